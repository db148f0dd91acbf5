#!/usr/bin/env bash
# The MPI comm plugin against the comm.h contract: tests/mpi/comm_conformance run as an MPI
# singleton (no mpirun) and under mpirun with 1, 2 and 4 ranks (oversubscribed on small machines),
# each run ending with the timeout checks; then one run where a rank calls abort, which must end
# every rank with the code it gave. About 15 s on 2 cores.
set -u
BUILD=${BUILD:-build}
plugin=$BUILD/plugins/ctitan-mpi.so
prog=$BUILD/tests/mpi/comm_conformance
if ! command -v mpirun >/dev/null; then
  echo "skip: mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)"; exit 0
fi
for f in "$plugin" "$prog"; do
  [ -e "$f" ] || { echo "FAIL $f not built (make all $prog)"; exit 1; }
done

# Sanitizer builds: OpenMPI's own allocations live until exit; suppress leaks with an MPI library
# (or one of its dlopened components, mca_*) on the stack. The slow unwinder sees through MPI's
# frames, so a leak of ours is still reported.
supp=$(mktemp); trap 'rm -f "$supp" "$out"' EXIT
out=$(mktemp)
{ [ -n "${LSAN_OPTIONS:-}" ] && sed -n 's/.*suppressions=\([^:]*\).*/\1/p' <<<"$LSAN_OPTIONS" | xargs -r cat
  printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so libhwloc.so libpmix.so libevent mca_
} >"$supp" 2>/dev/null
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"

mpirun_n() { timeout 90 mpirun --allow-run-as-root --oversubscribe -x LSAN_OPTIONS -x ASAN_OPTIONS -n "$@"; }
. tests/cli/lib/common.sh
counting_fails

# run LABEL NRANKS COMMAND...: exit 0, no FAIL line, every check printed, the timeout checks done
run() {
  local label=$1 n=$2; shift 2
  local t0=$SECONDS
  "$@" >"$out" 2>&1; local rc=$?
  local oks; oks=$(grep -c '^ok ' "$out")
  if [ $rc -ne 0 ] || grep -q FAIL "$out" || ! grep -q '^0 checks failed' "$out" || [ "$oks" -lt 35 ] ||
     ! grep -q '^ok wait on a recv nobody sent times out' "$out" ||
     { [ "$n" -gt 1 ] && ! grep -q '^ok all_reduce with a missing rank times out' "$out"; }; then
    fail "$label: exit $rc, $oks checks ok"; sed 's/^/    | /' "$out" | tail -n 40
  else
    echo "ok   $label: $oks checks, $((SECONDS-t0)) s"
    grep '^info:' "$out" | sed 's/^/    /'
  fi
}

opts="train_timeout_seconds=2"
run "singleton (no mpirun)" 1 timeout 60 "$prog" "$plugin" $opts
for n in 1 2 4; do
  run "mpirun -n $n" "$n" mpirun_n "$n" "$prog" "$plugin" $opts
done

# abort: the last of 3 ranks calls abort(3) while the others wait in a barrier it never joins;
# mpirun must end them all with status 3 well before their 20 s timeout
t0=$SECONDS
mpirun_n 3 "$prog" "$plugin" train_timeout_seconds=20 --abort 3 >"$out" 2>&1; rc=$?
took=$((SECONDS-t0))
if [ $rc -ne 3 ] || grep -q FAIL "$out" || [ $took -gt 15 ]; then
  fail "abort: exit $rc after $took s, expected 3 within 15 s"; sed 's/^/    | /' "$out" | tail -n 20
else
  echo "ok   abort(3) on one rank ends all 3 with status 3 ($took s)"
fi
exit $fails
