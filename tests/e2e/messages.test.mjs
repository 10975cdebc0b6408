// End-to-end tests of the guarded Anthropic Messages route (/v1/messages), through the real
// loopguard binary and the fake upstream speaking /v1/messages as SGLang and vLLM do
// (tests/fake/fake_messages.h). Each case runs streaming and whole and checks what the
// client received (a valid event sequence: one message_start, continuous block indexes, no
// loop text), what reached the upstream (the fake's records) and what loopguard wrote down
// (the incident names the route; metrics count the route).
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
const body = (extra = {}) => ({
    model: MODEL,
    max_tokens: 2000,
    temperature: 0.6,
    messages: [{ role: 'user', content: PROMPT }],
    ...extra,
});

const post = (url, b, headers = {}) => request(url + '/v1/messages', { method: 'POST', body: b, headers });

// The client's view of a stream: checks the sequence rules and returns the message.
function readStream(text) {
    const events = sse(text).map((e) => ({ name: e.event, data: JSON.parse(e.data) }));
    for (const e of events) assert.equal(e.name, e.data.type, 'event name matches data.type');
    const starts = events.filter((e) => e.name === 'message_start');
    assert.equal(starts.length, 1, 'exactly one message_start');
    assert.equal(events[0].name, 'message_start');
    assert.equal(events.at(-1).name, 'message_stop', 'the stream ends with message_stop');
    const blocks = [];
    let open = -1;
    let stop = null;
    for (const { name, data } of events) {
        if (name === 'content_block_start') {
            assert.equal(open, -1, 'a block starts only after the previous one stopped');
            assert.equal(data.index, blocks.length, 'block indexes are continuous');
            open = data.index;
            blocks.push({ ...data.content_block, text: '', thinking: '', json: '' });
        } else if (name === 'content_block_delta') {
            assert.equal(data.index, open, 'a delta goes to the open block');
            const b = blocks[open];
            if (data.delta.type === 'text_delta') b.text += data.delta.text;
            if (data.delta.type === 'thinking_delta') b.thinking += data.delta.thinking;
            if (data.delta.type === 'input_json_delta') b.json += data.delta.partial_json;
        } else if (name === 'content_block_stop') {
            assert.equal(data.index, open, 'the stop closes the open block');
            open = -1;
        } else if (name === 'message_delta') {
            stop = data.delta.stop_reason;
        }
    }
    assert.equal(open, -1, 'no block left open');
    return { blocks, stop, events };
}

const textOf = (blocks, type) =>
    blocks
        .filter((b) => b.type === type)
        .map((b) => (type === 'thinking' ? b.thinking : type === 'text' ? b.text : b.json ?? JSON.stringify(b.input)))
        .join('');

