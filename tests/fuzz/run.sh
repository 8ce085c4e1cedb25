#!/bin/sh
# tests/fuzz/run.sh - builds the libFuzzer harnesses of tests/fuzz/ (clang, ASan + UBSan) into
# build/fuzz/ and runs each for FUZZ_SECONDS (default 60) on its corpus there, which grows
# from run to run (checkpoints start from files fuzz_ckpt.c's GEN_SEEDS build saves). Any
# crash, sanitizer report, hang (5 s), 2 GB of memory or a failure without a "pdp_" message
# stops the run; libFuzzer leaves the input in build/fuzz/<name>-crash-* (or -oom-, -timeout-). `make fuzz`;
# `make fuzz FUZZ=store` for one. Not part of make test or CI: a minute of fuzzing a target
# finds little that a longer run would not, and it needs clang's libFuzzer.
#   Harnesses: fuzz_gzip (src/inflate.c, and IDX parsing), fuzz_data (IDX and token
#   loaders), fuzz_ckpt (checkpoints, ZeRO shards, src/json.c), fuzz_store (the TCP store's
#   server against raw clients; a proper client checked after each), fuzz_args
#   (pdp_args_parse).
set -e
B=${B:-build/fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
TARGETS=${FUZZ:-gzip data ckpt store args}
CC_FUZZ=${CC_FUZZ:-clang}
FLAGS="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I."
mkdir -p "$B"
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { (void)d; return (int)n * 0; }' |
    $CC_FUZZ -fsanitize=fuzzer -x c - -o "$B/probe" 2> /dev/null; then
    echo "fuzz: $CC_FUZZ cannot build libFuzzer programs (apt-get install clang)"
    exit 1
fi
for t in $TARGETS; do
    $CC_FUZZ $FLAGS "tests/fuzz/fuzz_$t.c" -o "$B/fuzz_$t" -lm -lpthread
    mkdir -p "$B/corpus_$t"
    if [ "$t" = ckpt ] && [ -z "$(ls "$B/corpus_$t")" ]; then
        $CC_FUZZ -g -O1 -DGEN_SEEDS -I. tests/fuzz/fuzz_ckpt.c -o "$B/gen_ckpt" -lm -lpthread
        "$B/gen_ckpt" "$B/corpus_$t"
    fi
    echo "== fuzz_$t: $SECONDS_EACH s"
    if ! (cd "$B" && ./"fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=5 -rss_limit_mb=2048 \
        -artifact_prefix="$t-" -print_final_stats=1 "corpus_$t" > "fuzz_$t.log" 2>&1); then
        tail -40 "$B/fuzz_$t.log"
        echo "fuzz_$t: FAILED (its log: $B/fuzz_$t.log; the input: $B/$t-*)"
        exit 1
    fi
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|cov:" "$B/fuzz_$t.log" | tail -3
done
