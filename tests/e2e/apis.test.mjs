// End-to-end tests of the guarded Anthropic Messages (/v1/messages) and OpenAI Responses
// (/v1/responses) routes, through the real loopguard binary and the fake upstream speaking
// both as SGLang and vLLM do (tests/fake/fake_messages.h, fake_responses.h). One table of
// cases runs against each route; a route's adapter (ROUTES) knows its request, reads its
// stream — checking the API's sequence rules on the way (Messages: one message_start, block
// indexes continuous, a block starts only after the previous one stopped; Responses:
// sequence_number 0, 1, 2, ... across retries, items added and done in order with
// continuous output_index, the final response listing every item the client saw) — and
// reduces an answer to parts {kind: reasoning | answer | tool, name, text, status}. Each
// case checks what the client received, what reached the upstream (the fake's records) and
// what loopguard wrote down (the incident names the route; metrics count the route).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startFake, startLoopguard, request, streamUntil, sse, incidents, metrics, metricValue, waitFor, SCENARIOS, DEADLINE } from './lib.mjs';

const MODEL = '/root/models/Qwen3.6-27B';
const PROMPT = 'Write a Python function that checks if a number is prime. Be concise.';

// A scenario file from tests/fake/scenarios, paced at `pace` ms a token (its dialect, or
// `dialect`: "inline" leaves the reasoning in the answer text between <think> tags).
const scenario = (name, { pace = 10, dialect } = {}) => {
    const s = JSON.parse(fs.readFileSync(path.join(SCENARIOS, name), 'utf8'));
    return { ...s, pace_ms: pace, ...(dialect ? { dialect } : {}) };
};
// Prose the guard never holds back (as core.test.mjs's byte-for-byte cases).
const CLEAN = {
    model: MODEL,
    responses: [{ reasoning: ['First I consider the question. ', 'Then I recall the book.'], content: ['The answer is forty two, ', 'as everyone knows.\n', 'Ask again tomorrow.'] }],
};
const CLEAN_REASONING = 'First I consider the question. Then I recall the book.';
const CLEAN_ANSWER = 'The answer is forty two, as everyone knows.\nAsk again tomorrow.';
const ORIGINAL = { fields: { temperature: 0.6, presence_penalty: null, frequency_penalty: null, repetition_penalty: null } };
const TOOL_LOOP = {
    model: MODEL,
    pace_ms: 10,
    responses: [
        { match: ORIGINAL, content: [], tool_calls: [{ name: 'search', arguments: ['{"query": "', { repeat: 'prime numbers ', times: -1 }] }] },
        { content: [], tool_calls: [{ name: 'search', arguments: '{"query": "prime"}' }] },
    ],
};
const LOOP_TEXT = /(lambda ){6}|(prime numbers ){6}|(The function returns True if the number is prime\. ){3}/;

const events = (text) => sse(text).map((e) => ({ name: e.event, data: JSON.parse(e.data) }));

// ---- the routes ------------------------------------------------------------------------

const MESSAGES = {
    path: '/v1/messages',
    label: 'messages',
    body: (extra = {}) => ({ model: MODEL, max_tokens: 2000, temperature: 0.6, messages: [{ role: 'user', content: PROMPT }], ...extra }),
    badBody: { model: MODEL, messages: 'hi' },
    deltaMark: /text_delta/,
    kinds: { thinking: 'reasoning', text: 'answer', tool_use: 'tool' },
    read(text) {
        const ev = events(text);
        for (const e of ev) assert.equal(e.name, e.data.type, 'event name matches data.type');
        assert.equal(ev.filter((e) => e.name === 'message_start').length, 1, 'exactly one message_start');
        assert.equal(ev[0].name, 'message_start');
        assert.equal(ev.at(-1).name, 'message_stop', 'the stream ends with message_stop');
        const blocks = [];
        let open = -1;
        let stop = null;
        for (const { name, data } of ev) {
            if (name === 'content_block_start') {
                assert.equal(open, -1, 'a block starts only after the previous one stopped');
                assert.equal(data.index, blocks.length, 'block indexes are continuous');
                open = data.index;
                blocks.push({ ...data.content_block, text: '' });
            } else if (name === 'content_block_delta') {
                assert.equal(data.index, open, 'a delta goes to the open block');
                const d = data.delta;
                if (d.type !== 'signature_delta') blocks[open].text += d.text ?? d.thinking ?? d.partial_json;
            } else if (name === 'content_block_stop') {
                assert.equal(data.index, open, 'the stop closes the open block');
                open = -1;
            } else if (name === 'message_delta') {
                stop = data.delta.stop_reason;
            }
        }
        assert.equal(open, -1, 'no block left open');
        return { parts: blocks.map((b) => ({ kind: this.kinds[b.type], name: b.name, text: b.text })), done: stop, events: ev };
    },
    whole(j) {
        assert.equal(j.type, 'message');
        assert.equal(j.role, 'assistant');
        const text = (b) => (b.type === 'thinking' ? b.thinking : b.type === 'text' ? b.text : JSON.stringify(b.input));
        return { parts: j.content.map((b) => ({ kind: this.kinds[b.type], name: b.name, text: text(b) })), done: j.stop_reason, usage: j.usage.output_tokens };
    },
    completed: 'end_turn',
    withheld: 'refusal',
    streamError(ev, message) {
        const err = ev.find((e) => e.name === 'error');
        assert.equal(err.data.type, 'error');
        if (message) assert.equal(err.data.error.message, message);
        else assert.equal(ev.at(-1).name, 'error'), assert.equal(err.data.error.type, 'api_error');
    },
    wholeError(r, message) {
        if (message) return assert.equal(r.json().error.message, message), assert.equal(r.json().type, 'error');
        assert.deepEqual(Object.keys(r.json()), ['type', 'error']);
    },
};

