#!/usr/bin/env bash
# tests/gpu/profile.sh: where a GPT step's GPU time goes, kernel by kernel, on a GPU machine.
#
# Nsight Compute (ncu) times each kernel of build/cuda/train_gpt (run.sh's shape: dim 384,
# 6 layers, 6 heads, context 256, batch 8) over LAUNCHES launches after the first SKIP (the
# warm-up steps), and this script sums them by kernel: calls, total and per-call time, share.
# ncu serialises the kernels and leaves the clocks alone (--clock-control none), so the
# total is the GPU's busy time for those launches, not a step's wall time; the shares are
# what to speed up. About 30 s on an H200; make cuda first (tests/gpu/run.sh does).
#
# Usage: tests/gpu/profile.sh [-precision bf16] [any other train_gpt options]
#        SKIP=3000 LAUNCHES=1500 TOP=25 tests/gpu/profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
skip=${SKIP:-3000} launches=${LAUNCHES:-1500} top=${TOP:-25}
command -v ncu >/dev/null 2>&1 || { echo "profile.sh: ncu (Nsight Compute) not found"; exit 2; }
[ -x build/cuda/train_gpt ] || { echo "profile.sh: no build/cuda/train_gpt: make cuda"; exit 2; }
out=$(mktemp)
timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "$skip" \
    --launch-count "$launches" --print-summary per-kernel ./build/cuda/train_gpt -device cuda \
    -steps 30 -dim 384 -layers 6 -heads 6 -context 256 -batch 8 -tokens 0 "$@" > "$out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then tail -20 "$out"; rm -f "$out"; echo "profile.sh: ncu exit $rc"; exit 1; fi
awk -v top="$top" '
    / Invocations [0-9]+$/ { name = $0; sub(/^ +/, "", name); sub(/\(.*/, "", name)
                             calls = $NF; next }
    /gpu__time_duration.sum/ && name != "" {
        us = $5; gsub(",", "", us); us *= ($2 == "ns" ? 1e-3 : $2 == "ms" ? 1e3 : 1)
        t[name] += us * calls; n[name] += calls; total += us * calls; all += calls; name = "" }
    END {
        printf "%d launches, %.0f us of GPU time\n", all, total
        printf "%-56s %6s %10s %9s %6s\n", "kernel", "calls", "total us", "us/call", "share"
        for (k in t) printf "%-56s %6d %10.0f %9.1f %5.1f%%\n", substr(k, 1, 56), n[k], t[k],
                            t[k] / n[k], 100 * t[k] / total | "sort -k3 -n -r | head -" top
    }' "$out"
rm -f "$out"
