#!/usr/bin/env bash
# `make bench`: fixed training configs, 2 threads, fp32. Each run measures this machine's sgemm peak
# first and ends with a summary line over the steps after the first two (those touch fresh arena
# memory): tokens/s, achieved GFLOP/s (torchtitan's FLOPs formula) and the ratio to that peak.
# BENCH_ONLY="moe cp" runs only the sections named (dense 124m fsdp float8 tp pp cp plan grouped moe
# memory); unset, every one. CT_PYTHON (default python3) runs the PyTorch reference of the MoE section.
set -euo pipefail
sections=" dense 124m fsdp float8 tp pp cp plan grouped moe memory "
for s in ${BENCH_ONLY:-}; do
  [ "${sections#* $s }" != "$sections" ] || { echo "BENCH_ONLY: unknown section '$s' (known:$sections)" >&2; exit 2; }
done
on() { [ -z "${BENCH_ONLY:-}" ] || [[ " $BENCH_ONLY " == *" $1 "* ]]; }
BUILD=${BUILD:-build}
CTITAN="$BUILD/ctitan"
BUILD=$BUILD scripts/prepare_demo_data.sh >/dev/null
common=(--device.threads=2 --training.mixed_precision_param=float32 --activation_checkpoint.mode=none
        --generate.max_new_tokens=0 --lr_scheduler.warmup_steps=2 --job.dump_folder=outputs/bench)
if on dense; then
  echo "== debugmodel, seq 256, batch 8 (12 steps)"
  "$CTITAN" train configs/llama3_debug.yaml "${common[@]}" --training.seq_len=256 --training.local_batch_size=8 \
    --training.steps=12 --metrics.log_freq=4 | grep -E '^(device|model|summary)'
fi
if on 124m; then
  echo "== 124M-class: dim 768, 12 layers, 12 heads, 4 kv heads, ffn 2048, vocab 32000, seq 512, batch 4 (6 steps)"
  "$CTITAN" train configs/llama3_debug.yaml "${common[@]}" --model.dim=768 --model.n_layers=12 --model.n_heads=12 \
    --model.n_kv_heads=4 --model.ffn_hidden=2048 --model.vocab_size=32000 --training.seq_len=512 \
    --training.local_batch_size=4 --training.steps=6 --metrics.log_freq=1 | grep -E '^(device|model|summary)'
fi
if on fsdp; then
  echo "== FSDP 2 ranks (one thread each), debugmodel, seq 256, global batch 8 (12 steps)"
  "$CTITAN" launch -n 2 train configs/llama3_debug.yaml "${common[@]}" --device.threads=1 --training.seq_len=256 \
    --training.local_batch_size=4 --training.global_batch_size=8 --training.steps=12 --metrics.log_freq=4 \
    --parallelism.data_parallel_shard_degree=2 --job.dump_folder=outputs/bench_fsdp2 | grep -E '^(mesh|summary)'
fi
if on float8; then
  echo "== float8 on the CPU (tensorwise/rowwise: the CPU's scaled fp8 matmuls, dequantise + sgemm; mxfp8: casts + f32 GEMM; all slower than fp32 here)"
  for fmt in none tensorwise rowwise mxfp8; do
    extra=(); [ "$fmt" != none ] && extra=(--quantize.dense.float8.enable=true --quantize.dense.float8.format=$fmt)
    printf '%-11s ' "$fmt"
    "$CTITAN" train configs/llama3_debug.yaml "${common[@]}" "${extra[@]}" --training.seq_len=256 \
      --training.local_batch_size=8 --training.steps=8 --metrics.log_freq=8 --job.dump_folder=outputs/bench_fp8 |
      grep -E '^summary' | sed 's/ GFLOP\/s [a-z0-9:]* matmul peak.*//'
  done