const RESPONSES = {
    path: '/v1/responses',
    label: 'responses',
    body: (extra = {}) => ({ model: MODEL, max_output_tokens: 2000, temperature: 0.6, input: PROMPT, ...extra }),
    badBody: { model: MODEL, input: 5 },
    deltaMark: /output_text\.delta/,
    kinds: { reasoning: 'reasoning', message: 'answer', function_call: 'tool' },
    read(text) {
        const ev = events(text);
        ev.forEach((e, i) => {
            assert.equal(e.name, e.data.type, 'event name matches data.type');
            assert.equal(e.data.sequence_number, i, 'sequence_number counts every event');
        });
        assert.equal(ev.filter((e) => e.name === 'response.created').length, 1, 'one response.created');
        const last = ev.at(-1);
        assert.match(last.name, /^response\.(completed|incomplete)$/, 'a terminal event ends the stream');
        const items = [];
        let open = -1;
        for (const { name, data } of ev) {
            if (name === 'response.output_item.added') {
                assert.equal(open, -1, 'an item is added after the previous one is done');
                assert.equal(data.output_index, items.length, 'output_index is continuous');
                open = data.output_index;
                items.push({ ...data.item, text: '' });
            } else if (/\.delta$/.test(name)) {
                assert.equal(data.output_index, open, 'a delta goes to the open item');
                items[open].text += data.delta;
            } else if (/\.done$/.test(name)) {
                assert.equal(data.output_index, open, 'a .done event ends the open item');
                if (name === 'response.output_item.done') (items[open].status = data.item.status), (open = -1);
            }
        }
        assert.equal(open, -1, 'no item left open');
        const final = last.data.response;
        assert.equal(final.id, ev[0].data.response.id, 'the final response keeps the first id');
        assert.equal(final.output.length, items.length, 'the final response lists every item the client saw');
        const parts = items.map((i) => ({ kind: this.kinds[i.type], name: i.name, text: i.text, status: i.status }));
        return { parts, done: final.incomplete_details?.reason ?? final.status, events: ev };
    },
    whole(j) {
        assert.equal(j.object, 'response');
        const text = (i) => (i.type === 'function_call' ? i.arguments : (i.content || []).map((c) => c.text).join(''));
        const parts = j.output.map((i) => ({ kind: this.kinds[i.type], name: i.name, text: text(i), status: i.status }));
        return { parts, done: j.incomplete_details?.reason ?? j.status, usage: j.usage?.output_tokens };
    },
    completed: 'completed',
    withheld: 'content_filter',
    streamError(ev, message) {
        const err = ev.find((e) => e.name === 'error');
        ev.forEach((e, i) => assert.equal(e.data.sequence_number, i));
        if (message) assert.equal(err.data.message, message);
        else assert.equal(ev.at(-1).name, 'error'), assert.equal(err.data.code, 'upstream_truncated');
    },
    wholeError(r, message) {
        if (message) return assert.equal(r.json().error.message, message);
        assert.equal(r.json().error.code, 'upstream_truncated');
    },
};

const textOf = (parts, kind) => parts.filter((p) => p.kind === kind).map((p) => p.text).join('');
const answerHasCode = (m) => /def is_prime/.test(textOf(m.parts, 'answer'));
// The call's arguments as JSON (a call cut short by the retry is not).
const args = (text) => {
    try {
        return JSON.parse(text);
    } catch {
        return null;
    }
};
const searchedPrime = (m) => m.parts.some((p) => p.kind === 'tool' && p.name === 'search' && args(p.text)?.query === 'prime');

