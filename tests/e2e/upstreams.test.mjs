// End-to-end tests for many upstreams: least-outstanding balancing, active and
// passive health checks, retries that go elsewhere, and degeneration-aware ejection.
//
// Every case runs the real loopguard in front of several real fake upstreams (kind sglang)
// and asserts on three views at once: what the clients got, what each fake recorded (which
// replica a request or its retry reached), and what loopguard reports about its replicas
// (/loopguard/upstreams, /loopguard/metrics, the incident log). Requests carry a unique
// prompt ("... #<tag>") so that a retry can be matched with the first attempt it replaces.
//
// Timing: health checks every 200 ms, ejection after 5 generations, a 2 s back-off (3x on the
// sanitizer build). Runtime ~25 s on the plain build.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import http from 'node:http';
import { spawn } from 'node:child_process';
import { startFake, startLoopguard, request, chat, sseData, sseJSON, assembleDeltas, incidents, metrics, metricValue, waitFor, sleep, tmpFile, SCENARIOS, isSanitizerBuild } from './lib.mjs';

const SLACK = isSanitizerBuild ? 3 : 1;
const MIN_REQUESTS = 5;
const BACKOFF_MS = 2000 * SLACK;
const HEALTH_MS = 200;
const CLEAN = JSON.parse(fs.readFileSync(path.join(SCENARIOS, 'clean.json'), 'utf8'));
const ALWAYS_LOOP = path.join(SCENARIOS, 'always_loop.json');
const CLEAN_FILE = path.join(SCENARIOS, 'clean.json');

/* ---- local helpers --------------------------------------------------------------- */

let seq = 0;
// A chat body with a prompt unique to this call; `tag` is returned so records can be matched.
function body({ stream = false, extra = {} } = {}) {
    const tag = `#req-${process.pid}-${++seq}`;
    return { tag, body: { model: 'm', temperature: 0.7, stream, messages: [{ role: 'user', content: `Write a prime check ${tag}` }], ...extra } };
}

// Sends one chat request and asserts the client got a clean, well-formed answer: HTTP 200,
// for a stream an SSE body ending in [DONE], the clean answer's code and no loop text.
// Returns {tag, content, finish}.
async function cleanChat(lg, { stream = false } = {}) {
    const { tag, body: b } = body({ stream });
    const r = await chat(lg.url + '/v1/chat/completions', b);
    assert.equal(r.status, 200, `${tag}: ${r.text.slice(0, 300)}`);
    let content, reasoning, finish;
    if (stream) {
        const data = sseData(r.text);
        assert.equal(data.at(-1), '[DONE]', `${tag}: stream ends with [DONE]`);
        const a = assembleDeltas(sseJSON(r.text));
        assert.ok(!sseJSON(r.text).some((c) => c.error), `${tag}: no error event`);
        content = a.content;
        reasoning = a.reasoning_content;
        finish = a.finish_reason;
    } else {
        const j = r.json();
        content = j.choices[0].message.content;
        reasoning = j.choices[0].message.reasoning_content || '';
        finish = j.choices[0].finish_reason;
    }
    assert.equal(finish, 'stop', `${tag}: finish_reason`);
    assert.match(content, /def is_prime/, `${tag}: the clean answer`);
    // The guard releases a unit until a second copy makes the tail periodic (exchange tests'
    // bound): never three copies back to back.
    assert.doesNotMatch(reasoning + content, /(lambda\s*){3}/, `${tag}: no loop reached the client`);
    return { tag, content, finish };
}

