#!/usr/bin/env bash
# The profiler's Chrome trace names every unit it timed: a 6-layer model's trace is valid JSON in
# Chrome's trace format (B/E pairs that match, with device ops, collectives and counters beside them)
# and holds layers.0 .. layers.5, each as often as the others (a model that handed out reused name
# buffers showed only the last three; the trace now copies each name). One rank; trace_profile.sh
# covers two.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/data.sh
test_data "$T" 512 || { echo "FAIL test data"; exit 1; }
N=6
timeout 120 "$CTITAN" train configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" \
  --model.tokenizer_path="$T/tok.model" --job.dump_folder="$T/dump" --model.vocab_size=512 \
  --model.n_layers=$N --model.dim=32 --model.n_heads=2 --model.n_kv_heads=2 --training.steps=2 \
  --training.seq_len=16 --training.local_batch_size=2 --generate.max_new_tokens=0 --metrics.log_freq=1 \
  --device.threads=1 --profiling.enable_profiling=true --profiling.profile_freq=2 --profiling.profiler_warmup=0 >"$T/out" 2>&1 \
  || { echo "FAIL training with profiling exited $?:"; tail -5 "$T/out"; exit 1; }
trace=$(sed -n 's/^trace: //p' "$T/out")
[ -f "$trace" ] || { echo "FAIL no trace: the run printed no 'trace:' line naming a file"; tail -5 "$T/out"; exit 1; }
case $trace in "$T/dump/profile_traces/iteration_2/trace.json") ;; *) echo "FAIL trace at $trace, wanted iteration_2 under the dump folder"; exit 1 ;; esac
python3 - "$trace" "$N" <<'PY'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
with open(path) as f:
    doc = json.load(f)  # raises on invalid JSON
ev = doc["traceEvents"]
assert isinstance(ev, list) and ev, "traceEvents is empty"
stacks = {}
for e in ev:
    assert e["ph"] in ("B", "E", "X", "C", "M"), e
    assert isinstance(e["ts"], (int, float)) and isinstance(e["name"], str) and "pid" in e and "tid" in e, e
    stack = stacks.setdefault((e["pid"], e["tid"]), [])
    if e["ph"] == "B":
        stack.append(e["name"])
    elif e["ph"] == "E":
        assert stack and stack.pop() == e["name"], "E without its B: %r" % e
assert not any(stacks.values()), "ranges left open: %r" % stacks
counts = {}
for e in ev:
    if e["ph"] == "B":
        counts[e["name"]] = counts.get(e["name"], 0) + 1
layers = ["layers.%d" % i for i in range(n)]
missing = [l for l in layers if l not in counts]
assert not missing, "missing from the trace: %s (it has %s)" % (missing, sorted(counts))
extra = sorted(k for k in counts if k.startswith("layers.") and k not in layers)
assert not extra, "layers the model does not have: %s" % extra
assert len({counts[l] for l in layers}) == 1, "layers timed unequally: %r" % {l: counts[l] for l in layers}
print("ok   %d events; layers.0 .. layers.%d each %d times, tok_embeddings %d, output %d"
      % (len(ev), n - 1, counts["layers.0"], counts.get("tok_embeddings", 0), counts.get("output", 0)))
PY
[ $? -eq 0 ] && echo "trace_layers: ok" || { echo "trace_layers: FAIL"; exit 1; }
