#!/usr/bin/env bash
# The core's folders depend only downward (core/README.md, "Layers"): every `#include "F/..."` in
# core/ names a folder F below the including file's own, in this order from the bottom:
#   base < config < host < io, data < tokenizer, schedule < engine < checkpoint, plan < train < cmd < main.c
# Folders on one floor (io and data, tokenizer and schedule, checkpoint and plan) do not include each other, so no
# two folders include each other. A new folder must be placed here; an include that goes up or
# sideways fails, naming the file and line. An include allowed to go up would be listed below with
# the work that removes it; the list is empty and may only stay so.
set -u
. tests/cli/lib/common.sh
floor() {
  case "$1" in
    base) echo 0 ;; config) echo 1 ;; host) echo 2 ;; io | data) echo 3 ;; tokenizer | schedule) echo 4 ;; engine) echo 5 ;;
    checkpoint | plan) echo 6 ;; train) echo 7 ;; cmd) echo 8 ;; .) echo 9 ;; *) echo "" ;;
  esac
}
# file:include pairs allowed to go up, each until the named change lands
known=(
)
for d in core/*/; do
  d=${d%/}; d=${d#core/}
  [ -n "$(floor "$d")" ] || fail "core/$d is on no floor: place it in tests/cli/core_layers.sh and core/README.md"
done
bad=0 seen_known=0 n=0
while IFS=: read -r file line text; do
  inc=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$text")
  case "$inc" in ctitan/* | */*) ;; *) continue ;; esac
  case "$inc" in ctitan/*) continue ;; esac
  to=${inc%%/*}
  from=${file#core/}; from=${from%%/*}; [ "$from" = "${file#core/}" ] && from=.
  [ "$to" = "$from" ] && continue
  n=$((n + 1))
  f=$(floor "$from") t=$(floor "$to")
  [ -n "$t" ] || { echo "FAIL $file:$line: includes $inc, a folder on no floor"; bad=1; continue; }
  if [ "$t" -ge "$f" ]; then
    allowed=0
    for k in "${known[@]}"; do [ "$k" = "$file $inc" ] && allowed=1; done
    if [ $allowed -eq 1 ]; then seen_known=$((seen_known + 1)); continue; fi
    what=$([ "$t" -gt "$f" ] && echo "up" || echo "sideways")
    echo "FAIL $file:$line: includes $inc, $what from $from/ (floor $f) to $to/ (floor $t)"
    bad=1
  fi
done < <(grep -rn --include='*.c' --include='*.h' --include='*.cpp' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' core)
[ $bad -eq 0 ] || exit 1
[ "$seen_known" -eq "${#known[@]}" ] ||
  fail "a known upward include is gone ($seen_known of ${#known[@]} seen): take it off the list in tests/cli/core_layers.sh"
echo "ok   $n includes between core folders, all downward but the ${#known[@]} listed to go (issue 28)"
