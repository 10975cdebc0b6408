// The HTTP edge against an attacker (README "Security"): raw sockets against loopguard in
// front of the C fake upstream and in front of tests/lenient/lenient_upstream.py, an upstream
// that parses heads as Python's http.server does (a bare CR ends a line there) and logs every
// request it parses. For each way a client could get something past loopguard the suite
// shows the upstream never sees it; a multi-client run over pooled upstream connections
// shows no answer crosses to another client; the stall and memory cases are measured (a
// health probe answered meanwhile, peak RSS from /proc), never timed.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';

import { startFake, startLoopguard, request, cleanup, waitFor, sleep, tmpFile, assertOpenAIError, DEADLINE, isSanitizerBuild, isSlowBuild } from './lib.mjs';

const T = DEADLINE;
const here = path.dirname(fileURLToPath(import.meta.url));
const LENIENT = path.resolve(here, '../lenient/lenient_upstream.py');
const SLACK = isSlowBuild ? 4 : 1;
const KEY_A = 'sk-edge-client-a';
const KEY_B = 'sk-edge-client-b';
const ADMIN = 'adm-edge-secret';

// ---- the two upstreams, behind one interface: seen() lists the requests that reached it ----

// Requests that came from clients: loopguard's own health checks (GET /health, sent by
// itself, so without X-Forwarded-For) arrive whenever its checker runs and are left out.
const fromClients = (list) => list.filter((r) => !(r.method === 'GET' && r.path === '/health' && !r.headers['x-forwarded-for']));

