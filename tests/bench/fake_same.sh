#!/usr/bin/env bash
# fake_same.sh [REV] — does this tree's fake upstream write what REV's writes (default:
# main)? For speed work on the fake (tests/fake/), whose bytes must not move: builds REV's
# tests/fake/ and this tree's (uncommitted edits included) and runs fake_same.py over both:
# some 39,000 requests, every kind, dialect, endpoint and fault, each response compared
# byte for byte but for the values that differ between any two runs (times, random ids).
# Exit 0: identical; 1: they differ (the first differences are shown). About 90 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:-main}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/rev"
git archive "$REV" tests/fake | tar -x -C "$work/rev"

# build DIR BIN: the fake of DIR's tests/fake/.
build() {
    # shellcheck disable=SC2046 # pkg-config prints several words on purpose
    cc -std=c11 -D_GNU_SOURCE -O2 $(pkg-config --cflags libcjson) "$1"/tests/fake/*.c -o "$2" \
        $(pkg-config --libs libcjson) -lm
}

build "$work/rev" "$work/rev.bin"
build . "$work/this.bin"
if python3 tests/bench/fake_same.py "$work/rev.bin" "$work/this.bin"; then
    echo "fake_same: identical to $REV"
    exit 0
fi
echo "fake_same: this tree's fake writes otherwise than $REV's" >&2
exit 1
