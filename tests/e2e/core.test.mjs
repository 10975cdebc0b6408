// End-to-end tests of the proxy core through the real loopguard binary and the
// fake upstream: a clean stream passes event-for-event and byte-for-byte in every dialect,
// a whole request comes back equal in meaning to the upstream's own answer, pass-through
// paths are transparent, the upstream kind is probed, a client that hangs up stops the
// generation upstream, and every documented error has its status and OpenAI shape.
// The reference for "what the upstream sent" is always a second, direct request to the fake
// with the very body loopguard sent (taken from the fake's request record).

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import {
    startFake,
    startLoopguard,
    runLoopguard,
    request,
    chat,
    rawStream,
    streamUntil,
    sse,
    sseData,
    sseJSON,
    assembleDeltas,
    normIds,
    metrics,
    metricValue,
    waitFor,
    sleep,
    tmpFile,
    isSlowBuild,
    usePair,
    deadPort,
    assertOpenAIError,
} from './lib.mjs';

const T = { timeout: isSlowBuild ? 60000 : 20000 };
const SLACK = isSlowBuild ? 3 : 1; // time factor for the slower ASan/valgrind runs
const MSG = [{ role: 'user', content: 'Say something useful please' }];

// The request record of the newest chat/completion request that reached the fake.
async function lastUpstreamRequest(fake, path = '/v1/chat/completions') {
    const reqs = await fake.requests(path);
    assert.ok(reqs.length > 0, `no ${path} request reached the fake`);
    return reqs[reqs.length - 1];
}

// Replays the body loopguard sent upstream directly to the fake: the bytes a client would
// have got without loopguard. `created` may tick between the two; vLLM/OpenAI ids are
// random per request (SGLang's are the rid, so equal) — both are normalised when asked.
async function replay(fake, rec, { ids = false } = {}) {
    const r = await rawStream(fake.url + rec.path, rec.body);
    assert.equal(r.status, 200);
    let t = r.text.replace(/"created":\d+/g, '"created":0');
    if (ids) t = normIds(t);
    return t;
}
const normCreated = (t) => t.replace(/"created":\d+/g, '"created":0');

// Drops the usage-only event(s) of an SSE body (what a client that did not ask for usage
// must not see); keeps every other byte.
function withoutUsageEvent(text) {
    return sse(text)
        .filter((e) => {
            if (e.data === '[DONE]') return true;
            const j = JSON.parse(e.data);
            return !(Array.isArray(j.choices) && j.choices.length === 0 && j.usage);
        })
        .map((e) => e.raw)
        .join('');
}

const KINDS = {
    sglang: ['sglang', 'sglang-pydantic', 'sglang-old'],
    vllm: ['vllm', 'vllm-old', 'vllm-both'],
    openai: ['openai'],
};
const CONTENT = ['The answer is forty two, ', 'as everyone knows.\n', 'Ask again tomorrow.'];
const REASONING = ['First I consider the question. ', 'Then I recall the book.'];

function reasoningOf(msg) {
    return msg.reasoning_content || msg.reasoning || '';
}

for (const [kind, dialects] of Object.entries(KINDS)) {
    describe(`dialects of a ${kind} upstream`, () => {
        let fake, lg;
        usePair({ fake: { kind } }, (f, l) => ([fake, lg] = [f, l]));

        for (const dialect of dialects) {
            const ids = kind !== 'sglang';
            for (const usage of [false, true]) {
                it(`${dialect}: clean content stream byte-for-byte (client usage ${usage})`, T, async () => {
                    await fake.setScenario({ dialect, responses: [{ content: CONTENT }] });
                    const body = { model: 'm1', messages: MSG, stream: true };
                    if (usage) body.stream_options = { include_usage: true };
                    const r = await rawStream(lg.url + '/v1/chat/completions', body);
                    assert.equal(r.status, 200, r.text);
                    assert.match(r.headers['content-type'], /^text\/event-stream/);
                    const rec = await lastUpstreamRequest(fake);
                    assert.equal(rec.body.stream, true);
                    assert.equal(rec.body.stream_options.include_usage, true, 'upstream always asked for usage');
                    let direct = await replay(fake, rec, { ids });
                    if (!usage) direct = withoutUsageEvent(direct);
                    let got = normCreated(r.text);
                    if (ids) got = normIds(got);
                    assert.equal(got, direct);
                    const events = sseJSON(r.text);
                    assert.equal(events.some((e) => e.usage), usage, 'usage chunk only when asked');
                    assert.equal(assembleDeltas(events).content, CONTENT.join(''));
                });
            }

            it(`${dialect}: stream with reasoning, event-for-event, same meaning`, T, async () => {
                const scen = { dialect, responses: [{ reasoning: kind === 'openai' ? [] : REASONING, content: CONTENT }] };
                await fake.setScenario(scen);
                const body = { model: 'm1', messages: MSG, stream: true, stream_options: { include_usage: true } };
                const r = await rawStream(lg.url + '/v1/chat/completions', body);
                assert.equal(r.status, 200, r.text);
                const rec = await lastUpstreamRequest(fake);
                const direct = await replay(fake, rec);
                const a = sseJSON(r.text);
                const b = sseJSON(direct);
                assert.equal(a.length, b.length, 'same number of events');
                const ga = assembleDeltas(a);
                const gb = assembleDeltas(b);
                assert.equal(ga.content, gb.content);
                assert.equal(ga.content, CONTENT.join(''));
                assert.equal(ga.reasoning_content, kind === 'openai' ? '' : REASONING.join(''), 'default output mode: reasoning_content');
                assert.equal(ga.finish_reason, gb.finish_reason);
                assert.deepEqual(ga.usage, gb.usage);
                assert.equal(sseData(r.text).at(-1), '[DONE]');
            });

            it(`${dialect}: whole request equal in meaning to the upstream's own answer`, T, async () => {
                await fake.setScenario({
                    dialect,
                    responses: [
                        {
                            reasoning: kind === 'openai' ? [] : REASONING,
                            content: CONTENT,
                            tool_calls: [{ name: 'lookup', arguments: '{"q": "forty two", "n": 3}' }],
                        },
                    ],
                });
                const body = { model: 'm1', messages: MSG, tools: [{ type: 'function', function: { name: 'lookup', parameters: {} } }] };
                const r = await chat(lg.url + '/v1/chat/completions', body);
                assert.equal(r.status, 200, r.text);
                assert.match(r.headers['content-type'], /^application\/json/);
                const got = r.json();
                const rec = await lastUpstreamRequest(fake);
                assert.equal(rec.body.stream, true, 'a whole request is still streamed from the upstream');
                const own = (await chat(fake.url + '/v1/chat/completions', { ...rec.body, stream: false, stream_options: undefined })).json();
                assert.equal(got.object, 'chat.completion');
                assert.equal(got.model, own.model);
                const gm = got.choices[0].message,
                    om = own.choices[0].message;
                assert.equal(gm.role, 'assistant');
                assert.equal(gm.content, om.content);
                assert.equal(reasoningOf(gm), reasoningOf(om));
                if (kind !== 'openai') assert.equal(gm.reasoning_content, REASONING.join(''));
                assert.equal(gm.tool_calls.length, 1);
                assert.equal(gm.tool_calls[0].type, 'function');
                assert.equal(gm.tool_calls[0].function.name, om.tool_calls[0].function.name);
                assert.equal(gm.tool_calls[0].function.arguments, om.tool_calls[0].function.arguments);
                // The call id is the upstream's (call_<hex> on SGLang, chatcmpl-tool-<hex> on vLLM).
                assert.equal(gm.tool_calls[0].id.replace(/[0-9a-f]{8,}$/, ''), om.tool_calls[0].id.replace(/[0-9a-f]{8,}$/, ''));
                assert.notEqual(gm.tool_calls[0].id, '');
                assert.equal(got.choices[0].finish_reason, own.choices[0].finish_reason);
                assert.equal(got.choices[0].finish_reason, 'tool_calls');
                for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) assert.equal(got.usage[k], own.usage[k], `usage.${k}`);
            });
        }

        it(`${kind}: text completion stream byte-for-byte and whole equal in meaning`, T, async () => {
            await fake.setScenario({ dialect: dialects[0], responses: [{ content: CONTENT }] });
            const body = { model: 'm1', prompt: 'Once upon a time', stream: true };
            const r = await rawStream(lg.url + '/v1/completions', body);
            assert.equal(r.status, 200, r.text);
            const rec = await lastUpstreamRequest(fake, '/v1/completions');
            const direct = withoutUsageEvent(await replay(fake, rec, { ids: kind !== 'sglang' }));
            let got = normCreated(r.text);
            if (kind !== 'sglang') got = normIds(got);
            assert.equal(got, direct);

            const w = await chat(lg.url + '/v1/completions', { model: 'm1', prompt: 'Once upon a time', max_tokens: 4 });
            assert.equal(w.status, 200, w.text);
            const wj = w.json();
            const wrec = await lastUpstreamRequest(fake, '/v1/completions');
            const own = (await chat(fake.url + '/v1/completions', { ...wrec.body, stream: false, stream_options: undefined })).json();
            assert.equal(wj.object, 'text_completion');
            assert.equal(wj.choices[0].text, own.choices[0].text);
            assert.equal(wj.choices[0].finish_reason, 'length');
            assert.equal(wj.usage.completion_tokens, own.usage.completion_tokens);
        });
    });
}

