#!/usr/bin/env bash
# Builds the tokenizer, shard, input-decompression, manifest and TOML fuzz targets as plain programs (cc,
# AddressSanitizer + UBSan, no libFuzzer) and replays their seed corpora plus deterministic mutations
# of every seed.
# Run from the repository root; BUILD (default build) says where the programs go.
set -euo pipefail
BUILD=${BUILD:-build}
CC=${CC:-cc}
out="$BUILD/fuzz-replay"
mkdir -p "$out"
flags=(-std=c11 -Wall -Wextra -Werror -g -O1 -D_GNU_SOURCE -Isdk/include -Icore
       -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)

"$CC" "${flags[@]}" -o "$out/fuzz_tokenizer_file" tests/fuzz/fuzz_tokenizer_file.c tests/fuzz/replay_main.c \
    core/tools/tokenizer.c core/tools/hf_tokenizer.c core/host/util.c -lpcre2-8 -ljansson -lpthread
"$CC" "${flags[@]}" -o "$out/fuzz_shard" tests/fuzz/fuzz_shard.c tests/fuzz/replay_main.c core/data/shard.c core/host/util.c -lz

"$out/fuzz_tokenizer_file" -m 300 tests/fuzz/corpus/tokenizer_file
"$out/fuzz_tokenizer_file" -m 100 tests/data/tokenizer/vocab.tiktoken
"$out/fuzz_tokenizer_file" -m 20 tests/data/tokenizer/hf/gpt2/tokenizer.json
"$out/fuzz_shard" -m 300 tests/fuzz/corpus/shard
# ctitan tokenize's decompression front end: plain, gzip and zstd seeds, truncated and corrupt ones
"$CC" "${flags[@]}" -o "$out/fuzz_instream" tests/fuzz/fuzz_instream.c tests/fuzz/replay_main.c core/tools/instream.c \
    core/host/util.c -lz -lzstd
"$out/fuzz_instream" -m 100 tests/fuzz/corpus/instream

# the TOML shim (toml++, C++17) under the same sanitizers, alone and behind the manifest
CXX=${CXX:-g++}
"$CXX" -std=c++17 -Wall -Wextra -Werror -g -O1 -Icore -fsanitize=address,undefined -fno-omit-frame-pointer \
    -fno-sanitize-recover=undefined -c -o "$out/toml_shim.o" core/config/toml_shim.cpp
"$CC" "${flags[@]}" -o "$out/fuzz_toml" tests/fuzz/fuzz_toml.c tests/fuzz/replay_main.c "$out/toml_shim.o" -lstdc++
"$out/fuzz_toml" -m 300 tests/fuzz/corpus/toml
"$CC" "${flags[@]}" -o "$out/fuzz_manifest" tests/fuzz/fuzz_manifest.c tests/fuzz/replay_main.c core/config/manifest.c \
    core/config/torchtitan_keys.c core/host/util.c "$out/toml_shim.o" -lyaml -lstdc++
"$out/fuzz_manifest" -m 200 tests/fuzz/corpus/manifest

core_srcs=$(ls core/*/*.c)
"$CC" "${flags[@]}" -o "$out/fuzz_checkpoint" tests/fuzz/fuzz_checkpoint.c tests/fuzz/replay_main.c $core_srcs \
    "$out/toml_shim.o" -lyaml -lpcre2-8 -ljansson -lz -lzstd -lcairo -lfontconfig -ldl -lm -lpthread -lstdc++
"$out/fuzz_checkpoint" -m 200 tests/fuzz/corpus/checkpoint
