#!/usr/bin/env bash
# metrics.enable_tensorboard: llama3 debugmodel (2 layers), 4 steps of 4 x 32 tokens, validation at
# steps 1, 2, 4, on one rank and on two (FSDP 2). The event files are read with the tensorboard
# package's own reader (tests/cli/lib/tb_check.py: EventAccumulator, which checks each record's
# CRCs), and every scalar of every step and validation record is checked against metrics.jsonl.
# - one folder per start, tb/RUN_ID, with one event file events.out.tfevents.<unix time>.<host>; a
#   rerun in the same dump folder gets its own; with FSDP 2 only rank 0 writes one;
# - an absolute metrics.save_tb_folder is used as is; tensorboard off writes no folder;
# - bad input: save_tb_folder a file, enable_wandb true: status 2 and one line naming file:line: key.
# Needs a Python with tensorboard: CT_PYTHON (default python3); `pip install tensorboard` if missing.
set -u
CTITAN=${CTITAN:-build/ctitan}
PY=${CT_PYTHON:-python3}
. tests/cli/lib/common.sh
test_tmp
"$PY" -c "import tensorboard" 2>/dev/null ||
  fail "$PY cannot import tensorboard: install it with \`$PY -m pip install tensorboard\` (or set CT_PYTHON to a Python that has it)"
. tests/cli/lib/data.sh
test_data "$T" 512 || fail "test data"
cat >"$T/tb.yaml" <<YAML
model: {name: llama3, flavor: debugmodel, n_layers: 2, vocab_size: 512}
training: {dataset_path: data.bin, seq_len: 32, local_batch_size: 2, global_batch_size: 4, steps: 4}
validation: {enable: true, dataset_path: data.bin, freq: 2, steps: 2}
metrics:
  log_freq: 1
  enable_tensorboard: true
  enable_wandb: false
YAML
common=("$T/tb.yaml" --generate.max_new_tokens=0 --device.threads=1 --activation_checkpoint.mode=none
        --training.mixed_precision_param=float32 --comm.train_timeout_seconds=120)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${common[@]}" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${common[@]}" "$@" >"$T/$name.log" 2>&1; fi ||
    { tail -20 "$T/$name.log"; fail "$name run"; }
}
run_ids() { sed -n 's/.*"event": "start".*"run_id": "\([^"]*\)".*/\1/p' "$1/metrics.jsonl"; }
# check DUMP TBFOLDER: one folder per start in TBFOLDER, named by its run_id, each checked
check() {
  local ids; ids=$(run_ids "$1" | sort | tr '\n' ' ')
  [ "$(cd "$2" && ls | sort | tr '\n' ' ')" = "$ids" ] || fail "$2 holds $(ls "$2" | tr '\n' ' '), not the starts $ids"
  for id in $ids; do
    ls "$2/$id" | grep -qE "^events\.out\.tfevents\.[0-9]{10}\.$(uname -n)$" || fail "$2/$id: $(ls "$2/$id")"
    "$PY" tests/cli/lib/tb_check.py "$2/$id" "$1/metrics.jsonl" || exit 1
  done
}

# 1. one rank, then a rerun in the same dump folder (a run of its own), then FSDP 2 (rank 0's file)
run single 1 --job.dump_folder="$T/single"
grep -q "^tensorboard: writing $T/single/tb/$(run_ids "$T/single")/events.out.tfevents" "$T/single.log" ||
  fail "no 'tensorboard: writing' line: $(grep tensorboard "$T/single.log")"
