#!/usr/bin/env bash
# Runs test suites against one or more builds and counts both suites (a test file, a unit
# binary, a corpus script, a fuzz target) and the cases in them (node:test's "# pass N" /
# "# fail N" / "# cancelled N", cmocka's "[  PASSED  ] N test(s)" / "[  FAILED  ] N
# test(s)"; a suite without cases counts as one). Each suite's last line names its counts,
# its wall seconds and the CPU seconds of everything it ran ("-- NAME: P passed, F failed
# (W s, C s CPU)"); the last line is the case total, "N passed, N failed". The four numbers
# are also appended to build/test-summary for `make test`'s total.
#
#   BUILD=build SUITES="unit e2e" tests/run.sh     one build (default build), some suites
#   PASSES="build:unit,e2e build/san:unit" ...      several builds in one queue
#   ONLY='e2e:(core|edge)' ...                       only the suites whose name matches
#
# Suite kinds: unit e2e client browser corpus (the default SUITES), valgrind (loopguard of
# BUILD under valgrind memcheck), tsan (BUILD is the ThreadSanitizer build), fuzz (BUILD is
# the fuzz build directory: each target is a suite). Files are discovered by glob, so a new
# tests/e2e/*.test.mjs or tests/unit/test_*.c is picked up without an edit here.
#
# JOBS=N runs up to N suites at once (default 1; `make test` uses 2 on two cores). Suites run
# in parallel are independent processes on their own ports and temporary files; each one's
# output is printed whole when it ends. A suite marked exclusive below (the valgrind suites,
# whose pacing checks need an unloaded machine) runs first, with at most corpus and fuzz
# suites beside it at nice 19.
#
# tests/run.sh --total FILE prints the totals of a test-summary file the same way;
# tests/run.sh --unnice PID... puts processes started at nice 19 back to 0 (as root).
set -u
cd "$(dirname "$0")/.."

# print_totals SUITES_PASSED SUITES_FAILED CASES_PASSED CASES_FAILED; the last line is the
# one CI reads.
print_totals() {
    echo "suites: $1 passed, $2 failed"
    echo "$3 passed, $4 failed"
}

# unnice PID...: the processes and their descendants back to nice 0 (only root may lower a
# nice value; for anyone else they stay as they are).
unnice() {
    local pids="$*" all=""
    while [ -n "${pids// /}" ]; do
        all="$all $pids"
        pids=$(ps -o pid= --ppid "$(echo $pids | tr ' ' ,)" 2>/dev/null | tr '\n' ' ')
    done
    renice -n 0 -p $all >/dev/null 2>&1 || true
}

if [ "${1:-}" = --unnice ]; then
    shift
    unnice "$@"
    exit 0
fi

