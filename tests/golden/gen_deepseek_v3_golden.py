#!/usr/bin/env python3
"""Golden values for ctitan's DeepSeek-V3 pack (models/deepseek_v3), from transformers' DeepseekV3ForCausalLM
in float64.

Writes tests/golden/deepseek_v3_tiny.ctt (and deepseek_v3_yarn_tiny.ctt and deepseek_v3_hf_yarn_tiny.ctt, below): a tiny
random DeepSeek-V3's parameters under ctitan's names and layout, one batch, transformers' logits, the loss and every parameter's gradient. The model: 3 blocks, the
first dense; multi-head latent attention with q_lora_rank 24, kv_lora_rank 16, qk_nope 8, qk_rope 4 and
v_head_dim 6 (so v is narrower than q and k, as in DeepSeek-V3); 8 routed experts of hidden 16 in 4 groups,
top-2 over the 2 best groups by sigmoid with norm_topk_prob and routed_scaling_factor 2.5, one shared expert.
The expert bias (e_score_correction_bias, ctitan's layers.N.moe.expert_bias buffer) is random, so the choice
differs from the scores' own.

transformers' router computes in float32 whatever the model's dtype; the generator runs it in float64 (the
same arithmetic) so the golden values carry no float32 rounding. RoPE: DeepSeek's checkpoints keep the rope
columns in interleaved pairs (rope_interleave), ctitan's own order: no row is permuted.

Run from the repository root (pip install torch transformers safetensors):

    python3 tests/golden/gen_deepseek_v3_golden.py            # (re)write the file
    python3 tests/golden/gen_deepseek_v3_golden.py --check    # recompute and compare with the committed file
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_llama3_golden import ctt_read, ctt_write  # noqa: E402

OUT = os.path.join(HERE, "deepseek_v3_tiny.ctt")
OUT_YARN = os.path.join(HERE, "deepseek_v3_yarn_tiny.ctt")
OUT_HF_YARN = os.path.join(HERE, "deepseek_v3_hf_yarn_tiny.ctt")
HF_FOLDER = os.path.join(HERE, "hf", "deepseek_v3_from_transformers")  # the same model saved by transformers
HF_YARN_FOLDER = os.path.join(HERE, "hf", "deepseek_v3_yarn_from_transformers")
ROOT = os.path.dirname(os.path.dirname(HERE))
OPTIONS = ["--model.name=deepseek_v3", "--model.flavor=671B", "--model.dim=32", "--model.n_layers=3",
           "--model.n_dense_layers=1", "--model.n_heads=4", "--model.vocab_size=512", "--model.inter_dim=64",
           "--model.moe_inter_dim=16", "--model.n_experts=8", "--model.n_shared_experts=1", "--model.top_k=2",
           "--model.n_expert_groups=4", "--model.n_limited_groups=2", "--model.q_lora_rank=24",
           "--model.kv_lora_rank=16", "--model.qk_nope_head_dim=8", "--model.qk_rope_head_dim=4",
           "--model.v_head_dim=6", "--model.norm_eps=1e-6"]
TINY = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
            first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, vocab_size=512,
            rms_norm_eps=1e-6, rope_theta=10000.0, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
            n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=24,
            kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, max_position_embeddings=64)
# The second golden: q projected directly (q_lora_rank None) and YaRN RoPE (factor 40 over an original context of
# 8 positions, mscale = mscale_all_dim = 1, so the softmax scale is multiplied by (0.1 ln 40 + 1)^2): ctitan turns
# YaRN on when training.seq_len (16) exceeds model.original_seq_len (8), as torchtitan does.
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=8, beta_fast=32.0,
            beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
# The third: the first model's sizes and weights with DeepSeek-V3's own rope_scaling (its config.json: YaRN of factor 40
# over 4096 positions, mscale = mscale_all_dim = 1, max_position_embeddings 163840), saved by transformers with its
# logits only (deepseek_v3_hf_yarn_tiny.ctt): transformers runs YaRN at every length, so the folder loads into
# ctitan as model.rope_scaling yarn (tests/unit/test_deepseek_v3_golden.c).
DEEPSEEK_YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                     beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
YARN_OPTIONS = ["--model.rope_scaling=yarn", "--model.rope_factor=40", "--model.original_seq_len=4096",
                "--model.mscale=1", "--model.max_position_embeddings=163840"]
SEED = 20261207
BATCH, SEQ = 2, 16
MARGIN = 1e-4  # every token's chosen groups and experts beat the next by more (no near tie)


def router_forward_f64(self, hidden_states):
    """DeepseekV3TopkRouter.forward without its float32 casts (the same arithmetic in the model's dtype)."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    scores = router_logits.sigmoid()
    scores_for_choice = scores + self.e_score_correction_bias.to(scores.dtype)
    group_scores = scores_for_choice.view(-1, self.num_group, self.num_experts // self.num_group).topk(2, -1)[0].sum(-1)
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, self.num_group, self.num_experts // self.num_group)
    score_mask = score_mask.reshape(-1, self.num_experts)
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
    self.last_margins = margins(group_scores, scores_for_choice, self.topk_group, self.top_k)
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices


def margins(group_scores, eligible, kg, k):
    """The smallest gap between a chosen group (expert) and the best one left out, over the tokens."""
    g = group_scores.detach().sort(-1, descending=True).values
    e = eligible.detach().sort(-1, descending=True).values
    return float((g[:, kg - 1] - g[:, kg]).min()), float((e[:, k - 1] - e[:, k]).min())


def make_model(yarn=False, hf_yarn=False):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mod

    mod.DeepseekV3TopkRouter.forward = router_forward_f64
    tiny = dict(TINY, q_lora_rank=None, rope_parameters=YARN) if yarn else TINY
    if hf_yarn:
        tiny = dict(TINY, max_position_embeddings=163840, rope_parameters=DEEPSEEK_YARN)
    config = DeepseekV3Config(**tiny, tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
                              rope_interleave=True, experts_implementation="eager")
    torch.manual_seed(SEED)
    model = DeepseekV3ForCausalLM(config).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.3 * z)
            elif "embed_tokens" in name:
                p.copy_(z)
            elif "mlp.gate.weight" in name or "q_b_proj" in name or "kv_b_proj" in name:
                p.copy_(z * 0.3)
            else:
                p.copy_(z * 0.1)
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen, dtype=torch.float32))
    tokens = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=gen, dtype=torch.int64)
    return model, tokens, targets


