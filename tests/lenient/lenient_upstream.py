#!/usr/bin/env python3
"""A deliberately lenient upstream for tests/e2e/edge.test.mjs.

It parses request heads with Python's own http.server (BaseHTTPRequestHandler, whose header
parser splits lines on a bare CR or LF as the email package does) and keeps connections
alive, as many OpenAI-compatible servers built on lenient parsers do. Every request it
parses is logged, so a test can show that nothing reaches an upstream that loopguard did
not route: GET /_lenient/log returns the log as JSON, POST /_lenient/reset clears it (the
tests call these directly, never through loopguard).

Answers: POST /v1/chat/completions streams an OpenAI chat completion whose content is
"echo:" + the last message's content (so a client can tell its own answer from anyone
else's); every other request gets its own log entry back, with "seq". The body is read by
Content-Length, or de-chunked when Transfer-Encoding is chunked.

Usage: lenient_upstream.py PORT_FILE   (binds 127.0.0.1:0, writes the port to PORT_FILE)
"""
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = []
LOCK = threading.Lock()


def read_body(h):
    if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
        out = b""
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return out
            out += h.rfile.read(size)
            h.rfile.readline()
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n > 0 else b""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, ctype, body):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self):
        body = read_body(self)
        if self.path == "/_lenient/log":
            with LOCK:
                data = json.dumps(LOG).encode()
            return self.send(200, "application/json", data)
        if self.path == "/_lenient/reset":
            with LOCK:
                LOG.clear()
            return self.send(200, "application/json", b"{}")
        with LOCK:
            LOG.append({
                "method": self.command,
                "path": self.path,
                "version": self.request_version,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body": body.decode("utf-8", "replace"),
            })
            seq = len(LOG)
        if self.command == "POST" and self.path == "/v1/chat/completions":
            return self.chat(body)
        self.send(200, "application/json", json.dumps(LOG[seq - 1] | {"seq": seq}).encode())

    def chat(self, body):
        try:
            req = json.loads(body)
            text = "echo:" + str(req["messages"][-1]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            return self.send(400, "application/json", b'{"error":{"message":"bad body"}}')
        out = b""
        for delta, finish in (({"role": "assistant", "content": text}, None), ({}, "stop")):
            chunk = {"id": "chatcmpl-lenient", "object": "chat.completion.chunk", "created": 0,
                     "model": "lenient",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            out += b"data: " + json.dumps(chunk).encode() + b"\n\n"
        out += b"data: [DONE]\n\n"
        self.send(200, "text/event-stream", out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    srv.serve_forever()


if __name__ == "__main__":
    main()
