#!/usr/bin/env bash
# Pipeline parallel computes the same function as one rank: llama3 debugmodel at half width (fp32), same seed and
# global batch, real MPI ranks. PP 2 with every shipped schedule (the zero-bubble ones with full
# activation checkpointing, DualPipeV without, as torchtitan runs it), PP 4 with Interleaved1F1B, a CSV
# schedule, a CSV with two stages per rank (the count taken from the file), explicit units per stage, PP 2 x FSDP 2 and PP 2 x FSDP 2 x TP 2 on 8 ranks: 20-step loss
# and grad-norm curves within 1e-6 (relative) of the single rank; under bf16 compute 1F1B, Interleaved1F1B and
# ZBVZeroBubble within 1e-6 of one rank's bf16 run with the same microbatches. Also: 1F1B holds fewer microbatches
# than GPipe, a checkpoint saved under PP 2 resumes on one rank, an unknown schedule lists the
# loadable ones, and a broken CSV is refused at start-up naming the rank and the action.
set -u
STEPS=${PP_STEPS:-20}
. tests/cli/lib/layouts.sh
common+=("${narrow[@]}") # debugmodel at half width: the layouts' arithmetic, a third of the time
pp=(--training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1)
run single 1 --training.local_batch_size=8
for s in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble DualPipeV; do
  ac=none; case $s in *ZeroBubble) ac=full ;; esac # split backward halves with recomputed units
  run "pp2_$s" 2 "${pp[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=$s \
    --activation_checkpoint.mode=$ac
  compare single "pp2_$s" "$STEPS" || exit 1
done
run pp4_interleaved 4 "${pp[@]}" --parallelism.pipeline_parallel_degree=4 \
  --parallelism.pipeline_parallel_schedule=interleaved_1f1b --parallelism.pipeline_parallel_layers_per_stage=1
grep -q "Interleaved1F1B, 8 stages on 4 ranks (2 per rank)" "$T/pp4_interleaved.log" || fail "pp4: not 8 stages of Interleaved1F1B"
compare single pp4_interleaved "$STEPS" || exit 1
# a hand-written schedule: GPipe's order with the backward of microbatch 0 first on each rank
printf '0F0,0F1,0F2,0F3,0F4,0F5,0F6,0F7,0B0,0B1,0B2,0B3,0B4,0B5,0B6,0B7\n1F0,1F1,1F2,1F3,1F4,1F5,1F6,1F7,1B0,1B1,1B2,1B3,1B4,1B5,1B6,1B7\n' >"$T/mine.csv"
run pp2_csv 2 "${pp[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=csv \
  --parallelism.pipeline_parallel_schedule_csv="$T/mine.csv"
compare single pp2_csv "$STEPS" || exit 1
# a CSV naming 4 stages on 2 ranks (2 per rank, stage s on rank s % 2: looped breadth-first), given the
# way torchtitan's tests give theirs (PipelineScheduleMulti, no split named): the stages come from the file
row() { local s m out=""; for s in "$@"; do for m in 0 1 2 3 4 5 6 7; do out+="${out:+,}$s"; out+="$m"; done; done; echo "$out"; }
{ row 0F 2F 2B 0B; row 1F 3F 3B 1B; } >"$T/two_per_rank.csv"
run pp2_csv_multi 2 "${pp[@]}" --parallelism.pipeline_parallel_degree=2 \
  --parallelism.pipeline_parallel_schedule=PipelineScheduleMulti --parallelism.pipeline_parallel_schedule_csv="$T/two_per_rank.csv"
grep -q "4 stages on 2 ranks (2 per rank)" "$T/pp2_csv_multi.log" || fail "pp2_csv_multi: the stages did not come from the CSV"
compare single pp2_csv_multi "$STEPS" || exit 1
run pp2_units 2 "${pp[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_stage_units=2,6 \
  --parallelism.pipeline_parallel_microbatch_size=2
grep -q "stage 0 (rank 0): units 0-1" "$T/pp2_units.log" || fail "pp2_units: stage split not as asked"
compare single pp2_units "$STEPS" || exit 1
run pp2_fsdp2 4 --training.local_batch_size=4 --parallelism.pipeline_parallel_degree=2 \
  --parallelism.data_parallel_shard_degree=2 --checkpoint.enable=true --checkpoint.interval=10
