#!/usr/bin/env python3
"""The fine-tuning path's inputs (tests/cli/sft_e2e.sh, configs/sft_llama3_debug.yaml).

Writes:
  tests/golden/hf/sft_llama3/      a tiny random LlamaForCausalLM (hidden 32, 2 layers, 4 heads, 2 KV
                                   heads, vocab 2048, fixed seed) saved by transformers' save_pretrained
                                   in float32, with tests/data/tokenizer/hf/llama3's tokenizer.json and a
                                   tokenizer_config.json holding Meta's Llama 3 chat template
                                   (tests/golden/chat/llama3's): a Hub-shaped folder to fine-tune
  tests/data/jsonl/sft_train.jsonl 48 conversations made here (arithmetic questions and capitals, some
                                   with a system prompt, some with two turns)
  tests/data/jsonl/sft_heldout.jsonl 8 more, for validation

Run with a Python that has torch and transformers 5.x: python3 tests/golden/gen_sft_golden.py
"""
import json
import os
import random
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "hf", "sft_llama3")
DATA = os.path.join(ROOT, "tests", "data", "jsonl")

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Egypt", "Cairo"), ("Peru", "Lima"),
            ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Chile", "Santiago"), ("Greece", "Athens")]


def conversation(rng, i):
    kind = i % 4
    if kind == 0:
        a, b = rng.randrange(2, 20), rng.randrange(2, 20)
        return {"messages": [{"role": "user", "content": "What is %d plus %d?" % (a, b)},
                             {"role": "assistant", "content": "%d plus %d is %d." % (a, b, a + b)}]}
    if kind == 1:
        c, cap = CAPITALS[rng.randrange(len(CAPITALS))]
        return {"messages": [{"role": "system", "content": "Answer in one short sentence."},
                             {"role": "user", "content": "What is the capital of %s?" % c},
                             {"role": "assistant", "content": "The capital of %s is %s." % (c, cap)}]}
    if kind == 2:
        c, cap = CAPITALS[rng.randrange(len(CAPITALS))]
        return {"prompt": "Name the capital of %s." % c, "completion": "%s." % cap}
    a, b = rng.randrange(2, 10), rng.randrange(2, 10)
    return {"messages": [{"role": "user", "content": "What is %d times %d?" % (a, b)},
                         {"role": "assistant", "content": "%d." % (a * b)},
                         {"role": "user", "content": "And plus one?"},
                         {"role": "assistant", "content": "%d." % (a * b + 1)}]}


def main():
    rng = random.Random(30)
    os.makedirs(DATA, exist_ok=True)
    for name, n in (("sft_train.jsonl", 48), ("sft_heldout.jsonl", 8)):
        with open(os.path.join(DATA, name), "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps(conversation(rng, i), ensure_ascii=False) + "\n")
    torch.manual_seed(30)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=2048, rms_norm_eps=1e-5, max_position_embeddings=256,
                      rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=1500, eos_token_id=1501)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # larger than the default init, so an untrained sample is not one repeated token
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    model.save_pretrained(OUT)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(OUT, extra)):
            os.remove(os.path.join(OUT, extra))
    shutil.copy(os.path.join(ROOT, "tests/data/tokenizer/hf/llama3/tokenizer.json"), OUT)
    template = json.load(open(os.path.join(HERE, "chat/llama3/tokenizer_config.json")))["chat_template"]
    with open(os.path.join(OUT, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "chat_template": template,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
        f.write("\n")
    print("wrote", OUT, "and", DATA + "/sft_{train,heldout}.jsonl")


if __name__ == "__main__":
    sys.exit(main())