ATTN = {"q_proj.weight": "attention.wq.weight", "q_a_proj.weight": "attention.wq_a.weight",
        "q_a_layernorm.weight": "attention.q_norm.weight", "q_b_proj.weight": "attention.wq_b.weight",
        "kv_a_proj_with_mqa.weight": "attention.wkv_a.weight", "kv_a_layernorm.weight": "attention.kv_norm.weight",
        "kv_b_proj.weight": "attention.wkv_b.weight", "o_proj.weight": "attention.wo.weight"}
MLP = {"gate_proj.weight": "w1.weight", "up_proj.weight": "w3.weight", "down_proj.weight": "w2.weight"}


def ctitan_tensors(model, grads=False):
    """(ctitan name, tensor) for every parameter (its gradient when grads), in ctitan's layout."""
    h = TINY["moe_intermediate_size"]
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
            pre, rest = f"layers.{parts[1]}.", ".".join(parts[2:])
            if rest == "input_layernorm.weight":
                out.append((pre + "attention_norm.weight", t))
            elif rest == "post_attention_layernorm.weight":
                out.append((pre + "ffn_norm.weight", t))
            elif rest.startswith("self_attn."):
                out.append((pre + ATTN[rest[len("self_attn."):]], t))
            elif rest == "mlp.gate.weight":
                out.append((pre + "moe.router.gate.weight", t))
            elif rest == "mlp.experts.gate_up_proj":
                out.append((pre + "moe.experts.w1", t[:, :h, :]))
                out.append((pre + "moe.experts.w3", t[:, h:, :]))
            elif rest == "mlp.experts.down_proj":
                out.append((pre + "moe.experts.w2", t))
            elif rest.startswith("mlp.shared_experts."):
                out.append((pre + "moe.shared_experts." + MLP[rest[len("mlp.shared_experts."):]], t))
            elif rest.startswith("mlp."):
                out.append((pre + "feed_forward." + MLP[rest[len("mlp."):]], t))
            else:
                raise KeyError(name)
    if not grads:  # the expert biases: buffers, float32 as transformers keeps them
        for name, b in model.named_buffers():
            if name.endswith("mlp.gate.e_score_correction_bias"):
                out.append((f"layers.{name.split('.')[2]}.moe.expert_bias", b.float()))
    return [(n, t.detach().clone().contiguous()) for n, t in out]


