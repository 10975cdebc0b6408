#!/usr/bin/env bash
# soak.sh — `make soak` (not in CI): loopguard under a long, hostile load.
#
# Starts SOAK_UPSTREAMS fake upstreams (kind sglang, scenario tests/soak/soak.json: clean
# generations, loops, and upstream faults chosen by the prompt) and one loopguard in front of
# them, then runs build/soakload: SOAK_STREAMS concurrent requests for SOAK_SECONDS, a share
# looping (on the first attempt only, or on every attempt), a share meeting an upstream fault
# (reset, stall, error event, HTTP 500, truncated chunked body, garbage lines, close before
# headers, not SSE, a retry that is reset), a share whole (non-streaming), a share hanging up
# mid-way. Every SOAK_SAMPLE_S seconds it samples loopguard's open file descriptors and RSS.
#
# Pass criteria (tests/soak/check.py prints the figures and decides):
#   - no crash: loopguard alive and /loopguard/health ok at the end, exits 0 on SIGTERM, no
#     sanitizer report;
#   - no malformed answer, no loop leaked, no hung request, no connection error, every clean
#     request answered cleanly (soakload's own checks);
#   - file descriptors and RSS flat after the warm-up (SOAK_WARMUP_S): growth between the first
#     and last sample after it within 10 % + 16 MiB (RSS) and 10 % + 64 (fds); after the load,
#     the idle fd count within the baseline plus one cached upstream connection per stream;
#   - the incident log holds exactly what the metrics counted: its lines equal
#     loopguard_incidents_total{fate="written"}, nothing dropped or failed, and the exchange
#     records by outcome equal loopguard_outcomes_total (ejection records equal
#     loopguard_upstream_ejections_total);
#   - every upstream generation was released (the fakes report no active generation).
#
# Env: SOAK_SECONDS (600), SOAK_STREAMS (2000), SOAK_SAMPLE_S (30; 10 when the run is shorter
# than 5 minutes), SOAK_WARMUP_S (60; a fifth of shorter runs), SOAK_UPSTREAMS (2),
# SOAK_SEED (1), SOAK_IDLE_MS (loopguard's timeouts.idle_ms, 10000: how long a stall fault
# lasts), SOAK_OUT (directory for logs and results, default $BUILD/soak), and the
# soakload mix: SOAK_LOOP_PCT (15), SOAK_FAULT_PCT (15), SOAK_WHOLE_PCT (20),
# SOAK_HANGUP_PCT (5). Exit status 0 when every criterion held.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DURATION=${SOAK_SECONDS:-600}
STREAMS=${SOAK_STREAMS:-2000}
if [ "$DURATION" -lt 300 ]; then SAMPLE=${SOAK_SAMPLE_S:-10}; WARMUP=${SOAK_WARMUP_S:-$((DURATION / 5))}
else SAMPLE=${SOAK_SAMPLE_S:-30}; WARMUP=${SOAK_WARMUP_S:-60}; fi
UPSTREAMS=${SOAK_UPSTREAMS:-2}
OUT=${SOAK_OUT:-$BUILD/soak}
LG_BIN=$PWD/$BUILD/loopguard FAKE_BIN=$PWD/$BUILD/fake_upstream LOAD_BIN=$PWD/$BUILD/soakload
for b in "$LG_BIN" "$FAKE_BIN" "$LOAD_BIN"; do
    [ -x "$b" ] || { echo "soak: $b missing (run make first)" >&2; exit 2; }
done
rm -rf "$OUT" && mkdir -p "$OUT/bin" || exit 2
OUT=$(cd "$OUT" && pwd)
# The servers run as copies under their own names: a `pkill fake_upstream` (or loopguard)
# run by something else on the machine must not end a ten-minute run half-way (it did).
cp "$LG_BIN" "$OUT/bin/soak-loopguard" && cp "$FAKE_BIN" "$OUT/bin/soak-upstream" || exit 2
LG_BIN=$OUT/bin/soak-loopguard FAKE_BIN=$OUT/bin/soak-upstream

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a server in the background (in this shell, so that `wait` can read its status);
# $1 name (log prefix), rest: the command. Sets STARTED_PID.
# Servers run inside $OUT with core dumps on, so that a crash leaves its core there.
start_bg() {
    local name=$1; shift
    (cd "$OUT" && ulimit -c unlimited 2>/dev/null; exec "$@") >"$OUT/$name.out" 2>"$OUT/$name.err" &
    STARTED_PID=$!
    pids+=("$STARTED_PID")
}

