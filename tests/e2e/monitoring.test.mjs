// The monitoring kit in docker/: the Grafana dashboard's queries and the Prometheus alert
// rules name only metrics a running loopguard exports (scraped from /loopguard/metrics
// after a guarded request), and the rules pass `promtool check rules` and their own unit
// tests (`promtool test rules tests/monitoring/alerts.test.yml`: each alert fires on the
// series it is meant for and not before).

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startFake, startLoopguard, chat, request, waitFor, SCENARIOS, SEED_BODY, isSlowBuild } from './lib.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const T = { timeout: isSlowBuild ? 60000 : 30000 };
const names = (text) => new Set(text.match(/\bloopguard_[a-z0-9_]+/g) || []);

describe('monitoring kit', () => {
    let fake, lg, exported;
    before(async () => {
        fake = await startFake({ scenario: path.join(SCENARIOS, 'seed_lambda.json') });
        lg = await startLoopguard({ upstream: fake.url, kind: 'sglang' });
        assert.equal((await chat(lg.url + '/v1/chat/completions', { ...SEED_BODY, stream: false })).status, 200);
        // The request is counted when loopguard has finished it (its access-log line), which
        // may be a moment after the client read its last byte: scrape until it shows.
        const trip = /^loopguard_model_trips_total\{model="\/root\/models\/Qwen3\.6-27B",route="\/v1\/chat\/completions"\} 1$/m;
        let text = '';
        await waitFor(async () => trip.test((text = (await request(lg.url + '/loopguard/metrics')).text)), 5000)
            .catch(() => {});
        // Every family, with its samples' names (a histogram's _bucket, _sum and _count).
        exported = new Set();
        for (const [, name, type] of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
            exported.add(name);
            if (type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) exported.add(name + s);
        }
        assert.ok(exported.has('loopguard_model_trips_total'), [...exported].join(' '));
        assert.match(text, trip);
    });
    after(async () => {
        await lg?.stop();
        await fake?.stop();
    });

    it('every query of the Grafana dashboard names exported metrics', T, () => {
        const dash = JSON.parse(fs.readFileSync(path.join(ROOT, 'docker/grafana-dashboard.json'), 'utf8'));
        const exprs = dash.panels.flatMap((p) => p.targets.map((t) => t.expr));
        assert.ok(exprs.length >= 10, `${exprs.length} queries`);
        for (const e of exprs) {
            const used = names(e);
            assert.ok(used.size > 0, `a query names no loopguard metric: ${e}`);
            for (const n of used) assert.ok(exported.has(n), `dashboard query names ${n}, which loopguard does not export: ${e}`);
        }
        for (const want of ['loopguard_model_trips_total', 'loopguard_upstream_ejected', 'loopguard_upstream_errors_total', 'loopguard_outcomes_total'])
            assert.ok(exprs.some((e) => e.includes(want)), `no panel on ${want}`);
    });

    it('the alert rules name exported metrics and pass promtool check and test', T, () => {
        const file = path.join(ROOT, 'docker/prometheus-alerts.yml');
        const used = names(fs.readFileSync(file, 'utf8'));
        assert.ok(used.size >= 6, [...used].join(' '));
        for (const n of used) assert.ok(exported.has(n), `an alert names ${n}, which loopguard does not export`);
        const check = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
        assert.equal(check.error, undefined, 'promtool not found: make setup installs Debian\'s prometheus package');
        assert.equal(check.status, 0, check.stdout + check.stderr);
        assert.match(check.stdout, /SUCCESS: 5 rules found/);
        const test = spawnSync('promtool', ['test', 'rules', 'alerts.test.yml'], { cwd: path.join(ROOT, 'tests/monitoring'), encoding: 'utf8' });
        assert.equal(test.status, 0, test.stdout + test.stderr);
        assert.match(test.stdout, /SUCCESS/);
    });
});