fi
# Tensor parallel on 2 ranks (one thread each): the time rank 0 is blocked in forward TP collectives,
# summed from its trace of steps 6-10 (the tp_comm_fwd ranges), without and with async TP; the share
# async TP hides.
if on tp; then
  echo "== tensor parallel 2 ranks, debugmodel, seq 256, batch 8 (10 steps): forward TP collectives, plain vs async"
  tp_fwd_ms() { awk -F'"ts":' '/"name":"tp_comm_fwd"/ { split($2, a, ","); t = a[1] + 0
      if (/"ph":"B"/) b = t; else s += t - b } END { printf "%.1f", s / 1000 / steps }' steps=5 "$1"; }
  for async in false true; do
    "$CTITAN" launch -n 2 train configs/llama3_debug.yaml "${common[@]}" --device.threads=1 --training.seq_len=256 \
      --training.local_batch_size=8 --training.steps=10 --metrics.log_freq=10 --parallelism.tensor_parallel_degree=2 \
      --parallelism.data_parallel_shard_degree=1 --parallelism.enable_async_tensor_parallel=$async \
      --profiling.enable_profiling=true --profiling.profile_freq=10 --profiling.profiler_active=5 \
      --profiling.profiler_warmup=0 --job.dump_folder=outputs/bench_tp_$async | grep -E '^summary: (tp axis|[0-9])' \
      | sed 's/ GFLOP\/s [a-z0-9:]* matmul peak.*//'
    printf '%s\n' "$(tp_fwd_ms outputs/bench_tp_$async/profile_traces/iteration_10/rank0_trace.json)" >outputs/bench_tp_$async/fwd_ms
  done
  awk -v p="$(cat outputs/bench_tp_false/fwd_ms)" -v a="$(cat outputs/bench_tp_true/fwd_ms)" 'BEGIN {
    printf "async TP: rank 0 blocked %.1f ms per step in forward TP collectives (plain: %.1f ms): %.0f%% of it hidden\n",
           a, p, (p > 0 ? 100 * (1 - a / p) : 0) }'
fi
# Pipeline parallel: the measured bubble (time outside stage work) against the schedule's prediction
if on pp; then
  echo "== pipeline parallel, debugmodel, seq 256, 8 microbatches of 1 (8 steps); pp 4 runs 4 ranks on this machine's cores"
  for pp in 2 4; do
    for sched in 1F1B Interleaved1F1B; do
      printf 'pp %d %-16s ' $pp $sched
      "$CTITAN" launch -n $pp train configs/llama3_debug.yaml "${common[@]}" --device.threads=1 --training.seq_len=256 \
        --training.local_batch_size=8 --training.steps=8 --metrics.log_freq=8 --parallelism.pipeline_parallel_degree=$pp \
        --parallelism.data_parallel_shard_degree=1 --parallelism.pipeline_parallel_schedule=$sched \
        --parallelism.pipeline_parallel_layers_per_stage=$([ $sched = 1F1B ] && echo 0 || echo $((8 / (2 * pp)))) \
        --job.dump_folder=outputs/bench_pp | grep -E '^summary: pipeline' | sed 's/^summary: pipeline //'
    done
  done
fi
# Context parallel: each rank's activation memory (the largest rank's live peak from metrics.jsonl)
# against cp, tokens/s per rank, the time a rank is blocked on the cp axis per step (the summary), and
# for the ring the share of that blocking its overlap hides: 1 - blocked / blocked with
# context_parallel_ring_overlap false (each transfer waited for before the attention it could hide behind).
if on cp; then
  echo "== context parallel, debugmodel, seq 2048, batch 1 (6 steps): activation memory per rank and tokens/s against cp"
  mkdir -p outputs
  for cfg in 1:allgather:on 2:allgather:on 2:alltoall:on 2:alltoall:off 4:allgather:on 4:alltoall:on 4:alltoall:off; do
    IFS=: read -r cp method ovl <<<"$cfg"
    dir=outputs/bench_cp_${cp}_${method}_$ovl
    rm -rf "$dir"
    if [ "$cp" = 1 ]; then run=("$CTITAN"); else run=("$CTITAN" launch -n "$cp"); fi
    "${run[@]}" train configs/llama3_debug.yaml "${common[@]}" --device.threads=$((cp == 1 ? 2 : 1)) \
      --training.seq_len=2048 --training.local_batch_size=1 --training.steps=6 --metrics.log_freq=1 \
      --parallelism.context_parallel_degree="$cp" --parallelism.context_parallel_rotate_method="$method" \
      --parallelism.context_parallel_ring_overlap=$([ "$ovl" = on ] && echo true || echo false) \
      --job.dump_folder="$dir" >"$dir.log" 2>&1 || { tail -3 "$dir.log"; exit 1; }
    blocked=$(sed -n 's/^summary: cp axis: \([0-9.]*\) ms per step blocked.*/\1/p' "$dir.log"); blocked=${blocked:-0}
    echo "$blocked" >"$dir.blocked"
    python3 - "$dir/metrics.jsonl" "$cp" "$method" "$ovl" "$blocked" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
act = max(r["memory"].get("activations_live_peak", 0) for r in recs) / 2**20
tps = sorted(r["tps"] for r in recs[2:])[len(recs[2:]) // 2]
print("cp %s %-9s overlap %-3s activations (live peak, largest rank) %7.1f MiB  %6.0f tokens/s per rank  "
      "cp axis blocked %6.2f ms per step" % (sys.argv[2], sys.argv[3], sys.argv[4], act, tps, float(sys.argv[5])))
PY
  done
  for cp in 2 4; do
    awk -v on="$(cat outputs/bench_cp_${cp}_alltoall_on.blocked)" -v off="$(cat outputs/bench_cp_${cp}_alltoall_off.blocked)" \
        -v cp=$cp 'BEGIN { printf "ring, cp %d: blocked %.2f ms per step with overlap, %.2f without: %.0f%% of the ring'"'"'s blocking hidden\n",
                           cp, on, off, (off > 0 ? 100 * (1 - on / off) : 0) }'
  done