# Prints the port server $1 (pid $2) listens on once it said "listening on".
port_of() {
    local name=$1 pid=$2 port
    for _ in $(seq 100); do
        port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$OUT/$name.out")
        [ -n "$port" ] && { echo "$port"; return 0; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "soak: $name did not start; stderr:" >&2
    cat "$OUT/$name.err" >&2
    return 1
}

upstreams=() fake_pids=()
for i in $(seq "$UPSTREAMS"); do
    start_bg "fake$i" "$FAKE_BIN" --listen 127.0.0.1:0 --kind sglang \
        --scenario "$PWD/tests/soak/soak.json" --max-records 0
    fake_pids+=("$STARTED_PID")
    port=$(port_of "fake$i" "$STARTED_PID") || exit 2
    upstreams+=("\"http://127.0.0.1:$port\"")
done
cat >"$OUT/loopguard.json" <<EOF
{
 "listen": "127.0.0.1:0",
 "upstream": [$(IFS=,; echo "${upstreams[*]}")],
 "upstream_kind": "sglang",
 "timeouts": {"connect_ms": 2000, "first_byte_ms": 10000, "idle_ms": ${SOAK_IDLE_MS:-10000}},
 "health": {"interval_ms": 1000},
 "limits": {"max_conns_per_ip": 0},
 "shutdown_grace_ms": 2000,
 "incidents": {"path": "$OUT/incidents.jsonl"}
}
EOF
start_bg loopguard "$LG_BIN" --config "$OUT/loopguard.json"
LG_PID=$STARTED_PID
LG_PORT=$(port_of loopguard "$LG_PID") || exit 2

# fds and RSS (KiB) of loopguard, "-1 -1" once it is gone.
sample() {
    local fds rss
    fds=$(ls "/proc/$LG_PID/fd" 2>/dev/null | wc -l)
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$LG_PID/status" 2>/dev/null)
    [ -n "$rss" ] && echo "$fds $rss" || echo "-1 -1"
}

sleep 1
read -r BASE_FDS BASE_RSS < <(sample)
echo "soak: $(date -u +%FT%TZ) $STREAMS streams for ${DURATION}s against loopguard :$LG_PORT" \
    "($UPSTREAMS upstreams), samples every ${SAMPLE}s, warm-up ${WARMUP}s;" \
    "baseline $BASE_FDS fds, $BASE_RSS KiB"

"$LOAD_BIN" --url "http://127.0.0.1:$LG_PORT" --streams "$STREAMS" --duration "$DURATION" \
    --ramp 5 --progress 5 --seed "${SOAK_SEED:-1}" --loop "${SOAK_LOOP_PCT:-15}" \
    --fault "${SOAK_FAULT_PCT:-15}" --whole "${SOAK_WHOLE_PCT:-20}" \
    --hangup "${SOAK_HANGUP_PCT:-5}" >"$OUT/load.json" 2>"$OUT/load.err" &
LOAD_PID=$!
pids+=("$LOAD_PID")

printf 't_s\tfds\trss_kib\n' >"$OUT/samples.tsv"
t0=$(date +%s)
next=$SAMPLE
while kill -0 "$LOAD_PID" 2>/dev/null; do
    sleep 1
    t=$(($(date +%s) - t0))
    if [ "$t" -ge "$next" ] && [ "$t" -lt "$DURATION" ]; then
        read -r fds rss < <(sample)
        printf '%s\t%s\t%s\n' "$t" "$fds" "$rss" >>"$OUT/samples.tsv"
        echo "soak: t=${t}s fds=$fds rss=${rss}KiB $(tail -n1 "$OUT/load.err")"
        next=$((next + SAMPLE))
    fi
done
wait "$LOAD_PID"
LOAD_RC=$?

# A fake upstream that died makes the run meaningless (and says something about the
# requests loopguard sent it): report how it ended.
FAKES_RC=0
for i in "${!fake_pids[@]}"; do
    if ! kill -0 "${fake_pids[$i]}" 2>/dev/null; then
        wait "${fake_pids[$i]}"
        echo "soak: FAIL fake upstream $((i + 1)) (pid ${fake_pids[$i]}) died during the run, status $?" \
            "(>128: signal); cores: $(ls "$OUT"/core* 2>/dev/null | tr '\n' ' ')"
        FAKES_RC=1
    fi
done

# Let loopguard settle (idle upstream connections stay cached), then read the end state.
sleep 3
read -r AFTER_FDS AFTER_RSS < <(sample)
fake_urls=$(IFS=,; echo "${upstreams[*]}" | tr -d '"')
python3 tests/soak/check.py --url "http://127.0.0.1:$LG_PORT" --pid "$LG_PID" \
    --incidents "$OUT/incidents.jsonl" --samples "$OUT/samples.tsv" --load "$OUT/load.json" \
    --load-rc "$LOAD_RC" --warmup "$WARMUP" --streams "$STREAMS" --duration "$DURATION" \
    --baseline "$BASE_FDS" "$BASE_RSS" --after "$AFTER_FDS" "$AFTER_RSS" \
    --fakes "$fake_urls" --stderr "$OUT/loopguard.err" --out "$OUT/summary.json"
CHECK_RC=$?
[ "$FAKES_RC" = 0 ] || CHECK_RC=1

# Shutdown: SIGTERM must end loopguard cleanly (exit 0) within its grace period.
kill -TERM "$LG_PID" 2>/dev/null
LG_RC=137
for _ in $(seq 100); do
    kill -0 "$LG_PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$LG_PID" 2>/dev/null; then
    echo "soak: FAIL loopguard did not exit within 10 s of SIGTERM"
else
    wait "$LG_PID"
    LG_RC=$?
    echo "soak: loopguard exited with status $LG_RC"
fi
[ "$LG_RC" = 0 ] || { echo "soak: FAIL loopguard exit status $LG_RC"; CHECK_RC=1; }
if grep -qE 'Sanitizer|runtime error:' "$OUT/loopguard.err"; then
    echo "soak: FAIL sanitizer report in $OUT/loopguard.err"
    CHECK_RC=1
fi
echo "soak: results in $OUT (summary.json, samples.tsv, load.json, incidents.jsonl)"
[ "$CHECK_RC" = 0 ] && echo "soak: PASS" || echo "soak: FAIL"
exit "$CHECK_RC"
