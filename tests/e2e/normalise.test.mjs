// End-to-end tests of reasoning normalisation through the real loopguard binary
// and the fake upstream: every upstream dialect in (reasoning_content, reasoning, both,
// merged deltas, <think> inline in content) × every output mode out (reasoning_content,
// reasoning, inline, hide), streaming and whole; <think> tags split at every byte; the
// template-opened tag (per-model rule), enable_thinking false, a generation truncated inside
// reasoning, a repeated </think>, history rewriting towards the upstream's field, usage kept,
// and the clean SGLang stream still byte-for-byte in the default mode.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFake, startLoopguard, usePair, request, chat, rawStream, sseData, sseJSON, assembleDeltas, incidents, waitIncident, isSlowBuild } from './lib.mjs';

const T = { timeout: isSlowBuild ? 60000 : 20000 };
const MSG = [{ role: 'user', content: 'What is the answer?' }];
const R = 'First I consider the question. Then I recall the book.';
const C = 'The answer is 42, as everyone knows.';
const REASONING = ['First I consider the question. ', 'Then I recall the book.'];
const CONTENT = ['The answer is 42, ', 'as everyone knows.'];
const MODES = ['reasoning_content', 'reasoning', 'inline', 'hide'];
const nz = (v) => v !== undefined && v !== null && v !== '';

// What a client in `mode` must see, as assembled from a stream or read from a message.
function expectView(mode, r, c) {
    switch (mode) {
        case 'reasoning_content':
            return { reasoning_content: r, reasoning: '', content: c };
        case 'reasoning':
            return { reasoning_content: '', reasoning: r, content: c };
        case 'inline':
            return { reasoning_content: '', reasoning: '', content: r ? `<think>${r}</think>\n\n${c}` : c };
        case 'hide':
            return { reasoning_content: '', reasoning: '', content: c };
    }
}

// Checks a streamed body: well-formed chunks, one id, one role, [DONE] once at the end,
// only the mode's reasoning key ever carrying text; returns the assembled view.
function checkStream(text, mode) {
    const data = sseData(text);
    assert.equal(data.at(-1), '[DONE]', 'stream ends with [DONE]');
    assert.equal(data.filter((d) => d === '[DONE]').length, 1);
    const chunks = sseJSON(text);
    assert.ok(chunks.length > 0);
    assert.equal(new Set(chunks.map((c) => c.id)).size, 1, 'one id for the whole stream');
    for (const c of chunks) {
        assert.equal(c.object, 'chat.completion.chunk');
        for (const ch of c.choices || []) {
            const d = ch.delta || {};
            if (mode !== 'reasoning_content') assert.ok(!nz(d.reasoning_content), `reasoning_content in mode ${mode}: ${JSON.stringify(c)}`);
            if (mode !== 'reasoning') assert.ok(!nz(d.reasoning), `reasoning in mode ${mode}: ${JSON.stringify(c)}`);
        }
    }
    const a = assembleDeltas(chunks);
    assert.equal(a.role, 'assistant');
    return a;
}

function checkWhole(r, mode) {
    assert.equal(r.status, 200, r.text);
    const j = r.json();
    assert.equal(j.object, 'chat.completion');
    const m = j.choices[0].message;
    assert.equal(m.role, 'assistant');
    if (mode !== 'reasoning_content') assert.ok(!nz(m.reasoning_content), `reasoning_content in mode ${mode}: ${r.text}`);
    if (mode !== 'reasoning') assert.ok(!nz(m.reasoning), `reasoning in mode ${mode}: ${r.text}`);
    return { j, view: { reasoning_content: m.reasoning_content || '', reasoning: m.reasoning || '', content: m.content || '' } };
}
const viewOf = (a) => ({ reasoning_content: a.reasoning_content, reasoning: a.reasoning, content: a.content });

