#!/usr/bin/env python3
"""torch_qwen3_moe.py: a PyTorch reference trainer for ctitan's Qwen3-MoE shapes, to compare throughput.

The model is transformers' Qwen3MoeForCausalLM built from a Qwen3MoeConfig with the sizes of
models/qwen3/qwen3.c's debugmodel_moe flavor (dim 256, 16 heads, 8 kv heads, head_dim 128, vocab 2048,
tied embeddings, 64 experts of moe_intermediate_size 768, top-8 with norm_topk_prob, rope theta 1e6,
RMSNorm eps 1e-6, no shared expert), with the layer count and expert sizes overridable as ctitan's
--model.* options override them. The load-balancing loss is on (router_aux_loss_coef 0.001, Qwen3's and
ctitan's), so both sides compute the same loss. AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1 off
the norms), gradients clipped to norm 1; tokens are random; fp32 throughout.

transformers runs the experts with its `experts_implementation` (--experts): grouped_mm (its default:
tokens sorted by expert, one grouped GEMM per projection, as ctitan's moe op does), eager (a Python loop
over the experts hit) or batched_mm.

FLOPs per token are ctitan's (models/qwen3 describe, torchtitan's MoE formula): only the top_k experts a
token visits count, the router counts whole, a tied table counts once as the output projection:
    6 * (active params - embedding params + tied output) + 12 * layers * heads * head_dim * seq_len
GFLOP/s and mfu are against this CPU's measured f32 matmul peak (a 512^3 torch.mm, best of 20), which swings
with the load on a shared machine; tokens/s is the figure to compare.

Output: one line per configuration:
    torch_qwen3_moe: layers=1 experts=64 top_k=8 moe_hidden=768 seq=256 batch=8 threads=2 experts_impl=grouped_mm \
        status=ok tokens_per_s=... gflops=... mfu=... peak_gflops=... loss=... aux_loss=...
status is ok or error (then `error=` says what).

Example:
    python3 bench/torch_qwen3_moe.py --layers 2 --seq 256 --batch 8 --steps 8
"""
import argparse
import os
import sys
import time

import torch

# models/qwen3/qwen3.c's debugmodel_moe: dim, layers, heads, kv heads, head_dim, vocab, experts, top_k,
# moe_hidden, rope theta, norm eps; tied embeddings, norm_topk_prob
DEBUGMODEL_MOE = dict(dim=256, layers=8, heads=16, kv_heads=8, head_dim=128, vocab=2048, experts=64, top_k=8,
                      moe_hidden=768, rope_theta=1e6, norm_eps=1e-6)


def flops_per_token(c, seq):
    """ctitan's qwen3 describe: 6 x active non-embedding params (+ the tied output) + attention."""
    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    ffn_active = c["experts"] * c["dim"] + c["top_k"] * 3 * c["dim"] * c["moe_hidden"]
    per_layer = 2 * c["dim"] + 2 * c["head_dim"] + 2 * c["dim"] * q + 2 * c["dim"] * kv + ffn_active
    active = c["vocab"] * c["dim"] + c["dim"] + c["layers"] * per_layer  # tied: the table once
    return 6.0 * active + 12.0 * c["layers"] * c["heads"] * c["head_dim"] * seq


def build_model(c, experts_impl):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(vocab_size=c["vocab"], hidden_size=c["dim"], num_hidden_layers=c["layers"],
                         num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"],
                         num_experts=c["experts"], num_experts_per_tok=c["top_k"],
                         moe_intermediate_size=c["moe_hidden"], norm_topk_prob=True,
                         intermediate_size=3072,  # the dense MLP's, unused: every block is MoE
                         rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
                         rms_norm_eps=c["norm_eps"], tie_word_embeddings=True, output_router_logits=True,
                         router_aux_loss_coef=0.001, use_cache=False, max_position_embeddings=40960)
    return Qwen3MoeForCausalLM._from_config(cfg, experts_implementation=experts_impl, dtype=torch.float32)


def measure_peak():
    """Best FLOP/s of a 512^3 f32 matmul on this CPU, with the threads set (noisy on a shared machine; ctitan's
    ratio is against its device's figure, from the clock and vector width)."""
    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for rep in range(21):
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        if rep > 0:
            best = min(best, dt)
    return 2.0 * n ** 3 / best


def run(args, c):
    res = dict(layers=c["layers"], experts=c["experts"], top_k=c["top_k"], moe_hidden=c["moe_hidden"],
               seq=args.seq, batch=args.batch, threads=torch.get_num_threads(), experts_impl=args.experts,
               status="ok")
    try:
        torch.manual_seed(args.seed)
        model = build_model(c, args.experts)
        model.train()
        res["experts_impl"] = model.config._experts_implementation
        decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
        no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
        g = torch.Generator().manual_seed(args.seed)

        def step():
            tokens = torch.randint(0, c["vocab"], (args.batch, args.seq), generator=g)
            out = model(input_ids=tokens, labels=tokens)  # transformers shifts the labels itself
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return out

        warmup = min(args.warmup, max(args.steps - 1, 0))
        out = None
        for _ in range(warmup):  # allocator, first touch of the AdamW states
            out = step()
        t0 = time.perf_counter()
        timed = args.steps - warmup
        for _ in range(timed):
            out = step()
        dt = time.perf_counter() - t0
        tps = args.batch * args.seq * timed / dt if timed > 0 else 0.0
        peak = measure_peak()
        gflops = flops_per_token(c, args.seq) * tps / 1e9
        res.update(tokens_per_s=f"{tps:.1f}", gflops=f"{gflops:.1f}", mfu=f"{100 * gflops * 1e9 / peak:.2f}%",
                   peak_gflops=f"{peak / 1e9:.1f}", loss=f"{out.loss.item():.4f}",
                   aux_loss=f"{out.aux_loss.item():.4f}", params=sum(p.numel() for p in model.parameters()),
                   flops_per_token=f"{flops_per_token(c, args.seq):.4g}")
    except Exception as e:
        res.update(status="error", error=f"{type(e).__name__}:{str(e).splitlines()[0][:80] if str(e) else ''}"
                   .replace(" ", "_"))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=DEBUGMODEL_MOE["layers"])
    ap.add_argument("--experts-per-block", dest="n_experts", type=int, default=DEBUGMODEL_MOE["experts"])
    ap.add_argument("--top-k", type=int, default=DEBUGMODEL_MOE["top_k"])
    ap.add_argument("--moe-hidden", type=int, default=DEBUGMODEL_MOE["moe_hidden"])
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8, help="steps, warmup included")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (make bench: 2, as ctitan's)")
    ap.add_argument("--experts", default="grouped_mm", choices=["grouped_mm", "eager", "batched_mm"],
                    help="transformers' experts_implementation")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(max(1, args.threads))
    c = dict(DEBUGMODEL_MOE, layers=args.layers, experts=args.n_experts, top_k=args.top_k, moe_hidden=args.moe_hidden)
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, cpu, {os.cpu_count()} cores",
          flush=True)
    r = run(args, c)
    print("torch_qwen3_moe: " + " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    return 0 if r["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
