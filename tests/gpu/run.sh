#!/usr/bin/env bash
# tests/gpu/run.sh: everything that needs a GPU, in one script (under 5 minutes on one H100/H200).
#
#   1. builds pdp_cuda.cu, the CUDA test, the GPU bench and the examples with nvcc (make cuda);
#   2. runs build/cuda/test_cuda with PDP_TEST_REQUIRE_CUDA=1 (a skip for "no device" fails):
#      CPU-vs-GPU equivalence of every layer's forward and backward, both losses, SGD/Adam/AdamW,
#      full MLP and CNN training steps (1e-5 relative, TF32 off), no allocation after warm-up,
#      DDP at world size 1 over NCCL, thread-rank DDP and DP over every GPU present;
#   3. runs the NCCL world-size-1 test again with torchrun's variables set (the env path);
#   4. prints the bench table: MLP and CNN samples/s, GEMM TFLOP/s beside cublasSgemm,
#      elementwise GB/s beside a device-to-device copy.
#
# Usage: tests/gpu/run.sh [--quick]     (exit status: 0 only when every test passed)
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=${1:-}

echo "== devices"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"

echo "== make cuda"
start=$(date +%s)
make -j"$(nproc)" cuda
echo "built in $(( $(date +%s) - start )) s"

echo "== CUDA tests (skips are failures)"
PDP_TEST_REQUIRE_CUDA=1 timeout 180 ./build/cuda/test_cuda -v

echo "== NCCL from the environment (RANK=0 WORLD_SIZE=1, as torchrun --nproc-per-node 1 sets)"
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 \
    PDP_TEST_REQUIRE_CUDA=1 timeout 60 ./build/cuda/test_cuda -t cuda_ddp_nccl_world_size_1

echo "== bench"
timeout 120 ./build/cuda/bench_gpu $quick
echo "== done in $(( $(date +%s) - start )) s"
