#!/usr/bin/env bash
# Runs loopguard under valgrind memcheck: the e2e suites use it as LOOPGUARD_BIN for the
# `valgrind` suite of tests/run.sh. Any invalid access or definite leak makes loopguard
# exit 97, which the suites' stop() reports as a failure.
# loopguard rejects LOOPGUARD_* variables that name no configuration key: take ours out.
real=${LOOPGUARD_REAL_BIN:?}
unset LOOPGUARD_REAL_BIN
exec valgrind --quiet --error-exitcode=97 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --track-fds=no --child-silent-after-fork=yes \
    "$real" "$@"
