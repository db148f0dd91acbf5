#!/usr/bin/env bash
# cuda_emulated: the CUDA plugin's own code, its C files and its kernels (plugins/cuda/), run on
# the CPU against the whole device conformance suite, under AddressSanitizer and UBSan.
#
# tests/cuda_emu stands in for the GPU: a CUDA runtime whose device memory is host memory, a
# kernel launch that runs every block in turn with one host thread per CUDA thread (real
# barriers for __syncthreads and warp shuffles), cuBLAS/cuBLASLt as an OpenBLAS sgemm, CUB's
# radix sort as a stable sort (see tests/cuda_emu/cuda_emu.h for what it can and cannot show).
# The .cu files are compiled by g++ after two rewrites (launches and dynamic shared memory), the
# plugin's C files as they are, against the stand-in headers: tests/cuda_emu/emu.mk (`make cuda-emu`).
#
#   (a) the emulated plugin passes every test of tests/unit/test_device_conformance.c (ABI 1.0,
#       float8 and tensor-parallel ops, 1.4's fp8 GEMM, bf16 operands and shared stream, 1.5's
#       device-resident loss ops and graph capture, 2.1's elementwise ops, 2.3's rope at positions
#       and attention by blocks with its merge, 2.4's rope with a frequency table, 2.9's copies
#       beside the work on a second stream ordered by events, 2.10's AdamW with bf16 moments, 2.13's
#       block-causal attention over packed documents and its merge by blocks, 2.14's
#       mixture-of-experts routing, permutation and grouped GEMMs), with
#       ASan/UBSan on the kernels and the host code;
#   (b) again with cuBLASLt finding no algorithm (the cublasSgemm fallback), and with cudaMalloc
#       failing past 228 MiB live (the allocator's trim-and-retry);
#   (c) with no device, create fails with "no CUDA device is visible";
#   (d) tests/cuda_emu/cross_check against the CPU plugin at Llama's shapes (attention at head dims
#       48, 64, 128 over several tiles, cross-entropy over 128256 columns, ...), twice for bits;
#       the seven ew_* ops over a million elements, bit for bit the CPU's; a context-parallel
#       rank's ring of attention blocks (2 to 4 ranks, positions shuffled), merged, and its backward;
#       rope with Llama 3.1's scaled table, at rows 0..t-1 and at positions past 120000; block-causal
#       attention over packed documents, whole rows and shuffled query and key halves; a
#       DeepSeek-V3-shaped MoE layer forward and backward, its routing identical to the CPU's;
#   (e) compile.enable: ctitan train with the emulated plugin, the microbatch captured as a CUDA
#       graph and launched, against the eager run (f32; block-causal attention over packed
#       documents; bf16 with checkpointing; a refused capture).
set -euo pipefail

BUILD=${BUILD:-build}
if [ "$BUILD" = build-san ]; then # it builds its own ASan/UBSan binaries: once per suite is enough
  echo "skipped under SANITIZE=1 (this test always runs under ASan/UBSan; the plain suite runs it)"; exit 0; fi
OUT=$BUILD/cuda-emu
EMU=tests/cuda_emu
mkdir -p "$OUT/src"

. tests/cli/lib/common.sh
for tool in g++ perl; do
    command -v $tool >/dev/null 2>&1 || { echo "skip: $tool is missing, so the CUDA plugin is not emulated here"; exit 0; }
done
[ "$(uname -m)" = x86_64 ] || { echo "skip: tests/cuda_emu switches fibers with x86-64 code"; exit 0; }

# the emulated plugin, the harnesses and the emulator's own check: tests/cuda_emu/emu.mk's rules, which
# `make test` has run with the rest of the build (here make finds them up to date)
MAKEFLAGS= make -s BUILD="$BUILD" cuda-emu >"$OUT/build.log" 2>&1 ||
    { grep -E 'error|rewrite' "$OUT/build.log" | head -20; fail "cannot build the emulated plugin (make cuda-emu; $OUT/build.log)"; }
