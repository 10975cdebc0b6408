// End-to-end tests of the guarded SGLang /generate route, through the real loopguard binary
// and the fake upstream's /generate, once streaming the text so far (SGLang's default) and
// once streaming new text only (--incremental-streaming-output). Each case checks what the
// client received (events in the upstream's own mode, no loop text, the last one with
// meta_info.finish_reason), what reached the upstream (the retry's sampling_params, the
// abort by rid) and the incident (route, rid).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startFake, startLoopguard, request, streamUntil, sse, incidents, metrics, metricValue, waitFor, SCENARIOS, DEADLINE } from './lib.mjs';

const MODEL = '/root/models/Qwen3.6-27B';
const PROMPT = 'Write a Python function that checks if a number is prime. Be concise.';
// The scenarios match on temperature 0.6 at the top level (chat); /generate carries it in
// sampling_params, so the loop responses are re-keyed here.
const body = (extra = {}) => ({ text: PROMPT, sampling_params: { temperature: 0.6, max_new_tokens: 2000 }, ...extra });
const scenario = (name, pace = 10) => {
    const s = JSON.parse(fs.readFileSync(path.join(SCENARIOS, name), 'utf8'));
    for (const r of s.responses) if (r.match?.fields) r.match = { ...r.match, fields: { 'sampling_params.temperature': 0.6 } };
    return { ...s, pace_ms: pace };
};
const CLEAN = { model: MODEL, responses: [{ content: ['The answer is forty two, ', 'as everyone knows.\n', 'Ask again tomorrow.'] }] };
const post = (url, b) => request(url + '/generate', { method: 'POST', body: b });

// The client's view of a stream in the given mode: the text, the events, the last meta_info.
function readStream(text, incremental) {
    const data = sse(text).map((e) => e.data);
    assert.equal(data.at(-1), '[DONE]', 'the stream ends with [DONE]');
    const events = data.slice(0, -1).map((d) => JSON.parse(d));
    let all = '';
    for (const e of events) {
        assert.equal(typeof e.text, 'string');
        if (incremental) {
            all += e.text;
        } else {
            assert.ok(e.text.startsWith(all), 'each event carries the text so far');
            all = e.text;
        }
    }
    const ids = new Set(events.map((e) => e.meta_info.id));
    assert.equal(ids.size, 1, 'one meta_info.id throughout');
    events.slice(0, -1).forEach((e) => assert.equal(e.meta_info.finish_reason, null));
    return { text: all, last: events.at(-1).meta_info, events };
}

