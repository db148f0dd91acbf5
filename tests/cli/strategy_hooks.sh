#!/usr/bin/env bash
# The host calls strategy hooks in the order strategy.h documents ("Life of a run"), with and
# without pipeline parallel: tests/plugins/hookcheck.c, a replicating strategy loaded by path as
# parallelism.dp_strategy, fails the run naming the rule on any call out of order (pairing per
# unit, zero-bubble windows counted, post_backward once per microbatch, last only on a unit's
# final one, units of this rank only, finish_backward after all) and on a period with another
# number of microbatches than told. Runs 2 data-parallel replicas without PP, and PP 2 with every
# shipped schedule (2 accumulation steps of 4 microbatches); checks every rank's totals (pre_forward
# = units x microbatches x periods, ...) and the loss curve against one rank without a strategy.
# Also: PP 2 x FSDP 2 under ZBVZeroBubble (overlapping windows) keeps the one-rank curve with one
# gather and one reduce-scatter per step; the checker fails a run whose microbatch count it was told
# wrong, with status 1 and the rule named.
set -u
STEPS=2
. tests/cli/lib/layouts.sh
BUILD=${BUILD:-build}
so=$BUILD/tests/plugins/ctitan-hookcheck.so
if [ ! "$so" -nt tests/plugins/hookcheck.c ]; then # not built by make (or stale): build it here
  PC=$(PKG_CONFIG_PATH="$BUILD" pkg-config --cflags ctitan-sdk) || fail "no $BUILD/ctitan-sdk.pc"
  so=$T/ctitan-hookcheck.so
  cc $PC -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -o "$so" tests/plugins/hookcheck.c ||
    fail "cannot build the hookcheck strategy"
fi
case $so in /*) ;; *) so=$(pwd)/$so ;; esac
M=4; A=2 # microbatches per local batch (PP), accumulation steps per step
base=(--training.seq_len=32 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=1
      --parallelism.dp_strategy="$so")

# totals NAME RANKS PER_PERIOD PERIODS: each rank's line, counts consistent with the run's shape
totals() {
  local name=$1 ranks=$2 mb=$3 periods=$4 n
  n=$(grep -c "hookcheck totals:" "$T/$name.log")
  [ "$n" -eq "$ranks" ] || fail "$name: $n ranks logged hookcheck totals, expected $ranks"
  grep "hookcheck totals:" "$T/$name.log" | sed 's/.*hookcheck totals: //' |
    awk -v name="$name" -v mb="$mb" -v periods="$periods" -v steps="$STEPS" '
      { for (i = 1; i < NF; i += 2) v[$i] = $(i + 1)
        want = v["units"] * mb * periods
        if (v["units"] < 1 || v["pre_forward"] != want || v["post_forward"] != want || v["pre_backward"] != want ||
            v["post_backward"] != want || v["last"] != v["units"] * steps || v["finish_backward"] != periods) {
          print "FAIL " name ": " $0 " (expected " want " calls per hook, " v["units"] * steps " last, " periods " finishes)"; bad = 1 }
        if (v["max_open_windows"] > open) open = v["max_open_windows"] }
      END { if (!bad) print "ok   " name ": hook counts = units x " mb " microbatches x " periods " periods on every rank; most windows of one unit open at once " open
            exit bad }' || exit 1
}

run one 1 --training.seq_len=32 --training.local_batch_size=4 # the reference, no strategy
# without PP: 2 replicas (the checker all-reduces at last, as DDP), 2 accumulation steps of 2 sequences
run dp2 2 "${base[@]}" --training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.hookcheck_microbatches=1
totals dp2 2 1 $((STEPS * A))
compare one dp2 "$STEPS" || exit 1
for s in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble DualPipeV; do
  ac=none; case $s in *ZeroBubble) ac=full ;; esac # split backward halves with recomputed units
  run "pp2_$s" 2 "${base[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=$s \
    --activation_checkpoint.mode=$ac --parallelism.hookcheck_microbatches=$M
  totals "pp2_$s" 2 $M $((STEPS * A))
  compare one "pp2_$s" "$STEPS" || exit 1
done
# zero-bubble schedules overlap a unit's backward windows here (rank 1: I of microbatch 1 before W of 0);
# DualPipeV does not at this shape: each of its Is is followed by its own W before the unit's next I
for s in InterleavedZeroBubble ZBVZeroBubble; do
  grep -q "max_open_windows [2-9]" "$T/pp2_$s.log" || fail "pp2_$s: no rank had two backward windows of a unit open"
done

# FSDP under PP with overlapping windows: each unit gathered once per step and its gradients
# reduce-scattered once per step (at last), however many microbatches and accumulation steps
run pp2_fsdp2_zbv 4 --training.seq_len=32 --training.local_batch_size=4 --parallelism.pipeline_parallel_degree=2 \
  --parallelism.data_parallel_shard_degree=2 --parallelism.pipeline_parallel_schedule=ZBVZeroBubble \
  --activation_checkpoint.mode=full
compare one pp2_fsdp2_zbv "$STEPS" || exit 1
step_records pp2_fsdp2_zbv | sed -n 1p | sed 's/.*"params": \([0-9]*\),.*"all_gather": \([0-9]*\), "reduce_scatter": \([0-9]*\).*/\1 \2 \3/' |
  awk '{ if ($2 > 0 && $2 <= $1 && $3 == 2 * $2) { print "ok   pp2_fsdp2_zbv: step 1 gathered " $2 " bytes (rank 0'"'"'s shard, once; the largest rank holds " $1 ") and reduce-scattered " $3 " (= the full gradients, once) over 4 microbatches x 2 accumulation steps"; exit 0 }
         print "FAIL pp2_fsdp2_zbv: step 1 params " $1 ", all_gather " $2 ", reduce_scatter " $3 " bytes: expected one gather and one reduce-scatter per step"; exit 1 }' || exit 1

# the checker itself fails a run out of its rules: told 3 microbatches, it sees 4
out=$("$CTITAN" launch -n 2 train "${common[@]}" "${base[@]}" --parallelism.pipeline_parallel_degree=2 \
      --parallelism.hookcheck_microbatches=3 --job.dump_folder="$T/wrong" 2>&1); st=$?
[ $st -eq 1 ] && echo "$out" | grep -q "hook order rule 'microbatches' violated: finish_backward: unit [0-9]* saw the hooks of 4 microbatches" ||
  { echo "$out" | tail -4; fail "wrong microbatch count: status $st"; }
echo "ok   checker fails a wrong count (status 1): $(echo "$out" | grep -m1 "hook order rule" | cut -c1-160)"