// The looping cases: each is cut at the server, retried with new sampling and ends clean.
const LOOPS = [
    { name: 'seed loop in the reasoning', sc: scenario('seed_lambda.json'), channel: 'reasoning', clean: answerHasCode },
    { name: 'content loop', sc: scenario('content_loop.json'), channel: 'content', clean: answerHasCode, released: true },
    { name: 'tool-argument loop', sc: TOOL_LOOP, channel: 'tool_args', clean: searchedPrime },
    // A server without a reasoning parser: <think> inline in the answer text.
    { name: 'inline <think> seed loop', sc: scenario('seed_lambda.json', { dialect: 'inline' }), channel: 'reasoning', clean: answerHasCode, split: true },
    { name: 'inline <think> content loop', sc: scenario('content_loop.json', { dialect: 'inline' }), channel: 'content', clean: answerHasCode, split: true, released: true },
];

for (const route of [MESSAGES, RESPONSES]) {
    const post = (url, b) => request(url + route.path, { method: 'POST', body: b });
    for (const kind of ['sglang', 'vllm']) {
        describe(`${route.path} on ${kind}`, DEADLINE, () => {
            let fake, lg;
            before(async () => {
                fake = await startFake({ kind, scenario: CLEAN });
                lg = await startLoopguard({ upstream: fake.url, kind });
            });
            after(async () => {
                await lg?.stop();
                await fake?.stop();
            });

            for (const [what, sc] of [
                ['with reasoning', CLEAN],
                ['without reasoning', { model: MODEL, responses: [{ content: CLEAN.responses[0].content }] }],
            ]) {
                test(`a clean stream ${what} reaches the client event for event`, async () => {
                    const norm = (t) => t.replace(/"id":"[^"]*"/g, '"id":"X"').replace(/"created_at":\d+/g, '"created_at":0');
                    await fake.setScenario(sc);
                    const direct = await post(fake.url, route.body({ stream: true }));
                    const via = await post(lg.url, route.body({ stream: true }));
                    assert.equal(via.status, 200);
                    assert.match(via.headers['content-type'], /text\/event-stream/);
                    if (/reasoning_part/.test(direct.text)) {
                        // vLLM's Responses reasoning parts get OpenAI's names (content_part.*),
                        // which the official SDKs read; everything else is as sent
                        const [d, v] = [events(norm(direct.text)), events(norm(via.text))];
                        assert.equal(v.length, d.length);
                        v.forEach((e, i) => {
                            const want = d[i].name.replace('response.reasoning_part.', 'response.content_part.');
                            assert.equal(e.name, want);
                            assert.deepEqual(e.data, { ...d[i].data, type: want });
                        });
                    } else {
                        assert.equal(norm(via.text), norm(direct.text), 'byte for byte');
                    }
                    const m = route.read(via.text);
                    assert.equal(m.done, route.completed);
                    assert.equal(textOf(m.parts, 'answer'), CLEAN_ANSWER);
                    assert.equal(textOf(m.parts, 'reasoning'), sc === CLEAN ? CLEAN_REASONING : '');
                });
            }

            test('a clean whole answer is the upstream answer', async () => {
                await fake.setScenario(scenario('clean.json', { pace: 0 }));
                const r = await post(lg.url, route.body());
                assert.equal(r.status, 200, r.text);
                const m = route.whole(r.json());
                assert.equal(m.done, route.completed);
                assert.deepEqual(m.parts.map((p) => p.kind), ['reasoning', 'answer']);
                assert.match(m.parts[1].text, /def is_prime/);
                assert.ok(m.usage > 0);
            });

            for (const stream of [true, false]) {
                test(`inline <think> in the answer text becomes the API's own reasoning part, ${stream ? 'streaming' : 'whole'}`, async () => {
                    await fake.setScenario({ ...CLEAN, dialect: 'inline' });
                    const direct = await post(fake.url, route.body({ stream }));
                    assert.match(direct.text, /<think>/, 'the upstream leaves the tags in the text');
                    const r = await post(lg.url, route.body({ stream }));
                    assert.equal(r.status, 200, r.text);
                    const m = stream ? route.read(r.text) : route.whole(r.json());
                    assert.deepEqual(m.parts.map((p) => p.kind), ['reasoning', 'answer']);
                    assert.equal(m.parts[0].text, CLEAN_REASONING);
                    assert.equal(m.parts[1].text, CLEAN_ANSWER);
                    assert.doesNotMatch(r.text, /<\/?think>/);
                    assert.equal(m.done, route.completed);
                });
            }

            for (const { name, sc, channel, clean, split, released } of LOOPS) {
                for (const stream of [true, false]) {
                    test(`${name}, ${stream ? 'streaming' : 'whole'}: cut, retried, clean answer`, async () => {
                        await fake.setScenario(sc);
                        await fake.reset();
                        const seen = (await incidents(lg.url)).length;
                        const r = await post(lg.url, route.body({ stream }));
                        assert.equal(r.status, 200, r.text);
                        const m = stream ? route.read(r.text) : route.whole(r.json());
                        if (stream) assert.match(r.text, /: X-Loopguard-Trips: 1/);
                        else assert.equal(r.headers['x-loopguard-trips'], '1');
                        assert.ok(clean(m), `clean answer: ${JSON.stringify(m.parts)}`);
                        assert.equal(m.done, sc === TOOL_LOOP && route === MESSAGES ? 'tool_use' : route.completed);
                        assert.doesNotMatch(JSON.stringify(m.parts), LOOP_TEXT, 'the loop never reaches the client');
                        if (split) {
                            assert.doesNotMatch(r.text, /<\/?think>/, 'the tags never reach the client');
                            assert.ok(m.parts.some((p) => p.kind === 'reasoning' && /prime check/.test(p.text)), 'the retry\'s reasoning is a reasoning part');
                        }
                        if (stream && released) {
                            // The first attempt's clean start reached the client before the
                            // loop began; the retry's parts follow it (read() checked the
                            // sequence), the first attempt's answer part ended where it was cut.
                            const answers = m.parts.filter((p) => p.kind === 'answer');
                            assert.equal(answers.length, 2, JSON.stringify(m.parts));
                            assert.match(answers[0].text, /^A number is prime/);
                            assert.doesNotMatch(answers[0].text, /def is_prime/);
                            if (route === RESPONSES) assert.equal(answers[0].status, 'incomplete');
                        }
                        const reqs = await fake.requests(route.path);
                        assert.equal(reqs.length, 2);
                        assert.equal(reqs[0].body.stream, true, 'the upstream always streams');
                        assert.notEqual(reqs[1].body.temperature, 0.6, 'the retry changed the temperature');
                        const gens = await fake.waitRecord((x) => x.kind === 'generation' && x.response === 0);
                        assert.ok(gens.tokens_sent < 400, `the loop was cut early (${gens.tokens_sent} tokens)`);
                        const inc = await waitFor(async () => (await incidents(lg.url)).slice(seen).at(-1));
                        assert.equal(inc.endpoint, route.path);
                        assert.equal(inc.outcome, 'recovered');
                        assert.equal(inc.attempts[0].channel, channel);
                    });
                }
            }

            for (const stream of [true, false]) {
                test(`always looping, ${stream ? 'streaming' : 'whole'}: a well-formed answer that says it was withheld`, async () => {
                    await fake.setScenario(scenario('always_loop.json'));
                    const seen = (await incidents(lg.url)).length;
                    const r = await post(lg.url, route.body({ stream }));
                    assert.equal(r.status, 200);
                    const m = stream ? route.read(r.text) : route.whole(r.json());
                    assert.equal(m.done, route.withheld);
                    assert.doesNotMatch(JSON.stringify(m.parts), LOOP_TEXT);
                    if (stream) {
                        assert.match(r.text, /: X-Loopguard-Attempts: 3/);
                    } else {
                        assert.equal(r.headers['x-loopguard-attempts'], '3');
                        assert.equal(r.headers['x-loopguard-trips'], '3');
                    }
                    const inc = await waitFor(async () => (await incidents(lg.url)).slice(seen).at(-1));
                    assert.equal(inc.outcome, 'failed');
                    assert.equal(inc.endpoint, route.path);
                });
            }

            test('a client that hangs up ends the generation upstream', async () => {
                await fake.setScenario({ model: MODEL, pace_ms: 20, responses: [{ content: [{ varied: -1 }] }] });
                await fake.reset();
                const r = await streamUntil(lg.url + route.path, route.body({ stream: true }), { until: (t) => route.deltaMark.test(t) });
                assert.equal(r.status, 200);
                const g = await fake.waitRecord((x) => x.kind === 'generation');
                assert.equal(g.client_gone, true);
            });

            for (const stream of [true, false]) {
                for (const [what, fault, message] of [
                    ['an upstream error event', { kind: 'error_event', at_token: 2, message: 'boom' }, 'boom'],
                    ['a stream cut mid-event', { kind: 'truncated_chunked', at_token: 2 }, null],
                ]) {
                    test(`${what} becomes a well-formed error, ${stream ? 'streaming' : 'whole'}`, async () => {
                        await fake.setScenario({ model: MODEL, responses: [{ content: ['some words here '], fault }] });
                        const r = await post(lg.url, route.body({ stream }));
                        if (stream) {
                            route.streamError(events(r.text), message);
                        } else {
                            assert.equal(r.status, 502, r.text);
                            route.wholeError(r, message);
                        }
                    });
                }
            }

            test('a malformed request gets an error in the API shape; metrics count the route', async () => {
                const r = await post(lg.url, route.badBody);
                assert.equal(r.status, 400);
                assert.equal(r.json().error.type, 'invalid_request_error');
                const m = await metrics(lg.url);
                assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: route.label, code: '200' }) > 0);
                assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: route.label, code: '400' }) >= 1);
            });
        });
    }
}
