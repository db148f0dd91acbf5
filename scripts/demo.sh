#!/usr/bin/env bash
# `make demo`: prepares the demo data (fortunes quotations), trains llama3 debugmodel on the CPU with
# configs/llama3_debug.yaml, and ends with a sample of generated text.
set -euo pipefail
BUILD=${BUILD:-build}
BUILD=$BUILD scripts/prepare_demo_data.sh
exec "$BUILD/ctitan" train configs/llama3_debug.yaml "$@"
