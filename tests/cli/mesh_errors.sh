#!/usr/bin/env bash
# Layout errors stop every rank at start-up with one clear line, before any work (printed once for
# the job by `ctitan launch`, with the rank that said it first): degrees that do
# not multiply to the world size, a global batch the data-parallel ranks cannot split, axes that are
# not available yet, a tp degree that does not divide the kv heads, and a bad reshard policy.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
fails=0
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.vocab_size=512 --model.n_layers=1
      --training.seq_len=32 --training.steps=2 --generate.max_new_tokens=0 --job.dump_folder="$T/out")
expect() { # name ranks pattern -- args
  local name=$1 n=$2 pat=$3; shift 4
  local out rc
  if [ "$n" -eq 1 ]; then out=$("$CTITAN" train "${base[@]}" "$@" 2>&1); rc=$?
  else out=$(timeout 120 "$CTITAN" launch -n "$n" train "${base[@]}" "$@" 2>&1); rc=$?; fi
  local hits; hits=$(echo "$out" | grep -cE -- "$pat")
  local ranked=1; [ "$n" -gt 1 ] && ! echo "$out" | grep -E -- "$pat" | grep -q '^\[rank [0-9]*\] ' && ranked=0
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$hits" -eq 1 ] && [ $ranked -eq 1 ] && ! echo "$out" | grep -q '^step '; then
    echo "ok   $name (status $rc): $(echo "$out" | grep -E -- "$pat" | head -1)"
  else echo "FAIL $name: status $rc, $hits lines (wanted 1, with its rank) said /$pat/:"; echo "$out" | tail -8 | sed 's/^/     /'; fails=$((fails+1)); fi
}
expect "degrees exceed one rank" 1 "dp_shard 2 .* = 2 ranks, but the job has 1" -- --parallelism.data_parallel_shard_degree=2
expect "degrees exceed the world" 2 "data_parallel_shard_degree.* = 4 ranks, but the job has 2" -- --parallelism.data_parallel_shard_degree=4
expect "-1 cannot divide" 3 "3 ranks do not divide by the other degrees' product 2" -- --parallelism.data_parallel_replicate_degree=2
expect "degree above the ranks, at its own key" 2 "data_parallel_replicate_degree: degree 3 is more than the job's 2 ranks" -- \
  --parallelism.data_parallel_replicate_degree=3
expect "degrees whose product is above the ranks" 2 "tensor_parallel_degree: with degree 2 the axes other than dp_shard already need 4" -- \
  --parallelism.data_parallel_replicate_degree=2 --parallelism.tensor_parallel_degree=2
expect "huge degree, at its own key" 1 "command line: --parallelism.pipeline_parallel_degree: degree 1048576 is more than the job's 1 ranks" -- \
  --parallelism.pipeline_parallel_degree=1048576
expect "batch does not split" 2 "global_batch_size.*multiple of local_batch_size x 2" -- \
  --parallelism.data_parallel_shard_degree=2 --training.local_batch_size=4 --training.global_batch_size=6
expect "tp must divide kv heads" 2 "tensor_parallel_degree 2 must divide the kv heads \\(1\\)" -- \
  --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=1 --model.n_kv_heads=1
expect "bad reshard policy" 2 "fsdp_reshard_after_forward: expected default, always or never" -- \
  --parallelism.data_parallel_shard_degree=2 --parallelism.fsdp_reshard_after_forward=sometimes
# n_layers 1 + the embedding and the output = 3 layers of weight, 2 per stage: 2 stages; 1 per stage: 3 stages
expect "uneven pipeline split, at the key that was set" 2 \
  "pipeline_parallel_layers_per_stage: the split gives 3 stages, which 2 pipeline ranks cannot share evenly" -- \
  --parallelism.pipeline_parallel_degree=2 --parallelism.data_parallel_shard_degree=1 \
  --parallelism.pipeline_parallel_layers_per_stage=1
exit $fails
