#!/usr/bin/env bash
# checkpoint.export_dtype: bfloat16 stores the final model-only save in bf16 (2 bytes per value, the file
# halved, metadata dtype "bf16"), each value the f32 weight rounded to nearest even; a run loading it
# reads those values back exactly (widened to f32), on one rank and resharded onto FSDP 2.
set -u
. tests/cli/lib/common.sh
CTITAN=${CTITAN:-build/ctitan}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
py=${CT_PYTHON:-python3}
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null || fail "tokenizer"
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail "tokenize"
c=(configs/llama3_debug.yaml --model.n_layers=2 --model.vocab_size=512 --training.seq_len=32 --training.local_batch_size=4
   --training.dataset_path="$T/data.bin" --generate.max_new_tokens=0 --device.threads=1 --metrics.log_freq=1
   --checkpoint.enable=true --checkpoint.last_save_model_only=true --comm.train_timeout_seconds=120)
run() { local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${c[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${c[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi ||
    { tail -5 "$T/$name.log"; fail "$name run"; }
}
run f32 1 --training.steps=3 --checkpoint.export_dtype=float32
run bf16 1 --training.steps=3 --checkpoint.export_dtype=bfloat16
grep -q '"dtype":"bf16"\|"dtype": "bf16"' "$T/bf16/checkpoint/step-3/metadata.json" || fail "metadata: no bf16 dtype"
# reading the saved bf16 back: one rank and FSDP 2, one step at lr 0 (the weights stay), saved in f32
for n in 1 2; do
  run "back$n" "$n" --training.steps=1 --optimizer.lr=0 --lr_scheduler.warmup_steps=0 --checkpoint.export_dtype=float32 \
    --checkpoint.initial_load_path="$T/bf16/checkpoint/step-3" --checkpoint.initial_load_model_only=true \
    --parallelism.data_parallel_shard_degree="$n" --training.local_batch_size=$((4 / n))
done
"$py" - "$T" <<'EOF' || exit 1
import json, struct, sys
T = sys.argv[1]
def values(step):  # tensor name -> list of floats, from every rank's pieces (1-D pieces of whole tensors here)
    meta = json.load(open(f"{step}/metadata.json"))
    out = {}
    for s in meta["shards"]:
        raw = open(f"{step}/{s['file']}", "rb").read()[s["byte_offset"]:s["byte_offset"] + s["bytes"]]
        if meta["tensors"][s["tensor"]]["dtype"] == "bf16":
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack(f"<{len(raw)//2}H", raw)]
        else:
            vals = list(struct.unpack(f"<{len(raw)//4}f", raw))
        out.setdefault(s["tensor"], []).append((s["offsets"], vals))
    return {k: [x for _, v in sorted(p) for x in v] for k, p in out.items()}
def bf16(x):  # round to nearest even, as ctitan does
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", u))[0]
import os
size = lambda d: sum(os.path.getsize(f"{d}/{f}") for f in os.listdir(d) if f.endswith(".bin"))
a, b = f"{T}/f32/checkpoint/step-3", f"{T}/bf16/checkpoint/step-3"
if size(a) != 2 * size(b):
    sys.exit(f"FAIL the bf16 save is {size(b)} bytes, the f32 one {size(a)}: not halved")
A, B = values(a), values(b)
bad = [k for k in A if [bf16(x) for x in A[k]] != B[k]]
if bad:
    sys.exit(f"FAIL bf16 values are not the f32 weights rounded to nearest even: {bad[:3]}")
for n in (1, 2):
    C = values(f"{T}/back{n}/checkpoint/step-1")
    bad = [k for k in B if C[k] != B[k]]
    if bad:
        sys.exit(f"FAIL a run on {n} rank(s) did not read the bf16 values back exactly: {bad[:3]}")
print(f"ok   export_dtype bfloat16: {size(b)} bytes for {size(a)} in f32, {len(B)} tensors rounded to nearest even, "
      "read back exactly on 1 rank and on FSDP 2")
EOF
