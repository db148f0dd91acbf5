#!/usr/bin/env bash
# Checkpoints and model files as untrusted input, and what a restart of a finished run does:
#   - tampered metadata.json fields (step, world_size, dp_size, dtype, a missing field, a wrong type)
#     and a step folder whose metadata.json was deleted: exit 2, one line naming the file and field;
#   - a resume with another training.seed, seq_len or n_layers is refused naming the setting, and
#     goes on with checkpoint.allow_config_change; a checkpoint without recorded settings gets a notice;
#   - a flipped byte of model.ctt (generate, convert) and NaN weights (a version-1 model.ctt, a
#     checkpoint piece, a Hugging Face initial load): exit 2 naming the file and the tensor;
#   - a finished run restarted: exit 0, says so, changes no file; with training.steps raised it goes
#     on bit-identically to one longer run (from the newest full-state save when the final one is
#     model-only); load_step naming a model-only save is refused; keep_latest_k keeps a full save;
#   - a save that runs out of disk (sync and async): exit 1 naming the file and errno, no step folder.
set -u
CTITAN=${CTITAN:-build/ctitan}
T=${KEEP_T:-$(mktemp -d)}
MNT=""
cleanup() { [ -n "$MNT" ] && umount "$MNT" 2>/dev/null; [ -n "${KEEP_T:-}" ] || rm -rf "$T"; }
trap cleanup EXIT
. tests/cli/lib/common.sh
. tests/cli/lib/data.sh
test_data "$T" 512 || fail "test data"
# lr_scheduler.total_steps fixes the schedule, so a 20-step run is the first 20 steps of a 30-step one
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.vocab_size=512 --model.n_layers=2
      --model.dim=128 --model.n_heads=4 --model.n_kv_heads=2 --training.seq_len=32 --training.global_batch_size=8
      --training.local_batch_size=8 --training.steps=20 --metrics.log_freq=1 --generate.max_new_tokens=0
      --activation_checkpoint.mode=none --checkpoint.enable=true --checkpoint.interval=10 --device.threads=1
      --lr_scheduler.warmup_steps=3 --lr_scheduler.total_steps=30 --model.tokenizer_path="$T/tok.model")
