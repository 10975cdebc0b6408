// End-to-end tests of the guarded exchange, through the real loopguard binary and
// the real fake upstream. Each scenario is run streaming and whole, and every case checks
// three witnesses: what the client received, what reached the "GPU" (the fake's records:
// requests with their rid and sampling, generations with tokens_sent, abort calls) and what
// loopguard wrote down (the incident, in the file and at /loopguard/incidents, and the
// metrics).
//
// The scenarios are the shipped ones in tests/fake/scenarios (the seed's "lambda" loop,
// "What is 2+2?" repeating a sentence, a content loop after a clean preamble, "!" after
// 5,000 good tokens, a model that loops whatever the sampling). They pace their tokens
// (10 ms here, 0.2 ms for the long one) so that the number of tokens the fake produced
// before loopguard cut it off means something.
//
// Runtime: ~6 s on the plain build (most of it the 5,000-token case, twice).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import {
    startFake,
    startRawUpstream,
    startLoopguard,
    request,
    chat,
    sseJSON,
    sseData,
    assembleDeltas,
    incidents,
    jsonLines,
    metrics,
    metricValue,
    waitFor,
    normIds,
    SCENARIOS,
    cleanup,
    underValgrind,
    isSlowBuild,
    sleep,
    DEADLINE,
} from './lib.mjs';

const SEED_PROMPT = 'Write a Python function that checks if a number is prime. Be concise.';
const MODEL = '/root/models/Qwen3.6-27B';
// The field report's request, verbatim (stream added per case).
const seedBody = (extra = {}) => ({
    model: MODEL,
    messages: [{ role: 'user', content: SEED_PROMPT }],
    max_tokens: 2000,
    temperature: 0.6,
    top_p: 0.95,
    top_k: 20,
    ...extra,
});
const scenario = (name) => JSON.parse(fs.readFileSync(path.join(SCENARIOS, name), 'utf8'));
// The shipped scenarios pace at 2 ms a token. The 40-token bound is read off the fake's own
// count, which includes every token produced while loopguard was catching up; on a loaded
// 2-core machine 2 ms leaves too little room (8 ms for the 2+2 case, which needs 36 tokens
// to trip), so the tests that check it run at 10 ms a token (a fast GPU still).
const PACE_MS = 10;
const paced = (plan) => (plan.pace_ms ? { ...plan, pace_ms: PACE_MS } : plan);
const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lg-exchange-'));
process.on('exit', () => fs.rmSync(tmpDir, { recursive: true, force: true }));

const T = DEADLINE;
const UNDER_VALGRIND = underValgrind;

/* ---- local helpers --------------------------------------------------------------- */


// Tokens the fake sends for the segments before a scenario response's first repeat
// segment (its "words" tokenisation: split after each whitespace run, one token per
// varied word). That is where the loop starts, in tokens.
function tokensBeforeLoop(resp) {
    let n = 0;
    for (const seg of [...[].concat(resp.reasoning || []), ...[].concat(resp.content || [])]) {
        if (typeof seg === 'string') n += (seg.match(/[^ \n\t\r]*[ \n\t\r]+|[^ \n\t\r]+/g) || []).length;
        else if (seg.varied) n += seg.varied;
        else if (seg.tokens) n += seg.tokens.length;
        else if (seg.repeat) return n;
    }
    return n;
}

// The text a clean scenario response produces on a channel.
const planText = (segs) => [].concat(segs || []).map((s) => (typeof s === 'string' ? s : '')).join('');

// How many back-to-back copies of the loop's unit the client may see: the aim is "at most
// the first copy of the repeating unit"; the acceptance bound (and the guard's holdback, which
// releases a unit until a second copy makes the tail periodic) allows "never more than two
// consecutive 'lambda'". The tests hold every scenario to that bound.
const MAX_COPIES = 2;

// Longest run of back-to-back copies of `unit` (surrounding whitespace ignored) in text.
function maxRun(text, unit) {
    const u = unit.trim().replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    let best = 0;
    for (const m of text.matchAll(new RegExp(`(?:${u}\\s*)+`, 'g')))
        best = Math.max(best, m[0].match(new RegExp(u, 'g')).length);
    return best;
}

// SSE comment lines (": ...") of a stream body.
const comments = (text) => text.split(/\r\n|\n|\r/).filter((l) => l.startsWith(':'));

// Checks the stream is well-formed SSE ending in exactly one [DONE]: every data field is
// JSON except the last, nothing but comments or blank lines after it.
function assertWellFormedStream(text) {
    const data = sseData(text);
    assert.ok(data.length >= 1, 'stream has events');
    assert.equal(data.at(-1), '[DONE]', 'stream ends with data: [DONE]');
    assert.equal(data.filter((d) => d === '[DONE]').length, 1, 'exactly one [DONE]');
    for (const d of data.slice(0, -1)) assert.doesNotThrow(() => JSON.parse(d), `event is JSON: ${d.slice(0, 200)}`);
    assert.match(text, /data: \[DONE\]\r?\n\r?\n$/, 'nothing after [DONE]');
}

// One client request. Returns what the client got as one view for both modes:
// {status, headers, text, reasoning, content, finish, chunks}.
async function ask(lg, body, { stream, headers = {}, path: p = '/v1/chat/completions' } = {}) {
    const r = await chat(lg.url + p, { ...body, stream }, headers);
    const out = { status: r.status, headers: r.headers, text: r.text };
    if (r.status !== 200) return out;
    if (stream) {
        assertWellFormedStream(r.text);
        out.chunks = sseJSON(r.text);
        const v = assembleDeltas(out.chunks);
        Object.assign(out, { reasoning: v.reasoning_content, content: v.content, finish: v.finish_reason });
    } else {
        const j = r.json();
        const m = j.choices[0].message;
        Object.assign(out, { json: j, reasoning: m.reasoning_content || '', content: m.content || '', finish: j.choices[0].finish_reason });
    }
    return out;
}

