#!/usr/bin/env bash
# models/deepseek_v3 computes the same function on every layout it runs: the debugmodel shrunk (3 blocks, the
# first dense; MLA with v narrower than q and k; 8 experts of hidden 32, top-3 by softmax, 2 shared experts;
# seq 64), real routing with aux-loss-free balancing on (the expert bias moved after every step from the
# step's global counts), same seed and global batch. Against one rank, loss and grad-norm curves within 1e-6
# relative and the per-expert counts and expert biases the pack logs (model.moe_log_load) equal to one
# rank's, step by step: TP 2 (sequence parallel; MLA's heads split, the low-rank kv projection gathered and
# whole), FSDP 4, EP 2 x FSDP 2, EP 4, PP 2 x EP 2, EP 2 x CP 2 and EP 2 x TP 2 (4 ranks each: FSDP 2, EP 2,
# PP 2 and CP 2 alone are covered by these), and torchtitan's pp_dualpipev: PP 2 x EP 2 under DualPipeV with AC
# none (stages 1,1,1,2 units, so that rank 0, which logs, holds an MoE block in the V's last stage). EP 2 x FSDP
# 2's checkpoint, biases included, resumes on one rank on its curve, and PP 2 x EP 2's and DualPipeV's (each
# stage saving its blocks' biases, rank 0 holding the first and the last stage) on one rank's. Then the 671B routing
# (sigmoid over 4 groups, top-2 of the best 2, route_scale 2.5, normalised) with a low-rank q, one rank
# against EP 2 and against TP 2 without sequence parallel (wq_a and q_norm whole, their gradients summed over
# tp). Last, transformers' folder through `ctitan convert` and model.flavor: from_checkpoint, and
# torchtitan's TOML naming deepseek_v3.
set -u
STEPS=${STEPS:-4}
. tests/cli/lib/layouts.sh
ds=(--model.name=deepseek_v3 --model.flavor=debugmodel --model.dim=64 --model.n_layers=3 --model.n_heads=4
    --model.kv_lora_rank=32 --model.qk_nope_head_dim=16 --model.qk_rope_head_dim=8 --model.v_head_dim=16
    --model.inter_dim=128 --model.moe_inter_dim=32 --model.vocab_size=2048 --model.moe_log_load=true
    --model.load_balance_coeff=1e-3 --optimizer.lr=3e-4)
v3=(--model.score_func=sigmoid --model.n_expert_groups=4 --model.n_limited_groups=2 --model.top_k=2
    --model.route_scale=2.5 --model.route_norm=true --model.q_lora_rank=24 --model.n_shared_experts=1)
lines() { grep -o 'moe \(load\|bias\) step .*' "$T/$1.log"; }
same_lines() { # REF RUN: RUN's count and bias lines are REF's
  local got; got=$(lines "$2" | wc -l)
  if [ "$got" -gt 0 ] && [ "$(lines "$1" | grep -cxFf <(lines "$2"))" = "$got" ]; then
    echo "ok   per-expert counts and expert biases $2 vs $1: $got lines equal"
  else echo "FAIL per-expert counts and expert biases $2 vs $1"; diff <(lines "$1") <(lines "$2") | head -4; return 1; fi
}
fails=0
run single 1 "${ds[@]}" --training.local_batch_size=8
run tp2 2 "${ds[@]}" --training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1 \
  --parallelism.tensor_parallel_degree=2
run fsdp4 4 "${ds[@]}" --training.local_batch_size=2 --parallelism.data_parallel_shard_degree=4
run ep2fsdp2 4 "${ds[@]}" --training.local_batch_size=2 --parallelism.data_parallel_shard_degree=4 \
  --parallelism.expert_parallel_degree=2 --checkpoint.enable=true --checkpoint.interval=2
run ep4 4 "${ds[@]}" --training.local_batch_size=2 --parallelism.data_parallel_shard_degree=4 \
  --parallelism.expert_parallel_degree=4
