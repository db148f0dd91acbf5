#!/usr/bin/env bash
# The Chrome trace names every unit correctly: a model pack's unit_name string must stay valid until
# the model is destroyed (model.h), because the trace keeps the pointer until it is written. llama3
# once handed out one of three rotating buffers, so a model with more than three blocks showed
# layers under another layer's name. Five blocks, one step: every unit's range is there, once per
# forward with its own name, and each begin has the end of the same name.
set -u
CTITAN=${CTITAN:-build/ctitan}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL $*"; exit 1; }
. tests/cli/lib/data.sh
test_data "$T" 512 || fail "test data"
cat >"$T/run.yaml" <<YAML
job: {dump_folder: $T/out}
device: {name: cpu, threads: 2}
model: {name: llama3, flavor: debugmodel, n_layers: 5, dim: 64, n_heads: 4, n_kv_heads: 2, vocab_size: 512,
        tokenizer_path: $T/tok.model}
optimizer: {name: AdamW, lr: 1e-3}
training: {dataset_path: $T/data.bin, local_batch_size: 2, seq_len: 32, steps: 1, seed: 1}
activation_checkpoint: {mode: none}
profiling: {enable_profiling: true}
YAML
"$CTITAN" train "$T/run.yaml" >"$T/log" 2>&1 || { tail -3 "$T/log"; fail "train with profiling"; }
trace=$T/out/profile_traces/trace.json
[ -s "$trace" ] || fail "no trace at $trace"
# one event per line is not promised: split on '{' and keep the unit ranges' phase and name
grep -o '"name":"[^"]*","ph":"[BE]"\|"ph":"[BE]"[^}]*"name":"[^"]*"' "$trace" >"$T/events"
[ -s "$T/events" ] || fail "no begin/end events in the trace: $(head -c 300 "$trace")"
for u in tok_embeddings layers.0 layers.1 layers.2 layers.3 layers.4 output; do
  b=$(grep -c "\"name\":\"$u\"[^}]*\"ph\":\"B\"\|\"ph\":\"B\"[^}]*\"name\":\"$u\"" "$T/events")
  e=$(grep -c "\"name\":\"$u\"[^}]*\"ph\":\"E\"\|\"ph\":\"E\"[^}]*\"name\":\"$u\"" "$T/events")
  [ "$b" -ge 1 ] && [ "$b" -eq "$e" ] || fail "unit $u: $b begin and $e end events in the trace, wanted the same number, at least 1"
done
echo "ok   every unit (tok_embeddings, layers.0-4, output) has its own begin and end in the trace"
