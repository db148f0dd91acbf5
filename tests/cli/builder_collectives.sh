#!/usr/bin/env bash
# The builder's differentiable collectives move exactly the data ctitan/model.h documents, forward and
# backward, on real MPI ranks: tests/plugins/collcheck.c, a test strategy loaded by path as
# parallelism.cp_strategy, runs after each microbatch's embedding, over the cp axis, the all-to-all by
# columns ((rows, c) -> (cp rows, c / cp)) and by rows (the inverse; ABI 2.12, each the other's
# backward), the 1-D all-gather (backward: reduce-scatter) and the 1-D reduce-scatter (backward:
# all-gather), on values that name the rank and the element, and compares every element of each
# output and of each input's gradient for equality. cp 3 on 3 ranks (the world group, an odd degree)
# and dp_shard 2 x cp 2 on 4 (each cp group a sub-group of the world), 2 steps: every rank reports 2
# exact forward and 2 exact backward passes of each collective (a mismatch stops the run, naming the
# collective, the element, what came and what was due).
set -u
STEPS=2
. tests/cli/lib/layouts.sh
BUILD=${BUILD:-build}
so=$BUILD/tests/plugins/ctitan-collcheck.so
if [ ! "$so" -nt tests/plugins/collcheck.c ]; then # not built by make (or stale): build it here
  PC=$(PKG_CONFIG_PATH="$BUILD" pkg-config --cflags ctitan-sdk) || fail "no $BUILD/ctitan-sdk.pc"
  so=$T/ctitan-collcheck.so
  cc $PC -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -o "$so" tests/plugins/collcheck.c ||
    fail "cannot build the collcheck strategy"
fi
case $so in /*) ;; *) so=$(pwd)/$so ;; esac
common+=(--model.n_layers=1 --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_hidden=128
         --parallelism.cp_strategy="$so")

# checked NAME RANKS CP: each rank's line, every collective exact in each step's forward and backward
checked() {
  local name=$1 ranks=$2 cp=$3 n
  n=$(grep -c "collcheck: rank [0-9]*, cp rank [0-9]* of $cp: " "$T/$name.log")
  [ "$n" -eq "$ranks" ] || { tail -5 "$T/$name.log"; fail "$name: $n ranks reported their checks, expected $ranks"; }
  local due="all-to-all by columns $STEPS/$STEPS, by rows $STEPS/$STEPS, 1-D all-gather $STEPS/$STEPS, 1-D reduce-scatter $STEPS/$STEPS"
  n=$(grep "collcheck: rank" "$T/$name.log" | grep -c "exact forward/backward: $due\$")
  [ "$n" -eq "$ranks" ] || { grep "collcheck: rank" "$T/$name.log"; fail "$name: not every check ran $STEPS times each way"; }
  echo "ok   $name: on each of $ranks ranks (cp $cp) $due (forward/backward), every element exact"
}
run cp3 3 --training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1 --parallelism.context_parallel_degree=3
checked cp3 3 3
run fsdp2_cp2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.context_parallel_degree=2
grep -q "dp_shard 2, cp 2, tp 1" "$T/fsdp2_cp2.log" || fail "fsdp2_cp2 did not run with dp_shard 2 x cp 2"
checked fsdp2_cp2 4 2