def save_folder(model, folder):
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    for f in os.listdir(folder):
        os.chmod(os.path.join(folder, f), 0o644)


def verify_export(ctitan, logits64, folder=HF_FOLDER, extra=(), golden=OUT):
    """A one-step run at lr 0 (and no bias update) loads the committed folder (checkpoint.initial_load_in_hf)
    and exports it (checkpoint.last_save_in_hf): its tensors must be transformers' bit for bit, its config.json's
    RoPE scaling transformers' own, and transformers must load the export and give the golden logits. Returns
    (relative error, tensors)."""
    import json

    import subprocess
    import tempfile

    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM

    corpus = os.path.join(ROOT, "tests", "data", "tokenizer", "corpus.txt")
    with tempfile.TemporaryDirectory() as tmp:
        tok, data = os.path.join(tmp, "tok.model"), os.path.join(tmp, "data.bin")
        quiet = dict(check=True, stdout=subprocess.DEVNULL)
        subprocess.run([ctitan, "tokenizer", "train", "--input", corpus, "--vocab-size", "512", "--output", tok],
                       **quiet)
        subprocess.run([ctitan, "tokenize", "--tokenizer", tok, "--input", corpus, "--output", data], **quiet)
        subprocess.run([ctitan, "train", os.path.join(ROOT, "configs", "llama3_debug.yaml"), *OPTIONS, *extra,
                        f"--training.dataset_path={data}", "--training.seq_len=16", "--training.local_batch_size=2",
                        "--training.steps=1", "--optimizer.lr=0", "--lr_scheduler.warmup_steps=0",
                        "--model.load_balance_coeff=0", "--generate.max_new_tokens=0", "--device.threads=1",
                        f"--job.dump_folder={tmp}/run", "--checkpoint.enable=true",
                        "--checkpoint.initial_load_in_hf=true", f"--checkpoint.initial_load_path={folder}",
                        "--checkpoint.last_save_in_hf=true"], **quiet)
        out = os.path.join(tmp, "run", "checkpoint", "step-1-hf")
        tensors = load_file(os.path.join(out, "model.safetensors"))
        theirs = load_file(os.path.join(folder, "model.safetensors"))
        with open(os.path.join(out, "config.json")) as f_ours, open(os.path.join(folder, "config.json")) as f_theirs:
            ours, orig = json.load(f_ours), json.load(f_theirs)
        want = orig["rope_parameters"] if orig["rope_parameters"]["rope_type"] != "default" else None
        got = ours["rope_scaling"]
        if want is not None:
            want = {k: v for k, v in want.items() if k != "rope_theta"}
        assert got == want, f"exported rope_scaling {got}, transformers wrote {want}"
        assert sorted(tensors) == sorted(theirs), sorted(set(tensors) ^ set(theirs))
        for k in tensors:
            assert torch.equal(tensors[k], theirs[k]), f"{k} changed in the round trip"
        model = DeepseekV3ForCausalLM.from_pretrained(out, attn_implementation="eager",
                                                      experts_implementation="eager").eval()
        with torch.no_grad():
            logits = model.double()(ctt_read(golden)["input.tokens"].long()).logits
    e = float((logits - logits64).norm() / logits64.norm())
    return e, len(tensors)


