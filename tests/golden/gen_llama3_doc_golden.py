#!/usr/bin/env python3
"""Golden values for block-causal attention over packed documents on a tiny Llama 3 (float64).

Writes tests/golden/llama3_doc_tiny.ctt: the tiny model of gen_llama3_golden.py (same shapes, weights
drawn with another seed) on two sequences that each pack several documents ended by an EOS token,
with attention masked by an explicit boolean document mask (a token sees the earlier tokens of its
own document; the EOS is its document's last token, as torchtitan's get_document_mask_mod counts
documents), and the targets masked at the document boundaries (the target of each EOS, the next
document's first token, is ignored). Stored: the weights, the tokens, the raw and the masked
targets, the logits, the loss and every parameter's gradient. Also the causal model's logits on the
same tokens, so the C test can show that the mask changed them. Run from the repository root:

    python3 tests/golden/gen_llama3_doc_golden.py            # (re)write the file
    python3 tests/golden/gen_llama3_doc_golden.py --check    # recompute and compare with the committed file

Before writing it checks the explicit mask against torch's scaled_dot_product_attention given the
same boolean mask, and against running each document alone, from position 0, through the causal
model (its logits must be the packed run's rows for that document to 1e-9): so the same logits hold
for RoPE positions restarted per document (input.doc_positions), which the C test checks too.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llama3_golden as base  # noqa: E402  (the model, the format)

SEED = 20261207
EOS = 255
# EOS positions per sequence: documents of 6, 1, 11, 14 tokens (the last ends the row), and of 13,
# 8, 11 (the last runs past the row's end: no EOS)
EOS_AT = ([5, 6, 17, 31], [12, 20])
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama3_doc_tiny.ctt")


def doc_ids(tokens):
    """(B, T) document ids: 0 from each row's start, one more after each EOS."""
    is_eos = (tokens == EOS).long()
    return torch.cumsum(is_eos, dim=1) - is_eos


def doc_positions(tokens):
    """(B, T) each token's position within its document, from 0 (RoPE restarted per document)."""
    d = doc_ids(tokens)
    T = tokens.shape[1]
    idx = torch.arange(T).expand_as(d)
    start = torch.zeros_like(d)
    for b in range(d.shape[0]):
        for doc in range(int(d[b].max()) + 1):
            rows = (d[b] == doc).nonzero().flatten()
            start[b, rows] = int(rows[0])
    return idx - start


def doc_mask(tokens):
    """(B, 1, T, T) True where key j is visible to query i: same document and j <= i."""
    d = doc_ids(tokens)
    T = tokens.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return ((d[:, :, None] == d[:, None, :]) & causal)[:, None]


