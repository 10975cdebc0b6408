// Every answer loopguard gives is counted in loopguard_requests_total by the status it
// really had: its own endpoints' errors (401 without the admin token, 405, 404) under
// endpoint "admin", and requests refused before any handler took them (401 without an API
// key, 400 for an absolute-form target) under the endpoint their path would have reached;
// with a separate admin listener, its own answers too.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startFake, startLoopguard, request, chat, metrics, metricValue, assertOpenAIError, deadPort, DEADLINE as T } from './lib.mjs';

// One raw HTTP/1.1 exchange (for a request target node's http client would not send).
function raw(port, text) {
    return new Promise((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1', () => s.end(text));
        const parts = [];
        s.on('data', (d) => parts.push(d));
        s.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
        s.on('error', reject);
    });
}

describe('loopguard_requests_total counts every answer by its status', () => {
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'sglang' });
        lg = await startLoopguard({ upstream: fake.url, config: { api_keys: ['k1'], admin: { token: 't1' } } });
    });
    after(async () => {
        await lg?.stop();
        await fake?.stop();
    });
    const admin = { authorization: 'Bearer t1' };
    const count = (m, endpoint, code) => metricValue(m, 'loopguard_requests_total', { endpoint, code });
    // lib's metrics(), with the admin token: the samples of one scrape.
    async function scrape() {
        const r = await request(lg.url + '/loopguard/metrics', { headers: admin });
        assert.equal(r.status, 200, r.text);
        const samples = r.text.split('\n').filter((l) => l && !l.startsWith('#'));
        return new Map(samples.map((l) => [l.slice(0, l.lastIndexOf(' ')), Number(l.slice(l.lastIndexOf(' ') + 1))]));
    }

    it('admin answers count by their own status, not as 200', T, async () => {
        assertOpenAIError(await request(lg.url + '/loopguard/metrics'), 401);
        assertOpenAIError(await request(lg.url + '/loopguard/incidents'), 401);
        assertOpenAIError(await request(lg.url + '/loopguard/upstreams', { method: 'POST', headers: admin }), 405);
        assertOpenAIError(await request(lg.url + '/loopguard/no-such-thing', { headers: admin }), 404);
        assert.equal((await request(lg.url + '/loopguard/health')).status, 200);
        const m = await scrape();
        assert.equal(count(m, 'admin', '401'), 2);
        assert.equal(count(m, 'admin', '405'), 1);
        assert.equal(count(m, 'admin', '404'), 1);
        assert.equal(count(m, 'admin', '200'), 1, 'the health check; this scrape counts after it is rendered');
    });

    it('requests refused before routing count under their endpoint', T, async () => {
        assertOpenAIError(await chat(lg.url + '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }), 401);
        assertOpenAIError(await request(lg.url + '/v1/models'), 401);
        const head = await raw(lg.port, 'GET http://example.com/v1/models HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n');
        assert.match(head, /^HTTP\/1\.1 400 /);
        const ok = await chat(lg.url + '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }, { authorization: 'Bearer k1' });
        assert.equal(ok.status, 200, ok.text);
        const m = await scrape();
        assert.equal(count(m, 'chat', '401'), 1);
        assert.equal(count(m, 'passthrough', '401'), 1);
        assert.equal(count(m, 'passthrough', '400'), 1);
        assert.equal(count(m, 'chat', '200'), 1);
        assert.equal((await fake.requests()).filter((q) => q.path === '/v1/models').length, 0, 'refused requests never reach the upstream');
    });
});

describe('with a separate admin listener', () => {
    it("the admin listener's answers are in its metrics, and admin paths on the main one count as refused", T, async () => {
        const fake = await startFake({ kind: 'sglang' });
        const port = await deadPort();
        const lg = await startLoopguard({ upstream: fake.url, config: { admin: { listen: `127.0.0.1:${port}` } } });
        try {
            const adminUrl = `http://127.0.0.1:${port}`;
            assertOpenAIError(await request(adminUrl + '/loopguard/no-such-thing'), 404);
            assertOpenAIError(await request(lg.url + '/loopguard/metrics'), 404);
            const m = await metrics(adminUrl);
            assert.equal(metricValue(m, 'loopguard_requests_total', { endpoint: 'admin', code: '404' }), 2);
        } finally {
            await lg.stop();
            await fake.stop();
        }
    });
});
