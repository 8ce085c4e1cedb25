#!/usr/bin/python3
"""A reference GPT in PyTorch and the fixtures pdp's GPT is held to (issue 23).

The model is nanoGPT's architecture with nanoGPT's state_dict names, written
here from the formulas (GPT-2: Radford et al. 2019; nanoGPT's model.py and
llm.c's train_gpt2.py are the layout it matches):

    x = wte[ids] + wpe[0:T]                        transformer.wte [V, C], .wpe [context, C]
    per block i (transformer.h.{i}.):
        x = x + attn(ln_1(x))                      pre-LayerNorm, residual add
        x = x + mlp(ln_2(x))
    attn(u): q, k, v = split(c_attn(u), C)         c_attn Linear(C, 3C): q = cols 0..C-1,
                                                   k = C..2C-1, v = 2C..3C-1; head h of each
                                                   is its columns h*D .. h*D+D-1, D = C / H
             att = softmax(mask(q k^T / sqrt(D)))  causal: position t sees 0..t
             y   = dropout(att) v, heads concatenated back to [T, C], then c_proj (C -> C)
    mlp(u) = c_proj(gelu_tanh(c_fc(u)))            c_fc C -> 4C, c_proj 4C -> C
    logits = ln_f(x) wte^T                         lm_head tied to wte: one parameter
    loss   = cross entropy over all B*T positions, ignore_index -1, mean over the rest

Linear weights are [out, in] (PyTorch's layout), LayerNorm eps 1e-5. The model keeps no
attn.bias mask buffer (the mask is built per call), so its state_dict is the parameters
only; lm_head.weight is the same Parameter as transformer.wte.weight (state_dict lists
both names, named_parameters() one).

CONFIG: vocab 67, context 16, 2 layers, 4 heads, dim 48 (head dim 12), dropout 0,
batch B = 3, T = 16; 60624 parameters. Init as GPT-2 / nanoGPT: every Linear weight and
both embeddings N(0, 0.02), the c_proj weights (attn and mlp) N(0, 0.02 / sqrt(2 * 2)),
biases 0, LayerNorm weight 1 and bias 0; drawn from torch.manual_seed(2323) in
named_parameters() order. Ids are uniform in [0, 67), targets too, with 4 of them set
to -1 (ignored). Ids and targets are stored as float32 values (exact for |x| < 2^24).

FILES (tests/fixtures/; PDPFIX01, see tests/fixture.h; every tensor float32):

gpt_forward.bin  one forward and backward of the initial model:
    ids, targets                       [3, 16]
    <name> for every parameter         nanoGPT names, tied head once as transformer.wte.weight:
        transformer.wte.weight [67, 48], transformer.wpe.weight [16, 48],
        transformer.h.{i}.ln_1.weight, .ln_1.bias, .ln_2.weight, .ln_2.bias   [48]
        transformer.h.{i}.attn.c_attn.weight [144, 48], .attn.c_attn.bias [144]
        transformer.h.{i}.attn.c_proj.weight [48, 48],  .attn.c_proj.bias [48]
        transformer.h.{i}.mlp.c_fc.weight [192, 48],    .mlp.c_fc.bias [192]
        transformer.h.{i}.mlp.c_proj.weight [48, 192],  .mlp.c_proj.bias [48]
        transformer.ln_f.weight, transformer.ln_f.bias  [48]
    act.x0                             [3, 16, 48]     wte[ids] + wpe (the blocks' input)
    act.h.{i}.ln_1                     [3, 16, 48]     ln_1(x)
    act.h.{i}.qkv                      [3, 16, 144]    c_attn(ln_1(x)), q | k | v
    act.h.{i}.att                      [3, 4, 16, 16]  attention probabilities (after the
                                                       mask and softmax, before dropout)
    act.h.{i}.attn_y                   [3, 16, 48]     att v, heads concatenated, before c_proj
    act.h.{i}.x_attn                   [3, 16, 48]     x + attn(ln_1(x))
    act.h.{i}.ln_2                     [3, 16, 48]     ln_2(x_attn)
    act.h.{i}.x_out                    [3, 16, 48]     x_attn + mlp(ln_2(x_attn)): block output
    act.ln_f                           [3, 16, 48]     ln_f(last block's x_out)
    logits                             [3, 16, 67]
    loss                               [1]
    grad.<name> for every parameter    d loss / d parameter. grad.transformer.wte.weight is
                                       the sum of both uses (embedding rows + head), which is
                                       what autograd gives for the tied Parameter.
    t11.ids, t11.targets               [3, 11]         a shorter sequence (T = 11 < context):
    t11.logits [3, 11, 67], t11.loss [1]   same parameters, positions 0..10 of wpe.

gpt_adamw.bin  5 training steps from the same initial parameters (gpt_forward.bin's):
    torch.optim.AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1, foreach=False)
    on every parameter (one group: pdp's PDP_DECAY_ALL), each step: zero_grad, forward,
    backward, norm = clip_grad_norm_(parameters, 1.0), step.
    step{s}.ids, step{s}.targets       [3, 16]   s = 0..4, new each step, 4 targets -1 each
    losses                             [5]       each step's loss (before its update)
    norms                              [5]       each step's total gradient norm before clipping
    final.<name> for every parameter             the parameters after the 5 steps
    final.logits                       [3, 16, 67]  the final model on gpt_forward.bin's ids
    final.loss                         [1]          and targets (for the checkpoint loader)

gpt_adamw_groups.bin  the same 5 steps with nanoGPT's configure_optimizers groups (pdp's
    PDP_DECAY_MATRICES): weight_decay 0.1 on the tensors of 2 or more dimensions (the
    Linear weights and both embeddings), 0 on the biases and LayerNorms, from the same
    initial parameters, its batches drawn from torch.Generator().manual_seed(SEED + 1):
    step{s}.ids, step{s}.targets, losses, norms, final.<name>   as in gpt_adamw.bin

gpt_gelu_erf.bin  a forward and backward on gpt_forward.bin's ids and targets with each
    MLP's GELU exact, nn.GELU() as nanoGPT's model.py has it (pdp_gpt_desc.gelu_erf), from
    the self-checks' moved parameters (at the init's scale the MLP's inputs are so small
    that the tanh form's logits are within 1e-5 of these; moved, they are not):
    <name> for every parameter, logits [3, 16, 67], loss [1], grad.<name>.

gpt_bf16.bin  gpt_forward.bin's forward and backward (same parameters, ids, targets) under
    torch.autocast("cpu", dtype=torch.bfloat16), the loss computed inside autocast as
    nanoGPT does:
    ids, targets [3, 16], logits [3, 16, 67] (bf16 values as float32), loss [1],
    grad.<name> for every parameter (fp32 .grad of the fp32 master parameters).
    What runs in bf16, from the output dtypes in torch 1.13 on the CPU (checked by
    bf16_case, which refuses to write on a different answer): the Linears (c_attn,
    c_proj, c_fc, the head) and both attention matmuls (q k^T, att v) give bf16;
    LayerNorm given the fp32 residual stream gives fp32; softmax (on bf16 scores) and
    GELU (on bf16 c_fc outputs) return bf16, so they are not on CPU autocast's fp32
    list; the residual adds promote to fp32, so the residual stream stays fp32; the
    loss is fp32 and equals, bit for bit, F.cross_entropy of the bf16 logits cast to
    fp32. The backward's gradients are rounded where the forward's were.
    Measured against gpt_forward.bin (tests/fixture.h's metric, max |a - b| / max(max
    |b|, 1)): logits 2.75e-3, loss 3.05e-6, worst parameter gradient 1.05e-3; a pdp
    bf16 path that rounds at other points is held to a bound of that order.

gpt_nanogpt.safetensors  the trained parameters (gpt_adamw.bin's final.*) as pdp will
    write and read a nanoGPT checkpoint: the 28 parameter tensors under nanoGPT names,
    fp32, lm_head.weight absent (it is transformer.wte.weight), no attn.bias buffers.
    Trap 1, the tied head: safetensors.torch.save_file(model.state_dict()) refuses, since
    lm_head.weight and transformer.wte.weight share memory (the error is printed by
    this tool); safetensors.torch.save_model keeps one of the two names. pdp's answer:
    store the head once as transformer.wte.weight, accept lm_head.weight as its alias
    on load (equal values required if both are present).
gpt_nanogpt_with_bias_buffers.safetensors  the same, as a nanoGPT user on torch 1.x saves
    it with {k: v.clone()}: also lm_head.weight (a copy equal to transformer.wte.weight)
    and, trap 2, transformer.h.{i}.attn.bias [1, 1, 16, 16], the lower-triangular causal
    mask buffer nanoGPT registers when F.scaled_dot_product_attention is missing
    (torch < 2.0). A loader skips or checks them; they hold no parameter.

SELF-CHECKS (the tool writes nothing unless all pass), on the initial parameters and on
a copy moved off them (N(0, 0.1) added, so that biases and LayerNorms are not 0 and 1):
    - gradients of a float64 copy of the model against central finite differences
      (step 1e-5), 4 entries per parameter tensor, |autograd - fd| / max(|fd|, 1e-3)
      <= 1e-6;
    - the float64 logits against naive_logits, a second implementation with loops over
      batch, heads and positions (<= 1e-10); the float32 logits against it (<= 1e-5).

REGENERATE:  /usr/bin/python3 tools/gpt_reference.py [--out DIR]
One intra-op thread and fixed seeds: a re-run writes byte-identical files (torch 1.13,
this machine's build).
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import ROOT, write  # noqa: E402  (the PDPFIX01 writer)

VOCAB, CONTEXT, LAYERS, HEADS, DIM, DROPOUT = 67, 16, 2, 4, 48, 0.0
B, T, T_SHORT = 3, 16, 11
SEED = 2323
IGNORED = 4  # targets set to -1 per batch


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)
        self.attn_dropout = nn.Dropout(DROPOUT)
        self.resid_dropout = nn.Dropout(DROPOUT)

    def forward(self, u, trace=None):
        b, t, c = u.shape
        d = c // HEADS
        qkv = self.c_attn(u)
        q, k, v = qkv.split(c, dim=2)
        # [b, t, c] -> [b, heads, t, d]: head h is columns h*d .. h*d+d-1
        q, k, v = (z.view(b, t, HEADS, d).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)  # key s > query t: masked
        att = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        y = self.attn_dropout(att) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        if trace is not None:
            trace.update(qkv=qkv, att=att, attn_y=y)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(DIM, 4 * DIM)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * DIM, DIM)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, u):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(u))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(DIM)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(DIM)
        self.mlp = MLP()

    def forward(self, x, trace=None):
        a = self.ln_1(x)
        x = x + self.attn(a, trace)
        m = self.ln_2(x)
        if trace is not None:
            trace.update(ln_1=a, x_attn=x, ln_2=m)
        x = x + self.mlp(m)
        if trace is not None:
            trace.update(x_out=x)
        return x


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, DIM),
            wpe=nn.Embedding(CONTEXT, DIM),
            drop=nn.Dropout(DROPOUT),
            h=nn.ModuleList([Block() for _ in range(LAYERS)]),
            ln_f=nn.LayerNorm(DIM),
        ))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one Parameter

    def init_gpt2(self):
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, 0.02 / math.sqrt(2 * LAYERS))
                elif name.endswith(".weight") and p.dim() == 2:
                    p.normal_(0.0, 0.02)
                elif name.endswith(".weight"):  # LayerNorm
                    p.fill_(1.0)
                else:
                    p.zero_()

    def forward(self, ids, targets, trace=None):
        t = ids.shape[1]
        assert t <= CONTEXT, "sequence of %d longer than the context %d" % (t, CONTEXT)
        tr = self.transformer
        x = tr.drop(tr.wte(ids) + tr.wpe(torch.arange(t)))
        if trace is not None:
            trace["x0"] = x
        for i, block in enumerate(tr.h):
            bt = {} if trace is not None else None
            x = block(x, bt)
            if trace is not None:
                for k, v in bt.items():
                    trace["h.%d.%s" % (i, k)] = v
        x = tr.ln_f(x)
        logits = self.lm_head(x)
        if trace is not None:
            trace["ln_f"] = x
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-1)
        return logits, loss


def params(model):
    """(name, Parameter) in named_parameters() order: the tied head once, as wte."""
    return list(model.named_parameters())


def batch(gen, t):
    ids = torch.randint(0, VOCAB, (B, t), generator=gen)
    targets = torch.randint(0, VOCAB, (B, t), generator=gen)
    flat = targets.view(-1)
    flat[torch.randperm(B * t, generator=gen)[:IGNORED]] = -1
    return ids, targets


# ---- self-checks ----

def naive_logits(sd, ids):
    """The GPT again, in float64, with explicit loops over batch, heads and positions."""
    sd = {k: v.double() for k, v in sd.items()}
    d = DIM // HEADS

    def layernorm(x, w, b):  # x [C]
        mu = sum(x) / DIM
        var = sum((x - mu) ** 2) / DIM
        return (x - mu) / math.sqrt(var + 1e-5) * w + b

    def linear(x, name):
        return sd[name + ".weight"] @ x + sd[name + ".bias"]

    def gelu(z):
        return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))

    out = torch.zeros(ids.shape[0], ids.shape[1], VOCAB, dtype=torch.float64)
    for b in range(ids.shape[0]):
        t_len = ids.shape[1]
        xs = [sd["transformer.wte.weight"][ids[b, t]] + sd["transformer.wpe.weight"][t]
              for t in range(t_len)]
        for i in range(LAYERS):
            p = "transformer.h.%d." % i
            qkv = [linear(layernorm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]),
                          p + "attn.c_attn") for x in xs]
            ys = [torch.zeros(DIM, dtype=torch.float64) for _ in range(t_len)]
            for h in range(HEADS):
                q = [z[h * d:(h + 1) * d] for z in qkv]
                k = [z[DIM + h * d:DIM + (h + 1) * d] for z in qkv]
                v = [z[2 * DIM + h * d:2 * DIM + (h + 1) * d] for z in qkv]
                for t in range(t_len):
                    s = [float(q[t] @ k[j]) / math.sqrt(d) for j in range(t + 1)]
                    top = max(s)
                    e = [math.exp(z - top) for z in s]
                    for j in range(t + 1):
                        ys[t][h * d:(h + 1) * d] += e[j] / sum(e) * v[j]
            xs = [x + linear(y, p + "attn.c_proj") for x, y in zip(xs, ys)]
            xs = [x + linear(gelu(linear(layernorm(x, sd[p + "ln_2.weight"],
                                                   sd[p + "ln_2.bias"]), p + "mlp.c_fc")),
                             p + "mlp.c_proj") for x in xs]
        for t in range(t_len):
            f = layernorm(xs[t], sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"])
            out[b, t] = sd["transformer.wte.weight"] @ f
    return out


def check_logits(model, ids, targets):
    naive = naive_logits(model.state_dict(), ids)
    m64 = GPT().double()
    m64.load_state_dict(model.state_dict())
    with torch.no_grad():
        l64, _ = m64(ids, targets)
        l32, _ = model(ids, targets)
    e64 = ((l64 - naive).abs().max() / naive.abs().max().clamp(min=1)).item()
    e32 = ((l32.double() - naive).abs().max() / naive.abs().max().clamp(min=1)).item()
    print("self-check: logits vs naive loops: float64 %.2e, float32 %.2e" % (e64, e32))
    return e64 <= 1e-10 and e32 <= 1e-5


def check_gradients(model, ids, targets, per_param=4, h=1e-5):
    m64 = GPT().double()
    m64.load_state_dict(model.state_dict())
    m64.zero_grad()
    m64(ids, targets)[1].backward()
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    for name, p in params(m64):
        flat, gflat = p.data.view(-1), p.grad.view(-1)
        for j in torch.randperm(flat.numel(), generator=gen)[:per_param].tolist():
            keep = flat[j].item()
            with torch.no_grad():
                flat[j] = keep + h
                up = m64(ids, targets)[1].item()
                flat[j] = keep - h
                down = m64(ids, targets)[1].item()
                flat[j] = keep
            fd = (up - down) / (2 * h)
            err = abs(fd - gflat[j].item()) / max(abs(fd), 1e-3)
            worst = max(worst, err)
            if err > 1e-6:
                print("self-check FAILED: %s[%d]: autograd %.9g, finite difference %.9g"
                      % (name, j, gflat[j].item(), fd))
                return False
    print("self-check: gradients vs finite differences (float64, %d entries per parameter): "
          "worst relative error %.2e" % (per_param, worst))
    return True


# ---- fixtures ----

def snapshot(tensors):
    """Copies: the parameters and their .grad change under later steps."""
    return [(n, t.detach().clone()) for n, t in tensors]


def forward_case(model, ids, targets, ids11, targets11):
    model.zero_grad()
    trace = {}
    logits, loss = model(ids, targets, trace)
    loss.backward()
    out = [("ids", ids), ("targets", targets)]
    out += [(n, p) for n, p in params(model)]
    out.append(("act.x0", trace["x0"]))
    for i in range(LAYERS):
        for k in ("ln_1", "qkv", "att", "attn_y", "x_attn", "ln_2", "x_out"):
            out.append(("act.h.%d.%s" % (i, k), trace["h.%d.%s" % (i, k)]))
    out += [("act.ln_f", trace["ln_f"]), ("logits", logits), ("loss", loss.reshape(1))]
    out += [("grad." + n, p.grad) for n, p in params(model)]
    with torch.no_grad():
        l11, loss11 = model(ids11, targets11)
    out += [("t11.ids", ids11), ("t11.targets", targets11), ("t11.logits", l11),
            ("t11.loss", loss11.reshape(1))]
    return snapshot(out)


def gelu_erf_case(model, ids, targets):
    """A forward and backward with the MLPs' GELU exact (nanoGPT's nn.GELU())."""
    for block in model.transformer.h:
        block.mlp.gelu = nn.GELU()
    model.zero_grad()
    logits, loss = model(ids, targets)
    loss.backward()
    out = [(n, p) for n, p in params(model)]
    out += [("logits", logits), ("loss", loss.reshape(1))]
    out += [("grad." + n, p.grad) for n, p in params(model)]
    for block in model.transformer.h:
        block.mlp.gelu = nn.GELU(approximate="tanh")
    return snapshot(out)


def adamw_case(model, gen, ids, targets, groups=False):
    """groups: nanoGPT's configure_optimizers (decay the tensors of 2+ dimensions only)."""
    named = params(model)
    if groups:
        groups = [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, foreach=False)
    out, losses, norms = [], [], []
    for s in range(5):
        xs, ys = batch(gen, T)
        opt.zero_grad()
        loss = model(xs, ys)[1]
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        out += [("step%d.ids" % s, xs), ("step%d.targets" % s, ys)]
        losses.append(loss.item())
        norms.append(norm.item())
    out += [("losses", torch.tensor(losses)), ("norms", torch.tensor(norms))]
    out += [("final." + n, p) for n, p in params(model)]
    if ids is not None:
        with torch.no_grad():
            logits, loss = model(ids, targets)
        out += [("final.logits", logits), ("final.loss", loss.reshape(1))]
    out = snapshot(out)
    print("adamw: losses %s, pre-clip norms %s" % (
        " ".join("%.4f" % v for v in losses), " ".join("%.4f" % v for v in norms)))
    return out