def attention(c, x, wq, wk, wv, wo, cos, sin, mask):
    B, T, _ = x.shape
    H, KVH, hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
    q = base.apply_rope((x @ wq.T).view(B, T, H, hd), cos, sin)
    k = base.apply_rope((x @ wk.T).view(B, T, KVH, hd), cos, sin)
    v = (x @ wv.T).view(B, T, KVH, hd)
    k = k.repeat_interleave(H // KVH, dim=2)
    v = v.repeat_interleave(H // KVH, dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    att = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, T, H * hd) @ wo.T


def forward(c, p, tokens, mask, sdpa=False):
    eps = c["norm_eps"]
    h = p["tok_embeddings.weight"][tokens.long()]
    cos, sin = base.rope_cos_sin(c, tokens.shape[1])
    for i in range(c["n_layers"]):
        L = f"layers.{i}."
        x = base.rms_norm(h, p[L + "attention_norm.weight"], eps)
        w = [p[L + f"attention.{n}.weight"] for n in ("wq", "wk", "wv", "wo")]
        if sdpa:
            B, T, _ = x.shape
            H, KVH, hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
            q = base.apply_rope((x @ w[0].T).view(B, T, H, hd), cos, sin).transpose(1, 2)
            k = base.apply_rope((x @ w[1].T).view(B, T, KVH, hd), cos, sin).transpose(1, 2)
            v = (x @ w[2].T).view(B, T, KVH, hd).transpose(1, 2)
            k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            h = h + y.transpose(1, 2).reshape(B, T, H * hd) @ w[3].T
        else:
            h = h + attention(c, x, *w, cos, sin, mask)
        x = base.rms_norm(h, p[L + "ffn_norm.weight"], eps)
        ff = F.silu(x @ p[L + "feed_forward.w1.weight"].T) * (x @ p[L + "feed_forward.w3.weight"].T)
        h = h + ff @ p[L + "feed_forward.w2.weight"].T
    return base.rms_norm(h, p["norm.weight"], eps) @ p["output.weight"].T


def compute():
    torch.set_num_threads(1)
    c = base.CONFIG
    gen = torch.Generator().manual_seed(SEED)
    params32 = base.init_params(c, gen)
    B, T, V = c["batch"], c["seq_len"], c["vocab"]
    tokens = torch.randint(0, EOS, (B, T), generator=gen, dtype=torch.int32)  # no EOS but where placed
    for b, at in enumerate(EOS_AT):
        tokens[b, at] = EOS
    raw = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int32)
    raw[0, 3] = -100  # an ignored target inside a document stays ignored
    targets = torch.where(tokens == EOS, torch.full_like(raw, -100), raw)
    mask = doc_mask(tokens)
    assert int(doc_ids(tokens).max()) >= 2, "several documents per sequence"

    p64 = {n: t.double().requires_grad_() for n, t in params32.items()}
    logits = forward(c, p64, tokens, mask)
    loss = base.loss_fn(logits, targets)
    loss.backward()
    grads = {n: t.grad.detach().clone() for n, t in p64.items()}
    with torch.no_grad():
        plain = {n: t.detach() for n, t in p64.items()}
        sd = forward(c, plain, tokens, mask, sdpa=True)
        sdpa_diff = float((sd - logits.detach()).abs().max())
        assert sdpa_diff < 1e-10, f"explicit mask and sdpa disagree by {sdpa_diff}"
        # each document alone, from its own start, through the causal model: the packed rows are its
        # logits (RoPE's scores depend only on the distance between positions, so the offset of a
        # document in its sequence changes nothing: RoPE restarted per document is the same function)
        alone = 0.0
        d = doc_ids(tokens)
        for b in range(B):
            for doc in range(int(d[b].max()) + 1):
                rows = (d[b] == doc).nonzero().flatten()
                a, e = int(rows[0]), int(rows[-1]) + 1
                n = e - a
                one = forward(c, plain, tokens[b : b + 1, a:e], torch.ones(n, n, dtype=torch.bool).tril()[None, None])
                alone = max(alone, float((one[0] - logits.detach()[b, a:e]).abs().max()))
        causal_logits = forward(c, plain, tokens, torch.ones(T, T, dtype=torch.bool).tril()[None, None])
        moved = float((causal_logits - logits.detach()).abs().max())
        assert moved > 1e-3, "the document mask changed nothing"

    items = []
    for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab", "ffn_hidden", "seq_len", "batch"):
        items.append((f"config.{k}", torch.tensor(c[k], dtype=torch.int32)))
    items.append(("config.rope_theta", torch.tensor(c["rope_theta"], dtype=torch.float32)))
    items.append(("config.norm_eps", torch.tensor(c["norm_eps"], dtype=torch.float32)))
    items.append(("config.eos_id", torch.tensor(EOS, dtype=torch.int32)))
    items += [(n, t) for n, t in params32.items()]
    items.append(("input.tokens", tokens))
    items.append(("input.targets_raw", raw))
    items.append(("input.targets", targets))
    items.append(("input.doc_ids", doc_ids(tokens).to(torch.int32)))
    items.append(("input.doc_positions", doc_positions(tokens).to(torch.int32)))
    items.append(("expected.logits", logits.detach()))
    items.append(("expected.causal_logits", causal_logits))
    items.append(("expected.loss", loss.detach()))
    items += [(f"grad.{n}", g) for n, g in grads.items()]
    summary = dict(loss=loss.item(), sdpa=sdpa_diff, alone=alone, moved=moved,
                   n_valid=int((targets != -100).sum()), docs=[int(d[b].max()) + 1 for b in range(B)])
    return items, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with the existing file instead of writing")
    args = ap.parse_args()
    items, s = compute()
    print(f"loss {s['loss']:.9f} over {s['n_valid']} valid targets; documents per sequence {s['docs']}; "
          f"sdpa cross-check {s['sdpa']:.1e}; documents alone {s['alone']:.1e}; causal differs by {s['moved']:.3f}")
    if args.check:
        have = base.ctt_read(args.out)
        assert list(have) == [n for n, _ in items], "names or their order differ"
        bad = 0
        for n, t in items:
            want = t.detach().to(torch.float32 if t.is_floating_point() else torch.int32)
            if have[n].shape != want.shape or not torch.equal(have[n], want):
                print(f"{n}: differs")
                bad += 1
        print(f"{args.out}: {'matches' if not bad else f'{bad} tensors differ'}")
        return 1 if bad else 0
    size = base.ctt_write(args.out, items)
    print(f"wrote {args.out}: {len(items)} tensors, {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
