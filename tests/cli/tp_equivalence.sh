#!/usr/bin/env bash
# Tensor parallel computes the same function as one rank: llama3 debugmodel at half width (fp32), same seed, same
# global batch, real MPI ranks. TP 2, TP 4, TP 2 without sequence parallel, TP 2 with async TP,
# TP 2 without loss parallel, TP 2 with full activation checkpointing, FSDP 2 x TP 2 and ZeRO-2 x TP 2
# (whole compute storage: tp leaves the parameters where the host pointed them) on 4 ranks:
# 20-step loss and grad-norm curves within 1e-6 (relative) of the single rank. Per-rank
# memory of the split matrices is 1/N (counters), a checkpoint saved under FSDP 2 x TP 2 resumes on
# one rank, and a degree that does not divide the heads is refused at start-up. Last, an
# operation-level strategy written out of tree (sdk/examples/mlp_tp: the feed-forward blocks only),
# built with nothing but the pkg-config file and named by path as the tp axis's strategy, trains on
# 2 ranks to the same curve with its feed-forward memory halved. Under bf16 compute TP 2 (the head and its
# loss in blocks under loss parallel) and TP 2 without loss parallel follow one rank within the bf16 bound.
set -u
. tests/cli/lib/layouts.sh
common+=("${narrow[@]}") # debugmodel at half width: the layouts' arithmetic, a third of the time
tp=(--training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1)
run single 1 --training.local_batch_size=8
run tp2 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2
run tp4 4 "${tp[@]}" --parallelism.tensor_parallel_degree=4
run tp2_nosp 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.enable_sequence_parallel=false
run tp2_async 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.enable_async_tensor_parallel=true
run tp2_noloss 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.disable_loss_parallel=true
run tp2_ac 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2 --activation_checkpoint.mode=full
run fsdp2_tp2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
    --parallelism.tensor_parallel_degree=2 --checkpoint.enable=true --checkpoint.interval=10
run tp2_zero2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
    --parallelism.tensor_parallel_degree=2 --parallelism.dp_strategy=zero2
grep -q "tp 4; strategy none" "$T/tp4.log" || fail "tp4 did not run with tp 4"
grep -q "dp_shard 2, cp 1, tp 2; strategy fsdp" "$T/fsdp2_tp2.log" || fail "fsdp2_tp2 did not run FSDP x TP"
grep -q "dp_shard 2, cp 1, tp 2; strategy zero2" "$T/tp2_zero2.log" || fail "tp2_zero2 did not run ZeRO-2 x TP"
for r in tp2 tp4 tp2_nosp tp2_async tp2_noloss tp2_ac fsdp2_tp2 tp2_zero2; do compare single $r 20 || exit 1; done
# bf16 compute: loss parallel runs the output head and its loss as one op in blocks of rows
# (linear_cross_entropy), holding less than the two ops do; both follow one rank's bf16 curve within
# the bf16 bound (tests/cli/lib/curves.sh)
bf=--training.mixed_precision_param=bfloat16
run single_bf16 1 --training.local_batch_size=8 $bf
run tp2_bf16 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2 $bf
run tp2_noloss_bf16 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.disable_loss_parallel=true $bf
for r in tp2_bf16 tp2_noloss_bf16; do CURVE_TOL=$CURVE_TOL_BF16 compare single_bf16 $r 20 || exit 1; done
act() { step_records "$1" | tail -1 | sed 's/.*"activations": \([0-9]*\).*/\1/'; }
awk -v a="$(act tp2_bf16)" -v b="$(act tp2_noloss_bf16)" 'BEGIN { ok = a > 0 && a < b
  printf "%s tp2 bf16: the blocked loss-parallel head holds %d bytes of activations, the gathered logits %d\n",
         ok ? "ok  " : "FAIL", a, b; exit !ok }' || exit 1

