# curves.sh: sourced by the tests that hold a run to a reference run of the same function (a layout
# against one rank, a checkpoint continued under another layout against the run that saved it).
#   same_curve NAME REF RUN N [FROM]
#       RUN's metrics.jsonl (a file) has exactly N step records, and each one's loss and grad_norm lie
#       within CURVE_TOL (relative, default 1e-6) of REF's records FROM..FROM+N-1 (FROM defaults
#       to 1). Prints "ok   NAME: max rel gap G over N steps (loss L, grad_norm R)" or a FAIL line
#       naming the first step outside, and returns non-zero on failure.
# Why 1e-6: the layouts reorder float sums, which moves a loss by a few ulps of f32 (about 6e-8
# relative over 20 steps); a wrong collective in the backward moves it by far more, but at first
# by less than the 1e-4 these tests used to allow.
CURVE_TOL=${CURVE_TOL:-1e-6}
# Under bf16 compute the saved activations are held in bf16 (core/engine/actpack.c): a reordering
# that moves an f32 value by an ulp can move its bf16 rounding by one bf16 ulp (2^-8 relative) on
# the odd element, so two runs of the same function drift apart faster than in f32. The floor,
# measured by tests/cli/pp_equivalence.sh: one rank with its batch of 8 in 8 microbatches against
# the same batch in one (f32: within 7.3e-8 over 20 steps) drifts 1.2e-4 over 20 steps under bf16
# compute (PP 2, which runs those 8 microbatches, follows the 8-microbatch run bit for bit); CP 2 on
# the ring with full AC drifts 3.0e-6 from one rank. The bf16 bound, a few times that floor (a wrong gradient grows past it within a few steps: a TP weight
# left partial moved the curve by 1.9e-2 in 20 steps, issue 29):
CURVE_TOL_BF16=${CURVE_TOL_BF16:-5e-4}
curve_records() { grep '"loss"' "$1" | sed 's/.*"loss": \([-0-9.e+naif]*\), "grad_norm": \([-0-9.e+naif]*\).*/\1 \2/'; }
same_curve() {
  local name=$1 ref=$2 run=$3 n=$4 from=${5:-1}
  local got; got=$(grep -c '"loss"' "$run" 2>/dev/null || true)
  [ "$got" = "$n" ] || { echo "FAIL $name: $run has ${got:-no} step records, expected $n"; return 1; }
  paste -d' ' <(curve_records "$ref" | tail -n +"$from" | head -n "$n") <(curve_records "$run") |
    awk -v name="$name" -v n="$n" -v tol="$CURVE_TOL" '
      function gap(a, b) { # relative to the reference a; nan or inf anywhere is a failure
        if ((a b) ~ /[nN]/) return 1e30
        d = a - b; if (d < 0) d = -d; if (a < 0) a = -a
        return a > 0 ? d / a : (d > 0 ? 1e30 : 0) }
      NF != 4 { printf "FAIL %s: step %d has no reference record\n", name, NR; bad = 1; next }
      { gl = gap($1, $3); gg = gap($2, $4); if (gl > wl) wl = gl; if (gg > wg) wg = gg
        if (!bad && (gl > tol || gg > tol)) {
          printf "FAIL %s: step %d loss %s vs %s (rel gap %.1e), grad_norm %s vs %s (rel gap %.1e); bound %g\n",
                 name, NR, $3, $1, gl, $4, $2, gg, tol; bad = 1 } }
      END { w = wl > wg ? wl : wg
        printf "%s %s: max rel gap %.1e over %d steps (loss %.1e, grad_norm %.1e)\n", bad ? "FAIL" : "ok  ", name, w, NR, wl, wg
        exit bad }'
}
#   final_within NAME REF RUN N BOUND
#       another numerics against its reference (float8, bf16 compute, bf16 moments): RUN's metrics.jsonl
#       has N step records, no NaN, and its final loss is within BOUND (relative) of REF's. Prints the
#       final losses and the largest gap over the curve.
final_within() {
  local name=$1 ref=$2 run=$3 n=$4 bound=$5
  loss_col() { grep '"loss"' "$1" | sed 's/.*"loss": \([-0-9.e+naif]*\).*/\1/'; }
  paste -d' ' <(loss_col "$ref") <(loss_col "$run") | awk -v name="$name" -v n="$n" -v bound="$bound" '
    { if ($2 != $2 + 0 || $2 == "nan") nan = 1; gap = ($2 - $1) / $1; if (gap < 0) gap = -gap; if (gap > maxgap) maxgap = gap
      last_ref = $1; last = $2 }
    END { final = (last - last_ref) / last_ref; if (final < 0) final = -final
      ok = !nan && NR == n && final <= bound
      printf "%s %s: %d steps, final loss %.4f vs %.4f (%.3f%%), max gap over the curve %.3f%%\n",
             ok ? "ok  " : "FAIL", name, NR, last, last_ref, 100 * final, 100 * maxgap; exit !ok }'
}