async function startLenient() {
    const portFile = tmpFile('lenient-port', '');
    fs.rmSync(portFile);
    const proc = spawn('python3', [LENIENT, portFile], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    proc.stderr.on('data', (d) => (err += d));
    const exited = new Promise((r) => proc.on('exit', r));
    const port = await waitFor(() => fs.existsSync(portFile) && Number(fs.readFileSync(portFile, 'utf8')), 15000);
    const url = `http://127.0.0.1:${port}`;
    return {
        name: 'lenient Python upstream',
        url,
        kind: 'openai',
        async seen() {
            const r = await request(url + '/_lenient/log');
            assert.equal(r.status, 200, `lenient log: ${err}`);
            return fromClients(r.json().map((e) => ({ method: e.method, path: e.path, headers: Object.fromEntries(e.headers.map(([k, v]) => [k.toLowerCase(), v])), rawHeaders: e.headers, body: e.body })));
        },
        async reset() {
            await request(url + '/_lenient/reset', { method: 'POST' });
        },
        async stop() {
            proc.kill('SIGTERM');
            await exited;
        },
    };
}

async function startC() {
    const fake = await startFake({ kind: 'openai' });
    return {
        name: 'C fake upstream',
        url: fake.url,
        kind: 'openai',
        fake,
        async seen() {
            return fromClients((await fake.requests()).map((r) => ({ method: r.method, path: r.path, headers: r.headers, rawHeaders: Object.entries(r.headers), body: r.body })));
        },
        reset: () => fake.reset(),
        stop: () => fake.stop(),
    };
}

// ---- raw sockets ---------------------------------------------------------------------------

// Sends `bytes` on a fresh connection and collects what comes back until the server closes
// (or `ms` pass). Returns {text, status, closed, headers}.
function raw(port, bytes, { ms = 5000 * SLACK, localAddress, host = '127.0.0.1' } = {}) {
    return new Promise((resolve) => {
        const s = net.connect({ port, host, localAddress });
        let out = Buffer.alloc(0);
        const done = (closed) => {
            clearTimeout(t);
            s.destroy();
            const text = out.toString('latin1');
            const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
            const head = text.slice(0, text.indexOf('\r\n\r\n') + 1);
            resolve({ text, closed, status: m ? Number(m[1]) : 0, head, body: text.slice(text.indexOf('\r\n\r\n') + 4) });
        };
        const t = setTimeout(() => done(false), ms);
        s.on('data', (d) => (out = Buffer.concat([out, d])));
        s.on('error', () => {});
        s.on('end', () => done(true));
        s.on('close', () => done(true));
        s.write(bytes);
    });
}

const auth = `Authorization: Bearer ${KEY_A}\r\n`;
const smuggled = 'POST /abort_request HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 18\r\n\r\n{"abort_all":true}';
const chunk = (s) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;

// Requests loopguard must refuse before anything is routed: [name, bytes, status, by]
// (by: 'libmicrohttpd' when its parser refuses first, with its own HTML page).
const REFUSED = [
    ['bare CR in a header value carrying a second request (1)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}X-A: a\rContent-Length: 0\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`, 400],
    ['bare CR alone in a value (1)', `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}X-A: a\rX-B: b\r\n\r\n`, 400],
    ['Content-Length with Transfer-Encoding (2)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n${chunk(smuggled)}0\r\n\r\n`, 400],
    ['Transfer-Encoding: xchunked (2)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: xchunked\r\n\r\n${chunk('{}')}0\r\n\r\n`, 501],
    ['Transfer-Encoding: gzip, chunked (2)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: gzip, chunked\r\n\r\n${chunk('{}')}0\r\n\r\n`, 501],
    ['Transfer-Encoding twice (2)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n${chunk('{}')}0\r\n\r\n`, 400],
    ['"Transfer-Encoding :" beside a Content-Length (10)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding : chunked\r\nContent-Length: ${chunk('{}').length + 5}\r\n\r\n${chunk('{}')}0\r\n\r\n`, 400],
    ['obs-fold carrying a framing header (10)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}X-A: x\r\n Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}`, 400],
    ['conflicting Content-Lengths (10)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}`, 400],
    ['duplicate Host (10)', `GET /v1/models HTTP/1.1\r\nHost: x\r\nHost: evil\r\n${auth}\r\n`, 400],
    ['HTTP/1.1 without Host', `GET /v1/models HTTP/1.1\r\n${auth}\r\n`, 400],
    ['control byte in a field name', `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}X\x01A: v\r\n\r\n`, 400],
    ['control byte in a field name after 40 others (the field list outgrows its first 32)', `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}${Array.from({ length: 40 }, (_, i) => `X-F${i}: v\r\n`).join('')}X\x01A: v\r\n\r\n`, 400],
    ['HTTP/1.2', `GET /v1/models HTTP/1.2\r\nHost: x\r\n${auth}\r\n`, 505],
    // What libmicrohttpd hides from the access handler, caught on the raw bytes (hh_stream):
    ['obs-fold (10)', `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}X-A: one\r\n two\r\n\r\n`, 400],
    ['obs-fold with a tab, folding Authorization (10)', `GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n\t${KEY_A}\r\n\r\n`, 400],
    ['whitespace before the first header field (10)', `GET /v1/models HTTP/1.1\r\n Host: x\r\nHost: x\r\n${auth}\r\n`, 400],
    ['NUL in a header value hiding a Content-Length (10)', `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}X-A: abc\0Content-Length: 99\r\n\r\n`, 400],
    ['NUL starting a header line (ends the head for libmicrohttpd) (10)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}\0Content-Length: ${smuggled.length}\r\n\r\n${smuggled}`, 400],
    // libmicrohttpd refuses this one itself (the line has no colon before the NUL), with its own page.
    ['NUL in a header name (10)', `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}X-\0A: v\r\n\r\n`, 400, 'libmicrohttpd'],
    ['NUL in the request target (10)', `GET /v1/models\0/../../abort_request HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 400],
    ['NUL in an empty line before the request line (10)', `\0\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 400],
    ['Transfer-Encoding "chunked " (libmicrohttpd would read to the close)', `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: chunked \r\n\r\n${chunk('{}')}0\r\n\r\n`, 400],
    ['dot segments to the guarded route (5)', `POST /x/../v1/chat/completions HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 2\r\n\r\n{}`, 400],
    ['encoded dot segments (5)', `POST /v1/models/%2e%2E/chat/completions HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 2\r\n\r\n{}`, 400],
    ['encoded slashes (5)', `POST /v1%2Fchat%2Fcompletions HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 2\r\n\r\n{}`, 400],
    ['a space in the target (6)', `GET /v1/models b HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 400],
    ['a fragment in the target (6)', `GET /v1/models#x HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 400],
    ['a tab in the query (6)', `GET /v1/models?a=\tb HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 400],
    ['600 query arguments (10)', `GET /v1/models?${Array.from({ length: 600 }, (_, i) => `a${i}=1`).join('&')} HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 414],
];

// Upstream control routes a client must not reach (9): all 404 with an OpenAI error.
const CONTROL = ['/abort_request', '/flush_cache', '/update_weights_from_disk', '/update_weights_from_tensor', '/init_weights_update_group', '/start_profile', '/stop_profile', '/v1/load_lora_adapter', '/v1/unload_lora_adapter', '/reset_prefix_cache', '/sleep', '/wake_up', '/configure_logging'];

function assertClean(headers, what) {
    for (const [k, v] of Object.entries(headers)) {
        assert.doesNotMatch(k, /[\r\n\0 :]/, `${what}: header name ${JSON.stringify(k)}`);
        assert.doesNotMatch(String(v), /[\r\n\0]/, `${what}: header ${k} value ${JSON.stringify(v)}`);
    }
}

async function admin(lg, p) {
    return request(lg.url + p, { headers: { authorization: `Bearer ${ADMIN}` } });
}

for (const start of [startC, startLenient]) {
    describe(`edge in front of the ${start === startC ? 'C fake' : 'lenient Python'} upstream`, () => {
        let up, lg;
        before(async () => {
            up = await start();
            lg = await startLoopguard({
                upstream: up.url,
                kind: up.kind,
                config: {
                    workers: 1,
                    api_keys: [KEY_A, KEY_B],
                    admin: { token: ADMIN },
                    passthrough: { allow: ['/_fake/*'] },
                    health: { interval_ms: 3600000, unhealthy_after: 2 },
                },
            });
        });
        after(() => cleanup(() => lg?.stop(), () => up?.stop()));

        for (const [name, bytes, status, by] of REFUSED) {
            it(`${name}: ${status}, the connection closed, nothing upstream`, T, async () => {
                await up.reset();
                const r = await raw(lg.port, Buffer.from(bytes, 'latin1'));
                assert.equal(r.status, status, `${name}: ${r.text.slice(0, 200)}`);
                assert.match(r.head, /\r\nConnection: close\r\n/i, 'the refusal closes the connection');
                assert.ok(r.closed, 'loopguard closed the connection');
                if (by !== 'libmicrohttpd') {
                    const err = JSON.parse(r.body).error;
                    assert.equal(err.type, 'invalid_request_error');
                    assert.ok(err.message && err.code, JSON.stringify(err));
                }
                assert.deepEqual(await up.seen(), [], 'nothing reached the upstream');
            });
        }

        it('control routes are closed (9): 404 with an OpenAI error, nothing upstream', T, async () => {
            await up.reset();
            for (const p of CONTROL) {
                const r = await request(lg.url + p, { method: 'POST', headers: { authorization: `Bearer ${KEY_A}` }, body: { abort_all: true } });
                assertOpenAIError(r, 404);
            }
            assert.deepEqual(await up.seen(), []);
        });

        it('targets libcurl would refuse never count against the replica (6)', T, async () => {
            // A replica is healthy once it answered (upstream.h): one real request first.
            assert.equal((await request(lg.url + '/v1/models', { headers: { authorization: `Bearer ${KEY_A}` } })).status, 200);
            for (let i = 0; i < 6; i++) {
                assert.equal((await raw(lg.port, `GET /a b HTTP/1.1\r\nHost: x\r\n${auth}\r\n`)).status, 400);
                assert.equal((await raw(lg.port, `GET /v1/models#frag HTTP/1.1\r\nHost: x\r\n${auth}\r\n`)).status, 400);
            }
            const ups = (await admin(lg, '/loopguard/upstreams')).json();
            assert.equal(ups[0].healthy, true, JSON.stringify(ups));
            const m = (await admin(lg, '/loopguard/metrics')).text;
            assert.doesNotMatch(m, /^loopguard_upstream_errors_total\{[^}]*\} [1-9]/m, 'no upstream error counted');
        });

        it('an encoded unreserved character is routed, guarded, on the normalised path (5)', T, async () => {
            await up.reset();
            const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 });
            const r = await raw(lg.port, `POST /v1/chat/complet%69ons HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
            assert.equal(r.status, 200, r.text.slice(0, 300));
            const seen = await up.seen();
            assert.equal(seen.length, 1, JSON.stringify(seen));
            assert.equal(seen[0].path, '/v1/chat/completions');
            const sent = typeof seen[0].body === 'string' ? JSON.parse(seen[0].body) : seen[0].body;
            assert.equal(sent.stream, true, 'the guarded exchange streams from the upstream');
            assert.deepEqual(sent.stream_options, { include_usage: true }, 'rewritten by the guarded exchange');
        });

        // Pipelined on one connection: requests the edge must let through, then the hostile
        // one. Everything before the hostile head is answered and reaches the upstream once;
        // the hostile one is refused and the connection closes (nothing after it is read).
        it('pipelined requests before a hidden-byte head are served, the head itself is refused (10)', T, async () => {
            await up.reset();
            const get = `GET /v1/models?n=1 HTTP/1.1\r\nHost: x\r\n${auth}\r\n`;
            const body = '{"input":"a"}';
            const post = `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
            const chunked = `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${chunk(body.slice(0, 4))}5;ext=1\r\n${body.slice(4, 9)}\n${chunk(body.slice(9))}0\r\nX-Trailer: t\r\n\r\n`;
            // The chunk data holds what would be a NUL and an obs-fold in a head: body bytes are no head.
            const tricky = '{"input":"\0\r\n x"}';
            const postTricky = `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${chunk(tricky)}0\r\n\r\n`;
            const hostile = `GET /v1/models?n=2 HTTP/1.1\r\nHost: x\r\n${auth}X-A: one\r\n two\r\n\r\n`;
            const r = await raw(lg.port, Buffer.from(`\r\n${get}${post}${chunked}${postTricky}${hostile}${get}`, 'latin1'));
            const statuses = [...r.text.matchAll(/HTTP\/1\.1 (\d{3}) [A-Z]/g)].map((m) => Number(m[1]));
            const ok = up.fake ? 404 : 200; // the C fake has no /v1/embeddings
            assert.deepEqual(statuses, [200, ok, ok, ok, 400], r.text.slice(0, 400));
            assert.ok(r.closed);
            const seen = await up.seen();
            assert.deepEqual(seen.map((s) => `${s.method} ${s.path.split('?')[0]}`), ['GET /v1/models', 'POST /v1/embeddings', 'POST /v1/embeddings', 'POST /v1/embeddings']);
            for (const s of seen) assertClean(s.headers, 'pipelined');
            if (!up.fake) assert.deepEqual(seen.slice(1).map((s) => s.body), [body, body, tricky], 'each body whole, in order');
        });

        it('a NUL in a chunked request\'s trailer: that request is served, the next head on the connection is refused (10)', T, async () => {
            for (const trailer of ['X-T: a\0b\r\n', '\0X-T: b\r\n']) {
                await up.reset();
                const body = '{"input":"a"}';
                const post = `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${chunk(body)}0\r\n${trailer}\r\n`;
                const get = `GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}\r\n`;
                const r = await raw(lg.port, Buffer.from(post + get + get, 'latin1'));
                const statuses = [...r.text.matchAll(/HTTP\/1\.1 (\d{3}) [A-Z]/g)].map((m) => Number(m[1]));
                assert.deepEqual(statuses, [up.fake ? 404 : 200, 400], `${JSON.stringify(trailer)}: ${r.text.slice(0, 300)}`);
                assert.ok(r.closed);
                assert.deepEqual((await up.seen()).map((x) => `${x.method} ${x.path}`), ['POST /v1/embeddings']);
            }
        });

        it("framing headers are loopguard's own: the client's never reach the upstream", T, async () => {
            await up.reset();
            const body = '{"hello":"world"}';
            const hdrs = `${auth}Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\nTE: trailers\r\nKeep-Alive: timeout=5\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\nTrailer: X-T\r\nX-Kept: yes\r\n`;
            for (const framing of ['length', 'chunked']) {
                const wire = framing === 'length' ? `Content-Length: ${body.length}\r\n\r\n${body}` : `Transfer-Encoding: chunked\r\n\r\n${chunk(body.slice(0, 5))}${chunk(body.slice(5))}0\r\n\r\n`;
                const r = await raw(lg.port, `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n${hdrs}${wire}`, { ms: 3000 * SLACK });
                assert.equal(r.status, up.fake ? 404 : 200, r.text.slice(0, 200));
            }
            const seen = await up.seen();
            assert.equal(seen.length, 2);
            for (const s of seen) {
                const h = s.headers;
                for (const k of ['x-hop', 'te', 'keep-alive', 'upgrade', 'proxy-connection', 'trailer']) assert.equal(h[k], undefined, `${k} forwarded`);
                assert.equal(h['x-kept'], 'yes');
                assert.ok(!(h['content-length'] && h['transfer-encoding']), 'one framing only');
                if (h['content-length']) assert.equal(Number(h['content-length']), body.length);
                const got = typeof s.body === 'string' ? s.body : JSON.stringify(s.body);
                assert.equal(got, body);
                assertClean(h, 'framing');
            }
        });

        it('X-Forwarded-For is appended at any length (10)', T, async () => {
            await up.reset();
            const chain = Array.from({ length: 300 }, (_, i) => `10.0.${i >> 8}.${i & 255}`).join(', ');
            assert.ok(chain.length > 3000);
            const r = await request(lg.url + '/v1/models', { headers: { authorization: `Bearer ${KEY_A}`, 'x-forwarded-for': chain } });
            assert.equal(r.status, 200);
            const [s] = await up.seen();
            assert.equal(s.headers['x-forwarded-for'], `${chain}, 127.0.0.1`);
        });

        it('duplicate keys, trailing bytes and budgets in a guarded body: 400, nothing upstream (3, 10)', T, async () => {
            await up.reset();
            const msgs = '[{"role":"user","content":"hi"}]';
            const bodies = {
                'duplicate "messages"': `{"messages":${msgs},"model":"m","messages":[{"role":"user","content":"other"}]}`,
                'duplicate "stream" after unescaping': `{"messages":${msgs},"stream":false,"str\\u0065am":true}`,
                'trailing bytes': `{"messages":${msgs}} {"x":1}`,
                'depth over limits.max_json_depth': `{"messages":${msgs},"x":${'['.repeat(100)}${']'.repeat(100)}}`,
            };
            for (const [name, b] of Object.entries(bodies)) {
                const r = await request(lg.url + '/v1/chat/completions', { method: 'POST', headers: { authorization: `Bearer ${KEY_A}`, 'content-type': 'application/json' }, body: b });
                const e = assertOpenAIError(r, 400);
                assert.equal(e.code, 'invalid_json', `${name}: ${e.message}`);
            }
            assert.deepEqual(await up.seen(), []);
        });

        it('two clients with their own keys over pooled upstream connections, an attacker smuggling meanwhile: every answer is its own (1, 2)', T, async () => {
            await up.reset();
            const N = isSlowBuild ? 16 : 40;
            // The relay (and, on the lenient upstream, the guarded chat route) answer each
            // client with what it sent; the attacker's requests, if they ever got through,
            // would queue extra answers on a pooled connection.
            const route = up.fake ? '/_fake/echo' : '/v1/chat/completions';
            const one = async (who, key, i) => {
                const mark = `${who}-${i}-${Math.random().toString(36).slice(2)}`;
                const r = await request(lg.url + route, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: { model: 'm', messages: [{ role: 'user', content: mark }], max_tokens: 4 } });
                assert.equal(r.status, 200, r.text.slice(0, 200));
                assert.ok(r.text.includes(mark), `${mark} not in its own answer: ${r.text.slice(0, 300)}`);
                assert.doesNotMatch(r.text.replace(mark, ''), /\b[AB]-\d+-/, `another client's mark in ${mark}'s answer`);
            };
            let attacking = true;
            const attacker = (async () => {
                let n = 0;
                while (attacking) {
                    const [, bytes] = REFUSED[n++ % 3];
                    await raw(lg.port, Buffer.from(bytes, 'latin1'), { ms: 2000 * SLACK });
                }
                return n;
            })();
            const lane = async (who, key) => {
                for (let i = 0; i < N; i++) await one(who, key, i);
            };
            await Promise.all([lane('A', KEY_A), lane('B', KEY_B), lane('A', KEY_A), lane('B', KEY_B)]);
            attacking = false;
            const attacks = await attacker;
            const seen = await up.seen();
            assert.ok(!seen.some((s) => s.path === '/abort_request'), 'no smuggled request reached the upstream');
            assert.equal(seen.length, up.fake ? 0 /* /_fake/* is not recorded */ : 4 * N, `${attacks} attacks`);
        });
    });
}

describe('admin endpoints when api_keys is set (7)', () => {
    let fake, lg, lgTok;
    before(async () => {
        fake = await startFake({ kind: 'openai' });
        lg = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { api_keys: [KEY_A] } });
        lgTok = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { api_keys: [KEY_A], admin: { token: ADMIN } } });
    });
    after(() => cleanup(() => lg?.stop(), () => lgTok?.stop(), () => fake?.stop()));

    it('without admin.token: closed to everyone, a client key included; health stays open', T, async () => {
        for (const p of ['/loopguard/incidents', '/loopguard/metrics', '/loopguard/upstreams']) {
            assertOpenAIError(await request(lg.url + p), 401);
            assertOpenAIError(await request(lg.url + p, { headers: { authorization: `Bearer ${KEY_A}` } }), 401);
        }
        assert.equal((await request(lg.url + '/loopguard/health')).status, 200);
    });

    it('with admin.token: only its bearer', T, async () => {
        assertOpenAIError(await request(lgTok.url + '/loopguard/incidents', { headers: { authorization: `Bearer ${ADMIN}x` } }), 401);
        assertOpenAIError(await request(lgTok.url + '/loopguard/incidents', { headers: { authorization: `Bearer ${KEY_A}` } }), 401);
        assert.equal((await request(lgTok.url + '/loopguard/incidents', { headers: { authorization: `Bearer ${ADMIN}` } })).status, 200);
    });
});

// ---- stalls and memory: measured, never timed ---------------------------------------------

function procStatus(pid) {
    const out = {};
    for (const line of fs.readFileSync(`/proc/${pid}/status`, 'utf8').split('\n')) {
        const m = /^(VmRSS|VmHWM):\s+(\d+) kB/.exec(line);
        if (m) out[m[1]] = Number(m[2]) * 1024;
    }
    return out;
}

describe('stalls and memory (one worker)', () => {
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'openai' });
        lg = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { workers: 1 } });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    const post = (body) => raw(lg.port, Buffer.concat([Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n`), body]), { ms: 60000 * SLACK });

    it('1.5 MB of filler keys and repeated "stream" (3): 400, and a health probe is answered meanwhile', T, async () => {
        await fake.reset();
        const parts = [];
        let len = 0;
        for (let i = 0; len < 1500000; i++) {
            const p = `"f${i}":0,"stream":true,`;
            parts.push(p);
            len += p.length;
        }
        const body = Buffer.from(`{"messages":[{"role":"user","content":"hi"}],${parts.join('')}"z":0}`);
        const t0 = performance.now();
        const hostile = post(body);
        const probe = await request(lg.url + '/loopguard/health', { timeout: 60000 * SLACK });
        const r = await hostile;
        const ms = performance.now() - t0;
        assert.equal(probe.status, 200);
        assert.equal(r.status, 400, r.text.slice(0, 200));
        assert.match(JSON.parse(r.body).error.message, /duplicate key "stream"/);
        assert.deepEqual(fromClients(await fake.requests()), []);
        console.log(`# duplicate-key body (${(body.length / 1e6).toFixed(2)} MB): answered 400 in ${ms.toFixed(0)} ms`);
    });

    it('a 10 MB body of 0,0,0,... (4): 400 from the node budget, peak RSS within the documented per-request bound', T, async () => {
        await fake.reset();
        const n = 10 * 1000 * 1000;
        const body = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"hi"}],"x":['), Buffer.from('0,'.repeat((n - 60) / 2)), Buffer.from('0]}')]);
        const before = procStatus(lg.proc.pid);
        const r = await post(body);
        assert.equal(r.status, 400, r.text.slice(0, 200));
        assert.match(JSON.parse(r.body).error.message, /max_json_nodes/);
        const afterSt = procStatus(lg.proc.pid);
        // README "Security": a guarded request holds its body in a buffer that grows by
        // doubling (at most 2x the body) and the guard's key arena (at most the body) before
        // any tree is built. The sanitizer build's quarantine keeps every freed buffer too.
        const bound = (isSanitizerBuild ? 8 : 3) * body.length;
        const grew = afterSt.VmHWM - before.VmRSS;
        console.log(`# 10 MB hostile body: RSS ${(before.VmRSS / 2 ** 20).toFixed(1)} -> ${(afterSt.VmRSS / 2 ** 20).toFixed(1)} MiB, peak ${(afterSt.VmHWM / 2 ** 20).toFixed(1)} MiB (bound +${(bound / 2 ** 20).toFixed(0)} MiB)`);
        assert.ok(grew < bound, `peak RSS grew ${grew} bytes, bound ${bound}`);
        assert.deepEqual(fromClients(await fake.requests()), []);
    });
});

