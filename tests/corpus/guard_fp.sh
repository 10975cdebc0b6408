#!/usr/bin/env bash
# Guard corpus test (fp): see tests/corpus/corpus.py for what it gathers and asserts.
# Run by tests/run.sh with LOOPGUARD_BIN pointing at the binary under test.
set -eu
cd "$(dirname "$0")/../.."
: "${LOOPGUARD_BIN:=$PWD/build/loopguard}"
export LOOPGUARD_BIN
if [ ! -x "$LOOPGUARD_BIN" ]; then
    echo "guard_fp: $LOOPGUARD_BIN is not built" >&2
    exit 1
fi
exec python3 tests/corpus/corpus.py fp
