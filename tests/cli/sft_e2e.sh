#!/usr/bin/env bash
# The fine-tuning path as a user runs it, with configs/sft_llama3_debug.yaml:
# - a Hugging Face Llama folder (tests/golden/hf/sft_llama3, a tiny random model saved by transformers,
#   with a Llama 3 tokenizer and chat template; tests/golden/gen_sft_golden.py) and the project's chat
#   conversations (tests/data/jsonl/sft_train.jsonl, sft_heldout.jsonl) tokenized with the folder's
#   template into a training and a held-out shard (version 4: loss masks, conversation starts);
# - `ctitan train` of the shipped manifest: the folder loaded (checkpoint.initial_load_in_hf), block_causal
#   documents from the shard's starts, validation at steps 1, 10 and 20 (the held-out loss must fall),
#   the result exported as a Hugging Face folder (checkpoint.last_save_in_hf);
# - transformers loads the export and its logits on a chat prompt's ids equal ctitan's own (the run's
#   model.ctt, `ctitan generate --logits-out`) within 1e-6 relative (L2);
# - `ctitan generate --chat` samples a reply from the result, ended by the template's <|eot_id|> or the
#   token budget.
# Needs a Python with torch and transformers: CT_PYTHON (default python3).
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
py=${CT_PYTHON:-python3}
"$py" -c "import torch, transformers" 2>/dev/null ||
  fail "$py cannot import torch and transformers: install them (\`$py -m pip install torch transformers\`) or set CT_PYTHON to a Python that has them"
H=tests/golden/hf/sft_llama3
for s in train:sft_train heldout:sft_heldout; do
  "$CTITAN" tokenize --format chat --tokenizer "$H" --seq-len 128 --input "tests/data/jsonl/${s#*:}.jsonl" \
    --output "$T/${s%%:*}.bin" >"$T/tok_${s%%:*}.log" 2>&1 || { cat "$T/tok_${s%%:*}.log"; fail "tokenize ${s%%:*}"; }
done
echo "ok   $(cut -c1-120 "$T/tok_train.log")..."
"$CTITAN" train configs/sft_llama3_debug.yaml --training.dataset="$T/train.bin" --validation.dataset="$T/heldout.bin" \
  --job.dump_folder="$T/run" --device.threads=1 >"$T/train.log" 2>&1 || { tail -20 "$T/train.log"; fail "train"; }
for want in "checkpoint: loaded the Hugging Face model $H" \
            "documents: block_causal takes them from the document starts the shards record" \
            "checkpoint: Hugging Face model written to $T/run/checkpoint/step-20-hf"; do
  grep -qF "$want" "$T/train.log" || { cat "$T/train.log"; fail "the run does not say: $want"; }
done
v1=$(sed -n 's/^validate: step 1  loss *\([0-9.]*\).*/\1/p' "$T/train.log")
v20=$(sed -n 's/^validate: step 20  loss *\([0-9.]*\).*/\1/p' "$T/train.log")
awk -v a="$v1" -v b="$v20" 'BEGIN { exit !(a > 0 && b > 0 && b < a) }' ||
  { grep validate "$T/train.log"; fail "the held-out loss did not fall: step 1 $v1, step 20 $v20"; }
echo "ok   trained from the HF folder: held-out loss $v1 at step 1, $v20 at step 20"

gen=("$CTITAN" generate configs/sft_llama3_debug.yaml --job.dump_folder="$T/run" --chat --generate.temperature=0
     --generate.max_new_tokens=24)
"${gen[@]}" --prompt "What is 3 plus 4?" --print-prompt-ids --logits-out "$T/logits.bin" >"$T/reply.txt" 2>"$T/gen.err" ||
  { cat "$T/gen.err"; fail "generate --chat"; }
ids=$(sed -n 's/^generate: chat prompt ids: [0-9]* tokens: //p' "$T/gen.err")
[ -n "$ids" ] || { cat "$T/gen.err"; fail "no prompt ids"; }
HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 \
  "$py" - "$T/run/checkpoint/step-20-hf" "$T/logits.bin" "$ids" <<'PY' || fail "transformers' logits differ from ctitan's"
import sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM
folder, path, ids = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split()]
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
with torch.no_grad():
    theirs = model(torch.tensor([ids])).logits[0].double().numpy()
ours = np.fromfile(path, dtype="<f4").astype(np.float64).reshape(len(ids), -1)
assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
rel = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
print("%s   transformers loads the export (%s): its logits on %d prompt ids vs ctitan's: relative L2 %.2e, "
      "max abs diff %.2e" % ("ok" if rel <= 1e-6 else "FAIL", type(model).__name__, len(ids), rel,
                             np.abs(ours - theirs).max()))
sys.exit(0 if rel <= 1e-6 else 1)
PY
grep -q "^generate: the reply: [0-9]* tokens, ended by \(<|eot_id|>\|generate.max_new_tokens\)$" "$T/gen.err" ||
  { cat "$T/gen.err"; fail "generate --chat: no reply line"; }
echo "ok   ctitan generate --chat: '$(head -c 80 "$T/reply.txt" | tr -d '\n')' ($(sed -n 's/^generate: the reply: //p' "$T/gen.err"))"
echo "sft_e2e: ok"
