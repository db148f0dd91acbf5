#!/usr/bin/env bash
# Context parallel trains a sequence one rank cannot hold: the CPU device capped at 300 MiB
# (device.memory_limit_mb, a GPU's capacity in small), llama3 debugmodel at 2,048 tokens, one
# sequence. One rank runs out of memory with one line naming the cap (exit 1); CP 4 trains it within
# the cap, and its first step's loss is one rank's (measured without a cap) to 1e-6.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/data.sh
test_data "$T" 2048 || fail "test data"
LIMIT=300
args=(train configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --training.seq_len=2048
      --training.local_batch_size=1 --training.global_batch_size=1 --training.steps=2 --metrics.log_freq=1
      --generate.max_new_tokens=0 --device.threads=1 --activation_checkpoint.mode=none
      --training.mixed_precision_param=float32 --comm.train_timeout_seconds=120)

"$CTITAN" "${args[@]}" --device.memory_limit_mb=$LIMIT --job.dump_folder="$T/one" >"$T/one.log" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -3 "$T/one.log"; fail "one rank under a $LIMIT MiB cap: exit $rc, expected 1 (out of memory)"; }
grep -q "out of memory.*memory_limit_mb $LIMIT" "$T/one.log" || { tail -3 "$T/one.log"; fail "the error does not name the cap"; }
[ "$(grep -c 'ctitan:' "$T/one.log")" -eq 1 ] || fail "more than one error line"
echo "ok    one rank, seq 2048, cap $LIMIT MiB: $(grep 'ctitan:' "$T/one.log")"

"$CTITAN" launch -n 4 "${args[@]}" --device.memory_limit_mb=$LIMIT --parallelism.context_parallel_degree=4 \
  --job.dump_folder="$T/cp4" >"$T/cp4.log" 2>&1 || { tail -5 "$T/cp4.log"; fail "CP 4 under the same cap"; }
"$CTITAN" "${args[@]}" --training.steps=1 --job.dump_folder="$T/ref" >"$T/ref.log" 2>&1 || fail "one rank without a cap"
python3 - "$T/cp4/metrics.jsonl" "$T/ref/metrics.jsonl" $LIMIT <<'PY' || fail "CP 4 against one rank"
import json, sys
cp = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
ref = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
limit = float(sys.argv[3]) * 2**20
peak = max(r["memory"]["peak_bytes"] for r in cp)
gap = abs(cp[0]["loss"] - ref[0]["loss"]) / abs(ref[0]["loss"])
ok = len(cp) == 2 and peak <= limit and gap <= 1e-6
print("%s  CP 4, seq 2048: peak %.1f MiB per rank (cap %.0f), step-1 loss %.8f vs one rank's %.8f (gap %.1e)"
      % ("ok  " if ok else "FAIL", peak / 2**20, limit / 2**20, cp[0]["loss"], ref[0]["loss"], gap))
sys.exit(0 if ok else 1)
PY