grep -q "pp 2, dp_replicate 1, dp_shard 2, cp 1, tp 1; strategy fsdp" "$T/pp2_fsdp2.log" || fail "pp2_fsdp2 layout"
compare single pp2_fsdp2 "$STEPS" || exit 1
# bf16 compute: each microbatch context holds its units' activations in bf16 (1F1B, Interleaved1F1B),
# a schedule that splits backward rounds them where they are (ZBVZeroBubble, full AC): each follows
# one rank's bf16 run with the same 8 microbatches within 1e-6 (bit for bit here). That run and the
# one-microbatch run are the floor of the bf16 bound (tests/cli/lib/curves.sh): the same function,
# summed in another order, then rounded to bf16
bf=--training.mixed_precision_param=bfloat16
run single_bf16 1 --training.local_batch_size=8 $bf
run single_bf16_mb8 1 --training.local_batch_size=1 $bf
run single_bf16_mb8_full 1 --training.local_batch_size=1 $bf --activation_checkpoint.mode=full
CURVE_TOL=$CURVE_TOL_BF16 compare single_bf16 single_bf16_mb8 "$STEPS" || exit 1
for s in 1F1B Interleaved1F1B ZBVZeroBubble; do
  ac=none ref=single_bf16_mb8; case $s in *ZeroBubble) ac=full ref=single_bf16_mb8_full ;; esac
  run "pp2_${s}_bf16" 2 "${pp[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=$s \
    --activation_checkpoint.mode=$ac $bf
  compare $ref "pp2_${s}_bf16" "$STEPS" || exit 1
done
run pp2_fsdp2_tp2 8 --training.local_batch_size=4 --parallelism.pipeline_parallel_degree=2 \
  --parallelism.data_parallel_shard_degree=2 --parallelism.tensor_parallel_degree=2
grep -q "pp 2, dp_replicate 1, dp_shard 2, cp 1, tp 2; strategy fsdp" "$T/pp2_fsdp2_tp2.log" || fail "3D layout"
compare single pp2_fsdp2_tp2 "$STEPS" || exit 1

# memory: 1F1B keeps at most pp microbatches' activations, GPipe all of them
held() { sed -n 's/.*at most \([0-9]*\) microbatches held on rank 0.*/\1/p' "$T/$1.log"; }
g=$(held pp2_GPipe); o=$(held pp2_1F1B)
[ -n "$g" ] && [ -n "$o" ] && [ "$o" -lt "$g" ] || fail "microbatches held: 1F1B '$o' vs GPipe '$g'"
echo "ok   microbatches held on rank 0: GPipe $g, 1F1B $o"

# the PP 2 x FSDP 2 checkpoint of step 10 continues on one rank
mkdir -p "$T/resume/checkpoint" && cp -r "$T/pp2_fsdp2/checkpoint/step-10" "$T/resume/checkpoint/"
run resume 1 --training.local_batch_size=8 --checkpoint.enable=true
grep -q "resuming after step 10" "$T/resume.log" || fail "resume: did not resume"
same_curve "resume: PP 2 x FSDP 2 step-10 checkpoint continued on one rank" "$T/pp2_fsdp2/metrics.jsonl" \
  "$T/resume/metrics.jsonl" $((STEPS - 10)) 11 || exit 1

# bad settings stop every rank before any step
out=$("$CTITAN" launch -n 2 train "${common[@]}" "${pp[@]}" --parallelism.pipeline_parallel_degree=2 \
      --parallelism.pipeline_parallel_schedule=Interleaved2F2B 2>&1); st=$?
[ $st -eq 2 ] && echo "$out" | grep -q "1F1B" && echo "$out" | grep -q "ZBVZeroBubble" || { echo "$out" | tail -4; fail "unknown schedule"; }
echo "ok   unknown schedule (status 2): $(echo "$out" | grep -m1 pipeline_parallel_schedule | cut -c1-160)"
printf '0F0,0F1,0B0\n1F0,1F1,1B0,1B1\n' >"$T/broken.csv"
out=$("$CTITAN" launch -n 2 train "${common[@]}" --training.local_batch_size=2 --training.global_batch_size=2 \
      --parallelism.data_parallel_shard_degree=1 --parallelism.pipeline_parallel_degree=2 \
      --parallelism.pipeline_parallel_schedule=csv --parallelism.pipeline_parallel_schedule_csv="$T/broken.csv" 2>&1); st=$?
[ $st -eq 2 ] && echo "$out" | grep -q "rank 0" && echo "$out" | grep -q "0B1" || { echo "$out" | tail -4; fail "broken csv"; }
echo "ok   broken CSV (status 2): $(echo "$out" | grep -m1 'schedule_csv' | cut -c1-160)"
