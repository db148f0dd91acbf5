#!/usr/bin/env bash
# Block-causal attention on a packed chat shard keeps to conversations, not to EOS-ended turns:
# - the golden conversations rendered with ChatML by a tokenizer whose EOS is <|im_end|> (Qwen's),
#   which ends every turn, packed first-fit into sequences of 128 (`tokenize --format chat`, a
#   version 4 shard recording where each conversation starts);
# - the same conversations each alone in its own sequence (alone.bin, made from packed.bin's words:
#   each conversation's words from its start to the next, then masked EOS padding);
# - trained under block_causal with RoPE positions restarted per document, every sequence in the one
#   global batch: the packed run's loss and grad norm equal the alone run's within 1e-6 at every
#   step, so each conversation sees itself whole and nothing of the others, and its loss masks hold;
# - the comparison can fail: the packed shard as version 3 (no starts: a document ends at each EOS,
#   so an answer does not see its prompt), and as version 4 with every mask cleared, both leave the
#   alone run's curve by more than 1e-4 (100 times the bound) within the 3 steps;
# - the planner's mean document length is the shard's, per conversation (per EOS without starts).
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/curves.sh
STEPS=3
G=tests/golden/chat
base=tests/data/tokenizer/hf/llama3/tokenizer.json
mkdir -p "$T/qwen"
sed -e 's/<|reserved_special_token_3|>/<|im_start|>/' -e 's/<|reserved_special_token_4|>/<|im_end|>/' \
    -e 's/<|reserved_special_token_5|>/<|endoftext|>/' "$base" >"$T/qwen/tokenizer.json"
cp "$G/qwen/tokenizer_config.json" "$T/qwen/"
"$CTITAN" tokenize --format chat --tokenizer "$T/qwen" --chat-template chatml --seq-len 128 \
  --input "$G/conversations.jsonl" --output "$T/packed.bin" >"$T/tok.log" 2>&1 || { cat "$T/tok.log"; fail "tokenize"; }
grep -qF "10 packed into 4 sequences of 128" "$T/tok.log" || { cat "$T/tok.log"; fail "expected 10 conversations in 4 sequences"; }
python3 - "$T" <<'PY' || fail "cannot write the control shards"
import struct, sys, zlib
T = sys.argv[1]
SEQ, M, S, EOS = 128, 1 << 31, 1 << 30, None
raw = open(T + "/packed.bin", "rb").read()
assert struct.unpack("<I", raw[8:12])[0] == 4, "packed.bin is not version 4"
w = list(struct.unpack("<%dI" % ((len(raw) - 32) // 4), raw[32:]))
def shard(path, words, version):
    body = struct.pack("<%dI" % len(words), *words)
    open(path, "wb").write(b"CTTOKENS" + struct.pack("<IIQQ", version, 4, len(words), zlib.crc32(body)) + body)
last = w[-1]  # the masked EOS the file ends with
alone, convs = [], 0
for b in range(len(w) // SEQ):
    blk = w[b * SEQ:(b + 1) * SEQ]
    starts = [i for i, x in enumerate(blk) if x & S] + [SEQ]
    for s, e in zip(starts, starts[1:]):
        alone += blk[s:e] + [last] * (SEQ - (e - s))
        convs += 1
alone.append(last)
assert convs == 10, convs
shard(T + "/alone.bin", alone, 4)
shard(T + "/eos_split.bin", [x & ~S for x in w], 3)
shard(T + "/unmasked.bin", [x & ~M for x in w], 4)
print("alone.bin: %d conversations in %d sequences" % (convs, convs))
PY
common=(configs/llama3_debug.yaml --training.steps=$STEPS --metrics.log_freq=1 --generate.max_new_tokens=0
        --training.seq_len=128 --training.mixed_precision_param=float32 --activation_checkpoint.mode=none
        --lr_scheduler.warmup_steps=1 --device.threads=1 --model.n_layers=2 --model.dim=64 --model.n_heads=4
        --model.n_kv_heads=2 --model.ffn_hidden=128 --model.attn_mask_type=block_causal
        --model.rope_positions=document --model.tokenizer_path="$T/qwen")
run() { # name shard sequences
  "$CTITAN" train "${common[@]}" --training.dataset_path="$T/$2" --training.global_batch_size="$3" \
    --training.local_batch_size="$3" --job.dump_folder="$T/$1" >"$T/$1.log" 2>&1 || { tail -20 "$T/$1.log"; fail "$1 run"; }
}
run packed packed.bin 4
run alone alone.bin 10
grep -q "^documents: block_causal takes them from the document starts the shards record" "$T/packed.log" &&
  echo "ok   the packed run takes its documents from the shard's starts" || { head -20 "$T/packed.log"; fail "no documents line"; }
same_curve "packed conversations vs each alone" "$T/alone/metrics.jsonl" "$T/packed/metrics.jsonl" $STEPS || exit 1
for ctl in eos_split unmasked; do
  run "$ctl" "$ctl.bin" 4
  if CURVE_TOL=1e-4 same_curve "$ctl vs alone" "$T/alone/metrics.jsonl" "$T/$ctl/metrics.jsonl" $STEPS >"$T/$ctl.cmp"; then
    cat "$T/$ctl.cmp"; fail "$ctl stays within 1e-4 of the alone run: the test cannot tell"
  fi
  echo "ok   $ctl leaves the alone run's curve: $(sed 's/^FAIL //' "$T/$ctl.cmp" | head -1)"
done
# the planner prices block-causal attention at the documents the shard records (513 words, 10
# conversations: 51.3 tokens), and at one per EOS, masked ones included, where a shard records none
doclen() { "$CTITAN" plan "${common[@]}" --training.dataset_path="$T/$1" --training.global_batch_size=4 \
             --training.local_batch_size=4 --hardware h100-sxm --gpus 1 2>&1 |
           sed -n "s/.*priced at the training data's mean document length, \([0-9.]*\) tokens.*/\1/p"; }
l4=$(doclen packed.bin) l3=$(doclen eos_split.bin)
[ "$l4" = 51.3 ] || fail "plan on the version 4 shard: mean document length '$l4', expected 51.3 (513 words, 10 conversations)"
awk -v a="$l3" 'BEGIN { exit !(a > 0 && a < 51.3) }' || fail "plan on the version 3 shard: '$l3' tokens per EOS, expected under 51.3"
echo "ok   the plan prices documents of $l4 tokens on the shard's starts, $l3 per EOS without them"
echo "chat_documents: ok"
