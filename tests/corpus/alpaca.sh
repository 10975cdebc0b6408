#!/usr/bin/env bash
# Guard recall and false trips on real model answers: the AlpacaEval dev corpus
# (../shared/corpus/alpaca-dev) against the hand labels in tests/corpus/labels/, measured by
# tests/corpus/alpaca_eval.py (see tests/corpus/README.md). Run by tests/run.sh with
# LOOPGUARD_BIN pointing at the binary under test.
#
# ENFORCE=0 reports the figures and fails only when it cannot measure (no binary, no corpus,
# a label that no longer matches its answer); ENFORCE=1 also fails when a target of the guard
# issue is missed. It is 1 since the guard met the targets (README: "Enforcing").
ENFORCE=1
set -u
cd "$(dirname "$0")/../.."
: "${LOOPGUARD_BIN:=$PWD/build/loopguard}"
export LOOPGUARD_BIN
mode=--report
[ "${ALPACA_ENFORCE:-$ENFORCE}" = 1 ] && mode=
exec python3 tests/corpus/alpaca_eval.py $mode
