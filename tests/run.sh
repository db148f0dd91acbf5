#!/usr/bin/env bash
# Runs the whole suite: every cmocka binary under $BUILD/tests and every tests/cli/*.sh script.
# With arguments, only the tests whose name contains one of them (`tests/run.sh tp_ test_shard`).
# Prints one line per test and ends with "N passed, N failed".
set -u
BUILD=${BUILD:-build}
export BUILD
export CTITAN="$BUILD/ctitan"
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0"
cd "$(dirname "$0")/.."
pass=0; fail=0; failed=(); names=()
logdir="$BUILD/test-logs"; mkdir -p "$logdir"
run_one() {
  local name=$1; shift
  local t0=$SECONDS
  names+=("$name")
  if "$@" >"$logdir/$name.log" 2>&1; then
    pass=$((pass+1)); printf 'PASS %-40s %4ds\n' "$name" $((SECONDS-t0))
  else
    fail=$((fail+1)); failed+=("$name"); printf 'FAIL %-40s %4ds\n' "$name" $((SECONDS-t0))
    tail -n 30 "$logdir/$name.log" | sed 's/^/    | /'
  fi
}
picked() { # name: no arguments, or one of them is part of the name
  [ $# -eq 1 ] && return 0
  local n=$1 a; shift
  for a in "$@"; do [[ "$n" == *"$a"* ]] && return 0; done
  return 1
}
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t"); picked "$n" "$@" || continue
  run_one "$n" "$t"
done
for s in tests/cli/*.sh; do
  [ -f "$s" ] || continue
  n=$(basename "$s" .sh); picked "$n" "$@" || continue
  run_one "$n" bash "$s"
done
for a in "$@"; do # a name that picked nothing is a list gone stale (or a binary not built)
  ran=0; for n in "${names[@]}"; do [[ "$n" == *"$a"* ]] && ran=1; done
  [ $ran -eq 1 ] || { fail=$((fail+1)); failed+=("$a"); printf 'FAIL %-40s no test by that name\n' "$a"; }
done
echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed in ${SECONDS}s"
[ "$fail" -eq 0 ]
