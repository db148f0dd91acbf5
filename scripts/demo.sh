#!/usr/bin/env bash
# `make demo`: prepares the demo data set from the fortunes package's quotations (real English text),
# then trains llama3 debugmodel on the CPU with configs/llama3_debug.yaml and prints a sample.
set -euo pipefail
BUILD=${BUILD:-build}
CTITAN="$BUILD/ctitan"
DATA=${CTITAN_DEMO_DATA:-data/demo}
mkdir -p "$DATA"
mapfile -t files < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
if [ ${#files[@]} -eq 0 ]; then echo "demo: no fortune files under /usr/share/games/fortunes (run make deps)" >&2; exit 1; fi
inputs=(); for f in "${files[@]}"; do inputs+=(--input "$f"); done
if [ ! -s "$DATA/tokenizer.model" ]; then
  echo "demo: training a 2048-token BPE vocabulary on ${#files[@]} fortune files"
  "$CTITAN" tokenizer train "${inputs[@]}" --split-on % --vocab-size 2048 --output "$DATA/tokenizer.model"
fi
if [ ! -s "$DATA/fortunes.bin" ]; then
  "$CTITAN" tokenize --tokenizer "$DATA/tokenizer.model" "${inputs[@]}" --split-on % --output "$DATA/fortunes.bin"
fi
exec "$CTITAN" train configs/llama3_debug.yaml "$@"
