// End-to-end tests of the guarded OpenAI Responses route (/v1/responses), through the real
// loopguard binary and the fake upstream speaking /v1/responses as vLLM and SGLang do
// (tests/fake/fake_responses.h). Each case runs streaming and whole and checks what the
// client received (a valid event sequence: sequence_number 0, 1, 2, ... across retries,
// items added and done in order with continuous output_index, no loop text), what reached
// the upstream (the fake's records) and what loopguard wrote down (the incident names the
// route; metrics count the route).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
    startFake,
    startLoopguard,
    request,
    streamUntil,
    sse,
    incidents,
    metrics,
    metricValue,
    waitFor,
    DEADLINE,
} from './lib.mjs';

import { MODEL, scenario, CLEAN, TOOL_LOOP } from './apis_fixtures.mjs';
const PROMPT = 'Write a Python function that checks if a number is prime. Be concise.';
const body = (extra = {}) => ({ model: MODEL, max_output_tokens: 2000, temperature: 0.6, input: PROMPT, ...extra });

const post = (url, b, headers = {}) => request(url + '/v1/responses', { method: 'POST', body: b, headers });

// The client's view of a stream: checks the sequence rules and returns the items.
function readStream(text) {
    const events = sse(text).map((e) => ({ name: e.event, data: JSON.parse(e.data) }));
    events.forEach((e, i) => {
        assert.equal(e.name, e.data.type, 'event name matches data.type');
        assert.equal(e.data.sequence_number, i, 'sequence_number counts every event');
    });
    assert.equal(events.filter((e) => e.name === 'response.created').length, 1, 'one response.created');
    const last = events.at(-1);
    assert.match(last.name, /^response\.(completed|incomplete)$/, 'a terminal event ends the stream');
    const items = [];
    let open = -1;
    for (const { name, data } of events) {
        if (name === 'response.output_item.added') {
            assert.equal(open, -1, 'an item is added after the previous one is done');
            assert.equal(data.output_index, items.length, 'output_index is continuous');
            open = data.output_index;
            items.push({ ...data.item, text: '' });
        } else if (/\.delta$/.test(name)) {
            assert.equal(data.output_index, open, 'a delta goes to the open item');
            items[open].text += data.delta;
        } else if (name === 'response.output_item.done') {
            assert.equal(data.output_index, open);
            open = -1;
        }
    }
    assert.equal(open, -1, 'no item left open');
    const final = last.data.response;
    assert.equal(final.id, events[0].data.response.id, 'the final response keeps the first id');
    assert.equal(final.output.length, items.length, 'the final response lists every item the client saw');
    return { items, final, events };
}

const itemText = (items, type) => items.filter((i) => i.type === type).map((i) => i.text).join('');
// A whole response's items as the stream reader returns them.
const wholeItems = (resp) =>
    resp.output.map((i) => ({ ...i, text: i.type === 'function_call' ? i.arguments : (i.content || []).map((c) => c.text).join('') }));

