// The upstream side of the guarded exchange on the wire, whoever speaks HTTP/1.1 there
// (libcurl today; the worker itself on plain-HTTP connections next). A raw TCP upstream
// records every byte of every request and answers with exactly the bytes each case needs.
// Each case pins what loopguard sends (one well-formed request, its header set, its body),
// how it reads an answer's framing (Content-Length, the close, Connection: close, error
// statuses, a head it cannot take), and what it does with a pooled connection (an idle one
// the upstream closed, one whose answer began, one holding bytes no request asked for, one
// a client left in the middle of): every client gets a well-formed answer of its own and no
// request is replayed to an upstream that had started to answer it.
// What loopguard answers is today's, recorded from the libcurl path; a case that allows two
// outcomes says why. The chunked body read is upbody.test.mjs's and upbody_hostile.test.mjs's;
// the client side of the edge is edge.test.mjs's.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import http from 'node:http';
import { startFake, startLoopguard, startRawUpstream, request, sse, assembleDeltas, normIds, sleep, cleanup, waitFor, DEADLINE as T } from './lib.mjs';

// ---- answers --------------------------------------------------------------------------

// One OpenAI chat-completion chunk event, and a whole event stream of `tokens`.
const ev = (content, finish = null) =>
    `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: content === null ? {} : { content }, finish_reason: finish }] })}\n\n`;