for (const incremental of [false, true]) {
    describe(`/generate, ${incremental ? 'incremental' : 'cumulative'} streaming`, DEADLINE, () => {
        let fake, lg;
        before(async () => {
            fake = await startFake({ kind: 'sglang', scenario: CLEAN, args: incremental ? ['--incremental-streaming-output'] : [] });
            lg = await startLoopguard({ upstream: fake.url, kind: 'sglang' });
        });
        after(async () => {
            await lg?.stop();
            await fake?.stop();
        });

        test('a clean stream reaches the client byte for byte', async () => {
            await fake.setScenario(CLEAN);
            const via = await post(lg.url, body({ stream: true }));
            assert.equal(via.status, 200);
            const sent = (await fake.requests('/generate')).at(-1).body;
            assert.equal(sent.stream, true);
            assert.match(sent.rid, /^[0-9a-f]{32}$/, 'loopguard gave the attempt a rid');
            const direct = await post(fake.url, sent);
            const norm = (t) => t.replace(/"e2e_latency":[0-9.e-]+/g, '"e2e_latency":0');
            assert.equal(norm(via.text), norm(direct.text));
            const m = readStream(via.text, incremental);
            assert.equal(m.text, 'The answer is forty two, as everyone knows.\nAsk again tomorrow.');
            assert.equal(m.last.finish_reason.type, 'stop');
        });

        test('a clean whole answer is the upstream answer', async () => {
            await fake.setScenario(CLEAN);
            const r = await post(lg.url, body());
            assert.equal(r.status, 200, r.text);
            const j = r.json();
            assert.equal(j.text, 'The answer is forty two, as everyone knows.\nAsk again tomorrow.');
            assert.equal(j.meta_info.finish_reason.type, 'stop');
            assert.equal(j.output_ids.length, j.meta_info.completion_tokens, 'every output id');
        });

        const loops = [
            ['seed loop (reasoning in the text)', 'seed_lambda.json', /(lambda ){6}/],
            ['content loop', 'content_loop.json', /(The function returns True if the number is prime\. ){3}/],
        ];
        for (const [name, file, loop] of loops) {
            for (const stream of [true, false]) {
                test(`${name}, ${stream ? 'streaming' : 'whole'}: cut at the server, retried, clean answer`, async () => {
                    await fake.setScenario(scenario(file));
                    await fake.reset();
                    const seen = (await incidents(lg.url)).length;
                    const r = await post(lg.url, body({ stream }));
                    assert.equal(r.status, 200, r.text);
                    let text, meta;
                    if (stream) {
                        ({ text, last: meta } = readStream(r.text, incremental));
                        assert.match(r.text, /: X-Loopguard-Trips: 1/);
                    } else {
                        ({ text, meta_info: meta } = r.json());
                        assert.equal(r.headers['x-loopguard-trips'], '1');
                    }
                    assert.match(text, /def is_prime/);
                    assert.doesNotMatch(text, loop, 'the loop never reaches the client');
                    assert.equal(meta.finish_reason.type, 'stop');
                    const reqs = await fake.requests('/generate');
                    assert.equal(reqs.length, 2);
                    assert.notEqual(reqs[1].body.sampling_params.temperature, 0.6, 'the retry changed the temperature');
                    assert.notEqual(reqs[1].body.rid, reqs[0].body.rid, 'each attempt has its own rid');
                    const abort = await fake.waitRecord((x) => x.kind === 'abort');
                    assert.equal(abort.rid, reqs[0].body.rid, 'the looping attempt was aborted by its rid');
                    const inc = await waitFor(async () => (await incidents(lg.url)).slice(seen).at(-1));
                    assert.equal(inc.endpoint, '/generate');
                    assert.equal(inc.attempts[0].rid, reqs[0].body.rid);
                    assert.equal(inc.outcome, 'recovered');
                });
            }
        }

        for (const stream of [true, false]) {
            test(`always looping, ${stream ? 'streaming' : 'whole'}: finish_reason abort, as SGLang reports one`, async () => {
                await fake.setScenario(scenario('always_loop.json'));
                const r = await post(lg.url, body({ stream }));
                assert.equal(r.status, 200);
                const meta = stream ? readStream(r.text, incremental).last : r.json().meta_info;
                assert.equal(meta.finish_reason.type, 'abort');
                assert.match(meta.finish_reason.message, /loop/);
                assert.equal(r.headers['x-loopguard-attempts'] ?? r.text.match(/X-Loopguard-Attempts: (\d+)/)[1], '3');
                const inc = (await incidents(lg.url)).at(-1);
                assert.equal(inc.outcome, 'failed');
                assert.equal(inc.attempts.length, 3);
            });
        }

        test('a client that hangs up ends the generation upstream, by rid', async () => {
            await fake.setScenario({ model: MODEL, pace_ms: 20, responses: [{ content: [{ varied: -1 }] }] });
            await fake.reset();
            const r = await streamUntil(lg.url + '/generate', body({ stream: true }), { until: (t) => (t.match(/data: /g) || []).length >= 3 });
            assert.equal(r.status, 200);
            const g = await fake.waitRecord((x) => x.kind === 'generation');
            assert.ok(g.client_gone || g.aborted, 'the generation stopped');
            const rid = (await fake.requests('/generate'))[0].body.rid;
            await fake.waitRecord((x) => x.kind === 'abort' && x.rid === rid);
        });

        for (const stream of [true, false]) {
            test(`an upstream error event becomes a well-formed error, ${stream ? 'streaming' : 'whole'}`, async () => {
                await fake.setScenario({ model: MODEL, responses: [{ content: ['some words here '], fault: { kind: 'error_event', at_token: 2, message: 'boom' } }] });
                const r = await post(lg.url, body({ stream }));
                if (stream) {
                    const data = sse(r.text).map((e) => e.data);
                    assert.equal(data.at(-1), '[DONE]');
                    assert.equal(JSON.parse(data.at(-2)).error.message, 'boom');
                } else {
                    assert.ok(r.status >= 400, r.text);
                    assert.equal(r.json().error.message, 'boom');
                }
            });
            test(`a stream cut mid-event becomes a well-formed error, ${stream ? 'streaming' : 'whole'}`, async () => {
                await fake.setScenario({ model: MODEL, responses: [{ content: ['some words here '], fault: { kind: 'truncated_chunked', at_token: 2 } }] });
                const r = await post(lg.url, body({ stream }));
                if (stream) {
                    const data = sse(r.text).map((e) => e.data);
                    assert.equal(JSON.parse(data.at(-2)).error.code, 'upstream_truncated');
                } else {
                    assert.equal(r.status, 502);
                    assert.equal(r.json().error.code, 'upstream_truncated');
                }
            });
        }

        // A batch: SGLang runs each prompt as a request of its own (its rid: the client's
        // list here) and streams their events interleaved, each with "index"; a whole batch
        // answers a list. Sample 0 loops forever, samples 1 and 2 are clean.
        const BATCH = {
            model: MODEL,
            pace_ms: 10,
            responses: [
                { match: { prompt_contains: 'lambda' }, content: ['You can use the ', { repeat: 'lambda ', times: -1 }] },
                { match: { prompt_contains: 'second' }, content: [{ varied: 40, seed: 2 }] },
                { content: [{ varied: 30, seed: 3 }] },
            ],
        };
        const batchBody = (extra = {}) => ({ text: ['Use a lambda.', 'The second prompt.', 'The third prompt.'], rid: ['s0', 's1', 's2'], sampling_params: { max_new_tokens: 2000 }, ...extra });
        // The client's view of a batch stream: per sample (by index), checked as readStream does.
        function readBatch(text) {
            const data = sse(text).map((e) => e.data);
            assert.equal(data.at(-1), '[DONE]', 'the stream ends with [DONE]');
            const bySample = [];
            for (const e of data.slice(0, -1).map((d) => JSON.parse(d))) {
                assert.equal(typeof e.index, 'number', 'every event names its sample');
                (bySample[e.index] ??= []).push(e);
            }
            return bySample.map((events) => {
                let all = '';
                for (const e of events) all = incremental ? all + e.text : (assert.ok(e.text.startsWith(all)), e.text);
                assert.equal(new Set(events.map((e) => e.meta_info.id)).size, 1, "one rid per sample");
                events.slice(0, -1).forEach((e) => assert.equal(e.meta_info.finish_reason, null));
                return { text: all, last: events.at(-1).meta_info };
            });
        }

        test('a clean batch stream reaches the client byte for byte', async () => {
            await fake.setScenario({ ...BATCH, responses: BATCH.responses.slice(1) });
            const norm = (t) => t.replace(/"e2e_latency":[0-9.e-]+/g, '"e2e_latency":0');
            const direct = await post(fake.url, batchBody({ stream: true }));
            const via = await post(lg.url, batchBody({ stream: true }));
            assert.equal(via.status, 200);
            assert.equal(norm(via.text), norm(direct.text));
            assert.equal(readBatch(via.text).length, 3);
        });

        test('n > 1: each sample has a rid SGLang makes up; the looping one is aborted by the rid its events carry', async () => {
            await fake.setScenario({
                model: MODEL,
                pace_ms: 10,
                responses: [{ match: { nth: 1 }, content: ['You can use the ', { repeat: 'lambda ', times: -1 }] }, { content: [{ varied: 30, seed: 4 }] }],
            });
            await fake.reset();
            const r = await post(lg.url, { text: PROMPT, sampling_params: { n: 3, max_new_tokens: 2000 }, stream: true });
            const samples = readBatch(r.text);
            assert.equal(samples.length, 3);
            assert.deepEqual(samples.map((x) => x.last.finish_reason.type), ['abort', 'stop', 'stop']);
            const abort = await fake.waitRecord((x) => x.kind === 'abort');
            assert.equal(abort.rid, samples[0].last.id);
            assert.equal(abort.found, true);
        });

        test("a batch SGLang refuses (a rid list of the wrong length) gets SGLang's 400", async () => {
            const r = await post(lg.url, { text: ['a', 'b'], rid: ['only-one'] });
            assert.equal(r.status, 400);
            assert.match(r.json().error.message, /rids length mismatch/);
        });

        test('a batch guards its first 256 samples; those past them are relayed as they come', async () => {
            await fake.setScenario({
                model: MODEL,
                responses: [{ match: { prompt_contains: 'lambda' }, content: [{ repeat: 'lambda ', times: 40 }] }, { content: ['Fine.'] }],
            });
            const text = Array.from({ length: 258 }, (_, i) => (i === 255 || i === 257 ? `Use a lambda, ${i}.` : `Prompt ${i}.`));
            const r = await post(lg.url, { text, sampling_params: { max_new_tokens: 100 } });
            assert.equal(r.status, 200, r.text);
            const out = r.json();
            assert.equal(out.length, 258);
            assert.equal(out[255].meta_info.finish_reason.type, 'abort', 'sample 255 is guarded');
            assert.equal(out[257].meta_info.finish_reason.type, 'stop', 'sample 257 is not');
            assert.match(out[257].text, /(lambda ){40}/);
            assert.equal(out[0].text, 'Fine.');
        });

        test('a client that hangs up on a batch ends every running sample upstream, by its rid', async () => {
            await fake.setScenario({ model: MODEL, pace_ms: 20, responses: [{ content: [{ varied: -1 }] }] });
            await fake.reset();
            const r = await streamUntil(lg.url + '/generate', batchBody({ stream: true }), { until: (t) => (t.match(/data: /g) || []).length >= 6 });
            assert.equal(r.status, 200);
            for (const rid of ['s0', 's1', 's2']) await fake.waitRecord((x) => x.kind === 'abort' && x.rid === rid);
        });

        for (const stream of [true, false]) {
            test(`a batch with one looping sample, ${stream ? 'streaming' : 'whole'}: that sample alone is cut (by its rid) and withheld, the others complete`, async () => {
                await fake.setScenario(BATCH);
                await fake.reset();
                const seen = (await incidents(lg.url)).length;
                const r = await post(lg.url, batchBody({ stream }));
                assert.equal(r.status, 200, r.text);
                let samples;
                if (stream) {
                    samples = readBatch(r.text);
                    assert.match(r.text, /: X-Loopguard-Trips: 1/);
                } else {
                    samples = r.json().map((o) => ({ text: o.text, last: o.meta_info, ids: o.output_ids }));
                    assert.equal(r.headers['x-loopguard-trips'], '1');
                }
                assert.deepEqual(samples.map((x) => x.last.id), ['s0', 's1', 's2']);
                assert.equal(samples[0].last.finish_reason.type, 'abort');
                assert.match(samples[0].last.finish_reason.message, /loop/);
                assert.doesNotMatch(samples[0].text, /(lambda ){6}/, 'the loop never reaches the client');
                for (const x of samples.slice(1)) {
                    assert.equal(x.last.finish_reason.type, 'stop');
                    assert.ok(x.text.split(' ').length > 25, x.text);
                    if (!stream) assert.equal(x.ids.length, x.last.completion_tokens, 'every output id');
                }
                const reqs = await fake.requests('/generate');
                assert.equal(reqs.length, 1, 'a sample is not retried');
                assert.deepEqual(reqs[0].body.rid, ['s0', 's1', 's2'], "the client's rids reach SGLang");
                const abort = await fake.waitRecord((x) => x.kind === 'abort');
                assert.equal(abort.rid, 's0', 'the looping sample was aborted by its rid');
                const gens = {};
                for (const rid of ['s0', 's1', 's2']) gens[rid] = await fake.waitRecord((x) => x.kind === 'generation' && x.rid === rid);
                assert.equal(gens.s0.ended, 'aborted');
                assert.ok(gens.s0.tokens_sent < 400, `the loop was cut early (${gens.s0.tokens_sent} tokens)`);
                assert.equal(gens.s1.ended, 'complete');
                assert.equal(gens.s2.ended, 'complete');
                assert.equal((await fake.records()).filter((x) => x.kind === 'abort').length, 1, 'only that sample');
                const inc = await waitFor(async () => (await incidents(lg.url)).slice(seen).at(-1));
                assert.equal(inc.endpoint, '/generate');
                assert.equal(inc.outcome, 'failed');
                assert.deepEqual(inc.attempts.map((a) => [a.rid, a.channel]), [['s0', 'content']], 'one record: the cut sample');
            });
        }

        test('a request without text or input_ids gets a 400; metrics count the route', async () => {
            const r = await post(lg.url, { sampling_params: {} });
            assert.equal(r.status, 400);
            assert.match(r.json().error.message, /text or input_ids/);
            const m = await metrics(lg.url);
            assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: 'generate', code: '200' }) > 0);
            assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: 'generate', code: '400' }) >= 1);
        });
    });
}
