#!/usr/bin/env bash
# AdamW with its moments held in bf16 (optimizer.implementation: fused_opt_states_bf16, torchtitan's
# name; device.h adamw_bf16_moments, ABI 2.10): parameters and gradients f32, both moments of an
# element in one 32-bit state.
#   1. 200 steps of the debug model follow fp32 moments within the bound float8 is held to against
#      fp32 (final loss within 3%; tests/cli/float8.sh), with no NaN;
#   2. the optimizer's memory halves, in the run and in `ctitan plan`;
#   3. FSDP 2 follows one rank within the bf16 bound (each element's step is its own, but FSDP's sums
#      in another order can move a moment across a bf16 rounding boundary: 3.1e-6 of the grad norm
#      by step 14, where fp32 moments stay within 1e-7; tests/cli/lib/curves.sh's CURVE_TOL_BF16);
#   4. a checkpoint resumes bit for bit, and one written by fp32 moments is refused, naming the
#      setting and the way out; a misspelt implementation is refused with its key.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/curves.sh
. tests/cli/lib/data.sh
test_data "$T" 2048 || fail "test data"
STEPS=${ADAMW_BF16_STEPS:-200}
# the debug model at 2 blocks of dim 128: 200 steps in seconds, under the sanitizers too
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.tokenizer_path="$T/tok.model"
      --model.n_layers=2 --model.dim=128 --model.n_heads=4 --model.n_kv_heads=2 --training.seq_len=64 --training.local_batch_size=8 --training.steps=$STEPS --metrics.log_freq=1
      --generate.max_new_tokens=0 --activation_checkpoint.mode=none --lr_scheduler.warmup_steps=10
      --optimizer.lr=2e-3 --device.threads=1 --comm.train_timeout_seconds=120)
bf16=(--optimizer.implementation=fused_opt_states_bf16)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${base[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${base[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi ||
    { tail -5 "$T/$name.log"; fail "$name"; }
}
optimizer_bytes() { grep '"loss"' "$T/$1/metrics.jsonl" | tail -1 | sed 's/.*"optimizer": \([0-9]*\).*/\1/'; }

# 1 and 2
run f32 1
run bf16 1 "${bf16[@]}"
final_within "bf16 moments against fp32 moments" "$T/f32/metrics.jsonl" "$T/bf16/metrics.jsonl" $STEPS 0.03 || exit 1
a=$(optimizer_bytes f32) b=$(optimizer_bytes bf16)
[ -n "$a" ] && [ "$b" -gt 0 ] && [ $((2 * b)) -eq "$a" ] || fail "optimizer memory: $b bytes with bf16 moments, $a with fp32"
plan_opt() {
  "$CTITAN" plan "${base[@]}" "$@" --hardware h100-sxm --gpus 1 --json 2>"$T/plan.err" |
    python3 -c 'import json, sys; print(round(json.load(sys.stdin)["layouts"][0]["memory_gib"]["optimizer"] * 2**30))' ||
    { cat "$T/plan.err"; fail "plan $*"; }
}
pa=$(plan_opt) pb=$(plan_opt "${bf16[@]}")
[ "$pa" -eq "$a" ] && [ "$pb" -eq "$b" ] || fail "the plan's optimizer memory: $pb and $pa bytes, the runs held $b and $a"
echo "ok   optimizer memory: $b bytes with bf16 moments, $a with fp32 moments; the plan says the same"

# 3: FSDP 2 against one rank, 20 steps
short=(--training.steps=20 --training.global_batch_size=8)
run one 1 "${bf16[@]}" "${short[@]}"
run fsdp2 2 "${bf16[@]}" "${short[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2
CURVE_TOL=$CURVE_TOL_BF16 same_curve "bf16 moments, FSDP 2 vs one rank" "$T/one/metrics.jsonl" "$T/fsdp2/metrics.jsonl" 20 || exit 1

# 4: checkpoints
ck=(--checkpoint.enable=true --checkpoint.interval=10 --training.steps=20)
run ck 1 "${bf16[@]}" "${ck[@]}"
mkdir -p "$T/resumed/checkpoint" && cp -r "$T/ck/checkpoint/step-10" "$T/resumed/checkpoint/"
run resumed 1 "${bf16[@]}" "${ck[@]}"
grep -q "resuming after step 10" "$T/resumed.log" || fail "did not resume"
cmp -s <(grep '"loss"' "$T/ck/metrics.jsonl" | cut -d, -f1-3 | sed -n 11,20p) \
       <(grep '"loss"' "$T/resumed/metrics.jsonl" | cut -d, -f1-3) || fail "resumed losses differ"
echo "ok   bf16 moments resume from a checkpoint: steps 11-20 bit-identical"
run ck32 1 "${ck[@]}"
mkdir -p "$T/mixed/checkpoint" && cp -r "$T/ck32/checkpoint/step-10" "$T/mixed/checkpoint/"
"$CTITAN" train "${base[@]}" "${bf16[@]}" "${ck[@]}" --job.dump_folder="$T/mixed" >"$T/mixed.log" 2>&1 &&
  fail "fp32 moments' checkpoint loaded into bf16 moments"
grep -q "optimizer.states_per_element 2; this run has 1" "$T/mixed.log" || { cat "$T/mixed.log"; fail "no clear refusal"; }
"$CTITAN" train "${base[@]}" "${bf16[@]}" "${ck[@]}" --checkpoint.allow_config_change=true --job.dump_folder="$T/mixed" \
  >"$T/mixed2.log" 2>&1 && fail "fp32 moments' states loaded into bf16 moments with allow_config_change"
grep -q "holds more optimizer states per element than this run's optimizer keeps (1; optimizer.1" "$T/mixed2.log" &&
  grep -q "checkpoint.exclude_from_loading: optimizer" "$T/mixed2.log" || { cat "$T/mixed2.log"; fail "no clear refusal"; }
"$CTITAN" train "${base[@]}" "${bf16[@]}" "${ck[@]}" --checkpoint.allow_config_change=true \
  --checkpoint.exclude_from_loading=optimizer --job.dump_folder="$T/mixed" >"$T/mixed3.log" 2>&1 ||
  { tail -5 "$T/mixed3.log"; fail "resume without the optimizer"; }
echo "ok   refused: fp32 moments' checkpoint under bf16 moments ($(grep -o 'optimizer.states_per_element[^(]*' "$T/mixed.log" | head -1)); loads without the optimizer"
"$CTITAN" train "${base[@]}" --optimizer.implementation=fused_bf16 --job.dump_folder="$T/bad" >"$T/bad.log" 2>&1 &&
  fail "a misspelt implementation accepted"
grep -q "optimizer.implementation.*expected fused, foreach, for-loop or fused_opt_states_bf16, got 'fused_bf16'" \
  "$T/bad.log" || { cat "$T/bad.log"; fail "no clear error for a misspelt implementation"; }
echo "ok   refused: $(grep -m1 'fused_bf16' "$T/bad.log")"