run rerun 1 --job.dump_folder="$T/single" --training.steps=2
[ "$(run_ids "$T/single" | wc -l)" -eq 2 ] || fail "the rerun is not a second start in metrics.jsonl"
check "$T/single" "$T/single/tb"
# the checker fails on a changed value: the last step's last scalar, with its CRC made right again
id=$(run_ids "$T/single" | head -1); mkdir -p "$T/mod/$id"
"$PY" - "$T/single/tb/$id"/events.* "$T/mod/$id/events.out.tfevents.0.mod" <<'PY' || fail "cannot rewrite the event file"
import struct, sys
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
recs, data, at = [], open(sys.argv[1], "rb").read(), 0
while at < len(data):
    n = struct.unpack("<Q", data[at:at + 8])[0]; recs.append(bytearray(data[at + 12:at + 12 + n])); at += n + 16
last = max(i for i, r in enumerate(recs) if b"comm/all_to_all" in r)
recs[last][-4:] = struct.pack("<f", struct.unpack("<f", recs[last][-4:])[0] + 1)
with open(sys.argv[2], "wb") as f:
    for r in recs:
        h = struct.pack("<Q", len(r)); f.write(h + struct.pack("<I", masked_crc32c(h)) + r + struct.pack("<I", masked_crc32c(bytes(r))))
PY
"$PY" tests/cli/lib/tb_check.py "$T/mod/$id" "$T/single/metrics.jsonl" >"$T/mod.log" 2>&1 &&
  fail "tb_check.py passed a changed value: $(cat "$T/mod.log")"
grep -q "^FAIL comm/all_to_all(bytes) step 4: " "$T/mod.log" || fail "tb_check.py: $(cat "$T/mod.log")"
echo "ok   tb_check.py finds a changed value: $(cat "$T/mod.log")"
run fsdp 2 --job.dump_folder="$T/fsdp" --parallelism.data_parallel_shard_degree=2
check "$T/fsdp" "$T/fsdp/tb"
# 2. an absolute save_tb_folder; tensorboard off writes nothing
run abs 1 --job.dump_folder="$T/abs" --metrics.save_tb_folder="$T/elsewhere" --training.steps=1
[ ! -e "$T/abs/tb" ] || fail "an absolute save_tb_folder also wrote under the dump folder"
check "$T/abs" "$T/elsewhere"
run off 1 --job.dump_folder="$T/off" --metrics.enable_tensorboard=false --training.steps=1
[ ! -e "$T/off/tb" ] || fail "tensorboard off made $T/off/tb"
echo "ok   no tb folder with metrics.enable_tensorboard false"

# 3. bad input: status 2, one stderr line naming the place and saying what is wrong
expect() { # name pattern... -- args
  local name=$1; shift; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  "$CTITAN" train "${common[@]}" "$@" >"$T/out" 2>"$T/err"; local rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] || { cat "$T/err"; fail "$name: status $rc, $(wc -l <"$T/err") lines"; }
  for p in "${pats[@]}"; do grep -qE -- "$p" "$T/err" || { cat "$T/err"; fail "$name: no /$p/"; }; done
  echo "ok   $name: $(cat "$T/err")"
}
mkdir -p "$T/bad1" && : >"$T/bad1/tb"
expect "save_tb_folder is a file" "metrics.save_tb_folder" "cannot create the folder $T/bad1/tb/" "Not a directory" -- \
  --job.dump_folder="$T/bad1"
expect "save_tb_folder empty" "command line: --metrics.save_tb_folder" "empty" -- \
  --job.dump_folder="$T/bad2" --metrics.save_tb_folder=
expect "enable_wandb true" "command line: --metrics.enable_wandb" "TensorBoard" -- --job.dump_folder="$T/bad3" \
  --metrics.enable_wandb=true
sed 's/enable_wandb: false/enable_wandb: true/' "$T/tb.yaml" >"$T/wandb.yaml"
"$CTITAN" train "$T/wandb.yaml" --job.dump_folder="$T/bad4" >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -qE "wandb.yaml:7: metrics.enable_wandb: true is not supported .*TensorBoard .*metrics.enable_tensorboard to true" "$T/err" ||
  { cat "$T/err"; fail "enable_wandb: true in the manifest"; }
echo "ok   $(cat "$T/err")"
echo "PASS"
