// The operator's side: what a person starting, configuring and watching loopguard sees.
// One instance per address (a second loopguard, or any other listener, on the same
// address is refused with a message: loopguard's one listening socket has no SO_REUSEPORT), --version and a
// complete --help, scan's command-line errors, configuration errors reported all at once
// with the key or variable that was probably meant, and upstream failures that name their
// cause and the upstream, to the client and at once on stderr, and the access log.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';
import { startLoopguard, startFake, runLoopguard, tmpFile, isSlowBuild, deadPort, chat, request, waitFor, sleep, assertOpenAIError, SCENARIOS, SEED_BODY } from './lib.mjs';

const T = { timeout: isSlowBuild ? 60000 : 20000 };

// The environment without any LOOPGUARD_* variable, plus `env`.
function cleanEnv(env = {}) {
    const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('LOOPGUARD_')));
    return { ...base, ...env };
}

// Runs loopguard with a config file on `listen` and expects it to refuse to start.
async function refusedOn(listen) {
    const file = tmpFile('second.json', JSON.stringify({ listen, upstream: 'http://127.0.0.1:9', upstream_kind: 'openai', workers: 1 }));
    return runLoopguard(['--config', file], { env: cleanEnv(), timeout: isSlowBuild ? 30000 : 10000 });
}

describe('one instance per address', () => {
    let first;
    before(async () => {
        first = await startLoopguard({ upstream: 'http://127.0.0.1:9', kind: 'openai', config: { workers: 2 } });
    });
    after(() => first?.stop());

    it('a second loopguard on the address of a running one exits 1 and says why', T, async () => {
        const r = await refusedOn(`127.0.0.1:${first.port}`);
        assert.equal(r.code, 1, r.stderr);
        assert.match(r.stderr, new RegExp(`listen 127\\.0\\.0\\.1:${first.port}: address already in use: another process \\(another loopguard\\?\\) listens there`));
        assert.doesNotMatch(r.stdout, /listening on/);
    });

    it('so does a loopguard on an address another program listens on', T, async () => {
        const srv = net.createServer(() => {});
        await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
        try {
            const r = await refusedOn(`127.0.0.1:${srv.address().port}`);
            assert.equal(r.code, 1, r.stderr);
            assert.match(r.stderr, /address already in use/);
        } finally {
            await new Promise((resolve) => srv.close(resolve));
        }
    });

    it('the admin listener is checked the same way', T, async () => {
        const srv = net.createServer(() => {});
        await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
        try {
            const file = tmpFile('admin-taken.json', JSON.stringify({
                listen: '127.0.0.1:0', upstream: 'http://127.0.0.1:9', upstream_kind: 'openai', workers: 1,
                admin: { listen: `127.0.0.1:${srv.address().port}` },
            }));
            const r = await runLoopguard(['--config', file], { env: cleanEnv() });
            assert.equal(r.code, 1, r.stderr);
            assert.match(r.stderr, new RegExp(`listen 127\\.0\\.0\\.1:${srv.address().port}: address already in use`));
        } finally {
            await new Promise((resolve) => srv.close(resolve));
        }
    });
});

describe('command line', () => {
    it('--version names the version and the libraries', T, async () => {
        const r = await runLoopguard(['--version'], { env: cleanEnv() });
        assert.equal(r.code, 0);
        assert.match(r.stdout, /^loopguard \d+\.\d+\.\d+ \(libmicrohttpd [\d.]+, libcurl [\d.]+, cJSON [\d.]+\)\n$/);
    });

    it('--help lists every mode and option, scan\'s included', T, async () => {
        const r = await runLoopguard(['--help'], { env: cleanEnv() });
        assert.equal(r.code, 0);
        for (const s of ['--config', '--listen', '--upstream', '--upstream-kind', '--check-config', 'scan', 'tool_args', '--max-bytes', '--channel', '--version', 'loopguard(1)'])
            assert.ok(r.stdout.includes(s), `--help does not mention ${s}:\n${r.stdout}`);
    });

    it('an unknown flag is named', T, async () => {
        const r = await runLoopguard(['--upstrem', 'x'], { env: cleanEnv() });
        assert.equal(r.code, 2);
        assert.match(r.stderr, /^loopguard: --upstrem: unknown flag\n/);
    });

    it('scan says what was wrong before the usage', T, async () => {
        const cases = [
            [['--channel', 'foo', 'x'], /loopguard scan: --channel: expected content, reasoning or tool_args, got foo\n/],
            [['--max-bytes', 'lots', 'x'], /loopguard scan: --max-bytes: expected a positive number of bytes, got lots\n/],
            [['--max-bytes'], /loopguard scan: missing value after --max-bytes\n/],
            [['--colour', 'x'], /loopguard scan: unknown option --colour\n/],
            [[], /loopguard scan: no FILE to scan/],
        ];
        for (const [args, want] of cases) {
            const r = await runLoopguard(['scan', ...args], { env: cleanEnv() });
            assert.equal(r.code, 2, args.join(' '));
            assert.match(r.stderr, want);
            assert.match(r.stderr, /usage: loopguard scan/);
        }
    });

    it('scan --channel tool_args and --max-bytes work as --help says', T, async () => {
        const f = tmpFile('scan.txt', 'x'.repeat(5000));
        const r = await runLoopguard(['scan', '--channel', 'tool_args', '--max-bytes', '100', f], { env: cleanEnv() });
        assert.equal(r.code, 0, r.stderr);
        assert.equal(JSON.parse(r.stdout).bytes, 100);
    });
});

