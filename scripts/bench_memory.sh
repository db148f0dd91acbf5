#!/usr/bin/env bash
# Training memory on the CPU, ctitan against PyTorch (make bench's last section; alone:
# scripts/bench_memory.sh). Each configuration trains 2 steps in a process of its own, run with
# MALLOC_MMAP_THRESHOLD_=65536 so that glibc hands every freed block above 64 KiB back to the
# kernel and the resident set's peak (ru_maxrss) follows what the program has allocated; a
# program's figure is that peak minus the peak of the same program training a tiny model (its
# libraries, interpreter and thread pools). Shapes: the debug model at seq 2048 x batch 8 and the
# 124M-class shape (dim 768, 12 layers, 12 heads, 4 kv heads, ffn 2048, vocab 32000) at seq 1024 x
# batch 4; activation checkpointing none, op (torchtitan's per-op policy) and full; fp32 and bf16
# (ctitan: training.mixed_precision_param bfloat16; PyTorch: f32 parameters under
# torch.autocast("cpu", torch.bfloat16), bench/torch_llama3.py). PyTorch's side runs where
# `$PYTHON -c "import torch"` works (PYTHON defaults to python3); otherwise ctitan's alone.
# SHAPES="debug" or "124m" picks one shape, DTYPES="float32" or "bfloat16" one precision.
set -euo pipefail
BUILD=${BUILD:-build}
CTITAN="$BUILD/ctitan"
PY=${PYTHON:-python3}
SHAPES=${SHAPES:-"debug 124m"}
DTYPES=${DTYPES:-"float32 bfloat16"}
BUILD=$BUILD scripts/prepare_demo_data.sh >/dev/null
export MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=2
torch_ok=0
"$PY" -c "import torch" 2>/dev/null && torch_ok=1

# peak resident KiB of a command (its output to $2), via the parent's view of its child
peak_kib() {
  local log=$1
  shift
  python3 -c 'import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:], stdout=open(sys.argv[1], "w"), stderr=subprocess.STDOUT).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else -1)' "$log" "$@"
}
ct() { # ac (none, op or full) dtype args...
  local ac=(--activation_checkpoint.mode="$1") dt=$2
  [ "$1" = op ] && ac=(--activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=op)
  shift 2
  peak_kib outputs/bench_mem/ctitan.log "$CTITAN" train configs/llama3_debug.yaml --device.threads=2 \
    --generate.max_new_tokens=0 --training.steps=2 --metrics.log_freq=1 --job.dump_folder=outputs/bench_mem \
    "${ac[@]}" --training.mixed_precision_param="$dt" "$@"
}
pt() { # ac dtype args...: the script's own resident peak at the end of its training steps (its
  # exit loads more libraries than a tiny model trains with, which would inflate the baseline)
  local ac=$1 dt=$2
  shift 2
  [ "$(peak_kib outputs/bench_mem/torch.log "$PY" bench/torch_llama3.py --device cpu --steps 2 --warmup 0 \
    --ac "$ac" --dtype "$dt" --peak-tflops 1 "$@")" -gt 0 ] || { echo -1; return; }
  sed -n 's/.* status=ok .*peak_mem_mib=\([0-9.]*\).*/\1/p' outputs/bench_mem/torch.log |
    awk '{ printf "%d\n", $1 * 1024 } END { if (!NR) print -1 }'
}
mkdir -p outputs/bench_mem
tiny_ct=(--model.dim=64 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_hidden=192
         --model.vocab_size=2048 --training.seq_len=32 --training.local_batch_size=1)
echo "== training memory on the CPU against PyTorch: resident peak minus the program's own tiny-model run, MiB (2 steps, 2 threads)"
for dt in $DTYPES; do
  short=$([ $dt = float32 ] && echo fp32 || echo bf16)
  base_ct=$(ct none $dt "${tiny_ct[@]}")
  base_pt=0
  [ $torch_ok = 1 ] && base_pt=$(pt none $short --flavor tiny --seq 32 --batch 1)
  for shape in $SHAPES; do
    if [ "$shape" = debug ]; then
      what="debugmodel seq 2048 x 8"
      sargs=(--model.vocab_size=2048 --training.seq_len=2048 --training.local_batch_size=8)
      pargs=(--flavor debugmodel --seq 2048 --batch 8)
    else
      what="124M-class seq 1024 x 4"
      sargs=(--model.dim=768 --model.n_layers=12 --model.n_heads=12 --model.n_kv_heads=4 --model.ffn_hidden=2048
             --model.vocab_size=32000 --training.seq_len=1024 --training.local_batch_size=4)
      pargs=(--flavor 124M --seq 1024 --batch 4)
    fi
    for ac in none op full; do
      m_ct=$(ct $ac $dt "${sargs[@]}")
      [ "$m_ct" -gt 0 ] || { tail -3 outputs/bench_mem/ctitan.log; echo "ctitan failed: $what $short ac $ac"; exit 1; }
      line=$(awk -v c="$m_ct" -v b="$base_ct" 'BEGIN { printf "ctitan %7.1f", (c - b) / 1024 }')
      if [ $torch_ok = 1 ]; then
        m_pt=$(pt $ac $short "${pargs[@]}")
        [ "$m_pt" -gt 0 ] && grep -q 'status=ok' outputs/bench_mem/torch.log ||
          { tail -3 outputs/bench_mem/torch.log; echo "PyTorch failed: $what $short ac $ac"; exit 1; }
        line=$(awk -v l="$line" -v c="$m_ct" -v b="$base_ct" -v p="$m_pt" -v q="$base_pt" 'BEGIN {
          printf "%s  pytorch %7.1f  ratio %.2f", l, (p - q) / 1024, (c - b) / (p - q) }')
      else
        line="$line  pytorch (not installed)"
      fi
      printf '%-24s %s ac %-4s  %s\n' "$what" "$short" "$ac" "$line"
    done
  done
done
