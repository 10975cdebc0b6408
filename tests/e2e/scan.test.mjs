// `loopguard scan --records`: request/answer records (a JSON array as AlpacaEval's
// model_outputs.json, or JSONL) scanned one by one. Each record's verdict must be exactly
// the verdict of scanning its output as a plain file, with the record's index and generator
// added; bad records are reported by index and skipped without losing the others.

import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { runLoopguard, tmpFile, LOOPGUARD_BIN } from './lib.mjs';

const LOOP = 'Here is my answer.\n' + 'The box was opened and the cat was alive. '.repeat(80);
const CLEAN = 'Paris is the capital of France. It lies on the Seine.';

function lines(stdout) {
    return stdout.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

// Runs scan with `input` on stdin.
function scanStdin(args, input) {
    return new Promise((resolve, reject) => {
        const p = spawn(LOOPGUARD_BIN, ['scan', ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
        let stdout = '',
            stderr = '';
        p.stdout.on('data', (d) => (stdout += d));
        p.stderr.on('data', (d) => (stderr += d));
        p.on('error', reject);
        p.on('exit', (code) => resolve({ code, stdout, stderr }));
        p.stdin.end(input);
    });
}

describe('scan --records', () => {
    it('scans each record of a JSON array like its output as a plain file', async () => {
        const plainLoop = lines((await runLoopguard(['scan', tmpFile('loop.txt', LOOP)])).stdout)[0];
        const plainClean = lines((await runLoopguard(['scan', tmpFile('clean.txt', CLEAN)])).stdout)[0];
        assert.equal(plainLoop.tripped, true, 'the loop text trips as a plain file');
        const arr = [
            { instruction: 'Tell me about Paris.', output: CLEAN, generator: 'model-a', dataset: 'x' },
            { instruction: 'What happened to the cat?', output: LOOP, generator: 'model-a', dataset: 'x' },
        ];
        const file = tmpFile('outputs.json', '  \n' + JSON.stringify(arr, null, 2));
        const r = await runLoopguard(['scan', '--records', file]);
        assert.equal(r.code, 0, r.stderr);
        const [a, b] = lines(r.stdout);
        assert.deepEqual(a, { ...plainClean, file, record: 0, generator: 'model-a' });
        assert.deepEqual(b, { ...plainLoop, file, record: 1, generator: 'model-a' });
        assert.deepEqual(Object.keys(b).slice(0, 4), ['file', 'record', 'generator', 'bytes']);
    });

    it('reads JSONL from stdin with prompt or chat messages, skipping blank lines', async () => {
        const jsonl = [
            JSON.stringify({ prompt: 'p', output: CLEAN }),
            '',
            JSON.stringify({
                messages: [
                    { role: 'system', content: 'Be brief.' },
                    { role: 'user', content: [{ type: 'text', text: 'The cat?' }] },
                ],
                output: LOOP,
            }),
        ].join('\n');
        const r = await scanStdin(['--records', '-'], jsonl + '\n');
        assert.equal(r.code, 0, r.stderr);
        const out = lines(r.stdout);
        assert.equal(out.length, 2);
        assert.deepEqual(out.map((v) => [v.file, v.record, v.tripped, 'generator' in v]), [
            ['-', 0, false, false],
            ['-', 1, true, false],
        ]);
    });

    it('reports a bad record by index, skips it and scans the rest (exit 1)', async () => {
        const jsonl = [
            JSON.stringify({ prompt: 'p', output: CLEAN }),
            '{"prompt": "broken',
            JSON.stringify({ prompt: 'no output here' }),
            JSON.stringify([1, 2]),
            JSON.stringify({ prompt: 'p', output: LOOP }),
        ].join('\n');
        const r = await scanStdin(['--records', '-'], jsonl);
        assert.equal(r.code, 1);
        assert.match(r.stderr, /-: line 2: not a JSON record/);
        assert.match(r.stderr, /-: record 2: not an object with a string "output"/);
        assert.match(r.stderr, /-: record 3: not an object with a string "output"/);
        assert.deepEqual(lines(r.stdout).map((v) => [v.record, v.tripped]), [
            [0, false],
            [4, true],
        ]);
    });

    it('rejects a truncated JSON array', async () => {
        const r = await scanStdin(['--records', '-'], '[{"output": "x"}, {"output": "y"');
        assert.equal(r.code, 1);
        assert.match(r.stderr, /not a JSON array of records/);
        assert.equal(r.stdout, '');
    });

    it('applies --max-bytes to each record', async () => {
        const plain = lines((await runLoopguard(['scan', '--max-bytes', '100', tmpFile('loop.txt', LOOP)])).stdout)[0];
        const arr = [{ output: LOOP }, { output: LOOP }];
        const r = await scanStdin(['--records', '--max-bytes', '100', '-'], JSON.stringify(arr));
        assert.equal(r.code, 0, r.stderr);
        const out = lines(r.stdout);
        assert.deepEqual(out.map((v) => [v.record, v.bytes]), [
            [0, 100],
            [1, 100],
        ]);
        for (const v of out) assert.deepEqual(v, { ...plain, file: '-', record: v.record });
    });

    it('leaves plain mode alone: a file that starts with [ is one text', async () => {
        const file = tmpFile('array.json', JSON.stringify([{ output: LOOP }]));
        const out = lines((await runLoopguard(['scan', file])).stdout);
        assert.equal(out.length, 1);
        assert.equal('record' in out[0], false);
    });
});
