#!/usr/bin/env bash
# Runs the whole suite: every cmocka test (tests/unit/test_*.c, its binary under $BUILD/tests) and
# every tests/cli/*.sh script. With arguments, only the tests whose name contains one of them
# (`tests/run.sh tp_ test_shard`). `--tier TIER[,TIER...]` runs the tests of those tiers
# (tests/tiers.txt: unit, contract, model, e2e, docs, fuzz, gpu; names given too narrow them).
# Prints one line per test as it ends and "N passed, N failed in Ss" at the end.
# Every test has its tier in tests/tiers.txt: the whole suite and --tier fail a test without one and
# a line whose test is gone (or, in a tier asked for, not built).
# CT_TEST_JOBS=N runs N tests at a time (default 1), the longest first (tests/slow.txt lists them in
# that order): the shell tests spend much of their time starting processes and ranks, and each
# training run asks for one thread per rank.
set -u
BUILD=${BUILD:-build}
export BUILD
export CTITAN="$BUILD/ctitan"
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0"
cd "$(dirname "$0")/.."
# --tier LIST (or --tier=LIST, repeatable): the tiers to run; the other arguments are names
tiers=""; names=()
while [ $# -gt 0 ]; do
  case $1 in
    --tier) [ $# -ge 2 ] || { echo "tests/run.sh: --tier needs a tier (tests/tiers.txt)"; exit 2; }
            tiers="$tiers,$2"; shift 2 ;;
    --tier=*) tiers="$tiers,${1#--tier=}"; shift ;;
    *) names+=("$1"); shift ;;
  esac
done
set -- "${names[@]}"
declare -A tier_of
while read -r n t _; do
  case $n in '' | '#'*) continue ;; esac
  tier_of[$n]=$t
done <tests/tiers.txt
known=" $(printf '%s\n' "${tier_of[@]}" | sort -u | tr '\n' ' ')"
wanted=" ${tiers//,/ } "
for t in $wanted; do
  case $known in *" $t "*) ;; *) echo "tests/run.sh: no tier '$t' in tests/tiers.txt (tiers:${known% })"; exit 2 ;; esac
done
# the tier check applies to the whole suite and to --tier runs, not to a run of names alone
check_tiers=1; [ -z "$tiers" ] && [ $# -gt 0 ] && check_tiers=0
jobs_max=${CT_TEST_JOBS:-1}
case "$jobs_max" in '' | *[!0-9]* | 0) echo "CT_TEST_JOBS: expected a number of tests at a time, got '$jobs_max'"; exit 2 ;; esac
# with tests side by side the cores are oversubscribed: OpenMP's waiting threads sleep instead of
# spinning on a core another test's thread needs (the thread count, and so every result, is unchanged)
[ "$jobs_max" -gt 1 ] && export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
logdir="$BUILD/test-logs"; mkdir -p "$logdir"
rm -f "$logdir"/*.result
picked() { # name: in a tier asked for (when tiers are), and no names or one of them is part of it
  local n=$1 a; shift
  if [ -n "$tiers" ]; then case $wanted in *" ${tier_of[$n]:-none} "*) ;; *) return 1 ;; esac; fi
  [ $# -eq 0 ] && return 0
  for a in "$@"; do [[ "$n" == *"$a"* ]] && return 0; done
  return 1
}
# name<TAB>command..., the slow ones first (in tests/slow.txt's order), then the rest as found
todo=(); found=" "; missing=()
for c in tests/unit/test_*.c; do
  n=$(basename "$c" .c); t=$BUILD/tests/$n; found="$found$n "
  [ -x "$t" ] || { [ -n "$tiers" ] && picked "$n" "$@" && missing+=("$n	not built ($t)"); continue; }
  picked "$n" "$@" && todo+=("$n	$t")
done
for s in tests/cli/*.sh; do
  [ -f "$s" ] || continue
  n=$(basename "$s" .sh); found="$found$n "
  picked "$n" "$@" && todo+=("$n	bash $s")
done
if [ $check_tiers -eq 1 ]; then # tests/tiers.txt against the tests there are
  for n in $found; do [ -n "${tier_of[$n]:-}" ] || missing+=("$n	has no tier in tests/tiers.txt"); done
  for n in "${!tier_of[@]}"; do
    [ -f "tests/unit/$n.c" ] || [ -f "tests/cli/$n.sh" ] || missing+=("$n	in tests/tiers.txt: no such test")
  done
fi
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
for m in "${missing[@]}"; do
  fail=$((fail+1)); failed+=("${m%%	*}"); printf 'FAIL %-40s %s\n' "${m%%	*}" "${m#*	}"
done
echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed in ${SECONDS}s"
[ "$fail" -eq 0 ]