// The fake's records split the way the assertions need them.
async function upstreamView(fake) {
    const recs = await fake.records();
    const chats = recs.filter((r) => r.kind === 'request' && r.path === '/v1/chat/completions');
    const gens = new Map(recs.filter((r) => r.kind === 'generation').map((g) => [g.rid ?? g.seq, g]));
    const aborts = recs.filter((r) => r.kind === 'abort');
    const abortCalls = recs.filter((r) => r.kind === 'request' && r.path === '/abort_request');
    return { recs, chats, gens, aborts, abortCalls };
}

// Waits for at least nChats chat requests and a generation record for each (a cut generation is recorded
// when the fake notices the close, a moment after loopguard answered).
async function settledUpstream(fake, nChats) {
    return waitFor(async () => {
        const v = await upstreamView(fake);
        return v.chats.length >= nChats && v.gens.size >= v.chats.length ? v : null;
    });
}

// The incident whose first attempt ran with `rid`, from /loopguard/incidents and from the
// JSON Lines file (written off the event loop, so polled); asserts both agree.
async function findIncident(lg, file, rid) {
    const inc = await waitFor(async () => (await incidents(lg.url)).find((i) => i.attempts?.[0]?.rid === rid));
    if (file) {
        const line = await waitFor(() => jsonLines(file).find((i) => i.attempts?.[0]?.rid === rid));
        assert.deepEqual(line, inc, 'the incident file and /loopguard/incidents hold the same record');
    }
    return inc;
}

const metricDelta = (before, after, name, labels = {}) => metricValue(after, name, labels) - metricValue(before, name, labels);

function assertClientCounters(res, stream, attempts, trips) {
    if (stream) {
        const c = comments(res.text);
        assert.ok(c.includes(`: X-Loopguard-Attempts: ${attempts}`), `stream comment X-Loopguard-Attempts: ${attempts}; got ${JSON.stringify(c)}`);
        assert.ok(c.includes(`: X-Loopguard-Trips: ${trips}`), `stream comment X-Loopguard-Trips: ${trips}; got ${JSON.stringify(c)}`);
        // The comments come before [DONE], after the last data event of the answer.
        assert.ok(res.text.lastIndexOf(': X-Loopguard-Trips') < res.text.lastIndexOf('data: [DONE]'), 'comments before [DONE]');
    } else {
        assert.equal(res.headers['x-loopguard-attempts'], String(attempts), 'X-Loopguard-Attempts header');
        assert.equal(res.headers['x-loopguard-trips'], String(trips), 'X-Loopguard-Trips header');
    }
}

// Sampling of attempt k (1-based) on the default ladder, checked on the upstream body.
function assertLadder(body, k, { kind = 'sglang', temperature = 0.6 } = {}) {
    if (k === 1) {
        assert.equal(body.temperature, temperature, 'attempt 1 keeps the client temperature');
        assert.equal(body.presence_penalty, undefined, 'attempt 1: no presence_penalty');
        assert.equal(body.repetition_penalty, undefined, 'attempt 1: no repetition_penalty');
        return;
    }
    const step = k === 2 ? { add: 0.2, pp: 1.0, rep: undefined } : { add: 0.4, pp: 1.5, rep: 1.1 };
    assert.ok(Math.abs(body.temperature - (temperature + step.add)) < 1e-9, `attempt ${k}: temperature ${temperature}+${step.add}, got ${body.temperature}`);
    assert.equal(body.presence_penalty, step.pp, `attempt ${k}: presence_penalty`);
    assert.equal(body.repetition_penalty, kind === 'openai' ? undefined : step.rep, `attempt ${k}: repetition_penalty`);
    assert.equal(typeof body.seed, 'number', `attempt ${k}: a fresh seed`);
    assert.equal(body.top_p, 0.95, 'top_p kept');
    assert.equal(body.top_k, 20, 'top_k kept');
}

/* ---- the recovered scenarios ----------------------------------------------------- */

// Each: scenario file, prompt, the repeating unit, the channel it loops in, what the
// clean answer must contain, and max_tokens (the long one needs room for 5,000 tokens).
const RECOVERED = [
    { file: 'seed_lambda.json', prompt: SEED_PROMPT, unit: 'lambda', channel: 'reasoning', answer: /def is_prime/ },
    { file: 'seed_2plus2.json', prompt: 'What is 2+2?', unit: 'The user is asking for the result of 2+2.', channel: 'reasoning', answer: /\*\*4\*\*/ },
    { file: 'content_loop.json', prompt: SEED_PROMPT, unit: 'The function returns True if the number is prime.', channel: 'content', answer: /def is_prime/ },
    { file: 'bang_after_5000.json', prompt: 'Write a long essay.', unit: '!', channel: 'content', answer: /\w+/, max_tokens: 8000 },
];

