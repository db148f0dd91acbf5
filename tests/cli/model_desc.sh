#!/usr/bin/env bash
# Saved models carry their description (pack, flavor, every model option, ct_model_desc's fields):
#   - a trained model.ctt converts to Hugging Face with no shape flags (config.json has its heads);
#   - generate from model.ctt or a checkpoint folder with no shape keys equals generate with them;
#   - model.flavor: from_checkpoint trains from a model.ctt, a checkpoint or a Hugging Face folder
#     exactly as the run with every size written out; a key that contradicts the file is one line
#     naming it and both values (exit 2); a description-less file or no initial_load_path is refused;
#   - a description-less file (the committed golden llama3_tiny.ctt) still loads given the sizes;
#   - continuing a finished run whose only save is model-only: exit 2 naming the keys to set, and the
#     remedy it names (initial_load_path + initial_load_model_only in a new folder) trains.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/data.sh
test_data "$T" 512 || fail "test data"
sizes=(--model.vocab_size=512 --model.n_layers=2 --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2)
common=(--training.dataset_path="$T/data.bin" --training.seq_len=32 --training.global_batch_size=4
        --training.local_batch_size=4 --metrics.log_freq=1 --generate.max_new_tokens=0 --device.threads=1
        --activation_checkpoint.mode=none --lr_scheduler.warmup_steps=1 --model.tokenizer_path="$T/tok.model")
train() { "$CTITAN" train configs/llama3_debug.yaml "${common[@]}" --job.dump_folder="$T/$1" "${@:2}" >"$T/out" 2>"$T/err"; }
# expect NAME STATUS PATTERN: the last command's status, one stderr line matching PATTERN
expect() {
  local rc=$2
  [ "$rc" -eq "$3" ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qE -- "$4" "$T/err" ||
    { cat "$T/err"; tail -3 "$T/out"; fail "$1: status $rc (want $3)"; }
  echo "ok   $1: $(cut -c1-200 "$T/err")"
}
losses() { grep '"loss"' "$1" | cut -d, -f1-3; }

train ref "${sizes[@]}" --training.steps=3 --checkpoint.enable=true || { cat "$T/err"; fail "reference run"; }

# convert: no shape flags
"$CTITAN" convert --to hf --input "$T/ref/model.ctt" --output "$T/hf" >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "convert"; }
grep -q '"num_attention_heads": 4,' "$T/hf/config.json" && grep -q '"num_key_value_heads": 2,' "$T/hf/config.json" &&
  grep -q '"intermediate_size": 256,' "$T/hf/config.json" || { cat "$T/hf/config.json"; fail "config.json heads"; }
echo "ok   a trained model.ctt converts with no shape flags (4 heads, 2 kv heads in config.json)"

# generate: no shape keys, from the model file and from the checkpoint folder
gen() { "$CTITAN" generate configs/llama3_debug.yaml --model.tokenizer_path="$T/tok.model" --device.threads=1 \
          --training.seq_len=32 --generate.max_new_tokens=8 --job.dump_folder="$T/ref" "$@" >"$T/out" 2>"$T/err"; }
gen "${sizes[@]}" || { cat "$T/err"; fail "generate with sizes"; }
cp "$T/out" "$T/gen.sized"
gen || { cat "$T/err"; fail "generate without sizes"; }
cmp -s "$T/out" "$T/gen.sized" || fail "generate without sizes differs"
gen --checkpoint "$T/ref/checkpoint" || { cat "$T/err"; fail "generate from the checkpoint without sizes"; }
cmp -s "$T/out" "$T/gen.sized" || fail "generate from the checkpoint differs"
echo "ok   generate from model.ctt and from the checkpoint folder with no shape keys: the same text as with them"
gen --model.n_heads=8
expect "generate: a key against the file" $? 2 "command line: --model.n_heads: 8 contradicts the checkpoint's 4 \(.*ref/model.ctt\)"

# from_checkpoint: the same run as the one with every size, from a model file, a checkpoint, an HF folder
sed 's/^  flavor: debugmodel$/  flavor: from_checkpoint/' configs/llama3_debug.yaml >"$T/fc.yaml"
grep -q from_checkpoint "$T/fc.yaml" || fail "fc.yaml"
fc() { "$CTITAN" train "$T/fc.yaml" "${common[@]}" --training.steps=2 --job.dump_folder="$T/$1" \
         --checkpoint.initial_load_path="$T/ref/model.ctt" "${@:2}" >"$T/out" 2>"$T/err"; }
train sized "${sizes[@]}" --training.steps=2 --checkpoint.initial_load_path="$T/ref/model.ctt" || { cat "$T/err"; fail "sized run"; }
fc fc_ctt || { cat "$T/err"; fail "from_checkpoint (model.ctt)"; }
grep -q "loaded the model file .*ref/model.ctt" "$T/out" || fail "from_checkpoint: model.ctt not loaded"
cmp -s <(losses "$T/sized/metrics.jsonl") <(losses "$T/fc_ctt/metrics.jsonl") || fail "from_checkpoint (model.ctt) differs"
fc fc_ckpt --checkpoint.initial_load_path="$T/ref/checkpoint" --checkpoint.initial_load_model_only=true ||
  { cat "$T/err"; fail "from_checkpoint (checkpoint folder)"; }
