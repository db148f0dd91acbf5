#!/usr/bin/env bash
# `make bench`: fixed training configs, 2 threads, fp32. Each run measures this machine's sgemm peak
# first and ends with a summary line over the steps after the first two (those touch fresh arena
# memory): tokens/s, achieved GFLOP/s (torchtitan's FLOPs formula) and the ratio to that peak.
set -euo pipefail
BUILD=${BUILD:-build}
CTITAN="$BUILD/ctitan"
BUILD=$BUILD scripts/prepare_demo_data.sh >/dev/null
common=(--device.threads=2 --training.mixed_precision_param=float32 --activation_checkpoint.mode=none
        --generate.max_new_tokens=0 --lr_scheduler.warmup_steps=2 --job.dump_folder=outputs/bench)
echo "== debugmodel, seq 256, batch 8 (12 steps)"
"$CTITAN" train configs/llama3_debug.yaml "${common[@]}" --training.seq_len=256 --training.local_batch_size=8 \
  --training.steps=12 --metrics.log_freq=4 | grep -E '^(device|model|summary)'
echo "== 124M-class: dim 768, 12 layers, 12 heads, 4 kv heads, ffn 2048, vocab 32000, seq 512, batch 4 (6 steps)"
"$CTITAN" train configs/llama3_debug.yaml "${common[@]}" --model.dim=768 --model.n_layers=12 --model.n_heads=12 \
  --model.n_kv_heads=4 --model.ffn_hidden=2048 --model.vocab_size=32000 --training.seq_len=512 \
  --training.local_batch_size=4 --training.steps=6 --metrics.log_freq=1 | grep -E '^(device|model|summary)'
echo "== FSDP 2 ranks (one thread each), debugmodel, seq 256, global batch 8 (12 steps)"
"$CTITAN" launch -n 2 train configs/llama3_debug.yaml "${common[@]}" --device.threads=1 --training.seq_len=256 \
  --training.local_batch_size=4 --training.global_batch_size=8 --training.steps=12 --metrics.log_freq=4 \
  --parallelism.data_parallel_shard_degree=2 --job.dump_folder=outputs/bench_fsdp2 | grep -E '^(mesh|summary)'
echo "== float8 (CPU emulation: each GEMM operand is cast to the fp8 grid, then an f32 GEMM; slower than fp32 here)"
for fmt in none tensorwise rowwise mxfp8; do
  extra=(); [ "$fmt" != none ] && extra=(--quantize.dense.float8.enable=true --quantize.dense.float8.format=$fmt)
  printf '%-11s ' "$fmt"
  "$CTITAN" train configs/llama3_debug.yaml "${common[@]}" "${extra[@]}" --training.seq_len=256 \
    --training.local_batch_size=8 --training.steps=8 --metrics.log_freq=8 --job.dump_folder=outputs/bench_fp8 |
    grep -E '^summary' | sed 's/ GFLOP\/s measured.*//'
done
