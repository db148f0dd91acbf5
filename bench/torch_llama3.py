#!/usr/bin/env python3
"""torch_llama3.py: a PyTorch reference trainer for ctitan's Llama 3 shapes, to compare throughput.

The model is models/llama3/llama3.c's: RMSNorm (eps 1e-5), RoPE on interleaved pairs
(x[2i], x[2i+1]) rotated by t * theta^(-2i/head_dim) (theta 500000), grouped-query attention
(causal SDPA), SwiGLU with torchtitan's hidden size (4 dim -> 2/3 -> * ffn_dim_multiplier -> round
up to multiple_of), untied output, cross-entropy over the full vocabulary; AdamW (lr 3e-4, betas
0.9/0.95, weight decay 0.1 off the norms), gradients clipped to norm 1. Tokens are random.

Precisions (--dtype): fp32 (TF32 off: what ctitan's f32 GEMMs do), tf32 (f32 with TF32 matmuls:
ctitan's device.tf32 option), bf16 (f32 parameters as master weights, bf16 autocast for compute).
Modes (--mode): eager, compile (torch.compile; reported as failed when it cannot run), or both.

FLOPs per token are ctitan's (models/llama3 describe, torchtitan's formula):
    6 * (params - embedding params) + 12 * layers * heads * head_dim * seq_len
MFU is against this device's measured matmul peak for the same dtype (a 4096^3 torch.mm timed
with events on a GPU; on a CPU, wall time), as ctitan measures its f32 peak.

Output: one line per configuration, parsed by tests/gpu/run.sh:
    torch_llama3: flavor=1B seq=2048 batch=1 dtype=bf16 mode=eager status=ok tokens_per_s=... \
        tflops=... mfu=... peak_tflops=... peak_mem_gib=... peak_mem_mib=... loss=...
status is ok, oom, compile_failed or error (then `error=` says what); the script goes on.

Examples:
    python3 bench/torch_llama3.py --flavor 1B --seq 2048 --dtype bf16 --mode both
    python3 bench/torch_llama3.py --flavor tiny --seq 64 --batch 2 --steps 2 --device cpu
"""
import argparse
import math
import os
import resource
import sys
import time

import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

# ctitan's flavors (models/llama3/llama3.c): dim, layers, heads, kv heads, vocab, ffn multiplier,
# multiple_of, rope theta. "tiny" is a CPU smoke-test shape, not a torchtitan flavor.
FLAVORS = {
    "tiny": (64, 2, 4, 2, 256, 0.0, 32, 500000.0),
    "debugmodel": (256, 6, 16, 16, 2048, 0.0, 256, 500000.0),
    "124M": (768, 12, 12, 4, 32000, 0.0, 256, 500000.0),  # make bench's 124M-class shape (ffn 2048)
    "1B": (2048, 16, 32, 8, 128256, 1.5, 1024, 500000.0),
    "3B": (3072, 28, 24, 8, 128256, 1.0, 1024, 500000.0),
    "8B": (4096, 32, 32, 8, 128256, 1.3, 1024, 500000.0),
}
NORM_EPS = 1e-5


def ffn_hidden(dim, mult, multiple_of):
    h = int(2 * (4 * dim) / 3)
    if mult > 0:
        h = int(mult * h)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


class Config:
    def __init__(self, flavor, seq):
        dim, layers, heads, kv, vocab, mult, multiple_of, theta = FLAVORS[flavor]
        self.flavor, self.dim, self.n_layers, self.n_heads, self.n_kv_heads = flavor, dim, layers, heads, kv
        self.vocab, self.rope_theta, self.seq = vocab, theta, seq
        self.head_dim = dim // heads
        self.ffn = ffn_hidden(dim, mult, multiple_of)

    def n_params(self):
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        per_layer = 2 * self.dim + self.dim * q * 2 + 2 * self.dim * kv + 3 * self.dim * self.ffn
        return self.vocab * self.dim * 2 + self.dim + self.n_layers * per_layer

    def flops_per_token(self):
        return 6.0 * (self.n_params() - self.vocab * self.dim) + \
            12.0 * self.n_layers * self.n_heads * self.head_dim * self.seq


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)).type_as(x) * self.weight


