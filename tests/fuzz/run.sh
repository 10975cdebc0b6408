#!/usr/bin/env bash
# Runs every libFuzzer target under $FUZZ_DIR (default build/fuzz), or the ones named
# (tests/fuzz/run.sh sse guard), for $FUZZ_SECONDS seconds each (default 60). Each target
# starts from a scratch corpus, $FUZZ_DIR/corpus-<name>, seeded from tests/fuzz/seeds/<name>/
# (fuzz_<name> -> <name>); the committed seeds are only read.
# Prints one line per target with the executions from libFuzzer's final stats, and exits
# non-zero when any target crashed, leaked, timed out or violated a property (the log and
# the reproducer are kept under $FUZZ_DIR).
set -u
cd "$(dirname "$0")/../.."
FUZZ_DIR=${FUZZ_DIR:-build/fuzz}
SECS=${FUZZ_SECONDS:-60}
failed=0 ran=0

if [ $# -gt 0 ]; then
    bins=()
    for name in "$@"; do bins+=("$FUZZ_DIR/fuzz_$name"); done
else
    bins=("$FUZZ_DIR"/fuzz_*)
fi
for bin in "${bins[@]}"; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    name=${bin##*/fuzz_}
    corpus=$FUZZ_DIR/corpus-$name
    log=$FUZZ_DIR/$name.log
    rm -rf "$corpus"
    mkdir -p "$corpus"
    if [ -d "tests/fuzz/seeds/$name" ]; then
        cp -r "tests/fuzz/seeds/$name/." "$corpus/"
    fi
    # -timeout: one input running this long is a hang; the outer timeout is a last resort.
    timeout -k 10 $((SECS + 120)) "$bin" -max_total_time="$SECS" -timeout=25 \
        -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/crash-$name-" "$corpus" >"$log" 2>&1
    rc=$?
    ran=$((ran + 1))
    execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    [ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -n 1)
    if [ "$rc" = 0 ]; then
        printf 'fuzz %-10s ok      %s executions in %ss\n' "$name" "${execs:-?}" "$SECS"
    else
        failed=$((failed + 1))
        printf 'fuzz %-10s FAILED  (exit %s) after %s executions; log %s\n' "$name" "$rc" \
            "${execs:-?}" "$log"
        grep -E 'ERROR|SUMMARY|Test unit written|deadly|timeout' "$log" | head -n 8 | sed 's/^/    /'
    fi
done

if [ "$ran" = 0 ]; then
    echo "fuzz: no targets under $FUZZ_DIR (build them with make fuzz)" >&2
    exit 1
fi
echo "fuzz: $ran targets, $failed failed"
[ "$failed" = 0 ]
