#!/usr/bin/env bash
# tests/gpu/run.sh: everything that needs a GPU, in one script, under 5 minutes on one H100/H200.
#
#   1. make cuda: pdp_cuda.cu, the CUDA tests (test_cuda, test_optim, test_checkpoint), the GPU
#      bench and the examples, with nvcc (about 75 s on 2 cores, less with more);
#   2. build/cuda/test_cuda with PDP_TEST_REQUIRE_CUDA=1 (a skip for "no device" fails):
#      CPU-vs-GPU equivalence of every layer's forward and backward, both losses, SGD/Adam/AdamW,
#      gradient clipping, full MLP and CNN training steps (1e-5 relative, TF32 off), no
#      allocation after warm-up, DDP at world size 1 over NCCL, thread-rank DDP over every GPU,
#      DP over every GPU (at least two workers, so one GPU runs it with two threads) against
#      one CPU model; a GPT's layers and a whole GPT (pdp_gpt_create on the GPU, three AdamW
#      steps with dropout against the CPU), run again alone as the step "GPT on the GPU";
#   2b. examples/train_gpt -device cuda: a GPT of dim 384, 6 layers, 6 heads, context 256,
#      batch 8 x 256 (bench/gpt's machine-sized shape), 100 AdamW steps in fp32 and in bf16, and
#      under DDP on two GPUs when there are two; the summary shows the last tokens/s printed;
#   3. build/cuda/test_optim and build/cuda/test_checkpoint (their CUDA cases:
#      optim_cuda_matches_cpu, checkpoint_cuda_round_trip), also with PDP_TEST_REQUIRE_CUDA=1;
#   3b. compute-sanitizer, where the toolkit has it: memcheck over test_cuda (every device
#      access in bounds; its reports of failed API calls off, since NCCL probes its own
#      kernels that way and pdp checks each call it makes), racecheck over the GPT's and
#      the layers' cases (no shared-memory race), and a leak check over the release case
#      alone (pdp_cuda_release leaves no device memory behind); a report fails the step.
#      By hand on an H200: memcheck 28-33 s, racecheck 24 + 7 (the step and the leak check
#      not yet run there);
#   4. the NCCL world-size-1 test again with torchrun's variables set (the env path);
#   5. DDP over NCCL with two processes, one per GPU, when there are two GPUs or more. NCCL
#      does not allow two ranks of one communicator on the same device, so with one GPU this
#      step prints "skipped: one GPU";
#   6. the bench table: MLP and CNN samples/s, GEMM TFLOP/s beside cublasSgemm, elementwise
#      GB/s beside a device-to-device copy.
#
# Every step runs under a timeout cut to what is left of a 290 s budget, so the script ends
# within 5 minutes whatever hangs; a step that finds no time left fails. It ends with a table
# (step, result, seconds, the test binary's "P passed, F failed, S skipped" line).
#
# Usage: tests/gpu/run.sh [--quick]     (--quick: shorter bench; exit status 0 only when every
#                                        step passed or was skipped for want of a second GPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
quick=${1:-}
budget=290
t_begin=$(date +%s)
names=(); results=(); secs=(); lines=()
failed=0

left() { echo $(( budget - ($(date +%s) - t_begin) )); }

# record NAME RESULT SECONDS LINE
record() {
    names+=("$1"); results+=("$2"); secs+=("$3"); lines+=("$4")
    [ "$2" = FAIL ] && failed=1
    return 0
}

# step NAME CAP_SECONDS COMMAND...: runs COMMAND under min(CAP, time left), tees its output,
# and records PASS/FAIL with the harness summary line when there is one.
step() {
    local name=$1 cap=$2 t rc t0 out line
    shift 2
    t=$(left)
    [ "$t" -gt "$cap" ] && t=$cap
    echo "== $name (timeout ${t} s)"
    if [ "$t" -lt 5 ]; then
        record "$name" FAIL 0 "not run: the 290 s budget is spent"
        return 0
    fi
    t0=$(date +%s)
    out=$(mktemp)
    timeout "$t" "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$out" | tail -n 1)
    [ -n "$line" ] || line=$(grep -o '[0-9]* tokens/s' "$out" | tail -n 1) # train_gpt
    rm -f "$out"
    [ "$rc" -eq 124 ] && line="timed out after ${t} s${line:+; $line}"
    if [ "$rc" -eq 0 ]; then
        record "$name" PASS $(( $(date +%s) - t0 )) "$line"
    else
        record "$name" FAIL $(( $(date +%s) - t0 )) "exit $rc${line:+; $line}"
    fi
}

