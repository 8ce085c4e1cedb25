#!/usr/bin/python3
"""Write the PyTorch reference fixtures of tests/test_fixtures.c into tests/fixtures/.

Each file holds one small module's forward and backward on fixed random data:
the input "x", the upstream gradient "dy" (the backward pass computes
d(sum(y * dy))), the output "y", the input gradient "dx", the parameters under
their state_dict names ("0.weight", ...) and their gradients ("grad.0.weight").
The loss files and the two small models use cross-entropy or MSE instead of dy.
autocast_bf16_mlp.bin is one SGD step of an MLP under torch.autocast("cpu",
dtype=torch.bfloat16) (see autocast_case), and the same step with pdp's rounding
points computed in float64 ("exact.*", see bf16_exact), for tests/test_bf16.c.

Format (little-endian; tests/fixture.h reads it): magic b"PDPFIX01", uint32
tensor count, then per tensor: uint32 name length, the name, uint32 ndim,
int64 dims[ndim], float32 data.

Run with Debian's torch (the pyenv python3 on PATH has none):
    /usr/bin/python3 tools/gen_fixtures.py [--out DIR]
The output is deterministic for a given torch build (fixed seeds, CPU, float32).
"""
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(path, tensors):
    """tensors: list of (name, tensor) in file order."""
    out = [b"PDPFIX01", struct.pack("<I", len(tensors))]
    for name, t in tensors:
        t = t.detach().to(torch.float32).contiguous().cpu()
        nb = name.encode("ascii")
        out.append(struct.pack("<I", len(nb)))
        out.append(nb)
        out.append(struct.pack("<I", t.dim()))
        out.append(struct.pack("<%dq" % t.dim(), *t.shape))
        out.append(t.numpy().astype("<f4").tobytes())
    with open(path, "wb") as f:
        f.write(b"".join(out))


def module_case(model, x_shape, seed):
    """Forward and backward of model on x ~ U(-1, 1), against dy ~ N(0, 1)."""
    torch.manual_seed(seed)
    for p in model.parameters():  # move LayerNorm off 1/0 so its gradients mean something
        with torch.no_grad():
            p.add_(0.2 * torch.randn_like(p))
    x = (torch.rand(*x_shape) * 2 - 1).requires_grad_(True)
    y = model(x)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    tensors = [("x", x), ("dy", dy), ("y", y), ("dx", x.grad)]
    for name, p in model.state_dict().items():
        tensors.append((name, p))
    for name, p in model.named_parameters():
        tensors.append(("grad." + name, p.grad))
    return tensors


def classifier_case(model, x_shape, classes, seed):
    """Cross-entropy (mean) of model(x) against random labels, and its backward."""
    torch.manual_seed(seed)
    x = (torch.rand(*x_shape) * 2 - 1).requires_grad_(True)
    labels = torch.randint(0, classes, (x_shape[0],))
    y = model(x)
    y.retain_grad()
    loss = F.cross_entropy(y, labels)
    loss.backward()
    tensors = [("x", x), ("labels", labels.float()), ("y", y), ("loss", loss.reshape(1)),
               ("dy", y.grad), ("dx", x.grad)]
    for name, p in model.state_dict().items():
        tensors.append((name, p))
    for name, p in model.named_parameters():
        tensors.append(("grad." + name, p.grad))
    return tensors