describe('configuration errors, all at once', () => {
    it('every bad key of the file, the environment and the flags in one run, with suggestions', T, async () => {
        const file = tmpFile('bad.json', JSON.stringify({
            upstrem: 'http://x:1',
            retry: { max_atempts: 3, mode: 'sideways' },
            timeouts: { idle_ms: 'soon' },
        }));
        const r = await runLoopguard(['--check-config', file, '--upstream-kind', 'tgi'], {
            env: cleanEnv({
                LOOPGUARD_UPSTREM: 'http://a:1',
                LOOPGUARD_GUARD__CONTENT: '{"lines": {',
                LOOPGUARD_WORKERS: 'many',
            }),
        });
        assert.equal(r.code, 2);
        assert.doesNotMatch(r.stdout, /config OK/);
        const lines = r.stderr.trimEnd().split('\n');
        assert.deepEqual(lines, [
            `loopguard: ${file}: upstrem: unknown key (did you mean upstream?)`,
            `loopguard: ${file}: timeouts.idle_ms: expected a non-negative integer`,
            `loopguard: ${file}: retry.max_atempts: unknown key (did you mean retry.max_attempts?)`,
            `loopguard: ${file}: retry.mode: expected one of auto, restart, continue`,
            'loopguard: LOOPGUARD_GUARD__CONTENT: guard.content: invalid JSON at character 12 of the value',
            'loopguard: LOOPGUARD_UPSTREM: no such setting (did you mean LOOPGUARD_UPSTREAM?)',
            'loopguard: LOOPGUARD_WORKERS: workers: expected a non-negative integer',
            'loopguard: --upstream-kind: expected auto, sglang, vllm or openai',
        ]);
    });

    it('an unknown LOOPGUARD_* variable stops the start like an unknown key', T, async () => {
        const r = await runLoopguard(['--upstream', 'http://127.0.0.1:9', '--listen', '127.0.0.1:0'], {
            env: cleanEnv({ LOOPGUARD_UPSTREM: 'http://127.0.0.1:30000' }),
        });
        assert.equal(r.code, 2);
        assert.equal(r.stderr, 'loopguard: LOOPGUARD_UPSTREM: no such setting (did you mean LOOPGUARD_UPSTREAM?)\n');
    });
});

// A TCP server that accepts and then does `onConn(socket)`; resolves to {port, close()}.
async function rawServer(onConn) {
    const socks = new Set();
    const srv = net.createServer((c) => {
        socks.add(c);
        c.on('error', () => {});
        c.once('data', () => onConn(c));
    });
    await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
    return {
        port: srv.address().port,
        close: () => {
            for (const c of socks) c.destroy();
            return new Promise((resolve) => srv.close(resolve));
        },
    };
}

const CHAT = { model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: 20 };