// An SSE server this project did not write (node:http): SGLang-shaped chunks framed the
// ways the WHATWG spec allows (CRLF, CR, comments, event/id/retry fields, multi-line data),
// written in pieces of 1, 3, 7 bytes or whole, so that every read boundary is exercised.
describe('an independent SSE server', () => {
    const ID = '0123456789abcdef0123456789abcdef';
    const ev = (delta, fin = null, nl = '\n') =>
        `data: {"id":"${ID}","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":${JSON.stringify(delta)},"logprobs":null,"finish_reason":${JSON.stringify(fin)},"matched_stop":null}]}${nl}${nl}`;
    const framed = (nl) => [ev({ role: 'assistant', content: '' }, null, nl), ev({ content: 'Hello ' }, null, nl), ev({ content: 'world' }, null, nl), ev({}, 'stop', nl), `data: [DONE]${nl}${nl}`];
    const VARIANTS = {
        lf: framed('\n'),
        crlf: framed('\r\n'),
        cr: framed('\r'),
        'comments and fields': [': ping\n\n', ev({ role: 'assistant', content: '' }), ': keep-alive\n', ev({ content: 'Hello ' }), 'event: message\n' + ev({ content: 'world' }), 'id: 7\nretry: 100\n' + ev({}, 'stop'), 'data: [DONE]\n\n'],
        'multi-line data': [ev({ role: 'assistant', content: '' }), `data: {"id":"${ID}","object":"chat.completion.chunk","created":1,"model":"m",\ndata: "choices":[{"index":0,"delta":{"content":"Hello "},"logprobs":null,"finish_reason":null}]}\n\n`, ev({ content: 'world' }), ev({}, 'stop'), 'data: [DONE]\n\n'],
    };
    let srv, lg, body, piece, firstUploadChunkAt;
    before(async () => {
        srv = http.createServer((req, res) => {
            if (req.url === '/slow') {
                res.writeHead(200, { 'content-type': 'text/plain' });
                res.write('first;');
                return setTimeout(() => res.end('second'), 500);
            }
            if (req.url === '/upload') {
                firstUploadChunkAt = null;
                let n = 0;
                req.on('data', (d) => {
                    firstUploadChunkAt ??= performance.now();
                    n += d.length;
                });
                return req.on('end', () => res.end(String(n)));
            }
            if (req.url === '/get_model_info') {
                res.setHeader('content-type', 'application/json');
                return res.end('{"model_path":"m","is_generation":true}');
            }
            if (req.url === '/v1/models') {
                res.writeHead(203, { 'content-type': 'application/json', 'x-upstream-id': 'u-1', 'cache-control': 'no-store', connection: 'close, x-hop', 'x-hop': 'secret', 'keep-alive': 'timeout=3' });
                return res.end('{"object":"list","data":[]}');
            }
            if (req.url !== '/v1/chat/completions') {
                res.writeHead(404);
                return res.end();
            }
            req.resume();
            req.on('end', async () => {
                res.writeHead(200, { 'content-type': 'text/event-stream', 'x-request-id': 'r-42' });
                for (let i = 0; i < body.length; i += piece) {
                    res.write(body.slice(i, i + piece));
                    await new Promise((r) => setImmediate(r));
                }
                res.end();
            });
        });
        await new Promise((r) => srv.listen(0, '127.0.0.1', r));
        // /slow and /upload are this server's own routes, outside the built-in allow-list.
        lg = await startLoopguard({ upstream: `http://127.0.0.1:${srv.address().port}`, config: { passthrough: { allow: ['/slow', '/upload'] } } });
    });
    after(async () => {
        await lg?.stop();
        await new Promise((r) => srv?.close(r));
    });

    it('pass-through response: status and end-to-end headers kept, hop-by-hop headers dropped', T, async () => {
        const r = await request(lg.url + '/v1/models');
        assert.equal(r.status, 203);
        assert.equal(r.text, '{"object":"list","data":[]}');
        assert.equal(r.headers['x-upstream-id'], 'u-1');
        assert.equal(r.headers['cache-control'], 'no-store');
        assert.equal(r.headers['x-hop'], undefined);
        assert.equal(r.headers['keep-alive'], undefined);
    });

    it('pass-through bodies stream both ways (neither is buffered whole)', T, async () => {
        // response: the first part must arrive long before the upstream sends the rest
        const t0 = performance.now();
        const firstAt = await new Promise((resolve, reject) => {
            http.get(lg.url + '/slow', { agent: false }, (res) => {
                res.once('data', () => resolve(performance.now()));
                res.resume();
            }).on('error', reject);
        });
        assert.ok(firstAt - t0 < 350, `first response bytes after ${(firstAt - t0).toFixed(0)} ms`);
        // request: the upstream must see the first chunk before the client sends the second
        const u = new URL(lg.url + '/upload');
        let secondSentAt;
        const r = await new Promise((resolve, reject) => {
            const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent: false, headers: { 'content-type': 'application/octet-stream' } }, (res) => {
                let t = '';
                res.on('data', (d) => (t += d));
                res.on('end', () => resolve({ status: res.statusCode, text: t }));
            });
            req.on('error', reject);
            req.write(Buffer.alloc(4096, 1));
            setTimeout(() => {
                secondSentAt = performance.now();
                req.end(Buffer.alloc(4096, 2));
            }, 500);
        });
        assert.equal(r.status, 200);
        assert.equal(r.text, '8192');
        assert.ok(firstUploadChunkAt < secondSentAt, 'the upstream got nothing before the whole body was sent');
    });

    it('a chat stream carries the upstream response headers', T, async () => {
        body = VARIANTS.lf.join('');
        piece = body.length;
        const r = await rawStream(lg.url + '/v1/chat/completions', { messages: MSG, stream: true });
        assert.equal(r.headers['x-request-id'], 'r-42');
        assert.match(r.headers['content-type'], /^text\/event-stream/);
    });

    for (const [name, events] of Object.entries(VARIANTS)) {
        it(`${name}: the stream passes byte-for-byte at every write size; whole equal in meaning`, T, async () => {
            body = events.join('');
            for (const p of [body.length, 7, 3, 1]) {
                piece = p;
                const r = await rawStream(lg.url + '/v1/chat/completions', { messages: MSG, stream: true });
                assert.equal(r.status, 200);
                assert.equal(assembleDeltas(sseJSON(r.text)).content, 'Hello world', `pieces of ${p}`);
                assert.equal(r.text, body, `pieces of ${p}`);
                const w = await chat(lg.url + '/v1/chat/completions', { messages: MSG });
                assert.equal(w.json().choices[0].message.content, 'Hello world');
                assert.equal(w.json().choices[0].finish_reason, 'stop');
            }
        });
    }
});