describe('guarded exchange: a loop under the original sampling is cut and retried', () => {
    let fake, lg;
    const incFile = path.join(tmpDir, 'incidents.jsonl');
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: path.join(SCENARIOS, 'seed_lambda.json') });
        lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { incidents: { path: incFile } } });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    for (const sc of RECOVERED) {
        for (const stream of [true, false]) {
            test(`${sc.file} (${stream ? 'streaming' : 'whole'})`, T, async (t) => {
                const plan = paced(scenario(sc.file));
                const looping = plan.responses[0], clean = plan.responses[1];
                await fake.setScenario(plan);
                await fake.reset();
                const m0 = await metrics(lg.url);
                const body = { ...seedBody(sc.max_tokens ? { max_tokens: sc.max_tokens } : {}), messages: [{ role: 'user', content: sc.prompt }] };
                const res = await ask(lg, body, { stream });
                assert.equal(res.status, 200, res.text.slice(0, 500));
                await fake.waitRecord((r) => r.kind === 'abort'); // attempt 1's, sent fire-and-forget
                const up = await settledUpstream(fake, 2);
                assert.equal(up.chats.length, 2, 'exactly two attempts reached the upstream');
                const [a1, a2] = up.chats;
                const inc = await findIncident(lg, incFile, a1.rid);
                const m1 = await metrics(lg.url);

                await t.test('client: clean answer, the loop never reached it', () => {
                    assert.equal(res.finish, 'stop');
                    assert.match(res.content, sc.answer, 'the clean answer');
                    const all = res.reasoning + '\n' + res.content;
                    assert.ok(maxRun(all, sc.unit) <= MAX_COPIES, `never more than ${MAX_COPIES} consecutive "${sc.unit}" (got ${maxRun(all, sc.unit)})`);
                    if (!stream) {
                        // A whole response restarts from scratch: exactly the clean attempt.
                        assert.equal(res.reasoning, planText(clean.reasoning), 'whole: reasoning is the clean attempt');
                        if (typeof clean.content[0] === 'string') assert.equal(res.content, planText(clean.content));
                    }
                    assertClientCounters(res, stream, 2, 1);
                });

                await t.test(`holdback: the client saw at most ${MAX_COPIES} copies of the unit before the cut`, () => {
                    if (!stream) return; // whole responses show nothing before the end
                    // What the client had when the loop was cut is the continuation prefix.
                    const last = a2.body.messages.at(-1);
                    assert.equal(last.role, 'assistant', 'auto mode continues a stream the client has seen');
                    const bare = last.content.replace(/^<think>\n/, '').replace(/\n<\/think>\n\n/, '');
                    assert.ok(maxRun(bare, sc.unit) <= MAX_COPIES, `at most ${MAX_COPIES} copies of "${sc.unit}" released before the cut (got ${maxRun(bare, sc.unit)}: ...${JSON.stringify(bare.slice(-120))})`);
                });

                await t.test('upstream: first attempt cut within 40 tokens of the loop, aborted by rid; retry on the next rung', () => {
                    assert.ok(a1.rid && a2.rid && a1.rid !== a2.rid, 'each attempt has its own rid');
                    assert.equal(a1.body.rid, a1.rid);
                    assertLadder(a1.body, 1);
                    assertLadder(a2.body, 2);
                    assert.equal(a1.body.stream, true, 'upstream always streamed');
                    assert.equal(a2.body.stream, true, 'upstream always streamed');
                    const g1 = up.gens.get(a1.rid), g2 = up.gens.get(a2.rid);
                    const fastPace = (looping.pace_us ?? plan.pace_us ?? 1000) < 1000;
                    // At 0.2 ms a token the fake can write all 8,000 tokens into the socket
                    // buffers before a slow build (ASan, valgrind) on a busy machine has read
                    // up to the loop; the fake then records a complete generation, and the cut
                    // shows in loopguard's own count and its abort by rid (below).
                    if (!(fastPace && isSlowBuild)) {
                        assert.notEqual(g1.ended, 'complete', 'attempt 1 was cut');
                        assert.ok(g1.client_gone || g1.aborted, 'attempt 1 released at the upstream');
                    }
                    // "Aborted within 40 tokens" of the loop: the witness is what loopguard had
                    // read when it tripped (the incident). The fake's own count adds the time the
                    // cut takes to reach it, which is scheduling, not the guard: at 10 ms a token
                    // a loaded two-core host delays it by more than 10 tokens, at 0.2 ms socket
                    // buffering alone is worth ~100, and under valgrind loopguard runs ~30x
                    // slower than the fake's clock. So the fake's count only has to show the
                    // generation stopped soon after.
                    const pre = tokensBeforeLoop(looping);
                    const seen = inc.attempts[0].tokens;
                    assert.ok(seen - pre <= 40, `attempt 1 cut within 40 tokens of the loop (${seen - pre} loop tokens read by loopguard; ${g1.tokens_sent} sent in all)`);
                    if (!UNDER_VALGRIND) assert.ok(g1.tokens_sent - pre <= 1000, `the generation stopped soon after the trip (${g1.tokens_sent - pre} loop tokens sent)`);
                    assert.equal(g2.ended, 'complete', 'attempt 2 ran to the end');
                    assert.ok(up.abortCalls.some((r) => r.body?.rid === a1.rid), 'POST /abort_request with attempt 1 rid');
                    assert.ok(up.aborts.some((r) => r.rid === a1.rid), 'abort record for attempt 1 rid');
                    assert.ok(!up.aborts.some((r) => r.rid === a2.rid), 'the clean attempt is not aborted');
                    if (stream) {
                        assert.equal(a2.body.continue_final_message, true, 'streaming auto mode continues the clean prefix');
                        assert.equal(a2.body.add_generation_prompt, undefined, 'SGLang gets no add_generation_prompt');
                    } else {
                        assert.equal(a2.body.continue_final_message, undefined, 'a whole response restarts');
                        assert.deepEqual(a2.body.messages, a1.body.messages, 'restart sends the original messages');
                    }
                });

                await t.test('incident: recovered, both attempts', () => {
                    assert.equal(inc.outcome, 'recovered');
                    assert.equal(inc.trips, 1);
                    assert.equal(inc.stream, stream);
                    assert.equal(inc.model, MODEL);
                    assert.equal(inc.endpoint, '/v1/chat/completions');
                    assert.match(inc.ts, /^\d{4}-\d\d-\d\dT/);
                    assert.ok(inc.id, 'incident id');
                    assert.equal(inc.attempts.length, 2);
                    const [i1, i2] = inc.attempts;
                    assert.equal(i1.attempt, 1);
                    assert.equal(i1.rid, a1.rid);
                    assert.ok(i1.detector, 'attempt 1 names its detector');
                    assert.equal(i1.channel, sc.channel);
                    assert.ok(i1.unit && sc.unit.includes(i1.unit.trim()), `unit ${JSON.stringify(i1.unit)} is the loop's`);
                    assert.ok(i1.repeats >= 2);
                    assert.ok(i1.tokens > 0 && i1.tokens <= up.gens.get(a1.rid).tokens_sent, 'tokens the proxy saw ≤ tokens the fake sent');
                    assert.equal(i1.sampling.temperature, 0.6);
                    assert.equal(i1.guarded, true);
                    assert.equal(i2.attempt, 2);
                    assert.equal(i2.rid, a2.rid);
                    assert.equal(i2.detector, null);
                    assert.equal(i2.sampling.presence_penalty, 1);
                    assert.ok(typeof i2.ms === 'number');
                    assert.ok(inc.excerpt.includes(sc.unit.trim()), 'the excerpt shows the loop');
                    assert.equal(inc.prompt, sc.prompt, 'the prompt excerpt (capture: excerpt)');
                });

                await t.test('metrics moved', () => {
                    assert.equal(metricDelta(m0, m1, 'loopguard_trips_total', { channel: sc.channel, detector: inc.attempts[0].detector }), 1, 'trips by detector and channel');
                    assert.equal(metricDelta(m0, m1, 'loopguard_attempts_total', { attempt: '1' }), 1);
                    assert.equal(metricDelta(m0, m1, 'loopguard_attempts_total', { attempt: '2' }), 1);
                    assert.equal(metricDelta(m0, m1, 'loopguard_outcomes_total', { outcome: 'recovered' }), 1);
                    assert.equal(metricDelta(m0, m1, 'loopguard_aborted_tokens_total'), inc.attempts[0].tokens, 'aborted tokens = attempt 1 tokens');
                    assert.equal(metricDelta(m0, m1, 'loopguard_retry_latency_seconds_count'), 1, 'one retry latency sample');
                });
            });
        }
    }

    test('always_loop.json: attempts bounded by max_attempts, content_filter end, incident failed', T, async (t) => {
        await fake.setScenario(paced(scenario('always_loop.json')));
        for (const stream of [true, false]) {
            await t.test(stream ? 'streaming' : 'whole', async () => {
                await fake.reset();
                const m0 = await metrics(lg.url);
                const res = await ask(lg, seedBody(), { stream });
                assert.equal(res.status, 200);
                assert.equal(res.finish, 'content_filter', 'documented end: finish_reason content_filter');
                if (stream) {
                    const fin = res.chunks.filter((c) => c.choices?.[0]?.finish_reason);
                    assert.equal(fin.length, 1, 'one finishing chunk');
                    assert.equal(fin[0].choices[0].finish_reason, 'content_filter');
                } else {
                    assert.equal(res.json.object, 'chat.completion');
                }
                const all = res.reasoning + res.content;
                assert.ok(maxRun(all, 'lambda') <= MAX_COPIES, `never more than ${MAX_COPIES} consecutive lambda (got ${maxRun(all, 'lambda')})`);
                assertClientCounters(res, stream, 3, 3);
                const up = await settledUpstream(fake, 3);
                assert.equal(up.chats.length, 3, 'max_attempts (3) attempts, no more');
                up.chats.forEach((c, i) => assertLadder(c.body, i + 1));
                assert.equal(new Set(up.chats.map((c) => c.rid)).size, 3, 'a new rid per attempt');
                const inc = await findIncident(lg, incFile, up.chats[0].rid);
                for (const c of up.chats) {
                    // The last abort is fire-and-forget: it may land just after the answer.
                    await fake.waitRecord((r) => r.kind === 'request' && r.path === '/abort_request' && r.body?.rid === c.rid);
                    const i = inc.attempts.find((a) => a.rid === c.rid);
                    // What loopguard read when it tripped (see the seed cases on the fake's count).
                    assert.ok(i.tokens <= 40, `cut within 40 tokens (${i.tokens} read by loopguard)`);
                    if (!UNDER_VALGRIND) assert.ok(up.gens.get(c.rid).tokens_sent <= 1000, 'the generation stopped soon after the trip');
                }
                assert.equal(inc.outcome, 'failed');
                assert.equal(inc.trips, 3);
                assert.deepEqual(inc.attempts.map((a) => a.rid), up.chats.map((c) => c.rid));
                assert.ok(inc.attempts.every((a) => a.detector), 'every attempt tripped');
                const m1 = await metrics(lg.url);
                assert.equal(metricDelta(m0, m1, 'loopguard_outcomes_total', { outcome: 'failed' }), 1);
                assert.equal(metricDelta(m0, m1, 'loopguard_trips_total'), 3);
                assert.equal(metricDelta(m0, m1, 'loopguard_attempts_total', { attempt: '3' }), 1);
            });
        }
    });

    test('text completions (/v1/completions) are guarded too', T, async (t) => {
        await fake.setScenario(scenario('seed_lambda.json'));
        const prompt = 'Write a Python function that checks if a number is prime.';
        for (const stream of [true, false]) {
            await t.test(stream ? 'streaming' : 'whole', async () => {
                await fake.reset();
                const r = await chat(lg.url + '/v1/completions', { model: MODEL, prompt, max_tokens: 2000, temperature: 0.6, top_p: 0.95, top_k: 20, stream });
                assert.equal(r.status, 200, r.text.slice(0, 300));
                let text;
                if (stream) {
                    assertWellFormedStream(r.text);
                    text = sseJSON(r.text).map((c) => c.choices?.[0]?.text || '').join('');
                } else {
                    text = r.json().choices[0].text;
                    assert.equal(r.json().choices[0].finish_reason, 'stop');
                }
                assert.match(text, /def is_prime/);
                assert.ok(maxRun(text, 'lambda') <= MAX_COPIES, `never more than ${MAX_COPIES} consecutive lambda: ${JSON.stringify(text.slice(0, 120))}`);
                assertClientCounters({ text: r.text, headers: r.headers }, stream, 2, 1);
                const up = await settledUpstream(fake, 0);
                const reqs = up.recs.filter((q) => q.kind === 'request' && q.path === '/v1/completions');
                assert.equal(reqs.length, 2);
                assertLadder(reqs[1].body, 2, { temperature: 0.6 });
                await fake.waitRecord((q) => q.kind === 'abort' && q.rid === reqs[0].rid); // attempt 1 aborted by rid
                if (stream) {
                    // Continued: the prompt grows by exactly what the client had already seen.
                    const seen = reqs[1].body.prompt.slice(prompt.length);
                    assert.equal(reqs[1].body.prompt.slice(0, prompt.length), prompt);
                    assert.ok(seen.length > 0 && text.startsWith(seen), `continued from the client's text: ${JSON.stringify(seen)}`);
                } else {
                    assert.equal(reqs[1].body.prompt, prompt, 'a whole response restarts');
                }
                const inc = await findIncident(lg, incFile, reqs[0].rid);
                assert.equal(inc.endpoint, '/v1/completions');
                assert.equal(inc.outcome, 'recovered');
                assert.equal(inc.attempts.length, 2);
            });
        }
    });

    test('clean text: no trip, no incident, no X-Loopguard comments', T, async () => {
        await fake.setScenario(scenario('clean.json'));
        await fake.reset();
        const n0 = (await incidents(lg.url)).length;
        const s = await ask(lg, seedBody(), { stream: true });
        assert.match(s.content, /def is_prime/);
        assert.equal(comments(s.text).filter((c) => c.startsWith(': X-Loopguard')).length, 0, 'no counters without a trip');
        const w = await ask(lg, seedBody(), { stream: false });
        assert.equal(w.headers['x-loopguard-trips'] ?? '0', '0');
        assert.equal((await fake.requests('/v1/chat/completions')).length, 2, 'one attempt each');
        assert.equal((await fake.requests('/abort_request')).length, 0);
        assert.equal((await incidents(lg.url)).length, n0, 'no incident for a clean exchange');
    });

    test('X-Loopguard: off is ignored unless guard.allow_client_off', T, async () => {
        await fake.setScenario(scenario('seed_lambda.json'));
        await fake.reset();
        const res = await ask(lg, seedBody(), { stream: true, headers: { 'X-Loopguard': 'off' } });
        assert.match(res.content, /def is_prime/, 'the guard still ran: clean answer');
        assert.equal((await fake.requests('/v1/chat/completions')).length, 2, 'tripped and retried');
    });
});

