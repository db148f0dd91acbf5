#!/usr/bin/env python3
"""Golden outputs of torchao's float8 training recipes for one linear layer (tests/unit/test_float8_golden.c).

Writes tests/golden/float8/float8_linear.ctt (the ctt format of core/io/tensorfile.h): the inputs x, w, dy of a
single nn.Linear(64, 96, bias=False) and, per recipe (tensorwise, rowwise, rowwise_with_gw_hp), the output y
and the gradients dx, dw that torchao computes with `convert_to_float8_training` and
`Float8LinearConfig(emulate=True)` on the CPU. Emulation casts each GEMM operand to the fp8 grid exactly as
on a GPU (same scales, same saturated round-to-nearest-even cast) and multiplies the dequantised values in
f32 (torch.mm), which is what ctitan's float8 plugin does with the device's fp8 ops.

A second, small case ("edge.*", 16 x 16 x 16, rowwise) puts every row's amax one float32 step above
448 / 2^3, where the power-of-two scale is rounded by torchao's float32 log2 (see README.md).

Needs torch 2.x and `pip install torchao` (tested with torchao 0.18.0 and torch 2.15). Run from the
repository root:

    python3 tests/golden/float8/gen_float8_golden.py           # writes the .ctt
    python3 tests/golden/float8/gen_float8_golden.py --check   # recompute, compare with the committed file

Before writing, the script checks that torchao's results equal a plain-PyTorch implementation of the
recipes written here from torchao's source (config.py, float8_linear.py, float8_utils.py), bit for bit,
and prints how far torchao's f32 GEMMs are from the same GEMMs in float64 (the floor any other summation
order can reach).
"""
import argparse
import copy
import dataclasses
import math
import os
import struct
import sys

import torch

N, IN, OUT = 32, 64, 96
EDGE = 16
SEED = 20240607
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "float8_linear.ctt")

# ---------------------------------------------------------------------------------------------------
# the ctt format (core/io/tensorfile.h): the reader and writer of tests/golden/gen_llama3_golden.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gen_llama3_golden import ctt_read, ctt_write  # noqa: E402  (the ctt format, shared)


def make_inputs():
    """x (N, IN), w (OUT, IN), dy (N, OUT) in f32 with outliers, tiny rows/columns and a zero row."""
    g = torch.Generator().manual_seed(SEED)
    w = (torch.rand(OUT, IN, generator=g) * 2 - 1) / math.sqrt(IN)  # nn.Linear's default init range
    w[3, :] *= 1e-3          # a tiny row: its own rowwise scale, mostly subnormal in tensorwise
    w[40, 17] = 2.0          # an outlier: the tensorwise weight scale is set by it
    w[:, 50] *= 1e-4         # a tiny column: the grad_input GEMM scales w per column
    x = torch.randn(N, IN, generator=g)
    x[5, 10] = 300.0         # large outliers: tensorwise scale 448/300, most of x lands on coarse values
    x[20, 3] = -150.0
    x[12, :] *= 1e-4         # a tiny row (forward groups), flushed towards subnormals by tensorwise
    x[30, :] = 0.0           # a zero row: amax 0 (torchao clamps it to EPS = 1e-12)
    x[:, 7] *= 1e-6          # a tiny column (grad_weight groups)
    x[9, 40] = 3e-9          # lone tiny values far below any fp8 subnormal
    x[17, 41] = -1e-7
    dy = torch.randn(N, OUT, generator=g) * 1e-3
    dy[7, 50] = 5.0          # a large gradient: e5m2 tensorwise scale set by it
    dy[:, 80] *= 1e-5        # a tiny column
    dy[15, :] *= 1e-6        # a tiny row
    dy[25, :] = 0.0          # a zero row
    return x.float(), w.float(), dy.float()


