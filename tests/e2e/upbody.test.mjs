// The upstream's chunked body read by the worker outside libcurl (proxy/worker.c, "the
// response body outside libcurl"; proxy/upbody.c). Between loopguard and the C fake sits a
// TCP front that passes the request on unchanged and the fake's response bytes back
// re-segmented or edited as a network or a middlebox could: the framing split into pieces of
// 1-7 bytes written apart, trailers in the terminal chunk, a chunk size made unreadable.
// Each case checks what the client gets and that the upstream connection is kept or dropped
// as it should be (the front counts the connections loopguard opened).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import {
    startFake,
    startLoopguard,
    request,
    sse,
    assembleDeltas,
    sleep,
    cleanup,
    DEADLINE as T,
} from './lib.mjs';

const CONTENT = ['Hello', ' there', ', this', ' is', ' a', ' streamed', ' answer', ' with', ' ten', ' tokens.'];
const MSG = [{ role: 'user', content: 'hi' }];

// A TCP front for the fake. `edit(text, conn)` gets each piece of the response as the fake
// wrote it (latin1) and returns what to send on, `pieces` (bytes per write, cycled; 0: as
// received) re-segments it, each write 2 ms after the last.
function startFront(upPort, { edit = (t) => t, pieces = [] } = {}) {
    // conns: the connections that carried a chat completion (the health checker's and the
    // like are not counted).
    const front = { conns: 0, edits: 0, sockets: new Set() };
    front.server = net.createServer((c) => {
        front.sockets.add(c);
        const u = net.connect(upPort, '127.0.0.1');
        let queue = Promise.resolve();
        let k = 0;
        let counted = false;
        c.on('data', (d) => {
            if (!counted && d.includes('POST /v1/chat/completions')) front.conns += counted = 1;
        });
        c.pipe(u);
        u.on('data', (d) => {
            const out = Buffer.from(edit(d.toString('latin1'), front), 'latin1');
            queue = queue.then(async () => {
                if (!pieces.length) return void (c.destroyed || c.write(out));
                for (let at = 0; at < out.length && !c.destroyed; ) {
                    const n = pieces[k++ % pieces.length];
                    c.write(out.subarray(at, at + n));
                    at += n;
                    await sleep(2);
                }
            });
        });
        u.on('end', () => queue.then(() => c.end()));
        c.on('error', () => u.destroy());
        u.on('error', () => c.destroy());
        c.on('close', () => {
            front.sockets.delete(c);
            u.destroy();
        });
    });
    return new Promise((r) =>
        front.server.listen(0, '127.0.0.1', () => {
            front.url = `http://127.0.0.1:${front.server.address().port}`;
            r(front);
        })
    );
}

function stopFront(front) {
    for (const s of front.sockets) s.destroy();
    return new Promise((r) => front.server.close(r));
}

// The text a streamed chat completion's events carry, and whether it ended with [DONE].
function streamed(text) {
    const data = sse(text).map((e) => e.data);
    const chunks = data.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d));
    return { content: assembleDeltas(chunks).content, done: data.at(-1) === '[DONE]', chunks };
}

