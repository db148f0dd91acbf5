#!/usr/bin/env python3
"""Golden files for ctitan's Hugging Face interop (`ctitan convert` through the packs' tables), checked with transformers.

Two directions, both under tests/golden/hf/:

  from_ctitan/        made by ctitan (`ctitan convert --to hf` on tests/golden/llama3_tiny.ctt). This
                      script VERIFIES it: transformers' LlamaForCausalLM.from_pretrained loads it and its
                      logits on llama3_tiny's batch must match llama3_tiny.ctt's expected.logits (computed
                      by gen_llama3_golden.py from the ctitan-named weights) within 1e-4 relative; and
                      every tensor must equal llama3_tiny's weight under the HF name, with q/k rows
                      permuted the way transformers' convert_llama_weights_to_hf.py does it.
                      The C test (tests/unit/test_hf.c) re-exports llama3_tiny with hf_save and
                      requires the same bytes.
  from_transformers/  WRITTEN here: a tiny LlamaForCausalLM (fixed seed) saved by save_pretrained
                      (safetensors, float32); from_transformers_bf16/ is the same model in bfloat16,
                      saved in 20 KB shards with model.safetensors.index.json; from_transformers.ctt
                      holds its config, a token batch and the logits (transformers in float64 on the
                      float32 weights; also its float32 logits, for reference). The C test loads the
                      folder with hf_load, runs ctitan's llama3 and compares logits within 1e-4.
  llama31_from_transformers/  WRITTEN here: a tiny Llama 3.1-style LlamaForCausalLM (RoPE scaling of
                      rope_type llama3, chosen so that its frequencies fall in all three bands) saved by
                      save_pretrained, and llama31_from_transformers.ctt with its config, a token batch,
                      transformers' RoPE table (expected.inv_freq) and logits (float64 on the float32
                      weights, and float32). tests/unit/test_hf.c matches the logits within 1e-5.

Run from the repository root, after building ctitan (pip install transformers safetensors):

    build/ctitan convert --to hf --input tests/golden/llama3_tiny.ctt --output tests/golden/hf/from_ctitan
    python3 tests/golden/gen_hf_golden.py            # verify from_ctitan/, (re)write from_transformers*
    python3 tests/golden/gen_hf_golden.py --check    # verify, and compare a regeneration with the committed files

The results are written to tests/golden/hf/README.md.
"""
import argparse
import filecmp
import math
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_llama3_golden import ctt_read, ctt_write  # noqa: E402  (the ctt format, shared)

HF_DIR = os.path.join(HERE, "hf")
LLAMA3_TINY = os.path.join(HERE, "llama3_tiny.ctt")

# The model written by transformers: different sizes and RoPE base from llama3_tiny, so a C side
# that ignored config.json would fail.
TINY = dict(hidden_size=32, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, rms_norm_eps=1e-6, rope_theta=25000.0, max_position_embeddings=64)
SEED = 20240917
BATCH, SEQ = 2, 16
TOL = 1e-4

# The Llama 3.1-style model: head_dim 16 (8 RoPE pairs). With rope_theta 81 the pairs' wavelengths
# 2 pi 81^(i/8) are 6.3, 10.9, 18.8, 32.6, 56.5, 97.9, 169.6, 293.8; original_max_position_embeddings
# 32 with high_freq_factor 4 and low_freq_factor 1 puts the band edges at 8 and 32, so pair 0 is kept,
# pairs 1-2 are blended and pairs 3-7 divided by factor 8: every band is used at SEQ positions.
# vocab 512: what `ctitan tokenizer train --vocab-size 512` covers, so tests can fine-tune it.
LLAMA31 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
               vocab_size=512, rms_norm_eps=1e-5, max_position_embeddings=256)
LLAMA31_ROPE = dict(rope_type="llama3", rope_theta=81.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=32)
LLAMA31_SEED = 20250723


