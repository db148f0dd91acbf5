#!/usr/bin/env bash
# Float8 on the MoE experts' grouped GEMMs (quantize.dense.float8.grouped_mm_fqns; torchtitan's
# quantize.grouped_mm.float8 / .mx): qwen3 debugmodel_moe shrunk (2 blocks, 8 experts of hidden 64,
# top-2, seq 64, forced balance), the experts converted and the linear layers left in high precision.
#   - the report names the experts weights converted and the linears left alone;
#   - rowwise and mxfp8 follow the high-precision run of the same seed: no NaN, every loss of the curve
#     within F8MOE_BOUND (relative) of it;
#   - EP 2 with the experts in float8 against one rank: the first step (same weights) within 1e-6
#     relative, loss and grad norm: the rowwise scales are per token, per expert channel and per column
#     of an expert's whole segment, and EP's all-to-all hands the expert's owner exactly the rows one
#     rank's segment holds. Later steps start from weights that differ by the reordered sums' ulps, and
#     a cast turns an ulp that crosses an e4m3 rounding midpoint into a whole fp8 step (6-12% of that
#     element): FSDP 2 without EP drifts the same way (step 2 loss 2.0e-6 from one rank, equal to
#     EP 2's), where the high-precision experts stay below 1e-7 (moe_layouts.sh). The curve is held to
#     F8MOE_LAYOUT_BOUND, about 3x the largest gap measured over 20 steps (3.3e-5);
#   - torchtitan's spellings (model.converters, quantize.grouped_mm.*) are the plugin's keys: the same
#     losses, bit for bit; a misspelt recipe is one line naming the key, exit 2.
set -u
if [ "${BUILD:-build}" = build-san ]; then # minutes of float8 emulation; test_float8_grouped covers the casts there
  echo "skipped under SANITIZE=1 (test_float8_grouped covers the grouped GEMMs there)"; exit 0; fi
STEPS=${STEPS:-20}
. tests/cli/lib/layouts.sh
# the measured gap to high precision (2026-12-07, 20 steps): rowwise 0.0017%, mxfp8 0.0023% of the loss
# at most over the curve; the bound is about 10x that
F8MOE_BOUND=${F8MOE_BOUND:-2e-4}
F8MOE_LAYOUT_BOUND=${F8MOE_LAYOUT_BOUND:-1e-4}
moe=(--model.name=qwen3 --model.flavor=debugmodel_moe --model.n_layers=2 --model.n_experts=8 --model.top_k=2
     --model.moe_hidden=64 --model.vocab_size=2048 --optimizer.lr=3e-4 --model.moe_force_load_balance=true)
experts=(--quantize.dense.float8.enable=true --quantize.dense.float8.linears=false
         --quantize.dense.float8.grouped_mm_fqns=experts)
loss_col() { grep '"loss"' "$T/$1/metrics.jsonl" | sed 's/.*"loss": \([-0-9.e+naif]*\).*/\1/'; }
curve_within() { # REF RUN: every loss of RUN within F8MOE_BOUND of REF's, no NaN
  paste -d' ' <(loss_col "$1") <(loss_col "$2") | awk -v name="$2 vs $1" -v n="$STEPS" -v bound="$F8MOE_BOUND" '
    { if ($2 != $2 + 0) nan = 1; g = ($2 - $1) / $1; if (g < 0) g = -g; if (g > w) w = g; last = $2; ref = $1 }
    END { ok = !nan && NR == n && w <= bound
          printf "%s %s: %d steps, max loss gap %.4f%% (bound %g%%), final %.4f vs %.4f\n", ok ? "ok  " : "FAIL", name, NR,
                 100 * w, 100 * bound, last, ref; exit !ok }'
}
fails=0
run hp 1 "${moe[@]}" --training.local_batch_size=8
run rowwise 1 "${moe[@]}" --training.local_batch_size=8 "${experts[@]}"
run mxfp8 1 "${moe[@]}" --training.local_batch_size=8 "${experts[@]}" --quantize.dense.float8.grouped_mm_recipe=mxfp8
for w in w1 w2 w3; do
  grep -q "float8: layers.1.moe.experts.$w converted" "$T/rowwise.log" || fail "rowwise: experts.$w not reported converted"
done
grep -q "float8: layers.0.attention.wq.weight stays in high precision (linears: false)" "$T/rowwise.log" ||
  fail "rowwise: the linears were not left in high precision"
