// Shared helpers for the end-to-end suites (tests/e2e/*.test.mjs, tests/client/*.test.mjs).
//
// The suites drive the real binaries of the build under test: tests/run.sh exports
// LOOPGUARD_BIN and FAKE_BIN (plain build/ or the ASan build build/san/), and nothing here
// ever names a build directory itself. Every process a helper starts is registered and
// killed at process exit as a last resort, but tests must still call stop() in after()
// hooks: stop() is where loopguard's exit code and sanitizer reports are checked.
// Only node built-ins are used (node:test, node:http, node:child_process...).
//
// API (kept stable; other suites import it):
//
//   startFake({kind, dialect, scenario, model, pace, args}) -> Promise<Fake>
//       kind 'sglang'|'vllm'|'openai' (default sglang); dialect overrides the kind's;
//       scenario: object (written to a temp file) or a file path; pace: --pace-ms.
//     Fake = {url, port, proc,
//             records() -> Promise<array>        all records (GET /_fake/records)
//             requests(path?) / generations() / aborts() -> filtered records
//             waitRecord(pred, ms=3000) -> Promise<record>  first record with pred(r)
//             reset(), setScenario(obj), stderr() -> string, stop() -> Promise}
//   startLoopguard({upstream, kind, config, args, env, listen}) -> Promise<Loopguard>
//       upstream: URL string or array (default none: the config's); kind: --upstream-kind
//       (omit for the config's, i.e. auto); config: object, deep-merged over DEFAULT_LG_CONFIG
//       and written to a temp JSON file; args: extra CLI args; env: extra env vars.
//     Loopguard = {url, port, proc, stderr() -> string, stdout() -> string,
//                  stop({expectCode=0}) -> Promise<{code, signal}>  SIGTERM, wait (10 s),
//                  asserts the exit code and no sanitizer report in stderr; idempotent}
//   runLoopguard(args, {env, timeout}) -> Promise<{code, signal, stdout, stderr}>  one-shot
//       (e.g. --check-config).
//   usePair({fake, lg}, set(fake, lg)) call inside describe(): registers before() that
//       starts a fake (startFake(fake)) and a loopguard in front of it (startLoopguard(
//       {upstream: fake.url, ...lg})), passes both to set(), and after() that stops both.
//   startRawUpstream(respond) -> Promise<RawUpstream>  a TCP server on 127.0.0.1 for upstreams
//       no HTTP library would play: it parses each request head (and its Content-Length body)
//       and records it; respond(socket, req, n) answers the n-th POST (from 0) with whatever
//       bytes it writes; anything else (loopguard's start-up health check) gets a small JSON
//       200. req = {conn (the connection's index), line, method, path, head (raw, latin1),
//       lines (the field lines), headers [[name, value]], body: Buffer, te (a
//       Transfer-Encoding field was sent), junk (the head does not begin with an HTTP/1.0 or
//       HTTP/1.1 request line)}. RawUpstream = {url, port, reqs, posts() -> the POST records,
//       conns() -> how many connections carried POSTs, sockets, server, stop() -> Promise}
//   deadPort() -> Promise<number>  a 127.0.0.1 port on which nothing listens.
//   assertOpenAIError(resp, status) -> error object; asserts status, JSON content type and
//       the {"error":{"message","type","code"}} shape.
//   request(url, {method='GET', headers, body, timeout=15000}) -> Promise<Resp>
//       body: object (sent as JSON), string, Buffer, or an async iterable of Buffers (sent
//       chunked). Resp = {status, headers (lower-case), rawHeaders, body: Buffer, text,
//       json() }
//   chat(url, body, headers) -> Promise<Resp>  POST JSON; url is the full URL
//       (lg.url + '/v1/chat/completions').
//   rawStream(url, body, headers) -> Promise<Resp>  same as chat but named for streams:
//       Resp.body is exactly the (de-chunked) bytes received.
//   streamUntil(url, body, {headers, until(text) -> bool, timeout}) -> Promise<{status,
//       headers, text, closedAt}>  reads a stream until until(textSoFar) holds, then
//       destroys the socket (a client hanging up); closedAt = performance.now().
//   sse(text) -> [{event, data, id, raw}]  WHATWG-ish event split (LF, CRLF, CR); raw is
//       the event's bytes including its terminating blank line.
//   sseData(text) -> [string]     the data fields; sseJSON(text) -> [object] (without [DONE])
//   assembleDeltas(chunks) -> {role, content, reasoning_content, reasoning, tool_calls,
//       finish_reason, usage, text}  concatenation of choice 0's deltas (any dialect; `text`
//       for text-completion chunks).
//   normIds(text) -> text with every "id":"…" replaced by "id":"ID" and "created":N by 0.
//   incidents(base) -> Promise<array>   GET /loopguard/incidents parsed (oldest first)
//   waitIncident(base, seen=[], ms=3000) -> Promise<record>  the newest incident whose id
//       is not in `seen` (an earlier incidents() snapshot), polling: the incident writer is
//       asynchronous, so a record may appear just after the response ended.
//   metrics(base) -> Promise<Map<string, number>>  GET /loopguard/metrics; key is the
//       sample as written without its value, e.g. 'loopguard_requests_total{endpoint="chat",code="200"}'
//   metricValue(map, name, labels={}) -> number  sum over samples of `name` whose labels
//       include `labels` (0 when none).
//   waitFor(fn, ms=3000, step=20) -> Promise<value>  polls async fn until truthy.
//   cleanup(...steps) runs every async step even if one throws, then rethrows the first error.
//   SEED_BODY: the field report's request, verbatim.
//   underValgrind, DEADLINE ({timeout} for a test: longer on the slow builds).
//   sleep(ms), tmpFile(name, content) -> path, DEFAULT_LG_CONFIG, LOOPGUARD_BIN, FAKE_BIN,
//   SCENARIOS (absolute path of tests/fake/scenarios), isSanitizerBuild (ASan build),
//   isSlowBuild (ASan, or loopguard under valgrind: give timing assertions slack).

