#!/usr/bin/env bash
# tests/demo.sh — `make demo`: the field report's failure, and what loopguard does about it.
#
# Starts the fake upstream as SGLang with the seed scenario (Qwen3.6-27B falling into
# "lambda lambda lambda …" under the report's sampling, answering cleanly once the sampling
# changes) and loopguard in front of it, sends the report's own request twice with curl,
# streaming — once straight to the "SGLang" and once through loopguard — and prints what
# the client saw each time, what the "GPU" generated, the incident record and the metrics
# that moved. No GPU, no network (127.0.0.1 only), a few seconds.
#
# It doubles as a smoke test: the exit status is 0 only if the direct request showed the
# loop and the guarded one came back clean with the answer, after a retry, with an incident
# recorded as "recovered". BUILD picks the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LG=$BUILD/loopguard
FAKE=$BUILD/fake_upstream
SCENARIO=tests/fake/scenarios/seed_lambda.json

for f in "$LG" "$FAKE"; do
    [ -x "$f" ] || { echo "demo: $f not built (run make)" >&2; exit 1; }
done
for c in curl python3; do
    command -v "$c" >/dev/null || { echo "demo: $c is required" >&2; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/loopguard-demo.XXXXXX")
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "$rc" != 0 ] && [ -d "$tmp" ]; then
        for log in "$tmp"/*.err; do
            [ -s "$log" ] && { echo "--- $(basename "$log")" >&2; tail -n 20 "$log" >&2; }
        done
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits for a server's "listening on HOST:PORT" line (both binaries print it once bound)
# and prints the port. Fails after 10 s or when the process died first.
port_of() { # pid stdout-file name
    for _ in $(seq 1 200); do
        if grep -q '^listening on ' "$2" 2>/dev/null; then
            sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$2" | head -n 1
            return 0
        fi
        kill -0 "$1" 2>/dev/null || { echo "demo: $3 exited before listening" >&2; return 1; }
        sleep 0.05
    done
    echo "demo: $3 did not start within 10 s" >&2
    return 1
}

"$FAKE" --listen 127.0.0.1:0 --kind sglang --scenario "$SCENARIO" >"$tmp/fake.out" 2>"$tmp/fake.err" &
pids+=($!)
fake_port=$(port_of "$!" "$tmp/fake.out" fake_upstream)
fake=http://127.0.0.1:$fake_port

# The demo's configuration: the built-in defaults plus a free port, the fake as the
# upstream, one worker and an incident log in the temp directory. LOOPGUARD_* variables
# still apply on top (LOOPGUARD_GUARD__ENABLED=false make demo shows the failure).
cat >"$tmp/loopguard.json" <<EOF
{
  "listen": "127.0.0.1:0",
  "upstream": "$fake",
  "upstream_kind": "sglang",
  "workers": 1,
  "shutdown_grace_ms": 500,
  "incidents": {"path": "$tmp/incidents.jsonl"}
}
EOF
"$LG" --config "$tmp/loopguard.json" >"$tmp/lg.out" 2>"$tmp/lg.err" &
pids+=($!)
lg_port=$(port_of "$!" "$tmp/lg.out" loopguard)
lg=http://127.0.0.1:$lg_port

# The field report's request, streaming; include_usage so the token count shows.
body='{"model":"/root/models/Qwen3.6-27B","messages":[{"role":"user","content":"Write a Python function that checks if a number is prime. Be concise."}],"max_tokens":2000,"temperature":0.6,"top_p":0.95,"top_k":20,"stream":true,"stream_options":{"include_usage":true}}'
post() { # base-url out-file -> prints seconds taken
    curl -sS -N --max-time 20 -H 'Content-Type: application/json' -d "$body" \
        -o "$2" -w '%{time_total}' "$1/v1/chat/completions"
}

echo "loopguard demo: the field report's request against a fake SGLang serving a model that"
echo "loops like Qwen3.6-27B did, once directly and once through loopguard ($BUILD/loopguard)."
echo "POST /v1/chat/completions"
python3 -c 'import json, sys, textwrap
b = json.loads(sys.argv[1])
print("\n".join(textwrap.wrap(", ".join("%s: %s" % (k, json.dumps(v)) for k, v in b.items()), 96,
      initial_indent="  ", subsequent_indent="    ")))' "$body"
echo

t_without=$(post "$fake" "$tmp/without.sse")
curl -sS "$fake/_fake/records" >"$tmp/without.records.json"
curl -sS -X POST "$fake/_fake/reset" >/dev/null
t_with=$(post "$lg" "$tmp/with.sse")

# The incident writer is a background thread: give it a moment to append the record.
for _ in $(seq 1 100); do
    [ -s "$tmp/incidents.jsonl" ] && break
    sleep 0.02
done
curl -sS "$fake/_fake/records" >"$tmp/with.records.json"
curl -sS "$lg/loopguard/metrics" >"$tmp/metrics.txt"

python3 - "$tmp" "$t_without" "$t_with" <<'PY'
import json, os, sys, textwrap

tmp, t_without, t_with = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
W = 48  # column width: two columns and a separator fit 100 terminal columns

def read_stream(path):
    """What a client assembles from an SSE chat stream: reasoning, content, usage,
    finish_reason, plus loopguard's trailing SSE comments."""
    out = {"reasoning": "", "content": "", "usage": None, "finish": None, "comments": []}
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line.startswith(":"):
                out["comments"].append(line[1:].strip())
                continue
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            for ch in chunk.get("choices") or []:
                d = ch.get("delta") or {}
                out["reasoning"] += d.get("reasoning_content") or d.get("reasoning") or ""
                out["content"] += d.get("content") or ""
                if ch.get("finish_reason"):
                    out["finish"] = ch["finish_reason"]
    return out

def records(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)

def kind(recs, k):
    return [r for r in recs if r["kind"] == k]

def block(title, text, limit, max_lines):
    lines = ["=== %s ===" % title]
    if not text:
        return lines + ["(empty)"]
    shown = text[:limit] + ("…" if len(text) > limit else "")
    body = []
    for para in shown.split("\n"):
        body += textwrap.wrap(para, W) or [""]
    if len(body) > max_lines:
        body = body[: max_lines - 1] + ["… (%d more lines)" % (len(body) - max_lines + 1)]
    return lines + [l.rstrip() for l in body]

def column(view, seconds, extra):
    usage = view["usage"] or {}
    col = block("Reasoning (first 300 chars)", view["reasoning"], 300, 9)
    col += block("Content", view["content"], 1000, 12)
    col += ["=== Stats ===",
            "tokens: %s, finish: %s" % (usage.get("completion_tokens", "?"), view["finish"]),
            "time to the last byte: %.2f s" % seconds] + extra
    return col

without = read_stream(os.path.join(tmp, "without.sse"))
withlg = read_stream(os.path.join(tmp, "with.sse"))
rec_without = records(os.path.join(tmp, "without.records.json"))
rec_with = records(os.path.join(tmp, "with.records.json"))
gen_without, gen_with = kind(rec_without, "generation"), kind(rec_with, "generation")
incidents = []
inc_path = os.path.join(tmp, "incidents.jsonl")
if os.path.exists(inc_path):
    with open(inc_path, encoding="utf-8") as f:
        incidents = [json.loads(l) for l in f if l.strip()]
inc = incidents[0] if incidents else {}
attempts = inc.get("attempts", [])

left = column(without, t_without, [])
trailer = dict(c.split(": ", 1) for c in withlg["comments"] if c.lower().startswith("x-loopguard-"))
right = column(withlg, t_with, ["attempts: %s, trips: %s (SSE trailer)" % (
    trailer.get("X-Loopguard-Attempts", "?"), trailer.get("X-Loopguard-Trips", "?"))])
print("%-*s | %s" % (W, "WITHOUT loopguard: client -> SGLang", "WITH loopguard: client -> loopguard -> SGLang"))
print("%s-+-%s" % ("-" * W, "-" * W))
for i in range(max(len(left), len(right))):
    l = left[i] if i < len(left) else ""
    r = right[i] if i < len(right) else ""
    print("%-*s | %s" % (W, l, r))
print()

# What the "GPU" did: the fake upstream records every request and generation.
def changes(before, after):
    """The sampling a retry ran with, as changes from the first attempt's."""
    out = []
    for k, v in after.items():
        if k == "seed":
            out.append("new seed")
        elif before.get(k) != v:
            out.append("%s %s" % (k, v) if k not in before else "%s %s->%s" % (k, before[k], v))
    return ", ".join(out) or "unchanged"

spent_without = sum(g["tokens_sent"] for g in gen_without)
spent_with = sum(g["tokens_sent"] for g in gen_with)
chats = [r for r in kind(rec_with, "request") if r["path"] == "/v1/chat/completions"]
print("What the inference server generated (the fake upstream's own records):")
for g in gen_without:
    print("  without:          %5d tokens, ended %s (finish_reason %s)"
          % (g["tokens_sent"], g["ended"], g["finish_reason"]))
for i, g in enumerate(gen_with):
    a = attempts[i] if i < len(attempts) else {}
    if a.get("detector"):
        how = "cut: %s on %s, unit %r x%s" % (a["detector"], a.get("channel"), a.get("unit"), a.get("repeats"))
    else:
        how = "clean; " + changes(attempts[0].get("sampling", {}) if attempts else {}, a.get("sampling", {}))
        if i < len(chats) and (chats[i].get("body") or {}).get("continue_final_message"):
            how += "\n%21s continued the clean prefix (continue_final_message)" % ""
    print("  with, attempt %d: %5d tokens, %s" % (i + 1, g["tokens_sent"], how))
if spent_without:
    print("  tokens saved: %d of %d (%.0f%%), /abort_request calls: %d"
          % (spent_without - spent_with, spent_without,
             100.0 * (spent_without - spent_with) / spent_without, len(kind(rec_with, "abort"))))
print("  (the report's server stopped after 260 tokens; a loop that never closes its thinking")
print("  runs to max_tokens, as here, and the GPU pays for every one of them)")
print()

print("The incident record (%s):" % "incidents.path, JSON Lines")
print(json.dumps(inc, indent=2, ensure_ascii=False) if inc else "  (none written)")
print()

print("Metrics that moved (GET /loopguard/metrics):")
moved = []
with open(os.path.join(tmp, "metrics.txt"), encoding="utf-8") as f:
    for line in f:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if any(k in name for k in ("trip", "attempt", "outcome", "aborted")) and float(value) != 0:
            if not name.endswith("_bucket"):
                moved.append(line)
print("\n".join("  " + m for m in moved) or "  (none)")
print()

# The smoke-test verdict: the loop must show without loopguard and be gone with it.
problems = []
LOOP = "lambda lambda lambda"
if LOOP not in without["reasoning"]:
    problems.append("the direct request did not show the lambda loop")
if without["content"]:
    problems.append("the direct request unexpectedly has content")
if "def is_prime" not in withlg["content"]:
    problems.append("the guarded answer lacks def is_prime")
# A loop is the unit three times in a row, as in the report; the retry may continue a
# clean prefix that ends in one or two occurrences of the word.
if LOOP in withlg["reasoning"] or LOOP in withlg["content"]:
    problems.append("the loop reached the client through loopguard")
if inc.get("outcome") != "recovered" or len(attempts) < 2:
    problems.append("no incident with outcome recovered after a retry")
if not any(m.startswith("loopguard_trips_total") for m in moved):
    problems.append("loopguard_trips_total did not move")
if problems:
    print("demo FAILED: " + "; ".join(problems))
    sys.exit(1)
print("demo OK: the loop was cut after %d tokens and the client got a clean answer." %
      (gen_with[0]["tokens_sent"] if gen_with else -1))
PY
echo "Status page of this run (incident, trips, upstream): $lg/loopguard/"
if [ -t 0 ] && [ -t 1 ]; then
    # Interactive: keep the demo's loopguard up so the page can be opened.
    read -r -p "Open it now; press Enter to stop the demo. " _ || true
fi
echo "Next: make run serves 127.0.0.1:8000 in front of SGLang on 127.0.0.1:30000 (Ctrl-C stops it);"
echo "      its status page is http://127.0.0.1:8000/loopguard/."