// Pooled upstream connections that the upstream closes (node:http): while they are idle, and
// right after every response without announcing it (the close reaches loopguard around the
// time the next request takes the connection).
// Every request is answered in full, on a fresh connection when the pooled one is gone.
describe('pooled upstream connections the upstream closes', () => {
    const ID = 'fedcba9876543210fedcba9876543210';
    const ev = (delta, fin = null) =>
        `data: {"id":"${ID}","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":${JSON.stringify(delta)},"logprobs":null,"finish_reason":${JSON.stringify(fin)}}]}\n\n`;
    const BODY = [ev({ role: 'assistant', content: '' }), ev({ content: 'pooled ' }), ev({ content: 'answer' }), ev({}, 'stop'), 'data: [DONE]\n\n'].join('');
    let srv, lg, connections, closeAfterEach;
    before(async () => {
        srv = http.createServer((req, res) => {
            req.resume();
            req.on('end', () => {
                if (req.url !== '/v1/chat/completions') {
                    res.writeHead(404);
                    return res.end();
                }
                res.writeHead(200, { 'content-type': 'text/event-stream' });
                res.end(BODY);
                if (closeAfterEach) res.on('finish', () => setImmediate(() => req.socket.destroy()));
            });
        });
        srv.on('connection', () => connections++);
        await new Promise((r) => srv.listen(0, '127.0.0.1', r));
        lg = await startLoopguard({ upstream: `http://127.0.0.1:${srv.address().port}`, kind: 'vllm', config: { workers: 1 } });
    });
    after(async () => {
        await lg?.stop();
        await new Promise((r) => srv?.close(r));
    });
    const ask = async (stream) => {
        const r = await chat(lg.url + '/v1/chat/completions', { messages: MSG, stream });
        assert.equal(r.status, 200, r.text);
        const content = stream ? assembleDeltas(sseJSON(r.text)).content : r.json().choices[0].message.content;
        assert.equal(content, 'pooled answer');
    };

    it('a connection the upstream closed while idle is not reused', T, async () => {
        closeAfterEach = false;
        await ask(true);
        await ask(false); // reuses the first connection
        connections = 0;
        srv.closeIdleConnections();
        await sleep(100 * SLACK);
        await ask(true);
        await ask(false);
        assert.equal(connections, 1, 'one fresh connection after the idle one was closed');
    });

    it('a connection closed right after each response: every request still answered', T, async () => {
        closeAfterEach = true;
        connections = 0;
        for (let i = 0; i < 20; i++) await ask(i % 2 === 0);
        // the first may take the connection the test before left open
        assert.ok(connections >= 19, `${connections} connections for 20 requests`);
    });
});

describe('pass-through', () => {
    let fake, lg;
    // The fake's own routes and SGLang's native /generate are outside the built-in
    // allow-list (tests/e2e/edge.test.mjs shows them closed by default).
    const allow = ['/_fake/*', '/nope/*', '/generate'];
    usePair({ fake: { kind: 'sglang' }, lg: { config: { passthrough: { allow } } } }, (f, l) => ([fake, lg] = [f, l]));

    for (const p of ['/v1/models', '/health', '/metrics', '/get_model_info', '/get_server_info', '/nope/not-here']) {
        it(`GET ${p} arrives as the upstream sent it`, T, async () => {
            const first = await request(fake.url + p);
            const a = await request(lg.url + p);
            const b = await request(fake.url + p);
            assert.equal(a.status, b.status);
            assert.equal(a.headers['content-type'], b.headers['content-type']);
            if (p === '/metrics') {
                // /metrics counts requests, so only its shape can be compared.
                assert.match(a.text, /^fake_requests_total/m);
            } else if (p === '/v1/models') {
                // Like SGLang's and vLLM's, the fake's model card is stamped with the second
                // of each request, which may tick between two requests: loopguard's copy
                // carries a stamp between those of the direct requests before and after it,
                // and is otherwise the same bytes.
                const created = (r) => JSON.parse(r.text).data[0].created;
                assert.ok(created(first) <= created(a) && created(a) <= created(b), `created ${created(first)}, ${created(a)}, ${created(b)}`);
                assert.equal(normCreated(a.text), normCreated(b.text));
            } else {
                assert.equal(a.text, b.text);
            }
        });
    }

    it('POST /generate (SGLang native) streams through unchanged', T, async () => {
        await fake.setScenario({ responses: [{ reasoning: ['hmm '], content: ['ok ', 'done'] }] });
        const body = { text: 'hello', sampling_params: { max_new_tokens: 16 }, stream: true, rid: 'gen-rid-1' };
        const a = await rawStream(lg.url + '/generate', body);
        const rec = await lastUpstreamRequest(fake, '/generate');
        assert.deepEqual(rec.body, body, '/generate body untouched (no rid rewrite, no stream_options)');
        const b = await rawStream(fake.url + '/generate', { ...body, rid: 'gen-rid-2' });
        assert.equal(a.status, 200);
        const strip = (t) => t.replace(/"e2e_latency":[0-9.e-]+/g, '').replace(/gen-rid-\d/g, 'R');
        assert.equal(strip(a.text), strip(b.text));
    });

    it('echo: method, query string exactly, end-to-end headers and Authorization forwarded', T, async () => {
        const q = '?a=1&b=%20x&c=&a=2&d=%2F&e=%E2%9C%93&f';
        const r = await request(lg.url + '/_fake/echo' + q, {
            method: 'PUT',
            headers: {
                Authorization: 'Bearer sk-secret-123',
                'X-Custom': 'one',
                'Content-Type': 'text/plain',
                Connection: 'keep-alive, X-Hop',
                'X-Hop': 'must-not-pass',
                'Keep-Alive': 'timeout=5',
                TE: 'trailers',
                'Proxy-Connection': 'keep-alive',
                Upgrade: 'websocket',
            },
            body: 'payload \u2713',
        });
        assert.equal(r.status, 200, r.text);
        const e = r.json();
        assert.equal(e.method, 'PUT');
        assert.equal(e.path, '/_fake/echo');
        assert.equal('?' + e.query, q);
        assert.equal(e.body, 'payload \u2713');
        assert.equal(e.headers.authorization, 'Bearer sk-secret-123');
        assert.equal(e.headers['x-custom'], 'one');
        assert.equal(e.headers['content-type'], 'text/plain');
        for (const h of ['x-hop', 'keep-alive', 'te', 'proxy-connection', 'upgrade'])
            assert.equal(e.headers[h], undefined, `hop-by-hop header ${h} forwarded`);
        assert.ok(!/x-hop/i.test(e.headers.connection || ''), 'Connection tokens forwarded');
        assert.doesNotMatch(lg.stderr(), /sk-secret-123/, 'Authorization never logged');
    });

    it("X-Forwarded-For: the client's list, however long, then the peer address", T, async () => {
        const list = Array.from({ length: 200 }, (_, i) => `10.0.${i >> 8}.${i & 255}`).join(', '); // ~2.5 KB
        const r = await request(lg.url + '/_fake/echo', { headers: { 'X-Forwarded-For': list } });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json().headers['x-forwarded-for'], `${list}, 127.0.0.1`);
    });

    it('an 8 MiB chunked request body streams to the upstream intact', T, async () => {
        const size = 8 << 20;
        const block = Buffer.alloc(65536);
        for (let i = 0; i < block.length; i++) block[i] = 97 + ((i * 7 + (i >> 9)) % 26);
        // Every block starts with its offset in hex: a reordered or lost block shows.
        const blockAt = (off) => {
            const b = Buffer.from(block);
            b.write(off.toString(16).padStart(8, '0'), 0, 'latin1');
            return b;
        };
        async function* gen() {
            for (let off = 0; off < size; off += block.length) yield blockAt(off);
        }
        const parts = [];
        for (let off = 0; off < size; off += block.length) parts.push(blockAt(off));
        const expected = Buffer.concat(parts).toString('latin1');
        const r = await request(lg.url + '/_fake/echo', { method: 'POST', body: gen(), headers: { 'content-type': 'application/octet-stream' }, timeout: 30000 });
        assert.equal(r.status, 200, r.text.slice(0, 300));
        const e = r.json();
        assert.equal(e.headers['transfer-encoding'] || e.headers['content-length'] !== undefined ? 'ok' : 'none', 'ok');
        assert.equal(e.body.length, size);
        assert.ok(e.body === expected, 'echoed body differs');
    });

    // The fake's /_fake/bytes stops after 262144 bytes and hangs (fake bug, reported), so
    // stay below that.
    it('a large response streams back intact', T, async () => {
        const r = await request(lg.url + '/_fake/bytes?n=250000');
        assert.equal(r.status, 200);
        assert.equal(r.headers['content-length'], '250000');
        assert.equal(r.body.length, 250000);
        assert.ok(r.body.every((c) => c === 0x78));
    });

    // The fake answers HEAD /_fake/echo with a body (a fake bug: node's parser rejects the
    // direct answer), so only loopguard's side is checked: the status and length of the
    // echo, no body.
    it('HEAD is forwarded as HEAD and gets headers without a body', T, async () => {
        const a = await request(lg.url + '/_fake/echo?h=1', { method: 'HEAD' });
        assert.equal(a.status, 200);
        assert.equal(a.body.length, 0);
        assert.ok(Number(a.headers['content-length']) > 0, 'content-length of the GET-equivalent body kept');
        const g = await request(lg.url + '/_fake/echo?h=1', { method: 'GET' });
        assert.equal(g.json().method, 'GET');
    });

    it('own endpoints: health, metrics count requests by endpoint and status', T, async () => {
        const h = await request(lg.url + '/loopguard/health');
        assert.equal(h.status, 200);
        const u = await request(lg.url + '/loopguard/upstreams');
        assert.equal(u.status, 200);
        const ups = u.json();
        assert.equal(ups.length, 1);
        assert.equal(ups[0].url, fake.url);
        assert.equal(ups[0].kind, 'sglang');
        assert.equal(ups[0].healthy, true);
        assertOpenAIError(await request(lg.url + '/loopguard/no-such-thing'), 404);
        assert.equal((await fake.requests()).filter((r) => r.path.startsWith('/loopguard')).length, 0, 'own endpoints never proxied');
        const before = await metrics(lg.url);
        const c0 = metricValue(before, 'loopguard_requests_total');
        await chat(lg.url + '/v1/chat/completions', { messages: MSG });
        await chat(lg.url + '/v1/chat/completions', { messages: 'x' });
        const m = await metrics(lg.url);
        assert.ok(metricValue(m, 'loopguard_requests_total') >= c0 + 2);
        assert.ok([...m.keys()].some((k) => k.startsWith('loopguard_requests_total{') && /"400"/.test(k)), 'a 400 is counted by status');
        assert.ok(m.has('loopguard_active_streams'));
        assert.ok([...m.keys()].some((k) => k.startsWith('loopguard_upstream_ttfb_seconds_bucket')));
        assert.ok([...m.keys()].some((k) => k.startsWith('loopguard_added_latency_seconds_bucket')));
    });
});