import { spawn } from 'node:child_process';
import { before, after } from 'node:test';
import http from 'node:http';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import assert from 'node:assert/strict';

const here = path.dirname(fileURLToPath(import.meta.url));
export const SCENARIOS = path.resolve(here, '../fake/scenarios');

function need(name) {
    const v = process.env[name];
    if (!v) throw new Error(`${name} is not set: run the suites through tests/run.sh`);
    return v;
}
export const LOOPGUARD_BIN = need('LOOPGUARD_BIN');
export const FAKE_BIN = need('FAKE_BIN');
// loopguard rejects a LOOPGUARD_* variable that names no configuration key, so the runner's
// own variable must not reach the processes the suites start.
delete process.env.LOOPGUARD_BIN;
// The ASan build lives under build/san (run.sh's BUILD); slower, so tests may scale waits.
export const isSanitizerBuild = /san/.test(process.env.BUILD || '') || /\/san\//.test(LOOPGUARD_BIN);
// ASan or loopguard under valgrind (tests/valgrind-loopguard.sh): scale timeouts up.
export const isSlowBuild = isSanitizerBuild || /valgrind/.test(LOOPGUARD_BIN);

// Defaults every test loopguard gets unless its config says otherwise: one free port, a
// short drain on SIGTERM (so stop() is quick even with a stream open) and no periodic
// health checks polluting the fake's records.
// Runs every cleanup step even when one throws (a sanitizer report found by lg.stop() must
// not leave the fake running, which would keep the test process alive); rethrows the first
// error.
export async function cleanup(...steps) {
    let first;
    for (const step of steps) {
        try {
            await step();
        } catch (e) {
            first ??= e;
        }
    }
    if (first) throw first;
}

// tests/run.sh's valgrind suite runs loopguard through tests/valgrind-loopguard.sh.
export const underValgrind = /valgrind/.test(LOOPGUARD_BIN);
// A per-test deadline, so a loopguard that never answers fails the test instead of hanging
// the suite (longer on the slow builds: valgrind on a busy machine took over 40 s).
export const DEADLINE = { timeout: isSlowBuild ? 120000 : 40000 };

// The field report's request, verbatim (tests add stream and friends).
export const SEED_BODY = Object.freeze({
    model: '/root/models/Qwen3.6-27B',
    messages: [{ role: 'user', content: 'Write a Python function that checks if a number is prime. Be concise.' }],
    max_tokens: 2000,
    temperature: 0.6,
    top_p: 0.95,
    top_k: 20,
});

export const DEFAULT_LG_CONFIG = {
    listen: '127.0.0.1:0',
    shutdown_grace_ms: 500,
    health: { interval_ms: 3600000 },
};

