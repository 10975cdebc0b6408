// The upstream's chunked body read outside libcurl (proxy/worker.c, proxy/upbody.c) against
// upstreams the C fake cannot play: a raw TCP server that writes exactly the bytes each case
// needs (framing variants, bytes after the terminal chunk, resets, bursts), one response per
// request, on kept-alive connections. Each case checks what the client gets and, where it
// matters, what a second request on the same pooled connection gets (no bytes of one
// response may reach another request).
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startLoopguard, startRawUpstream, request, sse, assembleDeltas, sleep, cleanup, DEADLINE as T } from './lib.mjs';

const MSG = [{ role: 'user', content: 'hi' }];

// One OpenAI chat-completion chunk event.
const ev = (content, finish = null) =>
    `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: content === null ? {} : { content }, finish_reason: finish }] })}\n\n`;
const events = (tokens) => [...tokens.map((t) => ev(t)), ev(null, 'stop'), 'data: [DONE]\n\n'];
const chunk = (s, size = (n) => n.toString(16), crlf = '\r\n') => `${size(Buffer.byteLength(s, 'latin1'))}${crlf}${s}${crlf}`;
const HEAD = 'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n';

// A raw upstream (lib.mjs, startRawUpstream): respond(sock, n, conn) is called for the n-th
// chat request (from 0) with the index of the connection it came on; up.conns() counts the
// connections that carried one (a model probe's are not counted).
async function withRaw(respond, fn) {
    const up = await startRawUpstream((c, req, n) => respond(c, n, req.conn));
    const lg = await startLoopguard({ upstream: up.url, kind: 'vllm', config: { workers: 1 } });
    try {
        await fn(lg, up);
    } finally {
        await cleanup(() => lg.stop(), () => up.stop());
    }
}

const ask = (lg, extra = {}) =>
    request(lg.url + '/v1/chat/completions', { method: 'POST', body: { model: 'm', messages: MSG, stream: true, ...extra }, timeout: 8000 });

function streamed(text) {
    const data = sse(text).map((e) => e.data);
    const parsed = data.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d));
    return { content: assembleDeltas(parsed.filter((p) => !p.error)).content ?? '', done: data.at(-1) === '[DONE]', error: parsed.find((p) => p.error)?.error };
}

const A = ['alpha', ' beta', ' gamma', ' delta'];
const B = ['uno', ' dos', ' tres'];

