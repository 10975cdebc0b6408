// loopguard in front of an OpenAI-compatible server this project did not write:
// @dwmkerr/mock-llm (npm, pinned in package.json), as a new user would try it. A clean
// stream must arrive event for event as the server sent it, a whole request equal in
// meaning, pass-through paths unchanged, and the official SDK must work unchanged.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { chat, deadPort, normIds, request, sse, sseJSON, assembleDeltas, startLoopguard, waitFor } from '../e2e/lib.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const MOCK = path.join(here, 'node_modules/@dwmkerr/mock-llm/dist/main.js');
const T = { timeout: 20000 };
// The mock echoes the last user message; long enough to be streamed in several chunks.
const PROMPT = 'Hello there, this is a test of streaming through a proxy that should stay out of the way.';
const BODY = { model: 'gpt-4', messages: [{ role: 'user', content: PROMPT }] };

describe('in front of @dwmkerr/mock-llm', () => {
    let mock, mockUrl, lg;

    before(async () => {
        const port = await deadPort();
        mock = spawn(process.execPath, [MOCK], {
            cwd: here,
            env: { ...process.env, HOST: '127.0.0.1', PORT: String(port) },
            stdio: ['ignore', 'pipe', 'pipe'],
        });
        let out = '', err = '';
        mock.stdout.on('data', (d) => (out += d));
        mock.stderr.on('data', (d) => (err += d));
        // A node server's start takes seconds on a loaded two-core host; one that exits (its
        // port taken meanwhile, say) says why at once.
        await waitFor(async () => {
            if (mock.exitCode !== null) throw new Error(`mock-llm exited ${mock.exitCode}: ${err || out}`);
            return /server running on/.test(out);
        }, 60000, 50);
        mockUrl = `http://127.0.0.1:${port}`;
        lg = await startLoopguard({ upstream: mockUrl, kind: 'auto' });
    });
    after(async () => {
        await lg?.stop();
        mock?.kill('SIGTERM');
    });

    it('auto-probe: the server is neither SGLang nor vLLM, so it is a generic upstream', T, async () => {
        const ups = (await request(lg.url + '/loopguard/upstreams')).json();
        assert.equal(ups[0].kind, 'openai');
    });

    it('a clean stream arrives event for event as the server sent it', T, async () => {
        const direct = await chat(mockUrl + '/v1/chat/completions', { ...BODY, stream: true });
        const via = await chat(lg.url + '/v1/chat/completions', { ...BODY, stream: true });
        assert.equal(via.status, 200);
        assert.match(via.headers['content-type'], /^text\/event-stream/);
        const d = sse(normIds(direct.text)).map((e) => e.data);
        const v = sse(normIds(via.text)).map((e) => e.data);
        assert.ok(d.length >= 3, `the server streamed ${d.length} events`);
        assert.deepEqual(v, d);
        assert.equal(assembleDeltas(sseJSON(via.text)).content, PROMPT);
    });

    it('a whole request comes back equal in meaning', T, async () => {
        const direct = (await chat(mockUrl + '/v1/chat/completions', BODY)).json();
        const r = await chat(lg.url + '/v1/chat/completions', BODY);
        assert.equal(r.status, 200);
        const via = r.json();
        assert.equal(via.object, 'chat.completion');
        assert.equal(via.choices[0].message.role, direct.choices[0].message.role);
        assert.equal(via.choices[0].message.content, direct.choices[0].message.content);
        assert.equal(via.choices[0].finish_reason, direct.choices[0].finish_reason);
        assert.equal(r.headers['x-loopguard-trips'], '0');
    });

    it('pass-through paths answer exactly as the server does', T, async () => {
        const direct = await request(mockUrl + '/v1/models');
        const via = await request(lg.url + '/v1/models');
        assert.equal(via.status, direct.status);
        assert.equal(via.text, direct.text);
    });

    it('the official openai SDK works unchanged (stream and whole)', T, async () => {
        const client = new OpenAI({ baseURL: lg.url + '/v1', apiKey: 'sk-test', maxRetries: 0 });
        let text = '';
        for await (const chunk of await client.chat.completions.create({ ...BODY, stream: true }))
            text += chunk.choices[0]?.delta?.content ?? '';
        assert.equal(text, PROMPT);
        const whole = await client.chat.completions.create(BODY);
        assert.equal(whole.choices[0].message.content, PROMPT);
        const models = await client.models.list();
        assert.ok(models.data.length >= 1);
    });
});