// Holds limits.max_conns_per_ip (6) connections to host:port from addresses[0] and shows the
// next one from there is closed without a response, one from addresses[1] is served, and a
// freed slot is usable again.
async function capHolds(port, host, [from, other]) {
    const held = [];
    for (let i = 0; i < 6; i++) {
        const s = net.connect({ port, host, localAddress: from });
        s.on('error', () => {});
        await new Promise((r) => s.on('connect', r));
        s.write('GET /v1/models HTTP/1.1\r\nHost: x\r\n'); // an unfinished head keeps it open
        held.push(s);
    }
    await sleep(200);
    const get = 'GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n';
    const refused = await raw(port, get, { ms: 3000 * SLACK, host, localAddress: from });
    assert.equal(refused.status, 0, `refused without a response: ${refused.text.slice(0, 80)}`);
    assert.ok(refused.closed, 'closed by loopguard');
    if (other) assert.equal((await raw(port, get, { host, localAddress: other })).status, 200, 'another address is served');
    held.pop().destroy();
    const again = await waitFor(async () => {
        const r = await raw(port, get, { host, localAddress: from });
        return r.status === 200 && r;
    }, 5000 * SLACK, 100);
    assert.equal(again.status, 200, 'a freed slot is usable again');
    for (const s of held) s.destroy();
}

