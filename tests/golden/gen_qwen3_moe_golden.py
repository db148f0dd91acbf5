#!/usr/bin/env python3
"""Golden values for ctitan's Qwen3 MoE flavors (models/qwen3, ct_builder.moe), from transformers'
Qwen3MoeForCausalLM in float64.

Writes tests/golden/qwen3_moe_tiny.ctt: a tiny random Qwen3-MoE's parameters under ctitan's names and
layout, one batch, transformers' logits, the loss, the load-balancing loss and every parameter's gradient.
The model: 2 blocks, 8 experts of hidden 16, top-2 by softmax with norm_topk_prob, no shared expert,
untied head, per-head QK-norm with random weights.

The loss is transformers' cross-entropy (mean over the tokens) plus router_aux_loss_coef times the mean over
the blocks of load_balancing_loss_func applied to each block's router logits alone (what ctitan computes;
transformers' own concatenates the blocks before taking the means, which differs with more than one block).

ctitan's layout: q and k projection rows and the QK-norm weights in RoPE's interleaved pair order (Hugging
Face keeps halves); the experts stacked: w1 = gate_up_proj's first half, w3 its second, w2 = down_proj.

Run from the repository root (pip install torch transformers safetensors):

    python3 tests/golden/gen_qwen3_moe_golden.py            # (re)write the file
    python3 tests/golden/gen_qwen3_moe_golden.py --check    # recompute and compare with the committed file
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_llama3_golden import ctt_read, ctt_write  # noqa: E402

OUT = os.path.join(HERE, "qwen3_moe_tiny.ctt")
HF_FOLDER = os.path.join(HERE, "hf", "qwen3_moe_from_transformers")  # the same model saved by transformers
ROOT = os.path.dirname(os.path.dirname(HERE))
OPTIONS = ["--model.name=qwen3", "--model.flavor=debugmodel_moe", "--model.dim=32", "--model.n_layers=2",
           "--model.n_heads=4", "--model.n_kv_heads=2", "--model.head_dim=16", "--model.vocab_size=512",
           "--model.n_experts=8", "--model.top_k=2", "--model.moe_hidden=16", "--model.rope_theta=50000",
           "--model.norm_eps=1e-6", "--model.tie_word_embeddings=false", "--model.router_aux_loss_coef=0.01"]
TINY = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512, rms_norm_eps=1e-6,
            rope_theta=50000.0, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
            router_aux_loss_coef=0.01, max_position_embeddings=64)
SEED = 20261208
BATCH, SEQ = 2, 16
MARGIN = 1e-4  # every token's k-th and (k+1)-th router probabilities differ by more (no near tie)


def make_model():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**TINY, tie_word_embeddings=False, hidden_act="silu", decoder_sparse_step=1,
                            mlp_only_layers=[], output_router_logits=True, experts_implementation="eager")
    torch.manual_seed(SEED)
    model = Qwen3MoeForCausalLM(config).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * z)
            elif "embed_tokens" in name:
                p.copy_(z)
            elif "q_proj" in name or "k_proj" in name or "mlp.gate" in name:
                p.copy_(z * 0.3)
            else:
                p.copy_(z * 0.1)
    tokens = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=gen, dtype=torch.int64)
    return model, tokens, targets


def block_aux(router_logits, e, k):
    """transformers' load_balancing_loss_func on one block's router logits (n, e)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    return load_balancing_loss_func((router_logits,), e, k)


