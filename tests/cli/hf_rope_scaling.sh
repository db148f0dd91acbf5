#!/usr/bin/env bash
# Llama 3.1's RoPE scaling (rope_type llama3) end to end, on the golden folder transformers wrote
# (tests/golden/hf/llama31_from_transformers, whose logits tests/unit/test_hf.c matches within 1e-5):
#   - `ctitan convert --from hf` prints the model options with the scaling and keeps it in the .ctt;
#     `--to hf` writes it back as rope_scaling, and the tensors come back bit for bit (C reader);
#   - a run fine-tunes the folder (checkpoint.initial_load_in_hf) with the scaling on: the loss falls;
#     its last_save_in_hf export says rope_scaling llama3 with the same settings, and equals what (without shape flags)
#     `convert --to hf` makes of the run's model.ctt, tensor for tensor;
#   - a model whose scaling differs from config.json's is refused (exit 2, one line naming the
#     options to set); so are bad scaling options, and resuming the run's checkpoint without it.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
G=tests/golden/hf/llama31_from_transformers
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
. tests/cli/lib/data.sh
test_data "$T" 512 || { echo "FAIL test data"; exit 1; }

# the golden's options, as convert --from hf prints them
scaling="rope_scaling: llama3, rope_scaling_factor: 8, rope_low_freq_factor: 1, rope_high_freq_factor: 4, rope_original_max_position: 32"
if "$CTITAN" convert --from hf --input "$G" --output "$T/a.ctt" >"$T/out" 2>"$T/err" &&
    grep -qF "dim: 32, n_layers: 2, n_heads: 2, n_kv_heads: 1, vocab_size: 512, ffn_hidden: 64, rope_theta: 81, norm_eps: 1e-05, $scaling}" "$T/out"; then
    ok "convert --from hf prints the llama3 scaling options"
else bad "convert --from hf: $(cat "$T/err" "$T/out")"; fi
# .ctt -> HF: rope_scaling written; HF -> .ctt again: the same file (every tensor, the scaling)
if "$CTITAN" convert --to hf --input "$T/a.ctt" --output "$T/hf" --n-heads 2 --rope-theta 81 --norm-eps 1e-5 >/dev/null 2>"$T/err" &&
    tr -d ' \n' <"$T/hf/config.json" | grep -qF '"rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":32,"rope_type":"llama3"}' &&
    "$CTITAN" convert --from hf --input "$T/hf" --output "$T/b.ctt" >/dev/null 2>>"$T/err" && cmp -s "$T/a.ctt" "$T/b.ctt"; then
    ok "convert --to hf writes rope_scaling llama3; HF -> .ctt -> HF -> .ctt is bit-exact"
else bad "convert round trip: $(cat "$T/err")"; fi

m=(--model.dim=32 --model.n_layers=2 --model.n_heads=2 --model.n_kv_heads=1 --model.vocab_size=512
   --model.ffn_hidden=64 --model.rope_theta=81 --model.norm_eps=1e-5)
s=(--model.rope_scaling=llama3 --model.rope_scaling_factor=8 --model.rope_low_freq_factor=1
   --model.rope_high_freq_factor=4 --model.rope_original_max_position=32)
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --training.seq_len=64 --training.local_batch_size=8
      --training.global_batch_size=8 --training.steps=12 --metrics.log_freq=1 --generate.max_new_tokens=0
      --activation_checkpoint.mode=none --device.threads=1 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=2
      --checkpoint.initial_load_path="$G" --checkpoint.initial_load_in_hf=true)
train() { "$CTITAN" train "${base[@]}" "$@" >"$T/train.log" 2>"$T/train.err"; }

