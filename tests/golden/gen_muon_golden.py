#!/usr/bin/env python3
"""Golden values for the Muon optimizer plugin (plugins/muon), computed with PyTorch in float64.

Writes tests/golden/muon_tiny.ctt: the parameters of a tiny Llama 3 (dim 16, 1 layer, 2 heads, 1 kv
head, vocab 24, ffn hidden 40; torchtitan's names and (out, in) shapes), three steps of gradients, and
the parameters after those three steps under two option sets. tests/unit/test_muon_golden.c runs the
plugin through the host's step_param path on the same inputs and compares. Run from the repository root:

    python3 tests/golden/gen_muon_golden.py            # (re)write the file
    python3 tests/golden/gen_muon_golden.py --check    # recompute and compare with the committed file

The update, per step t with learning rate lr_t:
  Muon, for the 2-D linear weights except output.weight (the default muon_exclude):
    m = mu m + g;  u = g + mu m (nesterov) or m;  O = NS5(u)
    W = W * (1 - lr wd) - lr * scale * O
    scale = 0.2 sqrt(max(rows, cols)) (adjust_lr moonlight) or sqrt(max(1, rows / cols)) (original)
    NS5 is Keller Jordan's quintic Newton-Schulz: X = u / (||u||_F + 1e-7), transposed when rows > cols;
    5 times A = X X^T, B = b A + c A A, X = a X + B X with (a, b, c) = (3.4445, -4.7750, 2.0315).
  AdamW (device.h's formula) for everything else: tok_embeddings, output (decayed), norms (no decay).
Inputs are drawn as float32 (what the file stores); the math runs in float64 on those values.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_llama3_golden import ctt_read, ctt_write  # noqa: E402  the house ctt writer and reader

CONFIG = dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab=24, ffn_hidden=40)
LRS = [0.01, 0.008, 0.006]
SEED = 20261202
# The two option sets the C test opens sessions with (its manifests spell the same values).
RUNS = {
    "moonlight": dict(momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.1, adjust_lr="moonlight",
                      adamw_beta1=0.9, adamw_beta2=0.95, adamw_eps=1e-8, adamw_weight_decay=0.1),
    "original": dict(momentum=0.9, nesterov=False, ns_steps=5, weight_decay=0.05, adjust_lr="original",
                     adamw_beta1=0.8, adamw_beta2=0.99, adamw_eps=1e-6, adamw_weight_decay=0.02),
}
MUON_EXCLUDE = ("output.weight",)

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "muon_tiny.ctt")


def param_specs(c):
    """(name, shape, kind) in the llama3 pack's order; kind: linear, embed or norm."""
    d, hd = c["dim"], c["dim"] // c["n_heads"]
    q, kv = c["n_heads"] * hd, c["n_kv_heads"] * hd
    out = [("tok_embeddings.weight", (c["vocab"], d), "embed")]
    for i in range(c["n_layers"]):
        p = f"layers.{i}."
        out += [(p + "attention_norm.weight", (d,), "norm"), (p + "attention.wq.weight", (q, d), "linear"),
                (p + "attention.wk.weight", (kv, d), "linear"), (p + "attention.wv.weight", (kv, d), "linear"),
                (p + "attention.wo.weight", (d, q), "linear"), (p + "ffn_norm.weight", (d,), "norm"),
                (p + "feed_forward.w1.weight", (c["ffn_hidden"], d), "linear"),
                (p + "feed_forward.w2.weight", (d, c["ffn_hidden"]), "linear"),
                (p + "feed_forward.w3.weight", (c["ffn_hidden"], d), "linear")]
    out += [("norm.weight", (d,), "norm"), ("output.weight", (c["vocab"], d), "linear")]
    return out


def is_muon(name, kind):
    return kind == "linear" and name not in MUON_EXCLUDE