/* ---- attempts exhausted: the other documented ends -------------------------------- */

describe('attempts exhausted: on_exhausted error and pass_through', () => {
    let fake;
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: path.join(SCENARIOS, 'always_loop.json') });
    });
    after(() => cleanup(() => fake?.stop()));

    test('on_exhausted error, max_attempts 2: error after exactly 2 attempts', T, async (t) => {
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { retry: { max_attempts: 2, on_exhausted: 'error' } } });
        try {
            for (const stream of [true, false]) {
                await t.test(stream ? 'streaming: error event then [DONE]' : 'whole: OpenAI-style error', async () => {
                    await fake.reset();
                    const r = await chat(lg.url + '/v1/chat/completions', seedBody({ stream }));
                    if (stream) {
                        assert.equal(r.status, 200);
                        assertWellFormedStream(r.text);
                        const ev = sseJSON(r.text);
                        const err = ev.at(-1);
                        assert.ok(err.error && err.error.message, `last event is an error event: ${JSON.stringify(err)}`);
                        assert.ok(!ev.some((c) => c.choices?.[0]?.finish_reason === 'stop'));
                        assertClientCounters({ text: r.text }, true, 2, 2);
                    } else {
                        assert.ok(r.status >= 400 && r.status < 600, `error status, got ${r.status}`);
                        const j = r.json();
                        assert.equal(typeof j.error?.message, 'string', 'OpenAI error shape');
                        assertClientCounters(r, false, 2, 2);
                    }
                    const up = await settledUpstream(fake, 2);
                    assert.equal(up.chats.length, 2, 'max_attempts bounds the attempts');
                    const inc = await findIncident(lg, null, up.chats[0].rid);
                    assert.equal(inc.outcome, 'failed');
                    assert.equal(inc.attempts.length, 2);
                });
            }
        } finally {
            await lg.stop();
        }
    });

    test('on_exhausted pass_through: the last attempt runs unguarded to its end', T, async (t) => {
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { retry: { on_exhausted: 'pass_through' } } });
        try {
            for (const stream of [true, false]) {
                await t.test(stream ? 'streaming' : 'whole', async () => {
                    await fake.reset();
                    const res = await ask(lg, seedBody({ max_tokens: 120 }), { stream });
                    assert.equal(res.status, 200);
                    assert.equal(res.finish, 'length', 'the unguarded attempt ran to max_tokens');
                    assert.ok(maxRun(res.reasoning, 'lambda') > 50, 'the loop was passed through, as configured');
                    assertClientCounters(res, stream, 3, 2);
                    const up = await settledUpstream(fake, 3);
                    assert.equal(up.chats.length, 3);
                    const g3 = up.gens.get(up.chats[2].rid);
                    assert.equal(g3.ended, 'complete');
                    assert.equal(g3.tokens_sent, 120);
                    assert.ok(!up.abortCalls.some((a) => a.body?.rid === up.chats[2].rid), 'the unguarded attempt is not aborted');
                    const inc = await findIncident(lg, null, up.chats[0].rid);
                    assert.equal(inc.attempts.length, 3);
                    assert.equal(inc.attempts[2].guarded, false, 'attempt 3 recorded as unguarded');
                    assert.equal(inc.trips, 2);
                    // The client received a loop: nothing was recovered.
                    assert.equal(inc.outcome, 'failed', 'attempts ran out: outcome failed even when the last one is passed through');
                });
            }
        } finally {
            await lg.stop();
        }
    });
});

