#!/usr/bin/env bash
# tests/gpu/run.sh OUT_DIR: ctitan's checks for a machine with an NVIDIA GPU (a few minutes on one
# H100/H200; QUICK=1 keeps the benchmarks to 1B at seq 2048, for a device call of under 10
# minutes). Run from the repository root. Every step's log goes to OUT_DIR/<step>.log; a step
# that fails is recorded and the script goes on; a table of every step comes last (also in
# OUT_DIR/summary.txt). Exit status: 0 when every check passed, 1 when one failed, 2 when no GPU
# is visible (then nothing runs).
#
# Steps:
#   build               make -j16 all and the unit-test binaries
#   conformance_f32     the device conformance harness on ctitan-cuda.so (TF32 off), tolerance
#                       CT_DEVICE_RTOL=1e-4 relative to each tensor's largest magnitude, for every
#                       op (every op is f32 in and out; bf16 and fp8 casts are compared bit for bit;
#                       the fp8 GEMMs at max(rtol, 1e-3): fp8 tensor cores accumulate in fewer bits)
#   conformance_tf32    the same with device option tf32=true, tolerance 5e-3 (a TF32 product keeps
#                       10 mantissa bits: ~5e-4 per product, a few e-4 summed over k = 53)
#   cross_check         tests/cuda_emu/cross_check.c: the CUDA plugin against the CPU plugin at Llama's
#                       shapes (attention at head dims 48, 64, 128; cross-entropy over 128256 columns;
#                       embedding backward with repeated ids; 300000-row column sums), rtol 2e-4, and
#                       the same bits twice
#   cuda_plugin         tests/cli/cuda_plugin.sh (with a GPU it runs the conformance suite too)
#   nccl_1rank          tests/cli/nccl_plugin.sh: tests/gpu/nccl_conformance.c under mpirun, 1 rank
#                       (2 ranks as well when 2 GPUs are visible)
#   golden_debugmodel   configs/llama3_debug.yaml for 10 steps on the CPU and on the GPU (f32, same
#                       seed and data): every step's loss must agree within LOSS_ATOL and the
#                       gradient norm within GNORM_RTOL (f32 sums in another order drift apart
#                       slowly; a wrong kernel shows at step 1)
#   golden_compile      the GPU run again with compile.enable: the same losses and norms as eager
#   bench_<flavor>_<seq>  ctitan on the GPU: llama3 1B and 3B at seq 2048 (no activation
#                       checkpointing) and 8192 (full checkpointing), batch 1, 6 steps; the summary
#                       line's tokens/s, ratio to the measured f32 matmul peak (MFU) and peak memory
#                       (under bf16 the peak the run measures is the bf16 GEMM's)
#   bench_1B_2048_bf16  the same at 1B/2048 with mixed_precision_param bfloat16 (bf16 tensor-core
#                       GEMMs through set_matmul_dtype, ABI 1.4)
#   bench_1B_2048_bf16compile  and with compile.enable (each microbatch one CUDA graph launch)
#   bench_1B_2048_fp8   and with float8 tensorwise on top (cuBLASLt fp8 GEMMs through matmul_fp8):
#                       fp8 vs bf16 tokens/s, the figure issue #6 asks for
#   bench_1B_2048_fp8rows  float8 rowwise (cuBLASLt's outer-vector scaling, matmul_fp8_rows; the
#                       start-up line says "emulated" if this cuBLASLt refuses it)
#   torch_<...>         bench/torch_llama3.py on the same shapes (when torch sees the GPU): f32 (TF32
#                       off, like ctitan) and bf16 autocast, eager; bf16 torch.compile at 1B/2048
set -u

LOSS_ATOL=${LOSS_ATOL:-2e-3}
GNORM_RTOL=${GNORM_RTOL:-2e-2}
RTOL_F32=${RTOL_F32:-1e-4}
RTOL_TF32=${RTOL_TF32:-5e-3}
BENCH_STEPS=${BENCH_STEPS:-6}

OUT=${1:-}
if [ -z "$OUT" ]; then
    echo "usage: tests/gpu/run.sh OUT_DIR   (run from the repository root, on a machine with an NVIDIA GPU)" >&2
    exit 2