if [ "${1:-}" = --total ]; then
    read -r sp sf cp cf < <(awk '{a += $1; b += $2; c += $3; d += $4}
                                END {print a + 0, b + 0, c + 0, d + 0}' "$2")
    print_totals "$sp" "$sf" "$cp" "$cf"
    [ "$sf" = 0 ] && [ "$cf" = 0 ]
    exit
fi

BUILD=${BUILD:-build}
SUITES=${SUITES:-"unit e2e client browser corpus"}
PASSES=${PASSES:-"$BUILD:$(echo $SUITES | tr ' ' ,)"}
JOBS=${JOBS:-1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-second_deadlock_stack=1}
suites_pass=0 suites_fail=0 cases_pass=0 cases_fail=0 failed=()
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lg-run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The queue: suite i is q_name[i], run by run_suite q_build[i] q_kind[i] q_arg[i];
# q_excl[i]=1 runs it alone.
q_name=() q_build=() q_kind=() q_arg=() q_excl=()
queue() { # NAME BUILD KIND ARG [EXCLUSIVE]
    [[ $1 =~ ${ONLY:-.} ]] || return 0
    q_name+=("$1") q_build+=("$2") q_kind+=("$3") q_arg+=("$4") q_excl+=("${5:-0}")
}

# The e2e files biggest first, so that the long suites start early and the short ones fill
# the gaps at the end.
e2e_files() { ls -S tests/e2e/*.test.mjs 2>/dev/null; }

for pass in $PASSES; do
    b=${pass%%:*}
    for s in $(echo "${pass#*:}" | tr , ' '); do
        case $s in
        unit)
            for t in "$b"/tests/test_*; do
                [ -x "$t" ] && queue "unit:${t##*/}" "$b" unit "$t"
            done ;;
        e2e)
            for t in $(e2e_files); do queue "e2e:${t##*/}" "$b" e2e "$t"; done ;;
        client | browser)
            for t in tests/"$s"/*.test.mjs; do
                [ -e "$t" ] && queue "$s:${t##*/}" "$b" node "$t"
            done ;;
        valgrind)
            for t in tests/e2e/exchange.test.mjs tests/e2e/normalise.test.mjs \
                     tests/e2e/faults.test.mjs tests/e2e/shutdown.test.mjs; do
                queue "valgrind:${t##*/}" "$b" valgrind "$t" 1
            done ;;
        tsan)
            # The ThreadSanitizer build with four workers: the suites whose requests,
            # retries, health checks and ejections cross threads.
            for t in tests/e2e/exchange.test.mjs tests/e2e/upstreams.test.mjs \
                     tests/e2e/faults.test.mjs; do
                queue "tsan:${t##*/}" "$b" tsan "$t"
            done
            # And the unit tests the Makefile built for it (TSAN_UNIT): threads that share
            # a structure.
            for t in "$b"/tests/test_*; do
                [ -x "$t" ] && queue "tsan:${t##*/}" "$b" unit "$t"
            done ;;
        corpus)
            for t in tests/corpus/*.sh; do
                [ -e "$t" ] && queue "corpus:${t##*/}" "$b" corpus "$t"
            done ;;
        fuzz)
            for t in "$b"/fuzz_*; do
                [ -f "$t" ] && [ -x "$t" ] && queue "fuzz:${t##*/fuzz_}" "$b" fuzz "${t##*/fuzz_}"
            done ;;
        *)
            echo "tests/run.sh: unknown suite kind '$s'" >&2
            exit 2 ;;
        esac
    done
done

node_test() { node --test --test-reporter=tap "$@"; }

# run_suite BUILD KIND ARG: the suite's command, with the build's binaries in the
# environment the suites read (tests/e2e/lib.mjs, tests/corpus/*.sh).
run_suite() {
    export BUILD=$1 LOOPGUARD_BIN="$PWD/$1/loopguard" FAKE_BIN="$PWD/$1/fake_upstream"
    # A suite whose servers were not built fails at once: node's test runner, shown a binary
    # it cannot spawn, waited forever (a failed TSan build, CI of 7079f3b).
    case $2 in
    e2e | node | valgrind | tsan)
        if [ ! -x "$LOOPGUARD_BIN" ] || [ ! -x "$FAKE_BIN" ]; then
            echo "tests/run.sh: no $1/loopguard or $1/fake_upstream (did that build fail?)" >&2
            return 1
        fi ;;
    esac
    case $2 in
    unit) "$3" ;;
    e2e | node) node_test "$3" ;;
    valgrind)
        LOOPGUARD_REAL_BIN="$LOOPGUARD_BIN" LOOPGUARD_BIN="$PWD/tests/valgrind-loopguard.sh" \
            node_test "$3" ;;
    tsan) LOOPGUARD_WORKERS=4 node_test "$3" ;;
    corpus) bash "$3" ;;
    fuzz) FUZZ_DIR=$1 tests/fuzz/run.sh "$3" ;;
    esac
}

# job I MODE: runs suite I with its output in $tmp/I.out (and on the terminal when MODE is
# live; at nice 19 when it is nice),
# then writes "STATUS WALL_SECONDS CPU_SECONDS" to $tmp/I.st. The CPU time is this
# subshell's children's (the suite and every process it waited for).
job() {
    local i=$1 t0=$SECONDS st
    [ "$2" = nice ] && renice -n 19 -p $BASHPID >/dev/null
    if [ "$2" = live ]; then
        (run_suite "${q_build[i]}" "${q_kind[i]}" "${q_arg[i]}") 2>&1 | tee "$tmp/$i.out"
        st=${PIPESTATUS[0]}
    else
        (run_suite "${q_build[i]}" "${q_kind[i]}" "${q_arg[i]}") >"$tmp/$i.out" 2>&1
        st=$?
    fi
    times >"$tmp/$i.times" # (a builtin in this shell: in a pipe it would count a fork's children)
    echo "$st $((SECONDS - t0)) $(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/)
        printf "%.1f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$tmp/$i.times")" >"$tmp/$i.st"
}