echo "== devices"
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L || true
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
else
    echo "(nvidia-smi not found)"
fi

step "make cuda" 200 make -j"$(nproc)" cuda

if [ "${results[0]}" = PASS ]; then
    export PDP_TEST_REQUIRE_CUDA=1
    step "test_cuda" 90 ./build/cuda/test_cuda -v
    step "GPT on the GPU" 30 ./build/cuda/test_cuda -v -t cuda_gpt
    gpt=(./build/cuda/train_gpt -device cuda -steps 100 -dim 384 -layers 6 -heads 6
         -context 256 -batch 8 -tokens 50)
    step "train_gpt -device cuda" 30 "${gpt[@]}"
    step "train_gpt -device cuda -precision bf16" 30 "${gpt[@]}" -precision bf16
    if [ "$ngpu" -ge 2 ]; then
        step "train_gpt -device cuda, ddp on 2 GPUs" 30 "${gpt[@]}" -strategy ddp -np 2
    fi
    step "test_optim (CUDA build)" 30 ./build/cuda/test_optim
    step "test_checkpoint (CUDA build)" 30 ./build/cuda/test_checkpoint
    if command -v compute-sanitizer >/dev/null 2>&1; then
        san=(compute-sanitizer --error-exitcode 9 --print-limit 20)
        step "memcheck test_cuda" 90 "${san[@]}" --tool memcheck --report-api-errors no \
            ./build/cuda/test_cuda
        step "racecheck, the GPT" 60 "${san[@]}" --tool racecheck ./build/cuda/test_cuda -t cuda_gpt
        step "racecheck, the layers" 30 "${san[@]}" --tool racecheck ./build/cuda/test_cuda \
            -t cuda_layers
        step "leak check, pdp_cuda_release" 30 "${san[@]}" --tool memcheck --leak-check full \
            --report-api-errors no ./build/cuda/test_cuda -t cuda_release_gives
    else
        echo "== compute-sanitizer: not found (skipped)"
        record "compute-sanitizer" SKIP 0 "not on the PATH"
    fi
    # RANK=0 WORLD_SIZE=1, as torchrun --nproc-per-node 1 sets them
    step "NCCL from the environment, 1 process" 45 \
        env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 \
        ./build/cuda/test_cuda -t cuda_ddp_nccl_world_size_1

    if [ "$ngpu" -ge 2 ]; then
        name="DDP over NCCL, 2 processes on 2 GPUs"
        t=$(left); [ "$t" -gt 60 ] && t=60
        echo "== $name (timeout ${t} s)"
        t0=$(date +%s)
        mp_rc=0
        summary=""
        if [ "$t" -lt 5 ]; then
            mp_rc=1; summary="not run: the 290 s budget is spent"
        else
            pids=()
            for r in 0 1; do
                RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
                    MASTER_PORT=29541 timeout "$t" ./build/cuda/test_cuda -v \
                    -t cuda_ddp_nccl_processes > "build/cuda/ddp_rank$r.log" 2>&1 &
                pids+=($!)
            done
            for r in 0 1; do
                wait "${pids[$r]}" || mp_rc=1
                sed "s/^/[rank $r] /" "build/cuda/ddp_rank$r.log"
                l=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' \
                    "build/cuda/ddp_rank$r.log" | tail -n 1)
                summary="$summary${summary:+; }rank $r: ${l:-no summary}"
                # the test skips without WORLD_SIZE: here it must have run and passed
                [ "$l" = "1 passed, 0 failed, 0 skipped" ] || mp_rc=1
            done
        fi
        if [ "$mp_rc" -eq 0 ]; then
            record "$name" PASS $(( $(date +%s) - t0 )) "$summary"
        else
            record "$name" FAIL $(( $(date +%s) - t0 )) "$summary"
        fi
    else
        why="skipped: one GPU"
        [ "$ngpu" -eq 1 ] || why="skipped: $ngpu GPUs"
        echo "== DDP over NCCL, 2 processes: $why (NCCL needs a device per rank)"
        record "DDP over NCCL, 2 processes" SKIP 0 "$why"
    fi
    unset PDP_TEST_REQUIRE_CUDA

    step "bench_gpu${quick:+ $quick}" 60 ./build/cuda/bench_gpu $quick
fi

echo
echo "== summary (whole run $(( $(date +%s) - t_begin )) s, budget ${budget} s)"
printf '%-40s %-6s %6s  %s\n' "step" "result" "s" "tests"
for i in "${!names[@]}"; do
    printf '%-40s %-6s %6s  %s\n' "${names[$i]}" "${results[$i]}" "${secs[$i]}" "${lines[$i]}"
done
exit $failed