fi
# The planner (`ctitan plan --search`): the top layouts for 8B on 8 and 70B on 256 H100 SXM, and the
# wall time of a 405B search over 4096 GPUs (the issue's bound: under 10 s; no test holds it to that)
if on plan; then
  echo "== planner: llama3 8B on 8 and 70B on 256 H100 SXM (top layouts); 405B over 4096 GPUs (search wall time)"
  if "$CTITAN" plan --help >/dev/null 2>&1; then
    for mg in 8b:8 70b:256; do
      echo "-- llama3 ${mg%%:*} on ${mg#*:} GPUs (h100-sxm)"
      "$CTITAN" plan "configs/llama3_${mg%%:*}.yaml" --hardware h100-sxm --gpus "${mg#*:}" --search --top 3
    done
    mkdir -p outputs
    t0=$(date +%s.%N)
    "$CTITAN" plan configs/llama3_405b.yaml --hardware h100-sxm --gpus 4096 --search >outputs/bench_plan_405b.txt
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "plan --search, llama3 405B over 4096 H100 SXM: %.2f s wall (bound: 10 s)\n", b - a }'
    grep -m1 'layout:' outputs/bench_plan_405b.txt | sed 's/^ *layout:/its best layout:/'
  else
    echo "ctitan plan is not in this build: skipped"
  fi
fi
# The MoE experts' grouped GEMMs (ABI 2.14) against one dense sgemm of the same size, 2 threads
if on grouped; then
  echo "== grouped GEMM (MoE experts, 8 uneven segments) against one dense sgemm of the same size"
  cc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -Isdk/include -o "$BUILD/bench_grouped_matmul" \
    tests/bench/bench_grouped_matmul.c -ldl
  CT_BENCH_THREADS=2 "$BUILD/bench_grouped_matmul" "$BUILD/plugins/ctitan-cpu.so"
fi
# Mixture of experts: qwen3's debugmodel_moe at full width (dim 256, 64 experts of hidden 768, top-8,
# vocab 2048) in one block, so that a run takes about half a minute on 2 cores; one rank, expert
# parallel on 2 ranks (32 experts each, the rows exchanged by all-to-all), and forced balance (every
# expert gets the same rows). GFLOP/s counts the top_k experts a token visits (the pack's describe,
# torchtitan's MoE formula). Then transformers' Qwen3MoeForCausalLM on the same sizes, 2 threads.
if on moe; then
  echo "== MoE: qwen3 debugmodel_moe, 1 block (64 experts of 768, top-8), seq 256, batch 8 (6 steps): one rank, EP 2, forced balance; PyTorch"
  moe=(--model.name=qwen3 --model.flavor=debugmodel_moe --model.n_layers=1 --training.seq_len=256
       --training.steps=6 --metrics.log_freq=6)
  printf '%-22s ' "one rank"
  "$CTITAN" train configs/llama3_debug.yaml "${common[@]}" "${moe[@]}" --training.local_batch_size=8 \
    --job.dump_folder=outputs/bench_moe | grep -E '^summary'
  printf '%-22s ' "EP 2 (1 thread each)"
  "$CTITAN" launch -n 2 train configs/llama3_debug.yaml "${common[@]}" "${moe[@]}" --device.threads=1 \
    --training.local_batch_size=4 --training.global_batch_size=8 --parallelism.expert_parallel_degree=2 \
    --parallelism.data_parallel_shard_degree=2 --job.dump_folder=outputs/bench_moe_ep2 | grep -E '^summary'
  printf '%-22s ' "forced balance"
  "$CTITAN" train configs/llama3_debug.yaml "${common[@]}" "${moe[@]}" --training.local_batch_size=8 \
    --model.moe_force_load_balance=true --job.dump_folder=outputs/bench_moe_balanced | grep -E '^summary'
  py=${CT_PYTHON:-python3}
  if "$py" -c 'import torch, transformers' 2>/dev/null; then
    "$py" bench/torch_qwen3_moe.py --layers 1 --seq 256 --batch 8 --steps 6 --threads 2
  else
    echo "PyTorch reference skipped: $py cannot import torch and transformers (set CT_PYTHON)"
  fi
fi
# Training memory against PyTorch on the CPU (PyTorch's side where it is installed)
if on memory; then
  BUILD=$BUILD scripts/bench_memory.sh
fi
