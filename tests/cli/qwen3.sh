#!/usr/bin/env bash
# qwen3: models/qwen3 (Qwen3 dense: per-head QK-norm before RoPE, its own head_dim, a tied head), a pack
# that carries its own Hugging Face mapping (ABI 2.12) and a tensor-parallel plan with QK-norm marked
# CT_TP_REPLICATED_PARTIAL.
#   - layouts: FSDP 2, TP 2 with and without sequence parallel, PP 2, FSDP 2 x TP 2 and CP 2 follow one rank's
#     8-step loss and grad-norm curve within 1e-6;
#   - transformers' Qwen3 (tests/golden/hf/qwen3_from_transformers, transformers 5's config.json with
#     rope_parameters) loads into a run (checkpoint.initial_load_in_hf) and the run's export
#     (checkpoint.last_save_in_hf, a Qwen3ForCausalLM folder) holds transformers' tensors bit for bit
#     (gen_qwen3_golden.py --check also has transformers load that export and match its logits);
#   - a trained model's export starts a run exactly as its native checkpoint does;
#   - a folder the model does not match is refused before training: exit 2, one line naming the key
#     or tensor.
# Learning rate 1e-3 (the debug config's 3e-3 let CP 2 drift to 1.5e-6 of one rank by step 4 in the
# sanitizer build, float reordering amplified by training). KEEP_T=DIR keeps the runs there.
set -u
STEPS=8
. tests/cli/lib/layouts.sh
G=tests/golden/hf/qwen3_from_transformers
py=${CT_PYTHON:-python3}
q=(--model.name=qwen3 --model.flavor=debugmodel --model.n_layers=2 --model.head_dim=32 --training.seq_len=32 --optimizer.lr=1e-3)
run single 1 "${q[@]}" --training.local_batch_size=8 --checkpoint.enable=true --checkpoint.last_save_in_hf=true
run fsdp2 2 "${q[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2
run tp2 2 "${q[@]}" --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2
run tp2_nosp 2 "${q[@]}" --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2 \
  --parallelism.enable_sequence_parallel=false
run pp2 2 "${q[@]}" --training.local_batch_size=8 --parallelism.pipeline_parallel_degree=2 \
  --parallelism.pipeline_parallel_microbatch_size=4
run fsdp2_tp2 4 "${q[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.tensor_parallel_degree=2
run cp2 2 "${q[@]}" --training.local_batch_size=8 --parallelism.context_parallel_degree=2
grep -q "tp 2" "$T/tp2.log" || fail "tp2 did not run with tp 2"
for r in fsdp2 tp2 tp2_nosp pp2 fsdp2_tp2 cp2; do compare single "$r" "$STEPS" || exit 1; done

# safetensors read with the standard library: tensor names, and each tensor's bytes
st_tensors() { "$py" - "$1" <<'EOF'
import json, struct, sys, hashlib
b = open(sys.argv[1] + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k in sorted(h):
    if k != "__metadata__":
        s, e = h[k]["data_offsets"]
        print(k, h[k]["dtype"], h[k]["shape"], hashlib.sha256(b[8 + n + s:8 + n + e]).hexdigest()[:16])
EOF
}

# transformers' Qwen3 in, one step at lr 0, the export out: transformers' tensors bit for bit
g=(--model.dim=32 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=16 --model.vocab_size=512
   --model.ffn_hidden=64 --model.rope_theta=50000 --model.n_layers=2 --model.name=qwen3 --training.steps=1
   --training.seq_len=16 --optimizer.lr=0 --lr_scheduler.warmup_steps=0 --checkpoint.enable=true
   --checkpoint.initial_load_in_hf=true --checkpoint.initial_load_path="$G" --checkpoint.last_save_in_hf=true)
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok512.model" >/dev/null || fail "tokenizer 512"
"$CTITAN" tokenize --tokenizer "$T/tok512.model" --input "$corpus" --output "$T/data512.bin" >/dev/null || fail "tokenize 512"
run golden 1 "${g[@]}" --training.dataset_path="$T/data512.bin" --training.local_batch_size=2
grep -q "loaded the Hugging Face model" "$T/golden.log" || fail "the run did not load transformers' folder"
hf=$T/golden/checkpoint/step-1-hf
grep -q '"Qwen3ForCausalLM"' "$hf/config.json" && grep -q '"head_dim": 16' "$hf/config.json" &&
  grep -q '"tie_word_embeddings": true' "$hf/config.json" || fail "the export's config.json: $(cat "$hf/config.json")"
st_tensors "$G" >"$T/theirs.txt" && st_tensors "$hf" >"$T/ours.txt" || fail "reading the safetensors files"
[ "$(wc -l <"$T/ours.txt")" -eq 24 ] && cmp -s "$T/theirs.txt" "$T/ours.txt" ||
  { diff "$T/theirs.txt" "$T/ours.txt" | head -5; fail "the export differs from transformers' tensors"; }
echo "ok   transformers' Qwen3 loads into a run and exports as its 24 tensors bit for bit (Qwen3ForCausalLM, tied)"

# a trained model's export starts a run as its native checkpoint does, bit for bit
hf=$T/single/checkpoint/step-8-hf
! grep -q lm_head "$hf/model.safetensors" || fail "a tied export holds lm_head.weight"
u=("${q[@]}" --training.local_batch_size=8 --training.steps=2 --checkpoint.enable=true)
run from_hf 1 "${u[@]}" --checkpoint.initial_load_path="$hf" --checkpoint.initial_load_in_hf=true
run from_native 1 "${u[@]}" --checkpoint.initial_load_path="$T/single/checkpoint/step-8" \
  --checkpoint.initial_load_model_only=true
CURVE_TOL=0 same_curve "qwen3 started from its HF export vs from its checkpoint" "$T/from_native/metrics.jsonl" \
  "$T/from_hf/metrics.jsonl" 2 || exit 1

# folders the model does not match: refused at start, exit 2, one line
refused() { # name pattern dir args...
  local name=$1 pat=$2 dir=$3; shift 3
  "$CTITAN" train "${common[@]}" "${g[@]}" --training.dataset_path="$T/data512.bin" --training.local_batch_size=2 \
    --checkpoint.initial_load_path="$dir" --job.dump_folder="$T/refused" "$@" >"$T/r.log" 2>"$T/r.err"; local st=$?
  [ $st -eq 2 ] && [ "$(wc -l <"$T/r.err")" -eq 1 ] && grep -q "$pat" "$T/r.err" || {
    cat "$T/r.err"; fail "$name: status $st"; }
  echo "ok   $name: $(cat "$T/r.err")"
}
refused "another rope_theta" "config.json: rope_theta is 50000.0, model qwen3 has 10000.0" "$G" --model.rope_theta=10000
cp -r "$G" "$T/llama" && sed -i 's/"model_type": "qwen3"/"model_type": "llama"/' "$T/llama/config.json"
refused "another model_type" "model_type 'llama' is not model qwen3's 'qwen3'" "$T/llama"
refused "fewer layers than the folder" "config.json: num_hidden_layers is 2, model qwen3 has 1" "$G" --model.n_layers=1