# Output dtype of each traced op under CPU autocast, as torch 1.13 gives them.
BF16_EXPECTED = {"x0": torch.float32, "ln_1": torch.float32, "qkv": torch.bfloat16,
                 "att": torch.bfloat16, "attn_y": torch.bfloat16, "x_attn": torch.float32,
                 "ln_2": torch.float32, "x_out": torch.float32, "ln_f": torch.float32,
                 "logits": torch.bfloat16, "loss": torch.float32, "gelu": torch.bfloat16}


def rel_err(a, b):
    """tests/fixture.h's metric: max |a - b| / max(max |b|, 1)."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1)).item()


def bf16_case(model, ids, targets, fwd):
    model.zero_grad()
    trace = {}
    block = model.transformer.h[0]
    hook = block.mlp.gelu.register_forward_hook(lambda m, i, o: trace.update(gelu=o))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(ids, targets, trace)
    hook.remove()
    got = {k.split(".")[-1]: v.dtype for k, v in trace.items()}
    got.update(logits=logits.dtype, loss=loss.dtype)
    if got != BF16_EXPECTED:
        print("bf16: autocast's dtypes differ from the documented ones: %s" % got)
        return None
    loss.backward()
    for n, p in params(model):
        assert p.grad.dtype == torch.float32, n
    if loss.item() != F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1),
                                      ignore_index=-1).item():
        print("bf16: the loss is not the fp32 cross entropy of the bf16 logits")
        return None
    print("bf16: dtypes as documented: %s" % ", ".join(
        "%s %s" % (k, str(v)[6:]) for k, v in sorted(got.items())))
    ref = dict(fwd)
    print("bf16 vs fp32 (fixture metric): logits %.2e, loss %.2e, gradients worst %.2e" % (
        rel_err(logits, ref["logits"]), rel_err(loss.reshape(1), ref["loss"]),
        max(rel_err(p.grad, ref["grad." + n]) for n, p in params(model))))
    out = [("ids", ids), ("targets", targets), ("logits", logits), ("loss", loss.reshape(1))]
    out += [("grad." + n, p.grad) for n, p in params(model)]
    return snapshot(out)


def safetensors_files(model, out_dir):
    from safetensors.torch import save_file
    try:  # trap 1, shown: what a nanoGPT user's first attempt gets
        save_file(model.state_dict(), os.path.join(out_dir, "gpt_refused.safetensors"))
        print("safetensors accepted the tied state_dict (unexpected)")
        return False
    except RuntimeError as e:
        print("safetensors.torch.save_file(state_dict) refuses the tied head:\n  %s"
              % str(e).strip().replace("\n", "\n  "))
    clean = {n: p.detach().clone().contiguous() for n, p in params(model)}
    save_file(clean, os.path.join(out_dir, "gpt_nanogpt.safetensors"), metadata={"format": "pt"})
    nano = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    for i in range(LAYERS):
        nano["transformer.h.%d.attn.bias" % i] = \
            torch.tril(torch.ones(CONTEXT, CONTEXT)).view(1, 1, CONTEXT, CONTEXT)
    assert "lm_head.weight" in nano
    save_file(nano, os.path.join(out_dir, "gpt_nanogpt_with_bias_buffers.safetensors"),
              metadata={"format": "pt"})
    return True


def main(argv):
    out_dir = os.path.join(ROOT, "tests", "fixtures")
    if len(argv) == 3 and argv[1] == "--out":
        out_dir = argv[2]
    elif len(argv) != 1:
        sys.exit("usage: %s [--out DIR]" % argv[0])
    torch.set_num_threads(1)  # one reduction order: byte-identical re-runs
    torch.manual_seed(SEED)
    model = GPT()
    model.init_gpt2()
    assert sum(p.numel() for _, p in params(model)) == 60624
    gen = torch.Generator().manual_seed(SEED)
    ids, targets = batch(gen, T)
    ids11, targets11 = batch(gen, T_SHORT)

    # The self-checks run on moved-off-init parameters too (biases and LayerNorms
    # non-trivial), so that a wrong bias or LayerNorm path cannot hide behind 0 and 1.
    moved = GPT()
    moved.load_state_dict(model.state_dict())
    with torch.no_grad():
        for _, p in params(moved):
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    moved_sd = {k: v.clone() for k, v in moved.state_dict().items()}
    ok = True
    for m in (model, moved):
        ok = check_logits(m, ids, targets) and check_logits(m, ids11, targets11) and ok
        ok = check_gradients(m, ids, targets) and ok
    if not ok:
        sys.exit("self-check failed: no fixtures written")

    init = {k: v.clone() for k, v in model.state_dict().items()}
    fwd = forward_case(model, ids, targets, ids11, targets11)
    bf16 = bf16_case(model, ids, targets, fwd)
    if bf16 is None:
        sys.exit("bf16 dtypes changed: update BF16_EXPECTED and the top comment; nothing written")
    model.load_state_dict(init)
    adamw = adamw_case(model, gen, ids, targets)

    os.makedirs(out_dir, exist_ok=True)
    for name, tensors in (("gpt_forward.bin", fwd), ("gpt_adamw.bin", adamw),
                          ("gpt_bf16.bin", bf16)):
        write(os.path.join(out_dir, name), tensors)
    if not safetensors_files(model, out_dir):
        sys.exit("safetensors did not behave as documented")
    # last, so that the files above are what they were before it
    model.load_state_dict(init)
    groups = adamw_case(model, torch.Generator().manual_seed(SEED + 1), None, None, groups=True)
    write(os.path.join(out_dir, "gpt_adamw_groups.bin"), groups)
    model.load_state_dict(moved_sd)
    write(os.path.join(out_dir, "gpt_gelu_erf.bin"), gelu_erf_case(model, ids, targets))
    for name in ("gpt_forward.bin", "gpt_adamw.bin", "gpt_bf16.bin", "gpt_nanogpt.safetensors",
                 "gpt_nanogpt_with_bias_buffers.safetensors", "gpt_adamw_groups.bin",
                 "gpt_gelu_erf.bin"):
        print("%-44s %8d bytes" % (name, os.path.getsize(os.path.join(out_dir, name))))


if __name__ == "__main__":
    main(sys.argv)
