#!/usr/bin/env bash
# cuda_plugin: the CUDA device plugin builds where nvcc is (and is skipped, with one line, where it
# is not), exports one symbol, is listed by `ctitan plugins`, resolves every library it links at
# load time, and on a machine without a GPU refuses cleanly: create returns CT_ERR_UNSUPPORTED with
# "no CUDA device is visible", the device conformance harness exits non-zero and `ctitan train`
# exits 2 with that line, without a crash or a hang. Where `nvidia-smi -L` lists a GPU, the whole
# device conformance suite runs against the plugin instead (tests/gpu/run.sh does more).
#
#   (a) $BUILD/plugins/ctitan-cuda.so exists when nvcc does; exports only ctitan_plugin_entry
#   (b) `make NVCC=/nonexistent/nvcc` prints the skip line and plans no CUDA build
#   (c) `ctitan plugins` lists it as a device plugin of the host's ABI major
#   (d) the harness dlopens it with LD_BIND_NOW=1 (every symbol of every library bound at load):
#       no GPU: create fails with the message, exit status non-zero and not a signal;
#       GPU: every conformance test passes (f32 tolerance CT_DEVICE_RTOL, default 1e-4)
#   (e) no GPU: `ctitan train` with device.name: cuda exits 2 naming the manifest line and the cause
set -euo pipefail

BUILD=${BUILD:-build}
CTITAN=${CTITAN:-$BUILD/ctitan}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SO=$BUILD/plugins/ctitan-cuda.so
HARNESS=$BUILD/tests/test_device_conformance
WANT="no CUDA device is visible"

. tests/cli/lib/common.sh

# (b) the skip branch of plugins/cuda/plugin.mk, whatever this machine has
plan=$(make -n NVCC=/nonexistent/nvcc BUILD="$BUILD" all 2>&1) || fail "make -n with a missing nvcc failed: $plan"
grep -q '^cuda: nvcc not found at /nonexistent/nvcc; skipping the CUDA plugin$' <<<"$plan" ||
    fail "make with a missing nvcc does not print the skip line"
! grep -q 'ctitan-cuda\.so\|cuda-obj' <<<"$plan" || fail "make with a missing nvcc still plans the CUDA plugin"
echo "ok: without nvcc the build skips the plugin with one line"

if [ ! -x "$NVCC" ]; then
    [ ! -f "$SO" ] || fail "$SO exists although $NVCC does not (SKIP_cuda not honoured?)"
    echo "skip: no $NVCC, so the CUDA plugin is not built here"
    exit 0
fi

# (a) built, one exported symbol
[ -f "$SO" ] || fail "$SO was not built (run make)"
syms=$(nm -D --defined-only "$SO" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sort -u | tr '\n' ' ')
[ "$syms" = "ctitan_plugin_entry " ] || fail "$SO exports [$syms], expected only ctitan_plugin_entry"
echo "ok: $(basename "$SO") exports only ctitan_plugin_entry"

# (c) listed
MAJOR=$(sed -n 's/^#define CT_ABI_MAJOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h)
# Read the whole listing first: `grep -q` stops at the first match, and under pipefail the
# listing's next write would then end ctitan with SIGPIPE and fail the pipeline.
listing=$("$CTITAN" plugins) || fail "ctitan plugins failed"
grep -qE "^device +cuda +$MAJOR\.[0-9]+ " <<<"$listing" || fail "ctitan plugins does not list the cuda device plugin"
echo "ok: ctitan plugins lists it"

# (d) the conformance harness
[ -x "$HARNESS" ] || fail "$HARNESS is missing (make $HARNESS)"
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
# CUDA in a sanitized harness: the shadow gap must stay mappable, and the CUDA runtime keeps
# memory to the end of the process, which LeakSanitizer would report.
if readelf -d "$HARNESS" | grep -c 'NEEDED.*libasan' >/dev/null || nm "$HARNESS" 2>/dev/null | grep -c __asan_init >/dev/null; then
    export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0
fi
rc=0
out=$(LD_BIND_NOW=1 CT_DEVICE_PLUGIN="$SO" timeout 600 "$HARNESS" 2>&1) || rc=$?
[ $rc -ne 124 ] || fail "the harness hung (killed after 600 s)"
[ $rc -lt 128 ] || { echo "$out" | tail -20; fail "the harness died of signal $((rc - 128))"; }
! grep -q 'cannot load' <<<"$out" || { echo "$out" | head -5; fail "the plugin does not load (a library unresolved?)"; }
if [ "$GPUS" -eq 0 ]; then
    [ $rc -ne 0 ] || fail "the harness passed although no GPU is visible"
    grep -q "create failed: create: $WANT" <<<"$out" || { echo "$out" | head -5; fail "no '$WANT' message"; }
    echo "ok: without a GPU, create fails cleanly: $(grep -o "$WANT.*" <<<"$out" | head -1)"
else
    echo "$out" | tail -40
    [ $rc -eq 0 ] || fail "the device conformance suite fails on the GPU"
    echo "ok: the device conformance suite passes on $GPUS GPU(s)"
    echo "cuda_plugin: ok"
    exit 0
fi

# (e) through the host: the manifest line and the cause, exit status 2 (bad input)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf 'device:\n  name: cuda\ntraining:\n  steps: 1\n  seq_len: 32\n  local_batch_size: 1\n' >"$WORK/cuda.yaml"
rc=0
out=$(timeout 120 "$CTITAN" train "$WORK/cuda.yaml" --job.dump_folder="$WORK/out" 2>&1) || rc=$?
[ $rc -eq 2 ] || { echo "$out" | tail -5; fail "ctitan train with device.name: cuda exited $rc, expected 2"; }
grep -q "cuda.yaml:2: device.name: cuda: create: $WANT" <<<"$out" ||
    { echo "$out" | tail -5; fail "ctitan train does not name the line and the cause"; }
echo "ok: ctitan train refuses with: $(head -1 <<<"$out")"
echo "cuda_plugin: ok"
