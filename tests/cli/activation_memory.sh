#!/usr/bin/env bash
# Activation memory is planned by liveness (core/engine/runtime.h): a unit's saved activations,
# recompute and activation gradients share one region that is given back unit by unit in backward,
# and the boundary gradients alternate between two buffers. So under full activation checkpointing
# each more block costs what it keeps, its input (B x T x dim floats), and nothing else: no boundary
# gradient stays behind per block. Measured from the arenas' device memory (metrics.jsonl's
# "activations", last step: the fourth, once an arena that grew in the first step has been remade
# and shrunk to what a step needs) for llama3 debugmodel with 4 and 10 blocks, fp32, one rank; the
# planner predicts the same bytes for both (within 2%). Under bf16 compute (no AC) a block keeps about
# half its f32 bytes, and the planner follows each checkpointing mode.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/data.sh
test_data "$T" 2048 || fail "test data"
B=4 S=128 D=256
args=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.tokenizer_path="$T/tok.model"
      --training.seq_len=$S --training.local_batch_size=$B --training.steps=4 --metrics.log_freq=1
      --generate.max_new_tokens=0 --training.mixed_precision_param=float32 --device.threads=1
      --activation_checkpoint.mode=full)
act() { grep '"loss"' "$T/$1/metrics.jsonl" | tail -1 | sed 's/.*"activations": \([0-9]*\).*/\1/'; }
for L in 4 10; do
  "$CTITAN" train "${args[@]}" --model.n_layers=$L --job.dump_folder="$T/l$L" >"$T/l$L.log" 2>&1 ||
    { tail -5 "$T/l$L.log"; fail "train with $L layers"; }
  "$CTITAN" plan "${args[@]}" --model.n_layers=$L --hardware h100-sxm --gpus 1 --json >"$T/p$L.json" 2>"$T/p$L.err" ||
    { cat "$T/p$L.err"; fail "plan with $L layers"; }
done
a4=$(act l4) a10=$(act l10)
[ -n "$a4" ] && [ -n "$a10" ] || fail "no activations in the metrics"
# what the checkpointed forward and recompute give back at each tensor's last use (from the second
# step on: core/engine/liveness.c) changes no value: the same losses and gradient norms, bit for
# bit, as with nothing checkpointed
"$CTITAN" train "${args[@]}" --model.n_layers=4 --activation_checkpoint.mode=none --job.dump_folder="$T/none4" \
  >"$T/none4.log" 2>&1 || { tail -5 "$T/none4.log"; fail "train with AC none"; }
curve() { grep '"loss"' "$T/$1/metrics.jsonl" | sed 's/.*"loss": \([^,]*\), "grad_norm": \([^,]*\),.*/\1 \2/'; }
[ "$(curve l4 | wc -l)" -eq 4 ] && [ "$(curve l4)" = "$(curve none4)" ] ||
  fail "full AC's curve is not AC none's: $(curve l4 | tr '\n' ';') against $(curve none4 | tr '\n' ';')"
echo "ok    full AC follows AC none bit for bit over 4 steps (liveness scripts from step 2 on)"
# one kept input per block, plus at most what moves the peak from one unit's backward to another's
# (a boundary gradient left behind per block would make it 2x)
awk -v a=$a4 -v b=$a10 -v per=$((B * S * D * 4)) 'BEGIN { d = (b - a) / 6; r = d / per
  printf "%s  full AC: %d bytes of activations with 4 blocks, %d with 10: %.0f per block = %.3f x its kept input (%d)\n",
         (r > 0.97 && r < 1.25) ? "ok  " : "FAIL", a, b, d, r, per; exit !(r > 0.97 && r < 1.25) }' || exit 1
for L in 4 10; do
  python3 - "$T/p$L.json" "$(act l$L)" $L <<'EOF' || exit 1
import json, sys
p = json.load(open(sys.argv[1]))
mem = p["layouts"][0]["memory_gib"]
pred = sum(mem[k] for k in ("activations", "transient", "logits")) * float(1 << 30)
meas = float(sys.argv[2])
r = pred / meas
ok = 0.98 < r < 1.02
print("%s  %s blocks: the planner's activations %.0f bytes, measured %.0f (ratio %.4f)" % ("ok  " if ok else "FAIL", sys.argv[3], pred, meas, r))
sys.exit(0 if ok else 1)
EOF
done

# bf16 compute: what a block keeps from its forward for its backward waits in bf16 (saved
# statistics, rstd and lse, stay f32), so without checkpointing each more block costs about half
# its f32 bytes; the head's loss runs in blocks of rows (linear_cross_entropy), and the planner
# still predicts the arenas to within 2%, for each checkpointing mode
none=("${args[@]/--activation_checkpoint.mode=full/--activation_checkpoint.mode=none}")
for dt in float32 bfloat16; do
  for L in 4 10; do
    "$CTITAN" train "${none[@]}" --model.n_layers=$L --training.mixed_precision_param=$dt --job.dump_folder="$T/$dt$L" \
      >"$T/$dt$L.log" 2>&1 || { tail -5 "$T/$dt$L.log"; fail "train $dt with $L layers"; }
  done
