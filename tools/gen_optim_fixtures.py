#!/usr/bin/python3
"""Write tests/fixtures/optim_*.bin: PyTorch reference runs for tests/test_optim.c.

Two kinds, both computed by torch in float32 with the single-tensor optimizers
(foreach=False, PyTorch's default on the CPU) and hyper-parameters given as
Python floats (doubles), exactly as a PyTorch user writes them:

1. Training runs, optim_<model>_<optim>.bin: the initial parameters, a fixed
   input batch and labels, the mean cross-entropy loss of each of 3 training
   steps, and the parameters after the 3 steps (forward, cross_entropy,
   backward, optimizer.step, zero_grad).
   Models (nn.Sequential, so state_dict names are pdp's):
     mlp: Linear(6, 5), ReLU, Linear(5, 3)                           input [4, 6]
     cnn: Conv2d(1, 2, 3), ReLU, MaxPool2d(2), Flatten, Linear(8, 3)  input [4, 1, 6, 6]
   Optimizers:
     sgd_nesterov: SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
     sgd_damp:     SGD(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)
     adam:         Adam(lr=0.01, weight_decay=0.01)   (default betas (0.9, 0.999), eps 1e-8)
     adamw:        AdamW(lr=0.01, weight_decay=0.1)   (default betas and eps)
   (Before issue 21 these used float32-exact values, 0.875 and 0.96875, so that
   pdp's then-float hyper-parameters agreed with torch's doubles: that hid
   Adam's float 1 - beta2.)

2. Optimizer-only runs, optim_raw_<optim>.bin: one flat parameter of RAW_N
   floats (pdp: the flat block of Linear(20, 47), 940 + 47), RAW_STEPS given
   gradients (no model: the optimizer's arithmetic alone), and the parameter and
   the optimizer's state after them. Gradient magnitudes span 1e-9 to 10 per
   element, so eps matters for some elements and not for others.
     adam:     Adam()                                  every default: lr 1e-3,
                                                       betas (0.9, 0.999), eps 1e-8
     adam_l2:  Adam(weight_decay=0.01)
     adamw:    AdamW()                                 defaults, weight_decay 0.01
     adamw_b:  AdamW(lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
     sgd_damp: SGD(lr=0.05, momentum=0.9, dampening=0.9, weight_decay=1e-4)
     sgd_nest: SGD(lr=0.05, momentum=0.95, nesterov=True, weight_decay=5e-4)
   Tensors: "init" [RAW_N], "grads" [RAW_STEPS, RAW_N], "final" [RAW_N] and the
   state: "final.exp_avg" and "final.exp_avg_sq" (Adam, AdamW) or
   "final.momentum_buffer" (SGD).

Fixture format (shared by pdp's tests): magic "PDPFIX01", uint32 tensor count,
then per tensor: uint32 name length, name bytes, uint32 ndim, int64 dims[ndim],
float32 data, all little-endian. Tensor names of the training runs: "x",
"labels" (class indices stored as floats), "loss" [3], "init.<param>",
"final.<param>".

Run with a Python that has torch (Debian: /usr/bin/python3 with python3-torch):
  /usr/bin/python3 tools/gen_optim_fixtures.py
"""
import os
import struct
import sys

import torch
from torch import nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
RAW_N = 20 * 47 + 47
RAW_STEPS = 10


def write_fixture(path, tensors):
    with open(path, "wb") as f:
        f.write(b"PDPFIX01")
        f.write(struct.pack("<I", len(tensors)))
        for name, t in tensors:
            t = t.detach().to(torch.float32).contiguous()
            nb = name.encode("ascii")
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<I", t.dim()))
            for d in t.shape:
                f.write(struct.pack("<q", d))
            f.write(struct.pack("<%df" % t.numel(), *t.flatten().tolist()))


def make_model(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8, 3))


def make_optim(kind, params):
    if kind == "sgd_nesterov":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                               foreach=False)
    if kind == "sgd_damp":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01,
                               foreach=False)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01, weight_decay=0.01, foreach=False)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=False)


def make_raw_optim(kind, params):
    if kind == "adam":
        return torch.optim.Adam(params, foreach=False)
    if kind == "adam_l2":
        return torch.optim.Adam(params, weight_decay=0.01, foreach=False)
    if kind == "adamw":
        return torch.optim.AdamW(params, foreach=False)
    if kind == "adamw_b":
        return torch.optim.AdamW(params, lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1,
                                 foreach=False)
    if kind == "sgd_damp":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, dampening=0.9, weight_decay=1e-4,
                               foreach=False)
    return torch.optim.SGD(params, lr=0.05, momentum=0.95, nesterov=True, weight_decay=5e-4,
                           foreach=False)


def training_runs():
    for mi, model_kind in enumerate(["mlp", "cnn"]):
        for oi, optim_kind in enumerate(["sgd_nesterov", "sgd_damp", "adam", "adamw"]):
            torch.manual_seed(1000 + 10 * mi + oi)
            model = make_model(model_kind)
            x = torch.randn(4, 6) if model_kind == "mlp" else torch.randn(4, 1, 6, 6)
            labels = torch.tensor([0, 2, 1, 2])
            init = [("init." + k, v.clone()) for k, v in model.state_dict().items()]
            opt = make_optim(optim_kind, model.parameters())
            losses = []
            for _ in range(3):
                loss = nn.functional.cross_entropy(model(x), labels)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            final = [("final." + k, v.clone()) for k, v in model.state_dict().items()]
            tensors = [("x", x), ("labels", labels.float()), ("loss", torch.tensor(losses))]
            path = os.path.join(OUT, "optim_%s_%s.bin" % (model_kind, optim_kind))
            write_fixture(path, tensors + init + final)
            print("wrote %s (torch %s)" % (os.path.relpath(path), torch.__version__))


def raw_runs():
    kinds = ["adam", "adam_l2", "adamw", "adamw_b", "sgd_damp", "sgd_nest"]
    for ki, kind in enumerate(kinds):
        torch.manual_seed(2000 + ki)
        init = torch.randn(RAW_N) * 0.5
        scale = 10.0 ** (torch.rand(RAW_N) * 10.0 - 9.0)  # 1e-9 .. 10, fixed per element
        grads = torch.randn(RAW_STEPS, RAW_N) * scale
        p = nn.Parameter(init.clone())
        opt = make_raw_optim(kind, [p])
        for s in range(RAW_STEPS):
            p.grad = grads[s].clone()
            opt.step()
        st = opt.state[p]
        names = ["momentum_buffer"] if kind.startswith("sgd") else ["exp_avg", "exp_avg_sq"]
        tensors = [("init", init), ("grads", grads), ("final", p.data.clone())]
        tensors += [("final." + k, st[k].clone()) for k in names]
        path = os.path.join(OUT, "optim_raw_%s.bin" % kind)
        write_fixture(path, tensors)
        print("wrote %s (torch %s)" % (os.path.relpath(path), torch.__version__))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    training_runs()
    raw_runs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