def rel_err(got, want):
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def hf_permute(w, n_heads, dim1, dim2):
    """transformers/models/llama/convert_llama_weights_to_hf.py: interleaved RoPE rows -> rotate_half rows."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def ctitan_to_hf_names(n_layers):
    """(ctitan name, HF name, permute heads key or None)."""
    out = [("tok_embeddings.weight", "model.embed_tokens.weight", None)]
    for i in range(n_layers):
        c, h = f"layers.{i}.", f"model.layers.{i}."
        out += [(c + "attention_norm.weight", h + "input_layernorm.weight", None),
                (c + "attention.wq.weight", h + "self_attn.q_proj.weight", "n_heads"),
                (c + "attention.wk.weight", h + "self_attn.k_proj.weight", "n_kv_heads"),
                (c + "attention.wv.weight", h + "self_attn.v_proj.weight", None),
                (c + "attention.wo.weight", h + "self_attn.o_proj.weight", None),
                (c + "ffn_norm.weight", h + "post_attention_layernorm.weight", None),
                (c + "feed_forward.w1.weight", h + "mlp.gate_proj.weight", None),
                (c + "feed_forward.w2.weight", h + "mlp.down_proj.weight", None),
                (c + "feed_forward.w3.weight", h + "mlp.up_proj.weight", None)]
    out += [("norm.weight", "model.norm.weight", None), ("output.weight", "lm_head.weight", None)]
    return out


def verify_from_ctitan():
    """ctitan's export, loaded by transformers, computes llama3_tiny's logits; its tensors are the right ones."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    folder = os.path.join(HF_DIR, "from_ctitan")
    g = ctt_read(LLAMA3_TINY)
    cfg = {k: int(g[f"config.{k}"]) for k in ("n_layers", "n_heads", "n_kv_heads", "dim")}
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    names = ctitan_to_hf_names(cfg["n_layers"])
    assert sorted(tensors) == sorted(h for _, h, _ in names), "tensor names differ"
    for c, h, heads in names:
        want = g[c]
        if heads:
            want = hf_permute(want, cfg[heads], want.shape[0], want.shape[1])
        assert tensors[h].dtype == torch.float32 and torch.equal(tensors[h], want), f"{h} != permuted {c}"

    model = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert model.dtype == torch.float32
    tokens = g["input.tokens"].long()
    want = g["expected.logits"]
    with torch.no_grad():
        l32 = model(tokens).logits
        l64 = model.double()(tokens).logits
    e32, e64 = rel_err(l32, want), rel_err(l64, want)
    assert e64 <= TOL and e32 <= TOL, f"transformers' logits differ from llama3_tiny's: {e64:.3g} (f64), {e32:.3g} (f32)"
    return dict(err64=e64, err32=e32, maxabs64=float((l64 - want.double()).abs().max()), n_tensors=len(tensors))