run pp2ep2 4 "${ds[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.expert_parallel_degree=2 --checkpoint.enable=true \
  --checkpoint.interval=2
run dualpipev 4 "${ds[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.expert_parallel_degree=2 \
  --parallelism.pipeline_parallel_schedule=DualPipeV --activation_checkpoint.mode=none \
  --parallelism.pipeline_parallel_stage_units=1,1,1,2 --checkpoint.enable=true --checkpoint.interval=2
grep -q "pipeline: DualPipeV, 4 stages on 2 ranks" "$T/dualpipev.log" &&
  grep -q "stage 3 (rank 0): units 3-4 (layers.2 .. output)" "$T/dualpipev.log" ||
  { echo "FAIL dualpipev did not run DualPipeV in a V"; fails=$((fails + 1)); }
run ep2cp2 4 "${ds[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.context_parallel_degree=2 --parallelism.expert_parallel_degree=2
run ep2tp2 4 "${ds[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.expert_parallel_degree=2 --parallelism.tensor_parallel_degree=2
grep -q "ep 2 x efsdp 2 of dp_shard x cp" "$T/ep2fsdp2.log" || { echo "FAIL ep2fsdp2 did not run expert parallel"; fails=$((fails + 1)); }
for r in tp2 fsdp4 ep2fsdp2 ep4 pp2ep2 dualpipev ep2cp2 ep2tp2; do
  compare single $r "$STEPS" || fails=$((fails + 1))
  same_lines single $r || fails=$((fails + 1))
done
grep -q 'moe bias step 1 layers.1' "$T/single.log" || { echo "FAIL no expert bias update logged"; fails=$((fails + 1)); }
# the expert biases are checkpointed (ABI 2.20 buffers): EP 2 x FSDP 2's step-2 checkpoint resumes on one rank
# on its curve, routing by the restored biases (a bias left at zero would route other tokens from step 3 on)
mkdir -p "$T/resume/checkpoint" && cp -r "$T/ep2fsdp2/checkpoint/step-2" "$T/resume/checkpoint/"
run resume 1 "${ds[@]}" --training.local_batch_size=8 --checkpoint.enable=true
grep -q "resuming after step 2" "$T/resume.log" || { echo "FAIL resume: did not resume"; fails=$((fails + 1)); }
same_curve "one rank resumed from EP 2 x FSDP 2's step-2 checkpoint" "$T/ep2fsdp2/metrics.jsonl" \
  "$T/resume/metrics.jsonl" $((STEPS - 2)) 3 || fails=$((fails + 1))
same_lines ep2fsdp2 resume || fails=$((fails + 1))
# PP 2 x EP 2's checkpoint: each stage writes the biases of its own blocks
mkdir -p "$T/resumepp/checkpoint" && cp -r "$T/pp2ep2/checkpoint/step-2" "$T/resumepp/checkpoint/"
run resumepp 1 "${ds[@]}" --training.local_batch_size=8 --checkpoint.enable=true
same_curve "one rank resumed from PP 2 x EP 2's step-2 checkpoint" "$T/single/metrics.jsonl" \
  "$T/resumepp/metrics.jsonl" $((STEPS - 2)) 3 || fails=$((fails + 1))
same_lines single resumepp || fails=$((fails + 1))
mkdir -p "$T/resumedpv/checkpoint" && cp -r "$T/dualpipev/checkpoint/step-2" "$T/resumedpv/checkpoint/"
run resumedpv 1 "${ds[@]}" --training.local_batch_size=8 --checkpoint.enable=true
same_curve "one rank resumed from DualPipeV's step-2 checkpoint" "$T/single/metrics.jsonl" \
  "$T/resumedpv/metrics.jsonl" $((STEPS - 2)) 3 || fails=$((fails + 1))
same_lines single resumedpv || fails=$((fails + 1))
run v3single 1 "${ds[@]}" "${v3[@]}" --training.local_batch_size=8
run v3ep2 2 "${ds[@]}" "${v3[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.expert_parallel_degree=2
run v3tp2 2 "${ds[@]}" "${v3[@]}" --training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1 \
  --parallelism.tensor_parallel_degree=2 --parallelism.enable_sequence_parallel=false