// Upstream shapes: [name, fake kind, scenario response extras, dialect]
const INPUTS = [
    ['sglang', 'sglang', {}, 'sglang'],
    ['sglang-pydantic', 'sglang', {}, 'sglang-pydantic'],
    ['sglang-old', 'sglang', {}, 'sglang-old'],
    ['vllm (reasoning)', 'vllm', {}, 'vllm'],
    ['vllm-old (reasoning_content)', 'vllm', {}, 'vllm-old'],
    ['vllm-both', 'vllm', {}, 'vllm-both'],
    ['vllm merged boundary delta', 'vllm', { merge_boundary: true }, 'vllm'],
    ['vllm-both merged boundary delta', 'vllm', { merge_boundary: true }, 'vllm-both'],
    ['inline <think> in content', 'openai', {}, 'inline'],
    ['inline, tags split', 'openai', { open_tag: ['<th', 'in', 'k>'], close_tag: ['</', 'think', '>'] }, 'inline'],
    ['inline, newline after </think>', 'openai', { close_tag: ['</think>', '\n\n'] }, 'inline'],
];

describe('every dialect in x every output mode out', () => {
    const env = {};
    for (const kind of ['sglang', 'vllm', 'openai']) usePair({ fake: { kind } }, (fake, lg) => (env[kind] = { fake, lg }));

    for (const [name, kind, extra, dialect] of INPUTS) {
        for (const mode of MODES) {
            it(`${name} -> ${mode}, stream and whole`, T, async () => {
                const { fake, lg } = env[kind];
                await fake.setScenario({ dialect, responses: [{ reasoning: REASONING, content: CONTENT, ...extra }] });
                const headers = { 'X-Loopguard-Reasoning': mode };
                const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true }, headers);
                assert.equal(s.status, 200, s.text);
                const a = checkStream(s.text, mode);
                assert.deepEqual(viewOf(a), expectView(mode, R, C));
                assert.equal(a.finish_reason, 'stop');

                const w = await chat(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG }, headers);
                const { j, view } = checkWhole(w, mode);
                assert.deepEqual(view, expectView(mode, R, C));
                assert.equal(j.choices[0].finish_reason, 'stop');
            });
        }
    }

    it('tool calls after reasoning survive every output mode (sglang, vllm), stream and whole', T, async () => {
        const TOOL = { name: 'lookup', arguments: '{"q": "the answer", "limit": 3}' };
        for (const [kind, dialect] of [
            ['sglang', 'sglang'],
            ['vllm', 'vllm'],
        ]) {
            const { fake, lg } = env[kind];
            await fake.setScenario({ dialect, responses: [{ reasoning: REASONING, content: ['Let me look.'], tool_calls: [TOOL] }] });
            for (const mode of MODES) {
                const headers = { 'X-Loopguard-Reasoning': mode };
                const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true }, headers);
                const a = checkStream(s.text, mode);
                assert.deepEqual(viewOf(a), expectView(mode, R, 'Let me look.'), `${dialect} ${mode}`);
                assert.equal(a.tool_calls.length, 1);
                assert.equal(a.tool_calls[0].function.name, TOOL.name);
                assert.equal(a.tool_calls[0].function.arguments, TOOL.arguments);
                assert.equal(a.finish_reason, 'tool_calls');
                const { j, view } = checkWhole(await chat(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG }, headers), mode);
                assert.deepEqual(view, expectView(mode, R, 'Let me look.'));
                assert.equal(j.choices[0].message.tool_calls[0].function.arguments, TOOL.arguments);
                assert.equal(j.choices[0].finish_reason, 'tool_calls');
            }
        }
    });

    // Reasoning models on /v1/completions write <think>R</think>C into `text` (there is no
    // reasoning field); that first </think> is the model's own, not a leaked template token.
    it('text completions (no reasoning field) keep inline <think> text byte-for-byte', T, async () => {
        const { fake, lg } = env.sglang;
        await fake.setScenario({ dialect: 'sglang', responses: [{ reasoning: REASONING, content: CONTENT }] });
        const s = await rawStream(lg.url + '/v1/completions', { model: 'm', prompt: 'Q:', stream: true, stream_options: { include_usage: true } });
        const text = sseJSON(s.text).map((c) => c.choices[0]?.text ?? '').join('');
        assert.equal(text, `<think>${R}</think>${C}`);
        const reqs = await fake.requests('/v1/completions');
        const d = await rawStream(fake.url + '/v1/completions', reqs.at(-1).body);
        const norm = (t) => t.replace(/"created":\d+/g, '"created":0');
        assert.equal(norm(s.text), norm(d.text));
    });

    it('usage (with the reasoning token count) is kept in every mode, stream and whole', T, async () => {
        const { fake, lg } = env.sglang;
        await fake.setScenario({ dialect: 'sglang', responses: [{ reasoning: REASONING, content: CONTENT }] });
        const own = (await chat(fake.url + '/v1/chat/completions', { model: 'm', messages: MSG })).json().usage;
        assert.ok(own.reasoning_tokens > 0, 'the fake reports reasoning tokens');
        for (const mode of MODES) {
            const headers = { 'X-Loopguard-Reasoning': mode };
            const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true, stream_options: { include_usage: true } }, headers);
            const u = sseJSON(s.text).filter((c) => c.usage).at(-1)?.usage;
            assert.deepEqual(u, own, `stream usage, mode ${mode}`);
            const w = await chat(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG }, headers);
            const wu = w.json().usage;
            for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens', 'reasoning_tokens']) assert.equal(wu[k], own[k], `whole usage.${k}, mode ${mode}`);
        }
    });

    it('an unknown X-Loopguard-Reasoning value is a 400', T, async () => {
        const { lg } = env.sglang;
        const r = await chat(lg.url + '/v1/chat/completions', { messages: MSG, stream: true }, { 'X-Loopguard-Reasoning': 'sideways' });
        assert.equal(r.status, 400);
        assert.equal(typeof r.json().error.message, 'string');
    });

    for (const dialect of ['sglang', 'sglang-pydantic', 'sglang-old']) {
        it(`clean ${dialect} stream with reasoning, default mode: byte-for-byte`, T, async () => {
            const { fake, lg } = env.sglang;
            await fake.setScenario({ dialect, responses: [{ reasoning: REASONING, content: CONTENT }] });
            const body = { model: 'm', messages: MSG, stream: true, stream_options: { include_usage: true } };
            const s = await rawStream(lg.url + '/v1/chat/completions', body);
            const rec = (await fake.requests('/v1/chat/completions')).at(-1);
            const d = await rawStream(fake.url + '/v1/chat/completions', rec.body);
            const norm = (t) => t.replace(/"created":\d+/g, '"created":0');
            assert.equal(norm(s.text), norm(d.text));
        });
    }

    it('vllm stream in mode reasoning (its own field): byte-for-byte but for the random id', T, async () => {
        const { fake, lg } = env.vllm;
        await fake.setScenario({ dialect: 'vllm', responses: [{ reasoning: REASONING, content: CONTENT }] });
        const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true }, { 'X-Loopguard-Reasoning': 'reasoning' });
        const rec = (await fake.requests('/v1/chat/completions')).at(-1);
        const d = await rawStream(fake.url + '/v1/chat/completions', { ...rec.body, stream_options: undefined });
        const norm = (t) => t.replace(/"created":\d+/g, '"created":0').replace(/"id":"[^"]*"/g, '"id":"X"');
        assert.equal(norm(s.text), norm(d.text));
    });
});

