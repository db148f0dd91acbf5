#!/usr/bin/env python3
"""Reference outputs of the MoE experts' float8 grouped GEMMs (tests/unit/test_float8_grouped.c).

Writes tests/golden/float8/float8_grouped.ctt (the ctt format of core/io/tensorfile.h): activations
x (M, I), dy (M, O), experts weights w (E, O, I), several segment layouts (offsets (E+1), empty segments
and rows in no segment among them) and, per recipe and layout, y = x_g w_g^T, dx = dy_g w_g and
dw_g = dy_g^T x_g computed here in plain PyTorch from the definition of torchao's float8 grouped GEMM:

  rowwise  every operand cast to float8_e4m3fn with one scale per row along the GEMM's reduction: the
           forward scales x per token (along I) and w per (expert, output channel) (along I), the input
           gradient dy per token (along O) and w per (expert, input column) (along O), the weight
           gradient dy and x per column within each expert's segment (along its tokens). A scale is
           448 / max(amax, 1e-12) rounded down to a power of two, in float32 as torchao rounds it.
  mxfp8    e4m3 in blocks of 32 along the same reductions with E8M0 scales 2^(8 - floor(log2 amax))
           (1 for an all-zero block); a segment's last block is padded with zeros to 32 rows.

Values are clamped to +-448 and cast with torch's round-to-nearest-even float8_e4m3fn conversion, then
dequantised; the GEMMs run in float64 on the dequantised values and are rounded to float32 once, so the
C test's tolerance covers its own float32 summation only.

Run from the repository root with torch 2.x:
    python3 tests/golden/float8/gen_float8_grouped_golden.py          # writes the .ctt
    python3 tests/golden/float8/gen_float8_grouped_golden.py --check  # recompute, compare with the file
"""
import argparse
import math
import os
import sys

import torch

M, E, O, I = 72, 4, 32, 64
SEED = 20261207
LAYOUTS = {
    "mixed": [0, 20, 20, 53, 72],        # expert 1 empty
    "one": [0, 0, 0, 72, 72],            # every row to expert 2, experts 0, 1, 3 empty
    "tail": [0, 5, 37, 40, 61],          # rows 61..71 in no segment (unrouted pairs)
}
RECIPES = ("rowwise", "mxfp8")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "float8_grouped.ctt")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gen_llama3_golden import ctt_read, ctt_write  # noqa: E402  (the ctt format, shared)

E4M3_MAX = 448.0


def fp8_rows(a):
    """a (rows, k): each row cast along k with one power-of-two scale (rowwise)."""
    amax = a.abs().amax(dim=1, keepdim=True).float()
    s = torch.tensor(E4M3_MAX, dtype=torch.float32) / torch.clamp(amax, min=1e-12)
    s = torch.exp2(torch.floor(torch.log2(s)))
    q = torch.clamp(a * s, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    return q / s


def fp8_blocks(a):
    """a (rows, k), k a multiple of 32: blocks of 32 along k with E8M0 scales (mxfp8)."""
    r, k = a.shape
    b = a.reshape(r, k // 32, 32)
    amax = b.abs().amax(dim=2, keepdim=True)
    expo = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax))))
    s = torch.where(amax > 0, torch.exp2(8 - expo), torch.ones_like(amax)).float()
    q = torch.clamp(b * s, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    return (q / s).reshape(r, k)


def cast(a, recipe, along_rows=True):
    """a (rows, k) cast along k (along_rows) or down its columns (along_rows False: along rows' count)."""
    if not along_rows:
        return cast(a.t().contiguous(), recipe).t().contiguous()
    if recipe == "rowwise":
        return fp8_rows(a)
    k = a.shape[1]
    pad = (-k) % 32
    padded = torch.cat([a, torch.zeros(a.shape[0], pad)], dim=1) if pad else a
    return fp8_blocks(padded)[:, :k]


def grouped(x, w, dy, off, recipe):
    """y (M, O), dx (M, I), dw (E, O, I) of the grouped GEMMs, zero where no segment writes."""
    y, dx, dw = torch.zeros(M, O), torch.zeros(M, I), torch.zeros(E, O, I)
    xq = cast(x, recipe).double()                                   # per token along I
    wq = cast(w.reshape(E * O, I), recipe).reshape(E, O, I).double()  # per expert output channel
    gq = cast(dy, recipe).double()                                  # per token along O
    for g in range(E):
        a, b = off[g], off[g + 1]
        wg_cols = cast(w[g], recipe, along_rows=False).double()     # per expert input column along O
        if b == a:
            continue
        y[a:b] = (xq[a:b] @ wq[g].t()).float()
        dx[a:b] = (gq[a:b] @ wg_cols).float()
        gseg = cast(dy[a:b], recipe, along_rows=False).double()     # per column within the segment
        xseg = cast(x[a:b], recipe, along_rows=False).double()
        dw[g] = (gseg.t() @ xseg).float()
    return y, dx, dw


def make_inputs():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(M, I, generator=g)
    x[3, 5] = 200.0          # an outlier token: its own row scale
    x[10, :] *= 1e-4         # a tiny token
    x[30, :] = 0.0           # a zero token (amax 0)
    x[:, 9] *= 1e-5          # a tiny column: the weight gradient scales x per column within a segment
    w = (torch.rand(E, O, I, generator=g) * 2 - 1) / math.sqrt(I)
    w[1, 4, :] *= 1e-3       # a tiny output channel of one expert
    w[2, :, 7] *= 1e-4       # a tiny input column of one expert (the input gradient's scale)
    w[3, 0, 0] = 3.0         # an outlier
    dy = torch.randn(M, O, generator=g) * 1e-3
    dy[12, 6] = 4.0
    dy[40, :] *= 1e-6
    dy[:, 20] *= 1e-5
    return x.float(), w.float(), dy.float()


def build():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    x, w, dy = make_inputs()
    items = [("x", x), ("w", w), ("dy", dy)]
    for name, off in LAYOUTS.items():
        items.append((f"{name}.offsets", torch.tensor(off, dtype=torch.int32)))
        for r in RECIPES:
            y, dx, dw = grouped(x, w, dy, off, r)
            items += [(f"{name}.{r}.y", y), (f"{name}.{r}.dx", dx), (f"{name}.{r}.dw", dw)]
    return items


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    items = build()
    if a.check:
        have = ctt_read(a.out)
        for k, v in items:
            if k not in have or not torch.equal(have[k].reshape(v.shape), v):
                sys.exit(f"{a.out}: {k} differs from a fresh computation")
        print(f"{a.out}: {len(items)} tensors equal a fresh computation")
        return
    n = ctt_write(a.out, items)
    print(f"wrote {a.out}: {len(items)} tensors, {n} bytes")


if __name__ == "__main__":
    main()
