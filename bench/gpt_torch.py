#!/usr/bin/env python3
"""PyTorch's side of bench/gpt.c: ms per GPT training step.

The model is tools/gpt_reference.py's architecture (nanoGPT's: pre-LayerNorm blocks,
c_attn / c_proj attention with the causal mask built per call, GELU tanh MLP, the head
tied to wte), sized as bench/gpt.c's shape of the run: by default the machine-sized model
(vocab 256, context 256, 6 layers, 6 heads, dim 384, batch 8 x 256); --shape
vocab,context,layers,heads,dim,batch,seq another (GPT-2 124M at 4 x 64:
--shape 50257,1024,12,12,768,4,64); dropout 0, torch.manual_seed(1), GPT-2's initialisation. The step is the
one bench/gpt.c times: zero_grad (set_to_none=False: pdp zeroes its gradients too),
forward, cross-entropy (mean), backward, AdamW (lr 6e-4, betas (0.9, 0.95), eps 1e-8,
weight_decay 0.1 on every parameter). A configuration ending in bf16 runs the forward
and the loss under torch.autocast("cpu", dtype=torch.bfloat16), as nanoGPT does.

Each figure is the median of `reps` steps after 2 warm-up steps. Prints one line per
configuration:

    <fp32|bf16> <threads> <ms_per_step>

Threads: as bench/train_torch.py, the count goes into OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS and MKL_NUM_THREADS before torch is imported (Debian's torch runs some
GEMMs on OpenBLAS, whose pool ignores torch.set_num_threads), so each thread count runs
in its own child process.

Usage: /usr/bin/python3 bench/gpt_torch.py [--reps 5] [--shape V,ctx,L,H,C,B,T] fp32:1 bf16:2 ...
"""
import math
import os
import statistics
import subprocess
import sys
import time

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
VOCAB, CONTEXT, LAYERS, HEADS, DIM, BATCH, SEQ = 256, 256, 6, 6, 384, 8, 256


def make_gpt():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(DIM, 3 * DIM)
            self.c_proj = nn.Linear(DIM, DIM)

        def forward(self, u):
            b, t, c = u.shape
            d = c // HEADS
            q, k, v = self.c_attn(u).split(c, dim=2)
            q, k, v = (z.view(b, t, HEADS, d).transpose(1, 2) for z in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            future = torch.ones(t, t, dtype=torch.bool).triu(1)
            y = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(DIM)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(DIM)
            self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(approximate="tanh"),
                                     nn.Linear(4 * DIM, DIM))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(VOCAB, DIM)
            self.wpe = nn.Embedding(CONTEXT, DIM)
            self.h = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f = nn.LayerNorm(DIM)
            self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
            self.lm_head.weight = self.wte.weight
            with torch.no_grad():
                for name, p in self.named_parameters():  # GPT-2's, as gpt_reference.py
                    if p.dim() == 2:
                        proj = name.endswith(("c_proj.weight", "mlp.2.weight"))
                        p.normal_(0.0, 0.02 / math.sqrt(2 * LAYERS) if proj else 0.02)

        def forward(self, ids, targets):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    return GPT()


def bench(bf16, threads, reps):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))

    def step():
        opt.zero_grad(set_to_none=False)
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(ids, targets)
        else:
            loss = model(ids, targets)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        ms.append(1e3 * (time.perf_counter() - t))
    return statistics.median(ms)


def main(argv):
    global VOCAB, CONTEXT, LAYERS, HEADS, DIM, BATCH, SEQ
    reps, configs, shape = 5, [], []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--reps":
            reps = int(args.pop(0))
        elif a == "--shape":
            shape = ["--shape", args.pop(0)]
            dims = [int(v) for v in shape[1].split(",")]
            if len(dims) != 7 or min(dims) < 1 or dims[6] > dims[1] or dims[4] % dims[3]:
                raise SystemExit("gpt_torch.py: bad --shape %r (V,ctx,L,H,C,B,T)" % shape[1])
            VOCAB, CONTEXT, LAYERS, HEADS, DIM, BATCH, SEQ = dims
        else:
            parts = a.split(":")
            if len(parts) != 2 or parts[0] not in ("fp32", "bf16"):
                raise SystemExit("gpt_torch.py: bad configuration %r (fp32|bf16:threads)" % a)
            configs.append((parts[0] == "bf16", int(parts[1])))
    if not configs:
        raise SystemExit("gpt_torch.py: no configuration given (fp32|bf16:threads)")
    counts = sorted({c[1] for c in configs})
    if len(counts) > 1 or any(os.environ.get(v) != str(counts[0]) for v in THREAD_VARS):
        for n in counts:  # a child per thread count, with the pools' sizes in its environment
            env = dict(os.environ, **{v: str(n) for v in THREAD_VARS})
            subprocess.run([sys.executable, __file__, "--reps", str(reps)] + shape
                           + ["%s:%d" % ("bf16" if c[0] else "fp32", c[1])
                              for c in configs if c[1] == n], env=env, check=True)
        return
    for bf16, threads in configs:
        ms = bench(bf16, threads, reps)
        print("%s %d %.1f" % ("bf16" if bf16 else "fp32", threads, ms), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
