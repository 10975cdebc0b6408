// End-to-end fault tests through the real loopguard binary and the
// real fake upstream, on the guarded exchange (chat completions).
//
// Upstream faults, each streaming and whole, in the first attempt and in a retry (the first
// attempt loops, so loopguard trips and the second attempt meets the fault): connection
// refused, close before headers, reset before the first event and mid-stream, stall (idle
// timeout), slow headers (first-byte timeout), slow start, garbage SSE lines (survived), an
// error event, HTTP 4xx/5xx, a body that is not SSE, truncated chunked encoding. Every
// client must get a well-formed answer — a complete stream, or an OpenAI-style error (JSON
// error response, or an error event then [DONE] once the stream has started) — loopguard
// must stay up, and a fault during a retry must end in an incident that says so.
//
// Client faults: disconnect before the body is complete, while loopguard holds a suspect
// tail back (also on a keep-alive connection's second request), and during a retry — the upstream generation is released (the fake sees the
// close, and SGLang gets /abort_request for that rid); a slow reader with a fast upstream —
// loopguard's RSS stays bounded and the stream completes when the client reads again;
// malformed requests, oversized headers, invalid UTF-8 and JSON bodies; an idle half-sent
// request is timed out without starving others.
//
// Runtime: ~20 s on the plain build (timeouts are set to 400 ms; a few cases wait for them).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import {
    startFake,
    startLoopguard,
    request,
    sseData,
    sseJSON,
    assembleDeltas,
    incidents,
    waitFor,
    metrics,
    sleep,
    isSanitizerBuild,
    cleanup,
    underValgrind,
    DEADLINE,
} from './lib.mjs';

const SLACK = isSanitizerBuild ? 3 : 1;
const TIMEOUT_MS = 400; // timeouts.first_byte_ms and timeouts.idle_ms of the loopguard under test
const MSG = [{ role: 'user', content: 'Count to eight.' }];
const CONTENT = ['one ', 'two ', 'three ', 'four ', 'five ', 'six ', 'seven ', 'eight'];
// The first attempt of a "retry" case: loops under the client's sampling (no
// presence_penalty), so loopguard trips it and retries with presence_penalty set.
const LOOP = { match: { fields: { presence_penalty: null } }, pace_ms: 2, reasoning: ['You can use the ', { repeat: 'lambda ', times: -1 }] };
const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lg-faults-'));
process.on('exit', () => fs.rmSync(tmpDir, { recursive: true, force: true }));

const T = DEADLINE;
const UNDER_VALGRIND = underValgrind;

/* ---- local helpers --------------------------------------------------------------- */


// An OpenAI-style error body: {"error":{"message",...}}, or SGLang's own error object
// ({"object":"error","message",...}) passed on as the upstream sent it.
function assertErrorBody(j, what) {
    const msg = j?.error?.message ?? (j?.object === 'error' ? j.message : undefined);
    assert.equal(typeof msg, 'string', `${what}: an error object with a message: ${JSON.stringify(j)}`);
}

// Classifies the client's answer and fails unless it is well-formed. Returns
// {kind: 'complete'|'error', content} for a stream or whole response.
function wellFormed(r, stream) {
    if (r.status !== 200) {
        assert.ok(r.status >= 400 && r.status < 600, `status ${r.status}`);
        assert.match(r.headers['content-type'] || '', /json/, 'an error response is JSON');
        assertErrorBody(JSON.parse(r.text), `HTTP ${r.status}`);
        return { kind: 'error', status: r.status };
    }
    if (!stream) {
        const j = JSON.parse(r.text);
        assert.equal(j.object, 'chat.completion', r.text.slice(0, 300));
        assert.ok(j.choices[0].finish_reason, 'a finish_reason');
        return { kind: 'complete', content: j.choices[0].message.content };
    }
    assert.match(r.headers['content-type'] || '', /text\/event-stream/);
    const data = sseData(r.text);
    assert.equal(data.at(-1), '[DONE]', `the stream ends with [DONE]: ...${JSON.stringify(r.text.slice(-300))}`);
    assert.equal(data.filter((d) => d === '[DONE]').length, 1, 'one [DONE]');
    assert.match(r.text, /\n\n$/, 'no half-written event');
    const ev = data.slice(0, -1).map((d) => JSON.parse(d));
    const last = ev.at(-1);
    if (last && last.error) {
        assertErrorBody(last, 'error event');
        assert.ok(!ev.slice(0, -1).some((e) => e.error), 'one error event, last');
        return { kind: 'error', content: assembleDeltas(ev.slice(0, -1)).content, event: last };
    }
    const v = assembleDeltas(ev);
    assert.ok(v.finish_reason, 'a complete stream has a finish_reason');
    return { kind: 'complete', content: v.content };
}