cmp -s <(losses "$T/sized/metrics.jsonl") <(losses "$T/fc_ckpt/metrics.jsonl") || fail "from_checkpoint (checkpoint) differs"
fc fc_hf --checkpoint.initial_load_path="$T/hf" --checkpoint.initial_load_in_hf=true || { cat "$T/err"; fail "from_checkpoint (HF)"; }
cmp -s <(losses "$T/sized/metrics.jsonl") <(losses "$T/fc_hf/metrics.jsonl") || fail "from_checkpoint (HF) differs"
echo "ok   model.flavor: from_checkpoint (model.ctt, checkpoint folder, HF folder): losses bit-identical to the sized run"
fc fc_agree --model.n_heads=4 --model.dim=64 || { cat "$T/err"; fail "from_checkpoint with agreeing keys"; }
echo "ok   from_checkpoint with keys that agree"
fc fc_bad --model.n_kv_heads=1
expect "from_checkpoint: a key against the file" $? 2 "^ctitan: command line: --model.n_kv_heads: 1 contradicts the checkpoint's 2 \(.*ref/model.ctt\)"
sed -i 's/  flavor: from_checkpoint/  flavor: from_checkpoint\n  dim: 128/' "$T/fc.yaml"
fc fc_bad
expect "from_checkpoint: a manifest key against the file" $? 2 "fc.yaml:[0-9]+: model.dim: 128 contradicts the checkpoint's 64"
fc fc_old --checkpoint.initial_load_path=tests/golden/llama3_tiny.ctt --model.dim=64
expect "from_checkpoint: a description-less file (the golden llama3_tiny.ctt)" $? 2 "model.flavor: tests/golden/llama3_tiny.ctt carries no model description"
fc fc_none --checkpoint.initial_load_path= --model.dim=64
expect "from_checkpoint without initial_load_path" $? 2 "fc.yaml:[0-9]+: model.flavor: from_checkpoint takes the model from checkpoint.initial_load_path"

# a description-less file still loads, given the sizes (as before): model.ctt without its first
# record (the description) and that record's checksum, as an older ctitan wrote it
rec=$(( $(grep -obUaF tok_embeddings.weight "$T/ref/model.ctt" | head -n 1 | cut -d: -f1) - 4 ))
n=$(od -An -tu4 -j12 -N4 "$T/ref/model.ctt" | tr -d ' ')
{ head -c 12 "$T/ref/model.ctt"; printf "\\x$(printf %02x $((n - 1)))\\x00\\x00\\x00"; tail -c +17 "$T/ref/model.ctt" | head -c 8
  tail -c +$((rec + 1)) "$T/ref/model.ctt" | head -c -$((8 * n)); tail -c $((8 * (n - 1))) "$T/ref/model.ctt"; } >"$T/old.ctt"
gen "${sizes[@]}" --checkpoint "$T/old.ctt" || { cat "$T/err"; fail "generate from a description-less file"; }
cmp -s "$T/out" "$T/gen.sized" || fail "generate from the description-less file differs"
train old "${sizes[@]}" --training.steps=2 --checkpoint.initial_load_path="$T/old.ctt" || { cat "$T/err"; fail "description-less initial load"; }
cmp -s <(losses "$T/sized/metrics.jsonl") <(losses "$T/old/metrics.jsonl") || fail "description-less initial load differs"
echo "ok   a description-less model.ctt (an older ctitan's) loads with the sizes given: the same sample and losses"

# continuing a finished run whose only save is the model-only final one
train ref "${sizes[@]}" --training.steps=3 --checkpoint.enable=true || fail "restart of the finished run"
grep -q "this run already finished at step 3 .*: nothing to train; its save holds the model only (checkpoint.last_save_model_only), so it cannot be continued" "$T/out" ||
  { cat "$T/out"; fail "finished run: no word on the model-only save"; }
echo "ok   finished run restarted: says its save cannot be continued"
train ref "${sizes[@]}" --training.steps=6 --checkpoint.enable=true
expect "continuing a model-only finished run" $? 2 "training.steps: .*ref/checkpoint/step-3 holds the model only \(checkpoint.last_save_model_only: true\).*checkpoint.initial_load_path: .*ref/checkpoint/step-3 and checkpoint.initial_load_model_only: true; .*checkpoint.last_save_model_only: false$"
train cont "${sizes[@]}" --training.steps=6 --checkpoint.enable=true --checkpoint.initial_load_path="$T/ref/checkpoint/step-3" \
  --checkpoint.initial_load_model_only=true || { cat "$T/err"; fail "the remedy"; }
grep -q "loaded .*ref/checkpoint/step-3 (model)" "$T/out" && [ "$(losses "$T/cont/metrics.jsonl" | wc -l)" -eq 6 ] ||
  fail "the remedy did not train from step-3's weights"
echo "ok   the remedy it names (initial_load_path + initial_load_model_only in a new job.dump_folder) trains"
