#!/usr/bin/env bash
# docs/observability.md's loss plot: four short runs of a tiny Llama on the test corpus (one rank in fp32, FSDP
# over 2 ranks in bf16, FSDP 2 x TP 2 in bf16, one rank with float8 rowwise linears), drawn by
# `ctitan plot` against tokens.
#   scripts/make_readme_plot.sh [OUT.png|OUT.svg]    (default docs/img/loss_layouts.png)
# CTITAN names the binary (default build/ctitan); KEEP=DIR keeps the runs in DIR.
set -euo pipefail
CTITAN=${CTITAN:-build/ctitan}
OUT=${1:-docs/img/loss_layouts.png}
T=${KEEP:-$(mktemp -d)}; [ -n "${KEEP:-}" ] || trap 'rm -rf "$T"' EXIT; mkdir -p "$T"
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.tokenizer_path="$T/tok.model"
      --model.vocab_size=512 --model.n_layers=2 --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2
      --training.seq_len=64 --training.global_batch_size=8 --training.steps=40 --lr_scheduler.warmup_steps=4
      --metrics.log_freq=1 --generate.max_new_tokens=0 --device.threads=1 --activation_checkpoint.mode=none)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  local cmd=("$CTITAN" train); [ "$n" -gt 1 ] && cmd=("$CTITAN" launch -n "$n" train)
  "${cmd[@]}" "${base[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1 ||
    { tail -5 "$T/$name.log" >&2; echo "make_readme_plot: the $name run failed" >&2; exit 1; }
}
run one 1 --training.local_batch_size=8
run fsdp 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 --training.mixed_precision_param=bfloat16
run fsdp_tp 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 --parallelism.tensor_parallel_degree=2 \
  --training.mixed_precision_param=bfloat16
run float8 1 --training.local_batch_size=8 --quantize.dense.float8.enable=true --quantize.dense.float8.format=rowwise
mkdir -p "$(dirname "$OUT")"
"$CTITAN" plot "$T/one" "$T/fsdp" "$T/fsdp_tp" "$T/float8" --x tokens --size 720x400 \
  --title "Tiny Llama, 40 steps: the same loss under each layout" --output "$OUT"
