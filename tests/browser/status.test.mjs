// The status page at /loopguard/ in a real headless browser (Debian's chromium, driven by
// puppeteer-core): on the admin listener, with an admin token, after the fake upstream
// produced a looping generation, the page loads without a console error, shows the
// incident with its excerpt and the loop marked from where it starts, the trips of that
// model and route, and the upstream's health; the JSON it reads is refused without the
// token. The screenshot lands in build/status-page.png (README's picture comes from it).

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import { startFake, startLoopguard, chat, request, waitFor, deadPort, SCENARIOS, isSlowBuild } from '../e2e/lib.mjs';

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const T = { timeout: isSlowBuild ? 120000 : 60000 };
const TOKEN = 's3cret-admin';
const SHOT = path.resolve(process.env.BUILD || 'build', 'status-page.png');

describe('status page', () => {
    let fake, lg, adminPort, browser;
    before(async () => {
        fake = await startFake({ scenario: path.join(SCENARIOS, 'always_loop.json') });
        adminPort = await deadPort();
        lg = await startLoopguard({
            upstream: fake.url,
            kind: 'sglang',
            config: { admin: { listen: `127.0.0.1:${adminPort}`, token: TOKEN } },
        });
        const body = { model: 'Qwen3.6-27B', messages: [{ role: 'user', content: 'Is 7 prime?' }], max_tokens: 2000, stream: true };
        const r = await chat(lg.url + '/v1/chat/completions', body);
        assert.equal(r.status, 200);
        const auth = { headers: { Authorization: `Bearer ${TOKEN}` } };
        await waitFor(async () => (await request(`http://127.0.0.1:${adminPort}/loopguard/incidents`, auth)).json().length > 0, 5000);
        browser = await puppeteer.launch({
            executablePath: CHROMIUM,
            headless: true,
            args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
        });
    });
    after(async () => {
        await browser?.close();
        await lg?.stop();
        await fake?.stop();
    });

    it('the JSON behind the page needs the admin token; the page itself holds no data', T, async () => {
        const base = `http://127.0.0.1:${adminPort}/loopguard/`;
        for (const p of ['series', 'upstreams', 'incidents']) assert.equal((await request(base + p)).status, 401, p);
        const page = await request(base);
        assert.equal(page.status, 200);
        assert.match(page.headers['content-type'], /^text\/html/);
        assert.match(page.headers['content-security-policy'], /default-src 'none'/);
        assert.doesNotMatch(page.text, /lambda|Qwen/);
        assert.equal((await request(`http://127.0.0.1:${adminPort}/loopguard`)).status, 200);
    });

    it('loads in chromium, shows the incident with the loop marked, no console error', T, async () => {
        const page = await browser.newPage();
        const problems = [];
        page.on('console', (m) => m.type() === 'error' && problems.push(`console: ${m.text()}`));
        page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
        page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()}`));
        page.on('response', (r) => r.status() >= 400 && problems.push(`HTTP ${r.status()}: ${r.url()}`));
        await page.setViewport({ width: 1100, height: 640 });
        await page.goto(`http://127.0.0.1:${adminPort}/loopguard/#token=${TOKEN}`, { waitUntil: 'load' });
        await page.waitForSelector('.incident .excerpt mark.start', { timeout: 15000 });

        const incident = await page.$eval('.incident', (e) => e.textContent);
        assert.match(incident, /failed/);
        assert.match(incident, /Qwen3\.6-27B/);
        assert.match(incident, /repeat on reasoning, unit " lambda" ×\d+, loop from byte \d+/);
        const marked = await page.$$eval('.incident .excerpt mark', (ms) => ms.map((m) => m.textContent));
        assert.ok(marked.length >= 3, `copies of the unit marked: ${JSON.stringify(marked)}`);
        assert.equal(marked[0], ' lambda');
        const before = await page.$eval('.incident .excerpt', (e) => e.firstChild.textContent);
        assert.doesNotMatch(before, /lambda lambda/, 'the text before the mark holds no loop');

        const row = await page.$$eval('#models tbody tr', (rs) => rs.map((r) => [...r.cells].map((c) => c.textContent)));
        const q = row.find((r) => r[0] === 'Qwen3.6-27B' && r[1] === '/v1/chat/completions');
        assert.ok(q, JSON.stringify(row));
        assert.equal(q[2], '1'); // requests
        assert.equal(q[4], '3'); // trips: every attempt looped
        assert.equal(q[6], '1'); // failed (attempts exhausted)
        assert.ok(Number(q[7].replace(/,/g, '')) > 5000, `tokens saved: ${q[7]}`);
        const up = await page.$eval('#upstreams tbody tr', (r) => [...r.cells].map((c) => c.textContent));
        assert.equal(up[0], fake.url);
        assert.equal(up[2], 'healthy');

        await page.screenshot({ path: SHOT });
        assert.ok(fs.statSync(SHOT).size > 10000);
        assert.deepEqual(problems, []);
        await page.close();
    });

    it('without the token the page asks for it', T, async () => {
        const page = await browser.newPage();
        await page.goto(`http://127.0.0.1:${adminPort}/loopguard/`, { waitUntil: 'load' });
        await page.waitForSelector('#auth', { visible: true, timeout: 15000 });
        assert.match(await page.$eval('#error', (e) => e.textContent), /admin token required/);
        await page.type('#token', TOKEN);
        await page.click('#auth button');
        await page.waitForSelector('.incident .excerpt mark.start', { timeout: 15000 });
        await page.close();
    });
});