def newton_schulz5(G, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.clone()
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if tall else X


def run(specs, params, grads, o):
    """Three steps of Muon + AdamW from params (float64) with grads[t]; returns the final params."""
    p = {n: params[n].clone() for n, _, _ in specs}
    st = {n: [torch.zeros_like(p[n]), torch.zeros_like(p[n])] for n, _, _ in specs}
    for t, lr in enumerate(LRS, start=1):
        for name, shape, kind in specs:
            g, (m, v) = grads[t][name], st[name]
            if is_muon(name, kind):
                m.mul_(o["momentum"]).add_(g)
                u = g + o["momentum"] * m if o["nesterov"] else m
                rows, cols = shape
                scale = (0.2 * math.sqrt(max(rows, cols)) if o["adjust_lr"] == "moonlight"
                         else math.sqrt(max(1.0, rows / cols)))
                p[name] = p[name] * (1 - lr * o["weight_decay"]) - lr * scale * newton_schulz5(u, o["ns_steps"])
            else:
                b1, b2, eps = o["adamw_beta1"], o["adamw_beta2"], o["adamw_eps"]
                wd = 0.0 if kind == "norm" else o["adamw_weight_decay"]
                x = p[name] * (1 - lr * wd)
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                p[name] = x - lr * (m / (1 - b1 ** t)) / (torch.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def self_check(gen):
    """NS5 makes a matrix's singular values near 1 (Keller Jordan's quintic lands in about [0.7, 1.2])
    and keeps its singular vectors: compare with U V^T from the SVD, both orientations."""
    for shape in [(8, 16), (40, 16), (16, 16)]:
        G = torch.randn(shape, generator=gen, dtype=torch.float64)
        O = newton_schulz5(G, 5)
        s = torch.linalg.svdvals(O)
        assert 0.6 < s.min() and s.max() < 1.25, f"NS5 singular values {s.min():.3f}..{s.max():.3f}"
        U, _, Vh = torch.linalg.svd(G, full_matrices=False)
        cos = (O * (U @ Vh)).sum() / (O.norm() * (U @ Vh).norm())
        assert cos > 0.95, f"NS5 is not near U V^T: cosine {cos:.4f}"
        assert torch.allclose(newton_schulz5(G.T, 5), O.T, atol=1e-12), "NS5 is not transpose-equivariant"


def compute():
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    self_check(gen)
    specs = param_specs(CONFIG)
    items = [(f"config.{k}", torch.tensor(v, dtype=torch.int32)) for k, v in CONFIG.items()]
    items.append(("lrs", torch.tensor(LRS, dtype=torch.float32)))
    params, grads = {}, {t: {} for t in range(1, len(LRS) + 1)}
    for name, shape, kind in specs:
        x = torch.randn(shape, generator=gen) * (0.1 if kind == "norm" else 0.02)
        if kind == "norm":
            x += 1
        params[name] = x.to(torch.float32)
        items.append((f"param.{name}", params[name]))
    for t in grads:
        for name, shape, _ in specs:
            # gradients with a common direction across steps, like a training run's
            g = torch.randn(shape, generator=gen) * 0.01 + 0.005 * torch.sin(torch.arange(math.prod(shape)) / 3.0).reshape(shape)
            grads[t][name] = g.to(torch.float32)
            items.append((f"grad{t}.{name}", grads[t][name]))
    p64 = {n: v.double() for n, v in params.items()}
    g64 = {t: {n: v.double() for n, v in gs.items()} for t, gs in grads.items()}
    for label, o in RUNS.items():
        final = run(specs, p64, g64, o)
        for name, _, _ in specs:
            items.append((f"{label}.{name}", final[name]))
        moved = sum((final[n] - p64[n]).norm() ** 2 for n, _, _ in specs) ** 0.5
        assert moved > 1e-3, f"{label}: the parameters barely moved ({moved:.2e})"
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output path (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with the existing file instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    items = compute()
    if args.check:
        old = ctt_read(args.out)
        assert list(old) == [n for n, _ in items], "names differ"
        worst = max(float((old[n].double() - t.to(old[n].dtype).double()).abs().max()) for n, t in items)
        print(f"{args.out}: {len(items)} tensors, largest difference {worst:.3g}")
        return 0 if worst == 0 else 1
    size = ctt_write(args.out, items)
    print(f"wrote {args.out}: {len(items)} tensors, {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
