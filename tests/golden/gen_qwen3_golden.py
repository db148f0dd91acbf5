#!/usr/bin/env python3
"""Golden files for ctitan's Qwen3 pack (models/qwen3) and its own Hugging Face mapping (ABI 2.12), from transformers.

Writes, under tests/golden/hf/:

  qwen3_from_transformers/     a tiny Qwen3ForCausalLM (fixed seed, per-head q/k RMSNorm with random
                               weights, head_dim 16 where hidden_size / heads is 8, tie_word_embeddings
                               true, float32) saved by save_pretrained: no lm_head.weight.
  qwen3_from_transformers.ctt  a token batch and its logits (transformers in float64 on the float32
                               weights; also its float32 logits, for reference).

The C test (tests/unit/test_qwen3_hf.c) loads the folder through the pack's table, as
checkpoint.initial_load_in_hf does, runs the pack's forward and compares the logits. --check also
verifies ctitan's side the other way: a one-step run at learning rate 0 loads the folder
(checkpoint.initial_load_in_hf) and exports it (checkpoint.last_save_in_hf); the export's tensors must
equal transformers' own bit for bit, and transformers must load ctitan's export and compute the same
logits.

Run from the repository root, after building ctitan (pip install torch transformers safetensors):

    python3 tests/golden/gen_qwen3_golden.py            # (re)write the files
    python3 tests/golden/gen_qwen3_golden.py --check    # regenerate in a temporary folder, compare
                                                        # with the committed files, verify the export
"""
import copy
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
from gen_qwen2_golden import golden_main, rel_err  # noqa: E402

HF_DIR = os.path.join(HERE, "hf")
NAME = "qwen3_from_transformers"
# head_dim 16 with hidden_size 32 and 4 heads (a pack that derived head_dim would build 8); vocabulary
# 512, the smallest ctitan's tokenizer trainer makes, so --check can train on real tokens.
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512, rms_norm_eps=1e-6, rope_theta=50000.0, max_position_embeddings=64)
SEED = 20261207
BATCH, SEQ = 2, 16
TOL = 1e-4
# ctitan's options for the same model
OPTIONS = ["--model.name=qwen3", "--model.flavor=debugmodel", "--model.dim=32", "--model.n_layers=2",
           "--model.n_heads=4", "--model.n_kv_heads=2", "--model.head_dim=16", "--model.vocab_size=512",
           "--model.ffn_hidden=64", "--model.rope_theta=50000", "--model.norm_eps=1e-6",
           "--model.tie_word_embeddings=true"]


def make_model():
    """Every parameter drawn from one seeded generator, in name order; the norms too (transformers
    starts them at one, which would hide a QK-norm weight in the wrong element order)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**TINY, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False)
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * z)
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
    ctt_write(os.path.join(out_dir, NAME + ".ctt"),
              [("input.tokens", tokens.to(torch.int32)),
               ("expected.logits", l64),          # transformers in float64 on the float32 weights
               ("expected.logits_hf_f32", l32)])  # transformers in float32, for reference
    return rel_err(l32, l64)


def verify_export(ctitan):
    """A one-step run at lr 0 from the committed folder; its export must be transformers' tensors bit
    for bit, and transformers must load it and give the committed logits."""
    from safetensors.torch import load_file
    from transformers import Qwen3ForCausalLM

    g = ctt_read(os.path.join(HF_DIR, NAME + ".ctt"))
    corpus = os.path.join(ROOT, "tests", "data", "tokenizer", "corpus.txt")
    with tempfile.TemporaryDirectory() as tmp:
        tok, data = os.path.join(tmp, "tok.model"), os.path.join(tmp, "data.bin")
        quiet = dict(check=True, stdout=subprocess.DEVNULL)
        subprocess.run([ctitan, "tokenizer", "train", "--input", corpus, "--vocab-size", "512", "--output", tok],
                       **quiet)
        subprocess.run([ctitan, "tokenize", "--tokenizer", tok, "--input", corpus, "--output", data], **quiet)
        subprocess.run([ctitan, "train", os.path.join(ROOT, "configs", "llama3_debug.yaml"), *OPTIONS,
                        f"--training.dataset_path={data}", "--training.seq_len=16", "--training.local_batch_size=2",
                        "--training.steps=1", "--optimizer.lr=0", "--lr_scheduler.warmup_steps=0",
                        "--generate.max_new_tokens=0", "--device.threads=1", f"--job.dump_folder={tmp}/run",
                        "--checkpoint.enable=true", "--checkpoint.initial_load_in_hf=true",
                        f"--checkpoint.initial_load_path={os.path.join(HF_DIR, NAME)}",
                        "--checkpoint.last_save_in_hf=true"], **quiet)
        out = os.path.join(tmp, "run", "checkpoint", "step-1-hf")
        config = json.load(open(os.path.join(out, "config.json")))
        assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"], config
        assert config["tie_word_embeddings"] is True and config["head_dim"] == 16, config
        tensors = load_file(os.path.join(out, "model.safetensors"))
        theirs = load_file(os.path.join(HF_DIR, NAME, "model.safetensors"))
        assert sorted(tensors) == sorted(theirs), "tensor names differ from transformers' own"
        for k in tensors:
            assert torch.equal(tensors[k], theirs[k]), f"{k} changed in the round trip"
        model = Qwen3ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = model.double()(g["input.tokens"].long()).logits
    e = rel_err(logits, g["expected.logits"])
    assert e <= TOL, f"transformers on ctitan's export: relative error {e:.3g} > {TOL}"
    return e, len(tensors)


if __name__ == "__main__":
    sys.exit(golden_main(__doc__, NAME, write, verify_export))
