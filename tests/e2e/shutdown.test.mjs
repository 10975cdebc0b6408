// End-to-end tests of shutdown and log handling, through the real
// loopguard binary and the real fake upstream.
//
// SIGTERM: loopguard stops accepting at once (a new connection is refused), lets the
// streams and whole requests in flight finish within shutdown_grace_ms, and past the grace
// ends them well-formed (an error event then [DONE] for a stream, a JSON error for a whole
// request) and releases their upstream generations; it exits 0 either way, with no
// sanitizer report. SIGHUP reopens the incident log: after a rename (what logrotate does)
// the next incident lands in a new file at the configured path. An unwritable log is counted
// and never stops the proxy.
//
// Runtime: ~6 s on the plain build.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
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
    jsonLines,
    metrics,
    metricValue,
    waitFor,
    sleep,
    SCENARIOS,
    isSanitizerBuild,
    cleanup,
    DEADLINE,
    SEED_BODY,
} from './lib.mjs';

const SLACK = isSanitizerBuild ? 3 : 1;
const MSG = [{ role: 'user', content: 'Write something.' }];
const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lg-shutdown-'));
process.on('exit', () => fs.rmSync(tmpDir, { recursive: true, force: true }));

const T = DEADLINE;

/* ---- local helpers --------------------------------------------------------------- */


// Resolves with {code, signal} when the process exits (at once if it already has).
function exited(proc) {
    if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve({ code: proc.exitCode, signal: proc.signalCode });
    return new Promise((r) => proc.once('exit', (code, signal) => r({ code, signal })));
}

// Tries a TCP connection: 'refused', 'closed' (accepted then closed without an answer) or
// 'answered' (an HTTP status line came back).
function probe(port) {
    return new Promise((resolve) => {
        const s = net.connect(port, '127.0.0.1');
        let got = '';
        s.on('connect', () => s.write('GET /loopguard/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'));
        s.on('data', (d) => (got += d));
        s.on('error', (e) => resolve(e.code === 'ECONNREFUSED' ? 'refused' : `error ${e.code}`));
        s.on('close', () => resolve(got.startsWith('HTTP/') ? 'answered' : 'closed'));
        s.setTimeout(2000, () => s.destroy());
    });
}

// lib's stop() after our own SIGTERM: wait for the exit first (a second SIGTERM would mean
// "stop now"); if the test failed before signalling, stop() sends the SIGTERM itself.
async function stopAfterTerm(lg, termed) {
    if (termed) await exited(lg.proc);
    await lg.stop();
}

// The tokens of a clean paced answer: 40 varied words, ~40 × pace ms long.
const WORDS = 40;
const pacedPlan = (pace) => ({ dialect: 'sglang', pace_ms: pace, responses: [{ reasoning: ['Fine.'], content: [{ varied: WORDS, seed: 3 }] }] });

// A paced stream through lg, once the fake generates it: {s, ended()}, ended() whether its
// response has settled.
async function streamInFlight(lg, fake) {
    const s = request(lg.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG, stream: true }, timeout: 60000 * SLACK });
    let ended = false;
    s.then(() => (ended = true), () => (ended = true));
    await waitFor(async () => (await fake.requests('/v1/chat/completions')).length === 1);
    return { s, ended: () => ended };
}

// The stream drained whole after the signal, and loopguard exited 0.
async function finishedWhole(stream, lg) {
    const rs = await stream.s;
    assert.equal(sseData(rs.text).at(-1), '[DONE]');
    assert.equal(assembleDeltas(sseJSON(rs.text)).content.split(' ').filter(Boolean).length, WORDS, 'the stream finished whole');
    assert.equal((await exited(lg.proc)).code, 0);
}

/* ---- SIGTERM ----------------------------------------------------------------------- */

