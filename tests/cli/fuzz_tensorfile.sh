#!/usr/bin/env bash
# The ctt reader (core/io/tensorfile.c) under AddressSanitizer + UBSan: builds the replay driver of
# tests/fuzz/fuzz_tensorfile.c with cc, runs it on valid, truncated and corrupted seeds (version 1
# built here, version 2 in tests/fuzz/corpus/tensorfile) plus seeded
# random mutations of each, then (when clang has libFuzzer) a short libFuzzer run.
set -euo pipefail
BUILD=${BUILD:-build}
out="$BUILD/fuzz"
mkdir -p "$out"
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
export TMPDIR="$seeds"
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

${CC:-cc} -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -O1 $SAN -DFUZZ_REPLAY_MAIN -Isdk/include -Icore \
    -o "$out/fuzz_tensorfile_replay" tests/fuzz/fuzz_tensorfile.c "$BUILD/libctitan-core.a" \
    -lyaml -lpcre2-8 -ljansson -lz -lzstd -lcairo -lfontconfig -ldl -lm -lpthread -lstdc++

# u32 / u64 little-endian as printf escapes
u32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)); }
u64() { u32 $(($1 & 0xffffffff)); u32 $(($1 >> 32 & 0xffffffff)); }
header() { printf 'CTTENSOR'; printf "$(u32 1)$(u32 "$1")$(u64 0)"; }
# record NAME DTYPE DIMS... (data is numel*4 bytes of 0x3f)
record() {
    local name=$1 dtype=$2; shift 2
    local numel=1 d
    printf "$(u32 ${#name})"; printf '%s' "$name"; printf "$(u32 "$dtype")$(u32 $#)"
    for d in "$@"; do printf "$(u64 "$d")"; numel=$((numel * d)); done
    head -c $((numel * 4)) /dev/zero | tr '\0' '?'
}
small="$seeds/small"; mkdir -p "$small"
{ header 3; record w 1 2 3; record ids 5 4; record s 1; } > "$small/valid.ctt"
{ header 0; } > "$small/empty.ctt"
{ header 2; record a 1 2; record a 1 2; } > "$small/duplicate.ctt"
{ header 1; record x 2 2; } > "$small/bad_dtype.ctt"
{ header 1; record x 1 1 1 1 1 1 1 1; } > "$small/ndim7.ctt"
{ header 1; printf "$(u32 4294967295)xxxxxxxx"; } > "$small/huge_name_len.ctt"
{ header 1; printf "$(u32 1)x$(u32 1)$(u32 2)$(u64 4294967296)$(u64 4294967296)xxxx"; } > "$small/huge_shape.ctt"
{ header 2147483647; record x 1 1; } > "$small/huge_count.ctt"
{ printf 'CTTENSOR'; printf "$(u32 3)$(u32 0)$(u64 0)"; } > "$small/bad_version.ctt"
{ printf 'NOTATENS'; printf "$(u32 1)$(u32 0)$(u64 0)"; } > "$small/bad_magic.ctt"
{ header 1; record x 1 2; printf 'tail'; } > "$small/trailing.ctt"
n=$(stat -c %s "$small/valid.ctt")
for cut in 0 5 23 24 26 28 30 40 $((n - 1)); do
    head -c "$cut" "$small/valid.ctt" > "$small/cut_$cut.ctt"
done

# every small seed must be handled without a sanitizer report; the valid ones must round-trip
FUZZ_MUTATIONS=300 "$out/fuzz_tensorfile_replay" "$small"
# the committed version-2 seeds (checksums; a flipped byte, a missing or wrong checksum, a NaN)
FUZZ_MUTATIONS=300 "$out/fuzz_tensorfile_replay" tests/fuzz/corpus/tensorfile

golden=tests/golden/llama3_tiny.ctt
if [ -f "$golden" ]; then
    big="$seeds/big"; mkdir -p "$big"
    g=$(stat -c %s "$golden")
    cp "$golden" "$big/golden.ctt"
    head -c $((g / 2)) "$golden" > "$big/golden_half.ctt"
    head -c $((g - 1)) "$golden" > "$big/golden_minus1.ctt"
    cp "$golden" "$big/golden_bad_len.ctt"
    printf '\xff\xff\xff\x7f' | dd of="$big/golden_bad_len.ctt" bs=1 seek=24 conv=notrunc status=none
    FUZZ_MUTATIONS=20 "$out/fuzz_tensorfile_replay" "$big"
fi

# a short coverage-guided libFuzzer run from the small seeds, when clang has libFuzzer
# libFuzzer's target is `make fuzz`'s (the core built with its instrumentation, build/fuzz/)
if command -v clang >/dev/null && mkdir -p build/fuzz && flock build/fuzz/.lock make -s build/fuzz/fuzz_tensorfile >"$seeds/make.log" 2>&1; then
    corpus="$seeds/corpus"; mkdir -p "$corpus"
    cp "$small"/* tests/fuzz/corpus/tensorfile/* "$corpus"/
    build/fuzz/fuzz_tensorfile -runs=100000 -max_len=4096 -seed=1 "$corpus" 2>&1 | tail -n 1
else
    echo "fuzz_tensorfile: clang with libFuzzer not found, skipped the libFuzzer run"
fi
echo "fuzz_tensorfile: ok"