def rope_tables(c, device):
    """(T, hd/2) cos and sin of t * theta^(-2i/hd), f32 as torchtitan computes them."""
    i = torch.arange(0, c.head_dim, 2, device=device)[: c.head_dim // 2].float()
    freqs = 1.0 / (c.rope_theta ** (i / c.head_dim))
    angles = torch.outer(torch.arange(c.seq, device=device).float(), freqs)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """x (B, T, H, hd): rotate the interleaved pairs (x[2i], x[2i+1])."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        self.attention_norm, self.ffn_norm = RMSNorm(c.dim), RMSNorm(c.dim)
        self.wq, self.wk = nn.Linear(c.dim, q, bias=False), nn.Linear(c.dim, kv, bias=False)
        self.wv, self.wo = nn.Linear(c.dim, kv, bias=False), nn.Linear(q, c.dim, bias=False)
        self.w1, self.w3 = nn.Linear(c.dim, c.ffn, bias=False), nn.Linear(c.dim, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.dim, bias=False)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, c.n_heads, c.head_dim)
        k = self.wk(h).view(B, T, c.n_kv_heads, c.head_dim)
        v = self.wv(h).view(B, T, c.n_kv_heads, c.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        rep = c.n_heads // c.n_kv_heads
        if rep > 1:  # GQA: query head i reads kv head i // rep
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama3(nn.Module):
    def __init__(self, c, ac):
        super().__init__()
        self.c, self.ac = c, ac
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)
        self.init_weights()

    def init_weights(self):
        """ctitan's initialisation (llama3.c): embeddings N(0, 1), linears trunc-normal 0.02,
        output projections 0.02 / sqrt(2 (layer + 1)), output layer 1 / sqrt(dim)."""
        nn.init.normal_(self.tok_embeddings.weight)
        for i, layer in enumerate(self.layers):
            std = 0.02 / math.sqrt(2 * (i + 1))
            for name in ("wq", "wk", "wv", "w1"):
                nn.init.trunc_normal_(getattr(layer, name).weight, std=0.02, a=-2, b=2)
            for name in ("wo", "w2", "w3"):
                nn.init.trunc_normal_(getattr(layer, name).weight, std=std, a=-2, b=2)
        s = 1 / math.sqrt(self.c.dim)
        nn.init.trunc_normal_(self.output.weight, std=s, a=-3 * s, b=3 * s)

    def forward(self, tokens, targets, cos, sin):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            if self.ac == "full" and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False)
            elif self.ac == "op" and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False,
                                                      context_fn=op_sac_contexts)
            else:
                x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def op_sac_contexts():
    """torchtitan's per-op selective checkpointing policy (activation_checkpoint.mode: selective,
    selective_ac_option: op), as ctitan's RT_AC_OP follows it: a block keeps the outputs of its
    matmuls, its attention and max, but recomputes every second matmul; all else is recomputed.
    Counts restart with each block's forward and, apart, with its recompute."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    keep = {aten.mm.default, aten.max.default}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
        if hasattr(aten, name):
            keep.add(getattr(aten, name).default)
    seen = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        if func == aten.mm.default:
            seen[ctx.is_recompute] += 1
            if seen[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_peak(device, dtype):
    """Best FLOP/s of a square matmul of the dtype ctitan's MFU would compare against."""
    n = 4096 if device.type == "cuda" else 512
    mm_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=mm_dtype)
    b = torch.randn(n, n, device=device, dtype=mm_dtype)
    best = float("inf")
    for rep in range(6):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b)
            stop.record()
            stop.synchronize()
            dt = start.elapsed_time(stop) / 1e3
        else:
            t0 = time.perf_counter()
            torch.mm(a, b)
            dt = time.perf_counter() - t0
        if rep > 0:
            best = min(best, dt)
    return 2.0 * n ** 3 / best