describe('<think> tags in content', () => {
    let fake, lg, lgRule, lgOff;
    before(async () => {
        fake = await startFake({ kind: 'openai', dialect: 'openai' });
        lg = await startLoopguard({ upstream: fake.url });
        lgOff = await startLoopguard({ upstream: fake.url, config: { guard: { enabled: false }, models: [{ pattern: '^qwen3\\.6', think_opened: true }] } });
        lgRule = await startLoopguard({ upstream: fake.url, config: { models: [{ pattern: '^qwen3\\.6', think_opened: true }] } });
    });
    after(async () => {
        await lg?.stop();
        await lgRule?.stop();
        await lgOff?.stop();
        await fake?.stop();
    });

    // The whole text a model without a server-side parser writes, cut into two content
    // tokens at every byte position (a UTF-8 character is never cut: the fake keeps JSON
    // strings valid, so splits inside "é" are skipped).
    const TEXT = `<think>${R} Déjà vu.</think>\n\n${C}`;
    const RR = `${R} Déjà vu.`;
    it('split into two tokens at every byte position: same reasoning and content, stream and whole', T, async () => {
        const buf = Buffer.from(TEXT);
        let tried = 0;
        for (let i = 1; i < buf.length; i++) {
            if ((buf[i] & 0xc0) === 0x80) continue; // inside a UTF-8 character
            const toks = [buf.subarray(0, i).toString(), buf.subarray(i).toString()];
            await fake.setScenario({ dialect: 'openai', responses: [{ content: [{ tokens: toks }] }] });
            const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
            const a = checkStream(s.text, 'reasoning_content');
            assert.deepEqual(viewOf(a), expectView('reasoning_content', RR, C), `split at ${i}: ${JSON.stringify(toks)}`);
            tried++;
        }
        assert.ok(tried > 60);
        await fake.setScenario({ dialect: 'openai', responses: [{ content: [{ tokens: [TEXT] }] }] });
        const { view } = checkWhole(await chat(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG }), 'reasoning_content');
        assert.deepEqual(view, expectView('reasoning_content', RR, C));
    });

    it('one byte per token (every tag cut everywhere), every output mode', T, async () => {
        await fake.setScenario({ dialect: 'openai', responses: [{ content: [TEXT], tokens: 'chars' }] });
        for (const mode of MODES) {
            const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true }, { 'X-Loopguard-Reasoning': mode });
            assert.deepEqual(viewOf(checkStream(s.text, mode)), expectView(mode, RR, C), mode);
        }
    });

    it('inline dialect: close tag cut at every byte position', T, async () => {
        const tag = '</think>';
        for (let i = 1; i < tag.length; i++) {
            await fake.setScenario({ dialect: 'inline', responses: [{ reasoning: REASONING, content: CONTENT, close_tag: [tag.slice(0, i), tag.slice(i)] }] });
            const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
            assert.deepEqual(viewOf(checkStream(s.text, 'reasoning_content')), expectView('reasoning_content', R, C), `close tag split at ${i}`);
        }
        const open = '<think>';
        for (let i = 1; i < open.length; i++) {
            await fake.setScenario({ dialect: 'inline', responses: [{ reasoning: REASONING, content: CONTENT, open_tag: [open.slice(0, i), open.slice(i)] }] });
            const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
            assert.deepEqual(viewOf(checkStream(s.text, 'reasoning_content')), expectView('reasoning_content', R, C), `open tag split at ${i}`);
        }
    });

    it('content that merely mentions <think> later stays content', T, async () => {
        const text = 'Use the <think> tag to open a block.';
        await fake.setScenario({ dialect: 'openai', responses: [{ content: [text] }] });
        const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
        const a = checkStream(s.text, 'reasoning_content');
        assert.equal(a.reasoning_content, '');
        assert.equal(a.content, text);
    });

    it('missing open tag (template opened it): model rule think_opened splits the stream', T, async () => {
        await fake.setScenario({ dialect: 'inline', responses: [{ reasoning: REASONING, content: CONTENT, open_tag: false }] });
        for (const mode of MODES) {
            const s = await rawStream(lgRule.url + '/v1/chat/completions', { model: 'qwen3.6-27b', messages: MSG, stream: true }, { 'X-Loopguard-Reasoning': mode });
            assert.deepEqual(viewOf(checkStream(s.text, mode)), expectView(mode, R, C), mode);
            const { view } = checkWhole(await chat(lgRule.url + '/v1/chat/completions', { model: 'qwen3.6-27b', messages: MSG }, { 'X-Loopguard-Reasoning': mode }), mode);
            assert.deepEqual(view, expectView(mode, R, C), `whole ${mode}`);
        }
    });

    // A template-opened reasoning block (no <think> in the output) cannot be told apart while
    // streaming, but a whole response can be split in hindsight at its </think>.
    it('missing open tag without a rule: a whole response is split in hindsight (guard off)', T, async () => {
        await fake.setScenario({ dialect: 'inline', responses: [{ reasoning: REASONING, content: CONTENT, open_tag: false }] });
        const { view } = checkWhole(await chat(lgOff.url + '/v1/chat/completions', { model: 'other-model', messages: MSG }), 'reasoning_content');
        assert.deepEqual(view, expectView('reasoning_content', R, C));
    });

    it('missing open tag without a rule: a whole response is split in hindsight (guard on, no leak trip)', T, async () => {
        await fake.setScenario({ dialect: 'inline', responses: [{ reasoning: REASONING, content: CONTENT, open_tag: false }] });
        const { j, view } = checkWhole(await chat(lg.url + '/v1/chat/completions', { model: 'other-model', messages: MSG }), 'reasoning_content');
        assert.deepEqual(view, expectView('reasoning_content', R, C));
        assert.equal(j.choices[0].finish_reason, 'stop');
    });

    it('the rule matches only its models: another model streams plain content unchanged', T, async () => {
        await fake.setScenario({ dialect: 'openai', responses: [{ content: CONTENT }] });
        const s = await rawStream(lgRule.url + '/v1/chat/completions', { model: 'llama-3', messages: MSG, stream: true });
        assert.deepEqual(viewOf(checkStream(s.text, 'reasoning_content')), expectView('reasoning_content', '', C));
    });

    it('enable_thinking false: no reasoning even for a think_opened model', T, async () => {
        await fake.setScenario({ dialect: 'openai', responses: [{ content: CONTENT }] });
        const body = { model: 'qwen3.6-27b', messages: MSG, chat_template_kwargs: { enable_thinking: false } };
        const s = await rawStream(lgRule.url + '/v1/chat/completions', { ...body, stream: true });
        assert.deepEqual(viewOf(checkStream(s.text, 'reasoning_content')), expectView('reasoning_content', '', C));
        const { view } = checkWhole(await chat(lgRule.url + '/v1/chat/completions', body), 'reasoning_content');
        assert.deepEqual(view, expectView('reasoning_content', '', C));
        const rec = (await fake.requests('/v1/chat/completions')).at(-1);
        assert.deepEqual(rec.body.chat_template_kwargs, { enable_thinking: false }, 'chat_template_kwargs forwarded');
    });

    // A reasoning cut by the client's max_tokens: finish_reason length, the text stays
    // reasoning. Checked with the guard off (pure normalisation) and on (where the guard
    // must not turn an honest truncation into retries).
    const LONG = ['Step one is to read. ', 'Step two is to think hard about it. ', 'Step three is to check every case carefully.'];
    const TRUNC = 'Step one is to read. Step two is to ';
    async function truncated(l, model, open, max) {
        await fake.setScenario({ dialect: 'inline', responses: [{ reasoning: LONG, content: CONTENT, open_tag: open }] });
        const s = await rawStream(l.url + '/v1/chat/completions', { model, messages: MSG, stream: true, max_tokens: max });
        const a = checkStream(s.text, 'reasoning_content');
        assert.equal(a.finish_reason, 'length');
        assert.deepEqual(viewOf(a), expectView('reasoning_content', TRUNC, ''), `stream, open tag ${open}`);
        const { j, view } = checkWhole(await chat(l.url + '/v1/chat/completions', { model, messages: MSG, max_tokens: max }), 'reasoning_content');
        assert.equal(j.choices[0].finish_reason, 'length');
        assert.deepEqual(view, expectView('reasoning_content', TRUNC, ''), `whole, open tag ${open}`);
    }
    // inline with its <think> token: 1 + 9 reasoning tokens; opened by the template: 9.
    it('truncated by max_tokens before </think>: stays reasoning (guard off)', T, async () => {
        await truncated(lgOff, 'm', true, 10);
        await truncated(lgOff, 'qwen3.6-27b', false, 9);
    });

    it('truncated reasoning in every output mode: stream and whole agree', T, async () => {
        await fake.setScenario({ dialect: 'inline', responses: [{ reasoning: LONG, content: CONTENT }] });
        for (const mode of MODES) {
            const headers = { 'X-Loopguard-Reasoning': mode };
            const s = await rawStream(lgOff.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true, max_tokens: 10 }, headers);
            assert.deepEqual(viewOf(checkStream(s.text, mode)), expectView(mode, TRUNC, ''), `stream ${mode}`);
            const { view } = checkWhole(await chat(lgOff.url + '/v1/chat/completions', { model: 'm', messages: MSG, max_tokens: 10 }, headers), mode);
            assert.deepEqual(view, expectView(mode, TRUNC, ''), `whole ${mode}`);
        }
    });

    it('truncated by max_tokens before </think>: stays reasoning, finish length (guard on)', T, async () => {
        await truncated(lg, 'm', true, 10);
        await truncated(lgRule, 'qwen3.6-27b', false, 9);
    });
});

