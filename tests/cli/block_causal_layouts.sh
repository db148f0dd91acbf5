#!/usr/bin/env bash
# Block-causal attention (model.attn_mask_type: block_causal) computes the same function under every
# layout: the fortunes corpus tokenized one fortune per document (each ended by EOS; 753 documents,
# about 45 tokens each, so a 128-token sequence packs about three), a small llama3, same seed and
# global batch, real MPI ranks. FSDP 2, TP 2, PP 2 (ZBVZeroBubble with full checkpointing, so every
# stage takes its own microbatch's document ids and the split backward replays them), CP 2 with
# allgather, the ring (alltoall) and Ulysses (documents crossing the load balancer's chunks and
# ranks), torchtitan's per-op selective checkpointing: loss and grad-norm curves within 1e-6
# (relative) of one rank. The causal run on the same data differs from the block-causal one at the
# first step (so the mask is applied). torchtitan's three flex/varlen feature tests (fsdp+flex_attn
# with full AC, fsdp+flex_attn+per_op_sac, fsdp+varlen_attn+per_op_sac) run with its flags on 4 ranks
# and match one rank. RoPE positions restarted per document (one rank, TP 2) give the same curves.
# The planner prices attention lower with shorter documents. Refusals: no tokenizer, a causal mask
# beside a block-causal flavor, rope_positions without block_causal or with context parallel, an
# unknown mask type.
set -u
STEPS=${BC_STEPS:-3}
. tests/cli/lib/layouts.sh
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --split-on % --output "$T/docs.bin" >"$T/tok.log" \
  || fail "tokenize documents"
grep -q "753 documents" "$T/tok.log" || { cat "$T/tok.log"; fail "expected 753 documents"; }
common+=(--model.n_layers=2 --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_hidden=128
         --training.seq_len=128 --training.dataset_path="$T/docs.bin")
bc=(--model.attn_mask_type=block_causal --model.tokenizer_path="$T/tok.model")
one=(--training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1)

run single 1 --training.local_batch_size=8 "${bc[@]}"
run causal 1 --training.local_batch_size=8
l1=$(step_records single | sed -n 1p | sed 's/.*"loss": \([-0-9.e+]*\).*/\1/')
l0=$(step_records causal | sed -n 1p | sed 's/.*"loss": \([-0-9.e+]*\).*/\1/')
awk -v a="$l1" -v b="$l0" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d > 1e-4) }' \
  || fail "block_causal's first loss $l1 is causal's $l0: the document mask changed nothing"
echo "ok   block_causal differs from causal on packed documents (first loss $l1 vs $l0)"

run fsdp2 2 "${bc[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2
compare single fsdp2 "$STEPS" || exit 1
run tp2 2 "${bc[@]}" "${one[@]}" --parallelism.tensor_parallel_degree=2
compare single tp2 "$STEPS" || exit 1
run pp2_zbv 2 "${bc[@]}" "${one[@]}" --parallelism.pipeline_parallel_degree=2 \
  --parallelism.pipeline_parallel_schedule=ZBVZeroBubble --parallelism.pipeline_parallel_microbatch_size=2 \
  --activation_checkpoint.mode=full
compare single pp2_zbv "$STEPS" || exit 1
# context parallel: 4 chunks of 32 tokens per sequence and documents of 45 tokens on average, so
# documents cross chunks and ranks (their keys on the other rank, their positions and ids with them)
for m in allgather alltoall ulysses; do
  run "cp2_$m" 2 "${bc[@]}" "${one[@]}" --parallelism.context_parallel_degree=2 \
    --parallelism.context_parallel_rotate_method=$m
  compare single "cp2_$m" "$STEPS" || exit 1
done
run ac_op 1 "${bc[@]}" --training.local_batch_size=8 --activation_checkpoint.mode=selective \
  --activation_checkpoint.selective_ac_option=op
compare single ac_op "$STEPS" || exit 1