const sseOf = (tokens) => tokens.map((t) => ev(t)).join('') + ev(null, 'stop') + 'data: [DONE]\n\n';
const TYPE = 'Content-Type: text/event-stream\r\n';
// A 200 event stream framed by Content-Length, by chunks (one per event) or by the close.
const byLength = (body, extra = '') => `HTTP/1.1 200 OK\r\n${TYPE}${extra}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
const byChunks = (body, extra = '') =>
    `HTTP/1.1 200 OK\r\n${TYPE}${extra}Transfer-Encoding: chunked\r\n\r\n` +
    body
        .split(/(?<=\n\n)/)
        .map((e) => `${Buffer.byteLength(e).toString(16)}\r\n${e}\r\n`)
        .join('') +
    '0\r\n\r\n';
const A = ['alpha', ' beta', ' gamma'];
const B = ['uno', ' dos', ' tres'];
const SMUGGLED = sseOf(['SMUGGLED', ' secret']);

// Writes `s` in pieces of 1-7 bytes, each a moment after the last (every line, length and
// boundary split at some offset); past its first 2 KiB, in pieces of 4 KiB.
async function writeSplit(c, s) {
    const buf = Buffer.from(s, 'latin1');
    const pieces = [1, 2, 3, 5, 7, 4, 6];
    for (let at = 0, k = 0; at < buf.length && !c.destroyed; k++) {
        const n = at < 2048 ? pieces[k % pieces.length] : 4096;
        c.write(buf.subarray(at, at + n));
        at += n;
        await sleep(1);
    }
}

// ---- the raw upstream -----------------------------------------------------------------

// One loopguard (one worker, so every request shares one pool) in front of one raw upstream
// (lib.mjs, startRawUpstream) per case. `prefix`: a path the upstream URL carries.
async function withWire(respond, fn, { config = {}, prefix = '' } = {}) {
    const up = await startRawUpstream(respond);
    const lg = await startLoopguard({ upstream: up.url + prefix, kind: 'vllm', config: { workers: 1, ...config } });
    try {
        await fn(lg, up);
    } finally {
        await cleanup(() => lg.stop(), () => up.stop());
    }
}

const MSG = (content = 'hi') => [{ role: 'user', content }];
const ask = (lg, stream, { content, headers, timeout = 10000 } = {}) =>
    request(lg.url + '/v1/chat/completions', { method: 'POST', headers, body: { model: 'm', messages: MSG(content), stream }, timeout });

// What a 200 chat answer carried: its content, whether a stream ended with [DONE], and the
// error event a stream ended with, if any.
function answer(r, stream) {
    assert.equal(r.status, 200, r.text.slice(0, 300));
    if (!stream) return { content: r.json().choices[0].message.content, done: true };
    const data = sse(r.text).map((e) => e.data);
    const parsed = data.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d));
    return { content: assembleDeltas(parsed.filter((p) => !p.error)).content, done: data.at(-1) === '[DONE]', error: parsed.find((p) => p.error)?.error };
}

// A client got exactly `tokens`, streamed or whole.
function assertAnswer(r, stream, tokens, what = '') {
    const a = answer(r, stream);
    assert.equal(a.error, undefined, `${what}: ${r.text.slice(-300)}`);
    assert.equal(a.content, tokens.join(''), what);
    assert.ok(a.done, `${what}: ends with [DONE]`);
}

// The answer of a request that failed upstream: an OpenAI error response with `status` (a
// whole request, or a stream that had not started), or an error event then [DONE] (a
// stream that had). Returns the error object.
function assertFailed(r, stream, { status = 502, code, streamStarted = false } = {}) {
    let err;
    if (stream && streamStarted) {
        const a = answer(r, true);
        assert.ok(a.error, `an error event: ${r.text.slice(-300)}`);
        assert.ok(a.done, 'then [DONE]');
        err = a.error;
    } else {
        assert.equal(r.status, status, r.text.slice(0, 300));
        assert.match(r.headers['content-type'] || '', /json/);
        err = r.json().error;
    }
    assert.equal(err.type, 'upstream_error', JSON.stringify(err));
    if (code) assert.equal(err.code, code, JSON.stringify(err));
    assert.ok(err.message, JSON.stringify(err));
    return err;
}

async function assertHealthy(lg) {
    assert.equal((await request(lg.url + '/loopguard/health', { timeout: 5000 })).status, 200, 'loopguard still answers');
}

// ---- 1. the request -------------------------------------------------------------------

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

// Asserts one recorded request is well-formed HTTP/1.1 as loopguard writes it today: the
// request line, field lines "Name: value" (no CR, LF or NUL inside), exactly one Host (the
// replica's), exactly one Content-Length equal to the body's bytes, no Transfer-Encoding, and
// exactly the header names `names` (lower-case, any order).
function assertRequest(req, { path, port, names }) {
    assert.ok(!req.junk, `a request line: ${JSON.stringify(req.head.slice(0, 120))}`);
    assert.equal(req.line, `POST ${path} HTTP/1.1`);
    for (const l of req.lines) assert.match(l, /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+: ?[^\r\n\0]*$/, `field line ${JSON.stringify(l)}`);
    for (const [k] of req.headers) assert.match(k, TOKEN);
    const got = req.headers.map(([k]) => k.toLowerCase()).sort();
    assert.deepEqual(got, [...names].sort(), `header names of ${req.line}`);
    const one = (k) => req.headers.filter(([n]) => n.toLowerCase() === k).map(([, v]) => v);
    assert.deepEqual(one('host'), [`127.0.0.1:${port}`]);
    assert.deepEqual(one('content-length'), [String(req.body.length)]);
    assert.ok(!req.te, 'no Transfer-Encoding');
    return one;
}

// Today's header set of an exchange request from a client that sent only Content-Type (and
// node's Host, Connection, Content-Length): loopguard's Host, Content-Length, Content-Type,
// Accept and X-Forwarded-For; nothing else (no Expect, Connection, Accept-Encoding, User-Agent).
const BASE_NAMES = ['host', 'x-forwarded-for', 'content-type', 'accept', 'content-length'];

describe('the request loopguard sends upstream', () => {
    test("every guarded route: one well-formed HTTP/1.1 request on the replica's path, today's header set, the body byte-exact", T, async () => {
        // Multi-byte UTF-8 (2, 3 and 4 bytes), an escaped quote and a backslash: Content-Length
        // counts bytes, and the body is sent as loopguard built it.
        const TEXT = 'h\u00e9llo \u2713 \u{1F600} "q" \\ end';
        const routes = [
            ['/v1/chat/completions', { model: 'm', messages: MSG(TEXT), stream: true }, (b) => b.messages[0].content],
            ['/v1/chat/completions', { model: 'm', messages: MSG(TEXT), stream: false }, (b) => b.messages[0].content],
            ['/v1/completions', { model: 'm', prompt: TEXT }, (b) => b.prompt],
            ['/v1/messages', { model: 'm', max_tokens: 16, messages: MSG(TEXT), stream: true }, (b) => b.messages[0].content],
            ['/v1/responses', { model: 'm', input: TEXT, stream: true }, (b) => b.input],
            ['/generate', { text: TEXT, stream: true }, (b) => b.text],
        ];
        await withWire(
            (c) => c.write(byLength(sseOf(A))),
            async (lg, up) => {
                for (const [route, body] of routes) await request(lg.url + route, { method: 'POST', body, timeout: 10000 });
                const posts = up.posts();
                assert.equal(posts.length, routes.length, 'one upstream request per client request');
                routes.forEach(([route, , text], i) => {
                    const req = posts[i];
                    const one = assertRequest(req, { path: `/pre/fix${route}`, port: up.port, names: BASE_NAMES });
                    assert.deepEqual(one('content-type'), ['application/json']);
                    assert.deepEqual(one('accept'), ['text/event-stream']);
                    assert.deepEqual(one('x-forwarded-for'), ['127.0.0.1']);
                    const sent = JSON.parse(req.body.toString('utf8'));
                    assert.ok(Buffer.from(req.body.toString('utf8'), 'utf8').equals(req.body), 'the body is valid UTF-8');
                    assert.equal(text(sent), TEXT, `${route}: the text byte for byte`);
                    assert.equal(sent.stream, true, `${route}: the exchange streams from the upstream`);
                });
                // Streamed and whole, a chat request is the same request upstream.
                assert.ok(posts[0].body.equals(posts[1].body), 'chat stream and whole send the same body');
                assert.ok(!up.reqs.some((r) => r.junk), 'no bytes between requests on a connection');
            },
            { prefix: '/pre/fix/' }
        );
    });

    test("a client's hostile headers never reach the upstream; its end-to-end ones arrive byte for byte", T, async () => {
        const body = JSON.stringify({ model: 'm', messages: MSG('hostile'), stream: false });
        const chunked = `${(10).toString(16)}\r\n${body.slice(0, 10)}\r\n${(body.length - 10).toString(16)}\r\n${body.slice(10)}\r\n0\r\n\r\n`;
        const LONG = 'v'.repeat(8000);
        const head = [
            'POST /v1/chat/completions HTTP/1.1',
            'Host: evil.example',
            'Content-Type: text/plain',
            'Accept: */*',
            'Accept-Encoding: gzip, br',
            'Expect: 100-continue',
            'Connection: keep-alive, X-Secret',
            'X-Secret: hop',
            'Keep-Alive: timeout=5',
            'TE: trailers',
            'Trailer: X-T',
            'Upgrade: h2c',
            'Proxy-Connection: keep-alive',
            'Proxy-Authorization: Basic eDp5',
            'X-Loopguard-Trace: 1',
            'X-Forwarded-For: 203.0.113.9',
            'Authorization: Bearer sk-client',
            'X-Kept: kept value',
            'X-Latin: caf\xe9',
            `X-Long: ${LONG}`,
            'Transfer-Encoding: chunked',
        ].join('\r\n');
        await withWire(
            (c) => c.write(byLength(sseOf(A))),
            async (lg, up) => {
                const got = await new Promise((resolve) => {
                    const s = net.connect(lg.port, '127.0.0.1');
                    let out = '';
                    s.setEncoding('latin1');
                    s.on('data', (d) => {
                        out += d;
                        if (/\r\n\r\n[\s\S]*"finish_reason":"stop"[\s\S]*\}$/.test(out)) s.destroy(), resolve(out);
                    });
                    s.on('error', () => {});
                    s.on('close', () => resolve(out));
                    s.write(Buffer.from(`${head}\r\n\r\n${chunked}`, 'latin1'));
                });
                assert.match(got, /^(HTTP\/1\.1 100 Continue\r\n\r\n)?HTTP\/1\.1 200 /, got.slice(0, 200));
                const [req] = up.posts();
                const one = assertRequest(req, { path: '/v1/chat/completions', port: up.port, names: [...BASE_NAMES, 'authorization', 'x-kept', 'x-latin', 'x-long'] });
                assert.deepEqual(one('content-type'), ['application/json']);
                assert.deepEqual(one('accept'), ['text/event-stream']);
                assert.deepEqual(one('x-forwarded-for'), ['203.0.113.9, 127.0.0.1']);
                assert.deepEqual(one('authorization'), ['Bearer sk-client']);
                assert.deepEqual(one('x-kept'), ['kept value']);
                assert.deepEqual(one('x-latin'), ['caf\xe9'], 'a latin-1 byte passes as it came');
                assert.deepEqual(one('x-long'), [LONG]);
                assert.equal(JSON.parse(req.body.toString('utf8')).messages[0].content, 'hostile');
            }
        );
    });

    test('a 3 MiB body to an upstream that reads slowly arrives whole; the next request on that connection is clean', T, async () => {
        const big = Array.from({ length: 3 << 16 }, (_, i) => `w${(i * 7919) % 100003}`.padEnd(16, '.')).join('');
        await withWire(
            (c, req, n) => c.write(byLength(sseOf(n ? B : A))),
            async (lg, up) => {
                // The upstream stops reading once the big request begins, so the sender meets a
                // full socket, then reads again.
                const slow = (c) => {
                    c.once('data', () => {
                        c.pause();
                        setTimeout(() => c.resume(), 300);
                    });
                };
                for (const s of up.sockets) slow(s);
                up.server.on('connection', slow);
                assertAnswer(await ask(lg, false, { content: big, timeout: 30000 }), false, A, 'big');
                assertAnswer(await ask(lg, true), true, B, 'next');
                const [first, second] = up.posts();
                assert.equal(JSON.parse(first.body.toString('utf8')).messages[0].content, big);
                assert.equal(first.body.length, Number(first.headers.find(([k]) => /content-length/i.test(k))[1]));
                assert.equal(JSON.parse(second.body.toString('utf8')).messages[0].content, 'hi');
                assert.ok(!second.junk);
                assert.equal(up.conns(), 1, 'one connection for both');
            },
            { config: { max_body_bytes: 16 << 20 } }
        );
    });
    // An upstream may answer before it has read the request (a 413 for a body too big) and
    // close: the answer is taken, not a failed send, and nothing is left for the next request.
    test('an answer written before the request is read, then the close: passed on as it came; the next request clean', T, async () => {
        const big = 'y'.repeat(8 << 20); // more than the two sockets' buffers hold
        await withWire(
            (c) => c.write(byLength(sseOf(B))),
            async (lg, up) => {
                // The raw upstream answers whole requests; this listener answers a big one at
                // its head.
                up.server.prependListener('connection', (c) => {
                    let seen = '';
                    const early = (d) => {
                        const big = /content-length: *\d{7}\r\n/i.test(seen + d.toString('latin1', 0, 4096));
                        seen = d.toString('latin1', Math.max(0, d.length - 64));
                        if (!big) return;
                        c.removeListener('data', early);
                        c.pause();
                        c.write('HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: 27\r\nConnection: close\r\n\r\n{"error":{"message":"big"}}');
                        setTimeout(() => c.destroy(), 300);
                    };
                    c.on('data', early);
                });
                for (const s of up.sockets) s.destroy(); // the health check's: the big request opens its own
                for (const stream of [true, false]) {
                    const r = await ask(lg, stream, { content: big, timeout: 30000 });
                    assert.equal(r.status, 413, r.text.slice(0, 200));
                    assert.equal(r.text, '{"error":{"message":"big"}}');
                    assertAnswer(await ask(lg, stream), stream, B, 'after');
                }
            },
            { config: { max_body_bytes: 32 << 20 } }
        );
    });
});

// ---- 2. pooled connections ------------------------------------------------------------

describe('pooled upstream connections the upstream closes', () => {
    // How the upstream leaves a connection after answering it: closed at once (FIN, without
    // Connection: close), closed a moment later, reset a moment later.
    const LEAVE = {
        'closed right after the response': (c) => c.destroy(),
        'closed after a pause': (c) => setTimeout(() => c.end(), 30),
        'reset after a pause': (c) => setTimeout(() => c.resetAndDestroy(), 30),
    };
    for (const [name, leave] of Object.entries(LEAVE)) {
        test(`${name}: every request answered on a fresh connection, each once`, T, async () => {
            await withWire(
                (c, req, n) => c.write(byLength(sseOf(n % 2 ? B : A)), () => leave(c)),
                async (lg, up) => {
                    for (let i = 0; i < 6; i++) {
                        if (i) await sleep(250); // the close has come: the idle connection is dead
                        assertAnswer(await ask(lg, i % 3 === 0), i % 3 === 0, i % 2 ? B : A, `request ${i}`);
                    }
                    assert.equal(up.posts().length, 6, 'no request sent twice to a live upstream');
                    assert.equal(up.conns(), 6);
                }
            );
        });
    }

    // libcurl retries a request on a fresh connection when a reused one dies before any byte
    // of the answer: the upstream cannot have acted on it (it closed the connection).
    for (const how of ['closed', 'reset']) {
        test(`a reused connection ${how} after the request, before any answer: retried on a fresh connection, answered`, T, async () => {
            await withWire(
                (c, req, n) => {
                    if (n === 1) return void (how === 'closed' ? c.end() : c.resetAndDestroy());
                    c.write(byLength(sseOf(n ? B : A)));
                },
                async (lg, up) => {
                    for (const stream of [false, true]) {
                        assertAnswer(await ask(lg, stream), stream, stream ? B : A);
                    }
                    const posts = up.posts();
                    assert.equal(posts.length, 3, 'the request that met the dead connection, once more');
                    assert.equal(posts[1].conn, posts[0].conn, 'the second request took the pooled connection');
                    assert.notEqual(posts[2].conn, posts[1].conn, 'the retry took a fresh one');
                }
            );
        });
    }

    // Once the upstream has begun to answer, the request may have been acted on: it is never
    // sent again; the client gets a well-formed error. (A first line cut short is not in this
    // case: libcurl 7.88 still retries when the upstream sent less than a whole line.)
    const BEGUN = [
        ['the status line', 'HTTP/1.1 200 OK\r\n', { code: 'upstream_unreachable' }],
        ['the head and part of the body', byLength(sseOf(B)).slice(0, -60), { code: 'upstream_truncated', streamStarted: true }],
    ];
    for (const [name, bytes, fail] of BEGUN) {
        test(`a reused connection closed after ${name} of the answer: an error, the request never replayed`, T, async () => {
            await withWire(
                (c, req, n) => {
                    if (n % 2 === 0) return void c.write(byLength(sseOf(A)));
                    c.write(bytes);
                    setTimeout(() => c.end(), 30);
                },
                async (lg, up) => {
                    for (const stream of [true, false]) {
                        assertAnswer(await ask(lg, stream), stream, A, 'first');
                        const r = await ask(lg, stream);
                        // A stream that has not started is answered like a whole request.
                        assertFailed(r, stream, fail.streamStarted ? fail : { code: fail.code });
                        await assertHealthy(lg);
                    }
                    assert.equal(up.posts().length, 4, 'each request reached the upstream once');
                }
            );
        });
    }

    test('an answer that comes after timeouts.first_byte_ms never reaches the next request; a half head times out too', T, async () => {
        let lateWritten;
        const late = new Promise((r) => (lateWritten = r));
        await withWire(
            (c, req, n) => {
                // 0: answered long after the timeout; 1: a head begun, never ended; then
                // honest answers.
                if (n === 0)
                    return void setTimeout(() => {
                        if (!c.destroyed) c.write(byLength(SMUGGLED));
                        lateWritten();
                    }, 1500);
                if (n === 1) return void c.write(`HTTP/1.1 200 OK\r\n${TYPE}`);
                c.write(byLength(sseOf(B)));
            },
            async (lg, up) => {
                assertFailed(await ask(lg, true), true, { status: 504, code: 'upstream_timeout' });
                assertFailed(await ask(lg, false), false, { status: 504, code: 'upstream_timeout' });
                await late;
                await sleep(50);
                for (const stream of [true, false]) {
                    const r = await ask(lg, stream);
                    assert.doesNotMatch(r.text, /SMUGGLED/);
                    assertAnswer(r, stream, B);
                }
                assert.equal(up.posts().length, 4, 'a timed-out request is not sent again');
                assert.equal(up.conns(), 3, 'neither timed-out connection was reused');
            },
            { config: { timeouts: { first_byte_ms: 300, idle_ms: 300 } } }
        );
    });
});

// ---- 3. framing ----------------------------------------------------------------------

describe('how an answer is framed', () => {
    test('Content-Length, head and body split at every byte: complete, stream and whole, one connection', T, async () => {
        await withWire(
            (c, req, n) => writeSplit(c, byLength(sseOf(n % 2 ? B : A), 'X-Request-Id: r-7\r\n')),
            async (lg, up) => {
                for (let i = 0; i < 4; i++) {
                    const stream = i < 2;
                    const r = await ask(lg, stream);
                    assertAnswer(r, stream, i % 2 ? B : A, `request ${i}`);
                    assert.equal(r.headers['x-request-id'], 'r-7', "the upstream's own header is passed on");
                }
                assert.equal(up.conns(), 1, 'the connection went back to the pool after each body');
            }
        );
    });

    // An answer without a length ends with the connection (RFC 9112 §6.3, 8.): an HTTP/1.0
    // head, or an HTTP/1.1 one without Content-Length or chunked coding.
    const CLOSE_DELIMITED = {
        'HTTP/1.0 without Content-Length': (body) => `HTTP/1.0 200 OK\r\n${TYPE}\r\n${body}`,
        'HTTP/1.1 without a length, Connection: close': (body) => `HTTP/1.1 200 OK\r\n${TYPE}Connection: close\r\n\r\n${body}`,
        'HTTP/1.1 without a length or Connection: close': (body) => `HTTP/1.1 200 OK\r\n${TYPE}\r\n${body}`,
    };
    for (const [name, wire] of Object.entries(CLOSE_DELIMITED)) {
        test(`delimited by the close (${name}): complete, stream and whole; the next request on a new connection`, T, async () => {
            await withWire(
                async (c, req, n) => {
                    await writeSplit(c, wire(sseOf(n % 2 ? B : A)));
                    c.end();
                },
                async (lg, up) => {
                    for (let i = 0; i < 4; i++) assertAnswer(await ask(lg, i < 2), i < 2, i % 2 ? B : A, `request ${i}`);
                    assert.equal(up.conns(), 4);
                }
            );
        });
    }

    // The upstream says it will close but leaves the socket open: loopguard must not send the
    // next request on it (the upstream would not read it, or would answer anyone's).
    const CLOSING = {
        'Connection: close, Content-Length': (body) => byLength(body, 'Connection: close\r\n'),
        'Connection: close, chunked': (body) => byChunks(body, 'Connection: close\r\n'),
        'HTTP/1.0 with Content-Length': (body) => byLength(body).replace('HTTP/1.1', 'HTTP/1.0'),
    };
    for (const [name, wire] of Object.entries(CLOSING)) {
        test(`${name}, the socket left open: the next request goes on a new connection`, T, async () => {
            await withWire(
                (c, req, n) => c.write(wire(sseOf(n % 2 ? B : A))),
                async (lg, up) => {
                    for (let i = 0; i < 4; i++) assertAnswer(await ask(lg, i % 2 === 0), i % 2 === 0, i % 2 ? B : A, `request ${i}`);
                    assert.equal(up.conns(), 4, 'each connection carried one request');
                }
            );
        });
    }

    // Every guarded route, against the C fake's own dialects: a front passes each request on
    // to the fake and sends its answer back framed otherwise (read whole, then by
    // Content-Length split at every byte, or delimited by the close). The client must get
    // what it gets when the fake's chunked answer comes straight.
    test('every route, stream and whole: an answer framed by Content-Length (split) or by the close is the chunked one', T, async () => {
        const fake = await startFake({ kind: 'sglang' });
        const CLEAN = { responses: [{ reasoning: ['Some thought. ', 'More thought.'], content: ['The answer ', 'is forty ', 'two.'] }] };
        let framing;
        const front = await startRawUpstream(async (c, req) => {
            const r = await request(fake.url + req.path, { method: 'POST', headers: Object.fromEntries(req.headers.filter(([k]) => !/^(host|content-length)$/i.test(k))), body: req.body });
            const head = `HTTP/1.1 ${r.status} X\r\nContent-Type: ${r.headers['content-type']}\r\n`;
            const body = r.body.toString('latin1');
            if (framing === 'close') {
                await writeSplit(c, `${head}Connection: close\r\n\r\n${body}`);
                return void c.end();
            }
            await writeSplit(c, `${head}Content-Length: ${r.body.length}\r\n\r\n${body}`);
        });
        const ROUTES = [
            ['/v1/chat/completions', (stream) => ({ model: 'm', messages: MSG('route'), stream })],
            ['/v1/completions', (stream) => ({ model: 'm', prompt: 'route', stream })],
            ['/v1/messages', (stream) => ({ model: 'm', max_tokens: 100, messages: MSG('route'), stream })],
            ['/v1/responses', (stream) => ({ model: 'm', input: 'route', stream })],
            ['/generate', (stream) => ({ text: 'route', sampling_params: { max_new_tokens: 100 }, stream })],
        ];
        // Ids, clocks and the fake's latency figures differ from one request to the next.
        const norm = (t) =>
            normIds(t)
                .replace(/"(created_at|completed_at|e2e_latency|rid|request_id)":("[^"]*"|[0-9.e-]+)/g, '"$1":0')
                .replace(/"(msg|resp|rs|chatcmpl|call|toolu)_[0-9a-zA-Z-]+"/g, '"ID"');
        const direct = await startLoopguard({ upstream: fake.url, kind: 'sglang' });
        const lg = await startLoopguard({ upstream: front.url, kind: 'sglang', config: { workers: 1 } });
        try {
            await fake.setScenario(CLEAN);
            for (const [route, body] of ROUTES) {
                for (const stream of [true, false]) {
                    const want = await request(direct.url + route, { method: 'POST', body: body(stream) });
                    assert.equal(want.status, 200, `${route}: ${want.text.slice(0, 200)}`);
                    assert.match(want.text, /forty/, `${route}: the answer`);
                    for (framing of ['length', 'close']) {
                        const got = await request(lg.url + route, { method: 'POST', body: body(stream) });
                        assert.equal(got.status, 200, `${route} ${framing}: ${got.text.slice(0, 200)}`);
                        assert.equal(norm(got.text), norm(want.text), `${route}, ${stream ? 'stream' : 'whole'}, framed by ${framing}`);
                    }
                }
            }
            assert.equal(front.posts().length, ROUTES.length * 4, 'every request went through the front');
        } finally {
            await cleanup(
                () => lg.stop(),
                () => direct.stop(),
                () => fake.stop(),
                () => front.stop()
            );
        }
    });

    // Heads a strict parser might refuse but HTTP/1.1 allows (RFC 9112 §4, §5): no reason
    // phrase or an empty one, no space or tabs around a field value, names in any case, an
    // empty value, leading zeros in Content-Length, interim 100 and 103 heads first; and an
    // HTTP/1.0 head that asks to keep the connection (libcurl 7.88 keeps it, and writes its
    // next requests on it as HTTP/1.0). Each answer is complete; the HTTP/1.1 ones leave the
    // connection to the next request.
    const VALID = {
        'no reason phrase': (b) => byLength(b).replace('200 OK', '200'),
        'an empty reason phrase': (b) => byLength(b).replace('200 OK', '200 '),
        'no space after the colon, tabs, any case, an empty value': (b) =>
            `HTTP/1.1 200 OK\r\ncontent-TYPE:text/event-stream\r\nCONTENT-LENGTH:\t ${b.length} \t\r\nx-empty:\r\n\r\n${b}`,
        'leading zeros in Content-Length': (b) => byLength(b).replace('Content-Length: ', 'Content-Length: 000'),
        'interim 100 and 103 heads': (b) => `HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n${byLength(b)}`,
    };
    test('valid heads a strict parser might refuse: each answer complete, split or whole, the connection kept', T, async () => {
        let wire, split;
        await withWire(
            (c, req, n) => (n % 2 ? c.write(byLength(sseOf(B))) : split ? writeSplit(c, wire(sseOf(A))) : c.write(wire(sseOf(A)))),
            async (lg, up) => {
                for ([split] of [[false], [true]]) {
                    for (const [name, w] of Object.entries(VALID)) {
                        wire = w;
                        for (const stream of [true, false]) {
                            assertAnswer(await ask(lg, stream), stream, A, name);
                            assertAnswer(await ask(lg, stream), stream, B, `${name}: after`);
                        }
                    }
                }
                assert.equal(up.conns(), 1, 'one connection for all');
                wire = (b) => byLength(b, 'Connection: keep-alive\r\n').replace('HTTP/1.1', 'HTTP/1.0');
                for (const stream of [true, false]) {
                    assertAnswer(await ask(lg, stream), stream, A, 'HTTP/1.0 keep-alive');
                    assertAnswer(await ask(lg, stream), stream, B, 'HTTP/1.0 keep-alive: after');
                }
            }
        );
    });

    test('204 is passed on without a body; 200 with Content-Length 0 is a truncated answer; the next request is clean', T, async () => {
        await withWire(
            (c, req, n) => {
                if (n % 3 === 0) return void c.write('HTTP/1.1 204 No Content\r\nX-Request-Id: r-204\r\n\r\n');
                if (n % 3 === 1) return void c.write(`HTTP/1.1 200 OK\r\n${TYPE}Content-Length: 0\r\n\r\n`);
                c.write(byLength(sseOf(B)));
            },
            async (lg) => {
                for (const stream of [true, false]) {
                    const r = await ask(lg, stream);
                    assert.equal(r.status, 204, r.text);
                    assert.equal(r.body.length, 0);
                    assert.equal(r.headers['x-request-id'], 'r-204');
                    assertFailed(await ask(lg, stream), stream, { code: 'upstream_truncated', streamStarted: true });
                    assertAnswer(await ask(lg, stream), stream, B, 'after');
                }
            }
        );
    });

    // An error status is passed on as it came (status, type, body; core.test.mjs has the
    // fake's), whatever its framing and however it is split; its body is read to its end, so
    // the connection serves the next request.
    const ERRORS = [
        ['400 JSON, Content-Length', 400, 'application/json', '{"object":"error","message":"bad sampling","type":"BadRequestError","param":null,"code":400}', byLength],
        ['500 text, Content-Length', 500, 'text/plain; charset=utf-8', 'Internal Server Error', byLength],
        ['503 JSON, chunked', 503, 'application/json', '{"error":{"message":"overloaded","type":"x","code":503}}', byChunks],
        ['429 JSON 40 KiB, Content-Length', 429, 'application/json', JSON.stringify({ error: { message: 'slow down ' + 'x'.repeat(40000), type: 'x', code: 429 } }), byLength],
    ];
    for (const [name, status, type, body, frame] of ERRORS) {
        test(`an error status (${name}), split: passed on as it came, stream and whole; the next request is clean`, T, async () => {
            const wire = frame(body).replace(/^HTTP\/1\.1 200 OK\r\nContent-Type: text\/event-stream\r\n/, `HTTP/1.1 ${status} Oops\r\nContent-Type: ${type}\r\n`);
            await withWire(
                (c, req, n) => (n % 2 ? c.write(byLength(sseOf(B))) : writeSplit(c, wire)),
                async (lg, up) => {
                    for (const stream of [true, false]) {
                        const r = await ask(lg, stream);
                        assert.equal(r.status, status);
                        assert.equal(r.headers['content-type'], type);
                        assert.equal(r.text, body);
                        assertAnswer(await ask(lg, stream), stream, B, 'after');
                    }
                    assert.equal(up.posts().length, 4, 'an error status is not retried');
                }
            );
        });
    }

    // More bytes than Content-Length says: a whole second answer after the first (in the same
    // write or a moment later). It answers no request and must never reach another client.
    for (const [name, first] of [
        ['200', byLength(sseOf(A))],
        ['400', byLength('{"error":{"message":"bad","type":"x","code":400}}').replace(/^HTTP\/1\.1 200 OK\r\nContent-Type: text\/event-stream/, 'HTTP/1.1 400 Bad Request\r\nContent-Type: application/json')],
    ]) {
        for (const later of [false, true]) {
            test(`a ${name} answer followed by bytes past its Content-Length (${later ? 'written later' : 'same write'}): never another client's answer`, T, async () => {
                await withWire(
                    async (c, req, n) => {
                        if (n % 2) return void setTimeout(() => c.destroyed || c.write(byLength(sseOf(B))), 50);
                        if (!later) return void c.write(first + byLength(SMUGGLED));
                        c.write(first);
                        await sleep(30);
                        if (!c.destroyed) c.write(byLength(SMUGGLED));
                    },
                    async (lg, up) => {
                        for (const stream of [true, false]) {
                            const r = await ask(lg, stream);
                            if (name === '200') assertAnswer(r, stream, A, 'first');
                            else assert.equal(r.status, 400);
                            await sleep(100);
                            const next = await ask(lg, stream);
                            assert.doesNotMatch(next.text, /SMUGGLED/, "the extra bytes answered another client's request");
                            assertAnswer(next, stream, B, 'next');
                        }
                        assert.equal(up.posts().length, 4);
                    }
                );
            });
        }
    }

    test('Content-Length larger than the bytes sent, then the close: an error, not a hang', T, async () => {
        await withWire(
            (c, req, n) => {
                if (n % 2) return void c.write(byLength(sseOf(B)));
                const body = sseOf(A);
                c.write(`HTTP/1.1 200 OK\r\n${TYPE}Content-Length: ${body.length + 100}\r\n\r\n${body.slice(0, 150)}`);
                setTimeout(() => c.end(), 50);
            },
            async (lg) => {
                for (const stream of [true, false]) {
                    assertFailed(await ask(lg, stream), stream, { code: 'upstream_truncated', streamStarted: true });
                    assertAnswer(await ask(lg, stream), stream, B, 'after');
                }
            },
            // The timeouts are long: only the close may end the answer.
            { config: { timeouts: { first_byte_ms: 60000, idle_ms: 60000 } } }
        );
    });

    // Heads loopguard cannot take: a 502 upstream_error "upstream_unreachable" (libcurl's
    // "Weird server reply", "Unsupported protocol"), stream and whole; the connection is not
    // reused. Content-Lengths that are not one valid length frame nothing: RFC 9112 §6.3 has
    // a proxy answer 502 (libcurl 7.88 would take the last length, or the digits before junk).
    const BROKEN = {
        'a header line without a colon': `HTTP/1.1 200 OK\r\n${TYPE}This is no header\r\nContent-Length: 5\r\n\r\nhello`,
        'a NUL in a header value': `HTTP/1.1 200 OK\r\n${TYPE}X-A: a\0Content-Length: 9\r\nContent-Length: 5\r\n\r\nhello`,
        'a status line that is not HTTP': `ICY 200 OK\r\n${TYPE}\r\n${sseOf(A)}`,
        'a status code that is not three digits': `HTTP/1.1 2x0 OK\r\n${TYPE}Content-Length: 5\r\n\r\nhello`,
        'no head at all': sseOf(A),
        'a negative Content-Length': `HTTP/1.1 200 OK\r\n${TYPE}Content-Length: -1\r\n\r\n${sseOf(A)}`,
        'a Content-Length with junk after its digits': `HTTP/1.1 200 OK\r\n${TYPE}Content-Length: ${sseOf(A).length}abc\r\n\r\n${sseOf(A)}`,
        'two different Content-Lengths (the true one first)': `HTTP/1.1 200 OK\r\n${TYPE}Content-Length: ${sseOf(A).length}\r\nContent-Length: ${sseOf(A).length + 40}\r\n\r\n${sseOf(A)}`,
        'two different Content-Lengths (the true one last)': `HTTP/1.1 200 OK\r\n${TYPE}Content-Length: ${sseOf(A).length + 40}\r\nContent-Length: ${sseOf(A).length}\r\n\r\n${sseOf(A)}`,
    };
    test('heads that are not HTTP/1.1 or break its grammar: 502 upstream_unreachable, stream and whole, the next request clean', T, async () => {
        let wire;
        await withWire(
            (c, req, n) => {
                if (n % 2) return void c.write(byLength(sseOf(B)));
                c.write(wire, 'latin1');
                setTimeout(() => c.end(), 30);
            },
            async (lg, up) => {
                for (const [name, bytes] of Object.entries(BROKEN)) {
                    wire = bytes;
                    for (const stream of [true, false]) {
                        const r = await ask(lg, stream);
                        assert.equal(r.status, 502, `${name}: ${r.text.slice(0, 200)}`);
                        assertFailed(r, stream, { code: 'upstream_unreachable' });
                        assertAnswer(await ask(lg, stream), stream, B, `${name}: after`);
                    }
                }
                assert.equal(up.posts().length, Object.keys(BROKEN).length * 4, 'nothing retried');
            }
        );
    });

    // Heads that libcurl takes although RFC 9112 would not have a sender write them: an
    // obs-fold (its continuation line dropped), a bare CR in a value (that header not passed
    // on), lines ended by a bare LF. The answer is complete; no header the client gets holds a
    // CR, an LF or what was folded.
    test('obs-fold, a bare CR in a value, bare-LF line ends: the answer complete, no folded or broken header reaches the client', T, async () => {
        const HEADS = {
            'obs-fold': ['X-Request-Id: r-1\r\n Injected: yes\r\n', 'r-1'],
            'obs-fold with a tab': ['X-Request-Id: r-1\r\n\tInjected: yes\r\n', 'r-1'],
            'a bare CR in a value': ['X-Request-Id: r-1\rInjected: yes\r\n', undefined],
        };
        let extra;
        await withWire(
            (c) => c.write((extra === 'lf' ? byLength(sseOf(A), 'X-Request-Id: r-lf\r\n').replace(/\r\n/g, (m, at, s) => (at < s.indexOf('\r\n\r\n') ? '\n' : m)) : byLength(sseOf(A), extra)), 'latin1'),
            async (lg, up) => {
                for (const [name, [h, id]] of Object.entries(HEADS)) {
                    extra = h;
                    for (const stream of [true, false]) {
                        const r = await ask(lg, stream);
                        assertAnswer(r, stream, A, name);
                        assert.equal(r.headers['x-request-id'], id, name);
                        assert.equal(r.headers.injected, undefined, `${name}: a folded line became a header`);
                        for (let i = 0; i < r.rawHeaders.length; i++) assert.doesNotMatch(r.rawHeaders[i], /[\r\n\0]/);
                    }
                }
                extra = 'lf';
                for (const stream of [true, false]) {
                    const r = await ask(lg, stream);
                    assertAnswer(r, stream, A, 'bare LF');
                    assert.equal(r.headers['x-request-id'], 'r-lf');
                }
                // libcurl reuses the connection after all of them; loopguard's own HTTP/1.1
                // (proxy/uplink.c) does not reuse one after an obs-fold (RFC 9112 §5.2 has a
                // gateway refuse or rewrite it), so each of the four folded answers may end
                // its connection, never more.
                assert.ok(up.conns() <= 5, `every answer but the folded ones reused its connection: ${up.conns()}`);
            }
        );
    });

    // A head far over any limit. One 200 KiB field line: over libcurl's (and the worker's) 100
    // KiB per line, 502. 200 KiB of 1 KiB lines: past the 8 KiB of fields loopguard passes on
    // (HTTP_HEAD_FIELDS_MAX: its own head must fit max_header_bytes), a 502 as nginx's "upstream
    // sent too big header" (before that bound libmicrohttpd closed the client's connection with
    // no answer). No hang, no crash, and the next request is answered.
    test('a 200 KiB response head: a 502 OpenAI-style error, never a hang; loopguard healthy after', T, async () => {
        const ONE_LINE = `HTTP/1.1 200 OK\r\n${TYPE}X-Big: ${'a'.repeat(200 * 1024)}\r\n`;
        const MANY = `HTTP/1.1 200 OK\r\n${TYPE}` + `X-Big: ${'b'.repeat(1015)}\r\n`.repeat(200);
        let head;
        await withWire(
            (c, req, n) => {
                if (n % 2) return void c.write(byLength(sseOf(B)));
                const body = sseOf(A);
                c.write(`${head}Content-Length: ${body.length}\r\n\r\n${body}`);
            },
            async (lg) => {
                for (const [name, h] of [['one line', ONE_LINE], ['many lines', MANY]]) {
                    head = h;
                    for (const stream of [true, false]) {
                        const r = await ask(lg, stream);
                        assertFailed(r, stream, { code: name === 'one line' ? 'upstream_unreachable' : 'bad_upstream' });
                        await assertHealthy(lg);
                        assertAnswer(await ask(lg, stream), stream, B, `${name}: after`);
                    }
                }
            }
        );
    });
});