train() { "$CTITAN" train "${base[@]}" --job.dump_folder="$T/$1" "${@:2}" >"$T/out" 2>"$T/err"; }
# expect NAME STATUS PATTERN: the last command's status, one stderr line matching PATTERN
expect() {
  local rc=$2
  [ "$rc" -eq "$3" ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qE -- "$4" "$T/err" ||
    { cat "$T/err"; tail -3 "$T/out"; fail "$1: status $rc (want $3)"; }
  echo "ok   $1: $(cut -c1-150 "$T/err")"
}
losses() { grep '"loss"' "$1" | cut -d, -f1-3; } # step records (start, stop and end records have no loss)
sums() { (cd "$1" && find . -type f ! -name .lock | sort | xargs md5sum); } # .lock: the run lock names its holder

train ref || { cat "$T/err"; fail "reference run"; }
cp "$T/ref/metrics.jsonl" "$T/ref.metrics"
train long --training.steps=30 || fail "30-step run"
# a copy of ref's step-10 (the full save) as a run's own checkpoint, tampered by sed
tamper() { # NAME SED-SCRIPT
  rm -rf "$T/$1"; mkdir -p "$T/$1/checkpoint"; cp -r "$T/ref/checkpoint/step-10" "$T/$1/checkpoint/"
  sed -i "$2" "$T/$1/checkpoint/step-10/metadata.json"
}
meta='checkpoint/step-10/metadata.json'
tamper t_step '/"train_state"/,/}/s/"step": 10,/"step": 1000000000000000000,/'
train t_step; expect "train_state.step 10^18" $? 2 "$meta: train_state.step must be an integer from 0 to [0-9]+, got 1000000000000000000"
tamper t_both 's/"step": 10,/"step": 11,/'
train t_both; expect "step 11 in folder step-10" $? 2 "$meta: step is 11 but the folder is step-10"
tamper t_world 's/"world_size": 1,/"world_size": 7,/'
train t_world; expect "world_size 7" $? 2 "$meta: world_size is 7 but the folder holds the rank indexes \(rank-R.json\) of 1 rank"
tamper t_dp 's/"dp_size": 1/"dp_size": 0/'
train t_dp; expect "dp_size 0" $? 2 "$meta: train_state.dp_size must be an integer from 1 to 1, got 0"
tamper t_dtype '0,/"dtype": "f32"/s//"dtype": "f16"/'
train t_dtype; expect "dtype f16" $? 2 "$meta: tensors.tok_embeddings.weight.dtype must be \"f32\""
tamper t_missing '/"world_size"/d'
train t_missing; expect "world_size missing" $? 2 "$meta: world_size must be an integer from 1 to 1048576, got missing"
tamper t_type 's/"data_position": \([0-9]*\)/"data_position": "\1"/'
train t_type; expect "data_position a string" $? 2 "$meta: train_state.data_position must be an integer .*, got \"80\""
tamper t_nometa ''; rm "$T/t_nometa/$meta"; before=$(sums "$T/t_nometa/checkpoint")
train t_nometa; expect "metadata.json deleted" $? 2 "checkpoint/step-10 holds rank pieces but no metadata.json .*: delete that folder, or set checkpoint.load_step"
[ "$(sums "$T/t_nometa/checkpoint")" = "$before" ] || fail "the checkpoints beside the folder without metadata.json were changed"

# another seed, seq_len or model: refused naming the setting; allowed with the key
tamper c_seed ''
train c_seed --training.seed=1; expect "another seed" $? 2 "checkpoint .*step-10 was written with training.seed 42; this run has 1 \(set checkpoint.allow_config_change"
tamper c_seq ''
train c_seq --training.seq_len=64; expect "another seq_len" $? 2 "written with training.seq_len 32; this run has 64"
tamper c_layers ''
train c_layers --model.n_layers=1; expect "another n_layers" $? 2 "written with model.n_layers 2; this run has 1"
train c_seed --training.seed=1 --checkpoint.allow_config_change=true || { cat "$T/err"; fail "allow_config_change: seed"; }
grep -q "written with training.seed 42; this run has 1 (allowed by checkpoint.allow_config_change)" "$T/out" || fail "no notice"
train c_layers --model.n_layers=1 --checkpoint.allow_config_change=true || { cat "$T/err"; fail "allow_config_change: n_layers"; }
grep -q "resuming after step 10" "$T/out" || fail "allow_config_change: n_layers did not resume"
echo "ok   allow_config_change: another seed and n_layers resume, with a notice"
tamper c_old '/"config": {/,/^ },/d'   # as written before the settings were recorded
train c_old || { cat "$T/err"; fail "a checkpoint without recorded settings"; }
grep -q "does not record the run's settings" "$T/out" && grep -q "resuming after step 10" "$T/out" || fail "old checkpoint notice"
cmp -s <(losses "$T/c_old/metrics.jsonl") <(losses "$T/ref.metrics" | sed -n 11,20p) || fail "old checkpoint: losses differ"
tamper c_old_seed '/"config": {/,/^ },/d'
train c_old_seed --training.seed=3; expect "older checkpoint, another seed" $? 2 "written with training.seed 42; this run has 3"

# model.ctt: a flipped payload byte; NaN weights (a version-1 file: no checksum to catch it first)
gen() { "$CTITAN" generate "${base[@]}" --job.dump_folder="$T/g" --checkpoint "$1" --prompt The >"$T/out" 2>"$T/err"; }
conv() { "$CTITAN" convert --to hf --input "$1" --output "$T/hf_x" --n-heads 4 >"$T/out" 2>"$T/err"; }
cp "$T/ref/model.ctt" "$T/flip.ctt"
printf '\x55' | dd of="$T/flip.ctt" bs=1 seek=100000 conv=notrunc status=none
gen "$T/flip.ctt"; expect "generate: flipped byte" $? 2 "flip.ctt: tensor [0-9]+ '[a-z_.0-9]+' at byte [0-9]+: checksum mismatch"
conv "$T/flip.ctt"; expect "convert: flipped byte" $? 2 "flip.ctt: tensor [0-9]+ '[a-z_.0-9]+' at byte [0-9]+: checksum mismatch"
count=$(od -An -tu4 -j12 -N4 "$T/ref/model.ctt" | tr -d ' ')
head -c $(( $(stat -c %s "$T/ref/model.ctt") - 8 * count )) "$T/ref/model.ctt" > "$T/nan.ctt"
printf '\x01' | dd of="$T/nan.ctt" bs=1 seek=8 conv=notrunc status=none
gen "$T/nan.ctt" || { cat "$T/err"; fail "a version-1 model.ctt"; }
grep -q "nan.ctt: format version 1 has no checksums" "$T/out" || fail "no notice for a version-1 file"
# tok_embeddings.weight (after the model description): its data starts 21 + 4 + 4 + 16 bytes after its name
data=$(( $(grep -obUaF tok_embeddings.weight "$T/nan.ctt" | head -n 1 | cut -d: -f1) + 45 ))
printf '\x00\x00\xc0\x7f' | dd of="$T/nan.ctt" bs=1 seek=$((data + 4 * 1000)) conv=notrunc status=none
gen "$T/nan.ctt"; expect "generate: NaN weight" $? 2 "nan.ctt: tensor 'tok_embeddings.weight' holds NaN at element 1000 of 65536"
conv "$T/nan.ctt"; expect "convert: NaN weight" $? 2 "nan.ctt: tensor 'tok_embeddings.weight' holds NaN at element 1000"
# a NaN in a checkpoint piece, its FNV-1a checksum (ctitan's offset basis) made to match
tamper n_ckpt ''
idx="$T/n_ckpt/checkpoint/step-10/rank-00000.json"
entry=$(grep -o '{[^}]*"tensor": *"norm.weight"[^}]*}' "$idx")
off=$(echo "$entry" | sed 's/.*"byte_offset": *\([0-9]*\).*/\1/'); old=$(echo "$entry" | sed 's/.*"fnv1a64": *"\([0-9a-f]*\)".*/\1/')
bin="$T/n_ckpt/checkpoint/step-10/rank-00000.bin"
printf '\x00\x00\xc0\x7f' | dd of="$bin" bs=1 seek=$((off + 8)) conv=notrunc status=none
h=1469598103934665603
for b in $(od -An -tu1 -v -j "$off" -N 512 "$bin"); do h=$(( (h ^ b) * 1099511628211 )); done
new=$(printf '%016x' "$h")
sed -i "s/$old/$new/" "$idx" "$T/n_ckpt/$meta"
train n_ckpt; expect "checkpoint: NaN weight" $? 2 "rank-00000.bin: tensor 'norm.weight' holds NaN at element 2 of 128"
gen "$T/n_ckpt/checkpoint"; expect "generate from a checkpoint: NaN weight" $? 2 "tensor 'norm.weight' holds NaN"
# a Hugging Face initial load (safetensors has no checksum)
"$CTITAN" convert --to hf --input "$T/ref/model.ctt" --output "$T/hf" --n-heads 4 >/dev/null 2>&1 || fail "export"
hdr=$(od -An -tu8 -N8 "$T/hf/model.safetensors" | tr -d ' ')
printf '\x00\x00\x80\x7f' | dd of="$T/hf/model.safetensors" bs=1 seek=$((8 + hdr + 40)) conv=notrunc status=none
train n_hf --checkpoint.enable=false --checkpoint.initial_load_path="$T/hf" --checkpoint.initial_load_in_hf=true
expect "initial_load_in_hf: Inf weight" $? 2 "checkpoint.initial_load_path.*tensor '[a-z_.0-9]+' holds Inf at element 10"
"$CTITAN" convert --from hf --input "$T/hf" --output "$T/x.ctt" >"$T/out" 2>"$T/err"
expect "convert --from hf: Inf weight" $? 2 "tensor '[a-z_.0-9]+' holds Inf at element 10"

# a finished run restarted: says so, trains and writes nothing
before=$(sums "$T/ref")
train ref; rc=$?
[ $rc -eq 0 ] && grep -q "checkpoint: this run already finished at step 20 (.*ref/checkpoint/step-20)" "$T/out" ||
  { cat "$T/err" "$T/out"; fail "finished run restart: status $rc"; }
[ "$(sums "$T/ref")" = "$before" ] || fail "the finished run's restart changed files"
echo "ok   finished run restarted: exit 0, 'already finished at step 20', no file changed"
# (metrics.jsonl is appended to: the extension's records follow the first run's)
# extended: the final save is model-only, so it goes on from step-10 and equals the 30-step run
cp -r "$T/ref" "$T/ext"
train ext --training.steps=30 || { cat "$T/err"; fail "extension"; }
grep -q "step-20 holds the model only (checkpoint.last_save_model_only); resuming from step-10" "$T/out" || fail "extension: no reason given"
cmp -s <(losses "$T/ext/metrics.jsonl" | tail -n 20) <(losses "$T/long/metrics.jsonl" | sed -n 11,30p) || fail "extension differs from the 30-step run"
echo "ok   extended 20 -> 30 steps (model-only final save): steps 11-30 bit-identical to one 30-step run"
train full --checkpoint.last_save_model_only=false || fail "full final save"
train full --training.steps=30 --checkpoint.last_save_model_only=false || { cat "$T/err"; fail "extension from a full save"; }
grep -q "resuming after step 20" "$T/out" || fail "extension from a full final save did not resume at step 20"
cmp -s <(losses "$T/full/metrics.jsonl" | tail -n 10) <(losses "$T/long/metrics.jsonl" | sed -n 21,30p) || fail "extension (full save) differs"
echo "ok   extended 20 -> 30 steps (full final save): resumes at step 20, steps 21-30 bit-identical"
train ref --training.steps=30 --checkpoint.load_step=20
expect "load_step names a model-only save" $? 2 "checkpoint.load_step.*step-20 holds the model only .*\(step-10 has it\)"
"$CTITAN" train "${base[@]}" --job.dump_folder="$T/seedrun" --checkpoint.create_seed_checkpoint=true >/dev/null 2>&1 || fail "seed"
train seedrun || { cat "$T/err"; fail "a run from its own seed checkpoint"; }
grep -q "loaded .*seedrun/checkpoint/step-0 (model)" "$T/out" || fail "the seed checkpoint step-0 was not loaded"
cmp -s <(losses "$T/seedrun/metrics.jsonl") <(losses "$T/ref.metrics") || fail "a run from its seed checkpoint differs"
echo "ok   a model-only step-0 (seed checkpoint) in the run's own folder: the model loads, training matches"
# a crash while a re-save of step-10 swapped the old one aside: step-10.old comes back (or goes, once
# a complete step-10 exists)
tamper swap ''; mv "$T/swap/checkpoint/step-10" "$T/swap/checkpoint/step-10.old"
cp -r "$T/swap/checkpoint/step-10.old" "$T/swap/checkpoint/step-10.tmp"
train swap || { cat "$T/err"; fail "a step-10.old left by a crash"; }
grep -q "resuming after step 10" "$T/out" && [ ! -e "$T/swap/checkpoint/step-10.old" ] || fail "step-10.old was not restored"
echo "ok   a replaced save left as step-10.old by a crash is restored and resumed from"
train keep1 --checkpoint.keep_latest_k=1 || fail "keep_latest_k 1"
[ "$(ls "$T/keep1/checkpoint" | tr '\n' ' ')" = "step-10 step-20 " ] || fail "keep_latest_k 1 left $(ls "$T/keep1/checkpoint")"
echo "ok   keep_latest_k 1 keeps the model-only step-20 and step-10, the newest full save"

# out of disk while saving: a 4 MiB tmpfs when this user may mount one, else a 4 MiB file size limit
MNT="$T/small"; mkdir -p "$MNT"
if mount -t tmpfs -o size=4m tmpfs "$MNT" 2>/dev/null; then limit=(); why="No space left on device"
else MNT=""; mkdir -p "$T/small"; limit=(ulimit -f 4096); why="File too large"; fi
# only the checkpoints fill the small disk (dump/checkpoint links there): metrics.jsonl, whose write
# errors end a run too, stays writable, so the save's own error is the one reported
for mode in disabled async; do
  rm -rf "$T/small/$mode" "$T/dump_$mode"; mkdir -p "$T/small/$mode" "$T/dump_$mode"
  ln -s "$T/small/$mode" "$T/dump_$mode/checkpoint"
  ( trap '' XFSZ; [ ${#limit[@]} -gt 0 ] && "${limit[@]}"
    exec "$CTITAN" train "${base[@]}" --job.dump_folder="$T/dump_$mode" --checkpoint.async_mode=$mode ) >"$T/out" 2>"$T/err"
  expect "out of disk, async_mode $mode" $? 1 "training failed: checkpoint: .*step-10.tmp/rank-00000.bin: (write failed|cannot sync): $why"
  [ -z "$(ls "$T/small/$mode")" ] || fail "a failed save left $(ls "$T/small/$mode")"
  rm -rf "$T/small/$mode"
done
echo "ok   checkpoint_trust"