def make_model(tiny=TINY, seed=SEED, rope=None):
    """The tiny LlamaForCausalLM: every parameter drawn from one seeded generator, in name order.
    q and k are large enough that attention is peaked (so a RoPE layout mistake shows in the logits).
    rope: transformers 5's rope_parameters (RoPE scaling), or None for plain RoPE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    extra = {} if rope is None else dict(rope_parameters=dict(rope))
    config = LlamaConfig(**tiny, tie_word_embeddings=False, head_dim=tiny["hidden_size"] // tiny["num_attention_heads"],
                         attention_bias=False, mlp_bias=False, hidden_act="silu", **extra)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    d = tiny["hidden_size"]
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * z)
            elif "embed_tokens" in name:
                p.copy_(z)
            elif name == "lm_head.weight":
                p.copy_(z * d ** -0.5)
            elif "q_proj" in name or "k_proj" in name:
                p.copy_(z * 0.3)
            else:
                p.copy_(z * 0.1)
    tokens = torch.randint(0, tiny["vocab_size"], (BATCH, SEQ), generator=gen, dtype=torch.int64)
    return model, tokens


def write_from_transformers(out_dir):
    """Writes from_transformers/, from_transformers_bf16/ and from_transformers.ctt under out_dir."""
    import copy

    model, tokens = make_model()
    with torch.no_grad():
        l32 = model(tokens).logits
        l64 = copy.deepcopy(model).double()(tokens).logits
    f32_dir, bf16_dir = os.path.join(out_dir, "from_transformers"), os.path.join(out_dir, "from_transformers_bf16")
    for d in (f32_dir, bf16_dir):
        shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(f32_dir, safe_serialization=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True, max_shard_size="20KB")
    assert os.path.exists(os.path.join(bf16_dir, "model.safetensors.index.json")), "bf16 model was not sharded"
    for d in (f32_dir, bf16_dir):
        for f in os.listdir(d):
            os.chmod(os.path.join(d, f), 0o644)

    c = TINY
    items = [(f"config.{k}", torch.tensor(c[k], dtype=torch.int32))
             for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "vocab_size")]
    items += [("config.rope_theta", torch.tensor(c["rope_theta"])), ("config.rms_norm_eps", torch.tensor(c["rms_norm_eps"]))]
    items += [("input.tokens", tokens.to(torch.int32)),
              ("expected.logits", l64),                # transformers in float64 on the float32 weights
              ("expected.logits_hf_f32", l32)]         # transformers in float32, for reference
    ctt_write(os.path.join(out_dir, "from_transformers.ctt"), items)
    return dict(err_hf_f32=rel_err(l32, l64))


def llama31_bands():
    """Which RoPE pairs of the Llama 3.1-style model each band holds (as _compute_llama3_parameters sorts them)."""
    r = LLAMA31_ROPE
    hd = LLAMA31["hidden_size"] // LLAMA31["num_attention_heads"]
    bands = {"kept": [], "blended": [], "divided": []}
    for i in range(hd // 2):
        wavelen = 2 * math.pi * r["rope_theta"] ** (2 * i / hd)
        lo, hi = r["original_max_position_embeddings"] / r["low_freq_factor"], r["original_max_position_embeddings"] / r["high_freq_factor"]
        bands["kept" if wavelen < hi else "divided" if wavelen > lo else "blended"].append(f"{i} ({wavelen:.1f})")
    return bands


def write_llama31(out_dir):
    """Writes llama31_from_transformers/ and llama31_from_transformers.ctt under out_dir."""
    import copy

    model, tokens = make_model(LLAMA31, LLAMA31_SEED, LLAMA31_ROPE)
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "llama3", rotary.rope_type
    inv_freq = rotary.inv_freq.detach().clone().to(torch.float32)
    hd = LLAMA31["hidden_size"] // LLAMA31["num_attention_heads"]
    plain = 1.0 / (LLAMA31_ROPE["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    changed = int((inv_freq != plain).sum())
    assert changed >= hd // 2 - 1, f"the scaling changes only {changed} of {hd // 2} frequencies"
    with torch.no_grad():
        l32 = model(tokens).logits
        l64 = copy.deepcopy(model).double()(tokens).logits
    folder = os.path.join(out_dir, "llama31_from_transformers")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    for f in os.listdir(folder):
        os.chmod(os.path.join(folder, f), 0o644)
    c, r = LLAMA31, LLAMA31_ROPE
    items = [(f"config.{k}", torch.tensor(c[k], dtype=torch.int32))
             for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "vocab_size")]
    items += [("config.rope_theta", torch.tensor(r["rope_theta"])), ("config.rms_norm_eps", torch.tensor(c["rms_norm_eps"])),
              ("config.rope_scaling_factor", torch.tensor(r["factor"])),
              ("config.rope_low_freq_factor", torch.tensor(r["low_freq_factor"])),
              ("config.rope_high_freq_factor", torch.tensor(r["high_freq_factor"])),
              ("config.rope_original_max_position", torch.tensor(r["original_max_position_embeddings"], dtype=torch.int32))]
    items += [("input.tokens", tokens.to(torch.int32)),
              ("expected.inv_freq", inv_freq),         # transformers' RoPE table (llama3 scaling)
              ("expected.logits", l64),                # transformers in float64 on the float32 weights
              ("expected.logits_hf_f32", l32)]         # transformers in float32, for reference
    ctt_write(os.path.join(out_dir, "llama31_from_transformers.ctt"), items)
    return dict(err31_hf_f32=rel_err(l32, l64), changed=changed)


def same_tree(a, b):
    """Files of folder/file a equal those of b, byte for byte (config.json's transformers_version aside)."""
    if os.path.isfile(a):
        return filecmp.cmp(a, b, shallow=False)
    if sorted(os.listdir(a)) != sorted(os.listdir(b)):
        return False
    for f in os.listdir(a):
        if f in ("config.json", "generation_config.json"):
            strip = lambda p: [l for l in open(p) if "transformers_version" not in l]  # noqa: E731
            if strip(os.path.join(a, f)) != strip(os.path.join(b, f)):
                return False
        elif not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False):
            return False
    return True