// Chat requests this fake received, as [{tag, body, at_ms}].
async function chatRequests(fake) {
    return (await fake.requests('/v1/chat/completions')).map((r) => ({ tag: /#req-\d+-\d+/.exec(r.body.messages[0].content)?.[0], body: r.body, at_ms: r.at_ms }));
}

async function upstreams(lg) {
    const r = await request(lg.url + '/loopguard/upstreams');
    assert.equal(r.status, 200, r.text);
    assert.match(r.headers['content-type'] || '', /json/);
    return r.json();
}
const replica = (list, fake) => {
    const u = list.find((x) => x.url === fake.url);
    assert.ok(u, `${fake.url} in /loopguard/upstreams: ${JSON.stringify(list)}`);
    return u;
};

function incidentFile(file) {
    if (!fs.existsSync(file)) return [];
    return fs
        .readFileSync(file, 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l));
}
const upstreamEvents = (recs, fake, event) => recs.filter((r) => r.kind === 'upstream' && r.upstream === fake.url && r.event === event);

// Runs `n` calls of fn(i) with at most `width` in flight; resolves to the results in order.
async function pool(n, width, fn) {
    const out = new Array(n);
    let next = 0;
    const run = async () => {
        while (next < n) {
            const i = next++;
            out[i] = await fn(i);
        }
    };
    await Promise.all(Array.from({ length: width }, run));
    return out;
}

const baseConfig = (incPath) => ({
    health: { interval_ms: HEALTH_MS, unhealthy_after: 2, healthy_after: 2 },
    eject: { min_requests: MIN_REQUESTS, backoff_ms: BACKOFF_MS },
    retry: { max_attempts: 3 },
    ...(incPath ? { incidents: { path: incPath } } : {}),
});

/* ---- ejection ---------------------------------------------------------------------- */

describe('a replica that loops on every request', () => {
    let a, b, c, lg, incPath;
    const seen = { c: 0 };
    before(async () => {
        a = await startFake({ scenario: CLEAN_FILE });
        b = await startFake({ scenario: path.join(SCENARIOS, 'seed_lambda.json') }); // clean at temperature 0.7
        c = await startFake({ scenario: ALWAYS_LOOP });
        incPath = tmpFile('incidents.jsonl', '');
        lg = await startLoopguard({ upstream: [a.url, b.url, c.url], kind: 'sglang', config: baseConfig(incPath) });
    });
    after(async () => {
        await lg?.stop();
        await Promise.all([a?.stop(), b?.stop(), c?.stop()]);
    });

    test('is ejected after the minimum sample; every retry lands on a healthy replica and clients see clean answers', async () => {
        let sent = 0;
        // Sequential, alternating stream and whole: the loop replica gets about a third.
        while (!replica(await upstreams(lg), c).ejected) {
            assert.ok(sent < 80, `not ejected after ${sent} requests: ${JSON.stringify(await upstreams(lg))}`);
            await cleanChat(lg, { stream: sent % 2 === 1 });
            sent++;
        }
        const onC = await chatRequests(c);
        // Exactly the minimum sample reached it: the 5th tripped generation ejected it.
        assert.equal(onC.length, MIN_REQUESTS, `requests on the looping replica before ejection`);
        const elsewhere = [...(await chatRequests(a)), ...(await chatRequests(b))];
        for (const q of onC) {
            assert.ok(q.tag, 'tagged prompt');
            assert.equal(onC.filter((x) => x.tag === q.tag).length, 1, `${q.tag}: the retry did not go back to the looping replica`);
            assert.equal(q.body.presence_penalty, undefined, `${q.tag}: the first attempt ran with the client's sampling`);
            const retry = elsewhere.filter((x) => x.tag === q.tag);
            assert.equal(retry.length, 1, `${q.tag}: its retry reached exactly one healthy replica`);
            assert.equal(retry[0].body.presence_penalty, 1, `${q.tag}: the retry carries the ladder's first step`);
        }
        // loopguard's own account of the exchanges agrees: first attempt on C, second elsewhere.
        const exch = (await incidents(lg.url)).filter((i) => i.kind !== 'upstream');
        const viaC = exch.filter((i) => i.attempts[0].upstream === c.url);
        assert.equal(viaC.length, MIN_REQUESTS, 'one incident per exchange that met the looping replica');
        for (const i of viaC) {
            assert.equal(i.outcome, 'recovered');
            assert.ok([a.url, b.url].includes(i.attempts.at(-1).upstream), `recovered on a healthy replica: ${JSON.stringify(i.attempts)}`);
        }
        assert.ok(sent >= MIN_REQUESTS, 'requests sent');
        seen.c = onC.length;
    });

    test('while ejected it gets no traffic, and the ejection shows in /loopguard/upstreams, metrics and the incident log', async () => {
        const t0 = Date.now();
        await pool(24, 4, (i) => cleanChat(lg, { stream: i % 2 === 0 }));
        const elapsed = Date.now() - t0;
        assert.ok(elapsed < BACKOFF_MS, `the burst (${elapsed} ms) ran inside the back-off`);
        assert.equal((await chatRequests(c)).length, seen.c, 'no request reached the ejected replica');

        const list = await upstreams(lg);
        const uc = replica(list, c);
        assert.equal(uc.ejected, true);
        assert.equal(uc.ejections, 1);
        assert.ok(uc.ejected_for_ms > 0 && uc.ejected_for_ms <= BACKOFF_MS, `ejected_for_ms ${uc.ejected_for_ms}`);
        assert.equal(uc.healthy, true, 'ejected, not unhealthy: it still answers /health');
        for (const f of [a, b]) {
            const u = replica(list, f);
            assert.equal(u.ejected, false);
            assert.equal(u.healthy, true);
            assert.equal(u.ejections, 0);
        }

        const m = await metrics(lg.url);
        assert.equal(metricValue(m, 'loopguard_upstream_ejected', { upstream: c.url }), 1);
        assert.equal(metricValue(m, 'loopguard_upstream_ejections_total', { upstream: c.url }), 1);
        for (const f of [a, b]) {
            assert.equal(metricValue(m, 'loopguard_upstream_ejected', { upstream: f.url }), 0);
            assert.equal(metricValue(m, 'loopguard_upstream_ejections_total', { upstream: f.url }), 0);
            assert.equal(metricValue(m, 'loopguard_upstream_trips_total', { upstream: f.url }), 0);
        }
        assert.equal(metricValue(m, 'loopguard_upstream_trips_total', { upstream: c.url }), MIN_REQUESTS);

        const recs = await waitFor(async () => {
            const r = incidentFile(incPath);
            return upstreamEvents(r, c, 'ejected').length ? r : null;
        });
        const ej = upstreamEvents(recs, c, 'ejected');
        assert.equal(ej.length, 1, 'one ejection record');
        assert.match(ej[0].ts, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
        assert.equal(ej[0].detail.generations, MIN_REQUESTS);
        assert.equal(ej[0].detail.trip_rate, 1);
        assert.equal(ej[0].detail.others_trip_rate, 0);
        assert.equal(ej[0].detail.backoff_ms, BACKOFF_MS);
        assert.equal(recs.filter((r) => r.kind === 'upstream' && r.upstream !== c.url).length, 0, 'no healthy replica was ejected');
        assert.ok((await incidents(lg.url)).some((r) => r.kind === 'upstream' && r.event === 'ejected' && r.upstream === c.url), 'the ejection is in /loopguard/incidents too');
    });

    test('it returns after its back-off once it answers cleanly, gradually, with a returned incident', async () => {
        await c.setScenario(CLEAN);
        await waitFor(async () => !replica(await upstreams(lg), c).ejected, BACKOFF_MS + 2000);
        // Ramp-up: its share grows over one back-off, so keep a light trickle until it serves.
        let sent = 0;
        await waitFor(
            async () => {
                await cleanChat(lg, { stream: sent++ % 2 === 0 });
                return (await chatRequests(c)).length > seen.c;
            },
            BACKOFF_MS * 2 + 2000,
            10
        );
        const recs = await waitFor(async () => {
            const r = incidentFile(incPath);
            return upstreamEvents(r, c, 'returned').length ? r : null;
        });
        assert.equal(upstreamEvents(recs, c, 'returned').length, 1, 'one returned record');
        assert.ok(recs.indexOf(upstreamEvents(recs, c, 'returned')[0]) > recs.indexOf(upstreamEvents(recs, c, 'ejected')[0]), 'returned after ejected');
        const uc = replica(await upstreams(lg), c);
        assert.equal(uc.ejected, false);
        assert.equal(uc.ejections, 1);
        const m = await metrics(lg.url);
        assert.equal(metricValue(m, 'loopguard_upstream_ejected', { upstream: c.url }), 0);

        // Once the ramp is over it takes its share again (1/3 expected; 30 sequential picks).
        await sleep(BACKOFF_MS);
        const before = (await chatRequests(c)).length;
        for (let i = 0; i < 30; i++) await cleanChat(lg, { stream: i % 2 === 0 });
        const got = (await chatRequests(c)).length - before;
        assert.ok(got >= 3, `the returned replica serves again (${got} of 30)`);
        assert.ok(got <= 20, `but not everything (${got} of 30)`);
        assert.equal(upstreamEvents(incidentFile(incPath), c, 'ejected').length, 1, 'clean answers do not eject it again');
    });
});

/* ---- health --------------------------------------------------------------------------- */

describe('a replica that is down', () => {
    let a, b, d, lg, dPort;
    before(async () => {
        a = await startFake({ scenario: CLEAN_FILE });
        b = await startFake({ scenario: CLEAN_FILE });
        d = await startFake({ scenario: CLEAN_FILE });
        dPort = d.port;
        lg = await startLoopguard({ upstream: [a.url, b.url, d.url], kind: 'sglang', config: baseConfig() });
    });
    after(async () => {
        await lg?.stop();
        await Promise.all([a?.stop(), b?.stop(), d?.stop()]);
    });

    test('is skipped: no client sees a 502 while another replica is healthy, and health checks mark it down', async () => {
        // Warm: all three serve.
        await pool(30, 3, (i) => cleanChat(lg, { stream: i % 2 === 0 }));
        assert.ok((await chatRequests(d)).length > 0, 'the replica served before it went down');
        await d.stop();
        // At once, before any health check noticed: connect errors are retried elsewhere.
        const t0 = Date.now();
        await pool(60, 6, (i) => cleanChat(lg, { stream: i % 2 === 0 }));
        const list = await waitFor(async () => {
            const l = await upstreams(lg);
            return replica(l, d).healthy === false ? l : null;
        }, 3000 * SLACK);
        assert.ok(Date.now() - t0 < 3000 * SLACK, 'marked down within a few health intervals');
        assert.equal(replica(list, a).healthy, true);
        assert.equal(replica(list, b).healthy, true);
        const m = await metrics(lg.url);
        assert.equal(metricValue(m, 'loopguard_upstream_healthy', { upstream: d.url }), 0);
        assert.equal(metricValue(m, 'loopguard_upstream_healthy', { upstream: a.url }), 1);
        // Still all clean while it is down.
        await pool(30, 6, (i) => cleanChat(lg, { stream: i % 2 === 0 }));
        assert.equal(metricValue(await metrics(lg.url), 'loopguard_requests_total', { endpoint: 'chat', code: '502' }), 0, 'no 502 counted');
    });

    test('pass-through requests are not answered 502 while another replica is healthy', async () => {
        // A fresh loopguard whose health checker has not yet noticed that one replica is
        // down (checks once an hour): every GET /v1/models still has a healthy replica.
        const fresh = await startLoopguard({ upstream: [a.url, d.url], kind: 'sglang', config: { health: { interval_ms: 3600000 } } });
        try {
            const codes = await pool(20, 4, () => request(fresh.url + '/v1/models').then((r) => r.status));
            assert.deepEqual(codes.filter((s) => s !== 200), [], `statuses: ${codes.join(',')}`);
        } finally {
            await fresh.stop();
        }
    });

    test('comes back healthy when restarted on the same port, and gets traffic again', async () => {
        d = await startFake({ scenario: CLEAN_FILE, args: ['--listen', `127.0.0.1:${dPort}`] });
        assert.equal(d.port, dPort);
        await waitFor(async () => replica(await upstreams(lg), d).healthy, 3000 * SLACK);
        assert.equal(metricValue(await metrics(lg.url), 'loopguard_upstream_healthy', { upstream: d.url }), 1);
        await pool(30, 3, (i) => cleanChat(lg, { stream: i % 2 === 0 }));
        const got = (await chatRequests(d)).length;
        assert.ok(got >= 3, `the restarted replica serves again (${got} of 30)`);
    });
});

/* ---- balancing ------------------------------------------------------------------------ */

// A clean answer of `tokens` content tokens paced at `pace` ms.
const pacedClean = (pace, tokens) => ({ dialect: 'sglang', pace_ms: pace, responses: [{ reasoning: ['Short.'], content: [{ varied: tokens, seed: 3 }] }] });

async function streamOk(lg) {
    const { tag, body: b } = body({ stream: true });
    const r = await chat(lg.url + '/v1/chat/completions', b);
    assert.equal(r.status, 200, `${tag}: ${r.text.slice(0, 200)}`);
    assert.equal(sseData(r.text).at(-1), '[DONE]');
    assert.equal(assembleDeltas(sseJSON(r.text)).finish_reason, 'stop');
}

describe('least-outstanding balancing', () => {
    test('slow streams spread evenly over two replicas', async () => {
        const x = await startFake({ scenario: pacedClean(20, 40) });
        const y = await startFake({ scenario: pacedClean(20, 40) });
        const lg = await startLoopguard({ upstream: [x.url, y.url], kind: 'sglang' });
        try {
            const samples = [];
            let sampling = true;
            const sampler = (async () => {
                while (sampling) {
                    const l = await upstreams(lg);
                    samples.push(l.map((u) => u.outstanding));
                    await sleep(50);
                }
            })();
            // 24 streams of ~0.8 s, started 15 ms apart: all overlap.
            await Promise.all(Array.from({ length: 24 }, (_, i) => sleep(15 * i).then(() => streamOk(lg))));
            sampling = false;
            await sampler;
            const nx = (await chatRequests(x)).length,
                ny = (await chatRequests(y)).length;
            assert.equal(nx + ny, 24);
            assert.ok(Math.abs(nx - ny) <= 2, `per-replica requests ${nx} / ${ny}`);
            const peak = samples.reduce((m, s) => Math.max(m, s[0] + s[1]), 0);
            assert.ok(peak >= 10, `streams overlapped (peak outstanding ${peak})`);
            // The balancer decides as streams start: balanced up to the peak. How they
            // finish is the streams' own pace (several slow workers under TSan end one
            // replica's streams before the other's).
            const rising = samples.slice(0, samples.findIndex((s) => s[0] + s[1] === peak) + 1);
            for (const s of rising) assert.ok(Math.abs(s[0] - s[1]) <= 2, `outstanding stays balanced while streams start: ${JSON.stringify(samples)}`);
        } finally {
            await lg.stop();
            await Promise.all([x.stop(), y.stop()]);
        }
    });

    test('a fast replica takes more of a closed-loop load than a slow one', async () => {
        const fast = await startFake({ scenario: pacedClean(2, 40) }); // ~80 ms a stream
        const slow = await startFake({ scenario: pacedClean(40, 40) }); // ~1.6 s a stream
        const lg = await startLoopguard({ upstream: [fast.url, slow.url], kind: 'sglang' });
        try {
            const end = Date.now() + 2500;
            await Promise.all(
                Array.from({ length: 4 }, async () => {
                    while (Date.now() < end) await streamOk(lg);
                })
            );
            const nf = (await chatRequests(fast)).length,
                ns = (await chatRequests(slow)).length;
            // Random or round-robin choice would split requests about evenly; least
            // outstanding keeps sending to the replica that frees up.
            assert.ok(ns >= 1, `the slow replica got some (${ns})`);
            assert.ok(nf >= 4 * ns, `fast ${nf} vs slow ${ns}`);
        } finally {
            await lg.stop();
            await Promise.all([fast.stop(), slow.stop()]);
        }
    });
});

/* ---- never the last one --------------------------------------------------------------- */

// A request to a pool where every replica loops: the answer is well-formed and ends with
// content_filter once attempts run out (the default retry.on_exhausted).
async function exhaustedChat(lg, stream) {
    const { tag, body: b } = body({ stream });
    const r = await chat(lg.url + '/v1/chat/completions', b);
    assert.equal(r.status, 200, `${tag}: ${r.text.slice(0, 200)}`);
    const finish = stream ? (assert.equal(sseData(r.text).at(-1), '[DONE]'), assembleDeltas(sseJSON(r.text)).finish_reason) : r.json().choices[0].finish_reason;
    assert.equal(finish, 'content_filter', tag);
}

describe('never eject the last healthy replica', () => {
    test('two replicas that both loop: neither is ejected', async () => {
        const x = await startFake({ scenario: ALWAYS_LOOP });
        const y = await startFake({ scenario: ALWAYS_LOOP });
        const lg = await startLoopguard({ upstream: [x.url, y.url], kind: 'sglang', config: { ...baseConfig(), retry: { max_attempts: 2 } } });
        try {
            for (let i = 0; i < 8; i++) await exhaustedChat(lg, i % 2 === 0);
            const list = await upstreams(lg);
            for (const u of list) {
                assert.equal(u.ejected, false, JSON.stringify(list));
                assert.equal(u.ejections, 0);
                assert.ok(u.window_trips >= MIN_REQUESTS, `each replica tripped past the minimum sample: ${JSON.stringify(list)}`);
            }
            const m = await metrics(lg.url);
            assert.equal(metricValue(m, 'loopguard_upstream_ejections_total'), 0);
            assert.equal((await incidents(lg.url)).filter((r) => r.kind === 'upstream').length, 0);
        } finally {
            await lg.stop();
            await Promise.all([x.stop(), y.stop()]);
        }
    });

    test('the only healthy replica loops while the other is down: it is not ejected', async () => {
        const x = await startFake({ scenario: ALWAYS_LOOP });
        const y = await startFake({ scenario: CLEAN_FILE });
        const lg = await startLoopguard({ upstream: [x.url, y.url], kind: 'sglang', config: { ...baseConfig(), retry: { max_attempts: 2 } } });
        try {
            await y.stop();
            await waitFor(async () => replica(await upstreams(lg), y).healthy === false, 3000 * SLACK);
            for (let i = 0; i < 2 * MIN_REQUESTS; i++) await exhaustedChat(lg, i % 2 === 0);
            const ux = replica(await upstreams(lg), x);
            assert.ok(ux.window_trips >= MIN_REQUESTS * 2, `tripped ${ux.window_trips} times`);
            assert.equal(ux.ejected, false);
            assert.equal(ux.ejections, 0);
            assert.equal(metricValue(await metrics(lg.url), 'loopguard_upstream_ejected', { upstream: x.url }), 0);
        } finally {
            await lg.stop();
            await x.stop();
        }
    });
});

/* ---- connect timeout ---------------------------------------------------------------- */

// A listener whose accept queue is full: the kernel drops further SYNs, so a connect to it
// neither succeeds nor fails until the client gives up. python3 because node accepts every
// connection it is offered.
async function blackhole() {
    const py = `
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(0)
fill = []
for _ in range(4):
    c = socket.socket(); c.setblocking(False)
    try: c.connect(s.getsockname())
    except BlockingIOError: pass
    fill.append(c)
print(s.getsockname()[1], flush=True)
time.sleep(600)
`;
    const p = spawn('python3', ['-c', py], { stdio: ['ignore', 'pipe', 'inherit'] });
    const port = await new Promise((resolve, reject) => {
        p.stdout.once('data', (d) => resolve(Number(String(d).trim())));
        p.once('exit', (c) => reject(new Error(`blackhole exited ${c}`)));
    });
    return { url: `http://127.0.0.1:${port}`, kill: () => p.kill() };
}

describe('a replica that never completes the TCP handshake (timeouts.connect_ms)', () => {
    const CONNECT_MS = 300;
    let hole, a;
    before(async () => {
        hole = await blackhole();
        a = await startFake({ scenario: CLEAN_FILE });
    });
    after(async () => {
        hole?.kill();
        await a?.stop();
    });
    const config = { timeouts: { connect_ms: CONNECT_MS }, health: { interval_ms: 3600000 }, retry: { max_attempts: 3 } };

    test('alone: the client gets a 504 once connect_ms has passed (ticks are 250 ms apart)', async () => {
        const lg = await startLoopguard({ upstream: [hole.url], kind: 'sglang', config });
        try {
            for (const stream of [false, true]) {
                const t0 = Date.now();
                const r = await chat(lg.url + '/v1/chat/completions', body({ stream }).body);
                const took = Date.now() - t0;
                assert.equal(r.status, 504, r.text.slice(0, 200));
                assert.equal(JSON.parse(r.text).error.code, 'upstream_timeout');
                assert.ok(took >= CONNECT_MS, `not before connect_ms (${took} ms)`);
                assert.ok(took < CONNECT_MS + 250 + 1000 * SLACK, `soon after connect_ms (${took} ms)`);
            }
        } finally {
            await lg.stop();
        }
    });

    test('with a healthy second replica: every client gets its answer', async () => {
        const lg = await startLoopguard({ upstream: [hole.url, a.url], kind: 'sglang', config });
        try {
            await pool(12, 4, (i) => cleanChat(lg, { stream: i % 2 === 0 }));
            const m = await metrics(lg.url);
            assert.ok(metricValue(m, 'loopguard_upstream_errors_total', { upstream: hole.url, kind: 'connect' }) >= 1, 'some requests tried the silent replica first and moved on');
        } finally {
            await lg.stop();
        }
    });
});

/* ---- a forward proxy from the environment ------------------------------------------- */

// A plain-HTTP forward proxy that records the request target of every request it relays
// (absolute-form for a client that talks to a proxy) and passes the answer through as it
// comes.
function forwardProxy() {
    const seen = [];
    const server = http.createServer((req, res) => {
        seen.push(req.url);
        const up = http.request(req.url, { method: req.method, headers: req.headers }, (ur) => {
            res.writeHead(ur.statusCode, ur.headers);
            ur.pipe(res);
        });
        up.on('error', () => res.destroy());
        req.pipe(up);
    });
    return new Promise((resolve) =>
        server.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}`, seen, close: () => server.close() })),
    );
}

// libcurl picks the upstream's proxy from http_proxy, no_proxy and the like (loopguard gives
// it "no proxy" itself only when none of them is set: worker.c, add_xfer).
describe('an upstream proxy from the environment', () => {
    let fake, proxy;
    const UNSET = { no_proxy: '', NO_PROXY: '', http_proxy: '', https_proxy: '', HTTPS_PROXY: '', all_proxy: '', ALL_PROXY: '' };
    before(async () => {
        fake = await startFake({ scenario: CLEAN_FILE });
        proxy = await forwardProxy();
    });
    after(async () => {
        proxy?.close();
        await fake?.stop();
    });
    const config = { health: { interval_ms: 3600000 } };

    for (const [name, env, viaProxy] of [
        ['http_proxy: every upstream request goes through the proxy', () => ({ ...UNSET, http_proxy: proxy.url }), true],
        ['all_proxy: every upstream request goes through the proxy', () => ({ ...UNSET, all_proxy: proxy.url }), true],
        ['http_proxy with the upstream in no_proxy: the proxy is bypassed', () => ({ ...UNSET, http_proxy: proxy.url, no_proxy: '127.0.0.1' }), false],
        ['no proxy variable: the upstream is reached directly', () => UNSET, false],
    ]) {
        test(name, async () => {
            proxy.seen.length = 0;
            const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config, env: env() });
            try {
                const results = [];
                for (const stream of [false, true, false]) results.push(await cleanChat(lg, { stream }));
                const reached = (await chatRequests(fake)).map((r) => r.tag);
                for (const r of results) assert.ok(reached.includes(r.tag), `${r.tag} reached the upstream`);
                const relayed = proxy.seen.filter((u) => u === `${fake.url}/v1/chat/completions`).length;
                assert.equal(relayed, viaProxy ? results.length : 0, `requests the proxy relayed: ${JSON.stringify(proxy.seen)}`);
            } finally {
                await lg.stop();
            }
        });
    }
});
