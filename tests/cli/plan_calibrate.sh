#!/usr/bin/env bash
# `ctitan plan --calibrate`: the debug model measured on one rank and under `ctitan launch -n 2`.
# Each profile loads back (a plan reads it), is marked calibrated, has positive rates, a forward and
# a backward time for every op kind of the model's microbatch, and on 2 ranks the three collectives
# over 2 ranks at several sizes with a fitted link; an --output that cannot be written is refused
# (status 2, one line) before anything is measured, and so is a layout of more GPUs than the job
# has ranks. About 10 s on 2 cores.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
counting_fails
M=configs/llama3_debug.yaml
small=(--training.local_batch_size=2 --training.seq_len=128 --device.threads=1 --comm.train_timeout_seconds=60)

# value FILE SECTION KEY: the number under "SECTION:" (a top-level key when SECTION is empty)
value() {
  awk -v s="$2" -v k="$3" '
    /^[a-z_]+:/ { sec = $1; sub(":", "", sec); if (s == "" && sec == k) { print $2; exit } next }
    s != "" && sec == s && $1 == k ":" { print $2; exit }' "$1"
}
positive() { awk -v v="$1" 'BEGIN { exit !(v + 0 > 0) }'; }

# check NAME FILE RANKS: the profile of a calibration on RANKS ranks
check() {
  local name=$1 f=$2 n=$3 bad=0 v
  [ -s "$f" ] || { fail "$name: no profile written"; return; }
  "$CTITAN" plan "$M" "${small[@]}" --hardware "$f" --gpus "$n" >"$T/plan.out" 2>&1 ||
    { fail "$name: the profile does not load back into a plan:"; sed 's/^/    | /' "$T/plan.out" | tail -5; bad=1; }
  grep -qE '^calibrated: true' "$f" || { fail "$name: not marked calibrated"; bad=1; }
  grep -qE "^name: \"calibrated: cpu x $n rank" "$f" || { fail "$name: name is not 'calibrated: cpu x $n ranks'"; bad=1; }
  [ "$(value "$f" "" gpus_per_node)" = "$n" ] || { fail "$name: gpus_per_node is not $n"; bad=1; }
  for sk in compute:fp32_tflops compute:bf16_tflops memory:bandwidth_gb_s memory:size_gib intra_node:bandwidth_gb_s \
            assumptions:matmul_efficiency assumptions:attention_efficiency assumptions:memory_efficiency; do
    v=$(value "$f" "${sk%%:*}" "${sk#*:}")
    positive "$v" || { fail "$name: ${sk/:/.} is '$v', expected a positive number"; bad=1; }
  done
  # every op kind of the debug model's microbatch, each with both times positive
  for k in gemm attention embedding rmsnorm rope swiglu add xent; do
    grep -qE "kind: $k," "$f" || { fail "$name: no measured $k op"; bad=1; }
  done
  local zero; zero=$(grep -E '^ +- \{kind: [a-z]+, shape' "$f" | grep -cE '(forward_s|backward_s): (0|-)[,}]')
  [ "$zero" -eq 0 ] || { fail "$name: $zero ops without a positive time"; bad=1; }
  if [ "$n" -gt 1 ]; then
    for k in all_gather reduce_scatter all_reduce; do
      local c; c=$(grep -cE "kind: $k, ranks: $n, " "$f")
      [ "$c" -ge 3 ] || { fail "$name: $c $k entries over $n ranks, expected several sizes"; bad=1; }
    done
    positive "$(value "$f" intra_node latency_us)" || { fail "$name: no fitted latency"; bad=1; }
  else
    ! grep -qE 'kind: (all_gather|reduce_scatter|all_reduce)' "$f" || { fail "$name: collectives on one rank"; bad=1; }
  fi
  [ $bad -eq 0 ] && echo "ok   $name: $(grep -cE '^ +- \{kind' "$f") measured entries, $(grep -E '^source:' "$f" | cut -c1-160)"
}

t0=$SECONDS
if "$CTITAN" plan "$M" "${small[@]}" --calibrate --output "$T/one.yaml" >"$T/one.log" 2>&1; then
  check "1 rank ($((SECONDS - t0)) s)" "$T/one.yaml" 1
else
  fail "calibrate on 1 rank: status $?"; sed 's/^/    | /' "$T/one.log" | tail -10
fi

t0=$SECONDS
if "$CTITAN" launch -n 2 plan "$M" "${small[@]}" --calibrate --output "$T/two.yaml" >"$T/two.log" 2>&1; then
  check "launch -n 2 ($((SECONDS - t0)) s)" "$T/two.yaml" 2
else
  fail "calibrate under launch -n 2: status $?"; sed 's/^/    | /' "$T/two.log" | tail -10
fi

# an output folder that does not exist: status 2 and one line naming --output, before measuring
"$CTITAN" plan "$M" "${small[@]}" --calibrate --output "$T/none/p.yaml" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q -- "--output $T/none/p.yaml: cannot write into folder" "$T/err" &&
   ! grep -q 'calibrate: wrote' "$T/out"; then
  echo "ok   unwritable --output: $(cat "$T/err")"
else
  fail "unwritable --output: status $rc, wanted 2 and one line:"; sed 's/^/    | /' "$T/err"
fi
# a layout of more GPUs than the job has ranks: status 2, one line saying how to launch it
"$CTITAN" plan "$M" "${small[@]}" --parallelism.tensor_parallel_degree=2 --calibrate --output "$T/tp.yaml" \
  >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "layout on this job's 1 rank: .*ctitan launch -n N" "$T/err" &&
   [ ! -e "$T/tp.yaml" ]; then
  echo "ok   layout larger than the job: $(cat "$T/err")"
else
  fail "layout larger than the job: status $rc, wanted 2 and one line:"; sed 's/^/    | /' "$T/err"
fi
"$CTITAN" launch -n 2 plan "$M" "${small[@]}" --calibrate --output "$T/none/p.yaml" >"$T/out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q -- "cannot write into folder" "$T/out"; then
  echo "ok   unwritable --output under launch -n 2: every rank stops, status 2"
else
  fail "unwritable --output under launch -n 2: status $rc, wanted 2:"; sed 's/^/    | /' "$T/out" | tail -5
fi
exit $fails