def set_precision(dtype):
    tf32 = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def run_one(args, device, flavor, seq, dtype, mode):
    """Trains `steps` steps; returns a dict of the results line's fields."""
    c = Config(flavor, seq)
    res = dict(flavor=flavor, seq=seq, batch=args.batch, dtype=dtype, mode=mode, status="ok")
    model = opt = None
    try:
        set_precision(dtype)
        torch.manual_seed(args.seed)
        model = Llama3(c, args.ac).to(device)
        decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
        no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
        cos, sin = rope_tables(c, device)
        fwd = model
        if mode == "compile":
            try:
                fwd = torch.compile(model)
            except Exception as e:  # no compiler backend here
                res.update(status="compile_failed", error=type(e).__name__)
                return res
        g = torch.Generator(device="cpu").manual_seed(args.seed)

        def step():
            tokens = torch.randint(0, c.vocab, (args.batch, seq + 1), generator=g).to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                loss = fwd(tokens[:, :-1], tokens[:, 1:], cos, sin)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        warmup = min(args.warmup, max(args.steps - 1, 0))
        loss = None
        for _ in range(warmup):  # compile, allocator, cuBLAS heuristics
            try:
                loss = step()
            except Exception as e:
                if mode == "compile" and not isinstance(e, torch.cuda.OutOfMemoryError):
                    res.update(status="compile_failed", error=type(e).__name__)
                    return res
                raise
        sync(device)
        t0 = time.perf_counter()
        timed = args.steps - warmup
        for _ in range(timed):
            loss = step()
        sync(device)
        dt = time.perf_counter() - t0
        tps = args.batch * seq * timed / dt if timed > 0 else 0.0
        if device.type == "cuda":
            mem = torch.cuda.max_memory_allocated() / 2 ** 30
        else:  # the resident set's peak (run with MALLOC_MMAP_THRESHOLD_=65536 to make it follow frees)
            mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB -> GiB
        peak = measure_peak(device, dtype) if not args.peak_tflops else args.peak_tflops * 1e12
        tflops = c.flops_per_token() * tps / 1e12
        res.update(tokens_per_s=f"{tps:.1f}", tflops=f"{tflops:.3f}", mfu=f"{100 * tflops * 1e12 / peak:.2f}%",
                   peak_tflops=f"{peak / 1e12:.2f}", peak_mem_gib=f"{mem:.2f}", peak_mem_mib=f"{mem * 1024:.1f}",
                   loss=f"{loss.item():.4f}",
                   params=c.n_params(), flops_per_token=f"{c.flops_per_token():.4g}")
    except torch.cuda.OutOfMemoryError:
        res.update(status="oom")
    except Exception as e:
        res.update(status="error", error=f"{type(e).__name__}:{str(e).splitlines()[0][:80] if str(e) else ''}"
                   .replace(" ", "_"))
    finally:
        del model, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flavor", nargs="+", default=["1B"], choices=sorted(FLAVORS))
    ap.add_argument("--seq", nargs="+", type=int, default=[2048])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6, help="steps per configuration, warmup included")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    ap.add_argument("--dtype", nargs="+", default=["bf16"], choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--mode", default="eager", choices=["eager", "compile", "both"])
    ap.add_argument("--ac", default="none", choices=["none", "op", "full"],
                    help="activation checkpointing per block (op: torchtitan's selective per-op policy)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="use this peak instead of measuring it")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, device {name}", flush=True)
    modes = ["eager", "compile"] if args.mode == "both" else [args.mode]
    failures = 0
    for flavor in args.flavor:
        for seq in args.seq:
            for dtype in args.dtype:
                for mode in modes:
                    r = run_one(args, device, flavor, seq, dtype, mode)
                    failures += r["status"] not in ("ok", "compile_failed")
                    print("torch_llama3: " + " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
