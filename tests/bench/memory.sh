#!/usr/bin/env bash
# tests/bench/memory.sh [STREAMS] [SECONDS] — where loopguard's memory per stream goes, on a
# live paced load (make bench's: 60 stamp tokens per request at 30 tokens/s, the guard on).
#
# Starts the fake upstream, loopguard (LOOPGUARD_BIN, default build/loopguard; guard settings
# in MEMORY_LOOPGUARD_JSON) and build/loadgen with STREAMS streams (default 5000) for SECONDS
# (default 20) after the ramp (MEMORY_PACE_MS, default 33, is the upstream's pace: a slower one
# lets a busy host keep the pace at 5,000 streams, as make bench's idle host does), and halfway through the window takes, from the live process:
#   VmRSS                       over its VmRSS before load, per stream
#   heap in use / heap free     glibc's malloc_stats() of the worker arenas (gdb calls it in
#                               the process, which stops for a moment): in use counts
#                               malloc's overhead and the pages of blocks given back with
#                               madvise (libmicrohttpd's write buffer while a stream writes
#                               directly, resident no more); free is what the arenas hold
#                               between live blocks, resident where it was touched
#   mappings                    pmap's resident KiB of the arena heaps (anonymous 64 MiB
#                               mappings), the main heap and everything else
# and prints them per stream. Nothing is timed: these are sizes. Needs gdb and pmap.
# The numbers move with how far behind the pace the host lets loopguard fall (its queues
# grow with the delay): read them beside `loadgen`'s delivered events/s, printed too.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
STREAMS=${1:-5000}
SECONDS_=${2:-20}
PACE_MS=${MEMORY_PACE_MS:-33}
LOOPGUARD=${LOOPGUARD_BIN:-$BUILD/loopguard}
unset LOOPGUARD_BIN # loopguard refuses unknown LOOPGUARD_* variables
OUT=$BUILD/memory
for t in gdb pmap; do command -v $t >/dev/null || {
    echo "memory.sh: $t is needed" >&2
    exit 1
}; done
rm -rf "$OUT"
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)" 2>/dev/null

PIDS=() # every process started here, ended on exit
stop_all() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    wait
}
trap stop_all EXIT

# listen_port FILE — the port of "listening on 127.0.0.1:PORT" in FILE, waiting up to 10 s.
listen_port() {
    for _ in $(seq 100); do
        grep -m1 -o 'listening on 127\.0\.0\.1:[0-9]*' "$1" 2>/dev/null | sed 's/.*://' && return 0
        sleep 0.1
    done
    echo "memory.sh: no 'listening on' in $1" >&2
    exit 1
}

echo '{"dialect":"sglang","responses":[{"content":[{"stamp_tokens":-1}]}]}' >"$OUT/scenario.json"
"$BUILD/fake_upstream" --listen 127.0.0.1:0 --kind sglang --scenario "$OUT/scenario.json" \
    --stamp --pace-ms "$PACE_MS" --max-records 0 >"$OUT/fake.out" 2>"$OUT/fake.err" &
FAKE=$!
PIDS+=("$FAKE")
fport=$(listen_port "$OUT/fake.out")
python3 -c 'import json, sys
extra = json.loads(sys.argv[1] or "{}")
json.dump({"limits": {"max_conns_per_ip": 0}, **extra}, open(sys.argv[2], "w"))' \
    "${MEMORY_LOOPGUARD_JSON:-}" "$OUT/loopguard.json" || exit 1
"$LOOPGUARD" --config "$OUT/loopguard.json" --listen 127.0.0.1:0 \
    --upstream "http://127.0.0.1:$fport" --upstream-kind sglang >"$OUT/loopguard.out" \
    2>"$OUT/loopguard.err" &
LG=$!
PIDS+=("$LG")
lport=$(listen_port "$OUT/loopguard.out")
sleep 0.3
idle=$(awk '/^VmRSS:/ {print $2}' "/proc/$LG/status")

ramp=$((STREAMS >= 5000 ? 2 : 1))
"$BUILD/loadgen" --url "http://127.0.0.1:$lport/v1/chat/completions" --streams "$STREAMS" \
    --max-tokens 60 --warmup $((ramp + 1)) --ramp "$ramp" --duration "$SECONDS_" \
    --watch-pid "$LG" --upstream-pid "$FAKE" --label memory >"$OUT/loadgen.json" &
LOAD=$!
PIDS+=("$LOAD")
sleep $((ramp + 1 + SECONDS_ / 2))
rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$LG/status")
pmap -x "$LG" >"$OUT/pmap.txt"
: >"$OUT/malloc_stats.txt"
# malloc_stats() writes to loopguard's stderr; the lines it adds there are the figures.
before=$(wc -l <"$OUT/loopguard.err")
timeout 60 gdb -p "$LG" -batch -ex 'call (void)malloc_stats()' >/dev/null 2>&1 ||
    echo "memory.sh: gdb could not call malloc_stats" >&2
tail -n +"$((before + 1))" "$OUT/loopguard.err" >"$OUT/malloc_stats.txt"
wait "$LOAD"

python3 - "$STREAMS" "$idle" "$rss" "$OUT" "$PACE_MS" <<'PY'
import json, os, re, sys
n, idle, rss, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
offered = n * 1000 / int(sys.argv[5])
stats = open(os.path.join(out, "malloc_stats.txt")).read()
arenas = re.findall(r"Arena (\d+):\nsystem bytes\s+=\s+(\d+)\nin use bytes\s+=\s+(\d+)", stats)
# Arena 0 is the main thread's (configuration, start-up); the threads' are the others.
work = [(int(s), int(u)) for a, s, u in arenas if a != "0"]
# A thread arena's heaps are anonymous mappings at 64 MiB-aligned addresses (glibc's
# HEAP_MAX_SIZE on 64-bit); the rest is the main heap, stacks, libraries and their data.
arena_kib = other_kib = 0
for line in open(os.path.join(out, "pmap.txt")):
    f = line.split()
    if len(f) < 6 or not f[1].isdigit() or not f[2].isdigit():
        continue
    if " ".join(f[5:]) == "[ anon ]" and int(f[0], 16) % (64 << 20) == 0:
        arena_kib += int(f[2])
    else:
        other_kib += int(f[2])
load = json.load(open(os.path.join(out, "loadgen.json")))
per = lambda kib: f"{kib / n:6.2f} KiB"
print(f"memory.sh: {n} paced streams, loopguard {load['events_per_s']:.0f} events/s delivered "
      f"of {offered:.0f} offered, errors {load['errors']}")
print(f"  VmRSS over idle       {per(rss - idle)}   ({rss} KiB, idle {idle} KiB)")
if work:
    use = sum(u for s, u in work) / 1024
    free = sum(s - u for s, u in work) / 1024
    print(f"  heap in use           {per(use)}   (malloc_stats: {len(work)} thread arenas, the workers' and helpers')")
    print(f"  heap free             {per(free)}")
else:
    print("  heap: no malloc_stats (gdb could not attach)")
print(f"  resident (pmap)       {per(arena_kib)}   in the worker arenas' heaps; "
      f"{other_kib} KiB in every other mapping")
print(f"  (files in {out})")
PY
