// Fixtures shared by the e2e suites of the Anthropic Messages and OpenAI Responses routes:
// the same fake-upstream plans drive both, so that each suite checks only its own wire shape.
import fs from 'node:fs';
import path from 'node:path';
import { SCENARIOS } from './lib.mjs';

export const MODEL = '/root/models/Qwen3.6-27B';

// A scenario file from tests/fake/scenarios, paced at `pace` ms a token.
export const scenario = (name, pace = 10) => {
    const s = JSON.parse(fs.readFileSync(path.join(SCENARIOS, name), 'utf8'));
    return { ...s, pace_ms: pace };
};
// Prose the guard never holds back (as core.test.mjs's byte-for-byte cases).
export const CLEAN = {
    model: MODEL,
    responses: [{ reasoning: ['First I consider the question. ', 'Then I recall the book.'], content: ['The answer is forty two, ', 'as everyone knows.\n', 'Ask again tomorrow.'] }],
};
export const ORIGINAL = { fields: { temperature: 0.6, presence_penalty: null, frequency_penalty: null, repetition_penalty: null } };
export const TOOL_LOOP = {
    model: MODEL,
    pace_ms: 10,
    responses: [
        { match: ORIGINAL, content: [], tool_calls: [{ name: 'search', arguments: ['{"query": "', { repeat: 'prime numbers ', times: -1 }] }] },
        { content: [], tool_calls: [{ name: 'search', arguments: '{"query": "prime"}' }] },
    ],
};
