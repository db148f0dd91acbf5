#!/usr/bin/env python3
"""Golden values for the tiny Llama 3 of gen_llama3_golden.py trained under ctitan's bf16 compute
(training.mixed_precision_param: bfloat16), computed with plain PyTorch on the CPU in float64.

Reads the weights and the batch of tests/golden/llama3_tiny.ctt and writes
tests/golden/llama3_tiny_bf16.ctt: the batch again, and the logits, the loss and every parameter's
gradient under bf16 compute. Run from the repository root:

    python3 tests/golden/gen_llama3_bf16_golden.py            # (re)write the file
    python3 tests/golden/gen_llama3_bf16_golden.py --check    # recompute and compare with the committed file

What bf16 compute means here (README "Mixed precision"), mirrored op by op:
  - every weight is used rounded to bf16 (round to nearest even), forward and backward; the
    gradients are those of the rounded weights, in f32 (here float64);
  - the math of an op runs in f32 (here float64) on what it reads;
  - what a unit (the embedding, each block) keeps from its forward for its backward is held in
    bf16: an op's backward reads its inputs, and attention its output, rounded to bf16, while the
    statistics (RMSNorm's 1/rms, attention's log-sum-exp) stay exact;
  - a unit's output goes to the next unit rounded to bf16 (the gradient passes straight through);
  - the head (final norm, output projection, cross entropy) runs its backward right after its
    forward and keeps nothing rounded.
Gradients come from hand-written backward formulas (the ones ctitan's device ops compute), each
checked here against autograd with nothing rounded.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llama3_golden as g  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama3_tiny_bf16.ctt")
ROUND = True  # False: every saved value exact (to check the hand-written backward against autograd)


def rb(x):
    """x rounded to bf16 through f32, as ctitan rounds its f32 values."""
    return x.float().bfloat16().double() if ROUND else x


class Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(rb(x), w)
        return x @ w.T

    @staticmethod
    def backward(ctx, dy):
        xr, w = ctx.saved_tensors
        return dy @ w, dy.flatten(0, -2).T @ xr.flatten(0, -2)


class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(rb(x), w, r)
        return x * r * w

    @staticmethod
    def backward(ctx, dy):
        xr, w, r = ctx.saved_tensors
        c = xr.shape[-1]
        k = (dy * w * xr).sum(-1, keepdim=True) * r.pow(3) / c
        dx = r * w * dy - xr * k
        dw = (dy * xr * r).flatten(0, -2).sum(0)
        return dx, dw, None


class SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, gate):
        ctx.save_for_backward(rb(a), rb(gate))
        return F.silu(a) * gate

    @staticmethod
    def backward(ctx, dy):
        a, gate = ctx.saved_tensors
        s = torch.sigmoid(a)
        return dy * gate * s * (1 + a * (1 - s)), dy * a * s


class Attention(torch.autograd.Function):
    """q (B, H, T, hd), k and v (B, KVH, T, hd): causal softmax attention; query head j reads kv
    head j // (H / KVH)."""

    @staticmethod
    def forward(ctx, q, k, v):
        H, KVH, T, hd = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
        kk, vv = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
        s = (q @ kk.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1, keepdim=True)
        o = torch.exp(s - lse) @ vv
        ctx.save_for_backward(rb(q), rb(k), rb(v), rb(o), lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        H, KVH, T, hd = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
        rep, scale = H // KVH, 1 / math.sqrt(hd)
        kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = (q @ kk.transpose(-1, -2)) * scale
        p = torch.exp(s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")) - lse)
        dv = p.transpose(-1, -2) @ do
        dp = do @ vv.transpose(-1, -2)
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        dq = ds @ kk * scale
        dk = ds.transpose(-1, -2) @ q * scale
        B = q.shape[0]
        return dq, dk.view(B, KVH, rep, T, hd).sum(2), dv.view(B, KVH, rep, T, hd).sum(2)


class Handoff(torch.autograd.Function):
    """A unit's output as the next unit reads it: rounded to bf16, the gradient straight through."""

    @staticmethod
    def forward(ctx, x):
        return rb(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def block(c, p, L, h, cos, sin):
    B, T, _ = h.shape
    H, KVH, hd, eps = c["n_heads"], c["n_kv_heads"], c["head_dim"], c["norm_eps"]
    x = RMSNorm.apply(h, p[L + "attention_norm.weight"], eps)
    q = Linear.apply(x, p[L + "attention.wq.weight"]).view(B, T, H, hd)
    k = Linear.apply(x, p[L + "attention.wk.weight"]).view(B, T, KVH, hd)
    v = Linear.apply(x, p[L + "attention.wv.weight"]).view(B, T, KVH, hd)
    q, k = g.apply_rope(q, cos, sin), g.apply_rope(k, cos, sin)  # autograd: RoPE keeps nothing
    o = Attention.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    h = h + Linear.apply(o.transpose(1, 2).reshape(B, T, H * hd), p[L + "attention.wo.weight"])
    x = RMSNorm.apply(h, p[L + "ffn_norm.weight"], eps)
    ff = SwiGLU.apply(Linear.apply(x, p[L + "feed_forward.w1.weight"]), Linear.apply(x, p[L + "feed_forward.w3.weight"]))
    return h + Linear.apply(ff, p[L + "feed_forward.w2.weight"])


def forward_bf16(c, p, tokens):
    """logits of the bf16 mirror; p holds the bf16-rounded weights (float64 leaves)."""
    h = Handoff.apply(p["tok_embeddings.weight"][tokens.long()])
    cos, sin = g.rope_cos_sin(c, tokens.shape[1])
    for i in range(c["n_layers"]):
        h = Handoff.apply(block(c, p, f"layers.{i}.", h, cos, sin))
    return g.rms_norm(h, p["norm.weight"], c["norm_eps"]) @ p["output.weight"].T  # the head: exact


def check_backward_formulas(c, params32, tokens, targets):
    """With nothing rounded, the hand-written backward equals autograd's on g.forward."""
    global ROUND
    ROUND = False
    try:
        a = {n: t.double().requires_grad_() for n, t in params32.items()}
        b = {n: t.double().requires_grad_() for n, t in params32.items()}
        la = g.loss_fn(forward_bf16(c, a, tokens), targets)
        lb = g.loss_fn(g.forward(c, b, tokens), targets)
        la.backward()
        lb.backward()
        assert abs(la.item() - lb.item()) < 1e-12 * abs(lb.item())
        worst = max(float((a[n].grad - b[n].grad).norm() / b[n].grad.norm()) for n in a)
        assert worst < 1e-10, f"hand-written backward differs from autograd by {worst}"
        return worst
    finally:
        ROUND = True


def compute():
    torch.set_num_threads(1)
    c = g.CONFIG
    fp32 = g.ctt_read(g.DEFAULT_OUT)  # the weights and the batch of the fp32 golden, as committed
    params32 = {n: fp32[n] for n, _ in g.param_shapes(c)}
    tokens, targets = fp32["input.tokens"], fp32["input.targets"]

    formulas = check_backward_formulas(c, params32, tokens, targets)
    p = {n: t.bfloat16().double().requires_grad_() for n, t in params32.items()}
    logits = forward_bf16(c, p, tokens)
    loss = g.loss_fn(logits, targets)
    loss.backward()
    grads = {n: t.grad.detach().clone() for n, t in p.items()}

    # how far bf16 compute moves the fp32 model's results: what the test's tolerance must stay below
    p64 = {n: t.double().requires_grad_() for n, t in params32.items()}
    ref_logits = g.forward(c, p64, tokens)
    ref_loss = g.loss_fn(ref_logits, targets)
    ref_loss.backward()
    logits, ref_logits = logits.detach(), ref_logits.detach()
    moved = dict(logits=float((logits - ref_logits).norm() / ref_logits.norm()),
                 loss=abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()),
                 grad=min(float((grads[n] - p64[n].grad).norm() / p64[n].grad.norm()) for n in p))
    items = [("input.tokens", tokens), ("input.targets", targets), ("bf16.logits", logits),
             ("bf16.loss", loss.detach())]
    items += [(f"bf16.grad.{n}", t) for n, t in grads.items()]
    return items, dict(loss=loss.item(), formulas=formulas, moved=moved)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output path (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with the existing file instead of writing")
    args = ap.parse_args()
    items, s = compute()
    m = s["moved"]
    print(f"bf16 loss {s['loss']:.9f}; hand-written backward vs autograd (nothing rounded) {s['formulas']:.1e}; "
          f"against fp32: logits {m['logits']:.2e}, loss {m['loss']:.2e}, gradients at least {m['grad']:.2e} (relative)")
    if args.check:
        have = g.ctt_read(args.out)
        assert list(have) == [n for n, _ in items], "names or their order differ"
        bad = 0
        for n, t in items:
            want = t.detach().to(torch.float32 if t.is_floating_point() else torch.int32)
            if not torch.equal(have[n], want):
                d = float((have[n].double() - want.double()).abs().max())
                print(f"{n}: values differ, max |diff| {d:.3e}")
                bad += d > 1e-6 * max(1.0, float(want.double().abs().max()))
        print(f"{args.out}: {'matches' if not bad else f'{bad} tensors differ'}")
        return 1 if bad else 0
    size = g.ctt_write(args.out, items)
    print(f"wrote {args.out}: {len(items)} tensors, {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