echo "ok: built $OUT/ctitan-cuda-emu.so (plugins/cuda/*.c and *.cu on tests/cuda_emu)"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1
export LSAN_OPTIONS="suppressions=$(pwd)/tests/lsan.supp:print_suppressions=0"
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
# two programs at a time below, each with two OpenMP threads on two cores: waiting threads sleep
# instead of spinning on a core the other program needs (the seq-128 bf16 run below: 58 s of CPU
# time spinning, 35 s without, on 2026-12-07; the thread count, and so every result, is unchanged)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
harness() { # log, env...
    local log=$1
    shift
    local rc=0
    env "$@" CT_DEVICE_PLUGIN="$OUT/ctitan-cuda-emu.so" timeout 900 "$OUT/test_device_conformance" >"$log" 2>&1 ||
        rc=$?
    return $rc
}

# Two at a time (two cores): (a) with (d), then the two variants of (b).
CPU_SO=$BUILD/plugins/ctitan-cpu.so
[ -f "$CPU_SO" ] || fail "$CPU_SO is missing (run make)"
cross_check() {
    ASAN_OPTIONS=detect_leaks=0 timeout 900 "$OUT/cross_check" "$CPU_SO" "$OUT/ctitan-cuda-emu.so" \
        >"$OUT/cross_check.log" 2>&1
}
cross_check &
cross_pid=$!

# (a) every conformance test
rc=0
harness "$OUT/conformance.log" || rc=$?
grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|FAIL|ERROR|cuda_emu:|runtime error|AddressSanitizer' "$OUT/conformance.log" |
    grep -v '^\[       OK \]' | head -40 || true
[ $rc -eq 0 ] || fail "the emulated CUDA plugin fails the device conformance suite (exit $rc, $OUT/conformance.log)"
! grep -q 'skipped' "$OUT/conformance.log" || fail "a conformance test skipped (an optional op missing?)"
echo "ok: $(grep -c '^\[       OK \]' "$OUT/conformance.log") conformance tests pass on the emulated plugin"

# (d) Llama's shapes against the CPU plugin (head dims 48-128, a 128256 vocabulary, long column
# sums, many repeated ids), each result twice for determinism
rc=0
wait $cross_pid || rc=$?
grep -E '^FAIL|cuda_emu:|runtime error|AddressSanitizer' "$OUT/cross_check.log" | head -20 || true
[ $rc -eq 0 ] || fail "the emulated plugin disagrees with the CPU plugin at Llama's shapes ($OUT/cross_check.log)"
echo "ok: $(grep -c '^ok' "$OUT/cross_check.log") checks against the CPU plugin at Llama's shapes agree"

# (b) the sgemm fallback and the allocator's retry: the whole suite again under each.
# 228 MiB covers what the suite holds at once (the peak-FLOP/s matmul's 3 x 64 MiB and cuBLASLt's
# 32 MiB workspace), not what the cache keeps besides: cudaMalloc must fail, and the plugin must
# hand its free blocks back and succeed on the retry.
# The fallback changes only the GEMMs: its run takes the tests that call one (matmul, fp8 and bf16
# GEMMs, the peak probe, the determinism run, argument checks, the captured graph), not the rest.
gemm_tests='test_plugin_info,test_info_and_peak_flops,*matmul*,test_bf16_casts,test_cross_entropy_backward_dev'
gemm_tests+=',test_same_inputs_give_same_bits,test_bad_arguments_are_errors,test_share_stream,test_graph_capture'
harness "$OUT/conformance_sgemm.log" CUDA_EMU_LT_NONE=1 CT_CONFORMANCE_ONLY="$gemm_tests" &
sgemm_pid=$!
rc=0
harness "$OUT/conformance_oom.log" CUDA_EMU_MALLOC_LIMIT=$((228 << 20)) || rc=$?
[ $rc -eq 0 ] || fail "with cudaMalloc limited to 228 MiB live, see $OUT/conformance_oom.log"
grep -q 'cuda_emu: cudaMalloc of .* refused' "$OUT/conformance_oom.log" ||
    fail "with cudaMalloc limited to 228 MiB, no cudaMalloc was refused: the retry was not exercised"
echo "ok: with cudaMalloc limited to 228 MiB ($(grep -c 'refused' "$OUT/conformance_oom.log") refusal(s), each followed by a trim and a retry), the suite passes"
rc=0
wait $sgemm_pid || rc=$?
[ $rc -eq 0 ] || fail "with cuBLASLt finding no algorithm (cublasSgemm fallback), see $OUT/conformance_sgemm.log"
echo "ok: the cublasSgemm fallback passes too"