/* ---- retry modes and upstream kinds ---------------------------------------------- */

describe('retry modes: continue sends the clean prefix, restart does not', () => {
    const lambda = scenario('seed_lambda.json');
    const cleanReasoning = planText(lambda.responses[1].reasoning);

    for (const kind of ['sglang', 'vllm']) {
        test(`continue mode, ${kind} upstream (streaming and whole)`, T, async (t) => {
            const plan = { ...lambda };
            delete plan.dialect; // the kind's own dialect
            const fake = await startFake({ kind, scenario: plan });
            const lg = await startLoopguard({ upstream: fake.url, kind, config: { retry: { mode: 'continue' } } });
            try {
                for (const stream of [true, false]) {
                    await t.test(stream ? 'streaming' : 'whole', async () => {
                        await fake.reset();
                        const res = await ask(lg, seedBody(), { stream });
                        assert.equal(res.status, 200);
                        const up = await settledUpstream(fake, 2);
                        assert.equal(up.chats.length, 2);
                        const b2 = up.chats[1].body;
                        assert.equal(b2.continue_final_message, true, 'continue_final_message');
                        if (kind === 'vllm') assert.equal(b2.add_generation_prompt, false, 'vLLM also needs add_generation_prompt: false');
                        else assert.equal(b2.add_generation_prompt, undefined, 'SGLang: no add_generation_prompt');
                        const last = b2.messages.at(-1);
                        assert.equal(last.role, 'assistant');
                        assert.deepEqual(b2.messages.slice(0, -1), up.chats[0].body.messages, 'the original messages, then the prefix');
                        const bare = last.content.replace(/^<think>\n/, '');
                        assert.ok(bare.startsWith('You can use the'), `prefix is the clean reasoning so far: ${JSON.stringify(last.content)}`);
                        assert.ok(maxRun(bare, 'lambda') <= MAX_COPIES, `the loop is cut out of the prefix (${maxRun(bare, 'lambda')} copies)`);
                        // The client's reasoning goes on as if nothing happened: prefix + continuation.
                        assert.equal(res.reasoning, bare + cleanReasoning);
                        assert.match(res.content, /def is_prime/);
                        if (kind === 'vllm') {
                            assert.equal(up.chats[0].body.rid, undefined, 'no rid to vLLM');
                            assert.equal(up.abortCalls.length, 0, 'no /abort_request on vLLM');
                        }
                    });
                }
            } finally {
                await cleanup(() => lg.stop(), () => fake.stop());
            }
        });
    }

    test('restart mode: the retry is the original request with new sampling', T, async () => {
        const fake = await startFake({ kind: 'sglang', scenario: lambda });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang', config: { retry: { mode: 'restart' } } });
        try {
            const res = await ask(lg, seedBody(), { stream: true });
            assert.match(res.content, /def is_prime/);
            const up = await settledUpstream(fake, 2);
            assert.equal(up.chats[1].body.continue_final_message, undefined);
            assert.deepEqual(up.chats[1].body.messages, up.chats[0].body.messages);
            assertLadder(up.chats[1].body, 2);
        } finally {
            await cleanup(() => lg.stop(), () => fake.stop());
        }
    });

    test('generic OpenAI upstream: never repetition_penalty, no rid, no abort call', T, async () => {
        // The openai dialect has no reasoning field: loop in the content.
        const plan = {
            pace_ms: 2,
            responses: [{ match: { fields: { presence_penalty: null } }, content: ['Sure: ', { repeat: 'lambda ', times: -1 }] }, { content: [{ repeat: 'lambda ', times: -1 }] }],
        };
        const fake = await startFake({ kind: 'openai', scenario: plan });
        const lg = await startLoopguard({ upstream: fake.url, kind: 'openai' });
        try {
            const res = await ask(lg, seedBody(), { stream: true });
            assert.equal(res.finish, 'content_filter');
            const up = await settledUpstream(fake, 3);
            assert.equal(up.chats.length, 3);
            up.chats.forEach((c, i) => assertLadder(c.body, i + 1, { kind: 'openai' }));
            assert.ok(up.chats.every((c) => c.body.rid === undefined && c.body.continue_final_message === undefined), 'no SGLang/vLLM-only fields');
            assert.equal(up.abortCalls.length, 0);
        } finally {
            await cleanup(() => lg.stop(), () => fake.stop());
        }
    });
});