def make_edge():
    """A 16x16x16 case for the power-of-two scale edge (README): every x row holds one value a float32
    step above 56 = 448 / 2^3 in column 0 and small values k * 2^-12 (k odd, 1..7) elsewhere; w's
    column 0 is zero so y depends only on the small values."""
    g = torch.Generator().manual_seed(SEED + 1)
    k = (torch.randint(0, 4, (EDGE, EDGE), generator=g) * 2 + 1).float()
    sign = torch.where(torch.rand(EDGE, EDGE, generator=g) < 0.5, -1.0, 1.0)
    x = k * sign * 2.0 ** -12
    x[:, 0] = torch.nextafter(torch.tensor(56.0), torch.tensor(math.inf))
    w = torch.randn(EDGE, EDGE, generator=g) * 0.1
    w[:, 0] = 0.0
    dy = torch.randn(EDGE, EDGE, generator=g) * 1e-2
    return x.float(), w.float(), dy.float()


# ---------------------------------------------------------------------------------------------------
# torchao


def torchao_config(recipe):
    from torchao.float8 import Float8LinearConfig
    if recipe == "tensorwise":
        return Float8LinearConfig(emulate=True)  # the default config is the tensorwise recipe
    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)


def run_torchao(recipe, x, w, dy):
    """y, dx, dw of a float8-converted nn.Linear (in, out, bias=False) with weight w."""
    from torchao.float8 import convert_to_float8_training
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    m = convert_to_float8_training(copy.deepcopy(lin), config=torchao_config(recipe))
    assert type(m).__name__ == "Float8Linear", f"{recipe}: not converted: {m}"
    xx = x.clone().requires_grad_(True)
    y = m(xx)
    y.backward(dy)
    return y.detach(), xx.grad.detach(), m.weight.grad.detach()


# ---------------------------------------------------------------------------------------------------
# The recipes in plain PyTorch, from torchao's source (config.py from_recipe_name, float8_linear.py
# matmul_with_hp_or_float8_args, float8_utils.py amax_to_scale / to_fp8_saturated, float8_ops.py's
# emulated mm: torch.mm(a_data.float() / a_scale, b_data.float() / b_scale)).

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
EPS = 1e-12


def pow2_torch(scale):
    """torchao's _round_scale_down_to_power_of_2: exp2(floor(log2(scale))) in float32."""
    return torch.exp2(torch.floor(torch.log2(scale)))


def pow2_exact(scale):
    """The true power of two at or below scale (frexp: exact)."""
    _, e = torch.frexp(scale)
    return torch.ldexp(torch.ones_like(scale), e - 1)


def fake_cast(t, dtype, dim, pow2):
    """t cast to dtype's grid and back; dim None: one tensor-wide scale, else amax over that dim."""
    amax = t.abs().max() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    scale = (torch.finfo(dtype).max / torch.clamp(amax.double(), min=EPS)).float()
    if pow2:
        scale = pow2_torch(scale)
    m = torch.finfo(dtype).max
    bits = (t * scale).clamp(-m, m).to(dtype)
    return bits.float() / scale, scale


def run_reference(recipe, x, w, dy):
    if recipe == "tensorwise":
        i_dim, w_dim, w_gi_dim, go_dim, go_gw_dim, i_gw_dim = None, None, None, None, None, None
        go_dtype, pow2, gw_hp = E5M2, False, False
    else:  # rowwise: scales along each GEMM's reduction dim (torchao's axiswise dims)
        i_dim, w_dim, go_dim, go_gw_dim, i_gw_dim = -1, -1, -1, 0, 0
        w_gi_dim = None if recipe == "rowwise_with_gw_hp" else 0  # w_gi is TENSORWISE in gw_hp
        go_dtype, pow2, gw_hp = E4M3, True, recipe == "rowwise_with_gw_hp"
    xq, _ = fake_cast(x, E4M3, i_dim, pow2)
    wq, _ = fake_cast(w, E4M3, w_dim, pow2)  # w (out, in): per row = per column of w^T (dim 0)
    y = torch.mm(xq, wq.t())
    gq, _ = fake_cast(dy, go_dtype, go_dim, pow2)
    wq_gi, _ = fake_cast(w, E4M3, w_gi_dim, pow2)  # per column of w = per row of w^T (dim -1)
    dx = torch.mm(gq, wq_gi)
    if gw_hp:
        dw = torch.mm(dy.t(), x)
    else:
        gq2, _ = fake_cast(dy, go_dtype, go_gw_dim, pow2)
        xq2, _ = fake_cast(x, E4M3, i_gw_dim, pow2)
        dw = torch.mm(gq2.t(), xq2)
    ops = dict(y=(xq, wq.t()), dx=(gq, wq_gi), dw=((dy.t(), x) if gw_hp else (gq2.t(), xq2)))
    return (y, dx, dw), ops


