#!/usr/bin/env bash
# Prepares the demo data set (not committed): a 2048-token BPE vocabulary trained on the quotations
# of Debian's fortunes package, and those quotations as a token shard. Skips what already exists.
set -euo pipefail
BUILD=${BUILD:-build}
CTITAN="$BUILD/ctitan"
DATA=${CTITAN_DEMO_DATA:-data/demo}
mkdir -p "$DATA"
[ -s "$DATA/tokenizer.model" ] && [ -s "$DATA/fortunes.bin" ] && exit 0
mapfile -t files < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
if [ ${#files[@]} -eq 0 ]; then echo "demo: no fortune files under /usr/share/games/fortunes (make deps installs them)" >&2; exit 1; fi
inputs=(); for f in "${files[@]}"; do inputs+=(--input "$f"); done
"$CTITAN" tokenizer train "${inputs[@]}" --split-on % --vocab-size 2048 --output "$DATA/tokenizer.model"
"$CTITAN" tokenize --tokenizer "$DATA/tokenizer.model" "${inputs[@]}" --split-on % --output "$DATA/fortunes.bin"
