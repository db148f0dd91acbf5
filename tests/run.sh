#!/usr/bin/env bash
# Runs the whole suite: every cmocka binary under $BUILD/tests and every tests/cli/*.sh script.
# With arguments, only the tests whose name contains one of them (`tests/run.sh tp_ test_shard`).
# Prints one line per test as it ends and "N passed, N failed in Ss" at the end.
# CT_TEST_JOBS=N runs N tests at a time (default 1), the longest first (tests/slow.txt lists them in
# that order): the shell tests spend much of their time starting processes and ranks, and each
# training run asks for one thread per rank.
set -u
BUILD=${BUILD:-build}
export BUILD
export CTITAN="$BUILD/ctitan"
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0"
cd "$(dirname "$0")/.."
jobs_max=${CT_TEST_JOBS:-1}
case "$jobs_max" in '' | *[!0-9]* | 0) echo "CT_TEST_JOBS: expected a number of tests at a time, got '$jobs_max'"; exit 2 ;; esac
# with tests side by side the cores are oversubscribed: OpenMP's waiting threads sleep instead of
# spinning on a core another test's thread needs (the thread count, and so every result, is unchanged)
[ "$jobs_max" -gt 1 ] && export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
logdir="$BUILD/test-logs"; mkdir -p "$logdir"
rm -f "$logdir"/*.result
picked() { # name: no arguments, or one of them is part of the name
  [ $# -eq 1 ] && return 0
  local n=$1 a; shift
  for a in "$@"; do [[ "$n" == *"$a"* ]] && return 0; done
  return 1
}
# name<TAB>command..., the slow ones first (in tests/slow.txt's order), then the rest as found
todo=()
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t"); picked "$n" "$@" && todo+=("$n	$t")
done
for s in tests/cli/*.sh; do
  [ -f "$s" ] || continue
  n=$(basename "$s" .sh); picked "$n" "$@" && todo+=("$n	bash $s")
done
ordered=()
if [ "$jobs_max" -gt 1 ] && [ -f tests/slow.txt ]; then
  while read -r slow _; do
    for i in "${!todo[@]}"; do
      [ "${todo[$i]%%	*}" = "$slow" ] && { ordered+=("${todo[$i]}"); unset 'todo[i]'; }
    done
  done < <(grep -v '^#' tests/slow.txt)
fi
ordered+=("${todo[@]}")
# one test: its log in $logdir/NAME.log, its line (and a failure's last lines) printed in one write
run_one() {
  local name=$1 cmd=$2 t0=$SECONDS out
  if $cmd >"$logdir/$name.log" 2>&1; then
    out=$(printf 'PASS %-40s %4ds' "$name" $((SECONDS - t0))); echo pass >"$logdir/$name.result"
  else
    out=$(printf 'FAIL %-40s %4ds\n%s' "$name" $((SECONDS - t0)) "$(tail -n 30 "$logdir/$name.log" | sed 's/^/    | /')")
    echo fail >"$logdir/$name.result"
  fi
  echo "$out"
}
running=0
for item in "${ordered[@]}"; do
  if [ "$jobs_max" -eq 1 ]; then run_one "${item%%	*}" "${item#*	}"; continue; fi
  while [ "$running" -ge "$jobs_max" ]; do wait -n; running=$((running - 1)); done
  run_one "${item%%	*}" "${item#*	}" &
  running=$((running + 1))
done
wait
pass=0; fail=0; failed=()
for item in "${ordered[@]}"; do
  n=${item%%	*}
  if [ "$(cat "$logdir/$n.result" 2>/dev/null)" = pass ]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$n"); fi
done
for a in "$@"; do # a name that picked nothing is a list gone stale (or a binary not built)
  ran=0; for item in "${ordered[@]}"; do [[ "${item%%	*}" == *"$a"* ]] && ran=1; done
  [ $ran -eq 1 ] || { fail=$((fail+1)); failed+=("$a"); printf 'FAIL %-40s no test by that name\n' "$a"; }
done
echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed in ${SECONDS}s"
[ "$fail" -eq 0 ]
