#!/usr/bin/python3
"""Write tests/fixtures/optim_*.bin: PyTorch reference runs for tests/test_optim.c.

For each (model, optimizer) pair: the initial parameters, a fixed input batch and
labels, the mean cross-entropy loss of each of 3 training steps, and the
parameters after the 3 steps (forward, cross_entropy, backward, optimizer.step,
zero_grad), all computed by torch in float32.

Models (nn.Sequential, so state_dict names are pdp's):
  mlp: Linear(6, 5), ReLU, Linear(5, 3)                           input [4, 6]
  cnn: Conv2d(1, 2, 3), ReLU, MaxPool2d(2), Flatten, Linear(8, 3)  input [4, 1, 6, 6]
Optimizers (hyper-parameters are exact float32 values, so pdp's float desc and
torch's Python floats agree):
  sgd_nesterov: SGD(lr=0.125, momentum=0.875, nesterov=True, weight_decay=0.0625)
  sgd_damp:     SGD(lr=0.125, momentum=0.875, dampening=0.25, weight_decay=0.0625)
  adam:         Adam(lr=0.0625, betas=(0.875, 0.96875), eps=2**-20, weight_decay=0.0625)
  adamw:        AdamW(lr=0.0625, betas=(0.875, 0.96875), eps=2**-20, weight_decay=0.25)

Fixture format (shared by pdp's tests): magic "PDPFIX01", uint32 tensor count,
then per tensor: uint32 name length, name bytes, uint32 ndim, int64 dims[ndim],
float32 data, all little-endian. Tensor names: "x", "labels" (class indices
stored as floats), "loss" [3], "init.<param>", "final.<param>".

Run with a Python that has torch (Debian: /usr/bin/python3 with python3-torch):
  /usr/bin/python3 tools/gen_optim_fixtures.py
"""
import os
import struct
import sys

import torch
from torch import nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


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
        return torch.optim.SGD(params, lr=0.125, momentum=0.875, nesterov=True,
                               weight_decay=0.0625)
    if kind == "sgd_damp":
        return torch.optim.SGD(params, lr=0.125, momentum=0.875, dampening=0.25,
                               weight_decay=0.0625)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.0625, betas=(0.875, 0.96875), eps=2.0 ** -20,
                                weight_decay=0.0625)
    return torch.optim.AdamW(params, lr=0.0625, betas=(0.875, 0.96875), eps=2.0 ** -20,
                             weight_decay=0.25)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