# finish I SHOWN: prints suite I's output (unless already shown live) and its line, and
# counts it.
finish() {
    local i=$1 name=${q_name[$1]} st secs cpu p f
    read -r st secs cpu <"$tmp/$i.st"
    if [ "$2" = 0 ]; then
        echo "== $name (${q_build[i]})"
        cat "$tmp/$i.out"
    fi
    read -r p f < <(awk '
        /^# pass [0-9]+$/                 { p += $3; n = 1 }
        /^# (fail|cancelled) [0-9]+$/     { f += $3; n = 1 }
        /^\[  PASSED  \] [0-9]+ test/     { p += $4; n = 1 }
        /^\[  FAILED  \] [0-9]+ test/     { f += $4; n = 1 }
        END { print (n ? p + 0 : -1), f + 0 }' "$tmp/$i.out")
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
        failed+=("$name (${q_build[i]})")
    fi
    cases_pass=$((cases_pass + p)) cases_fail=$((cases_fail + f))
    echo "-- $name: $p passed, $f failed ($secs s, $cpu s CPU)"
    rm -f "$tmp/$i.out"
}

# run_alone I: suite I with nothing else running, its output live.
run_alone() {
    echo "== ${q_name[$1]} (${q_build[$1]})"
    (job "$1" live)
    finish "$1" 1
}

t_start=$SECONDS
n=${#q_name[@]}
declare -A running=() # pid -> suite index
started=()            # suite index -> 1
# start I NICE: suite I in the background (at nice 19 when NICE=1).
start() {
    job "$1" "$([ "$2" = 1 ] && echo nice)" &
    running[$!]=$1 started[$1]=1
}
# reap: waits for one running suite to end, prints and counts it; its pid in done_pid.
reap() {
    wait -n -p done_pid
    finish "${running[$done_pid]}" 0
    unset "running[$done_pid]"
}
if [ "$JOBS" -le 1 ]; then
    for ((i = 0; i < n; i++)); do run_alone "$i"; done
else
    # First the exclusive suites, one at a time. Beside them, in the other slots, only the
    # suites that time nothing (corpus, fuzz: some unit tests pace a fake upstream) and at
    # nice 19, so that the CPU the exclusive suite leaves idle is used without slowing it.
    e=0 c=0 excl_pid=
    while :; do
        if [ -z "$excl_pid" ]; then
            while [ $e -lt $n ] && [ "${q_excl[e]}" != 1 ]; do e=$((e + 1)); done
            [ $e -lt $n ] || break
            start $e 0
            excl_pid=$! e=$((e + 1))
        fi
        while [ ${#running[@]} -lt "$JOBS" ] && [ $c -lt $n ]; do
            case ${q_excl[c]}:${q_kind[c]} in
            0:corpus | 0:fuzz) start $c 1 ;;
            esac
            c=$((c + 1))
        done
        reap
        [ "$done_pid" = "$excl_pid" ] && excl_pid=
    done
    # Nothing is timed any more: what still runs beside goes on at full priority.
    [ ${#running[@]} = 0 ] || unnice "${!running[@]}"
    # Then every other suite, JOBS at a time, in queue order.
    for ((i = 0; i < n; i++)); do
        [ -z "${started[i]:-}" ] || continue
        while [ ${#running[@]} -ge "$JOBS" ]; do reap; done
        start $i 0
    done
    while [ ${#running[@]} -gt 0 ]; do reap; done
fi
echo "-- $n suites in $((SECONDS - t_start)) s ($JOBS at a time): $PASSES"

[ ${#failed[@]} -eq 0 ] || printf 'FAILED: %s\n' "${failed[@]}"
if [ -d build ]; then
    echo "$suites_pass $suites_fail $cases_pass $cases_fail" >>build/test-summary
fi
print_totals "$suites_pass" "$suites_fail" "$cases_pass" "$cases_fail"
[ "$suites_fail" = 0 ]
