#!/usr/bin/env bash
# The ABI version is written once, in sdk/include/ctitan/abi.h: the README states it in one place
# and names no other ABI version, the pkg-config file carries it, and `ctitan --version` prints it.
set -u
CTITAN=${CTITAN:-build/ctitan}; BUILD=${BUILD:-build}
. tests/cli/lib/common.sh
counting_fails
MAJ=$(sed -n 's/^#define CT_ABI_MAJOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h)
MIN=$(sed -n 's/^#define CT_ABI_MINOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h)
[ -n "$MAJ" ] && [ -n "$MIN" ] || { echo "FAIL cannot read CT_ABI_MAJOR / CT_ABI_MINOR from abi.h"; exit 1; }
V=$MAJ.$MIN
stated=$(grep -noE 'ABI [0-9]+\.[0-9]+' README.md)
if [ "$(printf '%s\n' "$stated" | grep -c .)" -ne 1 ]; then fail "README.md should state the ABI version once, it has: $(echo $stated)"
elif [ "${stated#*:ABI }" != "$V" ]; then fail "README.md line ${stated%%:*} says ABI ${stated#*:ABI }, abi.h says $V"
else echo "ok   README.md line ${stated%%:*} states ABI $V, as abi.h does"; fi
pc=$(PKG_CONFIG_PATH="$BUILD" pkg-config --modversion ctitan-sdk 2>&1)
[ "$pc" = "$V.0" ] && echo "ok   pkg-config --modversion ctitan-sdk: $pc" || fail "pkg-config says '$pc', abi.h $V"
grep -q '^Version: @VERSION@$' sdk/ctitan-sdk.pc.in && echo "ok   ctitan-sdk.pc.in writes no version of its own" \
  || fail "sdk/ctitan-sdk.pc.in should say 'Version: @VERSION@' (the Makefile fills it from abi.h)"
out=$("$CTITAN" --version 2>&1)
[ "$out" = "ctitan: plugin ABI $V" ] && echo "ok   ctitan --version: $out" || fail "ctitan --version: '$out', abi.h $V"
[ $fails -eq 0 ] && echo "readme_abi_version: ok" || { echo "readme_abi_version: $fails failed"; exit 1; }
