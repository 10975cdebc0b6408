// The worker's own HTTP/1.1 on plain-HTTP upstream connections (proxy/uplink.c, worker.c's
// "the worker's own connections"): the framings it reads itself (Content-Length, a body
// until the close, no body), when a connection is kept for the next request and when not
// (Connection: close, HTTP/1.0, unasked bytes after a response), the retry of a request
// whose kept connection the upstream closed meanwhile, and an oversized response head.
// A scripted upstream answers each chat request with what the case writes, and counts the
// connections the requests came on.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startLoopguard, request, sse, assembleDeltas, sleep, cleanup, DEADLINE as T } from './lib.mjs';

const tokenEvent = (text, finish = null) =>
    `data: ${JSON.stringify({ id: 'u1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: text === null ? {} : { content: text }, finish_reason: finish }] })}\n\n`;
const STREAM = [tokenEvent('one'), tokenEvent(' two'), tokenEvent(null, 'stop'), 'data: [DONE]\n\n'].join('');
const SSE_TYPE = 'Content-Type: text/event-stream\r\n';

// Upstream: answer(sock, index of the chat request, whether its connection carried a chat
// request before) per chat request; every other request (the model probe, health checks) gets an empty JSON object.
// Requests are told apart by their Content-Length, on any split of the input.
async function scripted(answer) {
    const up = { chatConns: new Set(), chats: 0, open: new Set() };
    let nextConn = 0;
    up.server = net.createServer((sock) => {
        const id = nextConn++;
        let pending = '';
        up.open.add(sock);
        sock.on('close', () => up.open.delete(sock));
        sock.on('error', () => {});
        sock.on('data', (bytes) => {
            pending += bytes.toString('latin1');
            let split;
            while ((split = pending.indexOf('\r\n\r\n')) >= 0) {
                const head = pending.slice(0, split);
                const bodyLen = Number(head.match(/content-length:\s*(\d+)/i)?.[1] || 0);
                if (pending.length < split + 4 + bodyLen) break;
                pending = pending.slice(split + 4 + bodyLen);
                if (!/^POST \S*chat\/completions/.test(head)) {
                    sock.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}');
                    continue;
                }
                const again = up.chatConns.has(id);
                up.chatConns.add(id);
                answer(sock, up.chats++, again);
            }
        });
    });
    await new Promise((ok) => up.server.listen(0, '127.0.0.1', ok));
    return up;
}

// The upstream and a loopguard in front of it, both ended when test t ends.
async function against(t, answer) {
    const up = await scripted(answer);
    const lg = await startLoopguard({ upstream: `http://127.0.0.1:${up.server.address().port}`, kind: 'vllm', config: { workers: 1 } });
    t.after(() =>
        cleanup(
            () => lg.stop(),
            () => {
                up.open.forEach((s) => s.destroy());
                return new Promise((ok) => up.server.close(ok));
            }
        )
    );
    return { lg, up };
}

const chatOnce = (lg) =>
    request(lg.url + '/v1/chat/completions', { method: 'POST', body: { model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true }, timeout: 8000 });

// The client's view: the streamed text, whether [DONE] closed it, the error if any.
function seen(r) {
    const data = sse(r.text).map((e) => e.data);
    const json = data.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d));
    return { status: r.status, text: assembleDeltas(json.filter((j) => !j.error)).content ?? '', done: data.at(-1) === '[DONE]', error: json.find((j) => j.error)?.error };
}

async function expectClean(lg, times) {
    for (let i = 0; i < times; i++) {
        const s = seen(await chatOnce(lg));
        assert.equal(s.status, 200);
        assert.equal(s.text, 'one two');
        assert.ok(s.done && !s.error, JSON.stringify(s));
    }
}

const withLength = (extra = '') => `HTTP/1.1 200 OK\r\n${SSE_TYPE}${extra}Content-Length: ${Buffer.byteLength(STREAM)}\r\n\r\n${STREAM}`;

describe('the worker\'s own upstream connections', () => {
    test('a Content-Length answer: streamed whole, the connection kept for the next requests', T, async (t) => {
        const { lg, up } = await against(t, (sock) => sock.write(withLength()));
        await expectClean(lg, 3);
        assert.equal(up.chatConns.size, 1);
    });

    test('an HTTP/1.0 answer delimited by the close: complete, and a new connection each time', T, async (t) => {
        const { lg, up } = await against(t, (sock) => sock.end(`HTTP/1.0 200 OK\r\n${SSE_TYPE}\r\n${STREAM}`));
        await expectClean(lg, 2);
        assert.equal(up.chatConns.size, 2);
    });

    test('Connection: close is honoured even when the upstream keeps the socket open', T, async (t) => {
        const { lg, up } = await against(t, (sock) => sock.write(withLength('Connection: close\r\n')));
        await expectClean(lg, 2);
        assert.equal(up.chatConns.size, 2);
    });

    test('bytes nobody asked for after an answer: that connection is never reused', T, async (t) => {
        const { lg, up } = await against(t, (sock, n) => sock.write(withLength() + (n === 0 ? 'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nevil!' : '')));
        await expectClean(lg, 2);
        assert.equal(up.chatConns.size, 2);
    });

    test('a kept connection the upstream closed while idle: the next request goes on a new one, no error', T, async (t) => {
        const { lg, up } = await against(t, (sock) => {
            sock.write(withLength());
            setTimeout(() => sock.end(), 50);
        });
        await expectClean(lg, 1);
        await sleep(300);
        await expectClean(lg, 1);
        assert.equal(up.chatConns.size, 2);
    });

    test('a kept connection that dies as the request arrives: retried once on a new one, no error', T, async (t) => {
        const { lg, up } = await against(t, (sock, n, again) => {
            if (n === 1 && again) sock.destroy(); // the race: closed under the request
            else sock.write(withLength());
        });
        await expectClean(lg, 3);
        assert.equal(up.chats, 4); // the lost one, sent again
    });

    test('a response head past the bound: an OpenAI-style 502, and the next request is clean', T, async (t) => {
        const huge = `HTTP/1.1 200 OK\r\n${SSE_TYPE}X-Huge: ${'a'.repeat(120 * 1024)}\r\n\r\n`;
        const { lg } = await against(t, (sock, n) => sock.write(n === 0 ? huge : withLength()));
        const r = await chatOnce(lg);
        assert.equal(r.status, 502);
        assert.equal(JSON.parse(r.text).error.type, 'upstream_error');
        await expectClean(lg, 1);
    });
});