describe('the upstream body read outside libcurl, hostile and lenient upstreams', () => {
    test('head, every chunk and the terminal chunk in one write: complete, connection reused', T, async () => {
        await withRaw(
            (c, n) => c.write(HEAD + events(n % 2 ? B : A).map((e) => chunk(e)).join('') + '0\r\n\r\n'),
            async (lg, up) => {
                for (let i = 0; i < 4; i++) {
                    const s = streamed((await ask(lg)).text);
                    assert.equal(s.content, (i % 2 ? B : A).join(''));
                    assert.ok(s.done);
                }
                assert.equal(up.conns(), 1);
            }
        );
    });

    test('chunk sizes with leading zeros, uppercase hex and extensions', T, async () => {
        const size = (n) => '000' + n.toString(16).toUpperCase() + ';name="v a l";x=1';
        await withRaw(
            (c) => c.write(HEAD + events(A).map((e) => chunk(e, size)).join('') + '000;last=1\r\n\r\n'),
            async (lg) => {
                for (let i = 0; i < 2; i++) {
                    const s = streamed((await ask(lg)).text);
                    assert.equal(s.content, A.join(''));
                    assert.ok(s.done && !s.error);
                }
            }
        );
    });

    test('the terminal chunk and its final CRLF arrive apart: complete, connection reused', T, async () => {
        await withRaw(
            async (c) => {
                c.write(HEAD + events(A).map((e) => chunk(e)).join('') + '0\r\n');
                await sleep(30);
                c.write('x-trailer: 1\r\n');
                await sleep(30);
                c.write('\r\n');
            },
            async (lg, up) => {
                for (let i = 0; i < 2; i++) {
                    const s = streamed((await ask(lg)).text);
                    assert.equal(s.content, A.join(''));
                    assert.ok(s.done);
                }
                assert.equal(up.conns(), 1);
            }
        );
    });

    // A hostile upstream appends a whole second response after the terminal chunk (in the
    // same write, or a moment later): it must never be taken as the answer to the next
    // request on that connection (another user's).
    for (const later of [false, true]) {
        test(`a response smuggled after the terminal chunk (${later ? 'written later' : 'same write'}) never answers the next request`, T, async () => {
            const SMUGGLED = ['SMUGGLED', ' secret'];
            await withRaw(
                async (c, n) => {
                    if (n > 0) {
                        // The next request: answered honestly unless the smuggled bytes were taken.
                        c.write(HEAD + events(B).map((e) => chunk(e)).join('') + '0\r\n\r\n');
                        return;
                    }
                    const body = HEAD + events(A).map((e) => chunk(e)).join('') + '0\r\n\r\n';
                    const extra = HEAD + events(SMUGGLED).map((e) => chunk(e)).join('') + '0\r\n\r\n';
                    if (!later) return void c.write(body + extra);
                    c.write(body);
                    await sleep(20);
                    c.write(extra);
                },
                async (lg) => {
                    const first = streamed((await ask(lg)).text);
                    assert.equal(first.content, A.join(''));
                    await sleep(100);
                    const second = streamed((await ask(lg)).text);
                    assert.doesNotMatch(second.content, /SMUGGLED/, 'the previous response\'s leftover answered another request');
                    assert.equal(second.content, B.join(''));
                }
            );
        });
    }

    test('both Content-Length and chunked: the chunked framing wins, the next request is clean', T, async () => {
        await withRaw(
            (c, n) => {
                const body = events(n ? B : A).map((e) => chunk(e)).join('') + '0\r\n\r\n';
                c.write(HEAD.replace('\r\n\r\n', '\r\nContent-Length: 7\r\n\r\n') + body);
            },
            async (lg) => {
                for (let i = 0; i < 2; i++) {
                    const s = streamed((await ask(lg)).text);
                    assert.equal(s.content, (i ? B : A).join(''), `request ${i}`);
                }
            }
        );
    });

    test('bare-LF chunk framing (a lenient upstream libcurl accepts): still streamed', T, async () => {
        await withRaw(
            (c) => c.write(HEAD + events(A).map((e) => chunk(e, undefined, '\n')).join('') + '0\n\n'),
            async (lg) => {
                const s = streamed((await ask(lg)).text);
                assert.equal(s.error, undefined, 'no error event');
                assert.equal(s.content, A.join(''));
            }
        );
    });

    test('a chunk size past 64 bits: an error event, no crash, the next request works', T, async () => {
        await withRaw(
            (c, n) => {
                if (n === 0) c.write(HEAD + chunk(ev('a')) + '1FFFFFFFFFFFFFFFF\r\nxx');
                else c.write(HEAD + events(B).map((e) => chunk(e)).join('') + '0\r\n\r\n');
            },
            async (lg) => {
                const s = streamed((await ask(lg)).text);
                assert.ok(s.error, 'an error event');
                assert.ok(s.done);
                assert.equal(streamed((await ask(lg)).text).content, B.join(''));
            }
        );
    });

    test('a reset mid-chunk: an error event and [DONE], no hang, the next request works', T, async () => {
        await withRaw(
            async (c, n) => {
                if (n > 0) return void c.write(HEAD + events(B).map((e) => chunk(e)).join('') + '0\r\n\r\n');
                const e = chunk(ev('b'));
                c.write(HEAD + chunk(ev('a')) + e.slice(0, 9));
                await sleep(30);
                c.resetAndDestroy();
            },
            async (lg) => {
                const s = streamed((await ask(lg)).text);
                assert.ok(s.error, 'an error event');
                assert.ok(s.done);
                assert.equal(streamed((await ask(lg)).text).content, B.join(''));
            }
        );
    });

    // A burst far bigger than what the client's socket buffers and loopguard's output
    // high-water mark hold, to a client that stops reading for a while: the upstream is
    // paused and resumed; every token arrives once, in order.
    test('a slow client over a large burst: paused, resumed, no byte lost or repeated', { timeout: 120000 }, async () => {
        const N = 40000;
        const toks = Array.from({ length: N }, (_, i) => ` w${i.toString(36)}x${((i * 7919) % 10007).toString(36)}`);
        await withRaw(
            (c) => {
                const parts = [HEAD];
                for (const e of events(toks)) parts.push(chunk(e));
                parts.push('0\r\n\r\n');
                c.write(parts.join(''));
            },
            async (lg) => {
                const text = await new Promise((resolve, reject) => {
                    const req = http.request(lg.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
                        res.pause();
                        const bufs = [];
                        setTimeout(() => {
                            res.on('data', (d) => bufs.push(d));
                            res.on('end', () => resolve(Buffer.concat(bufs).toString('utf8')));
                            res.resume();
                        }, 1500);
                    });
                    req.on('error', reject);
                    req.end(JSON.stringify({ model: 'm', messages: MSG, stream: true }));
                });
                const s = streamed(text);
                assert.equal(s.error, undefined);
                assert.equal(s.content.length, toks.join('').length);
                assert.equal(s.content, toks.join(''));
                assert.ok(s.done);
            }
        );
    });
    // The same burst to a client that stops reading and then hangs up while the upstream is
    // paused: the half-read connection is dropped, never pooled; the next request gets a
    // clean answer on a new one.
    test('a client hanging up while its paused upstream holds unread bytes: the connection is not reused', { timeout: 120000 }, async () => {
        const N = 40000;
        const toks = Array.from({ length: N }, (_, i) => ` v${i.toString(36)}y${((i * 104729) % 10007).toString(36)}`);
        await withRaw(
            (c, n) => {
                if (n > 0) return void c.write(HEAD + events(B).map((e) => chunk(e)).join('') + '0\r\n\r\n');
                c.write([HEAD, ...events(toks).map((e) => chunk(e)), '0\r\n\r\n'].join(''));
            },
            async (lg, up) => {
                await new Promise((resolve, reject) => {
                    const req = http.request(lg.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
                        res.pause();
                        setTimeout(() => {
                            req.destroy();
                            resolve();
                        }, 1000);
                    });
                    req.on('error', () => {});
                    req.end(JSON.stringify({ model: 'm', messages: MSG, stream: true }));
                });
                await sleep(200);
                const s = streamed((await ask(lg)).text);
                assert.equal(s.content, B.join(''));
                assert.equal(up.conns(), 2, 'the half-read connection was not reused');
                assert.equal((await request(lg.url + '/loopguard/health')).status, 200);
            }
        );
    });
    // The head whole (so the worker takes the body), then the body cut into pieces of 1-7
    // bytes written apart: every size line, extension, data run and CRLF split at every
    // offset, the terminal chunk and its final CRLF too. (A head whose first read is under
    // nine bytes is libcurl's alone: upbody.test.mjs's split cases never reach the worker.)
    test('the head whole, then the body split at every byte: complete, connection reused', { timeout: 120000 }, async () => {
        const size = (n) => '0' + n.toString(16).toUpperCase() + ';e=1';
        await withRaw(
            async (c, n) => {
                const body = events(n % 2 ? B : A).map((e) => chunk(e, size)).join('') + '0;end\r\nx-t: 1\r\n\r\n';
                c.write(HEAD + body.slice(0, 3));
                const pieces = [1, 2, 3, 5, 7, 4, 6];
                for (let at = 3, k = 0; at < body.length && !c.destroyed; k++) {
                    await sleep(1);
                    c.write(body.slice(at, at + pieces[k % pieces.length]));
                    at += pieces[k % pieces.length];
                }
            },
            async (lg, up) => {
                for (let i = 0; i < 3; i++) {
                    const s = streamed((await ask(lg)).text);
                    assert.equal(s.error, undefined);
                    assert.equal(s.content, (i % 2 ? B : A).join(''));
                    assert.ok(s.done);
                }
                assert.equal(up.conns(), 1);
            }
        );
    });
});
