"""tb_check.py TB_RUN_FOLDER METRICS_JSONL: reads a run's TensorBoard event file with the tensorboard
package's own reader (EventAccumulator, which checks every record's CRCs) and checks it against the
records of metrics.jsonl whose run_id is the folder's name: every step record and validation record
has each of its tags at its step, with the record's value as a float32, and there is nothing else.
Prints one summary line; exit 0 when all match, 1 with a FAIL line on the first mismatch."""
import glob
import json
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as e:
    print(f"FAIL cannot import tensorboard ({e}): install it with `pip install tensorboard` "
          "(or point CT_PYTHON at a Python that has it)")
    sys.exit(1)

# tag -> where its value sits in a metrics.jsonl step record (README.md's table)
STEP_TAGS = {
    "loss_metrics/global_avg_loss": ("loss",),
    "grad_norm": ("grad_norm",),
    "lr": ("lr",),
    "throughput(tps)": ("tps",),
    "tflops": ("tflops",),
    "mfu(%)": ("mfu",),
    "memory/peak(bytes)": ("memory", "peak_bytes"),
    "memory/params(bytes)": ("memory", "params"),
    "memory/grads(bytes)": ("memory", "grads"),
    "memory/optimizer(bytes)": ("memory", "optimizer"),
    "memory/activations(bytes)": ("memory", "activations"),
    "memory/activations_live_peak(bytes)": ("memory", "activations_live_peak"),
    "memory/master(bytes)": ("memory", "master"),
    "memory/comm(bytes)": ("memory", "comm"),
    "comm/all_gather(bytes)": ("comm_bytes", "all_gather"),
    "comm/reduce_scatter(bytes)": ("comm_bytes", "reduce_scatter"),
    "comm/all_reduce(bytes)": ("comm_bytes", "all_reduce"),
    "comm/all_to_all(bytes)": ("comm_bytes", "all_to_all"),
}
VAL_TAGS = {"validation_metrics/loss": ("validation_loss",), "validation_metrics/tokens": ("validation_tokens",)}


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def main():
    folder, metrics = sys.argv[1], sys.argv[2]
    run_id = os.path.basename(os.path.normpath(folder))
    files = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    if len(files) != 1:
        fail(f"{folder}: {len(files)} event files, expected 1")
    want = {}  # tag -> {step: value}
    steps = vals = 0
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("run_id") != run_id:
                continue
            if rec.get("event") == "validation":
                tags, vals = VAL_TAGS, vals + 1
            elif "loss" in rec and "event" not in rec:
                tags, steps = STEP_TAGS, steps + 1
            else:
                continue
            for tag, path in tags.items():
                v = rec
                for k in path:
                    v = v[k]
                want.setdefault(tag, {})[rec["step"]] = f32(float(v))
    if not steps:
        fail(f"{metrics}: no step records of run {run_id}")
    acc = event_accumulator.EventAccumulator(files[0], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got_tags = set(acc.Tags()["scalars"])
    if got_tags != set(want):
        fail(f"{files[0]}: tags {sorted(got_tags ^ set(want))} are in only one of the event file and {metrics}")
    n = 0
    for tag, by_step in want.items():
        events = acc.Scalars(tag)
        got = {e.step: e.value for e in events}
        if len(events) != len(by_step) or set(got) != set(by_step):
            fail(f"{tag}: steps {sorted(got)} in the event file, {sorted(by_step)} in {metrics}")
        for step, v in by_step.items():
            same = got[step] == v or (got[step] != got[step] and v != v)  # NaN matches NaN
            if not same:
                fail(f"{tag} step {step}: {got[step]!r} in the event file, {v!r} (float32) in {metrics}")
            n += 1
    print(f"ok   {folder}: {len(want)} tags, {steps} step and {vals} validation records, {n} scalars equal")


main()