describe('SIGTERM', () => {
    test('within the grace: new connections refused, in-flight stream and whole request finish, exit 0', T, async () => {
        // ~4 s of stream: long enough to outlast the signal's handling and the probes on a
        // loaded two-core machine (at 20 ms a token it ended first in CI runs).
        const fake = await startFake({ kind: 'sglang', scenario: pacedPlan(100) });
        const GRACE = 60000;
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { shutdown_grace_ms: GRACE } });
        let termed = false;
        try {
            const t0 = performance.now();
            const s = request(lg.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG, stream: true }, timeout: GRACE });
            const w = request(lg.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG }, timeout: GRACE });
            let streamEnded = false;
            s.then(() => (streamEnded = true), () => (streamEnded = true));
            await waitFor(async () => (await fake.requests('/v1/chat/completions')).length === 2);
            await sleep(100);
            lg.proc.kill('SIGTERM');
            termed = true;
            // The listener closes once the signal is handled, which takes longer on a loaded
            // machine or under valgrind: probe until a connection is refused, and the stream
            // must still be draining then.
            await waitFor(async () => (await probe(lg.port)) === 'refused', 5000 * SLACK);
            assert.equal(streamEnded, false, 'a new connection is refused while draining');
            const [rs, rw] = await Promise.all([s, w]);
            assert.equal(rs.status, 200);
            const data = sseData(rs.text);
            assert.equal(data.at(-1), '[DONE]');
            const v = assembleDeltas(sseJSON(rs.text));
            assert.equal(v.finish_reason, 'stop', 'the stream finished normally');
            assert.equal(v.content.split(' ').filter(Boolean).length, WORDS, 'every token arrived');
            assert.equal(rw.status, 200, rw.text);
            assert.equal(rw.json().choices[0].message.content.split(' ').filter(Boolean).length, WORDS);
            const { code } = await exited(lg.proc);
            assert.equal(code, 0, 'exit code 0');
            assert.ok(performance.now() - t0 < GRACE / 2, 'exited once the streams were done, not at the deadline');
        } finally {
            await cleanup(() => stopAfterTerm(lg, termed), () => fake.stop()); // checks exit code and sanitizer report
        }
    });

    test('connections open with no request when the signal comes are answered or closed while a stream still drains, never held until exit', T, async () => {
        // ~4 s of stream on one worker; six idle connections spread over both.
        const fake = await startFake({ kind: 'sglang', scenario: pacedPlan(100) });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { shutdown_grace_ms: 30000, workers: 2 } });
        let termed = false;
        const idle = [];
        try {
            const stream = await streamInFlight(lg, fake);
            // Each connection's end is watched from the start: a worker with no stream may
            // close it before the request below is sent.
            const outcomes = [];
            for (let i = 0; i < 6; i++) {
                const c = net.connect(lg.port, '127.0.0.1');
                let got = '';
                c.on('data', (d) => (got += d));
                c.on('error', () => {});
                outcomes.push(new Promise((resolve) => c.on('close', () => resolve({ got, streamEnded: stream.ended() }))));
                await new Promise((r, j) => c.once('connect', r).once('error', j));
                idle.push(c);
            }
            lg.proc.kill('SIGTERM');
            termed = true;
            await waitFor(async () => (await probe(lg.port)) === 'refused', 5000 * SLACK);
            // Those still open send a request now: an answer (503, their worker still drains a
            // stream) or the connection closed (their worker is done), before the stream ends.
            for (const c of idle) if (!c.destroyed) c.write('GET /loopguard/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
            for (const o of await Promise.all(outcomes)) {
                assert.equal(o.streamEnded, false, 'answered or closed while the stream was still draining');
                assert.ok(o.got === '' || o.got.startsWith('HTTP/1.1 503 '), JSON.stringify(o.got.slice(0, 60)));
            }
            await finishedWhole(stream, lg);
        } finally {
            for (const c of idle) c.destroy();
            await cleanup(() => stopAfterTerm(lg, termed), () => fake.stop());
        }
    });

    test('a burst of connections racing the signal: each is answered, closed or refused while a stream still drains, none held until exit', T, async () => {
        // Two workers split new connections evenly, a worker handing one it should not keep
        // to the other's queue; the signal comes in the middle of a burst of 200, so that
        // connections are accepted, handed over and queued in the listener's backlog while the
        // workers leave it. Each must be answered (200 before the drain, 503 from the worker
        // that still drains the stream), closed, or refused once the listener is closed; one
        // left open would stay so until the process exits, after the stream. (That a queue
        // shut at a drain refuses a hand-off in the same instant is test_handoff's.)
        const N = 200;
        const fake = await startFake({ kind: 'sglang', scenario: pacedPlan(100) }); // ~4 s
        const lg = await startLoopguard({
            upstream: fake.url,
            kind: 'sglang',
            config: { shutdown_grace_ms: 30000, workers: 2, limits: { max_conns_per_ip: 0 } },
        });
        let termed = false;
        const socks = [];
        try {
            const stream = await streamInFlight(lg, fake);
            const outcomes = [];
            // A connection that asks for the health page as soon as it is open; its outcome
            // is what came back, the error if any, and whether the stream had ended by then.
            const open = (onConnect) => {
                const c = net.connect(lg.port, '127.0.0.1');
                let got = '', code = '';
                c.on('connect', () => {
                    c.write('GET /loopguard/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
                    onConnect();
                });
                c.on('data', (d) => (got += d));
                c.on('error', (e) => (code = e.code));
                outcomes.push(new Promise((resolve) => c.on('close', () => resolve({ got, code, streamEnded: stream.ended() }))));
                socks.push(c);
            };
            let connected = 0;
            const halfway = new Promise((resolve) => {
                for (let i = 0; i < N / 2; i++) open(() => ++connected === N / 4 && resolve());
            });
            // The signal when a quarter of the first half has connected (the rest of it is on
            // its way), then the second half at once.
            await halfway;
            lg.proc.kill('SIGTERM');
            termed = true;
            for (let i = N / 2; i < N; i++) open(() => {});
            const seen = { answered: 0, unavailable: 0, closed: 0, refused: 0 };
            for (const o of await Promise.all(outcomes)) {
                assert.equal(o.streamEnded, false, 'settled while the stream was still draining');
                if (o.got.startsWith('HTTP/1.1 200 ')) seen.answered++;
                else if (o.got.startsWith('HTTP/1.1 503 ')) seen.unavailable++;
                else if (o.got === '' && o.code === 'ECONNREFUSED') seen.refused++;
                else if (o.got === '' && (o.code === '' || o.code === 'ECONNRESET' || o.code === 'EPIPE')) seen.closed++;
                else assert.fail(`unexpected outcome ${o.code} ${JSON.stringify(o.got.slice(0, 60))}`);
            }
            // Which it is depends on the build's pace (under valgrind none is served before
            // the drain, and the listener stays open through the burst); some must have
            // reached the workers.
            assert.ok(seen.answered + seen.unavailable + seen.closed > 0, `none reached the workers: ${JSON.stringify(seen)}`);
            await finishedWhole(stream, lg);
        } finally {
            for (const c of socks) c.destroy();
            await cleanup(() => stopAfterTerm(lg, termed), () => fake.stop());
        }
    });

    test('past shutdown_grace_ms: streams end with an error event and [DONE], whole requests with an error, upstream released, exit 0', T, async () => {
        const GRACE = 300;
        const fake = await startFake({ kind: 'sglang', scenario: pacedPlan(100) }); // ~4 s
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { shutdown_grace_ms: GRACE } });
        let termed = false;
        try {
            const s = request(lg.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG, stream: true } });
            const w = request(lg.url + '/v1/chat/completions', { method: 'POST', body: { messages: MSG } });
            const chats = await waitFor(async () => {
                const c = await fake.requests('/v1/chat/completions');
                return c.length === 2 && c;
            });
            await sleep(200);
            const t0 = performance.now();
            lg.proc.kill('SIGTERM');
            termed = true;
            const [rs, rw] = await Promise.all([s, w]);
            const took = performance.now() - t0;
            assert.ok(took >= GRACE * 0.8, `the streams were given the grace (${took.toFixed(0)} ms)`);
            assert.ok(took < GRACE + 2000 * SLACK, `and ended soon after it (${took.toFixed(0)} ms)`);

            assert.equal(rs.status, 200);
            const data = sseData(rs.text);
            assert.equal(data.at(-1), '[DONE]', 'the stream ends with [DONE]');
            assert.equal(data.filter((d) => d === '[DONE]').length, 1);
            assert.match(rs.text, /\n\n$/, 'no half-written event');
            const ev = data.slice(0, -1).map((d) => JSON.parse(d));
            assert.ok(ev.at(-1).error && typeof ev.at(-1).error.message === 'string', `an error event before [DONE]: ${data.at(-2)}`);
            assert.ok(assembleDeltas(ev.slice(0, -1)).content.length > 0, 'what was generated before still reached the client');

            assert.ok(rw.status >= 500, `whole request: an error status (${rw.status})`);
            assert.equal(typeof rw.json().error?.message, 'string', 'OpenAI-style error body');

            const { code } = await exited(lg.proc);
            assert.equal(code, 0, 'exit code 0');
            for (const c of chats) {
                const g = await fake.waitRecord((r) => r.kind === 'generation' && r.rid === c.rid, 2000);
                assert.notEqual(g.ended, 'complete', 'the generation was cut');
                assert.ok(g.client_gone || g.aborted, 'the upstream generation was released');
                assert.ok(g.tokens_sent < WORDS + 2, 'released at the deadline, not run to the end');
                await fake.waitRecord((r) => r.kind === 'abort' && r.rid === c.rid, 2000); // SGLang told to stop it
            }
        } finally {
            await cleanup(() => stopAfterTerm(lg, termed), () => fake.stop());
        }
    });

    test('idle: SIGTERM exits 0 at once', T, async () => {
        const fake = await startFake({ kind: 'sglang' });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { shutdown_grace_ms: 10000 } });
        try {
            const t0 = performance.now();
            const r = await lg.stop();
            assert.equal(r.code, 0);
            assert.ok(performance.now() - t0 < 2000 * SLACK, 'no wait for a deadline with nothing in flight');
        } finally {
            await fake.stop();
        }
    });
});

