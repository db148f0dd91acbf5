#!/usr/bin/env bash
# Shared (tied) parameters, model.h's share: llama3 with tie_word_embeddings (the output head reuses
# tok_embeddings.weight, as Llama 3.2 1B/3B) follows the one-rank curve at 1e-6 under FSDP 2 (both
# reshard policies), HSDP 2x2, DDP 2, ZeRO-1 and ZeRO-2 on 2 ranks, TP 2, PP 2 (1F1B and a zero-bubble schedule, the table on
# stage 0 and its use on stage 1) and PP 2 x FSDP 2; a checkpoint written under FSDP 2 holds the
# table once and resumes on one rank. And the silent case is gone: a pack that computes with a
# parameter in a unit that neither declared nor shared it stops with one line naming the tensor and
# both units (tests/plugins/tied_head.c, built here with the SDK headers alone); and that pack's
# shared head follows, on one rank and under FSDP 2, the curve of the same model with both uses in
# one unit, where the tape alone sums the table's two gradients.
set -u
STEPS=${STEPS:-8}
. tests/cli/lib/layouts.sh
tie=(--model.tie_word_embeddings=true --model.n_layers=2 --optimizer.lr=${TIE_LR:-3e-4})
lrun() { local name=$1 n=$2; shift 2; run "$name" "$n" "${tie[@]}" "$@"; }
lrun single 1 --training.local_batch_size=8
lrun fsdp2 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2
lrun fsdp2_never 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.fsdp_reshard_after_forward=never
lrun hsdp2x2 4 --training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=2
lrun ddp2 2 --training.local_batch_size=4 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=1
lrun zero1 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 --parallelism.dp_strategy=zero1
lrun zero2 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 --parallelism.dp_strategy=zero2
lrun tp2 2 --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2
pp=(--training.local_batch_size=8 --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_microbatch_size=2)
lrun pp2 2 "${pp[@]}" --parallelism.pipeline_parallel_schedule=1F1B
lrun pp2_zb 2 "${pp[@]}" --parallelism.pipeline_parallel_schedule=InterleavedZeroBubble \
  --parallelism.pipeline_parallel_layers_per_stage=1 --activation_checkpoint.mode=full
lrun pp2_fsdp2 4 --training.local_batch_size=4 --parallelism.pipeline_parallel_degree=2 \
  --parallelism.data_parallel_shard_degree=2 --parallelism.pipeline_parallel_microbatch_size=2
for r in fsdp2 fsdp2_never hsdp2x2 ddp2 zero1 zero2 tp2 pp2 pp2_zb pp2_fsdp2; do compare single $r "$STEPS" || exit 1; done
# counted once: 2.23M parameters untied would be 2.75M
grep -q "2.230M parameters" "$T/single.log" || fail "the tied model's parameter count: $(grep 'parameters' "$T/single.log")"
echo "ok   the tied table is counted once (2.230M parameters)"

# a checkpoint under FSDP 2 holds tok_embeddings.weight and no output.weight, and resumes on one rank
half=$((STEPS / 2))
lrun ck_fsdp2 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --checkpoint.enable=true --checkpoint.interval=$half
python3 - "$T/ck_fsdp2/checkpoint/step-$half/metadata.json" <<'PY' || fail "checkpoint tensors"
import json, sys
t = json.load(open(sys.argv[1]))["tensors"]
assert "tok_embeddings.weight" in t and not any(k.startswith("output.weight") for k in t), sorted(t)[:6]
PY
echo "ok   the FSDP 2 checkpoint holds the tied table once (no output.weight)"
mkdir -p "$T/resume/checkpoint" && cp -r "$T/ck_fsdp2/checkpoint/step-$half" "$T/resume/checkpoint/"
lrun resume 1 --training.local_batch_size=8 --checkpoint.enable=true
grep -q "resuming after step $half" "$T/resume.log" || fail "resume: did not resume"
same_curve "one rank resumed from FSDP 2's step-$half checkpoint" "$T/ck_fsdp2/metrics.jsonl" \
  "$T/resume/metrics.jsonl" $((STEPS - half)) $((half + 1)) || exit 1

# the silent case: a use outside the declared units is an error naming it
cc -Isdk/include -std=c11 -Wall -Wextra -Werror -shared -fPIC -o "$T/tied_head.so" tests/plugins/tied_head.c ||
  fail "build tests/plugins/tied_head.c"
th=(--model.name="$T/tied_head.so" --model.flavor=tiny --model.tie_word_embeddings=__unset__)
thp=(--model.name="$T/tied_head.so" --model.flavor=tiny)
bad() { # ranks args...: the undeclared use must fail with the message
  local n=$1 out rc; shift
  if [ "$n" = 1 ]; then out=$("$CTITAN" train "${common[@]}" "${thp[@]}" --model.share=false --job.dump_folder="$T/bad$n" "$@" 2>&1)
  else out=$("$CTITAN" launch -n "$n" train "${common[@]}" "${thp[@]}" --model.share=false --job.dump_folder="$T/bad$n" "$@" 2>&1); fi
  rc=$?
  [ "$rc" -ne 0 ] || fail "an undeclared use of wte trained on $n rank(s)"
  echo "$out" | grep -q "linear in unit 1 (lm_head) uses parameter 'wte.weight' of unit 0: a parameter used by several units must be shared" ||
    { echo "$out" | tail -5; fail "no clear error for the undeclared use on $n rank(s)"; }
  echo "ok   undeclared use refused on $n rank(s), exit $rc: $(echo "$out" | grep -m1 "uses parameter" | sed 's/^.*model: //')"
}
bad 1 --training.local_batch_size=8
bad 2 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 --parallelism.fsdp_reshard_after_forward=never
run th_single 1 --training.local_batch_size=8 "${thp[@]}"
run th_fused 1 --training.local_batch_size=8 "${thp[@]}" --model.fused=true
compare th_fused th_single "$STEPS" || exit 1 # the copies' summed gradient is the tape's own sum
run th_fsdp2 2 --training.local_batch_size=4 "${thp[@]}" \
  --parallelism.data_parallel_shard_degree=2 --parallelism.fsdp_reshard_after_forward=never
compare th_single th_fsdp2 "$STEPS" || exit 1
