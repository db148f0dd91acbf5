#!/usr/bin/env bash
# A DeepSeek-V3 run exported to a Hugging Face folder (checkpoint.last_save_in_hf) under pipeline parallel
# carries every block's trained expert bias (e_score_correction_bias, the pack's buffer), not rank 0's copy
# of a block another stage runs. One rank and PP 2 x EP 2 (4 ranks, the MoE blocks on both stages) train 3
# steps with aux-loss-free balancing on (load_balance_coeff 1e-2: an odd count of sign steps, so no bias is back
# at zero); both export. Against one rank's export: every expert bias equal bit for bit (the updates are
# signs of integer counts, the same on every layout) and moved from zero, every weight within 1e-6 relative
# (the layouts' own tolerance). The same for the model files (model.ctt, which hold the biases too), and the
# PP run's step-3 checkpoint (each stage writing its own blocks' biases) loaded on one rank exports the same, as
# does one rank's loaded under PP 2 x EP 2.
set -u
STEPS=3
. tests/cli/lib/layouts.sh
counting_fails
ds=(--model.name=deepseek_v3 --model.flavor=debugmodel --model.dim=64 --model.n_layers=4 --model.n_dense_layers=1
    --model.n_heads=4 --model.kv_lora_rank=32 --model.qk_nope_head_dim=16 --model.qk_rope_head_dim=8
    --model.v_head_dim=16 --model.inter_dim=128 --model.moe_inter_dim=32 --model.vocab_size=2048
    --model.load_balance_coeff=1e-2 --optimizer.lr=3e-4 --checkpoint.enable=true --checkpoint.interval=3
    --checkpoint.last_save_in_hf=true)
run single 1 "${ds[@]}" --training.local_batch_size=8
run pp2ep2 4 "${ds[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.expert_parallel_degree=2
compare single pp2ep2 "$STEPS" || fails=$((fails + 1))
py=${CT_PYTHON:-python3}
# A B KIND: the two files' tensors (safetensors or .ctt through convert --from hf) compared as said above
same_export() {
  "$py" - "$1" "$2" <<'PY'
import json, struct, sys

def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), body[a:b])
    return out

a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
biases = [k for k in a if k.endswith("e_score_correction_bias")]
bad = [k for k in biases if a[k] != b[k]]
moved = [k for k in biases if max(abs(x) for x in a[k]) > 0]
worst = 0.0
for k in a:
    if k in biases:
        continue
    num = sum((x - y) ** 2 for x, y in zip(a[k], b[k])) ** 0.5
    den = sum(x * x for x in a[k]) ** 0.5 or 1.0
    worst = max(worst, num / den)
if bad or len(moved) != len(biases) or not biases or worst > 1e-6:
    print(f"differ: biases {bad[:3]} of {len(biases)}, moved {len(moved)}, worst weight {worst:.3g}")
    sys.exit(1)
print(f"{len(biases)} expert biases equal (all moved), {len(a) - len(biases)} weights within {worst:.2e}")
PY
}
hf=checkpoint/step-$STEPS-hf/model.safetensors
if out=$(same_export "$T/single/$hf" "$T/pp2ep2/$hf" 2>&1); then
  echo "ok   PP 2 x EP 2's Hugging Face export vs one rank's: $out"
else fail "PP 2 x EP 2's Hugging Face export vs one rank's: $out"; fi
# the model files, through convert --to hf (their biases are buffers beside the weights)
for r in single pp2ep2; do
  "$CTITAN" convert --to hf --input "$T/$r/model.ctt" --output "$T/$r-conv" >"$T/$r-conv.log" 2>&1 ||
    fail "convert $r's model.ctt: $(tail -2 "$T/$r-conv.log")"
done
if out=$(same_export "$T/single-conv/model.safetensors" "$T/pp2ep2-conv/model.safetensors" 2>&1); then
  echo "ok   PP 2 x EP 2's model.ctt vs one rank's: $out"
else fail "PP 2 x EP 2's model.ctt vs one rank's: $out"; fi
# the checkpoint (each stage writes its blocks' biases) loaded on one rank: a 1-step run at lr 0 without bias updates
# exports the PP run's biases and weights
run reload 1 "${ds[@]}" --training.local_batch_size=8 --training.steps=1 --optimizer.lr=0 \
  --model.load_balance_coeff=0 --checkpoint.initial_load_path="$T/pp2ep2/checkpoint/step-$STEPS" \
  --checkpoint.initial_load_model_only=true
if out=$(same_export "$T/pp2ep2/$hf" "$T/reload/checkpoint/step-1-hf/model.safetensors" 2>&1); then
  echo "ok   PP 2 x EP 2's checkpoint loaded on one rank (lr 0, no bias update) exports the same: $out"
else fail "PP 2 x EP 2's checkpoint loaded on one rank: $out"; fi
# and the other way: one rank's checkpoint loaded under PP 2 x EP 2 (each stage takes its blocks' biases) exports one
# rank's biases and weights
run reloadpp 4 "${ds[@]}" --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.expert_parallel_degree=2 --training.steps=1 --optimizer.lr=0 \
  --model.load_balance_coeff=0 --checkpoint.initial_load_path="$T/single/checkpoint/step-$STEPS" \
  --checkpoint.initial_load_model_only=true
if out=$(same_export "$T/single/$hf" "$T/reloadpp/checkpoint/step-1-hf/model.safetensors" 2>&1); then
  echo "ok   one rank's checkpoint loaded under PP 2 x EP 2 (lr 0, no bias update) exports the same: $out"
else fail "one rank's checkpoint loaded under PP 2 x EP 2: $out"; fi
[ "$fails" -eq 0 ] && echo "deepseek_v3_hf_pp: ok" || { echo "deepseek_v3_hf_pp: $fails failed"; exit 1; }
