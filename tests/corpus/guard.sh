#!/usr/bin/env bash
# Guard corpus tests: false positives on >= 2,000 real files, then recall on loops injected
# into real text (see tests/corpus/corpus.py for what each gathers and asserts). Run by
# tests/run.sh with LOOPGUARD_BIN pointing at the binary under test; fails if either fails.
set -u
cd "$(dirname "$0")/../.."
: "${LOOPGUARD_BIN:=$PWD/build/loopguard}"
export LOOPGUARD_BIN
if [ ! -x "$LOOPGUARD_BIN" ]; then
    echo "guard corpus: $LOOPGUARD_BIN is not built" >&2
    exit 1
fi
rc=0
python3 tests/corpus/corpus.py fp || rc=1
python3 tests/corpus/corpus.py recall || rc=1
exit $rc
