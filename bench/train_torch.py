#!/usr/bin/env python3
"""PyTorch's side of bench/train.c: samples/s of one full training step.

The step is the one bench/train.c times: forward, softmax cross-entropy (mean),
backward, SGD step (lr 0.01), gradients zeroed. Models, batch sizes and thread
counts come from the command line; each figure is the median of `reps` timed
repetitions after a warm-up, each repetition running the step for about
`rep_s` seconds. Prints one line per configuration:

    <model> <batch> <threads> <samples_per_second>

Usage: /usr/bin/python3 bench/train_torch.py [--reps 7] [--rep-s 0.3] mlp:128:1 cnn:128:2 ...
"""
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10)), (784,)
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 10)), (1, 28, 28)
    raise SystemExit("train_torch.py: unknown model %r (mlp or cnn)" % name)


def bench(name, batch, threads, reps, rep_s):
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model, shape = make_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand((batch,) + shape)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=False)
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
            name, batch, threads = a.split(":")
            configs.append((name, int(batch), int(threads)))
    for name, batch, threads in configs:
        rate = bench(name, batch, threads, reps, rep_s)
        print("%s %d %d %.1f" % (name, batch, threads, rate), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
