#!/usr/bin/env bash
# strategy_list: parallelism.strategies, the strategies in the order they are applied.
# - The list's order is the order they wrap the builder: tests/plugins/axisprobe.c (a third party's
#   strategy for the tp axis, and axisprobe_cp.c, the same for cp: neither known to the core, both
#   loaded from the list by path) log their first linear; the pack calls the outermost builder, the
#   last item's, so the lines come in the reverse of the list's order. Checked in the planner (one
#   process, a 4-rank tp 2 x cp 2 layout; the list given in YAML, then reversed on the command line)
#   and in a 4-rank training run, both orders.
# - A third party's axis strategy from the list trains: axisprobe serving tp 2 (parameters whole on
#   both ranks) computes one rank's curve within 1e-6.
# - The default list is torchtitan's order: tp 2 with `strategies: [tp, dp]` spelled out gives the
#   default run's losses and grad norms bit for bit.
# - Refused with exit 2 and one line naming the key: the data-parallel strategy before an axis's, two
#   strategies for one axis, a plugin in the list that does not say what it serves, an axis of degree 2
#   with no strategy, a *_strategy key whose plugin is not in the list, an empty item.
set -u
STEPS=3
. tests/cli/lib/layouts.sh
BUILD=${BUILD:-build}
P=$(pwd)/$BUILD/tests/plugins
for so in axisprobe axisprobe_cp hookcheck; do
  [ "$P/ctitan-$so.so" -nt tests/plugins/$so.c ] && [ "$P/ctitan-$so.so" -nt tests/plugins/axisprobe.c ] || fail "$P/ctitan-$so.so: not built (make $BUILD/tests/plugins/ctitan-$so.so)"
done
TP=$P/ctitan-axisprobe.so CP=$P/ctitan-axisprobe_cp.so

# order LOG RANK: the probes' first-linear lines of world rank RANK (-1: planning instances), "outer,inner"
order() { grep -F "] first linear (rank $2)" "$1" | sed 's/.*\[warn \([a-z_]*\)\].*/\1/' | paste -sd, -; }

# --- the planner: the list in YAML, then reversed on the command line ---
sed '/^generate:/,$d' configs/llama3_debug.yaml >"$T/list.yaml"
printf 'parallelism:\n  tensor_parallel_degree: 2\n  context_parallel_degree: 2\n  strategies: [%s, %s]\n' "$TP" "$CP" >>"$T/list.yaml"
"$CTITAN" plan "$T/list.yaml" --hardware h100-sxm --gpus 4 >"$T/plan1.out" 2>"$T/plan1.err" || { cat "$T/plan1.err"; fail "plan with [axisprobe, axisprobe_cp]"; }
"$CTITAN" plan "$T/list.yaml" --hardware h100-sxm --gpus 4 --parallelism.strategies="$CP,$TP" >"$T/plan2.out" 2>"$T/plan2.err" ||
  { cat "$T/plan2.err"; fail "plan with [axisprobe_cp, axisprobe]"; }
o1=$(order "$T/plan1.err" -1 | cut -d, -f1-2) o2=$(order "$T/plan2.err" -1 | cut -d, -f1-2)
[ "$o1" = "axisprobe_cp,axisprobe" ] && [ "$o2" = "axisprobe,axisprobe_cp" ] ||
  fail "planner: first linears by [tp probe, cp probe]: '$o1' (expected axisprobe_cp,axisprobe), reversed: '$o2'"
echo "ok   planner: [axisprobe, axisprobe_cp] -> the pack enters $o1; reversed -> $o2"

# --- refusals: exit 2, one line, the key named ---
refuse() { # NAME PATTERN ARGS...
  local name=$1 pat=$2 out st; shift 2
  out=$("$CTITAN" plan configs/llama3_debug.yaml --hardware h100-sxm --gpus 4 "$@" 2>&1 >/dev/null); st=$?
  [ $st -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && printf '%s' "$out" | grep -qE -- "$pat" ||
    fail "$name: status $st, wanted one line matching /$pat/: $out"
  echo "ok   refused, $name: $out"
}
tp2=(--parallelism.tensor_parallel_degree=2)
refuse "data parallel first" "parallelism.strategies: 'fsdp' \(data parallel\) comes before 'tp' \(the tp axis\)" \
  "${tp2[@]}" --parallelism.strategies=fsdp,tp
refuse "two for one axis" "parallelism.strategies: 'tp' and '.*axisprobe.so' both serve the tp axis" \
  "${tp2[@]}" --parallelism.strategies="tp,$TP,dp"
refuse "a plugin that does not say" "parallelism.strategies: strategy 'hookcheck' does not say what it serves" \
  "${tp2[@]}" --parallelism.strategies="tp,$P/ctitan-hookcheck.so"
refuse "an axis with none" "parallelism.strategies: no strategy serves the tp axis, whose degree \(parallelism.tensor_parallel_degree\) is 2" \
  "${tp2[@]}" --parallelism.strategies=dp
refuse "a key outside the list" "parallelism.tp_strategy: '.*axisprobe.so' is not an item of parallelism.strategies" \
  "${tp2[@]}" --parallelism.strategies=tp,dp --parallelism.tp_strategy="$TP"
refuse "an empty item" "parallelism.strategies: an empty item in 'tp,,dp'" "${tp2[@]}" --parallelism.strategies=tp,,dp

# --- training runs ---
run one 1
run probe_tp2 2 --parallelism.tensor_parallel_degree=2 --parallelism.strategies="$TP"
[ "$(grep -cE "\[warn axisprobe\] first linear \(rank [01]\)" "$T/probe_tp2.log")" -eq 2 ] || fail "probe_tp2: axisprobe did not run on both ranks"
grep -q "tp 2; strategy none" "$T/probe_tp2.log" || fail "probe_tp2 did not run with tp 2"
compare one probe_tp2 "$STEPS" || exit 1
run tp2 2 --parallelism.tensor_parallel_degree=2
run tp2_listed 2 --parallelism.tensor_parallel_degree=2 --parallelism.strategies=tp,dp
cmp -s <(curve_records "$T/tp2/metrics.jsonl") <(curve_records "$T/tp2_listed/metrics.jsonl") ||
  fail "tp 2: [tp, dp] spelled out differs from the default list"
echo "ok   tp 2: [tp, dp] spelled out gives the default list's $STEPS losses and grad norms bit for bit"
run order_a 4 --parallelism.tensor_parallel_degree=2 --parallelism.context_parallel_degree=2 --parallelism.strategies="$TP,$CP"
run order_b 4 --parallelism.tensor_parallel_degree=2 --parallelism.context_parallel_degree=2 --parallelism.strategies="$CP,$TP"
oa=$(order "$T/order_a.log" 0) ob=$(order "$T/order_b.log" 0)
[ "$oa" = "axisprobe_cp,axisprobe" ] && [ "$ob" = "axisprobe,axisprobe_cp" ] ||
  fail "4-rank runs: rank 0's first linears by [tp probe, cp probe]: '$oa', reversed: '$ob'"
echo "ok   4-rank runs: [axisprobe, axisprobe_cp] -> the pack enters $oa; reversed -> $ob"
echo "strategy_list: ok"