def pow2_edges(t, dims):
    """Groups whose torchao power-of-two scale differs from the exact one (log2 rounded up)."""
    hits = []
    for dtype, dim in dims:
        amax = t.abs().max() if dim is None else t.abs().amax(dim=dim, keepdim=True)
        scale = (torch.finfo(dtype).max / torch.clamp(amax.double(), min=EPS)).float()
        n = int((pow2_torch(scale) != pow2_exact(scale)).sum())
        if n:
            hits.append((str(dtype), dim, n))
    return hits


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / max(b.double().norm(), 1e-300))


def compute():
    import torchao
    torch.set_num_threads(1)
    x, w, dy = make_inputs()
    items = [("config.n", torch.tensor(N, dtype=torch.int32)), ("config.in", torch.tensor(IN, dtype=torch.int32)),
             ("config.out", torch.tensor(OUT, dtype=torch.int32)), ("input.x", x), ("input.w", w), ("input.dy", dy)]
    # The main inputs must not sit on the power-of-two edge (that is the edge case's job).
    for t, dims in ((x, [(E4M3, -1), (E4M3, 0)]), (w, [(E4M3, -1), (E4M3, 0), (E4M3, None)]),
                    (dy, [(E4M3, -1), (E4M3, 0)])):
        assert not pow2_edges(t, dims), "main inputs hit the power-of-two edge; change the seed"
    report = {"torchao": torchao.__version__, "torch": torch.__version__}
    for r in RECIPES:
        got = run_torchao(r, x, w, dy)
        ref, ops = run_reference(r, x, w, dy)
        for name, a, b in zip(("y", "dx", "dw"), got, ref):
            assert torch.equal(a, b), f"{r}.{name}: torchao differs from the plain-PyTorch recipe"
            exact = torch.mm(ops[name][0].double(), ops[name][1].double())
            report[f"{r}.{name}"] = rel_err(a, exact)
            items.append((f"{r}.{name}", a))
    ex, ew, edy = make_edge()
    hits = pow2_edges(ex, [(E4M3, -1)])
    assert hits and hits[0][2] == EDGE, f"the edge case does not hit the edge: {hits}"
    items += [("edge.x", ex), ("edge.w", ew), ("edge.dy", edy)]
    got = run_torchao("rowwise", ex, ew, edy)
    ref, _ = run_reference("rowwise", ex, ew, edy)
    for name, a, b in zip(("y", "dx", "dw"), got, ref):
        assert torch.equal(a, b), f"edge.rowwise.{name}: torchao differs from the plain-PyTorch recipe"
        items.append((f"edge.rowwise.{name}", a))
    return items, report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="recompute and compare with the file, write nothing")
    args = ap.parse_args()
    items, report = compute()
    print(f"torchao {report.pop('torchao')}, torch {report.pop('torch')}")
    for k, v in report.items():
        print(f"  {k:28s} torchao f32 GEMM vs float64 of the same fp8 operands: rel. err {v:.2e}")
    if args.check:
        have = ctt_read(args.out)
        bad = [n for n, t in items if n not in have or not torch.equal(have[n], t.to(have[n].dtype))]
        if bad or len(have) != len(items):
            print(f"{args.out}: differs: {bad or 'tensor count'}")
            return 1
        print(f"{args.out}: matches")
        return 0
    size = ctt_write(args.out, items)
    back = ctt_read(args.out)
    assert len(back) == len(items)
    print(f"wrote {args.out} ({size} bytes, {len(items)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
