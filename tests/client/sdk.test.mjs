// Client test: the official `openai` npm SDK (pinned in package.json), used unchanged, talks
// to loopguard in front of the fake upstream. It proves that what loopguard emits — streams,
// whole completions, pass-through endpoints, errors, and a stream repaired by a guarded
// retry — is read by the SDK exactly as from a real OpenAI-compatible server.

import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { usePair, waitIncident, SCENARIOS, isSlowBuild } from '../e2e/lib.mjs';

const T = { timeout: isSlowBuild ? 60000 : 20000 };
const MSG = [{ role: 'user', content: 'What is the answer?' }];
// The SDK as an application would configure it; no SDK-side retries, so a failure shows.
const API_KEY = 'sk-test-never-logged-4711';
const sdk = (lg) => new OpenAI({ baseURL: lg.url + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 30000 });

describe('official openai SDK through loopguard', () => {
    let fake, lg, client;
    usePair({ fake: { kind: 'sglang', model: 'fake-model' } }, (f, l) => {
        [fake, lg] = [f, l];
        client = sdk(lg);
    });

    it('chat stream: chunks arrive, content and reasoning assemble', T, async () => {
        await fake.setScenario({ dialect: 'sglang', responses: [{ reasoning: ['Let me think. ', 'Done thinking.'], content: ['The answer ', 'is 42.'] }] });
        const stream = await client.chat.completions.create({ model: 'm', messages: MSG, stream: true, stream_options: { include_usage: true } });
        let content = '',
            reasoning = '',
            finish = null,
            usage = null,
            n = 0;
        for await (const chunk of stream) {
            n++;
            const ch = chunk.choices[0];
            if (chunk.usage) usage = chunk.usage;
            if (!ch) continue;
            content += ch.delta.content ?? '';
            reasoning += ch.delta.reasoning_content ?? '';
            if (ch.finish_reason) finish = ch.finish_reason;
        }
        assert.ok(n >= 5, `${n} chunks`);
        assert.equal(content, 'The answer is 42.');
        assert.equal(reasoning, 'Let me think. Done thinking.');
        assert.equal(finish, 'stop');
        assert.ok(usage && usage.completion_tokens > 0);
    });

    it('whole completion', T, async () => {
        await fake.setScenario({ dialect: 'vllm', responses: [{ reasoning: ['Hmm.'], content: ['Forty ', 'two.'] }] });
        const c = await client.chat.completions.create({ model: 'm', messages: MSG });
        assert.equal(c.object, 'chat.completion');
        assert.equal(c.choices[0].message.role, 'assistant');
        assert.equal(c.choices[0].message.content, 'Forty two.');
        assert.equal(c.choices[0].message.reasoning_content, 'Hmm.');
        assert.equal(c.choices[0].finish_reason, 'stop');
        assert.equal(c.usage.completion_tokens, 3);
    });

    it('text completion stream', T, async () => {
        await fake.setScenario({ dialect: 'sglang', responses: [{ content: ['Once ', 'upon ', 'a time.'] }] });
        const stream = await client.completions.create({ model: 'm', prompt: 'Tell me', stream: true });
        let text = '';
        for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
        assert.equal(text, 'Once upon a time.');
    });

    it('every reasoning output mode reads unchanged (stream and whole, vLLM reasoning in)', T, async () => {
        await fake.setScenario({ dialect: 'vllm', responses: [{ reasoning: ['Think ', 'first.'], content: ['Then ', 'answer.'] }] });
        const want = {
            reasoning_content: { reasoning_content: 'Think first.', reasoning: '', content: 'Then answer.' },
            reasoning: { reasoning_content: '', reasoning: 'Think first.', content: 'Then answer.' },
            inline: { reasoning_content: '', reasoning: '', content: '<think>Think first.</think>\n\nThen answer.' },
            hide: { reasoning_content: '', reasoning: '', content: 'Then answer.' },
        };
        for (const [mode, exp] of Object.entries(want)) {
            const opts = { headers: { 'X-Loopguard-Reasoning': mode } };
            const stream = await client.chat.completions.create({ model: 'm', messages: MSG, stream: true }, opts);
            const got = { reasoning_content: '', reasoning: '', content: '' };
            for await (const chunk of stream) {
                const d = chunk.choices[0]?.delta ?? {};
                for (const k of Object.keys(got)) got[k] += d[k] ?? '';
            }
            assert.deepEqual(got, exp, `stream, ${mode}`);
            const c = await client.chat.completions.create({ model: 'm', messages: MSG }, opts);
            const m = c.choices[0].message;
            assert.deepEqual({ reasoning_content: m.reasoning_content ?? '', reasoning: m.reasoning ?? '', content: m.content ?? '' }, exp, `whole, ${mode}`);
        }
    });

    it('models.list() passes through', T, async () => {
        const ids = [];
        for await (const m of client.models.list()) ids.push(m.id);
        assert.ok(ids.includes('fake-model'), JSON.stringify(ids));
    });

    it('a 400 from loopguard surfaces as the SDK APIError (BadRequestError)', T, async () => {
        await assert.rejects(
            client.chat.completions.create({ model: 'm', messages: 'not an array' }),
            (e) => {
                assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
                assert.ok(e instanceof OpenAI.BadRequestError);
                assert.equal(e.status, 400);
                assert.equal(typeof e.message, 'string');
                return true;
            }
        );
    });

    it('an upstream 503 surfaces with its status', T, async () => {
        await fake.setScenario({ responses: [{ content: ['x'], fault: { kind: 'http_status', status: 503, message: 'overloaded' } }] });
        await assert.rejects(client.chat.completions.create({ model: 'm', messages: MSG, stream: true }), (e) => e instanceof OpenAI.APIError && e.status === 503);
    });

    it('a mid-stream error event is thrown by the SDK stream after the text before it', T, async () => {
        await fake.setScenario({ pace_ms: 10, responses: [{ content: ['Some ', 'words ', 'lost'], fault: { kind: 'error_event', at_token: 2, message: 'GPU on fire' } }] });
        const stream = await client.chat.completions.create({ model: 'm', messages: MSG, stream: true });
        let content = '';
        await assert.rejects(
            (async () => {
                for await (const chunk of stream) content += chunk.choices[0]?.delta?.content ?? '';
            })(),
            (e) => e instanceof OpenAI.APIError && /GPU on fire/.test(e.message)
        );
        assert.equal(content, 'Some words ');
    });
});