# (c) no device
rc=0
harness "$OUT/nodevice.log" CUDA_EMU_DEVICES=0 || rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "with no device the harness exited $rc"
grep -q 'create failed: create: no CUDA device is visible' "$OUT/nodevice.log" || fail "no 'no CUDA device' message"
echo "ok: with no device, create refuses cleanly"

# the emulator's own stream capture and graphs (tests/cuda_emu/emu_graph_check.cpp), with leak checks
"$OUT/emu_graph_check" >"$OUT/emu_graph_check.log" 2>&1 ||
    { grep -E '^FAIL|runtime error|Sanitizer' "$OUT/emu_graph_check.log" | head -20 || true
      fail "$EMU/emu_graph_check.cpp: see $OUT/emu_graph_check.log"; }
echo "ok: $(grep -c '^ok' "$OUT/emu_graph_check.log") checks of the emulator's stream capture and graphs pass"

# (e) compile.enable end to end: ctitan train on the emulated plugin (a tiny Llama, 2 microbatches
# a step), each microbatch from the third on one graph launch, against the same run eager: the
# same loss and gradient norm every step, bit for bit (the graph replays the same kernels). f32,
# f32 with Llama 3.1's RoPE scaling, then bf16 parameters with full activation checkpointing (bf16 GEMM scratch held by the graph,
# recomputation inside it); then a capture CUDA refuses mid-way (the 50th operation): the run says
# so and goes on eagerly with the same losses. The host binary is not sanitized: libasan and
# libubsan are preloaded for the plugin's sake. The runs state the peak (metrics.peak_tflops): the
# device's own probe, a 4096^3 matmul, takes seconds per run on the emulator (the conformance suite runs it).
CTITAN=$BUILD/ctitan
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$OUT/tok.model" >/dev/null &&
    "$CTITAN" tokenize --tokenizer "$OUT/tok.model" --input "$corpus" --output "$OUT/data.bin" >/dev/null ||
    fail "cannot make the training data"
cat >"$OUT/train.yaml" <<YAML
device: {name: $(pwd)/$OUT/ctitan-cuda-emu.so}
model: {name: llama3, flavor: debugmodel, n_layers: 2, dim: 64, n_heads: 4, n_kv_heads: 2, vocab_size: 512,
        tokenizer_path: $OUT/tok.model}
optimizer: {name: AdamW, lr: 3e-3}
lr_scheduler: {warmup_steps: 2}
training: {dataset_path: $OUT/data.bin, local_batch_size: 2, global_batch_size: 4, seq_len: 32, steps: 3, seed: 3}
metrics: {log_freq: 1, peak_tflops: 1}
YAML
PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)"
train() { # name, options...
    local name=$1
    shift
    rm -rf "${OUT:?}/$name" # metrics.jsonl is appended to: each suite run starts its runs afresh
    env LD_PRELOAD="$PRELOAD" timeout 600 "$CTITAN" train "$OUT/train.yaml" --job.dump_folder="$OUT/$name" "$@" \
        >"$OUT/$name.log" 2>&1 || { grep -E 'ctitan:|cuda_emu:|runtime error|Sanitizer' "$OUT/$name.log" | head -5
                                   fail "ctitan train $name (see $OUT/$name.log)"; }
}
curve() { grep '"loss"' "$OUT/$1/metrics.jsonl" | sed -E 's/.*"step": ([0-9]+), "loss": ([^,]+), "grad_norm": ([^,]+),.*/\1 \2 \3/'; }
same_curve() { # eager, compiled
    [ "$(curve "$1" | wc -l)" -eq 3 ] && [ "$(curve "$1")" = "$(curve "$2")" ] ||
        fail "$2 against $1: $(paste -d' ' <(curve "$1") <(curve "$2") | tr '\n' ';')"
}
captured() { grep -q "compile.enable: step 2: captured one microbatch's forward and backward as a graph of" "$OUT/$1.log" &&
             grep -q 'summary: compile: 4 microbatches ran as one graph launch each' "$OUT/$1.log" ||
             fail "$1: no capture at step 2 and 4 launches (see $OUT/$1.log)"; }
