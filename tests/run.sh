#!/usr/bin/env bash
# Runs the test suites against one build ($BUILD, default build) and counts both suites
# (a test file, a unit binary, a corpus script) and the cases in them (node:test's
# "# pass N" / "# fail N" / "# cancelled N", cmocka's "[  PASSED  ] N test(s)" /
# "[  FAILED  ] N test(s)"; a script without cases counts as one). Each suite's line names
# its counts and seconds; the last line is the case total, "N passed, N failed". The four
# numbers are also appended to build/test-summary for `make test`'s total.
# SUITES picks a subset: unit e2e client browser corpus valgrind tsan.
#
# tests/run.sh --total FILE prints the totals of a test-summary file the same way.
set -u
cd "$(dirname "$0")/.."

# print_totals SUITES_PASSED SUITES_FAILED CASES_PASSED CASES_FAILED; the last line is the
# one CI reads.
print_totals() {
    echo "suites: $1 passed, $2 failed"
    echo "$3 passed, $4 failed"
}

if [ "${1:-}" = --total ]; then
    read -r sp sf cp cf < <(awk '{a += $1; b += $2; c += $3; d += $4}
                                END {print a + 0, b + 0, c + 0, d + 0}' "$2")
    print_totals "$sp" "$sf" "$cp" "$cf"
    [ "$sf" = 0 ] && [ "$cf" = 0 ]
    exit
fi

BUILD=${BUILD:-build}
SUITES=${SUITES:-"unit e2e client browser corpus"}
export LOOPGUARD_BIN="$PWD/$BUILD/loopguard" FAKE_BIN="$PWD/$BUILD/fake_upstream" BUILD
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-second_deadlock_stack=1}
suites_pass=0 suites_fail=0 cases_pass=0 cases_fail=0 failed=()
out=$(mktemp "${TMPDIR:-/tmp}/lg-run.XXXXXX")
trap 'rm -f "$out"' EXIT

# run NAME CMD...: runs one suite with its output shown and kept in $out, then counts it.
run() {
    local name=$1 t0=$SECONDS st p f
    shift
    echo "== $name ($BUILD)"
    "$@" 2>&1 | tee "$out"
    st=${PIPESTATUS[0]}
    read -r p f < <(awk '
        /^# pass [0-9]+$/                 { p += $3; n = 1 }
        /^# (fail|cancelled) [0-9]+$/     { f += $3; n = 1 }
        /^\[  PASSED  \] [0-9]+ test/     { p += $4; n = 1 }
        /^\[  FAILED  \] [0-9]+ test/     { f += $4; n = 1 }
        END { print (n ? p + 0 : -1), f + 0 }' "$out")
    if [ "$p" = -1 ]; then # no case counts: the suite is its one case
        if [ "$st" = 0 ]; then p=1 f=0; else p=0 f=1; fi
    fi
    # A suite that failed without a failed case (a crash, a sanitizer report at exit)
    # counts one failed case, so that the total never hides it.
    if [ "$st" != 0 ] && [ "$f" = 0 ]; then f=1; fi
    if [ "$st" = 0 ]; then
        suites_pass=$((suites_pass + 1))
    else
        suites_fail=$((suites_fail + 1))
        failed+=("$name")
    fi
    cases_pass=$((cases_pass + p)) cases_fail=$((cases_fail + f))
    echo "-- $name: $p passed, $f failed ($((SECONDS - t0)) s)"
}

node_test() { node --test --test-reporter=tap "$@"; }

for s in $SUITES; do
    case $s in
    unit)
        for t in "$BUILD"/tests/test_*; do
            [ -x "$t" ] || continue
            run "unit:$(basename "$t")" "$t"
        done ;;
    e2e)
        for t in tests/e2e/*.test.mjs; do
            [ -e "$t" ] || continue
            run "e2e:$(basename "$t")" node_test --test-concurrency=1 "$t"
        done ;;
    client)
        for t in tests/client/*.test.mjs; do
            [ -e "$t" ] || continue
            run "client:$(basename "$t")" node_test "$t"
        done ;;
    browser)
        for t in tests/browser/*.test.mjs; do
            [ -e "$t" ] || continue
            run "browser:$(basename "$t")" node_test "$t"
        done ;;
    valgrind)
        for t in tests/e2e/exchange.test.mjs tests/e2e/normalise.test.mjs \
                 tests/e2e/faults.test.mjs tests/e2e/shutdown.test.mjs; do
            LOOPGUARD_REAL_BIN="$LOOPGUARD_BIN" LOOPGUARD_BIN="$PWD/tests/valgrind-loopguard.sh" \
                run "valgrind:$(basename "$t")" node_test --test-concurrency=1 "$t"
        done ;;
    tsan)
        # The ThreadSanitizer build (BUILD=build/tsan) with four workers: the suites whose
        # requests, retries, health checks and ejections cross threads.
        for t in tests/e2e/exchange.test.mjs tests/e2e/upstreams.test.mjs \
                 tests/e2e/faults.test.mjs; do
            LOOPGUARD_WORKERS=4 run "tsan:$(basename "$t")" node_test --test-concurrency=1 "$t"
        done ;;
    corpus)
        for t in tests/corpus/*.sh; do
            [ -e "$t" ] || continue
            run "corpus:$(basename "$t")" bash "$t"
        done ;;
    esac
done

[ ${#failed[@]} -eq 0 ] || printf 'FAILED: %s\n' "${failed[@]}"
if [ -d build ]; then
    echo "$suites_pass $suites_fail $cases_pass $cases_fail" >> build/test-summary
fi
print_totals "$suites_pass" "$suites_fail" "$cases_pass" "$cases_fail"
[ "$suites_fail" = 0 ]
