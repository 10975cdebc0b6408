// Clients whose socket is full while paced tokens keep coming: a receive buffer of a few
// KiB (SO_RCVBUF set before connecting, so the window stays that small) that is not read
// for a while, then read a few KiB at a time with pauses. Some token then meets a client
// socket that takes part of a chunk or none of it (strace of the first case: one or two
// short sendmsg calls and send_tail calls per stream; the kernel takes the first ~1.5 MB
// whole): what the socket does not take is kept (worker.c's tail, the exchange's `out`) and
// must leave whole, in order, with its chunk framing intact, also when the event was handed
// to the write straight from the upstream read's bytes (exchange.c, ex_out_raw), which the
// next read reuses. Written in review of lg/pcpu 0f240dd (direct raw writes) and lg/ttft
// (client input first): HTTP/1.1 (direct chunk writes), HTTP/1.0 (libmicrohttpd's own
// buffer, no chunks), and a client that resets its full connection mid-stream beside others
// that read on.
//
// The slow client is python3 (node cannot set SO_RCVBUF before connecting); edge.test.mjs
// runs python3 too.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { startFake, startLoopguard, chat, sseData, sseJSON, assembleDeltas, isSlowBuild, DEADLINE } from './lib.mjs';

const MSG = [{ role: 'user', content: 'Tell me about the history of bridges in some detail' }];
const N = isSlowBuild ? 800 : 2000; // tokens per stream, ~1.5 KB each: more than the kernel holds

// Tokens of ~1.5 KB: hex digests of their number (nothing the guard holds back), each cut by
// the fake at its trailing space.
function tokens() {
    const hex = (i, k) => createHash('sha256').update(`${i}.${k}`).digest('hex');
    return Array.from({ length: N }, (_, i) => `t${i}:` + Array.from({ length: 24 }, (_, k) => hex(i, k)).join('-') + ' ');
}

// Sends one streaming request over HTTP/1.`minor` with SO_RCVBUF 2048, reads nothing for
// `stallMs`, then reads at most 64 KiB per call with `everyMs` between calls; with
// `resetAfter` it closes with a reset (SO_LINGER 0) once it has read that many bytes.
// Resolves with every byte read (latin1: byte-exact).
const CLIENT = `
import socket, struct, sys, time
port, minor, stall, every, reset_after = (int(a) for a in sys.argv[1:6])
body = sys.stdin.buffer.read()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
s.connect(("127.0.0.1", port))
s.sendall(b"POST /v1/chat/completions HTTP/1.%d\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n" % (minor, len(body)) + body)
time.sleep(stall / 1000)
got = bytearray()
while True:
    d = s.recv(65536)
    if not d:
        break
    got += d
    if reset_after and len(got) >= reset_after:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        break
    if minor == 1 and got.endswith(b"\\r\\n0\\r\\n\\r\\n"):
        break
    time.sleep(every / 1000)
s.close()
sys.stdout.buffer.write(got)
`;

function slowClient(port, { minor = 1, stallMs = 1000, everyMs = 3, resetAfter = 0, body }) {
    return new Promise((resolve, reject) => {
        const args = [port, minor, stallMs, everyMs, resetAfter].map(String);
        const p = spawn('python3', ['-c', CLIENT, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
        const out = [];
        let err = '';
        p.stdout.on('data', (d) => out.push(d));
        p.stderr.on('data', (d) => (err += d));
        p.on('error', reject);
        p.on('close', (code) => (code === 0 ? resolve(Buffer.concat(out).toString('latin1')) : reject(new Error(`slow client exited ${code}: ${err}`))));
        p.stdin.end(JSON.stringify(body));
    });
}

// The body of a chunked response, its framing checked strictly: every size line is hex and
// CRLF-ended, every chunk's data is followed by CRLF, the last chunk is "0" and nothing
// follows it.
function dechunk(raw) {
    let at = 0;
    const parts = [];
    for (;;) {
        const eol = raw.indexOf('\r\n', at);
        assert.ok(eol > at, `a size line at byte ${at}: ${JSON.stringify(raw.slice(at, at + 40))}`);
        const line = raw.slice(at, eol);
        assert.match(line, /^[0-9a-fA-F]+$/, `size line at byte ${at}`);
        const n = parseInt(line, 16);
        at = eol + 2;
        if (n === 0) {
            assert.equal(raw.slice(at), '\r\n', 'nothing after the last chunk');
            return parts.join('');
        }
        parts.push(raw.slice(at, at + n));
        assert.equal(raw.slice(at + n, at + n + 2), '\r\n', `CRLF after the chunk at byte ${at}`);
        at += n + 2;
    }
}

function split(raw) {
    const sep = raw.indexOf('\r\n\r\n');
    assert.ok(sep > 0, 'a response head');
    return { head: raw.slice(0, sep), body: raw.slice(sep + 4) };
}

// Text of an event stream (decoded from latin1 bytes), checked: every event parses, the
// last is [DONE].
function content(bodyLatin1) {
    const text = Buffer.from(bodyLatin1, 'latin1').toString('utf8');
    assert.equal(sseData(text).at(-1), '[DONE]', 'the stream ends with [DONE]');
    const v = assembleDeltas(sseJSON(text));
    assert.equal(v.finish_reason, 'stop');
    return v.content;
}

describe('slow clients with full sockets at a decode pace', () => {
    let fake, lg, want;
    const body = { messages: MSG, stream: true, max_tokens: N + 10 };

    before(async () => {
        const toks = tokens();
        want = toks.join('');
        fake = await startFake({ scenario: { pace_ms: 1, responses: [{ content: toks }] } });
        lg = await startLoopguard({ upstream: fake.url, config: { workers: 1, client_timeout_s: 120 } });
    });

    after(async () => {
        if (lg) await lg.stop();
        if (fake) await fake.stop();
    });

    it('HTTP/1.1: chunks whole and in order, every byte once', DEADLINE, async () => {
        const { head, body: b } = split(await slowClient(lg.port, { body }));
        assert.match(head, /^HTTP\/1\.1 200 /);
        assert.match(head, /transfer-encoding: chunked/i);
        assert.equal(content(dechunk(b)), want);
    });

    it('HTTP/1.0: the events bare, whole and in order', DEADLINE, async () => {
        const { head, body: b } = split(await slowClient(lg.port, { minor: 0, body }));
        assert.match(head, /^HTTP\/1\.[01] 200 /);
        assert.doesNotMatch(head, /transfer-encoding/i);
        assert.equal(content(b), want);
    });

    it('three slow readers at once, one resetting its full connection mid-stream', DEADLINE, async () => {
        const [a, gone, c] = await Promise.all([
            slowClient(lg.port, { body, everyMs: 5 }),
            slowClient(lg.port, { body, resetAfter: 20000 }),
            slowClient(lg.port, { minor: 0, body, stallMs: 1500 }),
        ]);
        assert.ok(gone.length >= 20000, 'the resetting client read what it meant to');
        assert.equal(content(dechunk(split(a).body)), want);
        assert.equal(content(split(c).body), want);
        const after = await chat(lg.url + '/v1/chat/completions', body);
        assert.equal(after.status, 200);
        assert.equal(content(Buffer.from(after.text, 'utf8').toString('latin1')), want, 'the next stream is whole');
    });
});
