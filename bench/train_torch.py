#!/usr/bin/env python3
"""PyTorch's side of bench/train.c: samples/s of one full training step.

The step is the one bench/train.c times: forward, softmax cross-entropy (mean),
backward, SGD step (lr 0.01), gradients zeroed. Models, batch sizes and thread
counts come from the command line; each figure is the median of `reps` timed
repetitions after a warm-up, each repetition running the step for about
`rep_s` seconds. Prints one line per configuration:

    <model> <batch> <threads> <samples_per_second>

A configuration ending in :bf16 runs the forward pass and the loss under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's CPU mixed precision (bf16
GEMM and convolution inputs, fp32 weights, gradients and optimizer).

Threads: torch.set_num_threads(n) sets OpenMP's count, but Debian's torch runs
Linear's GEMMs on OpenBLAS (BLAS_INFO=generic), whose own thread pool ignores it:
"1 thread" then used both cores of the box (182% CPU for mlp:512:1). So the thread
count is also put into OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS
before torch is imported; configurations with different thread counts therefore
run in one child process per count.

Usage: /usr/bin/python3 bench/train_torch.py [--reps 7] [--rep-s 0.3] mlp:128:1 cnn:128:2 \
           mlp:512:1:bf16 ...
"""
import os
import statistics
import subprocess
import sys
import time

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def make_model(name):
    import torch.nn as nn

    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10)), (784,)
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 10)), (1, 28, 28)
    raise SystemExit("train_torch.py: unknown model %r (mlp or cnn)" % name)


def bench(name, batch, threads, bf16, reps, rep_s):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model, shape = make_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand((batch,) + shape)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=False)
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    t = time.perf_counter()
    calls = 0
    while time.perf_counter() - t < rep_s / 2 or calls < 2:
        step()
        calls += 1
    per_call = (time.perf_counter() - t) / calls
    iters = max(2, int(rep_s / per_call))
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            step()
        rates.append(batch * iters / (time.perf_counter() - t))
    return statistics.median(rates)


def main(argv):
    reps, rep_s, configs = 7, 0.3, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--reps":
            reps = int(args.pop(0))
        elif a == "--rep-s":
            rep_s = float(args.pop(0))
        else:
            parts = a.split(":")
            if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "bf16"):
                raise SystemExit("train_torch.py: bad configuration %r (model:batch:threads[:bf16])"
                                 % a)
            configs.append((parts[0], int(parts[1]), int(parts[2]), len(parts) == 4))
    if not configs:
        raise SystemExit("train_torch.py: no configuration given (model:batch:threads)")
    counts = sorted({c[2] for c in configs})
    if len(counts) > 1 or any(os.environ.get(v) != str(counts[0]) for v in THREAD_VARS):
        for n in counts:  # a child per thread count, with the pools' sizes in its environment
            env = dict(os.environ, **{v: str(n) for v in THREAD_VARS})
            subprocess.run([sys.executable, __file__, "--reps", str(reps), "--rep-s", str(rep_s)]
                           + ["%s:%d:%d%s" % (c[0], c[1], c[2], ":bf16" if c[3] else "")
                              for c in configs if c[2] == n], env=env, check=True)
        return
    for name, batch, threads, bf16 in configs:
        rate = bench(name, batch, threads, bf16, reps, rep_s)
        print("%s %d %d %.1f" % (name, batch, threads, rate), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