for r in v3ep2 v3tp2; do
  compare v3single $r "$STEPS" || fails=$((fails + 1))
  same_lines v3single $r || fails=$((fails + 1))
done
# transformers' DeepseekV3ForCausalLM folder (tests/golden/hf, expert biases included) through the pack's tables:
# convert to a model file and back to a folder and again to a model file (the two files equal byte for byte),
# and model.flavor: from_checkpoint of the folder and of the file train alike
hf=tests/golden/hf/deepseek_v3_from_transformers
{ "$CTITAN" convert --from hf --input "$hf" --output "$T/a.ctt" && "$CTITAN" convert --to hf --input "$T/a.ctt" \
    --output "$T/hf" && "$CTITAN" convert --from hf --input "$T/hf" --output "$T/b.ctt"; } >"$T/convert.log" 2>&1 &&
  cmp -s "$T/a.ctt" "$T/b.ctt" && echo "ok   convert: folder -> file -> folder -> file, the files equal" ||
  { echo "FAIL convert round trip"; tail -3 "$T/convert.log"; fails=$((fails + 1)); }
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok512.model" >/dev/null &&
  "$CTITAN" tokenize --tokenizer "$T/tok512.model" --input "$corpus" --output "$T/data512.bin" >/dev/null ||
  fail "the 512-token data"
fc=(--model.name=deepseek_v3 --model.flavor=from_checkpoint --training.local_batch_size=8 --training.steps=2
    --training.dataset_path="$T/data512.bin")
run fromhf 1 "${fc[@]}" --checkpoint.enable=true --checkpoint.initial_load_in_hf=true --checkpoint.initial_load_path="$hf"
run fromctt 1 "${fc[@]}" --checkpoint.initial_load_path="$T/a.ctt"
same_curve "from_checkpoint: the model file vs the folder" "$T/fromhf/metrics.jsonl" "$T/fromctt/metrics.jsonl" 2 ||
  fails=$((fails + 1))
# torchtitan's config path: its debug TOML with [model] name deepseek_v3 (the flavor is torchtitan's), and its
# debug.moe_force_load_balance, which becomes the pack's model.moe_force_load_balance (every expert 1/8 of the
# 2 ranks' 8 x 32 x 3 pairs)
sed 's/^name = "llama3"/name = "deepseek_v3"/' configs/torchtitan/llama3_debugmodel.toml >"$T/dsv3.toml"
"$CTITAN" launch -n 2 train "$T/dsv3.toml" --training.dataset_path="$T/data512.bin" --model.vocab_size=512 \
  --model.n_layers=2 --model.dim=64 --model.n_heads=4 --model.kv_lora_rank=32 --model.qk_nope_head_dim=16 \
  --model.qk_rope_head_dim=8 --model.v_head_dim=16 --model.inter_dim=128 --model.moe_inter_dim=32 \
  --training.seq_len=32 --training.local_batch_size=4 --training.steps=1 --activation_checkpoint.mode=none \
  --parallelism.data_parallel_shard_degree=2 --parallelism.expert_parallel_degree=2 --metrics.enable_tensorboard=false \
  --debug.moe_force_load_balance=true --model.moe_log_load=true --device.threads=1 --job.dump_folder="$T/toml" \
  >"$T/toml.log" 2>&1 && grep -q 'moe load step 1 layers.1.moe.router.gate.weight: 96 96 96 96 96 96 96 96' "$T/toml.log" &&
  echo "ok   torchtitan's debug TOML as deepseek_v3 under FSDP 2 x EP 2, debug.moe_force_load_balance spreading evenly" ||
  { echo "FAIL torchtitan's TOML"; tail -3 "$T/toml.log"; fails=$((fails + 1)); }
[ $fails -eq 0 ] && echo "deepseek_v3: ok" || { echo "deepseek_v3: $fails failed"; exit 1; }