# memory: parameters + gradients + AdamW states per rank under TP N, against the single rank. The norm
# weights stay whole, so the ratio is a little above 1/N; the split matrices are exactly 1/N.
single=$(mem single)
for n in 2 4; do
  got=$(mem tp$n)
  # llama3 debugmodel at dim 128, 6 layers; whole (not split) per rank: 13 norm weights of 128 floats,
  # x 3 (param, grad, two AdamW states = 4 copies in all), each 64-byte aligned
  awk -v s="$single" -v g="$got" -v n=$n 'BEGIN { whole = 13 * 128 * 4 * 4; want = (s - whole) / n + whole; r = g / want
    printf "%s  tp%d: params+grads+optimizer %d bytes per rank; split matrices at 1/%d predict %d (ratio %.4f)\n",
           (r > 0.99 && r < 1.01) ? "ok  " : "FAIL", n, g, n, want, r; exit !(r > 0.99 && r < 1.01) }' || exit 1
done

# the checkpoint saved at step 10 under FSDP 2 x TP 2 continues on one rank along the same curve
mkdir -p "$T/resume/checkpoint" && cp -r "$T/fsdp2_tp2/checkpoint/step-10" "$T/resume/checkpoint/"
"$CTITAN" train "${common[@]}" --training.local_batch_size=8 --job.dump_folder="$T/resume" --checkpoint.enable=true \
  >"$T/resume.log" 2>&1 || { tail "$T/resume.log"; fail "resume on one rank"; }
grep -q "resuming after step 10" "$T/resume.log" || fail "resume: did not resume"
same_curve "resume: FSDP 2 x TP 2 step-10 checkpoint continued on one rank" "$T/fsdp2_tp2/metrics.jsonl" \
  "$T/resume/metrics.jsonl" 10 11 || exit 1

# a degree that does not divide the heads is refused at start-up
out=$("$CTITAN" launch -n 3 train "${common[@]}" --training.local_batch_size=8 --training.seq_len=63 \
      --parallelism.tensor_parallel_degree=3 2>&1); st=$?
[ $st -ne 0 ] || fail "tp 3 was accepted"
echo "$out" | grep -q "tensor_parallel_degree 3 must divide the attention heads" || { echo "$out" | tail -5; fail "tp 3 message"; }
echo "ok   tp 3 refused: $(echo "$out" | grep -m1 'must divide' | sed 's/^\[rank [0-9]*\] //')"

# an out-of-tree operation-level strategy: built with pkg-config alone, serving the tp axis by path
ROOT=$(pwd)
[ -f "$BUILD/ctitan-sdk.pc" ] || fail "$BUILD/ctitan-sdk.pc is missing (run make)"
cp -r sdk/examples/mlp_tp "$T/mlp_tp" && rm -f "$T"/mlp_tp/*.so
env -u MAKEFLAGS -u MFLAGS -u CFLAGS -u CPPFLAGS -u LDFLAGS PKG_CONFIG_PATH="$ROOT/$BUILD" \
  make --no-print-directory -C "$T/mlp_tp" >"$T/make.log" 2>&1 || { cat "$T/make.log"; fail "mlp_tp: out-of-tree build"; }
run mlp_tp2 2 "${tp[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.tp_strategy="$T/mlp_tp/mlp_tp.so"
grep -q "tp 2; strategy none" "$T/mlp_tp2.log" || fail "mlp_tp2 did not run with tp 2"
compare single mlp_tp2 20 || exit 1
# the feed-forward weights (3 x 6 layers of 384 x 128 at this width) halved, the rest whole
awk -v s="$single" -v g="$(mem mlp_tp2)" 'BEGIN { ffn = 3 * 6 * 384 * 128 * 4 * 4; want = s - ffn / 2; r = g / want
  printf "%s  mlp_tp 2 (out of tree, by path): params+grads+optimizer %d bytes per rank; halved feed-forward predicts %d (ratio %.4f)\n",
         (r > 0.99 && r < 1.01) ? "ok  " : "FAIL", g, want, r; exit !(r > 0.99 && r < 1.01) }' || exit 1