fi
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ "$GPUS" -eq 0 ]; then
    echo "tests/gpu/run.sh: no NVIDIA GPU is visible (nvidia-smi is missing or lists none); nothing to run here." >&2
    echo "tests/gpu/run.sh: on a CPU machine, tests/cli/cuda_plugin.sh checks the CUDA plugin's build and its refusal." >&2
    exit 2
fi
[ -f Makefile ] && [ -d plugins/cuda ] || { echo "tests/gpu/run.sh: run it from the repository root" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(pwd)
BUILD=build
CTITAN=$BUILD/ctitan
SO=$ROOT/$BUILD/plugins/ctitan-cuda.so
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1

names=() statuses=() details=()
record() { # name status detail
    names+=("$1")
    statuses+=("$2")
    details+=("$3")
    printf '%-26s %-5s %s\n' "$1" "$2" "$3"
}
# run NAME TIMEOUT_S CMD...: output to OUT/NAME.log; returns the command's status (124: timeout)
run() {
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" >"$OUT/$name.log"
    timeout "$limit" "$@" >>"$OUT/$name.log" 2>&1
}
why() { # a short reason from a status and a log
    local rc=$1 log=$2
    [ "$rc" -eq 124 ] && { echo "timed out"; return; }
    grep -m1 -E 'FAIL|ERROR|error|Error|ctitan: ' "$log" | cut -c1-100 || echo "exit $rc"
}

echo "tests/gpu/run.sh: $GPUS GPU(s): $(nvidia-smi -L | head -1); logs in $OUT"

# ---------------------------------------------------------------- build
TESTS=$(ls tests/unit/test_*.c | sed 's|tests/unit/\(.*\)\.c|build/tests/\1|')
rc=0
run build 1200 make -j16 all $TESTS || rc=$?
if [ $rc -ne 0 ] || [ ! -f "$SO" ]; then
    record build FAIL "$(why $rc "$OUT/build.log")"
    echo "tests/gpu/run.sh: the build failed; see $OUT/build.log" >&2
    exit 1
fi
record build ok "$(grep -c nvcc "$OUT/build.log") nvcc calls"

# ---------------------------------------------------------------- conformance
conformance() { # name rtol options
    local rc=0
    run "$1" 600 env CT_DEVICE_PLUGIN="$SO" CT_DEVICE_RTOL="$2" CT_DEVICE_OPTIONS="$3" \
        CT_CONFORMANCE_VERBOSE=1 $BUILD/tests/test_device_conformance || rc=$?
    local passed failed
    passed=$(grep -c '^\[       OK \]' "$OUT/$1.log" || true)
    failed=$(grep -c '^\[  FAILED  \]' "$OUT/$1.log" || true)
    if [ $rc -eq 0 ]; then
        record "$1" ok "$passed tests passed, rtol $2 $(grep -m1 -o 'peak [0-9.]* GFLOP/s' "$OUT/$1.log")"
    else
        record "$1" FAIL "$passed ok, $failed failed: $(grep -m1 -A1 '^\[ RUN' "$OUT/$1.log" >/dev/null; why $rc "$OUT/$1.log")"
    fi
}
conformance conformance_f32 "$RTOL_F32" "tf32=false"
conformance conformance_tf32 "$RTOL_TF32" "tf32=true"

# Llama's shapes (head dims 48-128, a 128256 vocabulary, long column sums) against the CPU plugin
rc=0
cc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -Isdk/include -o "$WORK/cross_check" tests/cuda_emu/cross_check.c \
    -ldl -lm >"$OUT/cross_check.log" 2>&1 || rc=$?
[ $rc -ne 0 ] || run cross_check 900 "$WORK/cross_check" "$ROOT/$BUILD/plugins/ctitan-cpu.so" "$SO" || rc=$?
[ $rc -eq 0 ] && record cross_check ok "$(grep -c '^ok' "$OUT/cross_check.log") checks agree with the CPU plugin" ||
    record cross_check FAIL "$(grep -m1 '^FAIL' "$OUT/cross_check.log" | cut -c1-100)"

rc=0
run cuda_plugin 900 env BUILD=$BUILD CTITAN=$CTITAN bash tests/cli/cuda_plugin.sh || rc=$?
[ $rc -eq 0 ] && record cuda_plugin ok "tests/cli/cuda_plugin.sh" || record cuda_plugin FAIL "$(why $rc "$OUT/cuda_plugin.log")"

rc=0
run nccl_1rank 900 env BUILD=$BUILD CTITAN=$CTITAN bash tests/cli/nccl_plugin.sh || rc=$?
[ $rc -eq 0 ] && record nccl_1rank ok "$(grep -c 'NCCL conformance' "$OUT/nccl_1rank.log") mpirun run(s)" ||
    record nccl_1rank FAIL "$(why $rc "$OUT/nccl_1rank.log")"

# ---------------------------------------------------------------- data
# The demo data (scripts/prepare_demo_data.sh) needs Debian's fortunes; without them (no network on
# a GPU machine), the committed tokenizer test corpus tokenized with its committed vocabulary.
DATASET=$ROOT/data/demo/fortunes.bin
TOKENIZER=$ROOT/data/demo/tokenizer.model
if ! BUILD=$BUILD scripts/prepare_demo_data.sh >"$OUT/data.log" 2>&1; then
    DATASET=$WORK/corpus.bin
    TOKENIZER=$ROOT/tests/data/tokenizer/vocab.tiktoken
    $CTITAN tokenize --tokenizer "$TOKENIZER" --input tests/data/tokenizer/corpus.txt --split-on % \
        --output "$DATASET" >>"$OUT/data.log" 2>&1 || true
fi
if [ -s "$DATASET" ]; then
    record data ok "$(basename "$DATASET")"
else
    record data FAIL "no token shard (see data.log)"
fi

# The debug manifest on the GPU: device.name cuda, and no `threads` (a CPU option).
sed -e 's/^  name: cpu$/  name: cuda/' -e '/^  threads:/d' configs/llama3_debug.yaml >"$WORK/llama3_debug_cuda.yaml"
cp "$WORK/llama3_debug_cuda.yaml" "$OUT/llama3_debug_cuda.yaml"
common=(--training.dataset_path="$DATASET" --model.tokenizer_path="$TOKENIZER" --generate.max_new_tokens=0
        --lr_scheduler.warmup_steps=2 --metrics.log_freq=1)

# ---------------------------------------------------------------- golden: GPU against CPU
steps_of() { awk '$1 == "step" {print $2, $4, $6}' "$1"; } # step loss grad_norm
rc_cpu=0
rc_gpu=0
run golden_cpu 1200 $CTITAN train configs/llama3_debug.yaml "${common[@]}" --training.steps=10 \
    --job.dump_folder="$WORK/golden_cpu" || rc_cpu=$?
run golden_gpu 600 $CTITAN train "$WORK/llama3_debug_cuda.yaml" "${common[@]}" --training.steps=10 \
    --job.dump_folder="$WORK/golden_gpu" || rc_gpu=$?
if [ $rc_cpu -ne 0 ] || [ $rc_gpu -ne 0 ]; then
    record golden_debugmodel FAIL "cpu exit $rc_cpu, gpu exit $rc_gpu: $(why $((rc_cpu + rc_gpu)) "$OUT/golden_gpu.log")"
else
    paste -d' ' <(steps_of "$OUT/golden_cpu.log") <(steps_of "$OUT/golden_gpu.log") >"$OUT/golden_compare.txt"
    verdict=$(awk -v atol="$LOSS_ATOL" -v rtol="$GNORM_RTOL" '
        { n++; dl = $2 - $5; if (dl < 0) dl = -dl; if (dl > maxl) maxl = dl
          dg = $3 - $6; if (dg < 0) dg = -dg; if ($3 != 0) dg /= $3; if (dg > maxg) maxg = dg
          if ($1 != $4) bad = 1 }
        END { printf "%d steps, max |dloss| %.2e (atol %s), max grad_norm rel %.2e (rtol %s)", n, maxl, atol, maxg, rtol
              exit !(n >= 10 && !bad && maxl <= atol && maxg <= rtol) }' "$OUT/golden_compare.txt")
    [ $? -eq 0 ] && record golden_debugmodel ok "$verdict" || record golden_debugmodel FAIL "$verdict"
fi

# compile.enable on the GPU: each microbatch after the second is one CUDA graph launch, the same
# kernels as eager, so every step's loss and gradient norm must be eager's to the printed digit
rc=0
run golden_compile 600 $CTITAN train "$WORK/llama3_debug_cuda.yaml" "${common[@]}" --training.steps=10 \
    --compile.enable=true --job.dump_folder="$WORK/golden_compile" || rc=$?
if [ $rc -ne 0 ] || ! grep -q 'compile.enable: step [0-9]*: captured' "$OUT/golden_compile.log"; then
    record golden_compile FAIL "$(why $((rc + 1)) "$OUT/golden_compile.log")"
elif cmp -s <(steps_of "$OUT/golden_gpu.log") <(steps_of "$OUT/golden_compile.log"); then
    record golden_compile ok "$(grep -m1 -o 'a graph of [0-9]* device operations' "$OUT/golden_compile.log"); 10 steps identical to eager"
else
    record golden_compile FAIL "the losses differ from the eager GPU run (see golden_compile.log)"
fi

# ---------------------------------------------------------------- ctitan bench on the GPU
# bf16 GEMMs (eager, then replayed as CUDA graphs: compile.enable), then float8 tensorwise and
# rowwise GEMMs, at 1B / 2048 (TFLOP/s counted as for f32; the ratio in the summary line is to
# the peak measured at start-up)
for variant in bf16 bf16compile fp8 fp8rows; do
    name=bench_1B_2048_$variant
    extra=(--training.mixed_precision_param=bfloat16)
    [ $variant = bf16compile ] && extra+=(--compile.enable=true)
    [ $variant = fp8 ] && extra+=(--quantize.dense.float8.enable=true --quantize.dense.float8.format=tensorwise)
    [ $variant = fp8rows ] && extra+=(--quantize.dense.float8.enable=true --quantize.dense.float8.format=rowwise)
    rc=0
    run "$name" 900 $CTITAN train "$WORK/llama3_debug_cuda.yaml" "${common[@]}" --model.flavor=1B \
        --training.seq_len=2048 --training.local_batch_size=1 --training.steps=$BENCH_STEPS \
        --activation_checkpoint.mode=none "${extra[@]}" --job.dump_folder="$WORK/$name" || rc=$?
    rm -rf "${WORK:?}/$name"
    line=$(grep -m1 '^summary: [0-9]* steps' "$OUT/$name.log")
    if [ $rc -eq 0 ] && [ -n "$line" ]; then
        tps=$(sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/' <<<"$line")
        gflops=$(sed -E 's/.* ([0-9.]+) GFLOP\/s achieved.*/\1/' <<<"$line")
        mem=$(sed -E 's/.*peak memory ([0-9.]+) GiB.*/\1/' <<<"$line")
        how=$(grep -m1 -o -e 'float8 [a-z]*: [^;]*' -e 'a graph of [0-9]* device operations' "$OUT/$name.log" ||
              echo "bf16 GEMMs")
        record "$name" ok "ctitan $variant: $tps tok/s, $(awk -v g="$gflops" 'BEGIN{printf "%.1f", g/1000}') TFLOP/s, $mem GiB ($how)"
    else
        record "$name" FAIL "$(why $rc "$OUT/$name.log")"
    fi
done

# summary: N steps after the first 2: T tokens/s, G GFLOP/s achieved, P GFLOP/s cuda
#   matmul peak, ratio R, peak memory M GiB (activations live peak A GiB)
FLAVORS="1B 3B" SEQS="2048 8192"
[ "${QUICK:-0}" = 1 ] && FLAVORS=1B SEQS=2048
for flavor in $FLAVORS; do
    for seq in $SEQS; do
        ac=none
        [ "$seq" -gt 4096 ] && ac=full
        name=bench_${flavor}_${seq}
        rc=0
        run "$name" 900 $CTITAN train "$WORK/llama3_debug_cuda.yaml" "${common[@]}" --model.flavor=$flavor \
            --training.seq_len=$seq --training.local_batch_size=1 --training.steps=$BENCH_STEPS \
            --activation_checkpoint.mode=$ac --job.dump_folder="$WORK/$name" || rc=$?
        cp "$WORK/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
        rm -rf "${WORK:?}/$name" # the saved model (GBs at these sizes) is not wanted
        line=$(grep -m1 '^summary: [0-9]* steps' "$OUT/$name.log")
        if [ $rc -eq 0 ] && [ -n "$line" ]; then
            tps=$(sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/' <<<"$line")
            gflops=$(sed -E 's/.* ([0-9.]+) GFLOP\/s achieved.*/\1/' <<<"$line")
            ratio=$(sed -E 's/.*ratio ([0-9.]+).*/\1/' <<<"$line")
            peak=$(sed -E 's/.*, ([0-9.]+) GFLOP\/s [a-z0-9:]* matmul peak.*/\1/' <<<"$line")
            mem=$(sed -E 's/.*peak memory ([0-9.]+) GiB.*/\1/' <<<"$line")
            record "$name" ok "ctitan f32 ac=$ac: $tps tok/s, $(awk -v g="$gflops" 'BEGIN{printf "%.1f", g/1000}') TFLOP/s, MFU $(awk -v r="$ratio" 'BEGIN{printf "%.1f%%", 100*r}') of $(awk -v p="$peak" 'BEGIN{printf "%.1f", p/1000}') f32 peak, $mem GiB"
        else
            record "$name" FAIL "$(why $rc "$OUT/$name.log")"
        fi
    done
done

# ---------------------------------------------------------------- PyTorch on the same shapes
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    torch_run() { # name timeout args...
        local name=$1 limit=$2
        shift 2
        local rc=0
        run "$name" "$limit" python3 bench/torch_llama3.py --steps "$BENCH_STEPS" "$@" || rc=$?
        local any=0
        while read -r line; do
            any=1
            fields=${line#torch_llama3: }
            st=$(grep -o 'status=[a-z_]*' <<<"$fields" | cut -d= -f2)
            label=$(awk '{for (i = 1; i <= NF; i++) {split($i, kv, "="); f[kv[1]] = kv[2]}}
                         END {printf "torch_%s_%s_%s_%s", f["flavor"], f["seq"], f["dtype"], f["mode"]}' <<<"$fields")
            detail=$(awk '{for (i = 1; i <= NF; i++) {split($i, kv, "="); f[kv[1]] = kv[2]}}
                          END {if (f["status"] == "ok") printf "%s tok/s, %s TFLOP/s, MFU %s of %s peak, %s GiB",
                                  f["tokens_per_s"], f["tflops"], f["mfu"], f["peak_tflops"], f["peak_mem_gib"];
                               else printf "%s %s", f["status"], f["error"]}' <<<"$fields")
            [ "$st" = ok ] && record "$label" ok "$detail" || record "$label" FAIL "$detail"
        done < <(grep '^torch_llama3: ' "$OUT/$name.log")
        [ $any -eq 1 ] || record "$name" FAIL "$(why $rc "$OUT/$name.log")"
    }
    if [ "${QUICK:-0}" = 1 ]; then
        torch_run torch_2048 900 --flavor 1B --seq 2048 --dtype fp32 bf16 --mode eager --ac none
    else
        torch_run torch_2048 900 --flavor 1B 3B --seq 2048 --dtype fp32 bf16 --mode eager --ac none
        torch_run torch_8192 900 --flavor 1B 3B --seq 8192 --dtype fp32 bf16 --mode eager --ac full
        torch_run torch_compile 900 --flavor 1B --seq 2048 --dtype bf16 --mode compile --ac none
    fi
else
    record torch SKIP "torch with CUDA is not importable here"
fi

# ---------------------------------------------------------------- the table
{
    echo
    echo "tests/gpu/run.sh on $(nvidia-smi -L | head -1)"
    printf '%-34s %-5s %s\n' STEP STATUS DETAIL
    for i in "${!names[@]}"; do
        printf '%-34s %-5s %s\n' "${names[$i]}" "${statuses[$i]}" "${details[$i]}"
    done
} | tee "$OUT/summary.txt"
for s in "${statuses[@]}"; do
    [ "$s" = FAIL ] && exit 1
done
exit 0