const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lg-e2e-'));
const live = new Set();
process.on('exit', () => {
    for (const p of live) {
        try {
            p.kill('SIGKILL');
        } catch {}
    }
    fs.rmSync(tmpDir, { recursive: true, force: true });
});

let tmpSeq = 0;
export function tmpFile(name, content) {
    const p = path.join(tmpDir, `${++tmpSeq}-${name}`);
    fs.writeFileSync(p, content);
    return p;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function waitFor(fn, ms = 3000, step = 20) {
    const end = Date.now() + ms;
    for (;;) {
        const v = await fn();
        if (v) return v;
        if (Date.now() > end) throw new Error(`waitFor: condition not met within ${ms} ms`);
        await sleep(step);
    }
}

function deepMerge(a, b) {
    if (b === undefined) return a;
    if (a && b && typeof a === 'object' && typeof b === 'object' && !Array.isArray(a) && !Array.isArray(b)) {
        const out = { ...a };
        for (const [k, v] of Object.entries(b)) out[k] = deepMerge(a[k], v);
        return out;
    }
    return b;
}

// Spawns a binary and resolves once it printed "listening on HOST:PORT" on stdout.
function spawnListening(bin, args, env, what) {
    const proc = spawn(bin, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    live.add(proc);
    let out = '',
        err = '';
    proc.stdout.setEncoding('utf8');
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => (err += d));
    const exited = new Promise((resolve) =>
        proc.on('exit', (code, signal) => {
            live.delete(proc);
            resolve({ code, signal });
        })
    );
    const ready = new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${what} did not start in 10 s; stderr:\n${err}`)), 10000);
        proc.stdout.on('data', (d) => {
            out += d;
            const m = /listening on ([^\s:]+|\[[^\]]+\]):(\d+)\n/.exec(out);
            if (m) {
                clearTimeout(timer);
                resolve(Number(m[2]));
            }
        });
        exited.then(({ code, signal }) => {
            clearTimeout(timer);
            reject(new Error(`${what} exited (code ${code}, signal ${signal}) before listening; stderr:\n${err}`));
        });
        proc.on('error', (e) => {
            clearTimeout(timer);
            reject(e);
        });
    });
    return { proc, ready, exited, out: () => out, err: () => err };
}

const SAN_RE = /(ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error:|SUMMARY: \w+Sanitizer)/;

export async function startFake({ kind = 'sglang', dialect, scenario, model, pace, args = [] } = {}) {
    const a = ['--listen', '127.0.0.1:0', '--kind', kind];
    if (dialect) a.push('--dialect', dialect);
    if (model) a.push('--model', model);
    if (pace !== undefined) a.push('--pace-ms', String(pace));
    if (scenario !== undefined) {
        const file = typeof scenario === 'string' ? scenario : tmpFile('scenario.json', JSON.stringify(scenario));
        a.push('--scenario', file);
    }
    const p = spawnListening(FAKE_BIN, [...a, ...args], {}, 'fake_upstream');
    const port = await p.ready;
    const url = `http://127.0.0.1:${port}`;
    let stopped = null;
    const fake = {
        url,
        port,
        proc: p.proc,
        stderr: p.err,
        async records() {
            const r = await request(url + '/_fake/records');
            assert.equal(r.status, 200, 'GET /_fake/records');
            return r.json();
        },
        async requests(pathname) {
            return (await fake.records()).filter((r) => r.kind === 'request' && (!pathname || r.path === pathname));
        },
        async generations() {
            return (await fake.records()).filter((r) => r.kind === 'generation');
        },
        async aborts() {
            return (await fake.records()).filter((r) => r.kind === 'abort');
        },
        async waitRecord(pred, ms = 3000) {
            return waitFor(async () => (await fake.records()).find(pred), ms);
        },
        async reset() {
            const r = await request(url + '/_fake/reset', { method: 'POST' });
            assert.equal(r.status, 200, 'POST /_fake/reset');
        },
        async setScenario(obj) {
            const r = await request(url + '/_fake/scenario', { method: 'POST', body: obj });
            assert.equal(r.status, 200, `POST /_fake/scenario: ${r.text}`);
        },
        stop() {
            if (!stopped) {
                if (p.proc.exitCode === null && p.proc.signalCode === null) p.proc.kill('SIGTERM');
                stopped = p.exited;
            }
            return stopped;
        },
    };
    return fake;
}

export async function startLoopguard({ upstream, kind, config = {}, args = [], env = {}, listen } = {}) {
    const cfg = deepMerge(DEFAULT_LG_CONFIG, config);
    const file = tmpFile('loopguard.json', JSON.stringify(cfg, null, 1));
    const a = ['--config', file];
    if (listen) a.push('--listen', listen);
    if (upstream) a.push('--upstream', Array.isArray(upstream) ? upstream.join(',') : upstream);
    if (kind) a.push('--upstream-kind', kind);
    const p = spawnListening(LOOPGUARD_BIN, [...a, ...args], env, 'loopguard');
    const port = await p.ready;
    let stopped = null;
    return {
        url: `http://127.0.0.1:${port}`,
        port,
        proc: p.proc,
        configFile: file,
        stderr: p.err,
        stdout: p.out,
        stop({ expectCode = 0 } = {}) {
            if (stopped) return stopped;
            stopped = (async () => {
                if (p.proc.exitCode === null && p.proc.signalCode === null) p.proc.kill('SIGTERM');
                const t = setTimeout(() => p.proc.kill('SIGKILL'), isSlowBuild ? 20000 : 10000);
                const res = await p.exited;
                clearTimeout(t);
                assert.doesNotMatch(p.err(), SAN_RE, 'sanitizer report in loopguard stderr');
                assert.equal(res.signal, null, `loopguard died by signal ${res.signal}; stderr:\n${p.err()}`);
                if (expectCode !== null) assert.equal(res.code, expectCode, `loopguard exit code; stderr:\n${p.err()}`);
                return res;
            })();
            return stopped;
        },
    };
}

export function runLoopguard(args, { env = {}, timeout = 10000 } = {}) {
    return new Promise((resolve, reject) => {
        const proc = spawn(LOOPGUARD_BIN, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
        live.add(proc);
        let stdout = '',
            stderr = '';
        proc.stdout.on('data', (d) => (stdout += d));
        proc.stderr.on('data', (d) => (stderr += d));
        const t = setTimeout(() => proc.kill('SIGKILL'), timeout);
        proc.on('error', reject);
        proc.on('exit', (code, signal) => {
            clearTimeout(t);
            live.delete(proc);
            resolve({ code, signal, stdout, stderr });
        });
    });
}

// One HTTP/1.1 request over node:http (a fresh connection each time: no agent keep-alive,
// so a test never inherits a half-dead socket from another).
export function request(url, { method = 'GET', headers = {}, body, timeout = 15000 } = {}) {
    return new Promise((resolve, reject) => {
        const u = new URL(url);
        let payload = body;
        const h = { ...headers };
        if (payload !== undefined && payload !== null && typeof payload === 'object' && !Buffer.isBuffer(payload) && !payload[Symbol.asyncIterator]) {
            payload = JSON.stringify(payload);
            if (!Object.keys(h).some((k) => k.toLowerCase() === 'content-type')) h['content-type'] = 'application/json';
        }
        const req = http.request(
            { host: u.hostname, port: u.port, path: u.pathname + u.search, method, headers: h, agent: false },
            (res) => {
                const parts = [];
                res.on('data', (d) => parts.push(d));
                res.on('end', () => {
                    clearTimeout(timer);
                    const buf = Buffer.concat(parts);
                    resolve({
                        status: res.statusCode,
                        headers: res.headers,
                        rawHeaders: res.rawHeaders,
                        body: buf,
                        text: buf.toString('utf8'),
                        json() {
                            return JSON.parse(buf.toString('utf8'));
                        },
                    });
                });
                res.on('error', (e) => {
                    clearTimeout(timer);
                    reject(e);
                });
            }
        );
        const timer = setTimeout(() => req.destroy(new Error(`request ${method} ${url} timed out after ${timeout} ms`)), timeout);
        req.on('error', (e) => {
            clearTimeout(timer);
            reject(e);
        });
        if (payload && payload[Symbol.asyncIterator]) {
            (async () => {
                try {
                    for await (const chunk of payload) if (!req.write(chunk)) await new Promise((r) => req.once('drain', r));
                    req.end();
                } catch (e) {
                    req.destroy(e);
                }
            })();
        } else {
            req.end(payload === undefined || payload === null ? undefined : payload);
        }
    });
}

export function chat(url, body, headers = {}) {
    return request(url, { method: 'POST', headers, body });
}
export const rawStream = chat;

export function streamUntil(url, body, { headers = {}, until = () => true, timeout = 15000 } = {}) {
    return new Promise((resolve, reject) => {
        const u = new URL(url);
        const payload = typeof body === 'string' ? body : JSON.stringify(body);
        const req = http.request(
            { host: u.hostname, port: u.port, path: u.pathname + u.search, method: 'POST', headers: { 'content-type': 'application/json', ...headers }, agent: false },
            (res) => {
                let text = '';
                let done = false;
                const finish = (closed) => {
                    if (done) return;
                    done = true;
                    clearTimeout(timer);
                    resolve({ status: res.statusCode, headers: res.headers, text, closedAt: closed });
                };
                res.setEncoding('utf8');
                res.on('data', (d) => {
                    text += d;
                    if (!done && until(text)) {
                        const at = performance.now();
                        req.destroy();
                        res.destroy();
                        finish(at);
                    }
                });
                res.on('end', () => finish(null));
                res.on('error', () => finish(null));
            }
        );
        const timer = setTimeout(() => req.destroy(new Error(`streamUntil ${url}: condition not met in ${timeout} ms`)), timeout);
        req.on('error', (e) => {
            clearTimeout(timer);
            reject(e);
        });
        req.end(payload);
    });
}

// Splits an SSE body into events. Enough of the WHATWG rules for our assertions: lines end
// in LF, CRLF or CR; an empty line ends an event; "field: value" with one optional space;
// comment lines (":") are ignored; an event without data is dropped (as a browser would).
export function sse(text) {
    const events = [];
    let cur = { event: undefined, data: [], id: undefined, raw: '' };
    const re = /([^\r\n]*)(\r\n|\n|\r)/g;
    let m;
    while ((m = re.exec(text))) {
        const line = m[1];
        cur.raw += m[0];
        if (line === '') {
            if (cur.data.length) events.push({ event: cur.event, data: cur.data.join('\n'), id: cur.id, raw: cur.raw });
            cur = { event: undefined, data: [], id: undefined, raw: '' };
            continue;
        }
        if (line.startsWith(':')) continue;
        const i = line.indexOf(':');
        const field = i < 0 ? line : line.slice(0, i);
        let value = i < 0 ? '' : line.slice(i + 1);
        if (value.startsWith(' ')) value = value.slice(1);
        if (field === 'data') cur.data.push(value);
        else if (field === 'event') cur.event = value;
        else if (field === 'id') cur.id = value;
    }
    return events;
}
export const sseData = (text) => sse(text).map((e) => e.data);
export const sseJSON = (text) =>
    sseData(text)
        .filter((d) => d !== '[DONE]')
        .map((d) => JSON.parse(d));

const nz = (v) => v !== undefined && v !== null && v !== '';

// Concatenates choice 0's deltas of parsed chunks (any dialect) into one message view.
// Missing, null and "" are the same; finish_reason is the last non-empty one; usage the
// last chunk's non-null usage.
export function assembleDeltas(chunks) {
    const out = { role: null, content: '', reasoning_content: '', reasoning: '', tool_calls: [], finish_reason: null, usage: null, text: '' };
    for (const c of chunks) {
        if (c.usage) out.usage = c.usage;
        const ch = (c.choices || [])[0];
        if (!ch) continue;
        if (nz(ch.finish_reason)) out.finish_reason = ch.finish_reason;
        if (nz(ch.text)) out.text += ch.text;
        const d = ch.delta || {};
        if (nz(d.role)) out.role = d.role;
        if (nz(d.content)) out.content += d.content;
        if (nz(d.reasoning_content)) out.reasoning_content += d.reasoning_content;
        if (nz(d.reasoning)) out.reasoning += d.reasoning;
        for (const t of d.tool_calls || []) {
            const slot = (out.tool_calls[t.index] ||= { id: null, type: null, function: { name: '', arguments: '' } });
            if (nz(t.id)) slot.id = t.id;
            if (nz(t.type)) slot.type = t.type;
            if (t.function && nz(t.function.name)) slot.function.name += t.function.name;
            if (t.function && nz(t.function.arguments)) slot.function.arguments += t.function.arguments;
        }
    }
    return out;
}

export function normIds(text) {
    return text.replace(/"id":"[^"]*"/g, '"id":"ID"').replace(/"created":\d+/g, '"created":0');
}

// The records of a JSON Lines file written by loopguard (incidents, access log): whole lines
// only, as a reader polling it may read a write(2) half done (seen under valgrind).
export function jsonLines(file) {
    const text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
    return text.slice(0, text.lastIndexOf('\n') + 1).split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

export async function incidents(base) {
    const r = await request(base + '/loopguard/incidents');
    assert.equal(r.status, 200, `GET /loopguard/incidents: ${r.text}`);
    return r.json();
}

export async function waitIncident(base, seen = [], ms = 3000) {
    const ids = new Set(seen.map((i) => i.id));
    return waitFor(async () => (await incidents(base)).filter((i) => !ids.has(i.id)).at(-1), ms);
}

export async function metrics(base) {
    const r = await request(base + '/loopguard/metrics');
    assert.equal(r.status, 200, `GET /loopguard/metrics: ${r.text}`);
    const m = new Map();
    for (const line of r.text.split('\n')) {
        if (!line || line.startsWith('#')) continue;
        const sp = line.lastIndexOf(' ');
        m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
    }
    return m;
}

function parseLabels(s) {
    const out = {};
    const re = /(\w+)="((?:[^"\\]|\\.)*)"/g;
    let m;
    while ((m = re.exec(s))) out[m[1]] = m[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    return out;
}

export function metricValue(map, name, labels = {}) {
    let sum = 0;
    for (const [k, v] of map) {
        const b = k.indexOf('{');
        const n = b < 0 ? k : k.slice(0, b);
        if (n !== name) continue;
        const l = b < 0 ? {} : parseLabels(k.slice(b));
        if (Object.entries(labels).every(([lk, lv]) => l[lk] === String(lv))) sum += v;
    }
    return sum;
}

export function usePair({ fake: fakeOpts = {}, lg: lgOpts = {} } = {}, set = () => {}) {
    let fake, lg;
    before(async () => {
        fake = await startFake(fakeOpts);
        lg = await startLoopguard({ upstream: fake.url, ...lgOpts });
        set(fake, lg);
    });
    after(async () => {
        await lg?.stop();
        await fake?.stop();
    });
}

export function startRawUpstream(respond) {
    const up = { reqs: [], sockets: new Set() };
    let seq = 0;
    up.posts = () => up.reqs.filter((r) => r.method === 'POST');
    up.conns = () => new Set(up.posts().map((r) => r.conn)).size;
    up.server = net.createServer((c) => {
        const conn = seq++;
        up.sockets.add(c);
        c.on('close', () => up.sockets.delete(c));
        c.on('error', () => {});
        let buf = Buffer.alloc(0);
        c.on('data', (d) => {
            buf = Buffer.concat([buf, d]);
            for (;;) {
                const end = buf.indexOf('\r\n\r\n');
                if (end < 0) return;
                const head = buf.subarray(0, end).toString('latin1');
                const [line, ...lines] = head.split('\r\n');
                const headers = lines.map((l) => {
                    const i = l.indexOf(':');
                    return i < 0 ? [l, undefined] : [l.slice(0, i), l.slice(i + 1).trim()];
                });
                const len = Number(headers.find(([k]) => /^content-length$/i.test(k))?.[1] ?? 0);
                if (buf.length < end + 4 + len) return;
                const body = buf.subarray(end + 4, end + 4 + len);
                buf = buf.subarray(end + 4 + len);
                const m = /^([A-Z]+) (\S+) HTTP\/1\.[01]$/.exec(line);
                const te = headers.some(([k]) => /^transfer-encoding$/i.test(k));
                const req = { conn, line, method: m?.[1], path: m?.[2], head, lines, headers, body, te, junk: !m };
                up.reqs.push(req);
                if (req.method === 'POST') respond(c, req, up.posts().length - 1);
                else c.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}');
            }
        });
    });
    up.stop = () => {
        for (const s of up.sockets) s.destroy();
        return new Promise((r) => up.server.close(r));
    };
    return new Promise((r) =>
        up.server.listen(0, '127.0.0.1', () => {
            up.port = up.server.address().port;
            up.url = `http://127.0.0.1:${up.port}`;
            r(up);
        })
    );
}

export async function deadPort() {
    const s = net.createServer();
    await new Promise((r) => s.listen(0, '127.0.0.1', r));
    const p = s.address().port;
    await new Promise((r) => s.close(r));
    return p;
}

export function assertOpenAIError(r, status) {
    assert.equal(r.status, status, r.text);
    assert.match(r.headers['content-type'] || '', /json/);
    const e = r.json().error;
    assert.ok(e, `no error object: ${r.text}`);
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0);
    assert.equal(typeof e.type, 'string');
    assert.ok('code' in e);
    return e;
}
