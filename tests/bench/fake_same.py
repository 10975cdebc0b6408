#!/usr/bin/env python3
"""fake_same.py OLD_BIN NEW_BIN — do two fake_upstream builds write the same bytes?

fake_same.sh runs it. Starts both binaries with the same flags (each kind, with and
without --stamp, /generate incremental), loads the same scenario into both (every dialect
in turn; responses with reasoning, tool calls, escapes and non-ASCII text, each
tokenisation and segment kind, merge_boundary, inline tags, stop values, every fault),
sends every request to both (each endpoint, whole and streamed, with and without usage, a
cap that cuts, rid/request_id, /generate batches, the helpers and errors; one connection
each, Connection: close, read to EOF or RST) and compares the whole response (status line,
headers, chunk framing, bodies) after normalising only what differs between two runs of
one build: the date header, "created"/"created_at" seconds, stamp nanoseconds,
e2e_latency, records' times (and so their length) and the random hex ids (each distinct
id becomes H1, H2, ... in order of appearance, so equal ids stay equal). Exit 0 when no
response differs; prints the count of requests and bytes compared."""
import itertools
import json
import re
import socket
import subprocess
import sys

OLD, NEW = sys.argv[1], sys.argv[2]

def start(binary, flags):
    """Starts binary listening on a free port; returns (process, port)."""
    p = subprocess.Popen([binary, '--listen', '127.0.0.1:0'] + flags, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    m = re.match(r'listening on 127\.0\.0\.1:(\d+)', line)
    assert m, line
    return p, int(m.group(1))

def raw(port, method, path, body=None, headers=()):
    """Every byte of the answer to one request on a connection of its own ('<RST>' marks
    a reset)."""
    data = b'' if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = f'{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n'
    for h in headers:
        req += h + '\r\n'
    if body is not None:
        req += f'content-type: application/json\r\ncontent-length: {len(data)}\r\n'
    s = socket.create_connection(('127.0.0.1', port))
    s.settimeout(10)
    s.sendall(req.encode() + b'\r\n' + data)
    out = b''
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except ConnectionResetError:
        out += b'<RST>'
    s.close()
    return out

HEX = re.compile(rb'[0-9a-f]{24,}')

def norm(b):
    """b with what differs between two runs of one build replaced by placeholders."""
    b = re.sub(rb'date: [^\r]*\r\n', b'date: D\r\n', b)
    b = re.sub(rb'"created(_at)?":\d+', rb'"created\1":T', b)
    b = re.sub(rb'w\d{12,}', b'wN', b)  # the chunk sizes stay: same width unless the clock
    # passes a power of ten between the two runs
    b = re.sub(rb'"e2e_latency":\d+\.\d{6}', b'"e2e_latency":L', b)
    b = re.sub(rb'"(at_ms|ms)":\d+\.\d{3}', rb'"\1":M', b)
    ids = {}
    return HEX.sub(lambda m: ids.setdefault(m.group(0), b'H%d' % (len(ids) + 1)), b)

# bytes: both builds' answers; records: of which the /_fake/records arrays
stats = {'requests': 0, 'bytes': 0, 'records': 0, 'diffs': 0}

def both(ports, method, path, body=None, headers=(), label=''):
    """Sends one request to both builds and compares their answers."""
    a = raw(ports[0], method, path, body, headers)
    b = raw(ports[1], method, path, body, headers)
    stats['requests'] += 1
    stats['bytes'] += len(a) + len(b)
    if path == '/_fake/records':
        stats['records'] += len(a) + len(b)
        # times of varying width: the length varies with them
        a, b = (re.sub(rb'content-length: \d+', b'content-length: CL', x) for x in (a, b))
    if norm(a) != norm(b):
        stats['diffs'] += 1
        if stats['diffs'] <= 5:
            na, nb = norm(a), norm(b)
            i = next((k for k in range(min(len(na), len(nb))) if na[k] != nb[k]),
                     min(len(na), len(nb)))
            shown = json.dumps(body)[:200] if not isinstance(body, bytes) else body
            print(f'DIFF {label} {method} {path} {shown}\n'
                  f' old: {na[max(0, i - 150):i + 150]!r}\n new: {nb[max(0, i - 150):i + 150]!r}')

TRICKY = 'def f(x):\n\treturn "q\\\\" é ü 😀 \u0001\u001f\b\f\r end '
RESPONSES = [
    {'match': {'header': {'x-case': 'plain'}}, 'reasoning': ['You can use the ', {'repeat': 'lambda ', 'times': 5}],
     'content': [TRICKY, 'more words here ']},
    {'match': {'header': {'x-case': 'tools'}}, 'reasoning': 'think a bit ', 'content': 'calling now ',
     'tool_calls': [{'name': 'get_weather', 'arguments': '{"city": "Paris \\"é\\"", "n": 1}'},
                    {'name': 'f2', 'id': 'call_fixed', 'arguments': '{}'}]},
    {'match': {'header': {'x-case': 'toolsonly'}}, 'tool_calls': [{'name': 'g', 'arguments': '{"a":[1,2]}'}]},
    {'match': {'header': {'x-case': 'merge'}}, 'reasoning': 'r1 r2 r3 ', 'content': 'c1 c2 ', 'merge_boundary': True},
    {'match': {'header': {'x-case': 'mergetool'}}, 'reasoning': 'r1 ', 'merge_boundary': True,
     'tool_calls': [{'name': 'h', 'arguments': '{"x":1}'}]},
    {'match': {'header': {'x-case': 'chars'}}, 'tokens': 'chars', 'reasoning': 'ab"c', 'content': 'héllo 😀\n"\\'},
    {'match': {'header': {'x-case': 'bytes'}}, 'tokens': {'bytes': 2}, 'content': 'aé😀bcdefghü\u0007'},
    {'match': {'header': {'x-case': 'segs'}}, 'reasoning': [{'tokens': ['<a', 'b>']}],
     'content': [{'tokens': ['x', '"y"', '']}, {'varied': 30, 'seed': 7}, {'stamp_tokens': 4}, 'tail ']},
    {'match': {'header': {'x-case': 'stops'}}, 'content': 'a b c ', 'stop_reason': '</s>', 'matched_stop': '<|im_end|>'},
    {'match': {'header': {'x-case': 'stopnum'}}, 'content': 'a b c ', 'stop_reason': 42, 'matched_stop': 7,
     'prompt_tokens': 33},
    {'match': {'header': {'x-case': 'finish'}}, 'content': 'a b ', 'finish_reason': 'content_filter'},
    {'match': {'header': {'x-case': 'inline0'}}, 'reasoning': 'r1 r2 ', 'content': '\n\nans ', 'open_tag': False},
    {'match': {'header': {'x-case': 'inlinetags'}}, 'reasoning': 'r1 r2 ', 'content': 'ans ',
     'open_tag': ['<th', 'ink>'], 'close_tag': ['</th', 'ink>']},
    {'match': {'header': {'x-case': 'empty'}}, 'content': []},
    {'match': {'header': {'x-case': 'onlyreason'}}, 'reasoning': 'just thinking ', 'content': []},
    {'match': {'header': {'x-case': 'f_error'}}, 'content': 'a b c d ',
     'fault': {'kind': 'error_event', 'at_token': 2, 'message': 'boom é 😀 "q"\n', 'status': 503}},
    {'match': {'header': {'x-case': 'f_error0'}}, 'content': 'a b c d ', 'fault': {'kind': 'error_event'}},
    {'match': {'header': {'x-case': 'f_garbage'}}, 'content': 'a b c d ', 'fault': {'kind': 'garbage', 'at_token': 1}},
    {'match': {'header': {'x-case': 'f_http'}}, 'content': 'a ',
     'fault': {'kind': 'http_status', 'status': 503, 'message': 'busy "é"', 'type': 'ServiceUnavailable'}},
    {'match': {'header': {'x-case': 'f_http0'}}, 'content': 'a ', 'fault': {'kind': 'http_status'}},
    {'match': {'header': {'x-case': 'f_notsse'}}, 'content': 'a ', 'fault': {'kind': 'not_sse'}},
    {'match': {'header': {'x-case': 'f_trunc'}}, 'content': 'a b c d ', 'fault': {'kind': 'truncated_chunked', 'at_token': 2}},
    {'match': {'header': {'x-case': 'f_close'}}, 'content': 'a ', 'fault': {'kind': 'close_before_headers'}},
    {'match': {'header': {'x-case': 'f_reset'}}, 'content': 'a b c d ', 'fault': {'kind': 'reset', 'at_token': 2}},
    {'match': {'header': {'x-case': 'f_stall'}}, 'content': 'a b c d ', 'fault': {'kind': 'stall', 'at_token': 1, 'ms': 20}},
    {'match': {'header': {'x-case': 'f_slow'}}, 'content': 'a b ', 'fault': {'kind': 'slow_start', 'ms': 10}},
    {'match': {'header': {'x-case': 'long'}}, 'reasoning': {'repeat': 'think ', 'times': 300},
     'content': [{'varied': 700, 'seed': 3}]},
    {'match': {'header': {'x-case': 'nth'}, 'nth': 2}, 'content': 'second '},
]
CASES = [r['match']['header']['x-case'] for r in RESPONSES] + ['nomatch']

def bodies(ep, stream, usage, cap, ids):
    """The request body for endpoint ep."""
    msgs = [{'role': 'user', 'content': 'hi there, is 7 prime?'}]
    extra = {}
    if stream:
        extra['stream'] = True
        if usage:
            extra['stream_options'] = {'include_usage': True}
    if ep == '/v1/chat/completions':
        b = {'model': 'm-é', 'messages': msgs, **extra}
        if cap: b['max_tokens'] = cap
    elif ep == '/v1/completions':
        b = {'model': 'm', 'prompt': 'hi there', **extra}
        if cap: b['max_tokens'] = cap
    elif ep == '/v1/messages':
        b = {'model': 'claude', 'messages': msgs, 'max_tokens': cap or 4096, **extra}
        b.pop('stream_options', None)
    elif ep == '/v1/responses':
        b = {'model': 'r', 'input': 'hi', **extra}
        b.pop('stream_options', None)
        if cap: b['max_output_tokens'] = cap
    else:
        b = {'text': 'hi there', 'sampling_params': {'max_new_tokens': cap} if cap else {}, **extra}
        b.pop('stream_options', None)
    if ids:
        b['rid'] = 'rid-1'
        b['request_id'] = 'req-1'
    return b

def generation_requests(ports, kind, dialect):
    """Every case on every endpoint, whole and streamed; /generate batches on sglang."""
    eps = ['/v1/chat/completions', '/v1/completions', '/v1/messages', '/v1/responses', '/generate']
    for case, ep in itertools.product(CASES, eps):
        for stream, usage, cap, ids in [(False, False, 0, False), (True, False, 0, False), (True, True, 0, True),
                                        (True, True, 3, False), (False, False, 3, True)]:
            if case.startswith('f_') and (cap or ids) and not stream:
                continue
            both(ports, 'POST', ep, bodies(ep, stream, usage, cap, ids), [f'x-case: {case}'],
                 f'{kind}/{dialect}/{case}')
    if kind == 'sglang':  # /generate batches
        for stream in (False, True):
            for b in [{'text': ['a', 'b'], 'sampling_params': {'max_new_tokens': 4}},
                      {'text': 'a', 'sampling_params': {'n': 2, 'max_new_tokens': 3}},
                      {'text': ['a', 'b'], 'rid': ['x', 'y']}, {'text': ['a', 'b'], 'rid': 'z'},
                      {'input_ids': [[1, 2], [3]], 'sampling_params': [{'max_new_tokens': 2}, {}]},
                      {'text': ['a', 'b'], 'rid': ['x']}]:
                for case in ('plain', 'tools', 'segs', 'f_error'):
                    both(ports, 'POST', '/generate', {**b, 'stream': stream}, [f'x-case: {case}'],
                         f'{kind}/{dialect}/batch/{case}')

def other_requests(ports):
    """The endpoints that generate nothing, the helpers and the errors."""
    for method, path, body in [('GET', '/v1/models', None), ('GET', '/get_model_info', None),
                               ('GET', '/get_server_info', None), ('GET', '/health', None),
                               ('GET', '/health_generate', None), ('GET', '/version', None),
                               ('GET', '/metrics', None), ('GET', '/nope', None),
                               ('DELETE', '/v1/chat/completions', None), ('GET', '/_fake/echo?a=1', None),
                               ('POST', '/_fake/echo', {'x': 'é'}), ('GET', '/_fake/bytes?n=70000', None),
                               ('GET', '/_fake/sleep?ms=3', None), ('POST', '/abort_request', {'rid': 'none'}),
                               ('POST', '/v1/chat/completions', b'{not json'),
                               ('GET', '/_fake/records', None)]:
        both(ports, method, path, body, label='other')

def main():
    runs = [('sglang', []), ('sglang', ['--stamp']), ('sglang', ['--incremental-streaming-output']),
            ('vllm', []), ('vllm', ['--stamp']), ('openai', []), ('openai', ['--stamp'])]
    dialects = ['sglang', 'sglang-pydantic', 'sglang-old', 'vllm', 'vllm-old', 'vllm-both', 'openai', 'inline']
    for kind, flags in runs:
        procs = [start(b, ['--kind', kind, '--model', 'srv-model'] + flags) for b in (OLD, NEW)]
        ports = [p[1] for p in procs]
        other_requests(ports)
        for d in dialects:
            sc = {'dialect': d, 'responses': RESPONSES}
            both(ports, 'POST', '/_fake/scenario', sc, label='scenario')
            generation_requests(ports, kind, d)
            both(ports, 'GET', '/_fake/records', None, label=f'{kind}/{d}/records')
            both(ports, 'POST', '/_fake/reset', {}, label='reset')
        other_requests(ports)
        for p, _ in procs:
            p.terminate()
            p.wait()
        print(f'fake_same: {" ".join(["--kind", kind] + flags)}: {stats}', flush=True)
    print(f'fake_same: {stats["requests"]} requests, {stats["bytes"]:,} bytes (both builds; '
          f'{stats["records"]:,} of them records), {stats["diffs"]} differ')
    sys.exit(1 if stats['diffs'] else 0)

main()