# fine-tune with the scaling on: the loss falls; the export keeps the scaling
if train "${m[@]}" "${s[@]}" --job.dump_folder="$T/ft" --checkpoint.enable=true --checkpoint.last_save_in_hf=true &&
    grep -q "loaded the Hugging Face model" "$T/train.log"; then
    first=$(grep -m1 -o '"loss": *[0-9.e+-]*' "$T/ft/metrics.jsonl" | grep -o '[0-9.e+-]*$')
    last=$(grep -o '"loss": *[0-9.e+-]*' "$T/ft/metrics.jsonl" | tail -1 | grep -o '[0-9.e+-]*$')
    if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }'; then
        ok "fine-tuning the Llama 3.1-style folder: loss $first -> $last over 12 steps"
    else bad "the loss did not fall: $first -> $last"; fi
    hf=$T/ft/checkpoint/step-12-hf
    if tr -d ' \n' <"$hf/config.json" | grep -qF '"rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":32,"rope_type":"llama3"},"rope_theta":81.0'; then
        ok "last_save_in_hf writes rope_scaling llama3 and rope_theta 81"
    else bad "last_save_in_hf config.json: $(cat "$hf/config.json")"; fi
    if "$CTITAN" convert --to hf --input "$T/ft/model.ctt" --output "$T/conv" >/dev/null 2>"$T/err" &&
        "$CTITAN" convert --from hf --input "$hf" --output "$T/c.ctt" >/dev/null 2>>"$T/err" &&
        cmp -s "$hf/model.safetensors" "$T/conv/model.safetensors" && cmp -s "$hf/config.json" "$T/conv/config.json" &&
        "$CTITAN" convert --to hf --input "$T/c.ctt" --output "$T/again" >/dev/null 2>>"$T/err" &&
        cmp -s "$hf/model.safetensors" "$T/again/model.safetensors" && cmp -s "$hf/config.json" "$T/again/config.json"; then
        ok "the export equals convert --to hf of model.ctt (no shape flags: its description), and HF -> .ctt -> HF reproduces it (config.json too)"
    else bad "export round trip: $(cat "$T/err")"; fi
else bad "fine-tune run: $(tail -3 "$T/train.err")"; fi

# refusals: exit 2, one line naming what to set
expect_train_fail() { # name pattern args...
    local name=$1 pat=$2; shift 2
    train "$@" --job.dump_folder="$T/x"; local rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/train.err")" -eq 1 ] && grep -qE -- "$pat" "$T/train.err"; then
        ok "$name: $(cat "$T/train.err")"
    else bad "$name: status $rc (want 2), stderr: $(cat "$T/train.err")"; fi
}
expect_train_fail "plain RoPE on a scaled folder" \
    "config.json scales RoPE \(rope_type llama3\).*set model.rope_scaling: llama3, model.rope_scaling_factor: 8, model.rope_low_freq_factor: 1, model.rope_high_freq_factor: 4, model.rope_original_max_position: 32" \
    "${m[@]}"
expect_train_fail "another factor" "set model.rope_scaling: llama3, model.rope_scaling_factor: 8" \
    "${m[@]}" "${s[@]}" --model.rope_scaling_factor=32
expect_train_fail "a factor without scaling" "--model.rope_scaling_factor: llama3: set while model.rope_scaling is none" \
    "${m[@]}" --model.rope_scaling_factor=8
expect_train_fail "high below low" "--model.rope_high_freq_factor: llama3: 1 must be above rope_low_freq_factor 2" \
    "${m[@]}" "${s[@]}" --model.rope_low_freq_factor=2 --model.rope_high_freq_factor=1
expect_train_fail "an unknown scaling" "model.rope_scaling.*yarn" "${m[@]}" --model.rope_scaling=yarn
# the checkpoint records the scaling: resuming it with plain RoPE is refused
train "${m[@]}" --job.dump_folder="$T/ft" --checkpoint.enable=true --training.steps=14; rc=$?
if [ "$rc" -eq 2 ] && grep -q 'was written with model.rope_scaling "llama3"; this run has "none"' "$T/train.err"; then
    ok "resume with plain RoPE: $(cat "$T/train.err")"
else bad "resume with plain RoPE: status $rc, stderr: $(cat "$T/train.err")"; fi

echo
[ "$fails" -eq 0 ] && echo "hf_rope_scaling: ok" || echo "hf_rope_scaling: $fails failed"
[ "$fails" -eq 0 ]
