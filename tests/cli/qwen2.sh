#!/usr/bin/env bash
# qwen2: sdk/examples/qwen2, built out of tree with nothing but the pkg-config file, computes the same
# function on every layout: 1 rank, FSDP 2, TP 2 (its q/k/v biases split with their column-wise
# linears) and PP 2, 8-step loss and grad-norm curves within 1e-6 of the single rank, untied and tied
# (the head a use of the table, ABI 2.1 share; counted once). Then the Hugging Face side: the trained
# model exports as a Qwen2ForCausalLM folder (checkpoint.last_save_in_hf and ctitan convert give the
# same bytes), converts back and forth bit for bit and starts a run exactly as its native checkpoint
# does (checkpoint.initial_load_in_hf); transformers' tied golden converts to a model file without
# output.weight and back without lm_head.weight; Qwen2 folders ctitan would run differently are
# refused. KEEP_T=DIR keeps the runs there.
set -u
CTITAN=${CTITAN:-build/ctitan}
BUILD=${BUILD:-build}
ROOT=$(pwd)
case $CTITAN in /*) ;; *) CTITAN=$ROOT/$CTITAN ;; esac
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/curves.sh

# the pack, as a third party builds it
[ -f "$BUILD/ctitan-sdk.pc" ] || fail "$BUILD/ctitan-sdk.pc is missing (run make)"
cp -r sdk/examples/qwen2 "$T/qwen2" && rm -rf "$T"/qwen2/*.so "$T/qwen2/outputs"
grep -nE -- '-I|\.\./' "$T/qwen2/Makefile" && fail "the qwen2 Makefile reaches into the tree; only pkg-config may"
env -u MAKEFLAGS -u MFLAGS -u CFLAGS -u CPPFLAGS -u LDFLAGS PKG_CONFIG_PATH="$ROOT/$BUILD" \
  make --no-print-directory -C "$T/qwen2" >"$T/make.log" 2>&1 || { cat "$T/make.log"; fail "qwen2: out-of-tree build"; }
echo "ok   qwen2.so built out of tree with pkg-config alone"

corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 2048 --output "$T/tok.model" >/dev/null || fail "tokenizer"
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail "tokenize"
common=("$T/qwen2/qwen2_tiny.yaml" --training.dataset_path="$T/data.bin" --training.seq_len=64
        --training.global_batch_size=8 --training.steps=8 --metrics.log_freq=1 --training.mixed_precision_param=float32
        --activation_checkpoint.mode=none --device.threads=1 --comm.train_timeout_seconds=120)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi \
    || { tail -5 "$T/$name.log"; fail "$name run"; }
}
layouts() { # tie: the single rank, then FSDP 2, TP 2 and PP 2 against it
  local tie=$1 t=(--model.tie_word_embeddings="$1" --parallelism.data_parallel_shard_degree=1 --training.local_batch_size=8)
  run "single_$tie" 1 "${t[@]}" --checkpoint.enable=true --checkpoint.last_save_in_hf=true
  run "fsdp2_$tie" 2 --model.tie_word_embeddings="$tie" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2
  run "tp2_$tie" 2 "${t[@]}" --parallelism.tensor_parallel_degree=2
  # two microbatches of 4: with 8 of 1 the tied table's gradient (the head's part summed over the
  # microbatches on stage 1, the embedding's on stage 0) moves the tiny model's grad norm by float
  # reordering alone up to the bound (1.0e-6 at step 6; 9.1e-7 with 4 microbatches, 3.0e-8 with 2)
  run "pp2_$tie" 2 "${t[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_microbatch_size=4
  grep -q "tp 2; strategy none" "$T/tp2_$tie.log" || fail "tp2_$tie did not run with tp 2"
  for r in fsdp2 tp2 pp2; do
    same_curve "qwen2 tie_word_embeddings=$tie: $r vs 1 rank" "$T/single_$tie/metrics.jsonl" "$T/${r}_$tie/metrics.jsonl" 8 ||
      exit 1
  done
}
layouts false
layouts true
grep -q "0.230M parameters" "$T/single_true.log" || fail "tied: the table is not counted once ($(grep -m1 -o 'qwen2 ([^)]*): [^,]*' "$T/single_true.log"))"

# Hugging Face: the run's own export and ctitan convert agree, a round trip is bit-exact, and a run
# started from the export follows the one started from the native checkpoint bit for bit
for tie in false true; do
  hf=$T/single_$tie/checkpoint/step-8-hf
  grep -q '"Qwen2ForCausalLM"' "$hf/config.json" && grep -q "\"tie_word_embeddings\": $tie" "$hf/config.json" ||
    fail "last_save_in_hf: not a Qwen2 config with tie_word_embeddings $tie"
  [ $tie = false ] || ! grep -q lm_head "$hf/model.safetensors" || fail "a tied export holds lm_head.weight"
  "$CTITAN" convert --to hf --input "$T/single_$tie/model.ctt" --output "$T/conv_$tie" --n-heads 4 --rope-theta 1e6 \
    --norm-eps 1e-6 >/dev/null || fail "convert --to hf of the trained model"
  cmp -s "$hf/model.safetensors" "$T/conv_$tie/model.safetensors" && cmp -s "$hf/config.json" "$T/conv_$tie/config.json" ||
    fail "convert and last_save_in_hf wrote different folders"
  "$CTITAN" convert --from hf --input "$hf" --output "$T/back_$tie.ctt" >"$T/back.log" || fail "convert --from hf"
  grep -q "name: qwen2, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 2048, ffn_hidden: 192, rope_theta: 1000000, norm_eps: 1e-06, tie_word_embeddings: $tie" \
    "$T/back.log" || { cat "$T/back.log"; fail "--from hf model line"; }
  "$CTITAN" convert --to hf --input "$T/back_$tie.ctt" --output "$T/again_$tie" --n-heads 4 >/dev/null &&
    cmp -s "$T/conv_$tie/model.safetensors" "$T/again_$tie/model.safetensors" || fail "HF -> .ctt -> HF is not bit-exact"
  echo "ok   the trained qwen2 (tie_word_embeddings=$tie) exports as Qwen2ForCausalLM (last_save_in_hf = convert), round trip bit-exact"
  u=(--model.tie_word_embeddings=$tie --training.steps=2 --checkpoint.enable=true)
  run "from_hf_$tie" 1 "${u[@]}" --checkpoint.initial_load_path="$hf" --checkpoint.initial_load_in_hf=true
  run "from_native_$tie" 1 "${u[@]}" --checkpoint.initial_load_path="$T/single_$tie/checkpoint/step-8" \
    --checkpoint.initial_load_model_only=true
  grep -q "loaded the Hugging Face model" "$T/from_hf_$tie.log" || fail "from_hf_$tie did not load the export"
  CURVE_TOL=0 same_curve "qwen2 (tie_word_embeddings=$tie) started from its HF export vs from its checkpoint" \
    "$T/from_native_$tie/metrics.jsonl" "$T/from_hf_$tie/metrics.jsonl" 2 || exit 1
done

# transformers' tied Qwen2: no output.weight on ctitan's side, no lm_head.weight back on HF's
g=tests/golden/hf/qwen2_from_transformers
"$CTITAN" convert --from hf --input "$g" --output "$T/g.ctt" >"$T/g.log" || fail "convert --from hf of the golden"
grep -q "qwen2, 26 tensors, float32; tied embeddings: no output.weight" "$T/g.log" || { cat "$T/g.log"; fail "golden import"; }
"$CTITAN" convert --to hf --input "$T/g.ctt" --output "$T/g_hf" --n-heads 4 >"$T/g.log" || fail "convert --to hf of the golden"
grep -q '"tie_word_embeddings": true' "$T/g_hf/config.json" && ! grep -q lm_head "$T/g_hf/model.safetensors" &&
  grep -q "model.layers.1.self_attn.q_proj.bias" "$T/g_hf/model.safetensors" || fail "tied export: config or tensors"
echo "ok   transformers' tied Qwen2 -> .ctt (no output.weight) -> HF (tie_word_embeddings true, no lm_head.weight)"

# Qwen2 folders ctitan would run differently: exit 2, one line naming the file and what is wrong
expect_refused() { # name pattern dir
  "$CTITAN" convert --from hf --input "$3" --output "$T/x.ctt" >/dev/null 2>"$T/err"; local st=$?
  [ $st -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "$2" "$T/err" || { cat "$T/err"; fail "$1: status $st"; }
  echo "ok   $1: $(cat "$T/err")"
}
cp -r tests/golden/hf/from_transformers "$T/nobias"
sed -i 's/"model_type": "llama"/"model_type": "qwen2"/' "$T/nobias/config.json"
expect_refused "a Qwen2 config over a Llama's tensors" \
  "nobias: tensor 'model.layers.0.self_attn.q_proj.bias' (ctitan's 'layers.0.attention.wq.bias') is missing" "$T/nobias"
cp -r "$g" "$T/sliding"
sed -i 's/"use_sliding_window": false/"use_sliding_window": true/' "$T/sliding/config.json"
expect_refused "sliding-window attention" "sliding/config.json: use_sliding_window must be false" "$T/sliding"