for (const kind of ['sglang', 'vllm']) {
    describe(`/v1/messages on ${kind}`, DEADLINE, () => {
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
            const norm = (t) => t.replace(/"id":"[^"]*"/g, '"id":"X"');
            await fake.setScenario(CLEAN);
            const direct = await post(fake.url, body({ stream: true }));
            const via = await post(lg.url, body({ stream: true }));
            assert.equal(via.status, 200);
            assert.match(via.headers['content-type'], /text\/event-stream/);
            assert.equal(norm(via.text), norm(direct.text));
            const m = readStream(via.text);
            assert.equal(m.stop, 'end_turn');
            assert.equal(textOf(m.blocks, 'text'), 'The answer is forty two, as everyone knows.\nAsk again tomorrow.');
            assert.equal(textOf(m.blocks, 'thinking'), 'First I consider the question. Then I recall the book.');
        });

        test('a clean whole message is the upstream message', async () => {
            await fake.setScenario(scenario('clean.json', 0));
            const r = await post(lg.url, body());
            assert.equal(r.status, 200, r.text);
            const m = r.json();
            assert.equal(m.type, 'message');
            assert.equal(m.role, 'assistant');
            assert.equal(m.stop_reason, 'end_turn');
            assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
            assert.match(m.content[1].text, /def is_prime/);
            assert.ok(m.usage.output_tokens > 0);
        });

        const loops = [
            ['seed loop in the thinking', scenario('seed_lambda.json'), 'reasoning', (m) => /def is_prime/.test(textOf(m.blocks, 'text'))],
            ['content loop', scenario('content_loop.json'), 'content', (m) => /def is_prime/.test(textOf(m.blocks, 'text'))],
            ['tool-argument loop', TOOL_LOOP, 'tool_args', (m) => m.blocks.some((b) => b.type === 'tool_use' && b.name === 'search' && /"prime"/.test(b.json ?? JSON.stringify(b.input)))],
        ];
        for (const [name, sc, channel, clean] of loops) {
            for (const stream of [true, false]) {
                test(`${name}, ${stream ? 'streaming' : 'whole'}: cut, retried, clean answer`, async () => {
                    await fake.setScenario(sc);
                    await fake.reset();
                    const seen = (await incidents(lg.url)).length;
                    const r = await post(lg.url, body({ stream }));
                    assert.equal(r.status, 200, r.text);
                    let m;
                    if (stream) {
                        m = readStream(r.text);
                        assert.match(r.text, /: X-Loopguard-Trips: 1/);
                    } else {
                        const j = r.json();
                        m = { blocks: j.content, stop: j.stop_reason };
                        assert.equal(r.headers['x-loopguard-trips'], '1');
                    }
                    assert.ok(clean(m), `clean answer: ${JSON.stringify(m.blocks)}`);
                    assert.notEqual(m.stop, 'refusal');
                    const all = JSON.stringify(m.blocks);
                    assert.doesNotMatch(all, /(lambda ){6}|(prime numbers ){6}|(The function returns True if the number is prime\. ){3}/, 'the loop never reaches the client');
                    const reqs = await fake.requests('/v1/messages');
                    assert.equal(reqs.length, 2);
                    assert.equal(reqs[0].body.stream, true, 'the upstream always streams');
                    assert.notEqual(reqs[1].body.temperature, 0.6, 'the retry changed the temperature');
                    const gens = await fake.waitRecord((x) => x.kind === 'generation' && x.response === 0);
                    assert.ok(gens.tokens_sent < 400, `the loop was cut early (${gens.tokens_sent} tokens)`);
                    const inc = await waitFor(async () => (await incidents(lg.url)).slice(seen).at(-1));
                    assert.equal(inc.endpoint, '/v1/messages');
                    assert.equal(inc.outcome, 'recovered');
                    assert.equal(inc.attempts[0].channel, channel);
                });
            }
        }

        test('always looping, streaming: a well-formed message with stop_reason refusal', async () => {
            await fake.setScenario(scenario('always_loop.json'));
            const r = await post(lg.url, body({ stream: true }));
            assert.equal(r.status, 200);
            const m = readStream(r.text);
            assert.equal(m.stop, 'refusal');
            assert.doesNotMatch(textOf(m.blocks, 'thinking'), /(lambda ){6}/);
            assert.match(r.text, /: X-Loopguard-Attempts: 3/);
            const inc = (await incidents(lg.url)).at(-1);
            assert.equal(inc.outcome, 'failed');
            assert.equal(inc.endpoint, '/v1/messages');
        });

        test('always looping, whole: stop_reason refusal and the X-Loopguard headers', async () => {
            await fake.setScenario(scenario('always_loop.json'));
            const r = await post(lg.url, body());
            assert.equal(r.status, 200);
            assert.equal(r.json().stop_reason, 'refusal');
            assert.equal(r.headers['x-loopguard-attempts'], '3');
            assert.equal(r.headers['x-loopguard-trips'], '3');
        });

        test('a client that hangs up ends the generation upstream', async () => {
            await fake.setScenario({ model: MODEL, pace_ms: 20, responses: [{ content: [{ varied: -1 }] }] });
            await fake.reset();
            const r = await streamUntil(lg.url + '/v1/messages', body({ stream: true }), { until: (t) => /text_delta/.test(t) });
            assert.equal(r.status, 200);
            const g = await fake.waitRecord((x) => x.kind === 'generation');
            assert.equal(g.client_gone, true);
        });

        for (const stream of [true, false]) {
            test(`an upstream error event becomes a well-formed Anthropic error, ${stream ? 'streaming' : 'whole'}`, async () => {
                await fake.setScenario({ model: MODEL, responses: [{ content: ['some words here '], fault: { kind: 'error_event', at_token: 2, message: 'boom' } }] });
                const r = await post(lg.url, body({ stream }));
                if (stream) {
                    const ev = sse(r.text).map((e) => ({ name: e.event, data: JSON.parse(e.data) }));
                    const err = ev.find((e) => e.name === 'error');
                    assert.equal(err.data.type, 'error');
                    assert.equal(err.data.error.message, 'boom');
                } else {
                    assert.ok(r.status >= 400, r.text);
                    assert.equal(r.json().type, 'error');
                }
            });
            test(`a stream cut mid-event becomes a well-formed Anthropic error, ${stream ? 'streaming' : 'whole'}`, async () => {
                await fake.setScenario({ model: MODEL, responses: [{ content: ['some words here '], fault: { kind: 'truncated_chunked', at_token: 2 } }] });
                const r = await post(lg.url, body({ stream }));
                if (stream) {
                    const ev = sse(r.text).map((e) => ({ name: e.event, data: JSON.parse(e.data) }));
                    assert.equal(ev.at(-1).name, 'error');
                    assert.equal(ev.at(-1).data.error.type, 'api_error');
                } else {
                    assert.equal(r.status, 502);
                    assert.deepEqual(Object.keys(r.json()), ['type', 'error']);
                }
            });
        }

        test('a malformed request gets an Anthropic error; metrics count the route', async () => {
            const r = await post(lg.url, { model: MODEL, messages: 'hi' });
            assert.equal(r.status, 400);
            assert.equal(r.json().error.type, 'invalid_request_error');
            const m = await metrics(lg.url);
            assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: 'messages', code: '200' }) > 0);
            assert.ok(metricValue(m, 'loopguard_requests_total', { endpoint: 'messages', code: '400' }) >= 1);
        });
    });
}