// ---- 4. one pool, several clients ------------------------------------------------------

describe('clients sharing pooled upstream connections', () => {
    // The upstream answers each request with the mark its message carries, in the framing the
    // mark asks for.
    const echo = (c, req) => {
        const mark = JSON.parse(req.body.toString('utf8')).messages[0].content;
        const body = sseOf([mark, ' end']);
        return mark.includes('chunked') ? byChunks(body) : byLength(body);
    };

    test('two clients alternating on one upstream connection: every answer is its own', T, async () => {
        await withWire(
            (c, req) => writeSplit(c, echo(c, req)),
            async (lg, up) => {
                for (let i = 0; i < 8; i++) {
                    const who = i % 2 ? 'B' : 'A';
                    const mark = `${who}-${i}-${i % 4 < 2 ? 'length' : 'chunked'}`;
                    const stream = i % 3 !== 0;
                    const r = await ask(lg, stream, { content: mark, headers: { 'x-forwarded-for': who === 'A' ? '198.51.100.1' : '198.51.100.2' } });
                    assertAnswer(r, stream, [mark, ' end'], mark);
                    assert.equal(up.posts()[i].headers.find(([k]) => /x-forwarded-for/i.test(k))[1], `${who === 'A' ? '198.51.100.1' : '198.51.100.2'}, 127.0.0.1`);
                }
                assert.equal(up.conns(), 1, 'all on one pooled connection');
            }
        );
    });

    // A connection in use is never handed to another request (no pipelining on it): two
    // streams at once take two connections (the upstream answers neither before both came:
    // a pool that waited for the busy connection would never send the second); once both
    // ended, the pool serves the next two on the same two.
    test('two streams at once take two connections; each answer its own; both connections reused after', T, async () => {
        const tokens = (mark) => [mark, ...Array.from({ length: 20 }, (_, i) => ` ${mark}-${i}`)];
        const waiting = [];
        await withWire(
            (c, req) => {
                waiting.push([c, JSON.parse(req.body.toString('utf8')).messages[0].content]);
                if (waiting.length < 2) return;
                for (const [sock, mark] of waiting.splice(0)) writeSplit(sock, byChunks(sseOf(tokens(mark))));
            },
            async (lg, up) => {
                for (let round = 0; round < 2; round++) {
                    const marks = [`P${round}`, `Q${round}`];
                    const rs = await Promise.all(marks.map((m) => ask(lg, true, { content: m })));
                    rs.forEach((r, i) => assertAnswer(r, true, tokens(marks[i]), marks[i]));
                }
                const posts = up.posts();
                assert.notEqual(posts[0].conn, posts[1].conn);
                assert.ok(!posts.some((p) => p.junk));
                assert.equal(up.conns(), 2, 'the second round reused both');
            }
        );
    });

    // A client that leaves in the middle of its answer: the connection still holds the rest
    // of that answer, so it is closed, never handed to the next client.
    for (const framing of ['length', 'chunked']) {
        test(`a client leaving mid-answer (${framing}): the next client's answer is its own, on a new connection`, T, async () => {
            await withWire(
                async (c, req) => {
                    const mark = JSON.parse(req.body.toString('utf8')).messages[0].content;
                    if (!mark.startsWith('slow')) return void c.write(echo(c, req));
                    // A long answer, paced: the client leaves after its first events.
                    const toks = Array.from({ length: 200 }, (_, i) => ` ${mark}-${i}`);
                    const body = sseOf(toks);
                    const wire = framing === 'length' ? byLength(body) : byChunks(body);
                    for (let at = 0; at < wire.length && !c.destroyed; at += 400) {
                        c.write(wire.slice(at, at + 400));
                        await sleep(10);
                    }
                },
                async (lg, up) => {
                    assertAnswer(await ask(lg, true, { content: `first-${framing}` }), true, [`first-${framing}`, ' end']);
                    await new Promise((resolve, reject) => {
                        const req = http.request(lg.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
                            res.once('data', () => {
                                req.destroy();
                                resolve();
                            });
                        });
                        req.on('error', () => {});
                        req.setTimeout(10000, () => reject(new Error('no first event')));
                        req.end(JSON.stringify({ model: 'm', messages: MSG(`slow-${framing}`), stream: true }));
                    });
                    await waitFor(async () => (await request(lg.url + '/loopguard/metrics')).text.includes('loopguard_active_streams 0'), 5000);
                    for (const stream of [true, false]) {
                        const mark = `next-${stream}-${framing}`;
                        const r = await ask(lg, stream, { content: mark });
                        assert.doesNotMatch(r.text, /slow-/, "bytes of the answer the client left reached another's");
                        assertAnswer(r, stream, [mark, ' end']);
                    }
                    const posts = up.posts();
                    assert.equal(posts.length, 4);
                    assert.equal(posts[1].conn, posts[0].conn, 'the slow answer took the pooled connection');
                    assert.notEqual(posts[2].conn, posts[1].conn, 'the half-read connection was not reused');
                }
            );
        });
    }
});