describe('upstream failures name their cause', () => {
    // Starts loopguard in front of `upstream`, sends a chat and a relayed request, returns
    // both error messages and loopguard's stderr once the failure line is there.
    async function failWith(upstream, config = {}) {
        const lg = await startLoopguard({ upstream, kind: 'openai', config: { health: { interval_ms: 3600000 }, ...config } });
        try {
            const c = await chat(lg.url + '/v1/chat/completions', CHAT);
            const r = await request(lg.url + '/v1/models');
            const stderr = await waitFor(() => (lg.stderr().match(/upstream .* failed: /g) || []).length >= 2 && lg.stderr());
            return { chat: c, relay: r, stderr };
        } finally {
            await lg.stop();
        }
    }

    it('connection refused: 502 naming HOST:PORT, and a stderr line with the URL at once', T, async () => {
        const port = await deadPort();
        const f = await failWith(`http://127.0.0.1:${port}`);
        for (const r of [f.chat, f.relay]) {
            const e = assertOpenAIError(r, 502);
            assert.equal(e.message, `upstream 127.0.0.1:${port}: connection refused`);
            assert.equal(e.code, 'upstream_unreachable');
        }
        assert.match(f.stderr, new RegExp(`loopguard: upstream http://127\\.0\\.0\\.1:${port} failed: connection refused \\(libcurl: Couldn't connect to server; Connection refused\\)\n`));
    });

    it('DNS: a name that does not resolve', T, async () => {
        const f = await failWith('http://no-such-host.invalid:30000');
        assert.equal(assertOpenAIError(f.chat, 502).message, 'upstream no-such-host.invalid:30000: DNS lookup failed');
        assert.match(f.stderr, /upstream http:\/\/no-such-host\.invalid:30000 failed: DNS lookup failed/);
    });

    it('TLS: https to a server that speaks plain HTTP', T, async () => {
        const srv = await rawServer((c) => c.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n'));
        try {
            const f = await failWith(`https://127.0.0.1:${srv.port}`);
            assert.match(assertOpenAIError(f.chat, 502).message, new RegExp(`^upstream 127\\.0\\.0\\.1:${srv.port}: TLS handshake failed \\(`));
            assert.match(f.stderr, /failed: TLS handshake failed/);
        } finally {
            await srv.close();
        }
    });

    it('first-byte timeout: 504 naming timeouts.first_byte_ms', T, async () => {
        const srv = await rawServer(() => {}); // reads the request, never answers
        try {
            const f = await failWith(`http://127.0.0.1:${srv.port}`, { timeouts: { first_byte_ms: 300 } });
            for (const r of [f.chat, f.relay]) {
                const e = assertOpenAIError(r, 504);
                assert.equal(e.message, `upstream 127.0.0.1:${srv.port}: no response within timeouts.first_byte_ms`);
            }
            assert.match(f.stderr, /failed: no response within timeouts\.first_byte_ms/);
        } finally {
            await srv.close();
        }
    });

    it('idle timeout: a stream that stops ends with an error event naming timeouts.idle_ms', T, async () => {
        const event = 'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n';
        const srv = await rawServer((c) =>
            c.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n' +
                `${Buffer.byteLength(event).toString(16)}\r\n${event}\r\n`));
        const lg = await startLoopguard({ upstream: `http://127.0.0.1:${srv.port}`, kind: 'openai', config: { timeouts: { idle_ms: 300 }, health: { interval_ms: 3600000 } } });
        try {
            const r = await chat(lg.url + '/v1/chat/completions', CHAT);
            assert.equal(r.status, 200);
            assert.match(r.text, new RegExp(`"message":"upstream 127\\.0\\.0\\.1:${srv.port}: no event within timeouts\\.idle_ms"`));
            await waitFor(() => /failed: no event within timeouts\.idle_ms/.test(lg.stderr()));
        } finally {
            await lg.stop();
            await srv.close();
        }
    });

    it('a replica never reached is not reported healthy', T, async () => {
        const port = await deadPort();
        const fake = await startFake({ kind: 'openai' });
        const lg = await startLoopguard({ upstream: [`http://127.0.0.1:${port}`, fake.url], kind: 'openai' });
        try {
            // Relayed requests reach the fake (the dead replica's are sent on to it).
            for (let i = 0; i < 3; i++) assert.equal((await request(lg.url + '/v1/models')).status, 200);
            const ups = (await request(lg.url + '/loopguard/upstreams')).json();
            assert.equal(ups[0].healthy, false, JSON.stringify(ups));
            assert.equal(ups[0].reached, false);
            assert.equal(ups[1].healthy, true);
            const m = (await request(lg.url + '/loopguard/metrics')).text;
            assert.match(m, new RegExp(`loopguard_upstream_healthy\\{upstream="http://127\\.0\\.0\\.1:${port}"\\} 0\n`));
        } finally {
            await lg.stop();
            await fake.stop();
        }
    });
});

// The scheduling policy of each of pid's threads (proc(5): /proc/PID/task/TID/stat's 41st
// field; 3 is SCHED_BATCH, 0 SCHED_OTHER).
function threadPolicies(pid) {
    return fs.readdirSync(`/proc/${pid}/task`).map((tid) => {
        const stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
        return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[41 - 3]);
    });
}

describe('worker scheduling', () => {
    it('workers run SCHED_BATCH by default, and as started with "normal"', T, async () => {
        const batch = await startLoopguard({ upstream: 'http://127.0.0.1:9', kind: 'openai', config: { workers: 3 } });
        try {
            // the main thread and the others keep the policy the process started with
            await waitFor(() => threadPolicies(batch.proc.pid).filter((p) => p === 3).length === 3);
            assert.ok(threadPolicies(batch.proc.pid).includes(0));
        } finally {
            await batch.stop();
        }
        const normal = await startLoopguard({ upstream: 'http://127.0.0.1:9', kind: 'openai', config: { workers: 3, worker_scheduling: 'normal' } });
        try {
            await waitFor(() => threadPolicies(normal.proc.pid).length >= 4); // main + 3 workers
            await sleep(isSlowBuild ? 2000 : 300); // a worker sets its policy first thing
            assert.deepEqual(threadPolicies(normal.proc.pid).filter((p) => p !== 0), []);
        } finally {
            await normal.stop();
        }
    });
});