describe('connection limits (8)', () => {
    let fake, lg;
    const limits = { header_timeout_ms: 1000 * SLACK, body_timeout_ms: 1000 * SLACK, body_min_rate: 1000, max_conns_per_ip: 6 };
    before(async () => {
        fake = await startFake({ kind: 'openai' });
        lg = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { limits } });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    // Trickles `head` one byte every `every` ms until the server closes the connection.
    // Resolves with how many bytes it sent.
    function trickle(head, every) {
        return new Promise((resolve) => {
            const s = net.connect(lg.port, '127.0.0.1');
            let i = 0;
            let timer;
            const stop = () => {
                clearInterval(timer);
                s.destroy();
                resolve(i);
            };
            s.on('connect', () => {
                timer = setInterval(() => {
                    if (i < head.length) s.write(head[i++]);
                }, every);
            });
            s.on('error', stop);
            s.on('end', stop);
            s.on('close', stop);
        });
    }

    it('slowloris heads are cut at limits.header_timeout_ms while a real request is served', T, async () => {
        const head = `GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ${'a'.repeat(200)}\r\n\r\n`;
        const slow = Array.from({ length: 5 }, () => trickle(head, 150));
        await sleep(300);
        const ok = await request(lg.url + '/v1/models');
        assert.equal(ok.status, 200, 'a legitimate request is served beside them');
        const sent = await Promise.all(slow);
        for (const k of sent) assert.ok(k < head.length, `the server closed a trickling head after ${k} of ${head.length} bytes`);
    });

    // The tick times only the connections waiting on their client (edge.c, clock_start): a
    // connection goes back on that list when its request completes, and its next head is
    // timed from then (client_timeout_s of idling allowed first).
    it("a kept-alive connection's next head is cut at client_timeout_s + limits.header_timeout_ms", T, async () => {
        const lg2 = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { client_timeout_s: 1, limits } });
        try {
            const { s, status } = await kept(lg2.port, 5000 * SLACK);
            assert.equal(status, 200, 'the first request on the connection is served');
            const head = `GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ${'a'.repeat(400)}\r\n\r\n`;
            const t0 = performance.now();
            const sent = await new Promise((resolve) => {
                let i = 0;
                const stop = () => {
                    clearInterval(timer);
                    s.destroy();
                    resolve(i);
                };
                // A byte every 100 ms keeps libmicrohttpd's own idle timeout from firing.
                const timer = setInterval(() => (i < head.length ? s.write(head[i++]) : stop()), 100);
                s.on('error', stop);
                s.on('end', stop);
                s.on('close', stop);
            });
            assert.ok(sent < head.length, `the server closed the trickling second head after ${sent} of ${head.length} bytes`);
            assert.ok(performance.now() - t0 >= 900, 'not before client_timeout_s');
        } finally {
            await lg2.stop();
        }
    });

    it('a body slower than limits.body_min_rate is cut', T, async () => {
        await fake.reset();
        const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n`;
        const sent = await new Promise((resolve) => {
            const s = net.connect(lg.port, '127.0.0.1');
            let n = 0, timer;
            const stop = () => {
                clearInterval(timer);
                s.destroy();
                resolve(n);
            };
            s.on('connect', () => {
                s.write(head);
                timer = setInterval(() => {
                    s.write('          ');
                    n += 10;
                }, 100);
            });
            s.on('error', stop);
            s.on('end', stop);
            s.on('close', stop);
        });
        assert.ok(sent < 100000, `cut after ${sent} body bytes`);
        assert.deepEqual(fromClients(await fake.requests()), []);
    });

    it('limits.max_conns_per_ip: the next connection from that address is refused, another address is served', T, async () => {
        await capHolds(lg.port, '127.0.0.1', [undefined, '127.0.0.2']);
    });
});

// A connection that sent one keep-alive request: resolves with the socket, still open, and
// the status of the answer's head, or 0 when none came within `ms`.
function kept(port, ms) {
    return new Promise((resolve) => {
        const s = net.connect(port, '127.0.0.1');
        let out = '';
        const t = setTimeout(() => resolve({ s, status: 0 }), ms);
        s.on('error', () => {});
        s.on('data', (d) => {
            out += d.toString('latin1');
            const m = /^HTTP\/1\.1 (\d{3})/.exec(out);
            if (m && out.includes('\r\n\r\n')) {
                clearTimeout(t);
                resolve({ s, status: Number(m[1]) });
            }
        });
        s.write('GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n');
    });
}

// A new connection goes to a worker that holds the fewest (balance.h; worker.c, accept_clients):
// ten kept-alive connections opened one after another end up five and five, as the gauge
// loopguard_worker_connections shows. A worker that took every connection until it was busy
// (the placement before) held all ten.
describe('connections over the workers', () => {
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'openai' });
        lg = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { workers: 2 } });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    it('ten kept-alive connections are held five and five', T, async () => {
        const conns = [];
        for (let i = 0; i < 10; i++) {
            const c = await kept(lg.port, 5000 * SLACK);
            assert.equal(c.status, 200, `connection ${i + 1} is served`);
            conns.push(c);
        }
        try {
            // The metrics request is an eleventh connection, held while it is answered.
            const m = (await admin(lg, '/loopguard/metrics')).text;
            const held = [0, 1].map((w) => {
                const r = new RegExp(`^loopguard_worker_connections\\{worker="${w}"\\} (\\d+)$`, 'm').exec(m);
                assert.ok(r, `worker ${w}'s gauge is there`);
                return Number(r[1]);
            });
            assert.ok(held[0] + held[1] >= 10, `the gauges count the ten: ${held}`);
            for (const n of held) assert.ok(n >= 5 && n <= 6, `five or six a worker: ${held}`);
        } finally {
            for (const c of conns) c.s.destroy();
        }
    });
});

