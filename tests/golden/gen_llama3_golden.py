#!/usr/bin/env python3
"""Golden values for a tiny Llama 3, computed with plain PyTorch on the CPU in float64.

Writes tests/golden/llama3_tiny.ctt (the ctt format of core/io/tensorfile.h): the parameters, one batch,
the logits and loss, every parameter's gradient, and ten AdamW steps with gradient clipping. The C
model pack is checked against it. Run from the repository root:

    python3 tests/golden/gen_llama3_golden.py            # (re)write the file
    python3 tests/golden/gen_llama3_golden.py --check    # recompute and compare with the committed file

The model is torchtitan's llama3 (models/llama3/model/model.py), written out op by op:
  h = tok_embeddings[tokens]
  per layer:  h = h + wo(attention(rmsnorm(h) * attention_norm))
              h = h + w2(silu(w1 x) * w3 x),   x = rmsnorm(h) * ffn_norm
  logits = output(rmsnorm(h) * norm)
RoPE uses Llama's interleaved pairs (x[2i], x[2i+1]) rotated by t * theta^(-2i/head_dim), as
torchtitan's view_as_complex does. torchtitan's default RoPEScalingArgs (the Llama 3.1 low-frequency
scaling) is NOT applied: the angles are exactly t * theta^(-2i/head_dim).

Weights are drawn as float32 (that is what the file stores); all the math runs in float64 on those
values, and results are rounded to float32 only when written.
"""
import argparse
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

CONFIG = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab=256, ffn_hidden=192,
              rope_theta=500000.0, norm_eps=1e-5, seq_len=32, batch=2)
ADAMW = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0, steps=10)
SEED = 20240601
N_IGNORED = 5  # targets set to -100

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama3_tiny.ctt")

# ---------------------------------------------------------------------------------------------------
# ctt format (see core/io/tensorfile.h): little-endian; header "CTTENSOR", u32 version 1, u32 count,
# u64 reserved; per tensor u32 name_len, name, u32 dtype (1 f32, 5 int32), u32 ndim, u64 shape[ndim],
# data.

CTT_F32, CTT_I32 = 1, 5


def ctt_bytes(items):
    out = [b"CTTENSOR", struct.pack("<IIQ", 1, len(items), 0)]
    seen = set()
    for name, t in items:
        assert name not in seen, f"duplicate name {name}"
        seen.add(name)
        nb = name.encode("utf-8")
        assert 1 <= len(nb) <= 1024 and b"\0" not in nb
        t = t.detach().contiguous()
        if t.dtype in (torch.float32, torch.float64):
            dtype, fmt, vals = CTT_F32, "f", t.to(torch.float32).flatten().tolist()
        elif t.dtype in (torch.int32, torch.int64):
            dtype, fmt, vals = CTT_I32, "i", t.to(torch.int32).flatten().tolist()
        else:
            raise TypeError(f"{name}: dtype {t.dtype} has no ctt code")
        assert t.dim() <= 6
        out.append(struct.pack("<I", len(nb)) + nb)
        out.append(struct.pack("<II", dtype, t.dim()) + struct.pack(f"<{t.dim()}Q", *t.shape))
        out.append(struct.pack(f"<{len(vals)}{fmt}", *vals))
    return b"".join(out)


def ctt_write(path, items):
    """Atomic: write path.tmp, fsync, rename."""
    data = ctt_bytes(items)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(data)