describe('a repeated </think>', () => {
    let fake, ofake, lgOff, lgOn, lgOpenai;
    const SCEN = {
        dialect: 'openai',
        responses: [
            { match: { fields: { presence_penalty: null } }, content: [{ tokens: ['<think>', 'Reasoning here.', '</think>', '\n\nAnswer part. ', 'More thought.', '</think>', ' Final.'] }] },
            // A continuation of the clean prefix (what loopguard sends once text reached the
            // client) gets the rest only; a restart gets a whole clean answer.
            { match: { continue: true }, content: [' Final clean.'] },
            { content: [{ tokens: ['<think>', 'Reasoning here.', '</think>', '\n\nClean answer.'] }] },
        ],
    };
    before(async () => {
        fake = await startFake({ kind: 'vllm', scenario: SCEN });
        ofake = await startFake({ kind: 'openai', scenario: SCEN });
        lgOff = await startLoopguard({ upstream: fake.url, config: { guard: { enabled: false } } });
        lgOn = await startLoopguard({ upstream: fake.url });
        lgOpenai = await startLoopguard({ upstream: ofake.url });
    });
    after(async () => {
        for (const p of [lgOff, lgOn, lgOpenai, fake, ofake]) await p?.stop();
    });

    it('guard off: the first splits, the second stays in content', T, async () => {
        const s = await rawStream(lgOff.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
        const a = checkStream(s.text, 'reasoning_content');
        assert.equal(a.reasoning_content, 'Reasoning here.');
        assert.equal(a.content, 'Answer part. More thought.</think> Final.');
    });

    it('guard on: the second </think> trips leak, the clean prefix is continued', T, async () => {
        await fake.reset();
        const seen = await incidents(lgOn.url);
        const s = await rawStream(lgOn.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
        const a = checkStream(s.text, 'reasoning_content');
        assert.equal(a.reasoning_content, 'Reasoning here.');
        assert.equal(a.content, 'Answer part. More thought. Final clean.');
        const last = await waitIncident(lgOn.url, seen);
        assert.equal(last.attempts[0].detector, 'leak');
        assert.equal(last.attempts[0].channel, 'content');
        assert.equal(last.attempts[0].unit, '</think>');
        assert.equal(last.outcome, 'recovered');
        const reqs = await fake.requests('/v1/chat/completions');
        assert.equal(reqs.length, 2);
        const lastMsg = reqs[1].body.messages.at(-1);
        assert.equal(lastMsg.role, 'assistant');
        assert.ok(reqs[1].body.continue_final_message === true, JSON.stringify(reqs[1].body));
        assert.match(JSON.stringify(lastMsg), /Answer part\. More thought\./);
        assert.doesNotMatch(JSON.stringify(lastMsg), /Final\.|<\/think>\s*Final/);
    });

    // A generic OpenAI upstream cannot continue a prefix, so loopguard restarts; the first
    // attempt's reasoning and "Answer part. More thought." had already been streamed.
    it('guard on, generic openai upstream (restart): the client sees nothing twice', { ...T, todo: 'restart after text reached the client: the reasoning and the answer are streamed twice' }, async () => {
        const s = await rawStream(lgOpenai.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
        const a = checkStream(s.text, 'reasoning_content');
        assert.ok(!a.content.includes('</think>'), `leak reached the client: ${a.content}`);
        assert.equal(a.reasoning_content, 'Reasoning here.');
        assert.doesNotMatch(a.content, /Answer part\..*Clean answer/s);
    });
});

// The guard gets reasoning and content as separate channels whatever the dialect: a loop in
// the reasoning trips on channel "reasoning", a finished generation with reasoning and no
// answer trips empty_answer, and the client ends with the clean retry in its own mode.
describe('the guard sees the same channels in every dialect', () => {
    const CASES = [
        ['sglang', 'sglang', {}, 'm'],
        ['vllm', 'vllm', {}, 'm'],
        ['vllm', 'vllm-both', {}, 'm'],
        ['openai', 'inline', {}, 'm'],
        ['openai', 'inline', { open_tag: false }, 'qwen3.6-27b'],
    ];
    const env = {};
    for (const kind of ['sglang', 'vllm', 'openai'])
        usePair({ fake: { kind }, lg: { config: { models: [{ pattern: '^qwen3\\.6', think_opened: true }] } } }, (fake, lg) => (env[kind] = { fake, lg }));

    for (const [kind, dialect, extra, model] of CASES) {
        it(`${dialect}${extra.open_tag === false ? ' (template-opened)' : ''}: reasoning loop -> repeat on reasoning; no answer -> empty_answer`, T, async () => {
            const { fake, lg } = env[kind];
            await fake.setScenario({
                dialect,
                responses: [
                    { match: { fields: { presence_penalty: null }, prompt_contains: 'loop' }, reasoning: ['Start. ', { repeat: 'lambda ', times: -1 }], content: ['x'], ...extra },
                    { match: { fields: { presence_penalty: null }, prompt_contains: 'empty' }, reasoning: ['I thought about it carefully.'], content: [], ...extra },
                    { reasoning: ['Clean thought.'], content: ['Clean answer.'], ...extra },
                ],
            });
            for (const [prompt, detector, channel] of [
                ['loop', 'repeat', 'reasoning'],
                ['empty', 'empty_answer', 'content'],
            ]) {
                for (const stream of [true, false]) {
                    const body = { model, messages: [{ role: 'user', content: prompt }], stream, max_tokens: 3000 };
                    const seen = await incidents(lg.url);
                    const r = await chat(lg.url + '/v1/chat/completions', body);
                    const view = stream ? checkStream(r.text, 'reasoning_content') : checkWhole(r, 'reasoning_content').view;
                    assert.equal(view.content, 'Clean answer.', `${prompt} stream ${stream}`);
                    assert.doesNotMatch(view.reasoning_content, /(lambda ){3}/);
                    if (!stream) assert.equal(view.reasoning_content, 'Clean thought.');
                    const inc = await waitIncident(lg.url, seen);
                    assert.equal(inc.outcome, 'recovered');
                    assert.equal(inc.attempts[0].detector, detector, JSON.stringify(inc.attempts[0]));
                    assert.equal(inc.attempts[0].channel, channel);
                }
            }
        });
    }
});

describe('reasoning in the request history', () => {
    const HIST = [
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello.', reasoning_content: 'They greet me.' },
        { role: 'assistant', content: 'Hello again.', reasoning: 'Still greeting.' },
        { role: 'user', content: 'What is the answer?' },
    ];
    const procs = [];
    after(async () => {
        for (const p of procs.reverse()) await p.stop();
    });
    async function upstreamMessages(kind, config = {}) {
        const fake = await startFake({ kind });
        procs.push(fake);
        const lg = await startLoopguard({ upstream: fake.url, config });
        procs.push(lg);
        const r = await chat(lg.url + '/v1/chat/completions', { model: 'm', messages: HIST });
        assert.equal(r.status, 200, r.text);
        return (await fake.requests('/v1/chat/completions')).at(-1).body.messages;
    }

    it('vllm: reasoning_content moved to reasoning (vLLM >= 0.17 drops reasoning_content)', T, async () => {
        const m = await upstreamMessages('vllm');
        assert.deepEqual(m[1], { role: 'assistant', content: 'Hello.', reasoning: 'They greet me.' });
        assert.deepEqual(m[2], { role: 'assistant', content: 'Hello again.', reasoning: 'Still greeting.' });
        assert.deepEqual(m[0], HIST[0]);
        assert.deepEqual(m[3], HIST[3]);
    });

    it('sglang: reasoning moved to reasoning_content', T, async () => {
        const m = await upstreamMessages('sglang');
        assert.deepEqual(m[1], { role: 'assistant', content: 'Hello.', reasoning_content: 'They greet me.' });
        assert.deepEqual(m[2], { role: 'assistant', content: 'Hello again.', reasoning_content: 'Still greeting.' });
    });

    it('generic openai upstream: the history is forwarded as sent', T, async () => {
        const m = await upstreamMessages('openai');
        assert.deepEqual(m, HIST);
    });

    it('reasoning.history drop removes it; keep forwards it as sent', T, async () => {
        const d = await upstreamMessages('vllm', { reasoning: { history: 'drop' } });
        assert.deepEqual(d[1], { role: 'assistant', content: 'Hello.' });
        assert.deepEqual(d[2], { role: 'assistant', content: 'Hello again.' });
        const k = await upstreamMessages('vllm', { reasoning: { history: 'keep' } });
        assert.deepEqual(k, HIST);
    });
});

describe('configured output mode', () => {
    let fake, lg, lgFixed;
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: { responses: [{ reasoning: REASONING, content: CONTENT }] } });
        lg = await startLoopguard({ upstream: fake.url, config: { reasoning: { output: 'inline' } } });
        lgFixed = await startLoopguard({ upstream: fake.url, config: { reasoning: { output: 'hide', allow_client_choice: false } } });
    });
    after(async () => {
        await lg?.stop();
        await lgFixed?.stop();
        await fake?.stop();
    });

    it('reasoning.output inline applies to streams and whole responses; the header overrides it', T, async () => {
        const s = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true });
        assert.deepEqual(viewOf(checkStream(s.text, 'inline')), expectView('inline', R, C));
        const { view } = checkWhole(await chat(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG }), 'inline');
        assert.deepEqual(view, expectView('inline', R, C));
        const h = await rawStream(lg.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true }, { 'X-Loopguard-Reasoning': 'reasoning' });
        assert.deepEqual(viewOf(checkStream(h.text, 'reasoning')), expectView('reasoning', R, C));
    });

    it('allow_client_choice false: the header is ignored', T, async () => {
        const s = await rawStream(lgFixed.url + '/v1/chat/completions', { model: 'm', messages: MSG, stream: true }, { 'X-Loopguard-Reasoning': 'reasoning_content' });
        assert.deepEqual(viewOf(checkStream(s.text, 'hide')), expectView('hide', R, C));
        const r = await request(lgFixed.url + '/v1/chat/completions', { method: 'POST', body: { model: 'm', messages: MSG } });
        assert.deepEqual(checkWhole(r, 'hide').view, expectView('hide', R, C));
    });
});

