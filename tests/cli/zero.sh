#!/usr/bin/env bash
# ZeRO (parallelism.dp_strategy: zero1 | zero2, Megatron's distributed optimizer) on real MPI ranks,
# a tiny llama3 (2 layers, dim 128, seq 32, global batch 8, fp32):
#   - the loss and grad-norm curves of 8 steps equal the single rank's within 1e-6 for zero1 and
#     zero2 on 2 ranks (dp_shard 2), 4 ranks (dp_replicate 2 x dp_shard 2) and with 2 microbatches;
#     so do zero2 under pipeline parallel (ZBV zero-bubble) and zero1 with bf16 compute (against
#     the single rank's bf16 run);
#   - a checkpoint saved under zero1 continues on one rank (1e-6) and under zero2 (bit-identical to
#     zero2's own uninterrupted run);
#   - the memory counters show the distributed optimizer's arithmetic: master weights and optimizer
#     states 1/2 of the single rank's parameters and states, compute parameters whole, zero1's
#     gradients whole plus their shard, zero2's the shard plus the transient buffers it reports;
#   - `ctitan plan --json` (built on each strategy's report) plans the gradients the run holds, and
#     its collective bytes per step agree with the bytes the live run counts (comm_bytes) for zero1
#     and fsdp.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/curves.sh
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null || fail tokenizer
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail tokenize
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.vocab_size=512 --model.n_layers=2
      --model.dim=128 --model.n_heads=4 --model.n_kv_heads=2 --training.seq_len=32 --training.global_batch_size=8
      --training.steps=8 --metrics.log_freq=1 --generate.max_new_tokens=0 --activation_checkpoint.mode=none
      --training.mixed_precision_param=float32 --device.threads=1 --lr_scheduler.warmup_steps=3
      --comm.train_timeout_seconds=120)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${base[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${base[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi \
    || { tail -20 "$T/$name.log"; fail "$name run"; }
}
compare() { same_curve "$2 vs $1" "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" "$3" "${4:-1}"; }
# a memory counter of the first step record (peak bytes of that category on rank 0)
mem() { grep '"loss"' "$T/$1/metrics.jsonl" | sed -n 1p | sed "s/.*\"$2\": \([0-9]*\).*/\1/"; }
near() { # what got want tolerance: got within tolerance (relative) of want
  awk -v w="$1" -v g="$2" -v e="$3" -v t="$4" 'BEGIN { r = g / e; ok = r > 1 - t && r < 1 + t
    printf "%s %s: %d bytes, expected %d (ratio %.3f)\n", ok ? "ok  " : "FAIL", w, g, e, r; exit !ok }'
}
two=(--training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2)
four=(--training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=2)
accum=(--training.local_batch_size=2 --parallelism.data_parallel_shard_degree=2)
ckpt=(--checkpoint.enable=true --checkpoint.interval=4)

# on one process there is nothing to shard over: refused with one line, status 2
"$CTITAN" train "${base[@]}" --job.dump_folder="$T/one" --parallelism.dp_strategy=zero1 >"$T/one.log" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "strategy 'zero1' needs several ranks" "$T/one.log" ||
  fail "zero1 on one rank: status $rc, expected 2 with a line naming the strategy: $(cat "$T/one.log")"
echo "ok   zero1 on one rank refused (status 2): $(cat "$T/one.log")"
run single 1 --training.local_batch_size=8
for z in zero1 zero2; do
  run $z-2 2 "${two[@]}" --parallelism.dp_strategy=$z "${ckpt[@]}"
  grep -q "strategy $z" "$T/$z-2.log" || fail "$z-2 did not run $z"
  run $z-4 4 "${four[@]}" --parallelism.dp_strategy=$z
  run $z-accum 2 "${accum[@]}" --parallelism.dp_strategy=$z
  grep -q "x 2 microbatches" "$T/$z-accum.log" || fail "$z-accum: not 2 microbatches per step"
  for r in $z-2 $z-4 $z-accum; do compare single $r 8 || exit 1; done
done
# pipeline parallel (the other stage's slots left alone); ZBV zero-bubble opens a unit's backward
# windows of two microbatches at once (zero2 keeps one transient buffer for both)
run zero2-pp 4 --training.local_batch_size=1 --parallelism.pipeline_parallel_degree=2 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.dp_strategy=zero2 --parallelism.pipeline_parallel_schedule=ZBVZeroBubble --parallelism.pipeline_parallel_layers_per_stage=1
compare single zero2-pp 8 || exit 1
run single_bf16 1 --training.local_batch_size=8 --training.mixed_precision_param=bfloat16 --training.steps=4
run zero1_bf16 2 "${two[@]}" --parallelism.dp_strategy=zero1 --training.mixed_precision_param=bfloat16 --training.steps=4
compare single_bf16 zero1_bf16 4 || exit 1

# checkpoints: zero1's step 4 continued on one rank and under zero2
resume_from() { mkdir -p "$T/$1/checkpoint" && cp -r "$T/$2/checkpoint/step-4" "$T/$1/checkpoint/"; }
resume_from to_single zero1-2
run to_single 1 --training.local_batch_size=8 "${ckpt[@]}"
grep -q "resuming after step 4" "$T/to_single.log" || fail "to_single did not resume"
compare zero1-2 to_single 4 5 || exit 1
resume_from to_zero2 zero1-2
run to_zero2 2 "${two[@]}" --parallelism.dp_strategy=zero2 "${ckpt[@]}"
losses() { grep '"loss"' "$T/$1/metrics.jsonl" | cut -d, -f1-3; }
cmp -s <(losses zero2-2 | sed -n 5,8p) <(losses to_zero2) || fail "zero1 step 4 under zero2: steps 5-8 differ from zero2's own"
echo "ok   zero1's checkpoint continued under zero2: steps 5-8 bit-identical to zero2's uninterrupted run"

# memory: the single rank's parameters P, gradients G and optimizer states O; 2 shards over dp_shard
P=$(mem single params); G=$(mem single grads); O=$(mem single optimizer)
[ "$(mem single master)" = 0 ] || fail "single rank counts master weights"
for z in zero1 zero2; do
  near "memory: $z master weights (P/2)" "$(mem $z-2 master)" $((P / 2)) 0.05 || exit 1
  near "memory: $z optimizer states (O/2)" "$(mem $z-2 optimizer)" $((O / 2)) 0.05 || exit 1
  near "memory: $z compute parameters (P)" "$(mem $z-2 params)" "$P" 0.05 || exit 1
  near "memory: $z-4 master weights (P/2: sharded over dp_shard only)" "$(mem $z-4 master)" $((P / 2)) 0.05 || exit 1
done
near "memory: zero1 gradients (G whole + G/2 shard)" "$(mem zero1-2 grads)" $((G + G / 2)) 0.05 || exit 1

# the plans (`ctitan plan --json`, from the strategies' reports): zero2's gradients with its
# transient buffers, and the collective bytes per step against the live counters (comm_bytes between
# the first two step records; an all-gather counts this rank's shard, a reduce-scatter the whole buffer)
plan() { # name gpus args... -> $T/name.json
  local name=$1 gpus=$2; shift 2
  "$CTITAN" plan "${base[@]}" "$@" --hardware h100-sxm --gpus "$gpus" --json >"$T/$name.json" 2>"$T/$name.err" ||
    { cat "$T/$name.err"; fail "$name: plan"; }
}
planned() { # name key -> bytes (memory_gib's key) or, for all_gather / reduce_scatter / all_reduce@AXIS, bytes per step
  python3 - "$T/$1.json" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); l = d["layouts"][0] if isinstance(d, dict) and d.get("layouts") else d
k = sys.argv[2]
if k in l["memory_gib"]: print(round(l["memory_gib"][k] * 2**30)); sys.exit(0)
kind, _, axis = k.partition("@")
print(int(sum(c["bytes"] for c in l["collectives"] if c["what"].endswith(kind) and (not axis or c["axis"] == int(axis)))))
PY
}
plan zero2_plan 2 "${two[@]}" --parallelism.dp_strategy=zero2
near "memory: zero2 gradients (G/2 shard + transient buffers), planned" "$(mem zero2-2 grads)" "$(planned zero2_plan grads)" 0.05 ||
  exit 1
# deeper (8 layers): zero2's gradients shrink towards the shard, the transient buffers stay two units'
deep=(--model.n_layers=8 --training.steps=2)
run zero2-deep 2 "${two[@]}" --parallelism.dp_strategy=zero2 "${deep[@]}"
plan zero2_deep 2 "${two[@]}" --parallelism.dp_strategy=zero2 "${deep[@]}"
Pd=$(( $(mem zero2-deep master) * 2 )) # the whole model's bytes (no padding at dim 128 on 2 shards)
near "memory: zero2, 8 layers, gradients, planned" "$(mem zero2-deep grads)" "$(planned zero2_deep grads)" 0.05 || exit 1
awk -v g="$(mem zero2-deep grads)" -v p="$Pd" 'BEGIN { printf "%s memory: zero2, 8 layers: gradients %.2f of the whole model'"'"'s\n", g < 0.9 * p ? "ok  " : "FAIL", g / p; exit !(g < 0.9 * p) }' || exit 1
run fsdp-2 2 "${two[@]}" --parallelism.dp_strategy=fsdp
plan zero1_plan 2 "${two[@]}" --parallelism.dp_strategy=zero1
plan fsdp_plan 2 "${two[@]}" --parallelism.dp_strategy=fsdp
counted() { # run kind -> bytes between step records 1 and 2
  grep '"loss"' "$T/$1/metrics.jsonl" | sed -n 1,2p | sed "s/.*\"$2\": \([0-9]*\).*/\1/" | paste -sd' ' |
    awk '{ printf "%d", $2 - $1 }'
}
for pair in "zero1-2 zero1_plan" "fsdp-2 fsdp_plan"; do
  set -- $pair
  ag_r=$(planned "$2" all_gather); rs_r=$(planned "$2" reduce_scatter)
  ag_c=$(counted "$1" all_gather); rs_c=$(counted "$1" reduce_scatter)
  near "comm: $1 planned all-gather bytes vs counted x 2 shards" $((ag_c * 2)) "$ag_r" 0.02 || exit 1
  near "comm: $1 planned reduce-scatter bytes vs counted" "$rs_c" "$rs_r" 0.02 || exit 1
done
# a strategy made for planning touches no device or comm: one process plans 4 ranks
plan plan4 4 "${four[@]}" --parallelism.dp_strategy=zero2
[ "$(planned plan4 all_reduce@1)" -gt 0 ] || fail "zero2 on dp_replicate 2 x dp_shard 2: no all-reduce over dp_replicate in its plan"
echo "ok   zero2 on dp_replicate 2 x dp_shard 2: its plan all-reduces $(planned plan4 all_reduce@1) bytes per step over dp_replicate"
