#!/usr/bin/env bash
# profiling.profile_freq on 2 ranks (FSDP 2, a 6-layer model): the windows' steps only are traced,
# into iteration_N folders; the merged trace is Chrome trace JSON with one process per rank holding
# every layer's range, device ops with shapes and FLOPs, collectives with bytes and mesh axis, and
# memory counters; each memory snapshot's live bytes sum to the counters at the step's peak, which
# the trace's counters show too, and name the tensors that own them. Bad profiling keys exit 2.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/data.sh
test_data "$T" 512 || { echo "FAIL test data"; exit 1; }
args=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.tokenizer_path="$T/tok.model"
      --job.dump_folder="$T/dump" --model.vocab_size=512 --model.n_layers=6 --model.dim=32 --model.n_heads=2
      --model.n_kv_heads=2 --training.steps=5 --training.seq_len=16 --training.local_batch_size=2
      --generate.max_new_tokens=0 --metrics.log_freq=1 --device.threads=1 --comm.train_timeout_seconds=60
      --parallelism.data_parallel_shard_degree=2 --profiling.enable_profiling=true --profiling.profile_freq=2
      --profiling.profiler_warmup=0 --profiling.enable_memory_snapshot=true)
timeout 120 "$CTITAN" launch -n 2 train "${args[@]}" >"$T/out" 2>&1 \
  || { echo "FAIL training with profiling on 2 ranks exited $?:"; tail -5 "$T/out"; exit 1; }
grep -q "^trace: $T/dump/profile_traces/iteration_2/trace.json$" "$T/out" \
  || { echo "FAIL no 'trace:' line naming iteration_2/trace.json"; tail -5 "$T/out"; exit 1; }
python3 - "$T/dump" <<'PY'
import json, os, sys
dump = sys.argv[1]
traces, snaps = dump + "/profile_traces", dump + "/memory_snapshot"
# steps 1..5 at profile_freq 2: windows end at steps 2 and 4; step 5 starts a window that never ends
for folder in (traces, snaps):
    got = sorted(os.listdir(folder))
    assert got == ["iteration_2", "iteration_4"], "%s holds %s, wanted iteration_2 and iteration_4" % (folder, got)