# model.rope_positions: document (RoPE restarted per document): the same function up to rounding (RoPE's
# scores depend on the distance between positions only), on one rank and under TP 2
rd=(--model.rope_positions=document)
run rope_doc 1 "${bc[@]}" "${rd[@]}" --training.local_batch_size=8
compare single rope_doc "$STEPS" || exit 1
run rope_doc_tp2 2 "${bc[@]}" "${rd[@]}" "${one[@]}" --parallelism.tensor_parallel_degree=2
compare rope_doc rope_doc_tp2 "$STEPS" || exit 1

# torchtitan's feature tests (tests/integration_tests/features.py), its flags on its 4 ranks
tt=(--model.tokenizer_path="$T/tok.model" --parallelism.data_parallel_shard_degree=4 --training.local_batch_size=2)
run flex_attn 4 "${tt[@]}" --activation_checkpoint.mode=full --model.flavor=debugmodel_flex_attn
compare single flex_attn "$STEPS" || exit 1
run flex_attn_sac 4 "${tt[@]}" --activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=op \
  --model.flavor=debugmodel_flex_attn
compare single flex_attn_sac "$STEPS" || exit 1
run varlen_attn_sac 4 "${tt[@]}" --activation_checkpoint.mode=selective \
  --activation_checkpoint.selective_ac_option=op --model.flavor=debugmodel_varlen_attn
compare single varlen_attn_sac "$STEPS" || exit 1

# the planner prices block-causal attention at the data's mean document length (45 tokens here), or
# at plan.mean_document_length: attention time falls with shorter documents
att() { "$CTITAN" plan "${common[@]}" --training.seq_len=2048 --training.local_batch_size=1 --hardware h100-sxm \
          --gpus 1 --json "$@" 2>"$T/plan.err" | sed -n 's/.*"attention": \([0-9.e+-]*\).*/\1/p' | head -1; }
a_causal=$(att); a_data=$(att "${bc[@]}"); a_512=$(att "${bc[@]}" --plan.mean_document_length=512)
awk -v c="$a_causal" -v d="$a_data" -v m="$a_512" 'BEGIN { exit !(c > 0 && d > 0 && d < m && m < c / 2) }' \
  || { cat "$T/plan.err"; fail "planned attention: causal $a_causal s, documents of 512 $a_512 s," \
       "the data's $a_data s"; }
echo "ok   planned attention per step: causal $a_causal s, documents of 512 tokens $a_512 s, the data's (45) $a_data s"

# refusals: status 2, one line naming the key
refuse() { # name pattern args...
  local name=$1 pat=$2; shift 2
  "$CTITAN" train "${common[@]}" --job.dump_folder="$T/refused" "$@" >"$T/refused.log" 2>&1; local rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/refused.log")" -eq 1 ] && grep -qE -- "$pat" "$T/refused.log" \
    || { cat "$T/refused.log"; fail "$name: status $rc"; }
  echo "ok   refused: $name: $(cat "$T/refused.log")"
}
refuse "block_causal without a tokenizer" "attn_mask_type.*EOS.*model.tokenizer_path" \
  --model.attn_mask_type=block_causal --model.tokenizer_path=
refuse "causal beside a flex flavor" "attn_mask_type: 'causal'.*block-causal flavors" \
  --model.flavor=debugmodel_flex_attn --model.attn_mask_type=causal --model.tokenizer_path="$T/tok.model"
refuse "rope_positions without block_causal" "rope_positions: 'document' needs model.attn_mask_type block_causal" \
  --model.rope_positions=document
refuse "an unknown mask type" "attn_mask_type.*causal.*block_causal" --model.attn_mask_type=sliding
"$CTITAN" launch -n 2 train "${common[@]}" "${bc[@]}" "${one[@]}" "${rd[@]}" --parallelism.context_parallel_degree=2 \
  --job.dump_folder="$T/cp_rd" >"$T/cp_rd.log" 2>&1 && fail "rope_positions document with context parallel ran"
grep -q "rope_positions: document positions are not available with context parallel" "$T/cp_rd.log" \
  || { cat "$T/cp_rd.log"; fail "context parallel with document positions: the refusal"; }
echo "ok   refused: document RoPE positions with context parallel name model.rope_positions"