describe('access log', () => {
    // The complete lines of `file` (a line still being written is not one yet).
    const lines = (file) => (fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n').slice(0, -1).map((l) => JSON.parse(l)) : []);

    it('one JSON line per request, reopened on SIGHUP', T, async () => {
        const fake = await startFake({ scenario: path.join(SCENARIOS, 'seed_lambda.json') });
        const file = tmpFile('access.jsonl', '');
        fs.rmSync(file);
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { log: { access: file } } });
        try {
            const c = await chat(lg.url + '/v1/chat/completions', { ...SEED_BODY, stream: true });
            assert.equal(c.status, 200);
            assert.equal((await request(lg.url + '/v1/models?key=secret')).status, 200);
            const [ex, rel] = await waitFor(() => lines(file).length >= 2 && lines(file));
            assert.equal(ex.route, '/v1/chat/completions');
            assert.equal(ex.status, 200);
            assert.equal(ex.model, SEED_BODY.model);
            assert.equal(ex.upstream, fake.url);
            assert.equal(ex.attempts, 2);
            assert.equal(ex.trips, 1);
            assert.equal(ex.outcome, 'recovered');
            assert.ok(ex.tokens > 0, JSON.stringify(ex));
            assert.ok(ex.ttft_ms > 0 && ex.ttft_ms <= ex.duration_ms, JSON.stringify(ex));
            assert.match(ex.id, /^lg-[0-9a-f]{24}$/);
            assert.match(ex.ts, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
            // The incident of the same exchange carries the same id.
            const inc = (await request(lg.url + '/loopguard/incidents')).json();
            assert.ok(inc.some((i) => i.id === ex.id));
            assert.deepEqual({ ...rel, ts: 0, duration_ms: 0 }, {
                ts: 0, id: null, route: '/v1/models', status: 200, model: null, upstream: fake.url,
                attempts: 1, trips: 0, tokens: null, ttft_ms: null, duration_ms: 0, outcome: null,
            });
            // logrotate: rename, SIGHUP, and the lines go to a new file at the path. A request
            // sent while the signal is still being handled may land in either file (as with
            // nginx's USR1); none is lost, and the renamed file keeps the two lines above.
            fs.renameSync(file, file + '.1');
            lg.proc.kill('SIGHUP');
            let sent = 0;
            await waitFor(async () => {
                assert.equal((await request(lg.url + '/v1/models')).status, 200);
                sent++;
                return lines(file).length >= 1;
            });
            const old = lines(file + '.1');
            assert.deepEqual(old.slice(0, 2).map((l) => l.route), ['/v1/chat/completions', '/v1/models']);
            assert.equal(old[0].id, ex.id);
            assert.ok(old.slice(2).every((l) => l.route === '/v1/models'), JSON.stringify(old));
            await waitFor(() => old.length + lines(file).length === 2 + sent);
        } finally {
            await lg.stop();
            await fake.stop();
        }
    });

    it('log.access "stderr" writes the lines to stderr; a bad value is a config error', T, async () => {
        const fake = await startFake({ kind: 'openai' });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'openai', config: { log: { access: 'stderr' } } });
        try {
            assert.equal((await request(lg.url + '/v1/models')).status, 200);
            await waitFor(() => /^\{"ts":"[^"]+","id":null,"route":"\/v1\/models","status":200,/m.test(lg.stderr()));
        } finally {
            await lg.stop();
            await fake.stop();
        }
        const r = await runLoopguard(['--check-config', tmpFile('acc.json', '{"log": {"acess": "stderr"}}')], { env: cleanEnv() });
        assert.match(r.stderr, /log\.acess: unknown key \(did you mean log\.access\?\)/);
    });
});

describe('incidents to stdout (containers without a log sidecar)', () => {
    it('incidents.path /dev/stdout writes each incident as a JSON line on stdout', T, async () => {
        const fake = await startFake({ scenario: path.join(SCENARIOS, 'seed_lambda.json') });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { incidents: { path: '/dev/stdout' } } });
        try {
            assert.equal((await chat(lg.url + '/v1/chat/completions', { ...SEED_BODY, stream: false })).status, 200);
            const line = await waitFor(() => lg.stdout().split('\n').find((l) => l.startsWith('{')));
            const inc = JSON.parse(line);
            assert.equal(inc.outcome, 'recovered');
            assert.equal(inc.attempts[0].detector, 'repeat');
        } finally {
            await lg.stop();
            await fake.stop();
        }
    });
});