done
awk -v f4=$(act float324) -v f10=$(act float3210) -v b4=$(act bfloat164) -v b10=$(act bfloat1610) 'BEGIN {
  f = (f10 - f4) / 6; b = (b10 - b4) / 6; r = b / f; ok = r > 0.45 && r < 0.56
  printf "%s  no AC: a block keeps %.0f bytes under bf16 compute, %.0f in f32 (%.3f x)\n", ok ? "ok  " : "FAIL", b, f, r
  exit !ok }' || exit 1
for ac in none selective full; do
  bf=("${none[@]/--activation_checkpoint.mode=none/--activation_checkpoint.mode=$ac}" --model.n_layers=4
      --training.mixed_precision_param=bfloat16)
  "$CTITAN" train "${bf[@]}" --job.dump_folder="$T/bf_$ac" >"$T/bf_$ac.log" 2>&1 || { tail -5 "$T/bf_$ac.log"; fail "bf16 $ac"; }
  "$CTITAN" plan "${bf[@]}" --hardware h100-sxm --gpus 1 --json >"$T/pbf_$ac.json" 2>"$T/pbf_$ac.err" ||
    { cat "$T/pbf_$ac.err"; fail "plan bf16 $ac"; }
  python3 - "$T/pbf_$ac.json" "$(act bf_$ac)" "bf16, AC $ac" <<'PY' || exit 1
import json, sys
mem = json.load(open(sys.argv[1]))["layouts"][0]["memory_gib"]
pred = sum(mem[k] for k in ("activations", "transient", "logits")) * float(1 << 30)
meas = float(sys.argv[2])
ok = 0.98 < pred / meas < 1.02
print("%s  %s: the planner's activations %.0f bytes, measured %.0f (ratio %.4f)" % ("ok  " if ok else "FAIL", sys.argv[3], pred, meas, pred / meas))
sys.exit(0 if ok else 1)
PY
done

# per-op checkpointing, units in order: a block's forward temporaries sit in the saved arena above
# what it keeps and are given back when its forward ends, and its recompute goes there too, so the
# arenas hold the live peak (plus the region's 2 MiB steps), not a scratch arena's high mark on top
# of the saved arena's (1.20 x the live peak before, 1.07 x now)
op=("${args[@]/--activation_checkpoint.mode=full/--activation_checkpoint.mode=selective}"
    --activation_checkpoint.selective_ac_option=op --model.n_layers=4)
"$CTITAN" train "${op[@]}" --job.dump_folder="$T/op" >"$T/op.log" 2>&1 || { tail -5 "$T/op.log"; fail "AC op"; }
[ "$(curve op)" = "$(curve none4)" ] || fail "AC op's curve is not AC none's"
grep '"loss"' "$T/op/metrics.jsonl" | tail -1 | python3 -c '
import json, sys
m = json.load(sys.stdin)["memory"]
r = m["activations"] / m["activations_live_peak"]
ok = r < 1.10
print("%s  AC op: arenas %d bytes for a live peak of %d (%.3f x), the same curve as AC none" % ("ok  " if ok else "FAIL", m["activations"], m["activations_live_peak"], r))
sys.exit(0 if ok else 1)' || exit 1

# f32 without the blocked loss: the logits' gradient takes the logits' place a block of rows at a
# time (core/engine/tape.c, cross_entropy_bwd_in_place), so the head holds them once, not twice
# (vocab 32000: 1.10 x the logits' bytes live at the peak, 2.05 x before; each row's gradient is
# its own, so the values are the same), and the plan follows
vb=("${args[@]}" --model.n_layers=2 --model.vocab_size=32000)
"$CTITAN" train "${vb[@]}" --job.dump_folder="$T/vocab" >"$T/vocab.log" 2>&1 || { tail -5 "$T/vocab.log"; fail "vocab 32000"; }
"$CTITAN" plan "${vb[@]}" --hardware h100-sxm --gpus 1 --json >"$T/pvocab.json" 2>"$T/pvocab.err" ||
  { cat "$T/pvocab.err"; fail "plan vocab 32000"; }
grep '"loss"' "$T/vocab/metrics.jsonl" | tail -1 | python3 -c '
import json, sys
m = json.load(sys.stdin)["memory"]
logits = '$((B * S * 32000 * 4))'
r = m["activations_live_peak"] / logits
mem = json.load(open(sys.argv[1]))["layouts"][0]["memory_gib"]
pred = sum(mem[k] for k in ("activations", "transient", "logits")) * float(1 << 30)
ok = r < 1.2 and 0.98 < pred / m["activations"] < 1.02
print("%s  f32 head, vocab 32000: live peak %d bytes = %.3f x the logits (%d); planned %.0f against %d held" % ("ok  " if ok else "FAIL", m["activations_live_peak"], r, logits, pred, m["activations"]))
sys.exit(0 if ok else 1)' "$T/pvocab.json" || exit 1