/* ---- the incident log --------------------------------------------------------------- */

describe('incident log', () => {
    const seed = () => ({ ...SEED_BODY, stream: true });

    test('SIGHUP reopens the log: after a rename the next incident lands in a new file at the same path', T, async () => {
        const file = path.join(tmpDir, 'incidents.jsonl');
        const fake = await startFake({ kind: 'sglang', scenario: path.join(SCENARIOS, 'seed_lambda.json') });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { incidents: { path: file } } });
        try {
            const r1 = await request(lg.url + '/v1/chat/completions', { method: 'POST', body: seed() });
            assert.equal(r1.status, 200);
            const [first] = await waitFor(() => jsonLines(file).length === 1 && jsonLines(file));
            assert.equal(first.outcome, 'recovered');

            fs.renameSync(file, file + '.1'); // logrotate's default (no copytruncate)
            lg.proc.kill('SIGHUP');
            // The main thread takes signals every 100 ms; the writer reopens before its next record.
            await sleep(300 * SLACK);

            await fake.reset();
            const r2 = await request(lg.url + '/v1/chat/completions', { method: 'POST', body: seed() });
            assert.equal(r2.status, 200);
            const [second] = await waitFor(() => jsonLines(file).length === 1 && jsonLines(file));
            assert.notEqual(second.id, first.id);
            const rid2 = (await fake.requests('/v1/chat/completions'))[0].rid;
            assert.equal(second.attempts[0].rid, rid2, 'the new file holds the new incident');
            assert.deepEqual(jsonLines(file + '.1').map((i) => i.id), [first.id], 'the rotated file kept the old one, and only it');
            assert.deepEqual((await incidents(lg.url)).map((i) => i.id).sort(), [first.id, second.id].sort(), 'nothing lost');
            assert.equal(lg.proc.exitCode, null, 'SIGHUP does not stop loopguard');
        } finally {
            await cleanup(() => lg.stop(), () => fake.stop());
        }
    });

    test('an unwritable incident log is counted, never a crash or a stall', T, async () => {
        const fake = await startFake({ kind: 'sglang', scenario: path.join(SCENARIOS, 'seed_lambda.json') });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { incidents: { path: '/dev/full' } } });
        try {
            for (let i = 0; i < 3; i++) {
                const r = await request(lg.url + '/v1/chat/completions', { method: 'POST', body: seed(), timeout: 5000 * SLACK });
                assert.equal(r.status, 200);
                assert.match(assembleDeltas(sseJSON(r.text)).content, /def is_prime/);
            }
            const m = await waitFor(async () => {
                const mm = await metrics(lg.url);
                return metricValue(mm, 'loopguard_incidents_total', { fate: 'submitted' }) === 3 && mm;
            });
            const failed = metricValue(m, 'loopguard_incidents_total', { fate: 'write_error' }) + metricValue(m, 'loopguard_incidents_total', { fate: 'dropped' });
            assert.ok(failed >= 1, 'write failures are counted');
            assert.equal(metricValue(m, 'loopguard_incidents_total', { fate: 'written' }), 0);
            assert.equal((await incidents(lg.url)).length, 3, 'still kept in memory for /loopguard/incidents');
            assert.equal((await request(lg.url + '/loopguard/health')).status, 200);
        } finally {
            await cleanup(() => lg.stop(), () => fake.stop());
        }
    });
});
