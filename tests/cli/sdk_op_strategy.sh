#!/usr/bin/env bash
# sdk_op_strategy: an operation-level strategy written out of tree trains to the single-rank curve.
#
# Copies sdk/examples/mlp_tp out of the tree, builds it with nothing but the pkg-config file, and
# trains llama3 debugmodel (fp32) for 20 steps on 2 ranks with it serving the tp axis
# (--parallelism.tp_strategy=PATH): the feed-forward weights split over tp, the rest whole. The
# losses match the single rank's (lib/layouts.sh's compare), its feed-forward memory is halved,
# and the run counts the all-reduces it added.
set -u
. tests/cli/lib/layouts.sh
ROOT=$(pwd)
[ -f "$BUILD/ctitan-sdk.pc" ] || fail "$BUILD/ctitan-sdk.pc is missing (run make)"
cp -r sdk/examples/mlp_tp "$T/mlp_tp" && rm -f "$T"/mlp_tp/*.so
env -u MAKEFLAGS -u MFLAGS -u CFLAGS -u CPPFLAGS -u LDFLAGS PKG_CONFIG_PATH="$ROOT/$BUILD" \
  make --no-print-directory -C "$T/mlp_tp" >"$T/make.log" 2>&1 || { cat "$T/make.log"; fail "out-of-tree build"; }
echo "ok   built out of tree with pkg-config alone: $(ls "$T/mlp_tp"/*.so | xargs basename)"

run single 1 --training.local_batch_size=8
run mlp2 2 --training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1 \
    --parallelism.tensor_parallel_degree=2 --parallelism.tp_strategy="$T/mlp_tp/mlp_tp.so"
grep -q "tp 2; strategy none" "$T/mlp2.log" || fail "mlp2 did not run with tp 2"
compare single mlp2 20 || exit 1

# memory: the feed-forward weights (3 x 6 layers of 768 x 256 in debugmodel) are halved, the rest whole
single=$(mem single) got=$(mem mlp2)
awk -v s="$single" -v g="$got" 'BEGIN { ffn = 3 * 6 * 768 * 256 * 4 * 4; want = s - ffn / 2; r = g / want
  printf "%s  mlp_tp 2: params+grads+optimizer %d bytes per rank; halved feed-forward predicts %d (ratio %.4f)\n",
         (r > 0.99 && r < 1.01) ? "ok  " : "FAIL", g, want, r; exit !(r > 0.99 && r < 1.01) }' || exit 1
bytes=$(step_records mlp2 | tail -1 | sed 's/.*"all_reduce": \([0-9]*\).*/\1/')
[ "${bytes:-0}" -gt 0 ] 2>/dev/null || fail "mlp2: no all-reduce bytes counted"
echo "ok   mlp_tp 2: $bytes bytes of all-reduces in the last step (f and g around each feed-forward block)"
