#!/usr/bin/env python3
"""Golden files for ctitan's Qwen2 interop (core/io/hf_export.c, `ctitan convert`, sdk/examples/qwen2), from transformers.

Writes, under tests/golden/hf/:

  qwen2_from_transformers/     a tiny Qwen2ForCausalLM (fixed seed, q/k/v biases, tie_word_embeddings
                               true, float32) saved by save_pretrained: no lm_head.weight.
  qwen2_from_transformers.ctt  its config, a token batch and its logits (transformers in float64 on
                               the float32 weights; also its float32 logits, for reference).

The C test (tests/unit/test_qwen2_hf.c) loads the folder as `ctitan convert --from hf` does, runs
the qwen2 pack's forward and compares logits within 1e-4. --check also verifies ctitan's side the
other way: it converts the folder to a ctitan model file and back (`ctitan convert --from hf`, then
`--to hf`), and transformers must load ctitan's export (Qwen2ForCausalLM, tied, no lm_head.weight)
and compute the same logits within 1e-4.

Run from the repository root, after building ctitan (pip install torch transformers safetensors):

    python3 tests/golden/gen_qwen2_golden.py            # (re)write the files
    python3 tests/golden/gen_qwen2_golden.py --check    # regenerate in a temporary folder, compare
                                                        # with the committed files, verify the export
"""
import argparse
import copy
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from gen_llama3_golden import ctt_read, ctt_write  # noqa: E402  (the ctt format, shared)

HF_DIR = os.path.join(HERE, "hf")
NAME = "qwen2_from_transformers"
# Small enough to commit (about 80 KB of float32); a RoPE base other than the pack's default, so a
# C side that ignored config.json would fail.
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=96, rms_norm_eps=1e-6, rope_theta=50000.0, max_position_embeddings=64)
SEED = 20261202
BATCH, SEQ = 2, 16
TOL = 1e-4


def rel_err(got, want):
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def make_model():
    """Every parameter drawn from one seeded generator, in name order; biases too (transformers
    starts them at zero, which would hide a bias mapped to the wrong rows)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**TINY, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False)
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * z)
            elif "embed_tokens" in name:
                p.copy_(z)
            elif "q_proj" in name or "k_proj" in name:
                p.copy_(z * 0.3)
            else:
                p.copy_(z * 0.1)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "the head is not tied"
    tokens = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=gen, dtype=torch.int64)
    return model, tokens


def write(out_dir):
    model, tokens = make_model()
    with torch.no_grad():
        l32 = model(tokens).logits
        l64 = copy.deepcopy(model).double()(tokens).logits
    folder = os.path.join(out_dir, NAME)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    for f in os.listdir(folder):
        os.chmod(os.path.join(folder, f), 0o644)
    items = [(f"config.{k}", torch.tensor(TINY[k], dtype=torch.int32))
             for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "vocab_size")]
    items += [("config.rope_theta", torch.tensor(TINY["rope_theta"])),
              ("config.rms_norm_eps", torch.tensor(TINY["rms_norm_eps"])),
              ("input.tokens", tokens.to(torch.int32)),
              ("expected.logits", l64),          # transformers in float64 on the float32 weights
              ("expected.logits_hf_f32", l32)]   # transformers in float32, for reference
    ctt_write(os.path.join(out_dir, NAME + ".ctt"), items)
    return rel_err(l32, l64)


def same_folder(a, b):
    """Equal files, config.json's transformers_version aside."""
    if sorted(os.listdir(a)) != sorted(os.listdir(b)):
        return False
    for f in os.listdir(a):
        if f.endswith(".json"):
            strip = lambda p: [l for l in open(p) if "transformers_version" not in l]  # noqa: E731
            if strip(os.path.join(a, f)) != strip(os.path.join(b, f)):
                return False
        elif not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False):
            return False
    return True


def verify_export(ctitan):
    """ctitan's import then export of the committed folder, loaded by transformers: same logits."""
    from safetensors.torch import load_file
    from transformers import Qwen2ForCausalLM

    g = ctt_read(os.path.join(HF_DIR, NAME + ".ctt"))
    with tempfile.TemporaryDirectory() as tmp:
        ctt, out = os.path.join(tmp, "model.ctt"), os.path.join(tmp, "export")
        for args in (["--from", "hf", "--input", os.path.join(HF_DIR, NAME), "--output", ctt],
                     ["--to", "hf", "--input", ctt, "--output", out, "--n-heads", str(TINY["num_attention_heads"]),
                      "--rope-theta", str(TINY["rope_theta"]), "--norm-eps", str(TINY["rms_norm_eps"])]):
            subprocess.run([ctitan, "convert", *args], check=True, stdout=subprocess.DEVNULL)
        config = json.load(open(os.path.join(out, "config.json")))
        assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"], config
        assert config["tie_word_embeddings"] is True, "the export is not tied"
        tensors = load_file(os.path.join(out, "model.safetensors"))
        assert "lm_head.weight" not in tensors, "a tied export holds lm_head.weight"
        assert "model.layers.0.self_attn.q_proj.bias" in tensors, "the export has no q bias"
        theirs = load_file(os.path.join(HF_DIR, NAME, "model.safetensors"))
        assert sorted(tensors) == sorted(theirs), "tensor names differ from transformers' own"
        for k in tensors:
            assert torch.equal(tensors[k], theirs[k]), f"{k} changed in the round trip"
        model = Qwen2ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = model.double()(g["input.tokens"].long()).logits
    e = rel_err(logits, g["expected.logits"])
    assert e <= TOL, f"transformers on ctitan's export: relative error {e:.3g} > {TOL}"
    return e, len(tensors)


def golden_main(doc, name, write, verify_export):
    """The generators' command line: write the files, or --check them (regenerate in a temporary folder,
    compare, then verify_export(ctitan) -> (relative error, tensors))."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate elsewhere, compare, verify ctitan's export")
    ap.add_argument("--ctitan", default=os.environ.get("CTITAN", os.path.join(ROOT, "build", "ctitan")))
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not a.check:
        e = write(HF_DIR)
        print(f"wrote {os.path.join(HF_DIR, name)}/ and {name}.ctt (transformers f32 vs f64 logits: {e:.2e})")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp)
        same = same_folder(os.path.join(tmp, name), os.path.join(HF_DIR, name))
        g_new, g_old = ctt_read(os.path.join(tmp, name + ".ctt")), ctt_read(os.path.join(HF_DIR, name + ".ctt"))
        same = same and sorted(g_new) == sorted(g_old) and all(torch.equal(g_new[k], g_old[k]) for k in g_new)
    if not same:
        print(f"FAIL: a regeneration differs from the committed {name}")
        return 1
    e, n = verify_export(a.ctitan)
    print(f"ok: regeneration equals the committed files; ctitan's round trip keeps all {n} tensors bit for bit "
          f"and transformers on ctitan's export gives the logits within {e:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(golden_main(__doc__, NAME, write, verify_export))
