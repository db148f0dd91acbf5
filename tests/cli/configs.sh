#!/usr/bin/env bash
# Every shipped manifest loads, validates and describes its model (--dry-run); the presets have
# Llama 3's parameter counts.
set -u
CTITAN=${CTITAN:-build/ctitan}
fails=0
for c in configs/*.yaml; do
  if out=$("$CTITAN" train "$c" --dry-run 2>&1); then echo "ok   $c: $(echo "$out" | grep parameters)"
  else echo "FAIL $c:"; echo "$out" | sed 's/^/     /'; fails=$((fails+1)); fi
done
check() { "$CTITAN" train "configs/$1" --dry-run | grep -q "$2B parameters" || { echo "FAIL $1: expected $2B parameters"; fails=$((fails+1)); }; }
check llama3_debug.yaml 0.006
check llama3_8b.yaml 8.030
check llama3_70b.yaml 70.554
check llama3_405b.yaml 405.853
"$CTITAN" train configs/llama3_debug.yaml --print-config --dry-run | grep -q '^  flavor: "debugmodel"' || { echo "FAIL --print-config"; fails=$((fails+1)); }
exit $fails
