// Packaging and the first five minutes: `make install` with DESTDIR and PREFIX,
// the man page, the systemd unit, docker/build.sh run on the bare machine (there is no
// Docker engine here) on exactly the files the Dockerfile copies, the container entry
// point, the compose file and the Kubernetes manifest read structurally, and configuration
// through LOOPGUARD_* environment variables end to end. The deployment files are parsed
// with a small YAML-subset reader below (no YAML library), and every configuration they
// carry is fed to the binary under test with --check-config, so a file that drifts from
// the code fails here.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
    startFake,
    startLoopguard,
    runLoopguard,
    request,
    chat,
    incidents,
    waitFor,
    tmpFile,
    isSanitizerBuild,
    LOOPGUARD_BIN,
    SCENARIOS,
    SEED_BODY,
} from './lib.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const BUILD = process.env.BUILD || 'build';
const T = { timeout: isSanitizerBuild ? 60000 : 30000 };
const LAMBDA_TEXT = 'You can use the ' + 'lambda '.repeat(200);

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'lg-pkg-'));
after(() => fs.rmSync(scratch, { recursive: true, force: true }));

// Runs a command to completion: {code, signal, stdout, stderr}. `input` is written to stdin.
function run(cmd, args, { env = {}, cwd = ROOT, input, timeout = 60000 } = {}) {
    return new Promise((resolve, reject) => {
        const p = spawn(cmd, args, { cwd, env: { ...process.env, ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
        let stdout = '',
            stderr = '';
        p.stdout.on('data', (d) => (stdout += d));
        p.stderr.on('data', (d) => (stderr += d));
        const t = setTimeout(() => p.kill('SIGKILL'), timeout);
        p.on('error', reject);
        p.on('close', (code, signal) => {
            clearTimeout(t);
            resolve({ code, signal, stdout, stderr });
        });
        p.stdin.end(input);
    });
}

// Starts a server process that prints "listening on HOST:PORT" (loopguard, or the entry
// point that execs it) with exactly `env` over a scrubbed environment (no inherited
// LOOPGUARD_* variable may leak into a test about them). Returns {port, url, stop()};
// stop() sends SIGTERM and resolves to the exit code.
async function startServer(bin, args, env) {
    const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('LOOPGUARD_')));
    const p = spawn(bin, args, { env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '',
        err = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (err += d));
    const exited = new Promise((resolve) => p.on('exit', (code, signal) => resolve({ code, signal })));
    let gone = false;
    exited.then(() => (gone = true));
    const port = await waitFor(
        () => {
            if (gone) throw new Error(`${bin} exited before listening; stderr:\n${err}`);
            const m = /listening on \S+:(\d+)\n/.exec(out);
            return m && Number(m[1]);
        },
        10000,
        20
    );
    return {
        port,
        url: `http://127.0.0.1:${port}`,
        stderr: () => err,
        async stop() {
            if (!gone) p.kill('SIGTERM');
            const r = await exited;
            assert.equal(r.signal, null, `${bin} died by a signal; stderr:\n${err}`);
            return r.code;
        },
    };
}

// --- a reader for the YAML subset of docker/compose.yaml and docker/k8s.yaml --------------
// Block maps and sequences (an item may open a map), flow sequences, quoted and plain
// scalars, `|` block scalars, comments, `---` between documents; one value per document.
// Anything outside the subset throws, so a file that drifts out of it fails loudly.
function parseYaml(text) {
    const docs = [];
    for (const doc of text.split(/^---[ \t]*$/m)) {
        const lines = doc.split('\n');
        const sig = (i) => {
            while (i < lines.length && /^\s*(#.*)?$/.test(lines[i])) i++;
            return i;
        };
        const indentOf = (l) => l.match(/^ */)[0].length;
        const stripComment = (s) => {
            let q = null;
            for (let k = 0; k < s.length; k++) {
                const c = s[k];
                if (q) {
                    if (c === q) q = null;
                } else if (c === '"' || c === "'") q = c;
                else if (c === '#' && (k === 0 || /\s/.test(s[k - 1]))) return s.slice(0, k).trimEnd();
            }
            return s.trimEnd();
        };
        const scalar = (v) => {
            if (v.startsWith('"')) return JSON.parse(v);
            if (v.startsWith("'")) return v.slice(1, -1).replace(/''/g, "'");
            if (v.startsWith('[')) {
                if (!v.endsWith(']')) throw new Error(`yaml: unterminated flow sequence: ${v}`);
                try {
                    return JSON.parse(v);
                } catch {
                    const inner = v.slice(1, -1).trim();
                    return inner ? inner.split(/\s*,\s*/).map(scalar) : [];
                }
            }
            if (v.startsWith('{')) throw new Error(`yaml: flow maps are outside the subset: ${v}`);
            if (v === 'true' || v === 'false') return v === 'true';
            if (/^-?\d+$/.test(v)) return Number(v);
            return v;
        };
        const KEY = /^([A-Za-z0-9_.\/-]+|"[^"]*"):(?:\s+(.*))?$/;
        // Each parser takes the index of its first line and returns [value, next index].
        const node = (i, indent) => {
            const t = lines[i].slice(indent);
            return t === '-' || t.startsWith('- ') ? seq(i, indent) : map(i, indent);
        };
        const value = (rest, i, indent) => {
            if (rest === undefined || rest === '') {
                const j = sig(i + 1);
                if (j >= lines.length || indentOf(lines[j]) <= indent) return [null, j];
                return node(j, indentOf(lines[j]));
            }
            if (rest === '|' || rest === '|-') {
                let j = i + 1;
                const body = [];
                while (j < lines.length && (lines[j].trim() === '' || indentOf(lines[j]) > indent)) body.push(lines[j++]);
                while (body.length && body[body.length - 1].trim() === '') body.pop();
                const cut = Math.min(...body.filter((l) => l.trim()).map(indentOf));
                const s = body.map((l) => l.slice(cut)).join('\n');
                return [rest === '|' ? s + '\n' : s, j];
            }
            return [scalar(rest), i + 1];
        };
        const map = (i, indent, first) => {
            const out = {};
            let text = first;
            while (i < lines.length) {
                if (text === undefined) {
                    i = sig(i);
                    if (i >= lines.length || indentOf(lines[i]) !== indent) break;
                    text = lines[i].slice(indent);
                    if (text.startsWith('- ')) break;
                }
                const m = KEY.exec(stripComment(text));
                if (!m) throw new Error(`yaml: line ${i + 1}: expected "key: value": ${lines[i]}`);
                const key = m[1].startsWith('"') ? JSON.parse(m[1]) : m[1];
                if (key in out) throw new Error(`yaml: line ${i + 1}: duplicate key ${key}`);
                [out[key], i] = value(m[2], i, indent);
                text = undefined;
            }
            return [out, i];
        };
        const seq = (i, indent) => {
            const out = [];
            while (i < lines.length) {
                i = sig(i);
                if (i >= lines.length || indentOf(lines[i]) !== indent) break;
                const t = lines[i].slice(indent);
                if (!(t === '-' || t.startsWith('- '))) break;
                const rest = stripComment(t.slice(2).trim());
                let v;
                if (rest !== '' && !/^["'[]/.test(rest) && KEY.test(rest)) [v, i] = map(i, indent + 2, rest);
                else [v, i] = value(rest, i, indent);
                out.push(v);
            }
            return [out, i];
        };
        const start = sig(0);
        if (start >= lines.length) continue;
        const [v, end] = node(start, indentOf(lines[start]));
        if (sig(end) < lines.length) throw new Error(`yaml: unparsed line ${sig(end) + 1}: ${lines[sig(end)]}`);
        docs.push(v);
    }
    return docs;
}

// The Dockerfile as [{op, args}] with continuation lines joined and comments dropped.
function dockerfileInstructions() {
    const text = fs.readFileSync(path.join(ROOT, 'docker/Dockerfile'), 'utf8');
    const joined = text
        .split('\n')
        .filter((l) => !/^\s*#/.test(l))
        .join('\n')
        .replace(/\\\n/g, ' ');
    return joined
        .split('\n')
        .map((l) => l.trim())
        .filter(Boolean)
        .map((l) => {
            const m = /^(\w+)\s+(.*)$/.exec(l);
            return { op: m[1].toUpperCase(), args: m[2] };
        });
}

// Validates a configuration (a JSON file's text, plus environment variables) with the
// binary under test; returns runLoopguard's result.
function checkConfig(json, env = {}) {
    return runLoopguard(['--check-config', tmpFile('check.json', json)], { env });
}

describe('make install', () => {
    const dest = path.join(scratch, 'dest');
    let res;
    before(async () => {
        res = await run(
            'make',
            ['-s', '--no-print-directory', `BUILD=${BUILD}`, `SAN=${isSanitizerBuild ? 1 : 0}`, `DESTDIR=${dest}`, 'PREFIX=/usr', 'install'],
            { timeout: 240000 }
        );
    });

    it('installs the binary of this build, the example config, the unit and the man page under DESTDIR/PREFIX', T, async () => {
        assert.equal(res.code, 0, `make install failed:\n${res.stdout}\n${res.stderr}`);
        const bin = path.join(dest, 'usr/bin/loopguard');
        assert.ok(fs.statSync(bin).mode & 0o111, 'usr/bin/loopguard is executable');
        assert.ok(fs.readFileSync(bin).equals(fs.readFileSync(LOOPGUARD_BIN)), 'the installed binary is the build under test');
        const example = path.join(dest, 'usr/share/doc/loopguard/loopguard.example.json');
        assert.deepEqual(JSON.parse(fs.readFileSync(example, 'utf8')), JSON.parse(fs.readFileSync(path.join(ROOT, 'config/loopguard.example.json'), 'utf8')));
        assert.ok(fs.existsSync(path.join(dest, 'usr/share/doc/loopguard/examples/loopguard.service')));
        assert.ok(fs.existsSync(path.join(dest, 'usr/share/man/man1/loopguard.1')));
        // Nothing escaped DESTDIR: everything installed lives under dest/usr.
        assert.deepEqual(fs.readdirSync(dest), ['usr']);
        const r = await run(bin, ['--check-config', example]);
        assert.equal(r.code, 0, r.stderr);
        assert.match(r.stdout, /config OK/);
    });

    it('the man page renders without warnings and documents every flag the binary accepts', T, async () => {
        const page = path.join(dest, 'usr/share/man/man1/loopguard.1');
        const src = fs.readFileSync(page, 'utf8');
        const hasMan = (await run('sh', ['-c', 'command -v man'])).code === 0;
        let text;
        if (hasMan) {
            const r = await run('man', ['--warnings', '-E', 'UTF-8', '-l', page], { env: { MANWIDTH: '80', MANPAGER: 'cat', PAGER: 'cat' } });
            assert.equal(r.code, 0, r.stderr);
            assert.equal(r.stderr, '', 'man --warnings printed warnings');
            text = r.stdout;
        } else {
            // No man here: check the roff structure instead.
            assert.match(src, /^\.TH LOOPGUARD 1 /m);
            for (const l of src.split('\n')) assert.ok(!l.startsWith("'"), `a line starts with a control quote: ${l}`);
            text = src.replace(/\\-/g, '-').replace(/^\.(SH|B|BR|BI|RB|IR|TP|PP|RS|RE|nf|fi|br|nh|ad l|TH|SS)\b ?/gm, '');
        }
        for (const s of ['NAME', 'SYNOPSIS', 'DESCRIPTION', 'OPTIONS', 'CONFIGURATION', 'ENVIRONMENT', 'ENDPOINTS', 'SIGNALS', 'FILES', 'EXAMPLES'])
            assert.match(text, new RegExp(`^${s}$`, 'm'), `section ${s}`);
        assert.match(text, /loopguard scan --config/, 'an example of loopguard scan');
        assert.match(text, /loopguard\.example\.json/, 'CONFIGURATION points to the example file');
        for (const ep of ['/loopguard/health', '/loopguard/metrics', '/loopguard/incidents']) assert.ok(text.includes(ep), ep);
        // Every flag in the binary's own usage texts is in the page.
        const usage = (await run(LOOPGUARD_BIN, ['--help'])).stdout;
        const scanUsage = (await run(LOOPGUARD_BIN, ['scan'])).stderr;
        const flags = new Set([...(usage + scanUsage).matchAll(/--[a-z][a-z-]*/g)].map((m) => m[0]));
        assert.ok(flags.has('--upstream-kind') && flags.has('--channel'), `usage texts parsed: ${[...flags]}`);
        for (const f of flags) assert.ok(text.includes(f), `the man page does not mention ${f}`);
    });

    it('the systemd unit runs the installed binary, reloads with SIGHUP and outlasts the drain', T, async () => {
        const unitFile = path.join(dest, 'usr/share/doc/loopguard/examples/loopguard.service');
        const unit = fs.readFileSync(unitFile, 'utf8');
        const service = {};
        let section = null;
        for (const l of unit.split('\n')) {
            const s = /^\[(\w+)\]$/.exec(l);
            if (s) section = s[1];
            const kv = /^(\w+)=(.*)$/.exec(l);
            if (kv && section === 'Service') service[kv[1]] = kv[2];
        }
        assert.equal(service.Type, 'simple');
        assert.equal(service.ExecStart, '/usr/bin/loopguard --config /etc/loopguard/loopguard.json');
        assert.match(service.ExecReload, /^\/bin\/kill -HUP \$MAINPID$/);
        assert.equal(service.KillSignal, 'SIGTERM');
        const example = JSON.parse(fs.readFileSync(path.join(ROOT, 'config/loopguard.example.json'), 'utf8'));
        const stopSec = Number(/^(\d+)s?$/.exec(service.TimeoutStopSec)[1]);
        assert.ok(stopSec * 1000 > example.shutdown_grace_ms, `TimeoutStopSec ${stopSec}s must exceed shutdown_grace_ms ${example.shutdown_grace_ms}`);
        assert.equal(service.NoNewPrivileges, 'yes');
        assert.equal(service.ProtectSystem, 'strict');
        if ((await run('sh', ['-c', 'command -v systemd-analyze'])).code === 0) {
            // systemd's own parser, with the binary paths pointed at the installed one.
            const bin = path.join(dest, 'usr/bin/loopguard');
            const dir = fs.mkdtempSync(path.join(scratch, 'unit-'));
            fs.writeFileSync(path.join(dir, 'loopguard.service'), unit.replaceAll('/usr/bin/loopguard', bin));
            const r = await run('systemd-analyze', ['verify', '--man=no', path.join(dir, 'loopguard.service')]);
            assert.equal(r.code, 0, `systemd-analyze verify:\n${r.stdout}${r.stderr}`);
        }
    });
});

describe('docker/build.sh on the bare machine', () => {
    // build.sh always builds the plain binary, so the sanitizer pass has nothing to add.
    const skip = isSanitizerBuild ? 'the plain pass covers build.sh' : false;
    const ctx = path.join(scratch, 'context');
    const root = path.join(scratch, 'image-root');
    let res;
    before(async () => {
        if (skip) return;
        // The Docker build context as the build stage sees it: only what the Dockerfile COPYs.
        const stage = dockerfileInstructions().filter((i) => i.op === 'COPY' && !i.args.startsWith('--from'));
        for (const { args } of stage.slice(0, stage.findIndex((i) => /docker\/?$/.test(i.args.split(/\s+/)[0])) + 1)) {
            const [srcPat, dst] = args.split(/\s+/);
            const dir = path.join(ctx, dst.replace(/^\.\/?/, ''));
            const srcs = srcPat.includes('*')
                ? fs.readdirSync(path.join(ROOT, path.dirname(srcPat))).filter((f) => new RegExp('^' + path.basename(srcPat).replace('.', '\\.').replace('*', '.*') + '$').test(f)).map((f) => path.join(path.dirname(srcPat), f))
                : [srcPat];
            for (const s of srcs) {
                const from = path.join(ROOT, s);
                const to = fs.statSync(from).isDirectory() ? dir : path.join(dir, path.basename(s));
                fs.cpSync(from, to, { recursive: true, filter: (p) => !p.includes('node_modules') });
            }
        }
        res = await run(
            path.join(ctx, 'docker/build.sh'),
            ['--prefix', '/usr', '--destdir', root, '--build-dir', path.join(scratch, 'image-build'), '--strip', '--deps-out', path.join(scratch, 'runtime-packages'), '--jobs', '2'],
            { cwd: ctx, timeout: 280000 }
        );
    });

    it('builds from exactly the files the Dockerfile copies and installs into the prefix', { ...T, skip, timeout: 300000 }, async () => {
        assert.equal(res.code, 0, `build.sh failed:\n${res.stdout.slice(-3000)}\n${res.stderr.slice(-3000)}`);
        const bin = path.join(root, 'usr/bin/loopguard');
        assert.equal(res.stdout.trim().split('\n').pop(), bin, 'build.sh prints the installed binary last');
        for (const f of ['usr/share/doc/loopguard/loopguard.example.json', 'usr/share/man/man1/loopguard.1', 'usr/share/doc/loopguard/examples/loopguard.service'])
            assert.ok(fs.existsSync(path.join(root, f)), f);
        const sections = await run('readelf', ['-S', bin]);
        if (sections.code === 0) assert.doesNotMatch(sections.stdout, /\.symtab/, '--strip stripped the binary');
    });

    it('the installed binary validates its config and guards (scan)', { ...T, skip }, async () => {
        const bin = path.join(root, 'usr/bin/loopguard');
        const ok = await run(bin, ['--check-config', path.join(root, 'usr/share/doc/loopguard/loopguard.example.json')]);
        assert.equal(ok.code, 0, ok.stderr);
        assert.match(ok.stdout, /config OK/);
        const scan = await run(bin, ['scan', '--channel', 'reasoning', '-'], { input: LAMBDA_TEXT });
        assert.equal(scan.code, 0, scan.stderr);
        const v = JSON.parse(scan.stdout);
        assert.equal(v.tripped, true);
        assert.equal(v.unit.trim(), 'lambda');
    });

    it('lists the runtime Debian packages the image must install', { ...T, skip }, async () => {
        const pkgs = fs.readFileSync(path.join(scratch, 'runtime-packages'), 'utf8').trim().split('\n');
        for (const p of ['libmicrohttpd12', 'libcurl4', 'libcjson1', 'libpcre2-8-0']) assert.ok(pkgs.includes(p), `${p} in ${pkgs}`);
        for (const p of pkgs) {
            const r = await run('dpkg-query', ['-W', '-f=${Status}', p]);
            assert.equal(r.stdout, 'install ok installed', `${p} is a real installed package`);
        }
    });
});

describe('container files', () => {
    it('Dockerfile: two bookworm-slim stages, build.sh, non-root, health check, entry point', T, () => {
        const ins = dockerfileInstructions();
        const froms = ins.filter((i) => i.op === 'FROM');
        assert.equal(froms.length, 2, 'multi-stage');
        for (const f of froms) assert.match(f.args, /^debian:bookworm-slim\b/);
        assert.ok(ins.some((i) => i.op === 'RUN' && /docker\/build\.sh .*--prefix \/usr/.test(i.args)), 'RUN docker/build.sh');
        const user = ins.filter((i) => i.op === 'USER').pop();
        assert.ok(user && !/^(root|0)(:|$)/.test(user.args), 'runs as a non-root user');
        assert.match(user.args, /^[1-9]\d*:[1-9]\d*$/, 'USER is numeric (runAsNonRoot can check it)');
        // The build stage copies only what the binary is built from, and .dockerignore lets
        // exactly that into the build context.
        const copied = ins.filter((i) => i.op === 'COPY' && !i.args.startsWith('--from')).map((i) => i.args.split(/\s+/)[0].split('/')[0]);
        assert.ok(!copied.includes('tests'), 'no test or bench source in the image build');
        const ignore = fs.readFileSync(path.join(ROOT, '.dockerignore'), 'utf8').split('\n').filter((l) => l && !l.startsWith('#'));
        assert.equal(ignore[0], '*', '.dockerignore starts by excluding everything');
        assert.deepEqual(ignore.slice(1).map((l) => l.replace(/^!/, '')).sort(), [...new Set(copied)].sort());
        assert.ok(ins.some((i) => i.op === 'RUN' && /useradd .*loopguard/.test(i.args)), 'the user is created');
        assert.ok(ins.some((i) => i.op === 'ENV' && /LOOPGUARD_LISTEN=0\.0\.0\.0:8000/.test(i.args)));
        assert.ok(ins.some((i) => i.op === 'EXPOSE' && i.args === '8000'));
        const health = ins.find((i) => i.op === 'HEALTHCHECK');
        assert.ok(health && /CMD .*health/.test(health.args), 'HEALTHCHECK');
        const entry = JSON.parse(ins.find((i) => i.op === 'ENTRYPOINT').args)[0];
        const copyEntry = ins.find((i) => i.op === 'COPY' && i.args.startsWith('docker/entrypoint.sh '));
        assert.equal(copyEntry.args.split(/\s+/)[1], entry, 'ENTRYPOINT is where entrypoint.sh is copied');
        assert.ok(health.args.includes(entry), 'HEALTHCHECK uses the entry point');
        for (const c of ins.filter((i) => i.op === 'COPY' && !i.args.startsWith('--from'))) {
            const src = c.args.split(/\s+/)[0];
            const dir = path.join(ROOT, src.includes('*') ? path.dirname(src) : src);
            assert.ok(fs.existsSync(dir), `COPY source ${src} exists`);
        }
        assert.ok(fs.statSync(path.join(ROOT, 'docker/entrypoint.sh')).mode & 0o100, 'entrypoint.sh is executable');
        assert.ok(fs.statSync(path.join(ROOT, 'docker/build.sh')).mode & 0o100, 'build.sh is executable');
    });

    describe('docker/entrypoint.sh', () => {
        let fake;
        before(async () => {
            fake = await startFake({ kind: 'sglang', scenario: path.join(SCENARIOS, 'seed_lambda.json'), pace: 0 });
        });
        after(() => fake && fake.stop());
        const ep = path.join(ROOT, 'docker/entrypoint.sh');

        it('refuses to start with neither a config file nor LOOPGUARD_UPSTREAM, and says what to set', T, async () => {
            const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('LOOPGUARD_')));
            const r = await new Promise((resolve) => {
                const p = spawn(ep, [], { env: { ...env, LG_BIN: LOOPGUARD_BIN, LG_CONFIG: path.join(scratch, 'absent.json') } });
                let err = '';
                p.stderr.on('data', (d) => (err += d));
                p.on('close', (code) => resolve({ code, err }));
            });
            assert.equal(r.code, 2);
            assert.match(r.err, /LOOPGUARD_UPSTREAM/);
            assert.match(r.err, /absent\.json/);
        });

        it('runs from a mounted config file with LOOPGUARD_* on top, and `health` probes it', T, async () => {
            const conf = tmpFile('mounted.json', JSON.stringify({ listen: '127.0.0.1:0', upstream: 'http://127.0.0.1:9', upstream_kind: 'sglang', shutdown_grace_ms: 300 }));
            // The environment overrides the file's (unreachable) upstream, as documented.
            const srv = await startServer(ep, [], { LG_BIN: LOOPGUARD_BIN, LG_CONFIG: conf, LOOPGUARD_UPSTREAM: fake.url, LOOPGUARD_HEALTH__INTERVAL_MS: '3600000' });
            try {
                const r = await chat(srv.url + '/v1/chat/completions', SEED_BODY);
                assert.equal(r.status, 200, r.text);
                assert.match(r.json().choices[0].message.content, /def is_prime/);
                // The probe maps a wildcard listen address to loopback.
                const h = await run(ep, ['health'], { env: { LOOPGUARD_LISTEN: `0.0.0.0:${srv.port}`, LOOPGUARD_ADMIN__LISTEN: '' } });
                assert.equal(h.code, 0, h.stderr);
            } finally {
                assert.equal(await srv.stop(), 0);
            }
            const down = await run(ep, ['health'], { env: { LOOPGUARD_LISTEN: `127.0.0.1:${srv.port}`, LOOPGUARD_ADMIN__LISTEN: '' } });
            assert.notEqual(down.code, 0, 'health fails once loopguard is gone');
        });
    });

    it('compose.yaml: SGLang on GPUs with the report flags, loopguard in front on 8000', T, async () => {
        const [compose] = parseYaml(fs.readFileSync(path.join(ROOT, 'docker/compose.yaml'), 'utf8'));
        const { sglang, loopguard, ...others } = compose.services;
        assert.ok(sglang && loopguard, `services: ${Object.keys(compose.services)}`);
        assert.match(sglang.image, /^lmsysorg\/sglang(:|$)/);
        const cmd = Array.isArray(sglang.command) ? sglang.command.map(String) : String(sglang.command).split(/\s+/);
        const flag = (f) => cmd[cmd.indexOf(f) + 1];
        assert.deepEqual(cmd.slice(0, 3), ['python3', '-m', 'sglang.launch_server']);
        assert.equal(flag('--reasoning-parser'), 'qwen3');
        assert.equal(flag('--host'), '0.0.0.0');
        const sglangPort = flag('--port');
        assert.equal(sglangPort, '30000');
        const modelPath = flag('--model-path');
        assert.match(modelPath, /Qwen3\.6-27B$/);
        // "HOST:CONTAINER[:ro]", where HOST may be "${VAR:-default}" (a colon of its own).
        const targets = sglang.volumes.map((v) => v.replace(/\$\{[^}]*\}/g, 'HOST').split(':')[1]);
        assert.ok(targets.some((t) => modelPath.startsWith(t + '/')), `the model path is on a mounted volume: ${targets}`);
        const gpu = sglang.deploy.resources.reservations.devices[0];
        assert.equal(gpu.driver, 'nvidia');
        assert.deepEqual(gpu.capabilities, ['gpu']);
        assert.equal(sglang.ports, undefined, 'SGLang is not published: clients cannot bypass loopguard');
        // loopguard: built from this repository, pointed at the sglang service.
        assert.ok(fs.existsSync(path.join(ROOT, 'docker', loopguard.build.context, loopguard.build.dockerfile)), 'build.dockerfile exists');
        assert.equal(loopguard.environment.LOOPGUARD_UPSTREAM, `http://sglang:${sglangPort}`);
        assert.deepEqual(loopguard.ports, ['8000:8000']);
        assert.equal(loopguard.depends_on.sglang.condition, 'service_healthy');
        assert.ok(loopguard.healthcheck.test.join(' ').includes('loopguard-entrypoint health'));
        // Its environment is a valid configuration for the binary under test.
        const env = Object.fromEntries(Object.entries(loopguard.environment).map(([k, v]) => [k, String(v)]));
        const chk = await checkConfig('{}', env);
        assert.equal(chk.code, 0, chk.stderr);
        // Every other service is a client pointed at loopguard, never at SGLang.
        for (const [name, svc] of Object.entries(others)) {
            const c = JSON.stringify(svc.command || '');
            assert.match(c, /http:\/\/loopguard:8000\//, `${name} talks to loopguard`);
            assert.doesNotMatch(c, /sglang:30000/, `${name} bypasses loopguard`);
        }
    });

    it('k8s.yaml: a replicated Deployment and a Service, probes on /loopguard/health, a valid config', T, async () => {
        const docs = parseYaml(fs.readFileSync(path.join(ROOT, 'docker/k8s.yaml'), 'utf8'));
        const byKind = Object.fromEntries(docs.map((d) => [d.kind, d]));
        const dep = byKind.Deployment;
        const svc = byKind.Service;
        assert.ok(dep && svc, `kinds: ${docs.map((d) => d.kind)}`);
        assert.ok(dep.spec.replicas >= 2, 'N replicas');
        const pod = dep.spec.template;
        for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(pod.metadata.labels[k], v, 'the Service selects the pods');
        const c = pod.spec.containers.find((x) => x.name === 'loopguard');
        const port = c.ports.find((p) => p.name === svc.spec.ports[0].targetPort);
        assert.ok(port, 'the Service targets the container port by name');
        for (const probe of [c.readinessProbe, c.livenessProbe]) {
            assert.equal(probe.httpGet.path, '/loopguard/health');
            assert.equal(probe.httpGet.port, port.name);
        }
        // The mounted config: valid for the binary, listening on the container port.
        const cm = byKind.ConfigMap;
        const vol = pod.spec.volumes.find((v) => v.configMap && v.configMap.name === cm.metadata.name);
        assert.equal(c.volumeMounts.find((m) => m.name === vol.name).mountPath, '/etc/loopguard');
        const json = cm.data['loopguard.json'];
        const chk = await checkConfig(json, { LOOPGUARD_WORKERS: '2' });
        assert.equal(chk.code, 0, chk.stderr);
        const cfg = JSON.parse(json);
        assert.equal(cfg.listen, `0.0.0.0:${port.containerPort}`);
        // Termination: the preStop pause plus the drain fit in the grace period.
        const pre = Number(c.lifecycle.preStop.exec.command[1]);
        assert.ok(pod.spec.terminationGracePeriodSeconds > pre + cfg.shutdown_grace_ms / 1000);
        // Incidents go to loopguard's own stdout: no sidecar whose PID 1 ignores SIGTERM and
        // holds the pod for the whole grace period.
        assert.equal(cfg.incidents.path, '/dev/stdout');
        for (const x of pod.spec.containers) assert.ok(!JSON.stringify(x.command || []).includes('tail'), `container ${x.name} runs tail`);
        assert.deepEqual(pod.spec.containers.map((x) => x.name), ['loopguard']);
        // The note on what is per instance.
        const text = fs.readFileSync(path.join(ROOT, 'docker/k8s.yaml'), 'utf8');
        assert.match(text, /per instance/i);
        assert.match(text, /ejection/i);
        assert.match(text, /incident/i);
    });
});

describe('make demo', () => {
    it('tests/demo.sh shows the loop without loopguard and the recovery with it, in 100 columns, within 30 s', { timeout: 60000 }, async () => {
        const t0 = Date.now();
        const r = await run(path.join(ROOT, 'tests/demo.sh'), [], { env: { BUILD }, timeout: 60000 });
        const secs = (Date.now() - t0) / 1000;
        assert.equal(r.code, 0, `demo failed:\n${r.stdout}\n${r.stderr}`);
        assert.ok(secs < 30, `the demo took ${secs} s`);
        const out = r.stdout;
        assert.match(out, /WITHOUT loopguard.*\| WITH loopguard/);
        assert.match(out, /You can use the lambda lambda lambda/);
        assert.match(out, /def is_prime\(n\):/);
        assert.match(out, /tokens saved: \d+ of \d+/);
        assert.match(out, /"outcome": "recovered"/);
        assert.match(out, /loopguard_trips_total\{[^}]*\} [1-9]/);
        assert.match(out, /^demo OK/m);
        assert.match(out, /^Status page of this run .*: http:\/\/127\.0\.0\.1:\d+\/loopguard\/$/m);
        // Readable in a 100-column terminal (the pretty-printed incident aside).
        const prose = out.split('\n').filter((l) => !/^\s*("|[{}\]])/.test(l));
        for (const l of prose) assert.ok([...l].length <= 100, `line over 100 columns: ${l}`);
    });
});

describe('configuration through LOOPGUARD_* environment variables', () => {
    let fake;
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: path.join(SCENARIOS, 'seed_lambda.json'), pace: 0 });
    });
    after(() => fake && fake.stop());

    it('with no config file at all: listens, proxies, guards and logs incidents where the env says', T, async () => {
        const log = path.join(scratch, 'env-incidents.jsonl');
        const srv = await startServer(LOOPGUARD_BIN, [], {
            LOOPGUARD_LISTEN: '127.0.0.1:0',
            LOOPGUARD_UPSTREAM: fake.url,
            LOOPGUARD_UPSTREAM_KIND: 'sglang',
            LOOPGUARD_HEALTH__INTERVAL_MS: '3600000',
            LOOPGUARD_SHUTDOWN_GRACE_MS: '300',
            LOOPGUARD_INCIDENTS__PATH: log,
        });
        try {
            const direct = await request(fake.url + '/v1/models');
            const via = await request(srv.url + '/v1/models');
            assert.equal(via.status, 200);
            // `created` is the fake's clock at each request: it may tick between the two.
            const noClock = (r) => r.text.replace(/"created":\d+/g, '"created":0');
            assert.equal(noClock(via), noClock(direct), 'pass-through reaches the env-configured upstream');
            await fake.reset();
            const r = await chat(srv.url + '/v1/chat/completions', SEED_BODY);
            assert.equal(r.status, 200, r.text);
            const msg = r.json().choices[0].message;
            assert.match(msg.content, /def is_prime/);
            assert.doesNotMatch(msg.reasoning_content || '', /lambda lambda lambda/, 'the loop did not reach the client');
            assert.equal(r.headers['x-loopguard-attempts'], '2');
            const gens = await fake.generations();
            assert.equal(gens.length, 2, 'the loop was cut and retried upstream');
            const line = await waitFor(() => fs.existsSync(log) && fs.readFileSync(log, 'utf8').trim());
            assert.equal(JSON.parse(line.split('\n')[0]).outcome, 'recovered');
            assert.equal((await incidents(srv.url)).length, 1);
        } finally {
            assert.equal(await srv.stop(), 0);
        }
    });

    it('a nested key from the environment overrides the file (retry.max_attempts 3 -> 1)', T, async () => {
        const lg = await startLoopguard({
            upstream: fake.url,
            kind: 'sglang',
            config: { retry: { max_attempts: 3, on_exhausted: 'content_filter' } },
            env: { LOOPGUARD_RETRY__MAX_ATTEMPTS: '1' },
        });
        try {
            await fake.reset();
            const r = await chat(lg.url + '/v1/chat/completions', SEED_BODY);
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json().choices[0].finish_reason, 'content_filter', 'one attempt, no retry');
            assert.equal(r.headers['x-loopguard-attempts'], '1');
            assert.equal((await fake.requests('/v1/chat/completions')).length, 1);
        } finally {
            await lg.stop();
        }
    });

    for (const [env, key, path_] of [
        [{ LOOPGUARD_RETRY__MAX_ATTEMPTS: 'zero' }, 'LOOPGUARD_RETRY__MAX_ATTEMPTS', 'retry.max_attempts'],
        [{ LOOPGUARD_RETRY__MAX_ATTEMPTS: '0' }, 'LOOPGUARD_RETRY__MAX_ATTEMPTS', 'retry.max_attempts'],
        [{ LOOPGUARD_RETRY__MAX_ATEMPTS: '3' }, 'LOOPGUARD_RETRY__MAX_ATEMPTS', 'retry.max_atempts'],
        [{ LOOPGUARD_LISTEN: 'nonsense' }, 'LOOPGUARD_LISTEN', 'listen'],
        [{ LOOPGUARD_UPSTREAM: 'ftp://example' }, 'LOOPGUARD_UPSTREAM', 'upstream'],
        [{ LOOPGUARD_GUARD__ENABLED: 'maybe' }, 'LOOPGUARD_GUARD__ENABLED', 'guard.enabled'],
    ]) {
        it(`a bad ${Object.keys(env)[0]}=${Object.values(env)[0]} stops the start with a message naming the key`, T, async () => {
            const r = await runLoopguard(['--listen', '127.0.0.1:0', '--upstream', fake.url], { env, timeout: 5000 });
            assert.equal(r.code, 2, `exit code; stdout:\n${r.stdout}`);
            assert.doesNotMatch(r.stdout, /listening on/);
            assert.ok(r.stderr.includes(key), `stderr names ${key}: ${r.stderr}`);
            assert.ok(r.stderr.includes(path_ + ':'), `stderr names ${path_}: ${r.stderr}`);
        });
    }
});