/* ---- operator controls ----------------------------------------------------------- */

describe('operator controls: X-Loopguard: off and per-model guard override', () => {
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: path.join(SCENARIOS, 'seed_lambda.json') });
        lg = await startLoopguard({
            upstream: fake.url,
            kind: 'sglang',
            config: { guard: { allow_client_off: true }, models: [{ pattern: '^unguarded/', guard_enabled: false }] },
        });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    // A looping request the guard does not see: one attempt that runs to max_tokens.
    async function assertUnguarded(body, headers) {
        for (const stream of [true, false]) {
            await fake.reset();
            const res = await ask(lg, body, { stream, headers });
            assert.equal(res.status, 200);
            assert.equal(res.finish, 'length');
            assert.ok(maxRun(res.reasoning, 'lambda') >= 50, 'the loop went through unguarded');
            const up = await settledUpstream(fake, 1);
            assert.equal(up.chats.length, 1, 'no retry');
            assert.equal(up.abortCalls.length, 0, 'no abort');
            if (stream) assert.ok(!comments(res.text).some((c) => c.startsWith(': X-Loopguard-Trips')));
            else assert.equal(res.headers['x-loopguard-trips'] ?? '0', '0');
        }
    }

    test('X-Loopguard: off honoured when allowed', T, async () => {
        await assertUnguarded(seedBody({ max_tokens: 80 }), { 'X-Loopguard': 'off' });
    });

    test('models[].guard_enabled false turns the guard off for matching models only', T, async () => {
        await assertUnguarded({ ...seedBody({ max_tokens: 80 }), model: 'unguarded/Qwen3.6-27B' }, {});
        await fake.reset();
        const res = await ask(lg, seedBody(), { stream: true });
        assert.match(res.content, /def is_prime/, 'other models are still guarded');
        assert.equal((await fake.requests('/v1/chat/completions')).length, 2);
    });
});

/* ---- a burst: the guard judges a worker read's tokens at once -------------------- */

