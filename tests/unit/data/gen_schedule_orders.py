"""Writes schedule_orders.txt: PyTorch's action order per rank for each shipped pipeline schedule,
the golden file test_schedules.c compares ctitan's schedule plugins with.

    python3 tests/unit/data/gen_schedule_orders.py      (from the repository root; needs torch)

The multi-stage schedules (LoopedBFS, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble,
DualPipeV) come from torch.distributed.pipelining's own _calculate_single_rank_operations, called on
an instance built without a process group; idle steps (None) are dropped, and DualPipeV's overlapped
forward+backward actions are written as their two halves in PyTorch's order (the forward, then the
backward), as ctitan's schedule ABI has no paired action. GPipe and 1F1B run their orders
inside step() in PyTorch, so they are transcribed from Schedule{GPipe,1F1B}._step_microbatches.
Each line: <plugin file name> <pp> <stages per rank> <microbatches> <rank> <actions, comma-separated>.
"""
import os

import torch
from torch.distributed.pipelining import schedules as S


def multi(cls, p, v, m):
    o = object.__new__(cls)
    o.pp_group_size, o._n_microbatches, o.n_local_stages = p, m, v
    o._stages = [None] * v
    o._num_stages = o.num_stages = p * v
    o.number_of_rounds = max(1, m // p)
    o.microbatches_per_round = m // o.number_of_rounds
    rows = []
    for r in range(p):
        o.rank = r
        ops = []
        for a in o._calculate_single_rank_operations(r):
            if a is not None:
                ops.extend(str(sub) for sub in (getattr(a, "sub_actions", None) or (a,)))
        rows.append(ops)
    return rows


def gpipe(p, m):
    return [[f"{r}F{i}" for i in range(m)] + [f"{r}B{i}" for i in range(m)] for r in range(p)]


def one_f1b(p, m):
    rows = []
    for r in range(p):
        warmup = min(m, p - r)  # Schedule1F1B: warmup_chunks, then alternating backward, forward
        ops, f = [f"{r}F{i}" for i in range(warmup)], warmup
        for b in range(m):
            ops.append(f"{r}B{b}")
            if f < m:
                ops.append(f"{r}F{f}")
                f += 1
        rows.append(ops)
    return rows


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedule_orders.txt")
    lines = [f"# PyTorch {torch.__version__} pipeline schedule orders; written by gen_schedule_orders.py"]

    def emit(name, p, v, m, rows):
        for r, ops in enumerate(rows):
            lines.append(f"{name} {p} {v} {m} {r} {','.join(ops)}")

    for p in (1, 2, 3, 4):
        for m in sorted({1, 3, p, 2 * p, 2 * p + 2}):
            cases = [("gpipe", 1, gpipe(p, m)), ("1f1b", 1, one_f1b(p, m))]
            for v in (2, 3):
                cases.append(("loopedbfs", v, multi(S.ScheduleLoopedBFS, p, v, m)))
                if m % max(1, m // p) == 0:  # the interleaved schedules' rounds
                    cases.append(("interleaved1f1b", v, multi(S.ScheduleInterleaved1F1B, p, v, m)))
                    cases.append(("interleavedzerobubble", v, multi(S.ScheduleInterleavedZeroBubble, p, v, m)))
            cases.append(("zbvzerobubble", 2, multi(S.ScheduleZBVZeroBubble, p, 2, m)))
            for name, v, rows in cases:
                emit(name, p, v, m, rows)
    # DualPipeV takes at least as many microbatches as stages (2p); pp 8 is the deepest the unit test checks
    for p in (1, 2, 3, 4, 8):
        for m in sorted({2 * p, 2 * p + 1, 2 * p + 3, 4 * p}):
            emit("dualpipev", p, 2, m, multi(S.ScheduleDualPipeV, p, 2, m))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out}: {len(lines) - 1} rank orders")


if __name__ == "__main__":
    main()