async function assertHealthy(lg) {
    const h = await request(lg.url + '/loopguard/health', { timeout: 3000 });
    assert.equal(h.status, 200, 'loopguard still answers');
}

// A port on which nothing listens.
async function deadPort() {
    const s = net.createServer();
    await new Promise((r) => s.listen(0, '127.0.0.1', r));
    const p = s.address().port;
    await new Promise((r) => s.close(r));
    return p;
}

// VmRSS of a process in KiB.
const rssKiB = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);

// Sends raw bytes on a fresh connection; resolves with what came back once the server
// closed the connection, or {timedOut} after ms.
function rawExchange(port, bytes, ms = 3000) {
    return new Promise((resolve) => {
        const s = net.connect(port, '127.0.0.1');
        let out = Buffer.alloc(0);
        const t = setTimeout(() => {
            s.destroy();
            resolve({ text: out.toString('latin1'), timedOut: true });
        }, ms);
        s.on('data', (d) => (out = Buffer.concat([out, d])));
        s.on('error', () => {});
        s.on('close', () => {
            clearTimeout(t);
            resolve({ text: out.toString('latin1'), timedOut: false });
        });
        s.write(bytes);
    });
}

/* ---- upstream faults ------------------------------------------------------------- */

// name, fault, expected outcome: 'error' (well-formed error) or 'complete' (survived).
const FAULTS = [
    ['close before headers', { kind: 'close_before_headers' }, 'error'],
    ['HTTP 400', { kind: 'http_status', status: 400, message: 'bad sampling' }, 'error'],
    ['HTTP 503', { kind: 'http_status', status: 503, message: 'overloaded' }, 'error'],
    ['headers late (first-byte timeout)', null, 'error', { first_byte_ms: 3000 }],
    ['reset before the first event', { kind: 'reset', at_token: 0 }, 'error'],
    ['body not SSE', { kind: 'not_sse', message: 'Internal Server Error' }, 'error'],
    ['slow start (no event within idle_ms)', { kind: 'slow_start', ms: 3000 }, 'error'],
    ['error event before the first token', { kind: 'error_event', at_token: 0, message: 'GPU on fire' }, 'error'],
    ['reset mid-stream', { kind: 'reset', at_token: 4 }, 'error'],
    ['stall mid-stream (idle timeout)', { kind: 'stall', at_token: 3 }, 'error'],
    ['error event mid-stream', { kind: 'error_event', at_token: 4, message: 'GPU on fire' }, 'error'],
    ['truncated chunked encoding', { kind: 'truncated_chunked', at_token: 4 }, 'error'],
    ['garbage SSE lines mid-stream', { kind: 'garbage', at_token: 3 }, 'complete'],
];