// A saturated upstream's read brings dozens of tokens of a stream; loopguard feeds the guard
// their text at once at the read's end (a burst) and decides what to hold for the whole read.
// Each plan sends `before_` in the first read (libcurl's, token by token), stalls, then sends
// the rest at pace 0, as one write that the worker's next read takes whole.
describe('a burst: a worker read\'s tokens judged at once', () => {
    const before_ = 'Primes have no divisors but one and themselves. Small cases come first. ';
    const clean = 'Trial division checks candidates up to the square root of the number. ';
    const unit = 'The function returns True if the number is prime. ';
    // The fake's default tokenisation: a word with the whitespace after it.
    const words = (text) => text.match(/\S+\s*/g);
    let fake, lg;
    before(async () => {
        fake = await startFake({ kind: 'sglang', scenario: { dialect: 'sglang', responses: [{ content: ['x'] }] } });
        lg = await startLoopguard({ upstream: fake.url, kind: 'sglang' });
    });
    after(() => cleanup(() => lg?.stop(), () => fake?.stop()));

    // Attempt 1 sends `before_`, stalls, then `clean` and `loop` (cut by the guard) in a burst;
    // attempt 2 sends `answer`. Checks that the client got what it had at the cut (the retry's
    // continuation: `before_`, the burst's clean sentence, what the guard cleared of the loop)
    // and then the answer; returns that text and the first attempt's record.
    async function tripInBurst(loop, answer) {
        await fake.setScenario({
            dialect: 'sglang',
            pace_ms: 0,
            responses: [
                { match: { continue: false }, content: [before_, clean, loop], fault: { kind: 'stall', at_token: words(before_).length, ms: 300 } },
                { content: [answer] },
            ],
        });
        await fake.reset();
        const res = await ask(lg, seedBody(), { stream: true });
        assert.equal(res.status, 200, res.text.slice(0, 500));
        const up = await settledUpstream(fake, 2);
        const [a1, a2] = up.chats;
        const had = a2.body.messages.at(-1);
        assert.equal(had.role, 'assistant');
        assert.ok(had.content.startsWith(before_ + clean), `the clean text before the loop reached the client: ${JSON.stringify(had.content)}`);
        assert.equal(res.content, had.content + answer, 'then the retry\'s answer');
        assertClientCounters(res, true, 2, 1);
        const inc = (await incidents(lg.url)).find((i) => i.attempts?.[0]?.rid === a1.rid);
        return { had: had.content, inc, i1: inc.attempts[0], sent: up.gens.get(a1.rid).tokens_sent };
    }

    test('a trip inside a burst: the client gets what token by token would release, verdict and counts alike', T, async () => {
        const answer = 'Here is the function:\n\n```python\ndef is_prime(n):\n    return n > 1 and all(n % i for i in range(2, n))\n```';
        const { had, inc, i1, sent } = await tripInBurst({ repeat: unit, times: -1 }, answer);
        // At most a copy of the loop's unit reached the client before its second made the tail
        // periodic.
        assert.ok(maxRun(had, unit) <= 1, `at most the loop's first copy (${JSON.stringify(had)})`);
        assert.equal(i1.channel, 'content');
        assert.ok((unit + unit).includes(i1.unit), `the loop's unit (${JSON.stringify(i1.unit)})`);
        // The verdict's bytes are the channel's, as fed one token at a time: the loop starts after
        // the clean text, and the trip comes within the loop.
        const text = before_ + clean + unit.repeat(40);
        assert.ok(i1.loop_start >= before_.length + clean.length - unit.length && i1.loop_start <= before_.length + clean.length + unit.length, `loop_start ${i1.loop_start}`);
        assert.ok(i1.at_byte > i1.loop_start && i1.at_byte <= text.length, `at_byte ${i1.at_byte}`);
        // tokens: those up to the one the guard tripped in (the byte at_byte - 1), as per token.
        let end = 0, n = 0;
        for (const w of words(text)) {
            if (end >= i1.at_byte) break;
            end += w.length;
            n++;
        }
        assert.equal(i1.tokens, n, 'tokens read up to the tripping one');
        // The read went on past the tripping token: its tokens were judged at once (token by
        // token the parse stops at the trip, and the read's later chunks are never counted).
        assert.ok(i1.tokens_after_trip > 0, `tokens read after the trip (${i1.tokens_after_trip})`);
        assert.ok(i1.tokens + i1.tokens_after_trip <= sent, 'no token counted twice');
        // The excerpt: the released tail, then the held text up to the tripping token.
        assert.ok(inc.excerpt.endsWith(text.slice(0, end).slice(-40)), `excerpt ${JSON.stringify(inc.excerpt)}`);
        assert.ok((before_ + clean + inc.excerpt).includes(had.slice(-40)), 'the excerpt goes on from what the client had');
    });

    test('the token run trips inside a burst: it ends there, with what token by token would release', T, async () => {
        const { had, i1 } = await tripInBurst({ repeat: '!', times: -1 }, 'Done.');
        // The run's first "!" is released (nothing repeats yet), every later one held.
        assert.match(had, /^[^!]*!?$/, `at most the first "!" reached the client: ${JSON.stringify(had)}`);
        assert.equal(i1.detector, 'token_repeat');
        assert.equal(i1.unit, '!');
        assert.equal(i1.repeats, 32);
        const pre = (before_ + clean).length;
        assert.equal(i1.at_byte, pre + 32, 'at the 32nd "!"');
        assert.equal(i1.loop_start, pre);
        assert.equal(i1.tokens, words(before_ + clean).length + 32, 'tokens up to the 32nd "!"');
    });

    test('a burst that ends held: its held tokens are taken back, then released once, in order', T, async () => {
        // Two copies of a sentence end the burst. When the generation's last event ends it, the
        // guard holds a tail (a loop may be starting): the burst's tokens from its first held
        // byte on are taken back from the client's output and come with the last event,
        // released. (Fed token by token, main 27bb611 sent only the last token with it.)
        const twice = 'The number seven is prime. The number seven is prime.';
        await fake.setScenario({
            dialect: 'sglang',
            pace_ms: 0,
            responses: [{ content: [before_, clean, twice], fault: { kind: 'stall', at_token: words(before_).length, ms: 300 } }],
        });
        await fake.reset();
        const res = await ask(lg, seedBody(), { stream: true });
        assert.equal(res.status, 200, res.text.slice(0, 500));
        assert.equal(res.content, before_ + clean + twice, 'every byte once, in order');
        assert.equal(res.finish, 'stop');
        const fin = res.chunks.find((c) => c.choices?.[0]?.finish_reason);
        assert.match(fin.choices[0].delta.content || '', /The number seven is prime\.$/, 'the held tail comes with the last event');
    });
});