cats = ["params", "grads", "optimizer", "activations", "comm", "other", "master"]
for it in ("iteration_2", "iteration_4"):
    d = "%s/%s" % (traces, it)
    assert sorted(os.listdir(d)) == ["rank0_trace.json", "rank1_trace.json", "trace.json"], os.listdir(d)
    for r in (0, 1):
        with open("%s/rank%d_trace.json" % (d, r)) as f:
            assert {e["pid"] for e in json.load(f)["traceEvents"]} == {r}, "rank %d's file holds other pids" % r
    with open(d + "/trace.json") as f:
        ev = json.load(f)["traceEvents"]  # raises on invalid JSON
    assert isinstance(ev, list) and ev, "traceEvents is empty"
    for e in ev:
        assert e["ph"] in "BEXCM" and isinstance(e["ts"], (int, float)) and isinstance(e["name"], str), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X": assert e["dur"] >= 0, e
    names = sorted((e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name")
    assert names == [(0, "rank 0"), (1, "rank 1")], "process_name metadata: %r" % names
    for r in (0, 1):
        mine = [e for e in ev if e["pid"] == r]
        stacks, counts = {}, {}
        for e in mine:
            st = stacks.setdefault(e["tid"], [])
            if e["ph"] == "B":
                st.append(e["name"]); counts[e["name"]] = counts.get(e["name"], 0) + 1
            elif e["ph"] == "E":
                assert st and st.pop() == e["name"], "rank %d: E without its B: %r" % (r, e)
        assert not any(stacks.values()), "rank %d: ranges left open: %r" % (r, stacks)
        assert counts.get("step") == 1, "%s rank %d: %r steps traced, wanted 1 (profiler_active 1)" % (it, r, counts.get("step"))
        layers = ["layers.%d" % i for i in range(6)]
        missing = [l for l in layers if l not in counts]
        assert not missing, "rank %d: missing %s (has %s)" % (r, missing, sorted(counts))
        assert len({counts[l] for l in layers}) == 1, "rank %d: layers timed unequally %r" % (r, counts)
        ops = [e for e in mine if e.get("cat") == "device_op"]
        kinds = {e["name"] for e in ops}
        for k in ("linear", "attention", "rmsnorm", "embedding", "cross_entropy", "linear_backward", "attention_backward"):
            assert k in kinds, "rank %d: no %s op (has %s)" % (r, k, sorted(kinds))
        for e in ops:
            a = e["args"]
            assert isinstance(a["flops"], (int, float)) and isinstance(a["output"], list) and isinstance(a["inputs"], list), e
            if e["name"] == "linear":
                x, w = a["inputs"]
                m = 1
                for s in x[:-1]: m *= s
                assert a["flops"] == 2 * m * w[0] * w[1] and x[-1] == w[1], "linear flops != 2mnk: %r" % e
            if e["name"] == "attention":
                b, t, h, dh = a["inputs"][0]
                assert a["flops"] == 2 * b * h * t * t * dh, "attention flops: %r" % e
        coll = [e for e in mine if e.get("cat") == "collective"]
        assert coll, "rank %d: no collective" % r
        for e in coll:
            a = e["args"]
            assert a["kind"] == e["name"] and a["bytes"] > 0 and isinstance(a["axis"], str), e
        assert {"all_gather", "reduce_scatter"} <= {e["name"] for e in coll}, "rank %d: FSDP's collectives missing" % r
        assert "dp_shard" in {e["args"]["axis"] for e in coll}, "rank %d: no collective over dp_shard" % r
        mem = [e for e in mine if e["ph"] == "C" and e["name"] == "memory"]
        assert mem and all(sorted(e["args"]) == sorted(cats) for e in mem), "rank %d: memory counters %r" % (r, mem[:1])
        # the snapshot of this step: what is live at the peak, summing to the counters there
        with open("%s/%s/rank%d_memory_snapshot.json" % (snaps, it, r)) as f:
            snap = json.load(f)
        assert snap["rank"] == r and snap["step"] == int(it.split("_")[1]), snap
        sums = {c: 0 for c in cats}
        for l in snap["live"]:
            assert l["category"] in cats and l["bytes"] > 0 and l["owner"], l
            sums[l["category"]] += l["bytes"]
        assert sums == snap["counters"], "live bytes %r != counters %r" % (sums, snap["counters"])
        assert snap["total_bytes"] == sum(sums.values()), snap["total_bytes"]
        peak = max(sum(e["args"].values()) for e in mem)
        at = next(e["args"] for e in mem if sum(e["args"].values()) == peak)
        assert at == snap["counters"], "trace's counters at the peak %r != snapshot's %r" % (at, snap["counters"])
        owners = {(l["category"], l["owner"]) for l in snap["live"]}
        for i in range(6):
            for c in ("params", "grads"):
                assert (c, "layers.%d.attention.wq.weight" % i) in owners, "no %s owner layers.%d.attention.wq.weight" % (c, i)
        assert ("comm", "fsdp") in owners, "FSDP's buffers not owned by fsdp: %r" % sorted(o for o in owners if o[0] == "comm")
print("ok   2 ranks, iterations 2 and 4: layers, device ops, collectives, memory counters, snapshots")
PY
[ $? -eq 0 ] || { echo "trace_profile: FAIL"; exit 1; }
fails=0
bad() { # name pattern args...: exit 2 and one stderr line matching pattern
  local name=$1 pat=$2; shift 2
  "$CTITAN" train "${args[@]}" --job.dump_folder="$T/bad" "$@" >"$T/bo" 2>"$T/be"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/be")" -eq 1 ] && grep -qE -- "$pat" "$T/be"; then echo "ok   $name: $(cat "$T/be")"
  else echo "FAIL $name: status $rc, wanted 2 and one line /$pat/:"; sed 's/^/     /' "$T/be"; fails=$((fails+1)); fi
}
bad "profile_freq 0" "profiling.profile_freq.*need profile_freq >= 1.*got 0" --parallelism.data_parallel_shard_degree=1 --profiling.profile_freq=0
bad "warmup past the window" "profiling.profiler_warmup.*profiler_warmup \+ profiler_active <= profile_freq" \
  --parallelism.data_parallel_shard_degree=1 --profiling.profiler_warmup=2
[ $fails -eq 0 ] && echo "trace_profile: ok" || { echo "trace_profile: FAIL"; exit 1; }
