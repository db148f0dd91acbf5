#!/usr/bin/env bash
# Builds the tokenizer, shard, chat-template, input-decompression, manifest, TOML, hardware-profile and
# checkpoint fuzz targets as plain programs (cc, no libFuzzer; the target and its driver under AddressSanitizer + UBSan, linked with
# the core library $BUILD/libctitan-core.a, itself sanitized in the sanitizer build) and replays
# their seed corpora plus deterministic mutations of every seed.
# Run from the repository root; BUILD (default build) says where the programs go.
set -euo pipefail
BUILD=${BUILD:-build}
CC=${CC:-cc}
out="$BUILD/fuzz-replay"
mkdir -p "$out"
flags=(-std=c11 -Wall -Wextra -Werror -g -O1 -D_GNU_SOURCE -Isdk/include -Icore
       -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)

# each target with the replay driver against the core library (sanitized in the sanitizer build)
core=("$BUILD/libctitan-core.a" -lyaml -lpcre2-8 -ljansson -lz -lzstd -lcairo -lfontconfig -ldl -lm -lpthread -lstdc++)
build() { "$CC" "${flags[@]}" -o "$out/$1" "tests/fuzz/$1.c" tests/fuzz/replay_main.c "${core[@]}"; }
build fuzz_tokenizer_file
build fuzz_shard

"$out/fuzz_tokenizer_file" -m 300 tests/fuzz/corpus/tokenizer_file
"$out/fuzz_tokenizer_file" -m 100 tests/data/tokenizer/vocab.tiktoken
"$out/fuzz_tokenizer_file" -m 20 tests/data/tokenizer/hf/gpt2/tokenizer.json
"$out/fuzz_tokenizer_file" -m 20 tests/data/tokenizer/hf/torchtitan/tokenizer.json
"$out/fuzz_shard" -m 300 tests/fuzz/corpus/shard
# chat templates (ctitan tokenize --format chat): the Llama 3 and Qwen ones, the built-ins, refusals
build fuzz_jinja
"$out/fuzz_jinja" -m 300 tests/fuzz/corpus/jinja
# ctitan tokenize's decompression front end: plain, gzip and zstd seeds, truncated and corrupt ones
build fuzz_instream
"$out/fuzz_instream" -m 100 tests/fuzz/corpus/instream

# the TOML shim (toml++, C++17), alone and behind the manifest
build fuzz_toml
"$out/fuzz_toml" -m 300 tests/fuzz/corpus/toml
build fuzz_manifest
"$out/fuzz_manifest" -m 200 tests/fuzz/corpus/manifest
# hardware profiles through the same reader: the shipped ones, a calibrated one, every optional key
build fuzz_hw_profile
"$out/fuzz_hw_profile" -m 200 tests/fuzz/corpus/hw_profile configs/hardware/h100-sxm.yaml configs/hardware/a100-80gb.yaml

build fuzz_checkpoint
"$out/fuzz_checkpoint" -m 200 tests/fuzz/corpus/checkpoint