describe('chat relay behaviour', () => {
    let fake, lg;
    usePair({ fake: { kind: 'sglang' } }, (f, l) => ([fake, lg] = [f, l]));

    // While a connection is idle between requests, and while a request waits for its first
    // event, loopguard gives back the pages of its connection's buffer that libmicrohttpd
    // left zeroed; the head in that buffer must survive. Three requests on one connection,
    // 600 ms apart, each with a 6 KB header, each waiting 600 ms for the upstream twice:
    // its first attempt loops, and the retry, sent after the wait, must carry the client's
    // header intact.
    it('requests that wait for their first event on a keep-alive connection keep their head', T, async () => {
        await fake.setScenario({
            first_byte_ms: 600,
            responses: [{ match: { fields: { presence_penalty: null } }, content: ['Sure: ', { repeat: 'lambda ', times: -1 }] }, { content: ['A clean answer.'] }],
        });
        const sock = net.connect(lg.port, '127.0.0.1');
        await new Promise((r) => sock.on('connect', r));
        let got = '';
        sock.setEncoding('latin1');
        sock.on('data', (d) => (got += d));
        for (let i = 0; i < 3; i++) {
            if (i) await sleep(600);
            const pad = `${i}:` + 'abcdefghij'.repeat(600);
            const body = JSON.stringify({ messages: MSG, stream: true, max_tokens: 400 });
            sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Test-Pad: ${pad}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
            await waitFor(() => got.endsWith('\r\n0\r\n\r\n'), 8000 * SLACK);
            const sep = got.indexOf('\r\n\r\n');
            const head = got.slice(0, sep);
            const chunked = got.slice(sep + 4);
            got = '';
            assert.match(head, /^HTTP\/1\.1 200 /);
            let text = '';
            for (let rest = chunked; ; ) {
                const eol = rest.indexOf('\r\n');
                const n = parseInt(rest.slice(0, eol), 16);
                if (!n) break;
                text += rest.slice(eol + 2, eol + 2 + n);
                rest = rest.slice(eol + 4 + n);
            }
            assert.equal(sseData(text).at(-1), '[DONE]');
            assert.match(assembleDeltas(sseJSON(text)).content, /A clean answer\.$/);
            const reqs = (await fake.requests('/v1/chat/completions')).slice(-2);
            assert.equal(reqs.length, 2, 'the looping attempt and its retry');
            for (const r of reqs) assert.equal(r.headers['x-test-pad'], pad);
        }
        assert.equal(sock.destroyed, false, 'one connection for all three');
        sock.destroy();
    });

    // libmicrohttpd answers an HTTP/1.0 client without chunked encoding (it sends the body
    // as is and closes), so such a stream must not be written directly as chunks: the
    // events arrive bare, up to [DONE], and carry what an HTTP/1.1 client gets.
    it('an HTTP/1.0 client gets the events without chunk framing', T, async () => {
        await fake.setScenario({ pace_ms: 20, responses: [{ content: [{ varied: 12, seed: 3 }] }] });
        const body = JSON.stringify({ messages: MSG, stream: true });
        const sock = net.connect(lg.port, '127.0.0.1');
        let got = '';
        sock.setEncoding('latin1');
        sock.on('data', (d) => (got += d));
        const closed = new Promise((r) => sock.on('close', r));
        sock.write(`POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
        await closed;
        const sep = got.indexOf('\r\n\r\n');
        assert.match(got.slice(0, sep), /^HTTP\/1\.[01] 200 /);
        assert.doesNotMatch(got.slice(0, sep), /transfer-encoding/i);
        const text = got.slice(sep + 4);
        assert.match(text, /^data: /, 'no chunk-size line before the first event');
        assert.equal(sseData(text).at(-1), '[DONE]');
        const ref = await chat(lg.url + '/v1/chat/completions', { messages: MSG, stream: true });
        assert.equal(assembleDeltas(sseJSON(text)).content, assembleDeltas(sseJSON(ref.text)).content);
    });

    it('each event is forwarded when it arrives, not when the stream ends', T, async () => {
        await fake.setScenario({ pace_ms: 60, responses: [{ content: [{ varied: 12, seed: 3 }] }] });
        const u = new URL(lg.url + '/v1/chat/completions');
        const arrivals = await new Promise((resolve, reject) => {
            const times = [];
            const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
                let buf = '';
                res.setEncoding('utf8');
                res.on('data', (d) => {
                    buf += d;
                    const n = (buf.match(/"content":"[^"]/g) || []).length;
                    while (times.length < n) times.push(performance.now());
                });
                res.on('end', () => resolve(times));
            });
            req.on('error', reject);
            req.end(JSON.stringify({ messages: MSG, stream: true }));
        });
        assert.equal(arrivals.length, 12);
        // 12 tokens paced 60 ms apart: forwarded one by one they arrive over ~660 ms.
        const spread = arrivals.at(-1) - arrivals[0];
        assert.ok(spread > 400, `events arrived within ${spread.toFixed(0)} ms: buffered`);
        const gaps = arrivals.slice(1).map((t, i) => t - arrivals[i]);
        assert.ok(gaps.filter((g) => g > 20).length >= 8, `gaps ${gaps.map((g) => g.toFixed(0))}`);
    });

    it('metrics: an open stream is counted active, and no longer once it ended', T, async () => {
        await fake.setScenario({ pace_ms: 40, responses: [{ content: [{ varied: 15, seed: 9 }] }] });
        await fake.reset();
        const done = rawStream(lg.url + '/v1/chat/completions', { messages: MSG, stream: true });
        await fake.waitRecord((r) => r.kind === 'request' && r.path === '/v1/chat/completions', 2000);
        await sleep(100);
        assert.equal(metricValue(await metrics(lg.url), 'loopguard_active_streams'), 1);
        assert.equal((await done).status, 200);
        await waitFor(async () => metricValue(await metrics(lg.url), 'loopguard_active_streams') === 0, 2000);
    });

    it('Authorization, custom headers and unknown body fields reach the upstream', T, async () => {
        await fake.setScenario({ responses: [{ content: ['ok'] }] });
        const body = { model: 'm', messages: MSG, stream: true, logprobs: true, top_k: 20, custom_thing: { a: [1, 2, { b: null }] }, stream_options: { include_usage: false, extra: 1 } };
        const r = await chat(lg.url + '/v1/chat/completions', body, { Authorization: 'Bearer sk-abc', 'X-Request-Id': 'req-77' });
        assert.equal(r.status, 200);
        const rec = await lastUpstreamRequest(fake);
        assert.equal(rec.headers.authorization, 'Bearer sk-abc');
        assert.equal(rec.headers['x-request-id'], 'req-77');
        assert.equal(rec.body.logprobs, true);
        assert.equal(rec.body.top_k, 20);
        assert.deepEqual(rec.body.custom_thing, body.custom_thing);
        assert.equal(rec.body.stream_options.include_usage, true);
        assert.ok(!sseJSON(r.text).some((c) => c.usage), 'include_usage false: no usage chunk');
        assert.doesNotMatch(lg.stderr(), /sk-abc/);
    });

    it('keep-alive: several exchanges on one client connection', T, async () => {
        await fake.setScenario({ responses: [{ content: ['same ', 'socket'] }] });
        const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
        const u = new URL(lg.url);
        const ports = [];
        const one = (path, body) =>
            new Promise((resolve, reject) => {
                const req = http.request({ host: u.hostname, port: u.port, path, method: body ? 'POST' : 'GET', headers: body ? { 'content-type': 'application/json' } : {}, agent }, (res) => {
                    ports.push(res.socket.localPort);
                    let t = '';
                    res.setEncoding('utf8');
                    res.on('data', (d) => (t += d));
                    res.on('end', () => resolve({ status: res.statusCode, text: t }));
                });
                req.on('error', reject);
                req.end(body ? JSON.stringify(body) : undefined);
            });
        try {
            const a = await one('/v1/chat/completions', { messages: MSG, stream: true });
            const b = await one('/v1/chat/completions', { messages: MSG });
            const c = await one('/v1/models');
            const d = await one('/v1/chat/completions', { messages: MSG, stream: true });
            assert.equal(assembleDeltas(sseJSON(a.text)).content, 'same socket');
            assert.equal(JSON.parse(b.text).choices[0].message.content, 'same socket');
            assert.equal(c.status, 200);
            assert.equal(assembleDeltas(sseJSON(d.text)).content, 'same socket');
            assert.equal(new Set(ports).size, 1, `connections used: ${ports}`);
        } finally {
            agent.destroy();
        }
    });

    // A worker's requests take their small buffers from the blocks earlier requests gave
    // up (buf.h): nothing one request left in them may reach the next. One connection, a
    // long request with its own X-Forwarded-For, then short ones: each answer, upstream body
    // and X-Forwarded-For is exactly its own request's.
    it('keep-alive: a request after a longer one carries none of its bytes', T, async () => {
        const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
        const u = new URL(lg.url);
        const one = (body, headers = {}) =>
            new Promise((resolve, reject) => {
                const req = http.request({ host: u.hostname, port: u.port, path: '/v1/chat/completions', method: 'POST', headers: { 'content-type': 'application/json', ...headers }, agent }, (res) => {
                    let t = '';
                    res.setEncoding('utf8');
                    res.on('data', (d) => (t += d));
                    res.on('end', () => resolve({ status: res.statusCode, text: t }));
                });
                req.on('error', reject);
                req.end(JSON.stringify(body));
            });
        try {
            const long = 'SECRET-'.repeat(40);
            await fake.setScenario({ responses: [{ content: [long, 'tail of A'] }] });
            const a = await one({ model: 'model-of-a', messages: [{ role: 'user', content: 'PROMPT-A '.repeat(60) }], stream: true, user: 'user-a' }, { 'X-Forwarded-For': '203.0.113.77' });
            assert.equal(assembleDeltas(sseJSON(a.text)).content, long + 'tail of A');
            assert.equal((await lastUpstreamRequest(fake)).headers['x-forwarded-for'], '203.0.113.77, 127.0.0.1');
            await fake.setScenario({ responses: [{ content: ['b'] }] });
            for (const stream of [true, false]) {
                const b = await one({ messages: MSG, stream }, { accept: stream ? 'text/event-stream' : 'application/json' });
                assert.equal(b.status, 200);
                const content = stream ? assembleDeltas(sseJSON(b.text)).content : JSON.parse(b.text).choices[0].message.content;
                assert.equal(content, 'b');
                assert.doesNotMatch(b.text, /SECRET|PROMPT-A|tail of A|model-of-a|user-a|203\.0\.113/);
                const rec = await lastUpstreamRequest(fake);
                assert.equal(rec.headers['x-forwarded-for'], '127.0.0.1');
                // The exchange's own Accept, once: the client's is not sent beside it.
                assert.equal(rec.headers.accept, 'text/event-stream');
                assert.doesNotMatch(JSON.stringify(rec.body), /SECRET|PROMPT-A|model-of-a|user-a/);
            }
        } finally {
            agent.destroy();
        }
    });

    // A suspended connection's socket stays in libmicrohttpd's epoll set (worker.c keeps the
    // registration and drops its events until the resume), so what a client sends while
    // its stream is written, between requests and in parts must still be read. One
    // connection: a second request sent while the first streams, a third after an idle
    // pause, a fourth whose head comes in two writes.
    it('keep-alive: requests sent mid-stream, after a pause and in parts are all answered', T, async () => {
        await fake.setScenario({ pace_ms: 40, responses: [{ content: [{ varied: 8, seed: 5 }] }] });
        const sock = net.connect(lg.port, '127.0.0.1');
        await new Promise((r) => sock.on('connect', r));
        let got = '';
        sock.setEncoding('latin1');
        sock.on('data', (d) => (got += d));
        const body = JSON.stringify({ messages: MSG, stream: true });
        const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
        const ends = () => got.split('\r\n0\r\n\r\n').length - 1;
        const answers = (n) => {
            const texts = [];
            for (const part of got.split('\r\n0\r\n\r\n').slice(0, n)) {
                assert.match(part, /^HTTP\/1\.1 200 /);
                let text = '';
                for (let rest = part.slice(part.indexOf('\r\n\r\n') + 4); rest.length; ) {
                    const eol = rest.indexOf('\r\n');
                    const len = parseInt(rest.slice(0, eol), 16);
                    text += rest.slice(eol + 2, eol + 2 + len);
                    rest = rest.slice(eol + 4 + len);
                }
                texts.push(assembleDeltas(sseJSON(text)).content);
            }
            return texts;
        };
        sock.write(head + body);
        await waitFor(() => got.includes('data: '), 5000 * SLACK); // the stream's first event: suspended
        sock.write(head + body);
        await waitFor(() => ends() === 2, 8000 * SLACK);
        await sleep(400); // idle between requests, past a tick
        sock.write(head + body);
        await waitFor(() => ends() === 3, 8000 * SLACK);
        sock.write(head.slice(0, 20));
        await sleep(100);
        sock.write(head.slice(20) + body);
        await waitFor(() => ends() === 4, 8000 * SLACK);
        const texts = answers(4);
        assert.equal(new Set(texts).size, 1, 'the same answer four times');
        assert.ok(texts[0].trim().split(' ').length >= 8, texts[0]);
        assert.equal(sock.destroyed, false, 'one connection for all four');
        sock.destroy();
    });

    it('Expect: 100-continue from the client is honoured', T, async () => {
        await fake.setScenario({ responses: [{ content: ['continued'] }] });
        const body = JSON.stringify({ messages: MSG });
        const u = new URL(lg.url);
        const r = await new Promise((resolve, reject) => {
            let gotContinue = false;
            const req = http.request({ host: u.hostname, port: u.port, path: '/v1/chat/completions', method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), expect: '100-continue' } }, (res) => {
                let t = '';
                res.setEncoding('utf8');
                res.on('data', (d) => (t += d));
                res.on('end', () => resolve({ status: res.statusCode, text: t, gotContinue }));
            });
            req.on('continue', () => {
                gotContinue = true;
                req.end(body);
            });
            req.on('error', reject);
            req.flushHeaders();
        });
        assert.ok(r.gotContinue, '100 Continue received');
        assert.equal(r.status, 200);
        assert.equal(JSON.parse(r.text).choices[0].message.content, 'continued');
    });

    it('40 concurrent streams each get their own answer', T, async () => {
        const topics = ['apples', 'boats', 'clouds', 'dunes'];
        await fake.setScenario({ pace_ms: 3, responses: topics.map((t) => ({ match: { prompt_contains: t }, content: [`About ${t}: `, { varied: 30, seed: t.length }] })) });
        const jobs = [];
        for (let i = 0; i < 40; i++) {
            const t = topics[i % topics.length];
            jobs.push(rawStream(lg.url + '/v1/chat/completions', { messages: [{ role: 'user', content: `tell me about ${t}` }], stream: i % 2 === 0 }).then((r) => [t, i % 2 === 0, r]));
        }
        const expected = {};
        for (const t of topics) {
            const d = await chat(fake.url + '/v1/chat/completions', { messages: [{ role: 'user', content: `tell me about ${t}` }] });
            expected[t] = d.json().choices[0].message.content;
        }
        for (const [t, stream, r] of await Promise.all(jobs)) {
            assert.equal(r.status, 200);
            const content = stream ? assembleDeltas(sseJSON(r.text)).content : r.json().choices[0].message.content;
            assert.equal(content, expected[t], `${t} (stream ${stream})`);
        }
        const m = await metrics(lg.url);
        assert.equal(metricValue(m, 'loopguard_active_streams'), 0, 'no stream left active');
    });
});

describe('upstream kind', () => {
    const fakes = [];
    const lgs = [];
    after(async () => {
        for (const l of lgs) await l.stop();
        for (const f of fakes) await f.stop();
    });
    async function pair(kind, lgOpts = {}, scenario) {
        const f = await startFake({ kind, scenario });
        fakes.push(f);
        const l = await startLoopguard({ upstream: f.url, ...lgOpts });
        lgs.push(l);
        return [f, l];
    }
    const LOOP = {
        responses: [
            { match: { fields: { presence_penalty: null } }, content: ['Fine: ', { repeat: 'lambda ', times: -1 }] },
            { content: ['A clean answer after all.'] },
        ],
    };

    for (const [kind, rid] of [
        ['sglang', true],
        ['vllm', false],
        ['openai', false],
    ]) {
        it(`auto probe: ${kind} ${rid ? 'gets' : 'never gets'} rid; repetition_penalty ${kind === 'openai' ? 'never' : 'reaches it'} on retry`, T, async () => {
            const [f, l] = await pair(kind, { config: { retry: { max_attempts: 2, ladder: [{ presence_penalty: 1.0, repetition_penalty: 1.1 }] } } }, { dialect: kind === 'sglang' ? 'sglang' : 'openai', ...LOOP });
            const r = await chat(l.url + '/v1/chat/completions', { messages: MSG, temperature: 0.6, max_tokens: 400 });
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json().choices[0].message.content, 'A clean answer after all.');
            const reqs = await f.requests('/v1/chat/completions');
            assert.equal(reqs.length, 2, 'one retry after the loop');
            for (const q of reqs) assert.equal('rid' in q.body, rid, `rid in ${JSON.stringify(q.body)}`);
            assert.equal(reqs[1].body.presence_penalty, 1.0);
            if (kind === 'openai') assert.equal(reqs[1].body.repetition_penalty, undefined);
            else assert.equal(reqs[1].body.repetition_penalty, 1.1);
        });
    }

    it('a retried text completion keeps its prompt', T, async () => {
        const [f, l] = await pair('sglang', {}, {
            responses: [
                { match: { fields: { presence_penalty: null } }, content: ['Fine: ', { repeat: 'lambda ', times: -1 }] },
                { content: ['A clean completion.'] },
            ],
        });
        const r = await chat(l.url + '/v1/completions', { model: 'm', prompt: 'Complete this: ', max_tokens: 400 });
        assert.equal(r.status, 200, r.text);
        const reqs = await f.requests('/v1/completions');
        assert.ok(reqs.length >= 2, 'the loop was retried');
        for (const q of reqs) assert.equal(q.body.prompt, 'Complete this: ', JSON.stringify(q.body));
        assert.equal(r.json().choices[0].text, 'A clean completion.');
    });

    it('--upstream-kind overrides the probe (sglang server driven as vllm: no rid)', T, async () => {
        const [f, l] = await pair('sglang', { kind: 'vllm' });
        const r = await chat(l.url + '/v1/chat/completions', { messages: MSG, stream: true });
        assert.equal(r.status, 200);
        const q = await lastUpstreamRequest(f);
        assert.equal(q.body.rid, undefined);
        assert.equal((await f.requests('/get_model_info')).length, 0, 'no probe when the kind is given');
    });
});

describe('client disconnect', () => {
    let fake, lg, vfake, vlg;
    const FOREVER = { pace_ms: 10, responses: [{ content: [{ varied: -1, seed: 7 }] }] };
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: FOREVER });
        lg = await startLoopguard({ upstream: fake.url });
        vfake = await startFake({ kind: 'vllm', scenario: FOREVER });
        vlg = await startLoopguard({ upstream: vfake.url });
    });
    after(async () => {
        await lg?.stop();
        await fake?.stop();
        await vlg?.stop();
        await vfake?.stop();
    });

    it('sglang: stream client hangs up -> upstream closed within 1 s and POST /abort_request {rid}', T, async () => {
        await fake.reset();
        const s = await streamUntil(lg.url + '/v1/chat/completions', { messages: MSG, stream: true, max_tokens: 100000 }, { until: (t) => sse(t).length >= 5 });
        assert.equal(s.status, 200);
        assert.ok(s.closedAt);
        const gen = await fake.waitRecord((r) => r.kind === 'generation', 1000 * SLACK + 500);
        const took = performance.now() - s.closedAt;
        assert.ok(took < 1000 * SLACK, `generation ended ${took.toFixed(0)} ms after the hang-up`);
        assert.ok(gen.client_gone || gen.aborted, JSON.stringify(gen));
        assert.ok(gen.tokens_sent < 300, `the GPU kept going: ${gen.tokens_sent} tokens`);
        const rec = await lastUpstreamRequest(fake);
        const ab = await fake.waitRecord((r) => r.kind === 'abort', 1000 * SLACK);
        assert.equal(ab.rid, rec.rid);
        assert.ok(typeof rec.rid === 'string' && rec.rid.length > 0);
    });

    it('sglang: whole client hangs up -> the generation stops within ~1 s', T, async () => {
        await fake.reset();
        const sock = net.connect(lg.port, '127.0.0.1');
        await new Promise((r) => sock.on('connect', r));
        const body = JSON.stringify({ messages: MSG, max_tokens: 100000 });
        sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
        await fake.waitRecord((r) => r.kind === 'request' && r.path === '/v1/chat/completions', 2000);
        await sleep(200);
        const at = performance.now();
        sock.destroy();
        const gen = await fake.waitRecord((r) => r.kind === 'generation', 2000 * SLACK + 1000);
        const took = performance.now() - at;
        // The connection is suspended while loopguard waits for upstream events, so it
        // notices the hang-up at its next wake-up; the issue gives it a second.
        assert.ok(took < 1500 * SLACK, `generation ended ${took.toFixed(0)} ms after the hang-up`);
        assert.ok(gen.client_gone || gen.aborted);
        const rec = await lastUpstreamRequest(fake);
        const ab = await fake.waitRecord((r) => r.kind === 'abort', 1000 * SLACK);
        assert.equal(ab.rid, rec.rid, 'SGLang told to abort the whole request too');
    });

    it('vllm: hang-up closes the upstream transfer within 1 s, no /abort_request', T, async () => {
        await vfake.reset();
        const s = await streamUntil(vlg.url + '/v1/chat/completions', { messages: MSG, stream: true, max_tokens: 100000 }, { until: (t) => sse(t).length >= 5 });
        const gen = await vfake.waitRecord((r) => r.kind === 'generation', 2000 * SLACK);
        assert.ok(performance.now() - s.closedAt < 1000 * SLACK);
        assert.ok(gen.client_gone, JSON.stringify(gen));
        await sleep(100);
        assert.equal((await vfake.requests('/abort_request')).length, 0);
    });
});

describe('errors', () => {
    let fake, lg;
    const config = { max_body_bytes: 4096, timeouts: { first_byte_ms: 400 * SLACK, idle_ms: 400 * SLACK } };
    usePair({ fake: { kind: 'sglang' }, lg: { config } }, (f, l) => ([fake, lg] = [f, l]));
    const url = () => lg.url + '/v1/chat/completions';

    // Runs a streaming request under `scenario` that must end, once started, with one error
    // event and one [DONE]; returns the error object and the content before it.
    async function erroredStream(scenario) {
        await fake.setScenario(scenario);
        const r = await rawStream(url(), { messages: MSG, stream: true });
        assert.equal(r.status, 200, r.text);
        const data = sseData(r.text);
        assert.equal(data.at(-1), '[DONE]');
        assert.equal(data.filter((d) => d === '[DONE]').length, 1);
        const err = JSON.parse(data.at(-2)).error;
        assert.ok(err && typeof err.message === 'string', data.at(-2));
        const chunks = sseJSON(r.text);
        assert.ok(!chunks.some((j) => j.usage), 'no usage chunk: the client did not ask');
        return { err, content: assembleDeltas(chunks.filter((j) => !j.error)).content };
    }

    const BAD = [
        ['bad JSON', '{"messages": [', 'application/json'],
        ['body not an object', '[1,2,3]'],
        ['messages not an array', { messages: 'hello' }],
        ['messages missing', { model: 'm' }],
        ['stream not a boolean', { messages: MSG, stream: 'yes' }],
    ];
    for (const [name, body] of BAD) {
        it(`400 on ${name}, nothing sent upstream`, T, async () => {
            await fake.reset();
            const r = await request(url(), { method: 'POST', body, headers: { 'content-type': 'application/json' } });
            assertOpenAIError(r, 400);
            assert.equal((await fake.requests('/v1/chat/completions')).length, 0);
        });
    }

    it('400 on a text completion without a usable body', T, async () => {
        const r = await request(lg.url + '/v1/completions', { method: 'POST', body: 'nope', headers: { 'content-type': 'application/json' } });
        assertOpenAIError(r, 400);
    });

    it('413 on a body over max_body_bytes (Content-Length and chunked)', T, async () => {
        const big = { messages: [{ role: 'user', content: 'x'.repeat(5000) }] };
        assertOpenAIError(await chat(url(), big), 413);
        async function* chunks() {
            const s = JSON.stringify(big);
            for (let i = 0; i < s.length; i += 1000) yield Buffer.from(s.slice(i, i + 1000));
        }
        assertOpenAIError(await request(url(), { method: 'POST', body: chunks(), headers: { 'content-type': 'application/json' } }), 413);
    });

    it('504 when the upstream sends no headers before timeouts.first_byte_ms (stream and whole)', T, async () => {
        await fake.setScenario({ first_byte_ms: 3000, responses: [{ content: ['late'] }] });
        const t0 = performance.now();
        assertOpenAIError(await chat(url(), { messages: MSG, stream: true }), 504);
        assert.ok(performance.now() - t0 < 2500, 'timed out late');
        assertOpenAIError(await chat(url(), { messages: MSG }), 504);
    });

    it('idle timeout after the stream started: error event then [DONE]', T, async () => {
        const { content } = await erroredStream({ responses: [{ content: ['one ', 'two ', 'three ', 'four'], fault: { kind: 'stall', at_token: 2 } }] });
        assert.equal(content, 'one two ');
    });

    it('idle timeout on a whole request: 504', T, async () => {
        await fake.setScenario({ responses: [{ content: ['one ', 'two ', 'three'], fault: { kind: 'stall', at_token: 2 } }] });
        assertOpenAIError(await chat(url(), { messages: MSG }), 504);
    });

    it('slow start (headers, then no event for longer than idle_ms): 504 or error event', T, async () => {
        await fake.setScenario({ responses: [{ content: ['late'], fault: { kind: 'slow_start', ms: 3000 } }] });
        const r = await rawStream(url(), { messages: MSG, stream: true });
        if (r.status === 200) {
            const data = sseData(r.text);
            assert.equal(data.at(-1), '[DONE]');
            assert.ok(JSON.parse(data.at(-2)).error);
        } else assertOpenAIError(r, 504);
        assertOpenAIError(await chat(url(), { messages: MSG }), 504);
    });

    const ERR_SCEN = (pace) => ({
        pace_ms: pace,
        responses: [{ content: ['Some words ', 'and more ', 'never ', 'sent'], fault: { kind: 'error_event', at_token: 2, message: 'GPU on fire' } }],
    });
    async function midStreamError(pace) {
        const { err, content } = await erroredStream(ERR_SCEN(pace));
        assert.equal(err.message, 'GPU on fire');
        assert.equal(content, 'Some words ', 'the two tokens before the fault');
    }

    it('a mid-stream upstream error event is passed on, then [DONE] (paced upstream)', T, async () => {
        await midStreamError(20);
    });

    // With pace 0 the tokens and the error event arrive in one read: the tokens must still
    // reach the client before the error event (once answered as a JSON 500, fixed in 30d90cc).
    it('a mid-stream upstream error event is passed on, then [DONE] (unpaced upstream)', T, async () => {
        await midStreamError(0);
    });

    it('a mid-stream upstream error on a whole request is an OpenAI error', T, async () => {
        await fake.setScenario(ERR_SCEN(0));
        const r = await request(url(), { method: 'POST', body: { messages: MSG }, timeout: 3000 });
        assert.ok(r.status >= 500, `status ${r.status}`);
        assert.match(assertOpenAIError(r, r.status).message, /GPU on fire/);
    });

    for (const status of [500, 503, 400, 429]) {
        it(`upstream HTTP ${status} is passed on as it came (stream and whole)`, T, async () => {
            await fake.setScenario({ responses: [{ content: ['x'], fault: { kind: 'http_status', status, message: `upstream says ${status}` } }] });
            const direct = await chat(fake.url + '/v1/chat/completions', { messages: MSG, stream: true });
            for (const stream of [true, false]) {
                const r = await chat(url(), { messages: MSG, stream });
                assert.equal(r.status, status);
                assert.equal(r.text, direct.text);
                assert.equal(r.headers['content-type'], direct.headers['content-type']);
            }
        });
    }

    it('an upstream reset mid-stream ends the client stream with an error event and [DONE]', T, async () => {
        const { content } = await erroredStream({ pace_ms: 20, responses: [{ content: ['a ', 'b ', 'c ', 'd'], fault: { kind: 'reset', at_token: 2 } }] });
        assert.equal(content, 'a b ');
    });

    it('garbage lines in the upstream stream are survived (stream and whole)', T, async () => {
        for (const pace of [0, 20]) {
            await fake.setScenario({ pace_ms: pace, responses: [{ content: ['a ', 'b ', 'c ', 'd'], fault: { kind: 'garbage', at_token: 2 } }] });
            const r = await rawStream(url(), { messages: MSG, stream: true });
            assert.equal(r.status, 200);
            const data = sseData(r.text);
            assert.equal(data.at(-1), '[DONE]');
            const chunks = sseJSON(r.text); // every data line the client sees is JSON
            assert.equal(assembleDeltas(chunks).content, 'a b c d');
            assert.equal(assembleDeltas(chunks).finish_reason, 'stop');
            const w = await chat(url(), { messages: MSG });
            assert.equal(w.status, 200);
            assert.equal(w.json().choices[0].message.content, 'a b c d');
        }
    });

    it('a truncated chunked upstream body: error event then [DONE] (stream), 502 (whole)', T, async () => {
        const { content } = await erroredStream({ pace_ms: 20, responses: [{ content: ['a ', 'b ', 'c ', 'd'], fault: { kind: 'truncated_chunked', at_token: 2 } }] });
        assert.equal(content, 'a b ');
        assertOpenAIError(await chat(url(), { messages: MSG }), 502);
    });

    it('upstream closes before any header: 502', T, async () => {
        await fake.setScenario({ responses: [{ content: ['x'], fault: { kind: 'close_before_headers' } }] });
        assertOpenAIError(await chat(url(), { messages: MSG, stream: true }), 502);
        assertOpenAIError(await chat(url(), { messages: MSG }), 502);
    });

    it('upstream answers 200 text/plain instead of SSE: an OpenAI 5xx error', T, async () => {
        await fake.setScenario({ responses: [{ content: ['x'], fault: { kind: 'not_sse' } }] });
        for (const stream of [true, false]) {
            const r = await chat(url(), { messages: MSG, stream });
            assert.ok(r.status >= 500 && r.status < 600, `status ${r.status}`);
            assertOpenAIError(r, r.status);
        }
    });

    it('502 when nothing listens upstream (chat stream, whole, pass-through)', T, async () => {
        const l = await startLoopguard({ upstream: `http://127.0.0.1:${await deadPort()}`, kind: 'sglang' });
        try {
            assertOpenAIError(await chat(l.url + '/v1/chat/completions', { messages: MSG, stream: true }), 502);
            assertOpenAIError(await chat(l.url + '/v1/chat/completions', { messages: MSG }), 502);
            assertOpenAIError(await request(l.url + '/v1/models'), 502);
            assert.ok(metricValue(await metrics(l.url), 'loopguard_upstream_errors_total') >= 3, 'upstream errors counted');
        } finally {
            await l.stop();
        }
    });
});

describe('configuration', () => {
    it('--check-config accepts a valid file', T, async () => {
        const f = tmpFile('ok.json', JSON.stringify({ listen: '127.0.0.1:0', timeouts: { idle_ms: 1000 }, reasoning: { output: 'inline' } }));
        const r = await runLoopguard(['--check-config', f]);
        assert.equal(r.code, 0, r.stderr);
    });

    it('--check-config rejects an unknown key and names it', T, async () => {
        const f = tmpFile('bad.json', JSON.stringify({ retry: { max_atempts: 2 } }));
        const r = await runLoopguard(['--check-config', f]);
        assert.notEqual(r.code, 0);
        assert.match(r.stderr, /retry\.max_atempts/);
    });

    it('--check-config rejects a mistyped value and names the key', T, async () => {
        const f = tmpFile('bad2.json', JSON.stringify({ timeouts: { idle_ms: 'soon' } }));
        const r = await runLoopguard(['--check-config', f]);
        assert.notEqual(r.code, 0);
        assert.match(r.stderr, /timeouts\.idle_ms/);
    });

    it('a fixed listen port is the one the startup line names and the one that answers', T, async () => {
        const port = await deadPort();
        const lg = await startLoopguard({ upstream: `http://127.0.0.1:${await deadPort()}`, listen: `127.0.0.1:${port}` });
        try {
            assert.equal(lg.port, port, `startup line: ${lg.stdout()}`);
            const r = await request(`${lg.url}/loopguard/health`);
            assert.equal(r.status, 200, r.text);
        } finally {
            await lg.stop();
        }
    });

    it('loopguard refuses to start with an unknown key', T, async () => {
        const f = tmpFile('bad3.json', JSON.stringify({ listen: '127.0.0.1:0', bogus: 1 }));
        const r = await runLoopguard(['--config', f]);
        assert.notEqual(r.code, 0);
        assert.match(r.stderr, /bogus/);
    });
});

describe('shutdown (SIGTERM)', () => {
    let fake;
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: { pace_ms: 30, responses: [{ content: [{ varied: 25, seed: 5 }] }] } });
    });
    after(async () => {
        await fake?.stop();
    });

    it('a running stream finishes within shutdown_grace_ms, then loopguard exits 0', T, async () => {
        const lg = await startLoopguard({ upstream: fake.url, config: { shutdown_grace_ms: 5000 } });
        try {
            let signalled = false;
            const done = rawStream(lg.url + '/v1/chat/completions', { messages: MSG, stream: true });
            await fake.waitRecord((r) => r.kind === 'request' && r.path === '/v1/chat/completions', 2000);
            await sleep(100);
            lg.proc.kill('SIGTERM');
            signalled = true;
            const r = await done;
            assert.ok(signalled);
            assert.equal(r.status, 200);
            assert.equal(sseData(r.text).at(-1), '[DONE]');
            assert.equal(assembleDeltas(sseJSON(r.text)).finish_reason, 'stop');
            const gen = await fake.waitRecord((g) => g.kind === 'generation', 2000);
            assert.equal(gen.ended, 'complete');
            assert.equal(gen.tokens_sent, 25);
        } finally {
            await lg.stop();
        }
    });

    it('past shutdown_grace_ms the stream is ended, the upstream freed, exit 0', T, async () => {
        await fake.reset();
        const lg = await startLoopguard({ upstream: fake.url, config: { shutdown_grace_ms: 200 } });
        try {
            const done = rawStream(lg.url + '/v1/chat/completions', { messages: MSG, stream: true }).catch((e) => ({ error: e }));
            await fake.waitRecord((r) => r.kind === 'request' && r.path === '/v1/chat/completions', 2000);
            await sleep(100);
            const t0 = performance.now();
            lg.proc.kill('SIGTERM');
            await lg.stop(); // asserts exit code 0
            assert.ok(performance.now() - t0 < 3000 * SLACK, 'exit took too long');
            const r = await done;
            if (!r.error) assert.ok(!sseJSON(r.text).some((c) => c.choices?.[0]?.finish_reason === 'stop'), 'the stream was not cut');
            const gen = await fake.waitRecord((g) => g.kind === 'generation', 2000);
            assert.ok(gen.client_gone || gen.aborted, JSON.stringify(gen));
            assert.ok(gen.tokens_sent < 25);
        } finally {
            await lg.stop();
        }
    });
});
