#!/usr/bin/env python3
"""PyTorch's side of bench/gemm.c: GFLOP/s of one matrix product, fp32 and bf16.

For each shape M:K:N:OP (OP as bench/gemm.c writes it: NN is A*B, NT is A*B^T, TN is
A^T*B, with A and B row-major as pdp_sgemm takes them) prints one line

    <M:K:N:OP> <matmul fp32> <oneDNN fp32> <matmul bf16> <matmul fp32->bf16>

in GFLOP/s (2 M N K flops per call), each the median of `reps` timed repetitions of
about `rep_s` seconds after a warm-up:

  matmul fp32  torch.matmul on float32 views laid out as the shape says (a transposed
               operand is a .t() view, as nn.Linear's backward passes them). This
               build's fp32 matmul is its BLAS (torch.__config__: BLAS_INFO), not
               oneDNN.
  oneDNN fp32  torch._C._nn.mkldnn_linear(a, w): oneDNN's inner product, y = a w^T,
               on mkldnn tensors made before timing (op(A) and op(B)^T materialised:
               oneDNN picks its own layout, so the layout costs nothing here).
               -1 when this torch has no mkldnn.
  matmul bf16  torch.matmul on bfloat16 views laid out as the shape says: on a CPU
               with AVX512-BF16 or AMX, PyTorch sends it to oneDNN (what
               torch.autocast's Linear runs), on operands already in bf16: it reads
               half the bytes of an fp32 operand and converts nothing.
  matmul fp32->bf16
               torch.matmul(a.bfloat16(), b.bfloat16()) on the float32 views of the
               first column: the two conversions (each keeps its operand's strides, as
               autocast's cast does) are timed with the product, as autocast pays them
               where a Linear's inputs arrive in fp32 (the forward: activations and
               weights; its backward reuses the bf16 copies autocast saved). This is
               the like-for-like peer of pdp_gemm_bf16, which takes fp32 and rounds to
               bf16 as it packs.

The thread count goes into OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and
MKL_NUM_THREADS before torch is imported (the BLAS's own pool ignores
torch.set_num_threads), and into torch.set_num_threads.

Usage: /usr/bin/python3 bench/gemm_torch.py [--threads 1] [--reps 7] [--rep-s 0.1] \\
           512:784:512:NT 512:512:784:TN ...
"""
import os
import statistics
import sys
import time


def rate(fn, flops, reps, rep_s):
    for _ in range(3):
        fn()
    t, calls = time.perf_counter(), 0
    while time.perf_counter() - t < rep_s / 2 or calls < 2:
        fn()
        calls += 1
    iters = max(1, int(rep_s / ((time.perf_counter() - t) / calls)))
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        rates.append(flops * iters / (time.perf_counter() - t) * 1e-9)
    return statistics.median(rates)


def operands(torch, m, k, n, op, dtype):
    """op(A)[m,k] and op(B)[k,n] as views of row-major storage laid out as op says."""
    a = torch.rand(k, m) - 0.5 if op[0] == "T" else torch.rand(m, k) - 0.5
    b = torch.rand(n, k) - 0.5 if op[1] == "T" else torch.rand(k, n) - 0.5
    a, b = a.to(dtype), b.to(dtype)
    return (a.t() if op[0] == "T" else a), (b.t() if op[1] == "T" else b)


def main(argv):
    threads, reps, rep_s, shapes = 1, 7, 0.1, []
    args = list(argv)
    while args:
        x = args.pop(0)
        if x == "--threads":
            threads = int(args.pop(0))
        elif x == "--reps":
            reps = int(args.pop(0))
        elif x == "--rep-s":
            rep_s = float(args.pop(0))
        else:
            p = x.split(":")
            if len(p) != 4 or p[3] not in ("NN", "NT", "TN", "TT"):
                raise SystemExit("gemm_torch.py: bad shape %r (M:K:N:OP)" % x)
            shapes.append((int(p[0]), int(p[1]), int(p[2]), p[3]))
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(threads)
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(1)
    have_mkldnn = torch.backends.mkldnn.is_available()
    for m, k, n, op in shapes:
        flops = 2.0 * m * n * k
        a, b = operands(torch, m, k, n, op, torch.float32)
        r32 = rate(lambda: torch.matmul(a, b), flops, reps, rep_s)
        rdnn = -1.0
        if have_mkldnn:
            am, wm = a.contiguous().to_mkldnn(), b.t().contiguous().to_mkldnn()
            rdnn = rate(lambda: torch._C._nn.mkldnn_linear(am, wm, None), flops, reps, rep_s)
        a16, b16 = operands(torch, m, k, n, op, torch.bfloat16)
        r16 = rate(lambda: torch.matmul(a16, b16), flops, reps, rep_s)
        rcvt = rate(lambda: torch.matmul(a.bfloat16(), b.bfloat16()), flops, reps, rep_s)
        print("%d:%d:%d:%s %.1f %.1f %.1f %.1f" % (m, k, n, op, r32, rdnn, r16, rcvt),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
