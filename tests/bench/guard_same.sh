#!/usr/bin/env bash
# guard_same.sh [REV] [LIST] — does this tree's guard decide what REV's decides (default:
# main)? For speed work on the guard, whose verdicts must not move: builds
# tests/bench/guard_trace.c against REV's guard/ and against this tree's (uncommitted edits
# included), feeds both every AlpacaEval answer ($ALPACA_CORPUS, default
# ../shared/corpus/alpaca-dev) and, with LIST, every file it names (one path a line), each in
# random 1-8 byte chunks and whole, on both channels (guard_trace.c), and compares the
# traces: the verdict, its byte, unit and loop start, and every holdback value.
# GUARD_TRACE_PARAMS='{"novelty":{"min_ratio":0.7}}' runs both with those settings: the
# defaults trip some detectors rarely (novelty 4 times here), lowered thresholds test their
# counting on thousands of trips.
# Exit 0: identical; 1: they differ (the first differences are shown). About 20 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:-main}
LIST=${2:-}
CORPUS=${ALPACA_CORPUS:-../shared/corpus/alpaca-dev}
ls "$CORPUS"/*.json.xz >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/rev"
git archive "$REV" guard | tar -x -C "$work/rev"

# build DIR BIN: guard_trace against DIR's guard/.
build() {
    # shellcheck disable=SC2046 # pkg-config prints several words on purpose
    cc -std=c11 -D_GNU_SOURCE -O2 -I"$1" $(pkg-config --cflags libcjson libpcre2-8) \
        "$1"/guard/*.c tests/bench/guard_trace.c -o "$2" \
        $(pkg-config --libs libcjson libpcre2-8) -lm
}

# trace BIN: its trace of every answer, then of LIST's files.
trace() {
    for f in "$CORPUS"/*.json.xz; do
        xz -dc "$f" | "$1" "$(basename "$f" .json.xz)"
    done
    if [ -n "$LIST" ]; then "$1" -f "$LIST"; fi
}

build "$work/rev" "$work/rev.bin"
build . "$work/this.bin"
trace "$work/rev.bin" >"$work/rev.txt" &
trace "$work/this.bin" >"$work/this.txt"
wait $!
if cmp -s "$work/rev.txt" "$work/this.txt"; then
    echo "guard_same: identical to $REV ($(wc -l <"$work/this.txt") texts and ways)"
    exit 0
fi
echo "guard_same: this tree's guard decides otherwise than $REV's:" >&2
diff "$work/rev.txt" "$work/this.txt" | head -20 >&2 || true # head closes the pipe early
exit 1
