#!/usr/bin/env bash
# guard_vs.sh [REV] [guard_bench options] — the guard of this tree beside the guard of REV,
# measured side by side: build/guard_bench runs its rounds in turn with a guard_bench built
# from the same tests/bench/guard_bench.c against REV's guard/ (which is self-contained), and
# prints both and the ratio of each figure (speed above 1: this tree is faster; bytes per
# guard below 1: it is smaller).
# REV defaults to d471376, the guard before it was split into one file per detector, the
# reference of the guard's speed goal (within 10 %). The baseline binary is kept in
# $BUILD/guard_base/REV and rebuilt when guard_bench.c changes. `make bench` runs this.
# REV's guard is built as it was (-O2); this tree's as the Makefile builds it (GUARD_OPT,
# -O3): the flags are part of what is compared.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
REV=d471376
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    REV=$1
    shift
fi
dir="$BUILD/guard_base/$REV"
bin="$dir/guard_bench"
if [ ! -x "$bin" ] || [ tests/bench/guard_bench.c -nt "$bin" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    if ! git archive "$REV" guard 2>/dev/null | tar -x -C "$dir" 2>/dev/null; then
        echo "guard_vs: no $REV here (not a git clone?): the guard alone" >&2
        rm -rf "$dir"
        exec "$BUILD/guard_bench" "$@"
    fi
    # shellcheck disable=SC2046 # pkg-config prints several words on purpose
    cc -std=c11 -D_GNU_SOURCE -O2 -I"$dir" $(pkg-config --cflags libcjson libpcre2-8) \
        "$dir"/guard/*.c tests/bench/guard_bench.c -o "$bin" \
        $(pkg-config --libs libcjson libpcre2-8) -lm
fi
exec "$BUILD/guard_bench" --baseline "$bin" "$@"