grep -q "float8 experts (mxfp8): emulated" "$T/mxfp8.log" || fail "mxfp8: no notice of the experts' recipe"
cmp -s <(loss_col hp) <(loss_col rowwise) && fail "the rowwise run's losses are the high-precision run's: nothing was cast"
curve_within hp rowwise || fails=$((fails + 1))
curve_within hp mxfp8 || fails=$((fails + 1))
# the plan of each: the experts' casts in its float8 memory, and its peak the run's within 2% (without
# them it was 2.8% short under rowwise: 160.8 MB planned against 165.4 MB held, on 2026-12-07)
for r in rowwise mxfp8; do
  extra=(); [ $r = mxfp8 ] && extra=(--quantize.dense.float8.grouped_mm_recipe=mxfp8)
  "$CTITAN" plan "${common[@]}" "${moe[@]}" --training.local_batch_size=8 "${experts[@]}" "${extra[@]}" \
    --hardware h100-sxm --gpus 1 --json >"$T/$r.plan.json" || fail "$r: ctitan plan"
  python3 - "$T/$r.plan.json" "$T/$r/metrics.jsonl" $r <<'PY' || fails=$((fails + 1))
import json, sys
m = json.load(open(sys.argv[1]))["layouts"][0]["memory_gib"]
planned, f8 = (m["total"] - m["overhead"]) * 2**30, m["float8"] * 2**30
held = max(json.loads(l)["memory"]["peak_bytes"] for l in open(sys.argv[2]) if '"loss"' in l)
ok = f8 > 0 and abs(planned - held) <= 0.02 * held
print("%s %s experts: planned peak %.0f bytes (float8 %.0f) against %d held (ratio %.4f, bound 2%%)"
      % ("ok  " if ok else "FAIL", sys.argv[3], planned, f8, held, planned / held))
sys.exit(0 if ok else 1)
PY
done
# EP 2 (dp_shard 2: 4 sequences a rank) against one rank with its batch of 8, both with the experts in float8
run ep2 2 "${moe[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.expert_parallel_degree=2 "${experts[@]}"
first_step() { grep -m1 '"loss"' "$T/$1/metrics.jsonl" | sed 's/.*"loss": \([-0-9.e+naif]*\), "grad_norm": \([-0-9.e+naif]*\).*/\1 \2/'; }
paste -d' ' <(first_step rowwise) <(first_step ep2) | awk '
  function gap(a, b) { d = a - b; if (d < 0) d = -d; return d / (a < 0 ? -a : a) }
  { gl = gap($1, $3); gg = gap($2, $4); ok = NF == 4 && gl <= 1e-6 && gg <= 1e-6
    printf "%s ep2 vs rowwise, step 1: loss rel gap %.1e, grad_norm %.1e (bound 1e-6)\n", ok ? "ok  " : "FAIL", gl, gg
    exit !ok }' || fails=$((fails + 1))
CURVE_TOL=$F8MOE_LAYOUT_BOUND compare rowwise ep2 "$STEPS" || fails=$((fails + 1))
# torchtitan's spellings
run tt 1 "${moe[@]}" --training.local_batch_size=8 --model.converters=quantize.grouped_mm.float8 \
  --quantize.grouped_mm.float8.fqns=experts
cmp -s <(loss_col tt) <(loss_col rowwise) || fail "quantize.grouped_mm.float8 is not the rowwise experts run"
run ttmx 1 "${moe[@]}" --training.local_batch_size=8 --model.converters=quantize.grouped_mm.mx \
  --quantize.grouped_mm.mx.fqns=experts
cmp -s <(loss_col ttmx) <(loss_col mxfp8) || fail "quantize.grouped_mm.mx is not the mxfp8 experts run"
echo "ok   torchtitan's quantize.grouped_mm.float8 / .mx give the plugin's rowwise / mxfp8 losses"
"$CTITAN" train "${common[@]}" "${moe[@]}" "${experts[@]}" --quantize.dense.float8.grouped_mm_recipe=rowwsie \
  --job.dump_folder="$T/bad" >"$T/bad.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "grouped_mm_recipe" "$T/bad.log" || { cat "$T/bad.log"; fail "a misspelt grouped_mm_recipe: exit $rc"; }
echo "ok   a misspelt grouped_mm_recipe: $(grep -m1 grouped_mm_recipe "$T/bad.log")"
[ $fails -eq 0 ] && echo "float8_moe: ok" || { echo "float8_moe: $fails failed"; exit 1; }
