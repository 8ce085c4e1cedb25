#!/bin/sh
# bench/llmc/gpt_llmc.sh: builds and runs bench/llmc/gpt_llmc.c, llm.c's CPU trainer (train_gpt2.c)
# timed for bench/gpt.c, against the copy of llm.c named by PDP_LLMC (never committed here:
# fetch it yourself, e.g. git clone https://github.com/karpathy/llm.c).
#
#   PDP_LLMC=/path/to/llm.c bench/llmc/gpt_llmc.sh threads vocab context layers heads dim batch seq reps
#
# prints "fp32 <threads> <median ms per step>" (the step's lines go to stderr). The build
# takes llm.c's Makefile's own CC, CFLAGS, LDFLAGS and LDLIBS (asked of its Makefile: -Ofast,
# -march=native, OpenMP where found), into build/gpt_llmc, rebuilt when llm.c's train_gpt2.c
# or bench/llmc/gpt_llmc.c is newer. The random checkpoint and tokens go to build/llmc/ (about
# 0.5 GB for GPT-2 124M), reused while their size is right. Exit 3: no llm.c at PDP_LLMC.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$#" -ne 9 ]; then
    echo "usage: PDP_LLMC=/path/to/llm.c $0 threads vocab context layers heads dim batch seq reps" >&2
    exit 2
fi
llmc=${PDP_LLMC:-}
if [ -z "$llmc" ] || [ ! -f "$llmc/train_gpt2.c" ] || [ ! -f "$llmc/Makefile" ]; then
    echo "gpt_llmc.sh: no llm.c at PDP_LLMC='$llmc' (its train_gpt2.c and Makefile)" >&2
    exit 3
fi
bin=$root/build/gpt_llmc
mkdir -p "$root/build/llmc"
if [ ! -x "$bin" ] || [ "$llmc/train_gpt2.c" -nt "$bin" ] || [ "$root/bench/llmc/gpt_llmc.c" -nt "$bin" ]; then
    mk=$(mktemp)
    printf 'pdp-print-flags:\n\t@echo "$(CC)|$(CFLAGS)|$(LDFLAGS)|$(LDLIBS)"\n' > "$mk"
    flags=$(make -s -C "$llmc" -f Makefile -f "$mk" pdp-print-flags 2>/dev/null | tail -n 1)
    rm -f "$mk"
    cc=${flags%%|*}; rest=${flags#*|}
    cflags=${rest%%|*}; rest=${rest#*|}
    ldflags=${rest%%|*}; ldlibs=${rest#*|}
    echo "gpt_llmc.sh: $cc $cflags -I$llmc bench/llmc/gpt_llmc.c $ldflags $ldlibs" >&2
    # shellcheck disable=SC2086 # the flags are words
    $cc $cflags -I"$llmc" "$root/bench/llmc/gpt_llmc.c" $ldflags $ldlibs -o "$bin"
fi
threads=$1
shift
OMP_NUM_THREADS=$threads exec "$bin" "$@" "$root/build/llmc"
