// Many paced streams on one worker, so that its batches run long: keep-alive clients send
// their next request while the batch's token reads run (worker.c's requests_first and, past
// REQUESTS_WAIT_NS into a batch, requests_between run the daemons between the reads), and other
// clients hang up mid-stream meanwhile. Every stream that is read to its end is whole and
// in order, each hung-up one ends, and loopguard stays healthy (no sanitizer report under
// ASan+UBSan). Written in review of lg/ttft (ec5d673, ba4fbc8) and lg/pcpu (0f240dd).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startFake, startLoopguard, request, sseData, sseJSON, assembleDeltas, metrics, metricValue, waitFor, DEADLINE } from './lib.mjs';

const MSG = [{ role: 'user', content: 'Describe the water cycle for a school class' }];
const TOKENS = 150;
const KEPT = 40; // keep-alive connections, each ROUNDS streams in a row
const ROUNDS = 3;
const HANGUPS = 40; // streams whose client hangs up mid-stream
const BODY = JSON.stringify({ messages: MSG, stream: true, max_tokens: TOKENS + 10 });

// One stream through `agent`; with `hangUpAfter` the client destroys its request once it
// has read that many bytes. Resolves with the text read.
function stream(base, agent, hangUpAfter = 0) {
    const u = new URL(base + '/v1/chat/completions');
    return new Promise((resolve, reject) => {
        const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, agent }, (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (d) => {
                text += d;
                if (hangUpAfter && text.length >= hangUpAfter) {
                    req.destroy();
                    resolve(text);
                }
            });
            res.on('end', () => resolve(text));
            res.on('error', () => resolve(text));
        });
        req.on('error', (e) => (hangUpAfter ? resolve('') : reject(e)));
        req.end(BODY);
    });
}

describe('many paced streams on one worker, new requests and hang-ups mid-batch', () => {
    let fake, lg;

    before(async () => {
        fake = await startFake({ scenario: { pace_ms: 2, responses: [{ content: [{ varied: TOKENS, seed: 21 }] }] } });
        lg = await startLoopguard({ upstream: fake.url, config: { workers: 1, client_timeout_s: 60 } });
    });

    after(async () => {
        if (lg) await lg.stop();
        if (fake) await fake.stop();
    });

    it('every stream read to its end is whole; hung-up ones end; loopguard stays healthy', DEADLINE, async () => {
        const ref = await stream(lg.url, false);
        const want = assembleDeltas(sseJSON(ref)).content;
        assert.ok(want.length > TOKENS, 'a reference answer');

        const kept = new http.Agent({ keepAlive: true, maxSockets: KEPT });
        const rounds = Array.from({ length: KEPT }, async () => {
            const texts = [];
            for (let r = 0; r < ROUNDS; r++) texts.push(await stream(lg.url, kept));
            return texts;
        });
        const gone = Array.from({ length: HANGUPS }, (_, i) => stream(lg.url, false, 2000 + 300 * (i % 10)));
        const [whole] = await Promise.all([Promise.all(rounds), Promise.all(gone)]);
        kept.destroy();

        let n = 0;
        for (const texts of whole)
            for (const text of texts) {
                assert.equal(sseData(text).at(-1), '[DONE]', `stream ${n}: ends with [DONE]`);
                assert.equal(assembleDeltas(sseJSON(text)).content, want, `stream ${n}: the whole answer, in order`);
                n++;
            }
        assert.equal(n, KEPT * ROUNDS);
        await waitFor(async () => metricValue(await metrics(lg.url), 'loopguard_active_streams') === 0, 10000);
        assert.equal((await request(lg.url + '/loopguard/health')).status, 200);
    });
});
