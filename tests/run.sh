#!/usr/bin/env bash
# Runs the whole suite: every cmocka binary under $BUILD/tests and every tests/cli/*.sh script.
# Prints one line per test and ends with "N passed, N failed".
set -u
BUILD=${BUILD:-build}
export BUILD
export CTITAN="$BUILD/ctitan"
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0"
cd "$(dirname "$0")/.."
pass=0; fail=0; failed=()
logdir="$BUILD/test-logs"; mkdir -p "$logdir"
run_one() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$logdir/$name.log" 2>&1; then
    pass=$((pass+1)); printf 'PASS %-40s %4ds\n' "$name" $((SECONDS-t0))
  else
    fail=$((fail+1)); failed+=("$name"); printf 'FAIL %-40s %4ds\n' "$name" $((SECONDS-t0))
    tail -n 30 "$logdir/$name.log" | sed 's/^/    | /'
  fi
}
only=${1:-}
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t"); [ -n "$only" ] && [[ "$n" != *"$only"* ]] && continue
  run_one "$n" "$t"
done
for s in tests/cli/*.sh; do
  [ -f "$s" ] || continue
  n=$(basename "$s" .sh); [ -n "$only" ] && [[ "$n" != *"$only"* ]] && continue
  run_one "$n" bash "$s"
done
echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