// A burst ends with its worker read, also when the read ends between chunks (after a
// chunk's data, inside the next size line): what is written when the read ends must have been
// judged. A raw upstream sends the head and a first token, then in one write seven clean
// tokens, five "!" tokens (the token run holds all but the first: a loop may be starting) and
// the first digit of the next chunk's size line, then, 400 ms later, the rest.
test('a burst ends with its read, when the read ends inside a chunk size line', T, async () => {
    const ev = (content, finish = null) =>
        `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: content === null ? {} : { content }, finish_reason: finish }] })}\n\n`;
    const chunk = (e) => `${Buffer.byteLength(e).toString(16)}\r\n${e}\r\n`;
    const clean = ['Seven ', 'is ', 'a ', 'prime, ', 'and ', 'so ', 'is '];
    const rest = chunk(ev(' eleven.')) + chunk(ev(null, 'stop')) + chunk('data: [DONE]\n\n') + '0\r\n\r\n';
    let sentAt = 0;
    const up = await startRawUpstream(async (c) => {
        c.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(ev('First, ')));
        await sleep(200);
        c.write([...clean, '!', '!', '!', '!', '!'].map((t) => chunk(ev(t))).join('') + rest[0]);
        sentAt = performance.now();
        await sleep(400);
        c.write(rest.slice(1));
    });
    const lg = await startLoopguard({ upstream: up.url, kind: 'vllm', config: { workers: 1 } });
    try {
        const t0 = performance.now();
        const events = await timedStream(lg.url + '/v1/chat/completions', { model: 'm', messages: [{ role: 'user', content: 'Name two primes.' }], stream: true });
        const text = (evs) => evs.filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data).choices?.[0]?.delta?.content ?? '').join('');
        // What the client had in the middle of the pause: the clean tokens and the first "!".
        const mid = events.filter((e) => t0 + e.t < sentAt + 200);
        assert.equal(text(mid), 'First, ' + clean.join('') + '!', 'the token run held during the pause');
        assert.equal(text(events), 'First, ' + clean.join('') + '!!!!! eleven.', 'then released, every byte once');
    } finally {
        await cleanup(() => lg.stop(), () => up.stop());
    }
});

/* ---- holdback: clean text is not delayed ----------------------------------------- */

// Streams `body` from `url` and returns [{t, data}] per SSE event with its arrival time.
function timedStream(url, body) {
    return new Promise((resolve, reject) => {
        const u = new URL(url);
        const t0 = performance.now();
        const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
            const events = [];
            let buf = '';
            res.setEncoding('utf8');
            res.on('data', (d) => {
                const t = performance.now() - t0;
                buf += d;
                let i;
                while ((i = buf.indexOf('\n\n')) >= 0) {
                    const ev = buf.slice(0, i);
                    buf = buf.slice(i + 2);
                    const data = ev.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
                    if (data) events.push({ t, data });
                }
            });
            res.on('end', () => resolve(events));
            res.on('error', reject);
        });
        req.on('error', reject);
        req.end(JSON.stringify(body));
    });
}

test('holdback: with clean text every event reaches the client promptly and unchanged', T, async () => {
    // Under valgrind loopguard's delay per event varies by tens of milliseconds on a busy
    // machine, so the tokens are paced further apart there.
    const PACE = UNDER_VALGRIND ? 100 : 30;
    const plan = {
        dialect: 'sglang',
        pace_ms: PACE,
        responses: [{ reasoning: ['The user wants a prime check. I will write a short function.'], content: ['```python\ndef is_prime(n):\n    return n > 1 and all(n % i for i in range(2, int(n ** 0.5) + 1))\n```'] }],
    };
    const fake = await startFake({ kind: 'sglang', scenario: plan });
    const lg = await startLoopguard({ upstream: fake.url, kind: 'sglang' });
    try {
        const body = seedBody({ stream: true, stream_options: { include_usage: true } });
        const direct = await timedStream(fake.url + '/v1/chat/completions', body);
        const via = await timedStream(lg.url + '/v1/chat/completions', body);
        // Same events in the same order, byte for byte apart from ids (the fake uses the rid
        // loopguard adds as id).
        assert.deepEqual(via.map((e) => normIds(e.data)), direct.map((e) => normIds(e.data)), 'same events, same order');
        // Promptly: each token event arrives about one pace tick after the previous one, not
        // held and released in a burst. A held channel shows up as events arriving together;
        // a loaded machine bunches a few on its own, so the direct stream is the yardstick.
        const tokenEvents = (evs) => evs.filter((e) => /"(reasoning_)?content":"[^"]/.test(e.data));
        const bunched = (evs) => evs.slice(1).filter((e, i) => e.t - evs[i].t < PACE / 3).length;
        const tv = tokenEvents(via), td = tokenEvents(direct);
        assert.ok(tv.length > 20);
        assert.ok(bunched(tv) <= bunched(td) + tv.length / 5, `${bunched(tv)} of ${tv.length} token events arrived bunched together (direct: ${bunched(td)})`);
        const span = tv.at(-1).t - tv[0].t;
        assert.ok(span >= (tv.length - 1) * PACE * 0.6, `events spread over the generation (${span.toFixed(0)} ms for ${tv.length})`);
    } finally {
        await cleanup(() => lg.stop(), () => fake.stop());
    }
});
