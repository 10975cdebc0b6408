// Client test: the official SDKs of the other generation APIs, used unchanged, through
// loopguard in front of the fake upstream: @anthropic-ai/sdk (messages.stream,
// messages.create) on /v1/messages and openai (responses.stream, responses.create) on
// /v1/responses. The first attempt loops in its reasoning (the seed's "lambda" loop); each
// SDK must see one clean answer, as from a server that never looped.

import { describe, it, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { usePair, incidents, SCENARIOS, isSlowBuild } from '../e2e/lib.mjs';

const T = { timeout: isSlowBuild ? 60000 : 20000 };
const API_KEY = 'sk-test-never-logged-4711';
const PROMPT = 'Write a Python function that checks if a number is prime. Be concise.';
const LOOP = { ...JSON.parse(fs.readFileSync(path.join(SCENARIOS, 'seed_lambda.json'), 'utf8')), pace_ms: 5 };
const LOOP_TEXT = /(lambda ){6}/;

for (const kind of ['sglang', 'vllm']) {
    describe(`official SDKs of the other APIs through loopguard (${kind})`, () => {
        let fake, lg, anthropic, openai;
        usePair({ fake: { kind, scenario: LOOP }, lg: { kind } }, (f, l) => {
            [fake, lg] = [f, l];
            anthropic = new Anthropic({ baseURL: lg.url, apiKey: API_KEY, maxRetries: 0, timeout: 30000 });
            openai = new OpenAI({ baseURL: lg.url + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 30000 });
        });

        // The request just made looped first: it left an incident of its own.
        let seen = 0;
        beforeEach(async () => (seen = (await incidents(lg.url)).length));
        async function tripped(route) {
            const all = await incidents(lg.url);
            assert.equal(all.length, seen + 1, 'this request tripped');
            assert.equal(all.at(-1).endpoint, route);
            assert.equal(all.at(-1).outcome, 'recovered');
        }

        it('anthropic messages.stream: a clean message after a looping first attempt', T, async () => {
            let text = '';
            const stream = anthropic.messages.stream({ model: 'm', max_tokens: 2000, temperature: 0.6, messages: [{ role: 'user', content: PROMPT }] });
            stream.on('text', (t) => (text += t));
            const msg = await stream.finalMessage();
            assert.equal(msg.stop_reason, 'end_turn');
            const final = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
            assert.match(final, /def is_prime/);
            assert.equal(text, final, 'the text events and the final message agree');
            assert.doesNotMatch(JSON.stringify(msg.content), LOOP_TEXT);
            await tripped('/v1/messages');
        });

        it('anthropic messages.create: a clean message after a looping first attempt', T, async () => {
            const msg = await anthropic.messages.create({ model: 'm', max_tokens: 2000, temperature: 0.6, messages: [{ role: 'user', content: PROMPT }] });
            assert.equal(msg.type, 'message');
            assert.equal(msg.stop_reason, 'end_turn');
            assert.match(msg.content.find((b) => b.type === 'text').text, /def is_prime/);
            assert.doesNotMatch(JSON.stringify(msg.content), LOOP_TEXT);
            await tripped('/v1/messages');
        });

        it('openai responses.stream: a clean response after a looping first attempt', T, async () => {
            let text = '';
            const stream = openai.responses.stream({ model: 'm', input: PROMPT, temperature: 0.6, max_output_tokens: 2000 });
            stream.on('response.output_text.delta', (e) => (text += e.delta));
            const resp = await stream.finalResponse();
            assert.equal(resp.status, 'completed');
            assert.match(resp.output_text, /def is_prime/);
            assert.equal(text, resp.output_text);
            assert.doesNotMatch(JSON.stringify(resp.output), LOOP_TEXT);
            await tripped('/v1/responses');
        });

        it('openai responses.create: a clean response after a looping first attempt', T, async () => {
            const resp = await openai.responses.create({ model: 'm', input: PROMPT, temperature: 0.6, max_output_tokens: 2000 });
            assert.equal(resp.object, 'response');
            assert.equal(resp.status, 'completed');
            assert.match(resp.output_text, /def is_prime/);
            assert.doesNotMatch(JSON.stringify(resp.output), LOOP_TEXT);
            await tripped('/v1/responses');
        });
    });
}

// A server without a reasoning parser: the reasoning comes inline in the text, between
// <think> tags; loopguard gives it to the SDKs as a thinking block or a reasoning item, which
// their stream accumulators must take.
for (const kind of ['sglang', 'vllm']) {
    describe(`official SDKs through loopguard, reasoning inline upstream (${kind})`, () => {
        let lg, anthropic, openai;
        usePair({ fake: { kind, scenario: { ...LOOP, dialect: 'inline' } }, lg: { kind } }, (f, l) => {
            lg = l;
            anthropic = new Anthropic({ baseURL: lg.url, apiKey: API_KEY, maxRetries: 0, timeout: 30000 });
            openai = new OpenAI({ baseURL: lg.url + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 30000 });
        });

        it('anthropic messages.stream: a thinking block, then the clean text', T, async () => {
            let thinking = '';
            const stream = anthropic.messages.stream({ model: 'm', max_tokens: 2000, temperature: 0.6, messages: [{ role: 'user', content: PROMPT }] });
            stream.on('thinking', (t) => (thinking += t));
            const msg = await stream.finalMessage();
            assert.equal(msg.stop_reason, 'end_turn');
            const last = msg.content.slice(-2);
            assert.deepEqual(last.map((b) => b.type), ['thinking', 'text']);
            assert.match(last[0].thinking, /prime check/);
            assert.match(last[1].text, /def is_prime/);
            assert.ok(thinking.endsWith(last[0].thinking));
            assert.doesNotMatch(JSON.stringify(msg.content), /<\/?think>|(lambda ){6}/);
        });

        it('openai responses.stream: a reasoning item, then the clean message', T, async () => {
            const stream = openai.responses.stream({ model: 'm', input: PROMPT, temperature: 0.6, max_output_tokens: 2000 });
            const resp = await stream.finalResponse();
            assert.equal(resp.status, 'completed');
            const last = resp.output.slice(-2);
            assert.deepEqual(last.map((i) => i.type), ['reasoning', 'message']);
            assert.match(last[0].content[0].text, /prime check/);
            assert.match(resp.output_text, /def is_prime/);
            assert.doesNotMatch(JSON.stringify(resp.output), /<\/?think>|(lambda ){6}/);
        });
    });
}
