#!/usr/bin/env bash
# The Muon optimizer (plugins/muon) computes the same update however the weights are laid out: llama3
# debugmodel (2 layers, fp32) on one rank, under FSDP 2, TP 2, PP 2 and FSDP 2 x TP 2 (real MPI ranks): 8-step loss
# and grad-norm curves within 1e-6 relative of the single rank, and the loss falls. Its momentum
# resumes from a checkpoint exactly (and resharded, FSDP 2 to one rank). A bad Muon or AdamW option
# exits 2 with one line naming the key.
set -u
STEPS=8
. tests/cli/lib/layouts.sh
# llama3_debug.yaml with the optimizer section replaced by Muon's (lr as AdamW's: Moonlight's scale)
awk '/^optimizer:/ { print "optimizer:\n  name: muon\n  lr: 3e-3"; skip = 1; next }
     skip && /^[^ ]/ { skip = 0 } !skip' configs/llama3_debug.yaml >"$T/muon.yaml"
common[0]="$T/muon.yaml"
common+=(--model.n_layers=2 --training.seq_len=32)
ckpt=(--checkpoint.enable=true --checkpoint.interval=4)
run single 1 --training.local_batch_size=8 "${ckpt[@]}"
run fsdp2 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 "${ckpt[@]}"
run tp2 2 --training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1 --parallelism.tensor_parallel_degree=2
run fsdp2_tp2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 --parallelism.tensor_parallel_degree=2
# each stage's ranks skip the other stage's slots (no local storage) alike
run pp2 2 --training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1 --parallelism.pipeline_parallel_degree=2 \
    --parallelism.pipeline_parallel_schedule=1F1B
grep -q "strategy fsdp" "$T/fsdp2.log" || fail "fsdp2 did not run FSDP"
grep -q "tp 2" "$T/tp2.log" || fail "tp2 did not run with tp 2"
grep -qi "muon" "$T/single.log" || fail "single did not name the muon optimizer"
compare single fsdp2 $STEPS || exit 1
compare single tp2 $STEPS || exit 1
compare single pp2 $STEPS || exit 1
compare single fsdp2_tp2 $STEPS || exit 1
# the momentum is checkpointed like AdamW's moments: a resume from step 4 on one rank is exact, and
# FSDP 2's step 4 continued on one rank follows the single rank's curve
resume() { mkdir -p "$T/$1/checkpoint" && cp -r "$T/$2/checkpoint/step-4" "$T/$1/checkpoint/"; }
resume resumed single
run resumed 1 --training.local_batch_size=8 "${ckpt[@]}"
grep -q "resuming after step 4" "$T/resumed.log" || fail "did not resume after step 4"
cmp -s <(curve_records "$T/single/metrics.jsonl" | tail -n +5) <(curve_records "$T/resumed/metrics.jsonl") ||
  fail "Muon: steps 5-8 resumed on one rank differ from the uninterrupted run"
echo "ok   Muon resumed from step 4 on one rank: steps 5-8 bit-identical"
resume fsdp2_on_one fsdp2
run fsdp2_on_one 1 --training.local_batch_size=8 "${ckpt[@]}"
grep -q "resuming after step 4" "$T/fsdp2_on_one.log" || fail "FSDP 2's checkpoint: did not resume after step 4"
same_curve "FSDP 2's step 4 continued on one rank" "$T/single/metrics.jsonl" "$T/fsdp2_on_one/metrics.jsonl" 4 5 || exit 1
curve_records "$T/single/metrics.jsonl" | awk 'NR == 1 { first = $1 } { last = $1 }
  END { ok = last < first - 0.05; printf "%s loss falls under Muon: %.4f -> %.4f over %d steps\n", ok ? "ok  " : "FAIL", first, last, NR; exit !ok }' ||
  exit 1

# bad options: status 2, one stderr line naming the key
fails=0
bad() { # name key-pattern message-pattern args...
  local name=$1 key=$2 msg=$3; shift 3
  "$CTITAN" train "${common[@]}" --job.dump_folder="$T/bad" "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q -- "$key" "$T/err" && grep -qE -- "$msg" "$T/err"; then
    echo "ok   $name: $(cat "$T/err")"
  else echo "FAIL $name: status $rc, wanted 2 and one line naming $key:"; sed 's/^/     /' "$T/err"; fails=$((fails + 1)); fi
}
bad "momentum 1" "optimizer.momentum" "1" --optimizer.momentum=1
bad "ns_steps 0" "optimizer.ns_steps" "0" --optimizer.ns_steps=0
bad "adjust_lr unknown" "optimizer.adjust_lr" "moonlight" --optimizer.adjust_lr=sideways
bad "weight_decay negative" "optimizer.weight_decay" "-1" --optimizer.weight_decay=-1
bad "adamw_beta2 1" "optimizer.adamw_beta2" "1" --optimizer.adamw_beta2=1
bad "adamw_eps 0" "optimizer.adamw_eps" "0" --optimizer.adamw_eps=0
bad "muon_exclude empty pattern" "optimizer.muon_exclude" "non-empty" "--optimizer.muon_exclude=output.weight,,x"
bad "an AdamW key under muon" "optimizer.beta1" "beta1" --optimizer.beta1=0.9
[ $fails -eq 0 ] || exit 1
