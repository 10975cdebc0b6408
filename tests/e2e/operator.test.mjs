// The operator's side: what a person starting, configuring and watching loopguard sees.
// One instance per address (a second loopguard, or any other listener, on the same
// address is refused with a message, whatever SO_REUSEPORT would allow), --version and a
// complete --help, scan's command-line errors, and configuration errors reported all at
// once, with the key or variable that was probably meant.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startLoopguard, runLoopguard, tmpFile, isSlowBuild } from './lib.mjs';

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