describe('the upstream body read outside libcurl', () => {
    let fake;
    before(async () => {
        fake = await startFake({ kind: 'sglang' });
        await fake.setScenario({ dialect: 'sglang', responses: [{ content: CONTENT, pace_ms: 5 }] });
    });
    after(() => cleanup(() => fake?.stop()));

    // One loopguard in front of one front for each case.
    async function withFront(opts, fn) {
        const front = await startFront(fake.port, opts);
        const lg = await startLoopguard({ upstream: front.url, kind: 'sglang', config: { workers: 1 } });
        try {
            await fn(lg, front);
        } finally {
            await cleanup(() => lg.stop(), () => stopFront(front));
        }
    }
    // A response split into pieces 2 ms apart takes hundreds of writes: seconds on a loaded host,
    // more under ASan, so the request may take as long as the case (the hang guard).
    const ask = (lg, extra = {}) =>
        request(lg.url + '/v1/chat/completions', { method: 'POST', body: { model: 'm', messages: MSG, stream: true, ...extra }, timeout: T.timeout });

    test('framing split at odd byte boundaries: the same answer, one upstream connection for three requests', T, async () => {
        await withFront({ pieces: [1, 2, 3, 5, 7, 4, 6] }, async (lg, front) => {
            for (let i = 0; i < 3; i++) {
                const r = await ask(lg);
                assert.equal(r.status, 200);
                const s = streamed(r.text);
                assert.equal(s.content, CONTENT.join(''), 'every token, in order, once');
                assert.ok(s.done, 'ends with [DONE]');
                assert.equal(s.chunks.at(-1).choices[0].finish_reason, 'stop');
            }
            assert.equal(front.conns, 1, 'the connection went back to the pool after each terminal chunk');
        });
    });

    test('trailers after the terminal chunk: the stream completes and the connection is reused', T, async () => {
        const edit = (t, front) => {
            if (!t.endsWith('\r\n0\r\n\r\n')) return t;
            front.edits++;
            return t.slice(0, -2) + 'x-upstream-trailer: 1\r\nx-other: two\r\n\r\n';
        };
        await withFront({ edit }, async (lg, front) => {
            for (let i = 0; i < 2; i++) {
                const r = await ask(lg);
                const s = streamed(r.text);
                assert.equal(s.content, CONTENT.join(''));
                assert.ok(s.done);
            }
            assert.equal(front.edits, 2, 'both responses carried trailers');
            assert.equal(front.conns, 1, 'one upstream connection for both');
            // And split too: the trailer section across writes.
        });
        await withFront({ edit, pieces: [3, 1, 4] }, async (lg, front) => {
            const r = await ask(lg);
            assert.equal(streamed(r.text).content, CONTENT.join(''));
            const again = await ask(lg);
            assert.ok(streamed(again.text).done);
            assert.equal(front.conns, 1);
        });
    });

    test('a malformed chunk size mid-stream: an OpenAI-style error event, the connection dropped, loopguard healthy', T, async () => {
        let seen = 0;
        const edit = (t, front) => {
            // The fake writes one chunk per event: the fourth chunk's size line made junk.
            if (!/^[0-9a-f]+\r\ndata: /.test(t) || ++seen !== 4) return t;
            front.edits++;
            return t.replace(/^[0-9a-f]+/, 'zz');
        };
        await withFront({ edit }, async (lg, front) => {
            const r = await ask(lg);
            assert.equal(r.status, 200, 'the stream had started');
            const events = sse(r.text).map((e) => e.data);
            assert.equal(front.edits, 1);
            const err = events.map((d) => (d === '[DONE]' ? null : JSON.parse(d))).find((e) => e?.error);
            assert.ok(err, `an error event: ${r.text.slice(-400)}`);
            assert.equal(err.error.type, 'upstream_error');
            assert.equal(err.error.code, 'upstream_truncated');
            assert.equal(events.at(-1), '[DONE]');
            // The broken connection is not reused: the next request opens another and succeeds.
            const again = await ask(lg);
            assert.equal(streamed(again.text).content, CONTENT.join(''));
            assert.equal(front.conns, 2);
            const h = await request(lg.url + '/loopguard/health');
            assert.equal(h.status, 200);
        });
    });

    test('a malformed chunk size before anything was streamed: 502 with an OpenAI error body (whole response)', T, async () => {
        let seen = 0;
        const edit = (t) => (/^[0-9a-f]+\r\ndata: /.test(t) && ++seen === 1 ? t.replace(/^[0-9a-f]+/, '1g') : t);
        await withFront({ edit }, async (lg) => {
            const r = await ask(lg, { stream: false });
            assert.equal(r.status, 502);
            const body = r.json();
            assert.equal(body.error.type, 'upstream_error');
            assert.equal(body.error.code, 'upstream_truncated');
        });
    });

    test('the upstream dies mid-chunk (split framing): error event and [DONE], no hang', T, async () => {
        await fake.setScenario({
            dialect: 'sglang',
            responses: [{ content: CONTENT, pace_ms: 5, fault: { kind: 'truncated_chunked', at_token: 3 } }],
        });
        try {
            await withFront({ pieces: [2, 5, 1] }, async (lg) => {
                const r = await ask(lg);
                const events = sse(r.text).map((e) => e.data);
                const err = events.map((d) => (d === '[DONE]' ? null : JSON.parse(d))).find((e) => e?.error);
                assert.ok(err, r.text.slice(-400));
                assert.equal(err.error.code, 'upstream_truncated');
                assert.equal(events.at(-1), '[DONE]');
                const s = streamed(r.text.replace(/data: \{"error".*\n\n/, ''));
                assert.ok(s.content && CONTENT.slice(0, 3).join('').startsWith(s.content), `released before the cut: ${s.content}`);
            });
        } finally {
            await fake.setScenario({ dialect: 'sglang', responses: [{ content: CONTENT, pace_ms: 5 }] });
        }
    });

    test('an interim 103 head before the final one (whole and split): the answer streams, the connection is reused', T, async () => {
        const edit = (t, front) => {
            if (!t.startsWith('HTTP/1.1 200 OK\r\n') || !t.includes('text/event-stream')) return t;
            front.edits++;
            return 'HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n' + t;
        };
        for (const pieces of [[], [7, 3, 11, 1]]) {
            await withFront({ edit, pieces }, async (lg, front) => {
                for (let i = 0; i < 2; i++) {
                    const r = await ask(lg);
                    assert.equal(r.status, 200);
                    const s = streamed(r.text);
                    assert.equal(s.content, CONTENT.join(''));
                    assert.ok(s.done);
                }
                assert.equal(front.edits, 2, 'both responses began with the interim head');
                assert.equal(front.conns, 1);
            });
        }
    });
});