describe('official openai SDK: a guarded retry (seed_lambda)', () => {
    let fake, lg, client;
    usePair({ fake: { kind: 'sglang', scenario: path.join(SCENARIOS, 'seed_lambda.json') } }, (f, l) => {
        [fake, lg] = [f, l];
        client = sdk(lg);
    });

    it('the SDK stream gets clean reasoning and the is_prime answer, no lambda loop', T, async () => {
        const stream = await client.chat.completions.create({
            model: '/root/models/Qwen3.6-27B',
            messages: [{ role: 'user', content: 'Write a Python function that checks whether a number is prime.' }],
            temperature: 0.6,
            max_tokens: 2000,
            stream: true,
        });
        let content = '',
            reasoning = '',
            finish = null;
        const ids = new Set();
        for await (const chunk of stream) {
            ids.add(chunk.id);
            const ch = chunk.choices[0];
            if (!ch) continue;
            content += ch.delta.content ?? '';
            reasoning += ch.delta.reasoning_content ?? '';
            if (ch.finish_reason) finish = ch.finish_reason;
        }
        assert.equal(ids.size, 1, 'one id across the retry');
        assert.match(content, /def is_prime\(n\):/);
        assert.doesNotMatch(reasoning, /(lambda ){4}/, `the loop reached the client: ${reasoning.slice(0, 200)}`);
        assert.equal(finish, 'stop');
        const reqs = await fake.requests('/v1/chat/completions');
        assert.ok(reqs.length >= 2, 'a retry was made');
        assert.equal(reqs[0].body.temperature, 0.6);
        const gens = (await fake.records()).filter((r) => r.kind === 'generation');
        assert.ok(gens[0].tokens_sent < 500, `the looping attempt ran ${gens[0].tokens_sent} tokens`);
        const inc = await waitIncident(lg.url);
        assert.equal(inc.outcome, 'recovered');
        assert.equal(reqs[0].headers.authorization, `Bearer ${API_KEY}`, 'the key reaches the upstream');
        assert.ok(!JSON.stringify(inc).includes(API_KEY), 'the API key is in the incident');
        assert.ok(!lg.stderr().includes(API_KEY), 'the API key is in the log');
    });
});