def rope_rows(w, head_dim):
    """Hugging Face's half-split RoPE rows (or elements) -> ctitan's interleaved pairs, per head."""
    shape = w.shape
    w = w.reshape(shape[0] // head_dim, 2, head_dim // 2, -1).transpose(1, 2)
    return w.reshape(shape)


def ctitan_tensors(model, grads=False):
    """(ctitan name, tensor) for every parameter (its gradient when grads), in ctitan's layout."""
    hd, h = TINY["head_dim"], TINY["moe_intermediate_size"]
    out = []
    for name, p in model.named_parameters():
        t = p.grad if grads else p.data
        n = name.replace("model.", "", 1)
        if n == "embed_tokens.weight":
            out.append(("tok_embeddings.weight", t))
        elif name == "lm_head.weight":
            out.append(("output.weight", t))
        elif n == "norm.weight":
            out.append(("norm.weight", t))
        else:
            parts = n.split(".")  # layers.L.<module>...
            L, rest = parts[1], ".".join(parts[2:])
            pre = f"layers.{L}."
            table = {"input_layernorm.weight": "attention_norm.weight",
                     "post_attention_layernorm.weight": "ffn_norm.weight",
                     "self_attn.v_proj.weight": "attention.wv.weight",
                     "self_attn.o_proj.weight": "attention.wo.weight",
                     "mlp.gate.weight": "moe.router.gate.weight",
                     "mlp.experts.down_proj": "moe.experts.w2"}
            rope = {"self_attn.q_proj.weight": "attention.wq.weight", "self_attn.k_proj.weight": "attention.wk.weight",
                    "self_attn.q_norm.weight": "attention.q_norm.weight",
                    "self_attn.k_norm.weight": "attention.k_norm.weight"}
            if rest in table:
                out.append((pre + table[rest], t))
            elif rest in rope:
                out.append((pre + rope[rest], rope_rows(t, hd)))
            elif rest == "mlp.experts.gate_up_proj":
                out.append((pre + "moe.experts.w1", t[:, :h, :]))
                out.append((pre + "moe.experts.w3", t[:, h:, :]))
            else:
                raise KeyError(name)
    return [(n, t.detach().clone().contiguous()) for n, t in out]


def save_folder(model, folder):
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    for f in os.listdir(folder):
        os.chmod(os.path.join(folder, f), 0o644)


def verify_export(ctitan, logits64):
    """A one-step run at lr 0 loads the committed folder (checkpoint.initial_load_in_hf) and exports it
    (checkpoint.last_save_in_hf): its tensors must be transformers' bit for bit, and transformers must load
    the export and give the golden logits. Returns (relative error, tensors)."""
    import subprocess
    import tempfile

    from safetensors.torch import load_file
    from transformers import Qwen3MoeForCausalLM

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
                        f"--checkpoint.initial_load_path={HF_FOLDER}", "--checkpoint.last_save_in_hf=true"], **quiet)
        out = os.path.join(tmp, "run", "checkpoint", "step-1-hf")
        tensors = load_file(os.path.join(out, "model.safetensors"))
        theirs = load_file(os.path.join(HF_FOLDER, "model.safetensors"))
        assert sorted(tensors) == sorted(theirs), sorted(set(tensors) ^ set(theirs))
        for k in tensors:
            assert torch.equal(tensors[k], theirs[k]), f"{k} changed in the round trip"
        model = Qwen3MoeForCausalLM.from_pretrained(out, attn_implementation="eager",
                                                    experts_implementation="eager").eval()
        with torch.no_grad():
            logits = model.double()(ctt_read(OUT)["input.tokens"].long()).logits
    e = float((logits - logits64).norm() / logits64.norm())
    return e, len(tensors)


def compute(folder=None):
    model, tokens, targets = make_model()
    if folder:
        save_folder(model, folder)
    params = ctitan_tensors(model)  # the float32 weights
    m64 = model.double()
    out = m64(tokens, output_router_logits=True)
    logits = out.logits
    e, k = TINY["num_experts"], TINY["num_experts_per_tok"]
    for rl in out.router_logits:  # no near tie in any token's choice
        top = torch.softmax(rl, -1).topk(k + 1, -1).values
        gap = float((top[:, k - 1] - top[:, k]).min())
        assert gap > MARGIN, f"a router near tie ({gap:.2e}): pick another seed"
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    aux = sum(block_aux(rl, e, k) for rl in out.router_logits) / len(out.router_logits)
    loss = ce + TINY["router_aux_loss_coef"] * aux
    loss.backward()
    items = params + [("input.tokens", tokens.to(torch.int32)), ("input.targets", targets.to(torch.int32)),
                      ("expected.logits", logits.detach()), ("expected.loss", ce.detach().reshape(1)),
                      ("expected.aux_loss", (TINY["router_aux_loss_coef"] * aux).detach().reshape(1))]
    items += [("grad." + n, g) for n, g in ctitan_tensors(m64, grads=True)]
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="recompute and compare with the committed file")
    ap.add_argument("--ctitan", default=os.environ.get("CTITAN", os.path.join(ROOT, "build", "ctitan")))
    a = ap.parse_args()
    torch.set_num_threads(1)
    items = compute(None if a.check else HF_FOLDER)
    if a.check:
        old = ctt_read(OUT)
        new = {n: t for n, t in items}
        bad = [n for n in new if n not in old or not torch.equal(old[n].double(), new[n].double().float().double()
                                                                  if new[n].is_floating_point() else new[n].double())]
        if bad or len(old) != len(new):
            print(f"FAIL: {OUT} differs from a regeneration ({bad[:3]})")
            return 1
        e, n = verify_export(a.ctitan, old["expected.logits"].double())
        assert e <= 1e-6, f"transformers on ctitan's export: relative error {e:.3g}"
        print(f"ok: {OUT} equals a regeneration ({len(new)} tensors); ctitan's Hugging Face round trip keeps all "
              f"{n} tensors bit for bit and transformers on ctitan's export gives the logits within {e:.2e}")
        return 0
    ctt_write(OUT, items)
    print(f"wrote {OUT}: {len(items)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