describe('upstream faults: every client gets a well-formed answer, loopguard stays up', () => {
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'sglang' });
        lg = await startLoopguard({
            upstream: fake.url,
            kind: 'sglang',
            config: { timeouts: { first_byte_ms: TIMEOUT_MS * SLACK, idle_ms: TIMEOUT_MS * SLACK }, incidents: { path: path.join(tmpDir, 'faults.jsonl') } },
        });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    for (const [name, fault, expect, extra = {}] of FAULTS) {
        for (const phase of ['first attempt', 'retry']) {
            for (const stream of [true, false]) {
                test(`${name}, ${phase}, ${stream ? 'streaming' : 'whole'}`, T, async () => {
                    const resp = { pace_ms: 5, reasoning: ['Counting.'], content: CONTENT, ...extra };
                    if (fault) resp.fault = fault;
                    await fake.setScenario({ dialect: 'sglang', responses: phase === 'retry' ? [LOOP, resp] : [resp] });
                    await fake.reset();
                    const t0 = performance.now();
                    const r = await request(lg.url + '/v1/chat/completions', { method: 'POST', body: { model: 'm', messages: MSG, stream }, timeout: 2500 * SLACK });
                    const ms = performance.now() - t0;
                    const got = wellFormed(r, stream);
                    assert.equal(got.kind, expect, `expected a ${expect} answer, got ${got.kind}: ${r.text.slice(-300)}`);
                    if (expect === 'complete') assert.equal(got.content, CONTENT.join(''), 'the garbage was skipped, nothing else lost');
                    if (/timeout|slow start|late/.test(name)) {
                        assert.ok(ms < 3000, `timed out by loopguard's timeout, not the upstream's (${ms.toFixed(0)} ms)`);
                        if (got.kind === 'error' && got.status) assert.equal(got.status, 504);
                    }
                    await assertHealthy(lg);
                    const chats = await fake.requests('/v1/chat/completions');
                    assert.equal(chats.length, phase === 'retry' ? 2 : 1, 'an upstream fault is not retried');
                    if (phase === 'retry') {
                        const rid1 = chats[0].rid;
                        await fake.waitRecord((a) => a.kind === 'abort' && a.rid === rid1); // the looping attempt, aborted by rid
                        const inc = await waitFor(async () => (await incidents(lg.url)).find((i) => i.attempts?.[0]?.rid === rid1));
                        assert.equal(inc.outcome, expect === 'complete' ? 'recovered' : 'upstream_error', 'the incident says what happened');
                        assert.equal(inc.attempts.length, 2, 'the incident records the attempt that met the fault');
                        assert.equal(inc.attempts[1].rid, chats[1].rid);
                    }
                });
            }
        }
    }

    test('connection refused: 502 stream and whole, loopguard stays up', T, async () => {
        const l = await startLoopguard({ upstream: `http://127.0.0.1:${await deadPort()}`, kind: 'sglang' });
        try {
            for (const stream of [true, false]) {
                const r = await request(l.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG, stream } });
                assert.equal(wellFormed(r, stream).kind, 'error');
                assert.equal(r.status, 502);
            }
            await assertHealthy(l);
        } finally {
            await l.stop();
        }
    });

    test('connection refused during a retry: error event then [DONE] / 502, incident upstream_error', T, async () => {
        // A front that forwards to the fake until it sees the first chat request go by; then
        // it stops listening and drops every other connection (an idle pooled one would be
        // reused), so the retry after the trip finds the port closed: connection refused.
        await fake.setScenario({ dialect: 'sglang', responses: [LOOP, { content: CONTENT }] });
        for (const stream of [true, false]) {
            await fake.reset();
            const socks = new Set();
            const front = net.createServer((c) => {
                socks.add(c);
                const u = net.connect(fake.port, '127.0.0.1');
                c.on('data', (d) => {
                    if (!front.listening || !d.includes('POST /v1/chat/completions')) return;
                    front.close();
                    for (const o of socks) if (o !== c) o.destroy();
                });
                c.pipe(u).pipe(c);
                c.on('error', () => u.destroy());
                c.on('close', () => socks.delete(c));
                u.on('error', () => c.destroy());
            });
            await new Promise((r) => front.listen(0, '127.0.0.1', r));
            const l = await startLoopguard({ upstream: `http://127.0.0.1:${front.address().port}`, kind: 'sglang', config: { retry: { elsewhere: 'never' } } });
            try {
                const r = await request(l.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG, stream }, timeout: 5000 * SLACK });
                const got = wellFormed(r, stream);
                assert.equal(got.kind, 'error');
                if (!stream) assert.equal(r.status, 502);
                await assertHealthy(l);
                const inc = await waitFor(async () => (await incidents(l.url))[0]);
                assert.equal(inc.outcome, 'upstream_error');
                assert.equal(inc.attempts.length, 2);
                assert.equal((await fake.requests('/v1/chat/completions')).length, 1, 'the retry never got through');
            } finally {
                await cleanup(() => l.stop(), () => front.close());
            }
        }
    });
});

