#!/usr/bin/env bash
# An op that reads a parameter through a view (a Qwen3 pack's QK-norm: rmsnorm on a reshaped norm
# weight) computes its backward with the parameter's data of backward time. Under FSDP with the
# default reshard the block's weights are gathered anew for backward, into another buffer: the view
# must follow them. tests/plugins/param_view.c (built here with the SDK headers alone) on one rank
# is bit-identical with and without the views, and FSDP 2 (both reshard policies), HSDP 2x2, ZeRO-2,
# PP 2 and PP 2 x FSDP 2 follow the one-rank curve within 1e-6. Its q_norm is a QK-norm over head-split
# activations: under TP (below) its gradient must be summed over tp or the start refused. With
# model.double_by=custom its block runs a custom op of its own on the builder's device (ABI 2.12).
set -u
STEPS=${STEPS:-8}
. tests/cli/lib/layouts.sh
cc -Isdk/include -std=c11 -Wall -Wextra -Werror -shared -fPIC -o "$T/param_view.so" tests/plugins/param_view.c ||
  fail "build tests/plugins/param_view.c"
pv=(--model.name="$T/param_view.so" --model.flavor=tiny)
run single 1 --training.local_batch_size=8 "${pv[@]}"
run single_noview 1 --training.local_batch_size=8 "${pv[@]}" --model.view=false
CURVE_TOL=0 same_curve "one rank: the view vs the weight itself (bit-identical)" "$T/single_noview/metrics.jsonl" \
  "$T/single/metrics.jsonl" "$STEPS" || exit 1
fs=(--training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 "${pv[@]}")
run fsdp2 2 "${fs[@]}"
run fsdp2_never 2 "${fs[@]}" --parallelism.fsdp_reshard_after_forward=never
run hsdp2x2 4 --training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=2 "${pv[@]}"
run zero2 2 "${fs[@]}" --parallelism.dp_strategy=zero2
pp=(--parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_microbatch_size=2 "${pv[@]}")
run pp2 2 --training.local_batch_size=8 "${pp[@]}"
run pp2_fsdp2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 "${pp[@]}"
for r in fsdp2 fsdp2_never hsdp2x2 zero2 pp2 pp2_fsdp2; do compare single $r "$STEPS" || exit 1; done

# A pack's own custom op on the device the builder hands it (ABI 2.12, ct_builder.device): doubling the
# block's branch with it is bit-identical to the builder's add (y + y) on one rank, and follows it
# under FSDP 2 and TP 2.
run single_add 1 --training.local_batch_size=8 "${pv[@]}" --model.double_by=add
run single_custom 1 --training.local_batch_size=8 "${pv[@]}" --model.double_by=custom
CURVE_TOL=0 same_curve "one rank: the pack's custom op on the builder's device vs the builder's add (bit-identical)" \
  "$T/single_add/metrics.jsonl" "$T/single_custom/metrics.jsonl" "$STEPS" || exit 1
run fsdp2_custom 2 "${fs[@]}" --model.double_by=custom
run tp2_custom 2 --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2 "${pv[@]}" --model.double_by=custom
for r in fsdp2_custom tp2_custom; do compare single_custom $r "$STEPS" || exit 1; done

# Tensor parallel: q_norm meets head-split q, so each rank's gradient is partial. With
# CT_TP_REPLICATED_PARTIAL it is summed over tp (with and without sequence parallel; also the
# SP-only style under SP, which sums it too); with no rule, or the SP-only style without SP, the
# start is refused naming the parameter (both trained on with wrong gradients before).
tp=(--training.local_batch_size=8 --parallelism.tensor_parallel_degree=2 "${pv[@]}")
nosp=--parallelism.enable_sequence_parallel=false
run tp2 2 "${tp[@]}"
run tp2_nosp 2 "${tp[@]}" $nosp
run tp4 4 --training.local_batch_size=8 --parallelism.tensor_parallel_degree=4 "${pv[@]}"
run tp2_sp_style 2 "${tp[@]}" --model.q_norm_style=sequence_parallel
run fsdp2_tp2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.tensor_parallel_degree=2 "${pv[@]}"
for r in tp2 tp2_nosp tp4 tp2_sp_style fsdp2_tp2; do compare single $r "$STEPS" || exit 1; done
refused() { # name want args...: the start fails with the message
  local name=$1 want=$2 out rc; shift 2
  out=$("$CTITAN" launch -n 2 train "${common[@]}" --job.dump_folder="$T/$name" "$@" 2>&1); rc=$?
  [ $rc -ne 0 ] && echo "$out" | grep -qF "$want" ||
    { echo "$out" | tail -5; fail "$name: status $rc, no clear refusal"; }
  echo "ok   $name refused, status $rc: $(echo "$out" | grep -m1 -oF "$want")"
}
refused tp2_no_rule "rmsnorm applies parameter 'block.q_norm.weight' (tp style none) to activations split over tp (by features, after a column-wise linear): its gradient would be partial" \
  "${tp[@]}" --model.q_norm_style=none
refused tp2_nosp_sp_style "rmsnorm applies parameter 'block.q_norm.weight' (tp style CT_TP_SEQUENCE_PARALLEL) to activations split over tp" \
  "${tp[@]}" $nosp --model.q_norm_style=sequence_parallel