def autocast_case(seed, lr):
    """One SGD step of an MLP under torch.autocast("cpu", dtype=torch.bfloat16).

    Linear(64, 32), ReLU, Linear(32, 10) on a batch of 8, mean cross-entropy on the
    fp32 logits. Under autocast each Linear casts its input and weight to bf16 and
    returns bf16 (fp32 accumulation inside), so the hidden activations, the logits
    and, in backward, every Linear's gradients come out rounded to bf16; the master
    weights, their .grad (bf16 gradients cast back) and the SGD update stay fp32.
    Saves x, labels, the initial parameters, the logits (as fp32), the loss, the
    parameter gradients and the parameters after one SGD(lr) step ("final.<name>")."""
    torch.manual_seed(seed)
    mlp = seq(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    x = torch.rand(8, 64) * 2 - 1
    labels = torch.randint(0, 10, (8,))
    tensors = [("x", x), ("labels", labels.float()), ("lr", torch.tensor([lr]))]
    for name, p in mlp.state_dict().items():
        tensors.append((name, p.clone()))
    opt = torch.optim.SGD(mlp.parameters(), lr=lr)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = mlp(x)
    assert logits.dtype == torch.bfloat16
    loss = F.cross_entropy(logits.float(), labels)
    loss.backward()
    tensors += [("y", logits.float()), ("loss", loss.reshape(1))]
    for name, p in mlp.named_parameters():
        assert p.grad.dtype == torch.float32
        tensors.append(("grad." + name, p.grad))
    opt.step()
    for name, p in mlp.state_dict().items():
        tensors.append(("final." + name, p))
    return tensors


def bf16_exact(tensors, lr):
    """The autocast case's step as pdp's bf16 mode defines it, in float64: every GEMM
    input (x, W1, h, W2 forward; dz, h, W2, da1, x backward) rounded to bf16, everything
    else exact: fp32 bias, fp32 outputs, bias gradients summed unrounded. pdp differs
    from it only by its fp32 accumulation (gemm.h's bound), while an fp32 step differs
    by the bf16 roundings (~2^-9 relative per product), so the test can tell the two.
    Returns the "exact.*" tensors, or None when a value to be rounded lies within 2^-10
    of a bf16 ulp of a rounding tie (pdp's fp32 value could round the other way)."""
    t = dict(tensors)
    def r16(v):
        return v.float().to(torch.bfloat16).to(torch.float64)
    def near_tie(v):
        low = (v.float().view(torch.int32) & 0xFFFF).to(torch.int64)
        return bool(((low - 0x8000).abs() < 64).any())  # 64 / 65536 = 2^-10 ulp
    x = t["x"].double()
    labels = t["labels"].long()
    w1, b1 = t["0.weight"].double(), t["0.bias"].double()
    w2, b2 = t["2.weight"].double(), t["2.bias"].double()
    a1 = r16(x) @ r16(w1).T + b1
    h = a1.clamp(min=0)
    z = r16(h) @ r16(w2).T + b2
    loss = F.cross_entropy(z, labels)
    dz = (torch.softmax(z, dim=1) - F.one_hot(labels, 10).double()) / x.shape[0]
    dw2, db2 = r16(dz).T @ r16(h), dz.sum(0)
    da1 = (r16(dz) @ r16(w2)) * (a1 > 0).double()
    dw1, db1 = r16(da1).T @ r16(x), da1.sum(0)
    if near_tie(h) or near_tie(dz) or near_tie(da1):
        return None
    out = [("exact.y", z), ("exact.loss", loss.reshape(1)), ("exact.grad.0.weight", dw1),
           ("exact.grad.0.bias", db1), ("exact.grad.2.weight", dw2),
           ("exact.grad.2.bias", db2)]
    return [(n, v.float()) for n, v in out]


def seq(*layers):
    return nn.Sequential(*layers)


def main(argv):
    out_dir = os.path.join(ROOT, "tests", "fixtures")
    if len(argv) == 2 and argv[0] == "--out":
        out_dir = argv[1]
    elif argv:
        sys.stderr.write("usage: gen_fixtures.py [--out DIR]\n")
        return 2
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    cases = {}

    # Layers, one file each (batch 3, odd sizes). Module seeds fix the init.
    torch.manual_seed(1)
    cases["linear.bin"] = module_case(seq(nn.Linear(7, 5)), (3, 7), 11)
    cases["relu.bin"] = module_case(seq(nn.ReLU()), (3, 7), 12)
    cases["gelu.bin"] = module_case(seq(nn.GELU(approximate="tanh")), (3, 7), 13)
    cases["tanh.bin"] = module_case(seq(nn.Tanh()), (3, 7), 14)
    cases["sigmoid.bin"] = module_case(seq(nn.Sigmoid()), (3, 7), 15)
    cases["silu.bin"] = module_case(seq(nn.SiLU()), (3, 7), 31)
    cases["gelu_erf.bin"] = module_case(seq(nn.GELU()), (3, 7), 32)
    torch.manual_seed(2)
    cases["layernorm.bin"] = module_case(seq(nn.LayerNorm((2, 3, 3))), (3, 2, 3, 3), 16)
    torch.manual_seed(3)
    cases["conv2d.bin"] = module_case(seq(nn.Conv2d(2, 4, 3, stride=2, padding=1)),
                                      (3, 2, 5, 5), 17)
    torch.manual_seed(4)
    cases["conv2d_s1.bin"] = module_case(seq(nn.Conv2d(3, 2, 2, stride=1, padding=0)),
                                         (2, 3, 4, 6), 18)
    cases["maxpool2d.bin"] = module_case(seq(nn.MaxPool2d(2)), (3, 2, 5, 5), 19)
    cases["maxpool2d_k3s2.bin"] = module_case(seq(nn.MaxPool2d(3, stride=2)), (2, 3, 7, 6), 20)

    # Losses.
    torch.manual_seed(21)
    logits = (torch.randn(4, 5) * 3).requires_grad_(True)
    labels = torch.tensor([2, 0, 4, 1])
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    cases["cross_entropy.bin"] = [("logits", logits), ("labels", labels.float()),
                                  ("loss", loss.reshape(1)), ("dlogits", logits.grad)]
    torch.manual_seed(22)
    pred = torch.randn(3, 4).requires_grad_(True)
    target = torch.randn(3, 4)
    loss = F.mse_loss(pred, target)
    loss.backward()
    cases["mse.bin"] = [("pred", pred), ("target", target), ("loss", loss.reshape(1)),
                        ("dpred", pred.grad)]

    # Small models, trained one step's worth: forward, cross-entropy, backward.
    torch.manual_seed(5)
    mlp = seq(nn.Linear(20, 16), nn.GELU(approximate="tanh"), nn.LayerNorm(16), nn.Linear(16, 10))
    with torch.no_grad():
        mlp[2].weight.add_(0.2 * torch.randn(16))
        mlp[2].bias.add_(0.2 * torch.randn(16))
    cases["mlp.bin"] = classifier_case(mlp, (4, 20), 10, 23)
    torch.manual_seed(6)
    cnn = seq(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
              nn.Linear(4 * 3 * 3, 5))
    cases["cnn.bin"] = classifier_case(cnn, (3, 1, 6, 6), 5, 24)

    # bf16 mixed precision: one training step under torch.autocast (test_bf16.c).
    # The seed is the first from 25 whose step has no value near a bf16 tie (bf16_exact).
    for seed in range(25, 1000):
        tensors = autocast_case(seed, 0.25)
        exact = bf16_exact(tensors, 0.25)
        if exact is not None:
            break
    cases["autocast_bf16_mlp.bin"] = tensors + exact

    for name in sorted(cases):
        write(os.path.join(out_dir, name), cases[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
