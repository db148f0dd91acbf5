#!/usr/bin/env python3
"""The OCP FP8 reference table from ml_dtypes (float8_e4m3fn, float8_e5m2) through numpy casts.

Writes tests/golden/fp8/ml_dtypes_table.txt, which tests/unit/test_fp8.c reads (the C test never
runs Python). Needs numpy and ml_dtypes (`pip install numpy ml_dtypes`):

    python3 tests/golden/fp8/gen_ml_dtypes_table.py            # writes the table
    python3 tests/golden/fp8/gen_ml_dtypes_table.py --check    # recompute, compare with the file

Lines (hex, no 0x), the same layout as cuda_fp8_table.txt but with one encoding per input:
    decode FMT CODE F32       numpy: codes viewed as the fp8 dtype, .astype(float32)
    encode FMT F32 ASTYPE     numpy: float32 array .astype(fp8 dtype) -- round to nearest even,
                              NOT saturating: past the overflow tie e4m3fn gives NaN, e5m2 inf

The sweep of inputs is the one gen_cuda_fp8_table.cu makes (same construction, see README.md);
test_fp8.c checks that both tables list the same inputs.
"""
import argparse
import os
import sys

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "ml_dtypes_table.txt")
FORMATS = [("e4m3", ml_dtypes.float8_e4m3fn, 0x7E), ("e5m2", ml_dtypes.float8_e5m2, 0x7B)]


def f32(x):
    return np.float32(x)


def bits(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def float_of(u):
    return np.array([u], dtype=np.uint32).view(np.float32)[0]


def decode_all(dtype):
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)


def sweep(dtype, max_code):
    """Every finite fp8 value, the midpoints between neighbours and 1 f32 ulp either side, the
    same around the overflow and underflow ties, some values past max and below the smallest
    subnormal; then all negated; then inf and NaN. Sorted by bits, duplicates removed."""
    v = decode_all(dtype)[: max_code + 1]
    pos = []

    def around(m):
        m = f32(m)
        pos.extend([bits(m), bits(np.nextafter(m, f32(0))), bits(np.nextafter(m, f32(np.inf)))])

    for k in range(len(v)):
        pos.append(bits(v[k]))
        if k + 1 < len(v):
            around((v[k] + v[k + 1]) / f32(2))
    mx, ulp_max = v[-1], v[-1] - v[-2]
    around(mx + ulp_max / f32(2))
    for x in (mx * f32(1.0001), mx + ulp_max, mx * f32(2), f32(1e6), f32(1e30),
              np.finfo(np.float32).max):
        pos.append(bits(x))
    around(v[1] / f32(2))
    for x in (v[1] / f32(4), float_of(1), np.finfo(np.float32).tiny):
        pos.append(bits(x))
    pos = sorted(set(pos))
    return pos + [u | 0x80000000 for u in pos] + [
        0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF]


def table():
    lines = [
        "# OCP FP8 reference from ml_dtypes %s (numpy %s), numpy astype casts "
        "(made by gen_ml_dtypes_table.py)" % (ml_dtypes.__version__, np.__version__),
        "# decode FMT CODE F32_BITS",
        "# encode FMT F32_BITS ASTYPE",
    ]
    for name, dtype, _ in FORMATS:
        for c, x in enumerate(decode_all(dtype)):
            lines.append("decode %s %02x %08x" % (name, c, bits(x)))
    for name, dtype, max_code in FORMATS:
        inputs = np.array(sweep(dtype, max_code), dtype=np.uint32)
        with np.errstate(invalid="ignore", over="ignore"):
            codes = inputs.view(np.float32).astype(dtype).view(np.uint8)
        for u, c in zip(inputs, codes):
            lines.append("encode %s %08x %02x" % (name, int(u), int(c)))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed table")
    args = ap.parse_args()
    text = table()
    if args.check:
        with open(OUT) as f:
            same = f.read() == text
        print("%s: %s" % (OUT, "up to date" if same else "DIFFERS"))
        return 0 if same else 1
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, OUT)
    print("wrote %s (%d lines)" % (OUT, text.count("\n")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