def compute(folder=None, yarn=False, hf_yarn=False):
    model, tokens, targets = make_model(yarn, hf_yarn)
    if folder:
        save_folder(model, folder)
    params = ctitan_tensors(model)  # the float32 weights
    m64 = model.double()
    logits = m64(tokens).logits
    for layer in m64.model.layers[TINY["first_k_dense_replace"]:]:
        g, e = layer.mlp.gate.last_margins
        assert min(g, e) > MARGIN, f"a router near tie (groups {g:.2e}, experts {e:.2e}): pick another seed"
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    if hf_yarn:  # the weights are the folder's (and the first golden's): the logits and loss only
        return [("input.tokens", tokens.to(torch.int32)), ("input.targets", targets.to(torch.int32)),
                ("expected.logits", logits.detach()), ("expected.loss", loss.detach().reshape(1))]
    loss.backward()
    items = params + [("input.tokens", tokens.to(torch.int32)), ("input.targets", targets.to(torch.int32)),
                      ("expected.logits", logits.detach()), ("expected.loss", loss.detach().reshape(1))]
    items += [("grad." + n, g) for n, g in ctitan_tensors(m64, grads=True)]
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="recompute and compare with the committed file")
    ap.add_argument("--ctitan", default=os.environ.get("CTITAN", os.path.join(ROOT, "build", "ctitan")))
    a = ap.parse_args()
    torch.set_num_threads(1)
    items = compute(None if a.check else HF_FOLDER)
    yarn_items = compute(None, yarn=True)
    hf_yarn_items = compute(None if a.check else HF_YARN_FOLDER, hf_yarn=True)
    if a.check:
        for path, its in ((OUT, items), (OUT_YARN, yarn_items), (OUT_HF_YARN, hf_yarn_items)):
            old = ctt_read(path)
            new = {n: t for n, t in its}
            bad = [n for n in new if n not in old or not torch.equal(old[n].double(), new[n].double().float().double()
                                                                      if new[n].is_floating_point() else new[n].double())]
            if bad or len(old) != len(new):
                print(f"FAIL: {path} differs from a regeneration ({bad[:3]})")
                return 1
        e, n = verify_export(a.ctitan, ctt_read(OUT)["expected.logits"].double())
        assert e <= 1e-6, f"transformers on ctitan's export: relative error {e:.3g}"
        ey, ny = verify_export(a.ctitan, ctt_read(OUT_HF_YARN)["expected.logits"].double(), HF_YARN_FOLDER,
                               YARN_OPTIONS, OUT_HF_YARN)
        assert ey <= 1e-6, f"transformers on ctitan's YaRN export: relative error {ey:.3g}"
        print(f"ok: {OUT}, {OUT_YARN} and {OUT_HF_YARN} equal a regeneration; ctitan's Hugging Face round trip keeps "
              f"all {n} tensors bit for bit and transformers on ctitan's export gives the logits within {e:.2e}; "
              f"with DeepSeek-V3's YaRN rope_scaling: all {ny} tensors, the rope_scaling transformers wrote, the "
              f"logits within {ey:.2e}")
        return 0
    ctt_write(OUT, items)
    ctt_write(OUT_YARN, yarn_items)
    ctt_write(OUT_HF_YARN, hf_yarn_items)
    print(f"wrote {OUT}: {len(items)} tensors, {OUT_YARN}: {len(yarn_items)} tensors, {OUT_HF_YARN}: "
          f"{len(hf_yarn_items)} tensors, and {HF_FOLDER} and {HF_YARN_FOLDER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
