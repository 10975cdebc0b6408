// A keep-alive client whose last request and its FIN (a half-close: it still reads) arrive
// together must see the connection closed once the answer is written, not after
// client_timeout_s. libmicrohttpd 0.9.75 takes a short read as "drained" (it clears the
// socket's read readiness) and, edge-triggered, gets no new edge for a FIN that came with
// the data; the worker's own watch reports the hang-up but, between requests, leaves the
// close to libmicrohttpd (worker.c, TAG_CLIENT). Found in review of bec482e/dda5636: it
// fails before them as well (about 1 in 3 trials each, 40 trials per build).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startFake, startLoopguard, waitFor, sleep, DEADLINE, isSlowBuild } from './lib.mjs';

const SLACK = isSlowBuild ? 4 : 1;
const MSG = [{ role: 'user', content: 'Say something useful please' }];

describe('half-close after the last request', () => {
    it('the server closes a kept-alive connection whose client half-closed with its last request', DEADLINE, async () => {
        const fake = await startFake({ scenario: { pace_ms: 5, responses: [{ content: [{ varied: 4, seed: 5 }] }] } });
        // client_timeout_s far beyond the wait below: only a close on the FIN passes.
        const lg = await startLoopguard({ upstream: fake.url, config: { workers: 1, client_timeout_s: 120 } });
        try {
            const body = JSON.stringify({ messages: MSG, stream: false });
            const chat = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
            const bad = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{bad}';
            // The FIN must come with the data, before libmicrohttpd reads it: a race, so
            // several connections, each of which must be closed.
            for (let trial = 0; trial < 12; trial++) {
                const sock = net.connect(lg.port, '127.0.0.1');
                await new Promise((r) => sock.on('connect', r));
                let got = '';
                let closed = false;
                sock.setEncoding('latin1');
                sock.on('data', (d) => (got += d));
                sock.on('error', () => {});
                sock.on('close', () => (closed = true));
                sock.write(chat);
                await waitFor(() => /\}$/.test(got), 5000 * SLACK);
                await sleep(20);
                const mark = got.length;
                sock.end(bad);
                await waitFor(() => /^HTTP\/1\.1 400 /.test(got.slice(mark)), 5000 * SLACK);
                await waitFor(() => closed, 5000 * SLACK).catch(() => {});
                sock.destroy();
                assert.ok(closed, `trial ${trial}: the 400 came, the connection stayed open after the client's FIN`);
            }
        } finally {
            await lg.stop();
            await fake.stop();
        }
    });
});