train eager_f32 &
pid=$!
train compile_f32 --compile.enable=true
wait $pid || exit 1
same_curve eager_f32 compile_f32
captured compile_f32
echo "ok: compile.enable, f32: $(grep -o 'a graph of [0-9]* device operations' "$OUT/compile_f32.log"), 4 launches; 3 steps identical to eager"
# Llama 3.1's scaled RoPE (rope_freqs): its table goes to the device once, so the capture holds
scaled=(--model.rope_scaling=llama3 --model.rope_original_max_position=16)
train eager_scaled "${scaled[@]}" &
pid=$!
train compile_scaled "${scaled[@]}" --compile.enable=true
wait $pid || exit 1
same_curve eager_scaled compile_scaled
captured compile_scaled
[ "$(curve eager_f32)" != "$(curve eager_scaled)" ] || fail "rope_scaling llama3 did not change the curve"
echo "ok: compile.enable with rope_scaling llama3: 4 launches; 3 steps identical to eager (and not the plain curve)"
# block-causal attention over packed documents (one fortune per document, about 45 tokens, so most
# 32-token sequences hold a boundary, each microbatch at other places): the graph reads each
# microbatch's document ids from the uploads it was captured with, so replays follow the eager run
"$CTITAN" tokenize --tokenizer "$OUT/tok.model" --input "$corpus" --split-on % --output "$OUT/docs.bin" >/dev/null ||
    fail "cannot make the document data"
docs=(--model.attn_mask_type=block_causal --training.dataset_path="$OUT/docs.bin")
train eager_docs "${docs[@]}" &
pid=$!
train compile_docs "${docs[@]}" --compile.enable=true
wait $pid || exit 1
same_curve eager_docs compile_docs
captured compile_docs
echo "ok: compile.enable with block_causal over packed documents: 4 launches; 3 steps identical to eager"
bf16=(--training.mixed_precision_param=bfloat16 --activation_checkpoint.mode=full)
train eager_bf16 "${bf16[@]}" &
pid=$!
train compile_bf16 "${bf16[@]}" --compile.enable=true
wait $pid || exit 1
same_curve eager_bf16 compile_bf16
captured compile_bf16
echo "ok: compile.enable, bf16 parameters and full activation checkpointing: $(grep -o 'a graph of [0-9]* device operations' "$OUT/compile_bf16.log"), 3 steps identical to eager"
CUDA_EMU_CAPTURE_FAIL_AT=50 train refused_capture --compile.enable=true
grep -q 'compile.enable: the capture failed at step 2 (.*cudaErrorStreamCapture.*); the step runs eagerly' \
    "$OUT/refused_capture.log" || fail "a refused capture: no notice (see $OUT/refused_capture.log)"
! grep -q 'summary: compile' "$OUT/refused_capture.log" || fail "a refused capture still launched a graph"
same_curve eager_f32 refused_capture
echo "ok: a capture refused at its 50th operation: notice, then eager with the same losses"
# growable regions (ABI 2.8: plugins/cuda/region.c on the emulator's cuMem* calls): the arenas grow
# in place, so the first step holds what the third does; without them (CUDA_EMU_NO_VMM=1: the
# plugin falls back to blocks) the first step holds more. The same losses either way.
act() { grep '"loss"' "$OUT/$1/metrics.jsonl" | sed -E 's/.*"activations": ([0-9]+).*/\1/' | sed -n "${2}p"; }
larger=(--training.seq_len=128 --model.dim=128 "${bf16[@]}")
train regions "${larger[@]}" &
pid=$!
CUDA_EMU_NO_VMM=1 train blocks "${larger[@]}"
wait $pid || exit 1
same_curve regions blocks
[ "$(act regions 1)" = "$(act regions 3)" ] ||
    fail "regions: step 1 held $(act regions 1) B of activations, step 3 $(act regions 3) B"
[ "$(act blocks 1)" -gt "$(act blocks 3)" ] ||
    fail "blocks: step 1 held $(act blocks 1) B, step 3 $(act blocks 3) B: the check above cannot tell regions from blocks"
echo "ok: growable regions: step 1 holds $(act regions 1) B of activations as step 3 does (blocks: $(act blocks 1) B, then $(act blocks 3) B); the same losses"
"$CTITAN" train "$OUT/train.yaml" --device.name=cpu --compile.enable=true --training.steps=1 \
    --job.dump_folder="$OUT/cpu" >"$OUT/cpu.log" 2>&1 || fail "compile.enable on the cpu (see $OUT/cpu.log)"
grep -q 'compile.enable: no effect on the cpu device: the device has no graph capture' "$OUT/cpu.log" ||
    fail "compile.enable on the cpu: no notice"
echo "ok: compile.enable on the cpu: a one-line notice"
echo "cuda_emulated: ok"
