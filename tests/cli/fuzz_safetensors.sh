#!/usr/bin/env bash
# The safetensors reader (core/io/safetensors.c) and the config.json / index parsers (core/io/hf_export.c,
# core/io/safetensors.c) under AddressSanitizer + UBSan: builds tests/fuzz/fuzz_safetensors.c as a replay
# program (cc, tests/fuzz/replay_main.c, no libFuzzer), replays the committed seeds
# (tests/fuzz/corpus/safetensors: valid files written by Python's safetensors, hand-made broken ones,
# config.json and index seeds) and the golden Hugging Face folders, each with seeded mutations; then,
# when clang has libFuzzer, a short coverage-guided run from the seeds.
# Longer runs: make the libFuzzer binary as below and run it with -max_total_time=600 NEW_DIR SEEDS.
set -euo pipefail
BUILD=${BUILD:-build}
CC=${CC:-cc}
out="$BUILD/fuzz-replay"
mkdir -p "$out" "$BUILD/fuzz"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work"   # the round-trip files
flags=(-std=c11 -Wall -Wextra -Werror -g -O1 -D_GNU_SOURCE -Isdk/include -Icore
       -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
# the target and the replay driver against the core library (sanitized in the sanitizer build)
"$CC" "${flags[@]}" -o "$out/fuzz_safetensors" tests/fuzz/replay_main.c tests/fuzz/fuzz_safetensors.c \
    "$BUILD/libctitan-core.a" -lyaml -lpcre2-8 -ljansson -lz -lzstd -lcairo -lfontconfig -ldl -lm -lpthread -lstdc++
"$out/fuzz_safetensors" -m 300 tests/fuzz/corpus/safetensors
golden=tests/golden/hf
if [ -d "$golden" ]; then
    "$out/fuzz_safetensors" -m 3 -s 7 "$golden/from_transformers_bf16" "$golden/from_ctitan/config.json" \
        "$golden/from_transformers/config.json"
fi

# libFuzzer's target is `make fuzz`'s (the core built with its instrumentation, build/fuzz/)
if command -v clang >/dev/null && mkdir -p build/fuzz && flock build/fuzz/.lock make -s build/fuzz/fuzz_safetensors >"$work/make.log" 2>&1; then
    mkdir -p "$work/corpus"
    cp tests/fuzz/corpus/safetensors/* "$work/corpus"/
    build/fuzz/fuzz_safetensors -runs=20000 -max_len=8192 -seed=1 "$work/corpus" 2>&1 | tail -n 1
else
    echo "fuzz_safetensors: clang with libFuzzer not found, skipped the libFuzzer run"
fi
echo "fuzz_safetensors: ok"