README = """# Hugging Face interop goldens

Made and checked by `tests/golden/gen_hf_golden.py` (transformers {tv}, torch {torchv}); see
tests/golden/README.md for how to regenerate. This file is written by the script.

## from_ctitan/ (written by ctitan, verified by transformers)

`ctitan convert --to hf --input tests/golden/llama3_tiny.ctt --output tests/golden/hf/from_ctitan`.
transformers' `LlamaForCausalLM.from_pretrained` loads it; its logits on llama3_tiny's batch against
llama3_tiny.ctt's `expected.logits`:

| transformers run | relative L2 error | max abs diff |
|---|---|---|
| float64 | {err64:.2e} | {maxabs64:.2e} |
| float32 | {err32:.2e} | |

All {n_tensors} tensors equal llama3_tiny's weights under the HF names, bit for bit, with q/k rows
permuted as transformers' `convert_llama_weights_to_hf.py` does. Tolerance: {tol:g}.

## from_transformers/, from_transformers_bf16/, from_transformers.ctt (written by transformers)

A LlamaForCausalLM with {cfg}, weights from a seeded generator, saved by `save_pretrained` in float32
(one file) and in bfloat16 (20 KB shards with `model.safetensors.index.json`). from_transformers.ctt
holds `config.*`, `input.tokens` ({b} x {t}), `expected.logits` (transformers in float64 on the float32
weights) and `expected.logits_hf_f32` (transformers in float32; relative error {err_hf_f32:.2e} to
float64). tests/unit/test_hf.c loads the folders through the llama3 pack (as `ctitan convert` does) and runs ctitan's llama3 on them.

## llama31_from_transformers/, llama31_from_transformers.ctt (Llama 3.1 RoPE scaling)

A LlamaForCausalLM with {cfg31} and `rope_parameters` {rope31} (transformers 5 writes
`rope_parameters`; Meta's Llama 3.1 files say `rope_scaling`, which ctitan reads too). The scaling
changes {changed} of the {pairs} RoPE frequencies. Pairs by band (wavelength in positions; the edges are
original_max_position_embeddings / high_freq_factor and / low_freq_factor):

| band | pairs |
|---|---|
| kept (wavelength below the high edge) | {kept} |
| blended (between the edges) | {blended} |
| divided by factor | {divided} |

llama31_from_transformers.ctt holds `config.*` (with `config.rope_scaling_factor`,
`config.rope_low_freq_factor`, `config.rope_high_freq_factor`, `config.rope_original_max_position`),
`input.tokens` ({b} x {t}), `expected.inv_freq` (transformers' table), `expected.logits` (float64 on
the float32 weights) and `expected.logits_hf_f32` (relative error {err31_hf_f32:.2e} to float64).
tests/unit/test_hf.c runs ctitan's llama3 with `rope_scaling: llama3` on the folder and matches the
float64 logits within 1e-5 relative; tests/cli/hf_rope_scaling.sh fine-tunes it and exports it back.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare a regeneration with the committed files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import transformers

    v = verify_from_ctitan()
    print(f"from_ctitan: {v['n_tensors']} tensors equal llama3_tiny's (q/k permuted); transformers' logits vs "
          f"llama3_tiny expected.logits: {v['err64']:.2e} (float64), {v['err32']:.2e} (float32) relative")

    if args.check:
        tmp = tempfile.mkdtemp()
        try:
            w = write_from_transformers(tmp)
            write_llama31(tmp)
            bad = [n for n in ("from_transformers", "from_transformers_bf16", "from_transformers.ctt",
                               "llama31_from_transformers", "llama31_from_transformers.ctt")
                   if not same_tree(os.path.join(tmp, n), os.path.join(HF_DIR, n))]
        finally:
            shutil.rmtree(tmp)
        print("from_transformers: " + ("matches the committed files" if not bad else f"differs: {bad}"))
        return 1 if bad else 0

    w = write_from_transformers(HF_DIR)
    print(f"wrote {HF_DIR}/from_transformers*; transformers float32 vs float64 logits: {w['err_hf_f32']:.2e}")
    w31 = write_llama31(HF_DIR)
    print(f"wrote {HF_DIR}/llama31_from_transformers*: {w31['changed']} frequencies scaled; transformers float32 vs "
          f"float64 logits: {w31['err31_hf_f32']:.2e}")
    cfg = ", ".join(f"{k} {val}" for k, val in TINY.items())
    cfg31 = ", ".join(f"{k} {val}" for k, val in LLAMA31.items())
    rope31 = ", ".join(f"{k} {val}" for k, val in LLAMA31_ROPE.items())
    bands = {k: ", ".join(val) or "none" for k, val in llama31_bands().items()}
    pairs = LLAMA31["hidden_size"] // LLAMA31["num_attention_heads"] // 2
    with open(os.path.join(HF_DIR, "README.md"), "w") as f:
        f.write(README.format(tv=transformers.__version__, torchv=torch.__version__, tol=TOL, cfg=cfg, b=BATCH, t=SEQ,
                              cfg31=cfg31, rope31=rope31, pairs=pairs, **bands, **v, **w, **w31))
    return 0


if __name__ == "__main__":
    sys.exit(main())
