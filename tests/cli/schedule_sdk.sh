#!/usr/bin/env bash
# schedule_sdk: a third party can write a pipeline schedule from the SDK alone. Copies
# sdk/examples/schedule_reverse out of the tree, builds it with nothing but the pkg-config file
# ($BUILD/ctitan-sdk.pc), checks it exports only ctitan_plugin_entry, and runs `ctitan schedule`
# on it by path: the checker accepts it, with GPipe's bubble and the backwards last-in first-out.
# Then a manifest names it by path and PP 2 trains to the single rank's losses.
set -euo pipefail
ROOT=$(pwd)
BUILD=${BUILD:-build}
CTITAN=${CTITAN:-$BUILD/ctitan}
case $CTITAN in /*) ;; *) CTITAN=$ROOT/$CTITAN ;; esac
. tests/cli/lib/common.sh

[ -f "$BUILD/ctitan-sdk.pc" ] || fail "$BUILD/ctitan-sdk.pc is missing (run make)"
help=$("$CTITAN" schedule --help 2>&1 || true)
grep -q -- "--microbatches" <<<"$help" || fail "ctitan has no 'schedule' command (core/main.c needs its dispatch line)"
export PKG_CONFIG_PATH=$ROOT/$BUILD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r sdk/examples/schedule_reverse "$WORK/reverse"
rm -f "$WORK"/reverse/*.so
grep -nE -- '-I|\.\./' "$WORK/reverse/Makefile" && fail "the example's Makefile reaches into the tree; only pkg-config may"
env -u MAKEFLAGS -u MFLAGS -u CFLAGS -u CPPFLAGS -u LDFLAGS make --no-print-directory -C "$WORK/reverse" \
    || fail "the example does not build from the SDK alone"
so=$WORK/reverse/reverse_gpipe.so
syms=$(nm -D --defined-only "$so" | awk '{print $3}' | sort -u | tr '\n' ' ')
[ "$syms" = "ctitan_plugin_entry " ] || fail "reverse_gpipe.so exports [$syms], expected only ctitan_plugin_entry"
echo "ok: reverse_gpipe.so builds out of tree and exports only ctitan_plugin_entry"

out=$("$CTITAN" schedule --name "$so" --pp 4 --microbatches 8) || fail "ctitan schedule --name $so exited $?"
echo "$out"
echo "$out" | grep -q '^ReverseGPipe: pp 4, 4 stages' || fail "the header does not name ReverseGPipe"
echo "$out" | grep -qx 'bubble 0.273  peak activations 8  makespan 33' || fail "not GPipe's bubble, peak and makespan"
echo "$out" | grep -q '^rank 3 .*F7 B7--- B6---' || fail "rank 3 does not run B7 first, right after F7"
# a shape it refuses comes back as a clean error naming the plugin
err=$("$CTITAN" schedule --name "$so" --pp 2 --stages 4 --microbatches 4 2>&1 >/dev/null) && fail "2 stages per rank accepted"
echo "$err" | grep -q "ReverseGPipe runs exactly 1 stage per rank" || fail "refusal message: $err"
echo "schedule_sdk: ok"

# ... and it trains: named by path in the manifest, PP 2 follows the single rank's losses
T=$WORK/train; mkdir -p "$T"
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 2048 --output "$T/tok.model" >/dev/null || fail "tokenizer"
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail "tokenize"
common=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --training.seq_len=64 --training.steps=5
        --training.local_batch_size=8 --training.global_batch_size=8 --metrics.log_freq=1 --generate.max_new_tokens=0
        --training.mixed_precision_param=float32 --activation_checkpoint.mode=none --device.threads=1)
"$CTITAN" train "${common[@]}" --job.dump_folder="$T/single" >"$T/single.log" 2>&1 || fail "single-rank run"
# a user's manifest naming the schedule by its path
{ cat configs/llama3_debug.yaml
  printf 'parallelism:\n  pipeline_parallel_degree: 2\n  data_parallel_shard_degree: 1\n  pipeline_parallel_schedule: %s\n' "$so"
} >"$T/pp.yaml"
"$CTITAN" launch -n 2 train "$T/pp.yaml" "${common[@]:1}" --job.dump_folder="$T/pp" >"$T/pp.log" 2>&1 \
  || { tail "$T/pp.log"; fail "PP 2 with the out-of-tree schedule"; }
grep -q "pipeline: ReverseGPipe, 2 stages on 2 ranks" "$T/pp.log" || fail "the run did not use ReverseGPipe"
. "$ROOT/tests/cli/lib/curves.sh"
same_curve "PP 2 with ReverseGPipe vs the single rank" "$T/single/metrics.jsonl" "$T/pp/metrics.jsonl" 5 || exit 1