for (const kind of ['sglang', 'vllm']) {
    describe(`/v1/responses on ${kind}`, DEADLINE, () => {
        let fake, lg;
        before(async () => {
            fake = await startFake({ kind, scenario: CLEAN });
            lg = await startLoopguard({ upstream: fake.url, kind });
        });
        after(async () => {
            await lg?.stop();
            await fake?.stop();
        });

        test('a clean stream reaches the client byte for byte', async () => {
            const norm = (t) => t.replace(/"id":"[^"]*"/g, '"id":"X"').replace(/"created_at":\d+/g, '"created_at":0');
            const answer = { model: MODEL, responses: [{ content: CLEAN.responses[0].content }] };
            await fake.setScenario(answer);
            const direct = await post(fake.url, body({ stream: true }));
            const via = await post(lg.url, body({ stream: true }));
            assert.equal(via.status, 200);
            assert.match(via.headers['content-type'], /text\/event-stream/);
            assert.equal(norm(via.text), norm(direct.text));
            const m = readStream(via.text);
            assert.equal(m.final.status, 'completed');
            assert.equal(itemText(m.items, 'message'), 'The answer is forty two, as everyone knows.\nAsk again tomorrow.');
        });

        test("a clean stream with reasoning: event for event, vLLM's reasoning_part events under OpenAI's names", async () => {
            const norm = (t) => t.replace(/"id":"[^"]*"/g, '"id":"X"').replace(/"created_at":\d+/g, '"created_at":0');
            await fake.setScenario(CLEAN);
            const direct = sse(norm((await post(fake.url, body({ stream: true }))).text));
            const via = sse(norm((await post(lg.url, body({ stream: true }))).text));
            assert.equal(via.length, direct.length);
            via.forEach((e, i) => {
                const d = JSON.parse(direct[i].data);
                const want = d.type.replace('response.reasoning_part.', 'response.content_part.');
                assert.equal(e.event, want);
                assert.deepEqual(JSON.parse(e.data), { ...d, type: want });
            });
            assert.ok(direct.some((e) => e.event === 'response.reasoning_part.added'), 'the upstream sent vLLM names');
            const m = readStream(via.map((e) => e.raw).join(''));
            assert.equal(itemText(m.items, 'reasoning'), 'First I consider the question. Then I recall the book.');
        });

        test('a clean whole response is the upstream response', async () => {
            await fake.setScenario(scenario('clean.json', 0));
            const r = await post(lg.url, body());
            assert.equal(r.status, 200, r.text);
            const m = r.json();
            assert.equal(m.object, 'response');
            assert.equal(m.status, 'completed');
            assert.deepEqual(m.output.map((i) => i.type), ['reasoning', 'message']);
            assert.match(m.output[1].content[0].text, /def is_prime/);
            assert.ok(m.usage.output_tokens > 0);
        });

        const loops = [
            ['seed loop in the reasoning', scenario('seed_lambda.json'), 'reasoning', (items) => /def is_prime/.test(itemText(items, 'message'))],
            ['content loop', scenario('content_loop.json'), 'content', (items) => /def is_prime/.test(itemText(items, 'message'))],
            ['tool-argument loop', TOOL_LOOP, 'tool_args', (items) => items.some((i) => i.type === 'function_call' && i.name === 'search' && i.text === '{"query": "prime"}')],
        ];
        for (const [name, sc, channel, clean] of loops) {
            for (const stream of [true, false]) {
                test(`${name}, ${stream ? 'streaming' : 'whole'}: cut, retried, clean answer`, async () => {
                    await fake.setScenario(sc);
                    await fake.reset();
                    const seen = (await incidents(lg.url)).length;
                    const r = await post(lg.url, body({ stream }));
                    assert.equal(r.status, 200, r.text);
                    let items, final;
                    if (stream) {
                        ({ items, final } = readStream(r.text));
                        assert.match(r.text, /: X-Loopguard-Trips: 1/);
                    } else {
                        final = r.json();
                        items = wholeItems(final);
                        assert.equal(r.headers['x-loopguard-trips'], '1');
                    }
                    assert.ok(clean(items), `clean answer: ${JSON.stringify(items)}`);
                    assert.equal(final.status, 'completed');
                    const all = JSON.stringify(items);
                    assert.doesNotMatch(all, /(lambda ){6}|(prime numbers ){6}|(The function returns True if the number is prime\. ){3}/, 'the loop never reaches the client');
                    const reqs = await fake.requests('/v1/responses');
                    assert.equal(reqs.length, 2);
                    assert.equal(reqs[0].body.stream, true, 'the upstream always streams');
                    assert.notEqual(reqs[1].body.temperature, 0.6, 'the retry changed the temperature');
                    const gens = await fake.waitRecord((x) => x.kind === 'generation' && x.response === 0);
                    assert.ok(gens.tokens_sent < 400, `the loop was cut early (${gens.tokens_sent} tokens)`);
                    const inc = await waitFor(async () => (await incidents(lg.url)).slice(seen).at(-1));
                    assert.equal(inc.endpoint, '/v1/responses');
                    assert.equal(inc.outcome, 'recovered');
                    assert.equal(inc.attempts[0].channel, channel);
                });
            }
        }

        test('always looping, streaming: response.incomplete for content_filter', async () => {
            await fake.setScenario(scenario('always_loop.json'));
            const r = await post(lg.url, body({ stream: true }));
            assert.equal(r.status, 200);
            const m = readStream(r.text);
            assert.equal(m.events.at(-1).name, 'response.incomplete');
            assert.equal(m.final.status, 'incomplete');
            assert.deepEqual(m.final.incomplete_details, { reason: 'content_filter' });
            assert.doesNotMatch(itemText(m.items, 'reasoning'), /(lambda ){6}/);
            assert.match(r.text, /: X-Loopguard-Attempts: 3/);
            const inc = (await incidents(lg.url)).at(-1);
            assert.equal(inc.outcome, 'failed');
            assert.equal(inc.endpoint, '/v1/responses');
        });

        test('always looping, whole: status incomplete for content_filter and the X-Loopguard headers', async () => {
            await fake.setScenario(scenario('always_loop.json'));
            const r = await post(lg.url, body());
            assert.equal(r.status, 200);
            assert.equal(r.json().status, 'incomplete');
            assert.deepEqual(r.json().incomplete_details, { reason: 'content_filter' });
            assert.equal(r.headers['x-loopguard-attempts'], '3');
            assert.equal(r.headers['x-loopguard-trips'], '3');
        });

        test('a client that hangs up ends the generation upstream', async () => {
            await fake.setScenario({ model: MODEL, pace_ms: 20, responses: [{ content: [{ varied: -1 }] }] });
            await fake.reset();
            const r = await streamUntil(lg.url + '/v1/responses', body({ stream: true }), { until: (t) => /output_text\.delta/.test(t) });
            assert.equal(r.status, 200);
            const g = await fake.waitRecord((x) => x.kind === 'generation');
            assert.equal(g.client_gone, true);
        });

        for (const stream of [true, false]) {
            test(`an upstream error event becomes a well-formed error, ${stream ? 'streaming' : 'whole'}`, async () => {
                await fake.setScenario({ model: MODEL, responses: [{ content: ['some words here '], fault: { kind: 'error_event', at_token: 2, message: 'boom' } }] });
                const r = await post(lg.url, body({ stream }));
                if (stream) {
                    const ev = sse(r.text).map((e) => ({ name: e.event, data: JSON.parse(e.data) }));
                    const err = ev.find((e) => e.name === 'error');
                    assert.equal(err.data.message, 'boom');
                    ev.forEach((e, i) => assert.equal(e.data.sequence_number, i));
                } else {
                    assert.ok(r.status >= 400, r.text);
                    assert.equal(r.json().error.message, 'boom');
                }
            });
            test(`a stream cut mid-event becomes a well-formed error, ${stream ? 'streaming' : 'whole'}`, async () => {
                await fake.setScenario({ model: MODEL, responses: [{ content: ['some words here '], fault: { kind: 'truncated_chunked', at_token: 2 } }] });
                const r = await post(lg.url, body({ stream }));
                if (stream) {
                    const ev = sse(r.text).map((e) => ({ name: e.event, data: JSON.parse(e.data) }));
                    assert.equal(ev.at(-1).name, 'error');
                    assert.equal(ev.at(-1).data.code, 'upstream_truncated');
                } else {
                    assert.equal(r.status, 502);
                    assert.equal(r.json().error.code, 'upstream_truncated');
                }
            });
        }

        test('a malformed request gets an OpenAI error; metrics count the route', async () => {
            const r = await post(lg.url, { model: MODEL, input: 5 });
            assert.equal(r.status, 400);
            assert.equal(r.json().error.type, 'invalid_request_error');
            const m = await metrics(lg.url);
            assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: 'responses', code: '200' }) > 0);
            assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: 'responses', code: '400' }) >= 1);
        });
    });
}
