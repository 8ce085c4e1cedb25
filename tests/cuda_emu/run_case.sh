#!/bin/sh
# run_case.sh N PROGRAM TEST: runs the one test TEST of PROGRAM (its exact name) on N
# emulated GPUs and fails unless it ran and passed. greatest's exit status alone would pass
# a filter that matches no test and a test that skips for want of GPUs (SKIPm, which
# PDP_TEST_REQUIRE_CUDA=1 does not turn into a failure): make emu-cuda-test runs its cases
# that need 3 or 4 GPUs through this, so a renamed or skipped case cannot pass CI silently.
n=$1 prog=$2 name=$3
out=$(PDP_EMU_CUDA_DEVICES=$n PDP_TEST_REQUIRE_CUDA=1 timeout 600 "$prog" -e -t "$name" 2>&1)
st=$?
printf '%s\n' "$out"
[ "$st" -eq 0 ] || exit "$st"
printf '%s\n' "$out" | grep -qx '1 passed, 0 failed, 0 skipped' && exit 0
echo "run_case.sh: $name did not run and pass on $n emulated GPUs" >&2
exit 1
