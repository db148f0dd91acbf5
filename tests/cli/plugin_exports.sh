#!/usr/bin/env bash
# Every built plugin exports exactly one symbol, its entry function (ABI rule 1), and `ctitan
# plugins` lists each of them with its kind, name and ABI version.
set -u
BUILD=${BUILD:-build}; CTITAN=${CTITAN:-$BUILD/ctitan}
fails=0; n=0
MAJOR=$(sed -n 's/^#define CT_ABI_MAJOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h)
for so in "$BUILD"/plugins/ctitan-*.so; do
  n=$((n+1))
  syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sort -u | tr '\n' ' ')
  if [ "$syms" = "ctitan_plugin_entry " ]; then echo "ok   $so exports only ctitan_plugin_entry"
  else echo "FAIL $so exports: $syms"; fails=$((fails+1)); fi
  name=$(basename "$so" .so); name=${name#ctitan-}
  if ! "$CTITAN" plugins | grep -qE "^(device|model|optimizer|comm|strategy|quantizer|schedule|pipeline) +[^ ]+ +$MAJOR\.[0-9]+ +.*/ctitan-$name\.so$"; then
    echo "FAIL ctitan plugins does not list $name"; fails=$((fails+1)); fi
done
[ $n -ge 3 ] || { echo "FAIL only $n plugins built"; fails=$((fails+1)); }
exit $fails