// Each worker holds its share of max_connections (here 1 each): past it a worker leaves new
// connections to the other (accept_clients), and past the limit a connection waits in the
// kernel's backlog, as at nginx's worker_connections or HAProxy's maxconn, and is served
// once a connection closes.
describe('max_connections over the workers', () => {
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'openai' });
        lg = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { workers: 2, max_connections: 2 } });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    it('a connection past the limit waits until one closes, and is served then', T, async () => {
        const a = await kept(lg.port, 5000 * SLACK);
        assert.equal(a.status, 200, 'the first connection is served');
        const b = await kept(lg.port, 5000 * SLACK);
        assert.equal(b.status, 200, 'so is the second, by the other worker');
        let third = null;
        const c = kept(lg.port, 60000 * SLACK).then((r) => (third = r));
        await sleep(1500 * SLACK);
        assert.equal(third, null, 'a third waits: both workers hold their share');
        a.s.destroy();
        await c;
        assert.equal(third.status, 200, 'and is served once a connection closed');
        b.s.destroy();
        third.s.destroy();
    });
});

// IPv6: a host commonly owns a whole /64, so the cap counts per /64 (edge_addr_key; its unit
// test covers distinct addresses of one /64). ::1 is one /64 with itself. An IPv4 client of
// an IPv6 socket arrives as ::ffff:a.b.c.d and is counted per IPv4 address, not as the one
// ::/64 all of them (and ::1) would share.
const ipv6Loopback = await new Promise((resolve) => {
    const s = net.createServer().once('error', () => resolve(false));
    s.listen(0, '::1', () => s.close(() => resolve(true)));
});

describe('connection limits over IPv6 (8)', { skip: !ipv6Loopback && 'this host cannot listen on ::1' }, () => {
    let fake, lg6, lgMapped;
    const limits = { max_conns_per_ip: 6 };
    before(async () => {
        fake = await startFake({ kind: 'openai' });
        lg6 = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { limits }, listen: '[::1]:0' });
        lgMapped = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { limits }, listen: '[::ffff:127.0.0.1]:0' });
    });
    after(() => cleanup(() => lg6?.stop(), () => lgMapped?.stop(), () => fake?.stop()));

    it('::1 is capped like any address', T, async () => {
        await capHolds(lg6.port, '::1', [undefined, undefined]);
    });

    it('IPv4-mapped clients count per IPv4 address', T, async () => {
        await capHolds(lgMapped.port, '127.0.0.1', [undefined, '127.0.0.2']);
    });
});