def ctt_read(path):
    """Returns {name: tensor} in file order (a strict reader, used to check what was written)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"CTTENSOR", "bad magic"
    version, count, reserved = struct.unpack_from("<IIQ", data, 8)
    assert version == 1 and reserved == 0
    pos, out = 24, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, pos)
        name = data[pos + 4:pos + 4 + n].decode("utf-8")
        pos += 4 + n
        dtype, ndim = struct.unpack_from("<II", data, pos)
        shape = struct.unpack_from(f"<{ndim}Q", data, pos + 8)
        pos += 8 + 8 * ndim
        numel = math.prod(shape)
        fmt = {CTT_F32: "f", CTT_I32: "i"}[dtype]
        vals = struct.unpack_from(f"<{numel}{fmt}", data, pos)
        pos += 4 * numel
        assert name not in out
        out[name] = torch.tensor(vals, dtype=torch.float32 if dtype == CTT_F32 else torch.int32).reshape(shape)
    assert pos == len(data), "trailing bytes"
    return out


# ---------------------------------------------------------------------------------------------------
# The model


def param_shapes(c):
    """(name, shape) in the order of the contract with the C model pack; shapes are (out, in)."""
    d, hd, f = c["dim"], c["head_dim"], c["ffn_hidden"]
    out = [("tok_embeddings.weight", (c["vocab"], d))]
    for i in range(c["n_layers"]):
        p = f"layers.{i}."
        out += [(p + "attention_norm.weight", (d,)),
                (p + "attention.wq.weight", (c["n_heads"] * hd, d)),
                (p + "attention.wk.weight", (c["n_kv_heads"] * hd, d)),
                (p + "attention.wv.weight", (c["n_kv_heads"] * hd, d)),
                (p + "attention.wo.weight", (d, c["n_heads"] * hd)),
                (p + "ffn_norm.weight", (d,)),
                (p + "feed_forward.w1.weight", (f, d)),
                (p + "feed_forward.w2.weight", (d, f)),
                (p + "feed_forward.w3.weight", (f, d))]
    out += [("norm.weight", (d,)), ("output.weight", (c["vocab"], d))]
    return out


def is_norm(name):
    return name.endswith("norm.weight")


def init_params(c, gen):
    """float32 weights: embeddings N(0,1), linears N(0,0.02) (wo, w2: 0.02/sqrt(2*(layer+1))),
    output N(0, dim^-0.5), norms 1 + 0.1 N(0,1)."""
    params = {}
    for name, shape in param_shapes(c):
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name == "tok_embeddings.weight":
            t = z
        elif name == "output.weight":
            t = z * c["dim"] ** -0.5
        elif is_norm(name):
            t = 1.0 + 0.1 * z
        elif name.endswith("wo.weight") or name.endswith("w2.weight"):
            layer = int(name.split(".")[1])
            t = z * (0.02 / math.sqrt(2 * (layer + 1)))
        else:
            t = z * 0.02
        params[name] = t.to(torch.float32)
    return params


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(c, T):
    """(T, hd/2) cos and sin of t * theta^(-2i/hd), in float64."""
    hd = c["head_dim"]
    i = torch.arange(hd // 2, dtype=torch.float64)
    inv_freq = c["rope_theta"] ** (-2.0 * i / hd)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """x (B, T, H, hd): rotate each pair (x[2i], x[2i+1]) by the angle of (t, i)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def attention(c, x, wq, wk, wv, wo, cos, sin):
    B, T, _ = x.shape
    H, KVH, hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
    q = (x @ wq.T).view(B, T, H, hd)
    k = (x @ wk.T).view(B, T, KVH, hd)
    v = (x @ wv.T).view(B, T, KVH, hd)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k = k.repeat_interleave(H // KVH, dim=2)  # query head j reads kv head j // (H / KVH)
    v = v.repeat_interleave(H // KVH, dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = scores.masked_fill(causal, float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
    return y @ wo.T


def forward(c, p, tokens):
    """logits (B, T, vocab) from p (name -> float64 tensor) and tokens (B, T)."""
    eps = c["norm_eps"]
    h = p["tok_embeddings.weight"][tokens.long()]
    cos, sin = rope_cos_sin(c, tokens.shape[1])
    for i in range(c["n_layers"]):
        L = f"layers.{i}."
        x = rms_norm(h, p[L + "attention_norm.weight"], eps)
        h = h + attention(c, x, *(p[L + f"attention.{w}.weight"] for w in ("wq", "wk", "wv", "wo")), cos, sin)
        x = rms_norm(h, p[L + "ffn_norm.weight"], eps)
        ff = F.silu(x @ p[L + "feed_forward.w1.weight"].T) * (x @ p[L + "feed_forward.w3.weight"].T)
        h = h + ff @ p[L + "feed_forward.w2.weight"].T
    return rms_norm(h, p["norm.weight"], eps) @ p["output.weight"].T


def loss_fn(logits, targets):
    """Sum of cross entropy over targets != -100, divided by their number."""
    t = targets.flatten().long()
    n_valid = int((t != -100).sum())
    return F.cross_entropy(logits.flatten(0, 1), t, reduction="sum", ignore_index=-100) / n_valid


# ---------------------------------------------------------------------------------------------------
# Independent checks


def forward_torchtitan_style(c, p, tokens):
    """The same model the way torchtitan writes it (complex RoPE, expand-based repeat_kv, sdpa,
    F.rms_norm), to cross-check forward()."""
    B, T = tokens.shape
    H, KVH, hd, eps = c["n_heads"], c["n_kv_heads"], c["head_dim"], c["norm_eps"]
    freqs = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64)[: hd // 2] / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs).view(1, T, 1, hd // 2)

    def rope(x):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * freqs_cis).flatten(3)

    def repeat_kv(x, n):
        b, s, kvh, d = x.shape
        return x[:, :, :, None, :].expand(b, s, kvh, n, d).reshape(b, s, kvh * n, d)

    def norm(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    h = F.embedding(tokens.long(), p["tok_embeddings.weight"])
    for i in range(c["n_layers"]):
        L = f"layers.{i}."
        x = norm(h, p[L + "attention_norm.weight"])
        q = F.linear(x, p[L + "attention.wq.weight"]).view(B, T, -1, hd)
        k = F.linear(x, p[L + "attention.wk.weight"]).view(B, T, -1, hd)
        v = F.linear(x, p[L + "attention.wv.weight"]).view(B, T, -1, hd)
        q, k = rope(q), rope(k)
        k, v = repeat_kv(k, H // KVH), repeat_kv(v, H // KVH)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = h + F.linear(y.transpose(1, 2).contiguous().view(B, T, -1), p[L + "attention.wo.weight"])
        x = norm(h, p[L + "ffn_norm.weight"])
        h = h + F.linear(F.silu(F.linear(x, p[L + "feed_forward.w1.weight"])) * F.linear(x, p[L + "feed_forward.w3.weight"]),
                         p[L + "feed_forward.w2.weight"])
    return F.linear(norm(h, p["norm.weight"]), p["output.weight"])


def check_gradcheck():
    """torch.autograd.gradcheck of loss(forward()) w.r.t. every parameter, on a smaller model."""
    c = dict(CONFIG, dim=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, vocab=11, ffn_hidden=12,
             seq_len=5, batch=2)
    g = torch.Generator().manual_seed(7)
    p0 = init_params(c, g)
    names = list(p0)
    tokens = torch.randint(0, c["vocab"], (2, 5), generator=g, dtype=torch.int32)
    targets = torch.randint(0, c["vocab"], (2, 5), generator=g, dtype=torch.int32)
    targets[0, 1] = -100
    leaves = tuple(p0[n].double().requires_grad_() for n in names)

    def f(*ts):
        return loss_fn(forward(c, dict(zip(names, ts)), tokens), targets)

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-5), "gradcheck failed"


def check_finite_differences(p64, tokens, targets, grads, gen, n=12):
    """Central differences on random coordinates of the full model agree with autograd."""
    names = list(p64)
    worst = 0.0
    for _ in range(n):
        name = names[int(torch.randint(len(names), (1,), generator=gen))]
        idx = int(torch.randint(p64[name].numel(), (1,), generator=gen))
        h = 1e-5
        vals = []
        for s in (1, -1):
            q = {k: v.detach().clone() for k, v in p64.items()}
            q[name].view(-1)[idx] += s * h
            vals.append(float(loss_fn(forward(CONFIG, q, tokens), targets)))
        fd = (vals[0] - vals[1]) / (2 * h)
        ad = float(grads[name].view(-1)[idx])
        err = abs(fd - ad) / max(1e-6, abs(ad))
        worst = max(worst, err if abs(ad) > 1e-6 else abs(fd - ad))
        assert abs(fd - ad) <= 1e-7 + 1e-5 * abs(ad), f"{name}[{idx}]: autograd {ad} vs finite difference {fd}"
    return worst


# ---------------------------------------------------------------------------------------------------


def compute():
    torch.set_num_threads(1)  # fixed summation order, so a rerun gives the same bytes
    c = CONFIG
    gen = torch.Generator().manual_seed(SEED)
    params32 = init_params(c, gen)
    B, T, V = c["batch"], c["seq_len"], c["vocab"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int32)
    ignored = torch.randperm(B * T, generator=gen)[:N_IGNORED]
    targets.view(-1)[ignored] = -100

    # forward + backward in float64 on the float32 weights
    p64 = {n: t.double().requires_grad_() for n, t in params32.items()}
    logits = forward(c, p64, tokens)
    loss = loss_fn(logits, targets)
    loss.backward()
    grads = {n: t.grad.detach().clone() for n, t in p64.items()}

    # the cross-checks
    with torch.no_grad():
        p_plain = {n: t.detach() for n, t in p64.items()}
        ref = forward_torchtitan_style(c, p_plain, tokens)
        fwd_diff = float((ref - logits.detach()).abs().max())
        assert fwd_diff < 1e-10, f"forward disagrees with the torchtitan-style forward by {fwd_diff}"
    check_gradcheck()
    fd_worst = check_finite_differences({n: t.detach() for n, t in p64.items()}, tokens, targets, grads, gen)
    assert math.isfinite(loss.item())

    # AdamW: 10 steps on the same batch, clip by global norm first; norms have no weight decay
    a = ADAMW
    q = {n: torch.nn.Parameter(t.double().clone()) for n, t in params32.items()}
    groups = [{"params": [q[n] for n in q if not is_norm(n)], "weight_decay": a["weight_decay"]},
              {"params": [q[n] for n in q if is_norm(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"],
                            weight_decay=a["weight_decay"], foreach=False)
    losses, grad_norms = [], []
    for _ in range(a["steps"]):
        opt.zero_grad(set_to_none=True)
        step_loss = loss_fn(forward(c, q, tokens), targets)
        step_loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(list(q.values()), max_norm=a["max_norm"], foreach=False)
        opt.step()
        losses.append(step_loss.item())
        grad_norms.append(float(gn))
    assert abs(losses[0] - loss.item()) < 1e-12
    full_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
    assert abs(grad_norms[0] - full_norm) < 1e-9 * full_norm
    assert all(math.isfinite(x) for x in losses + grad_norms)
    assert losses[-1] < losses[0] - 0.1, f"AdamW losses do not fall: {losses}"

    items = []
    for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab", "ffn_hidden", "seq_len", "batch"):
        items.append((f"config.{k}", torch.tensor(c[k], dtype=torch.int32)))
    items.append(("config.rope_theta", torch.tensor(c["rope_theta"], dtype=torch.float32)))
    items.append(("config.norm_eps", torch.tensor(c["norm_eps"], dtype=torch.float32)))
    for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "max_norm"):
        items.append((f"adamw.{k}", torch.tensor(a[k], dtype=torch.float32)))
    items.append(("adamw.steps", torch.tensor(a["steps"], dtype=torch.int32)))
    items += [(n, t) for n, t in params32.items()]
    items.append(("input.tokens", tokens))
    items.append(("input.targets", targets))
    items.append(("expected.logits", logits.detach()))
    items.append(("expected.loss", loss.detach()))
    items += [(f"grad.{n}", g) for n, g in grads.items()]
    items.append(("adamw.losses", torch.tensor(losses, dtype=torch.float64)))
    items.append(("adamw.grad_norms", torch.tensor(grad_norms, dtype=torch.float64)))
    items += [(f"adamw.final.{n}", t.detach()) for n, t in q.items()]
    summary = dict(loss=loss.item(), losses=losses, grad_norms=grad_norms, fwd_diff=fwd_diff, fd_worst=fd_worst,
                   n_valid=int((targets != -100).sum()))
    return items, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output path (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with the existing file instead of writing")
    ap.add_argument("--list", action="store_true", help="print every name and shape")
    args = ap.parse_args()

    items, s = compute()
    print(f"loss {s['loss']:.9f} over {s['n_valid']} valid targets; "
          f"forward cross-check max |diff| {s['fwd_diff']:.2e}; finite differences worst rel err {s['fd_worst']:.2e}; "
          f"gradcheck ok")
    print("adamw losses     " + " ".join(f"{x:.6f}" for x in s["losses"]))
    print("adamw grad norms " + " ".join(f"{x:.6f}" for x in s["grad_norms"]))

    if args.check:
        have = ctt_read(args.out)
        bad = 0
        assert list(have) == [n for n, _ in items], "names or their order differ"
        for n, t in items:
            want = t.detach().to(torch.float32 if t.is_floating_point() else torch.int32)
            got = have[n]
            if got.shape != want.shape or got.dtype != want.dtype:
                print(f"{n}: shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}")
                bad += 1
            elif not torch.equal(got, want):
                d = float((got.double() - want.double()).abs().max())
                print(f"{n}: values differ, max |diff| {d:.3e}")
                bad += d > 1e-6 * max(1.0, float(want.double().abs().max()))
        print(f"{args.out}: {'matches' if not bad else f'{bad} tensors differ'}")
        return 1 if bad else 0

    size = ctt_write(args.out, items)
    back = ctt_read(args.out)
    assert list(back) == [n for n, _ in items]
    for n, t in items:
        assert torch.equal(back[n], t.detach().to(back[n].dtype)), n
    print(f"wrote {args.out}: {len(items)} tensors, {size} bytes")
    if args.list:
        for n, t in items:
            print(f"  {n:44s} {'f32' if t.is_floating_point() else 'i32'} {tuple(t.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
