#!/bin/sh
# same_figures.sh "REFERENCE COMMAND" "COMMAND": runs both with PDP_SHORT=1 (an example's
# few-steps mode) and fails unless the second prints the same training figures as the first:
# every "loss N", "val N", "train N%" and "test N%" in order, as printed: equal strings, so to
# the digits the example prints (throughput and timings may differ).
# make emu-cuda-test uses it to hold an example's GPU run (on the CPU emulation of CUDA)
# to its CPU run.
# same_figures.sh --run-only "REFERENCE COMMAND" "COMMAND": runs the second alone and fails
# unless it succeeds and prints figures. For the sanitizer pass (make emu-cuda-test
# EMU_SAME_FIGURES=0): the plain pass has compared the figures, and the reference is the
# example's CPU path, which make sanitize runs under ASan already.
set -u
run_only=0
[ "${1:-}" = "--run-only" ] && { run_only=1; shift; }
[ $# -eq 2 ] || { echo "usage: $0 [--run-only] 'reference command' 'command'" >&2; exit 2; }
ref=$(mktemp) out=$(mktemp)
trap 'rm -f "$ref" "$out"' EXIT
figures() { grep -o 'loss [0-9.]*\|\<val [0-9][0-9.]*\|train [0-9.]*%\|test [0-9.]*%' "$1"; }
if [ $run_only = 1 ]; then
    PDP_SHORT=1 timeout 600 $2 > "$out" 2>&1 || { cat "$out"; echo "same_figures: '$2' failed"; exit 1; }
    cat "$out"
    [ -n "$(figures "$out")" ] || { echo "same_figures: '$2' printed no figures"; exit 1; }
    echo "same_figures: '$2' ran ($(figures "$out" | wc -l) figures; not compared: --run-only)"
    exit 0
fi
PDP_SHORT=1 timeout 600 $1 > "$ref" 2>&1 || { cat "$ref"; echo "same_figures: '$1' failed"; exit 1; }
PDP_SHORT=1 timeout 600 $2 > "$out" 2>&1 || { cat "$out"; echo "same_figures: '$2' failed"; exit 1; }
cat "$out"
if [ -z "$(figures "$ref")" ] || [ "$(figures "$ref")" != "$(figures "$out")" ]; then
    echo "same_figures: '$2' differs from '$1':"
    figures "$ref" > "$ref.f"; figures "$out" > "$out.f"
    diff "$ref.f" "$out.f"; rm -f "$ref.f" "$out.f"
    exit 1
fi
echo "same_figures: $(figures "$out" | wc -l) figures as '$1' prints them"
