#!/usr/bin/env bash
# Runs the test suites against one build ($BUILD, default build) and prints one summary
# line "N passed, N failed" (also appended to build/test-summary for `make test`'s total).
# SUITES picks a subset: unit e2e client corpus valgrind.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SUITES=${SUITES:-"unit e2e client corpus"}
export LOOPGUARD_BIN="$PWD/$BUILD/loopguard" FAKE_BIN="$PWD/$BUILD/fake_upstream" BUILD
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
pass=0 fail=0 failed=()

record() { # name status
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$1"); fi
}

for s in $SUITES; do
    case $s in
    unit)
        for t in "$BUILD"/tests/test_*; do
            [ -x "$t" ] || continue
            echo "== unit: $(basename "$t") ($BUILD)"
            "$t"; st=$?; record "unit:$(basename "$t")" "$st"
        done ;;
    e2e)
        for t in tests/e2e/*.test.mjs; do
            [ -e "$t" ] || continue
            echo "== e2e: $(basename "$t") ($BUILD)"
            node --test --test-concurrency=1 "$t"; st=$?; record "e2e:$(basename "$t")" "$st"
        done ;;
    client)
        for t in tests/client/*.test.mjs; do
            [ -e "$t" ] || continue
            echo "== client: $(basename "$t") ($BUILD)"
            node --test "$t"; st=$?; record "client:$(basename "$t")" "$st"
        done ;;
    valgrind)
        for t in tests/e2e/exchange.test.mjs tests/e2e/normalise.test.mjs \
                 tests/e2e/faults.test.mjs tests/e2e/shutdown.test.mjs; do
            echo "== valgrind: $(basename "$t")"
            LOOPGUARD_REAL_BIN="$LOOPGUARD_BIN" LOOPGUARD_BIN="$PWD/tests/valgrind-loopguard.sh" \
                node --test --test-concurrency=1 "$t"
            st=$?; record "valgrind:$(basename "$t")" "$st"
        done ;;
    corpus)
        for t in tests/corpus/*.sh; do
            [ -e "$t" ] || continue
            echo "== corpus: $(basename "$t") ($BUILD)"
            bash "$t"; st=$?; record "corpus:$(basename "$t")" "$st"
        done ;;
    esac
done

[ ${#failed[@]} -eq 0 ] || printf 'FAILED: %s\n' "${failed[@]}"
echo "$pass passed, $fail failed"
if [ -d build ]; then echo "$pass $fail" >> build/test-summary; fi
[ "$fail" = 0 ]