/* ---- client faults ---------------------------------------------------------------- */

describe('client faults: the upstream is always released', () => {
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'sglang' });
        lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { client_timeout_s: 2 } });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    test('disconnect before the body is complete: nothing reaches the upstream', T, async () => {
        await fake.setScenario({ dialect: 'sglang', responses: [{ content: CONTENT }] });
        await fake.reset();
        const body = JSON.stringify({ messages: MSG, stream: true });
        const s = net.connect(lg.port, '127.0.0.1');
        await new Promise((r) => s.on('connect', r));
        s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length + 100}\r\n\r\n${body}`);
        await sleep(100);
        s.destroy();
        await sleep(300);
        assert.equal((await fake.requests('/v1/chat/completions')).length, 0);
        await assertHealthy(lg);
    });

    // Streams until `stop(text)` holds, waits `linger` ms more without reading further, then
    // hangs up. Resolves with the text received.
    function hangUpWhen(stop, body, linger = 0) {
        return new Promise((resolve, reject) => {
            const u = new URL(lg.url + '/v1/chat/completions');
            let text = '';
            const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
                res.setEncoding('utf8');
                let fired = false;
                res.on('data', (d) => {
                    text += d;
                    if (!fired && stop(text)) {
                        fired = true;
                        setTimeout(() => {
                            req.destroy();
                            resolve(text);
                        }, linger);
                    }
                });
                res.on('end', () => reject(new Error(`the stream ended before the hang-up: ${text.slice(-300)}`)));
            });
            req.on('error', () => {});
            req.end(JSON.stringify(body));
        });
    }

    test('disconnect while a suspect tail is held back: generation released and aborted by rid', T, async () => {
        // 30 ms a token: the guard needs ~14 "lambda" to trip; hang up after a few are held.
        await fake.setScenario({ dialect: 'sglang', pace_ms: 30, responses: [{ reasoning: ['You can use the ', { repeat: 'lambda ', times: -1 }] }] });
        await fake.reset();
        const text = await hangUpWhen((t) => t.includes('lambda'), { messages: MSG, stream: true }, 150);
        const seen = assembleDeltas(sseJSON(text.slice(0, text.lastIndexOf('\n\n') + 2))).reasoning_content;
        assert.ok((seen.match(/lambda/g) || []).length <= 2, `the held copies never reached the client (at most two "lambda", as in exchange.test.mjs): ${JSON.stringify(seen)}`);
        const [chatReq] = await fake.requests('/v1/chat/completions');
        const gen = await fake.waitRecord((r) => r.kind === 'generation' && r.rid === chatReq.rid, 2000);
        assert.equal(gen.ended, 'client_gone', 'the upstream transfer was closed');
        assert.ok(gen.tokens_sent < 14 + 4, `released before the guard would have tripped (${gen.tokens_sent} tokens)`);
        await fake.waitRecord((r) => r.kind === 'abort' && r.rid === chatReq.rid, 2000);
        assert.equal((await fake.requests('/v1/chat/completions')).length, 1, 'no retry for a client that left');
        await assertHealthy(lg);
    });

    test('disconnect on a keep-alive connection\'s second request, while a tail is held back: released and aborted', T, async () => {
        // The worker watches a client socket for the hang-up from the connection's first
        // request on; the second request on the same connection must be watched as well
        // (nothing is written to the client while the tail is held, so only the watch sees
        // it leave before the guard would trip).
        await fake.setScenario({ dialect: 'sglang', pace_ms: 30, responses: [{ reasoning: ['You can use the ', { repeat: 'lambda ', times: -1 }] }] });
        await fake.reset();
        const s = net.connect(lg.port, '127.0.0.1');
        await new Promise((r) => s.on('connect', r));
        let got = '';
        s.setEncoding('latin1');
        s.on('data', (d) => (got += d));
        s.on('error', () => {});
        const post = (body) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
        // A first request that ends by itself (2 tokens), read to its end.
        s.write(post(JSON.stringify({ messages: MSG, stream: true, max_tokens: 2 })));
        const complete = () => {
            const i = got.indexOf('\r\n\r\n');
            if (i < 0) return false;
            const len = /\r\ncontent-length: *(\d+)/i.exec(got.slice(0, i));
            return len ? got.length - i - 4 >= Number(len[1]) : got.endsWith('\r\n0\r\n\r\n');
        };
        await waitFor(complete, 5000 * SLACK);
        assert.match(got, /^HTTP\/1\.1 200/);
        assert.ok(!/\r\nconnection: close/i.test(got), 'the connection is kept alive');
        got = '';
        s.write(post(JSON.stringify({ messages: MSG, stream: true })));
        await waitFor(() => got.includes('lambda'), 5000 * SLACK);
        await sleep(150);
        s.destroy();
        const reqs = await fake.requests('/v1/chat/completions');
        assert.equal(reqs.length, 2);
        const rid = reqs[1].rid;
        const gen = await fake.waitRecord((r) => r.kind === 'generation' && r.rid === rid, 2000 * SLACK);
        assert.equal(gen.ended, 'client_gone', 'the upstream transfer was closed');
        assert.ok(gen.tokens_sent < 14 + 4, `released before the guard would have tripped (${gen.tokens_sent} tokens)`);
        await fake.waitRecord((r) => r.kind === 'abort' && r.rid === rid, 2000 * SLACK);
        assert.equal((await fake.requests('/v1/chat/completions')).length, 2, 'no retry for a client that left');
        await assertHealthy(lg);
    });

    test('disconnect during a retry (streaming and whole): retry released and aborted, incident client_gone', T, async () => {
        const retry = { pace_ms: 40, content: ['RETRY ', { varied: 200, seed: 4 }] };
        await fake.setScenario({ dialect: 'sglang', responses: [LOOP, retry] });
        for (const stream of [true, false]) {
            await fake.reset();
            if (stream) {
                await hangUpWhen((t) => t.includes('RETRY'), { messages: MSG, stream: true });
            } else {
                // A whole request shows nothing: hang up once the retry is at the upstream.
                const u = new URL(lg.url + '/v1/chat/completions');
                const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false });
                req.on('error', () => {});
                req.end(JSON.stringify({ messages: MSG }));
                await waitFor(async () => (await fake.requests('/v1/chat/completions')).length === 2);
                await sleep(100);
                req.destroy();
            }
            const chats = await fake.requests('/v1/chat/completions');
            assert.equal(chats.length, 2);
            const rid2 = chats[1].rid;
            const gen = await fake.waitRecord((r) => r.kind === 'generation' && r.rid === rid2, 2000);
            assert.equal(gen.ended, 'client_gone', 'the retry transfer was closed');
            await fake.waitRecord((r) => r.kind === 'abort' && r.rid === rid2, 2000);
            const inc = await waitFor(async () => (await incidents(lg.url)).find((i) => i.attempts?.[0]?.rid === chats[0].rid));
            assert.equal(inc.outcome, 'client_gone');
            assert.equal(inc.stream, stream);
            assert.equal(inc.attempts.length, 2, 'both attempts recorded');
            assert.equal(inc.attempts[1].rid, rid2);
        }
        await assertHealthy(lg);
    });

    test('slow reader, fast upstream: RSS stays bounded, the stream completes when read', T, async (t) => {
        const N = 150000; // ~35 MB of SSE if it were all buffered
        await fake.setScenario({ dialect: 'sglang', pace_ms: 0, responses: [{ content: [{ varied: N, seed: 9 }] }] });
        await fake.reset();
        const rss0 = rssKiB(lg.proc.pid);
        const u = new URL(lg.url + '/v1/chat/completions');
        const result = await new Promise((resolve, reject) => {
            const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
                res.pause(); // stop reading: the socket buffers fill, then loopguard's
                setTimeout(() => {
                    const rss1 = rssKiB(lg.proc.pid);
                    let n = 0;
                    const parts = [];
                    res.on('data', (d) => {
                        n += d.length;
                        parts.push(d);
                    });
                    res.on('end', () => resolve({ rss1, bytes: n, text: Buffer.concat(parts).toString('utf8') }));
                    res.resume();
                }, 1500);
            });
            req.on('error', reject);
            req.end(JSON.stringify({ messages: MSG, stream: true, max_tokens: N + 10 }));
        });
        const grew = result.rss1 - rss0;
        t.diagnostic(`loopguard RSS ${rss0} KiB before, ${result.rss1} KiB after ${N} tokens (~${Math.round(result.bytes / 1048576)} MiB of SSE) met a client that did not read`);
        if (!UNDER_VALGRIND) assert.ok(grew < 24 * 1024, `RSS grew ${grew} KiB while the client did not read (bound 24 MiB)`);
        const gens = await fake.generations();
        assert.ok(gens.length === 1 && gens[0].tokens_sent === N, 'the whole generation was sent');
        const data = sseData(result.text);
        assert.equal(data.at(-1), '[DONE]');
        const v = assembleDeltas(sseJSON(result.text));
        assert.equal(v.finish_reason, 'stop');
        assert.equal(v.content.split(' ').filter(Boolean).length, N, 'every token arrived');
        await assertHealthy(lg);
    });

    // Paced tokens find the client queue empty, so loopguard writes them to the socket itself
    // (proxy/worker.h, direct writes) until the socket is full; then a chunk is left
    // half-written and must be finished before anything else goes out. The fake cuts its
    // content at spaces: each token is one 12 KB word, 9.6 MB in all, more than the two
    // sockets' buffers hold (checked once with a print in the worker: a 9.6 KB tail).
    function bigTokens() {
        let seed = 7;
        const word = () => {
            let w = '';
            for (let n = 3 + (seed % 6); n > 0; n--) {
                seed = (seed * 1103515245 + 12345) % 2147483648;
                w += String.fromCharCode(97 + ((seed >> 16) % 26));
            }
            return w;
        };
        return Array.from({ length: 800 }, (_, i) => `t${i}:` + Array.from({ length: 1800 }, word).join('-') + ' ');
    }

    // A stream through `base` whose reader pauses after its first data for pauseMs (forever
    // when null). `text` resolves with the whole text once it ends; `req` is the request.
    function pausingStream(base, pauseMs) {
        const u = new URL(base + '/v1/chat/completions');
        const out = {};
        out.text = new Promise((resolve, reject) => {
            out.req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
                const parts = [];
                res.on('data', (d) => {
                    parts.push(d);
                    if (parts.length > 1) return;
                    res.pause();
                    if (pauseMs !== null) setTimeout(() => res.resume(), pauseMs);
                });
                res.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
                res.on('aborted', () => reject(new Error('the stream was cut off')));
            });
            out.req.on('error', reject);
            out.req.end(JSON.stringify({ messages: MSG, stream: true, max_tokens: 5000 }));
        });
        return out;
    }

    test('reader stops between paced tokens: every byte arrives in order', T, async () => {
        const tokens = bigTokens();
        await fake.setScenario({ dialect: 'sglang', pace_ms: 2, responses: [{ content: tokens }] });
        await fake.reset();
        // A pause longer than the whole generation; this suite's client_timeout_s (2) would
        // end it under ASan.
        const patient = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { client_timeout_s: 60 } });
        let text;
        try {
            text = await pausingStream(patient.url, 2000 * SLACK).text;
        } finally {
            await patient.stop();
        }
        assert.equal(sseData(text).at(-1), '[DONE]');
        const v = assembleDeltas(sseJSON(text));
        assert.equal(v.content.length, tokens.join('').length, 'as many bytes as the upstream sent');
        assert.ok(v.content === tokens.join(''), 'the same bytes in the same order');
        await assertHealthy(lg);
    });

    test('reader stops for good with a chunk half-written: the stream ends after client_timeout_s', T, async () => {
        await fake.setScenario({ dialect: 'sglang', pace_ms: 2, responses: [{ content: bigTokens() }] });
        await fake.reset();
        const s = pausingStream(lg.url, null);
        s.text.catch(() => {});
        try {
            await waitFor(async () => (await metrics(lg.url)).get('loopguard_active_streams') === 1, 3000 * SLACK);
            // client_timeout_s is 2 here; the generation itself takes about 1.6 s.
            await waitFor(async () => (await metrics(lg.url)).get('loopguard_active_streams') === 0, 8000 * SLACK);
        } finally {
            s.req.destroy();
        }
        await assertHealthy(lg);
    });

    test('malformed HTTP: 4xx or closed, never a crash', T, async () => {
        const cases = [
            'GARBAGE\r\n\r\n',
            'GET / HTTP/9.9\r\nHost: x\r\n\r\n',
            'GET /loopguard/health HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n',
            'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n',
            'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
            '\x00\x01\x02 / HTTP/1.1\r\n\r\n',
        ];
        for (const c of cases) {
            const r = await rawExchange(lg.port, c, 4000 * SLACK);
            assert.ok(!r.timedOut, `answered or closed in time: ${JSON.stringify(c)}`);
            if (r.text) assert.match(r.text, /^HTTP\/1\.1 4\d\d|^HTTP\/1\.1 505/, `a 4xx/505 for ${JSON.stringify(c)}: ${r.text.slice(0, 80)}`);
        }
        await assertHealthy(lg);
    });

    test('oversized headers (200 KiB): 431 or closed', T, async () => {
        for (const hdr of [`X-Big: ${'a'.repeat(200 * 1024)}\r\n`, 'X-A: b\r\n'.repeat(25000)]) {
            const r = await rawExchange(lg.port, `GET /loopguard/health HTTP/1.1\r\nHost: x\r\n${hdr}\r\n`);
            assert.ok(!r.timedOut, 'closed in time');
            if (r.text) assert.match(r.text, /^HTTP\/1\.1 (431|413|400)/, r.text.slice(0, 80));
        }
        await assertHealthy(lg);
    });

    test('invalid JSON and invalid UTF-8 bodies: 400, nothing sent upstream', T, async () => {
        await fake.reset();
        const head = (len) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ${len}\r\n\r\n`;
        const badUtf8 = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3, 0x28]), Buffer.from('"}]}')]);
        const bodies = {
            'invalid JSON': Buffer.from('{"messages":[{"role":"user","content":"hi"}],"stream":tru}'),
            'truncated JSON': Buffer.from('{"messages":[{"role":"user",'),
            'invalid UTF-8 in a string': badUtf8,
            'overlong UTF-8 encoding': Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}]}')]),
        };
        for (const [name, b] of Object.entries(bodies)) {
            const r = await rawExchange(lg.port, Buffer.concat([Buffer.from(head(b.length)), b]));
            assert.match(r.text, /^HTTP\/1\.1 400 /, `${name}: 400, got ${r.text.slice(0, 60)}`);
            assertErrorBody(JSON.parse(r.text.slice(r.text.indexOf('\r\n\r\n') + 4)), name);
        }
        assert.equal((await fake.requests('/v1/chat/completions')).length, 0, 'nothing reached the upstream');
        await assertHealthy(lg);
    });

    test('an idle half-sent request is timed out (client_timeout_s) without starving others', T, async () => {
        const s = net.connect(lg.port, '127.0.0.1');
        s.on('error', () => {});
        const closed = new Promise((r) => s.on('close', () => r(performance.now())));
        const t0 = performance.now();
        s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le');
        await fake.setScenario({ dialect: 'sglang', responses: [{ content: CONTENT }] });
        const r = await request(lg.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG } });
        assert.equal(r.status, 200, 'another client is served meanwhile');
        const at = await Promise.race([closed, sleep(6000 * SLACK).then(() => null)]);
        assert.ok(at, 'the idle connection was closed');
        assert.ok(at - t0 >= 1500, `not before client_timeout_s (${(at - t0).toFixed(0)} ms)`);
    });
});
