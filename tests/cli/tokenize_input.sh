#!/usr/bin/env bash
# ctitan tokenize's input: JSONL with a named field, gzip (several members) and zstd (several frames)
# by path and from standard input give the same shard as the plain file, byte for byte; the progress
# and summary lines; truncated, corrupt and mislabeled input is one line naming the file, exit 2, no
# shard; a shard with a flipped byte fails its checksum in `tokenize --check` and in a training run;
# a version-1 shard (no checksum) is still read and trained on.
set -u
CTITAN=${CTITAN:-build/ctitan}; BUILD=${BUILD:-build}
. tests/cli/lib/common.sh
test_tmp
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
VOCAB=tests/data/tokenizer/vocab.tiktoken
tok() { "$CTITAN" tokenize --tokenizer "$VOCAB" --format jsonl --field content "$@"; }

# A JSONL corpus of about 250 kB (so reads cross the 64 kB and 128 kB buffers), its text under
# "content": every line of the test corpus as a document, twice, control bytes dropped, escaped.
sed -e '/^%$/d' tests/data/tokenizer/corpus.txt | tr -d '\000-\010\013-\037\177' | grep -v '^$' |
  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' >"$T/lines"
{ awk '{ printf "{\"id\": %d, \"content\": \"%s\", \"lang\": \"en\"}\n", NR, $0 }' "$T/lines"
  awk '{ printf "{\"content\": \"%s \\u00e9\\u4e2d\", \"id\": %d}\n", $0, NR + 100000 }' "$T/lines"; } >"$T/c.jsonl"
docs=$(wc -l <"$T/c.jsonl"); size=$(stat -c %s "$T/c.jsonl")
[ "$size" -gt 200000 ] || bad "corpus is only $size bytes"

tok --input "$T/c.jsonl" --output "$T/base.bin" >"$T/out" 2>"$T/err" || { bad "plain JSONL: $(cat "$T/err")"; exit 1; }
grep -qE "^tokenize: $docs documents, [0-9]+ tokens from 0\.[0-9]+ MB of text \(0\.[0-9]+ MB read\) in [0-9.]+ s \([0-9.]+ MB/s of text\) -> $T/base.bin$" "$T/out" &&
  [ ! -s "$T/err" ] && ok "plain JSONL, --field content: $(cat "$T/out")" || { bad "summary line:"; cat "$T/out" "$T/err"; }

# gzip: one member, and the file cut at an odd byte into two members (cat a.gz b.gz)
gzip -c "$T/c.jsonl" >"$T/c.jsonl.gz"
head -c 100003 "$T/c.jsonl" | gzip -c >"$T/multi.gz"; tail -c +100004 "$T/c.jsonl" | gzip -1 -c >>"$T/multi.gz"
# zstd: frames of 70001 input bytes made here (libzstd), and the zstd CLI's file when it is installed
cc -O1 -o "$T/zstd_frames" tests/cli/lib/zstd_frames.c -lzstd || { bad "cannot build tests/cli/lib/zstd_frames.c"; exit 1; }
"$T/zstd_frames" 70001 <"$T/c.jsonl" >"$T/frames.zst"
[ "$(od -An -tx1 -N4 "$T/frames.zst" | tr -d ' ')" = 28b52ffd ] || bad "zstd_frames wrote no zstd frame"
inputs=("$T/c.jsonl.gz" "$T/multi.gz" "$T/frames.zst")
if command -v zstd >/dev/null; then zstd -q -c "$T/c.jsonl" >"$T/cli.zst"; inputs+=("$T/cli.zst")
else echo "skip the zstd CLI's own file (zstd not installed; libzstd's frames are tested)"; fi
cp "$T/frames.zst" "$T/frames_no_suffix"   # told by the magic bytes, not the name
inputs+=("$T/frames_no_suffix")
for f in "${inputs[@]}"; do
  n=$(basename "$f")
  tok --input "$f" --output "$T/p.bin" --quiet >/dev/null 2>"$T/err" && cmp -s "$T/base.bin" "$T/p.bin" &&
    ok "$n by path: the same shard" || { bad "$n by path"; cat "$T/err"; }
  tok --input - --output "$T/s.bin" --quiet <"$f" >/dev/null 2>"$T/err" && cmp -s "$T/base.bin" "$T/s.bin" &&
    ok "$n as --input - (redirect): the same shard" || { bad "$n from stdin"; cat "$T/err"; }
  cat "$f" | tok --input - --output "$T/q.bin" --quiet >/dev/null 2>"$T/err" && cmp -s "$T/base.bin" "$T/q.bin" &&
    ok "$n as --input - (pipe): the same shard" || { bad "$n from a pipe"; cat "$T/err"; }
done

# progress: --progress 0 writes a line per document; a file has its size (percentage, ETA), a pipe not
tok --input "$T/c.jsonl.gz" --output "$T/p.bin" --progress 0 >"$T/out" 2>"$T/err"
last=$(tail -n 1 "$T/err")
re="^tokenize: [0-9.]+ kB of [0-9.]+ kB read \(100%\), [0-9.]+ kB of text at [0-9.]+ MB/s, $docs documents, [0-9]+ tokens, ETA [0-9]+s\$"
[ "$(wc -l <"$T/err")" -eq "$docs" ] && [[ "$last" =~ $re ]] &&
  ok "progress of a .gz file: $last" || { bad "progress lines of a file ($(wc -l <"$T/err") lines):"; tail -n 2 "$T/err"; }
cat "$T/frames.zst" | tok --input - --output "$T/p.bin" --progress 0 >"$T/out" 2>"$T/err"
last=$(tail -n 1 "$T/err")
re="^tokenize: [0-9.]+ kB read, [0-9.]+ kB of text at [0-9.]+ MB/s, $docs documents, [0-9]+ tokens\$"
[[ "$last" =~ $re ]] &&
  ok "progress of a pipe (no size, no ETA): $last" || { bad "progress of a pipe:"; tail -n 2 "$T/err"; }
tok --input "$T/c.jsonl" --output "$T/p.bin" >"$T/out" 2>"$T/err"
[ ! -s "$T/err" ] && [ "$(wc -l <"$T/out")" -eq 1 ] && ok "default: a line every 10 s off a terminal (none in a short run), the summary" ||
  { bad "default progress"; cat "$T/err"; }

# expect NAME PATTERN -- ARGS: exit 2, one stderr line matching PATTERN, no shard and no temporary
expect() {
  local name=$1 pat=$2; shift 3
  rm -f "$T/never.bin"
  "$@" --output "$T/never.bin" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qE -- "$pat" "$T/err" &&
     [ ! -e "$T/never.bin" ] && [ ! -e "$T/never.bin.tmp" ]; then ok "$name: $(cat "$T/err")"
  else bad "$name: status $rc, wanted 2 and /$pat/, no shard:"; cat "$T/err"; ls "$T" | grep never; fi
}
sz=$(stat -c %s "$T/c.jsonl.gz")
head -c $((sz / 2)) "$T/c.jsonl.gz" >"$T/half.gz"
head -c $((sz - 4)) "$T/c.jsonl.gz" >"$T/notrailer.gz"
cp "$T/c.jsonl.gz" "$T/flip.gz"; printf '\xa5' | dd of="$T/flip.gz" bs=1 seek=$((sz - 6)) conv=notrunc status=none   # the CRC-32
cp "$T/c.jsonl.gz" "$T/flip2.gz"; printf '\xff' | dd of="$T/flip2.gz" bs=1 seek=20 conv=notrunc status=none
{ cat "$T/c.jsonl.gz"; printf 'not gzip\n'; } >"$T/trailing.gz"
zs=$(stat -c %s "$T/frames.zst")
head -c $((zs / 2)) "$T/frames.zst" >"$T/half.zst"
head -c $((zs - 3)) "$T/frames.zst" >"$T/cut.zst"
cp "$T/frames.zst" "$T/flip.zst"; printf '\xa5\x5a\xa5\x5a' | dd of="$T/flip.zst" bs=1 seek=3000 conv=notrunc status=none
cp "$T/c.jsonl" "$T/plain.gz"
printf '\xfd7zXZ\0rest' >"$T/c.xz"
expect "truncated gzip (half)" "half.gz: truncated gzip data: the input ends inside member 1" -- tok --input "$T/half.gz"
expect "truncated gzip (no trailer)" "notrailer.gz: truncated gzip data" -- tok --input "$T/notrailer.gz"
expect "corrupt gzip (its CRC-32)" "flip.gz: corrupt gzip data in member 1 near compressed byte [0-9]+: incorrect data check" -- tok --input "$T/flip.gz"
expect "corrupt gzip (deflate data)" "flip2.gz: corrupt gzip data in member 1 near compressed byte [0-9]+: " -- tok --input "$T/flip2.gz"
expect "gzip, then other bytes" "trailing.gz: the bytes after gzip member 1 \(from compressed byte $sz\) are not gzip data" -- tok --input "$T/trailing.gz"
expect "truncated gzip on stdin" "^ctitan tokenize: standard input: truncated gzip data" -- tok --input - <"$T/half.gz"
expect "truncated zstd (half)" "half.zst: truncated zstd data: the input ends inside frame [0-9]+" -- tok --input "$T/half.zst"
expect "truncated zstd (last 3 bytes)" "cut.zst: truncated zstd data: the input ends inside frame [0-9]+" -- tok --input "$T/cut.zst"
expect "corrupt zstd" "flip.zst: corrupt zstd data in frame 1 \(within the first [0-9]+ compressed bytes\): " -- tok --input "$T/flip.zst"
expect "corrupt zstd on stdin" "^ctitan tokenize: standard input: corrupt zstd data" -- tok --input - <"$T/flip.zst"
expect "a .gz name on plain data" "plain.gz: the name ends in .gz but the data is not gzip" -- tok --input "$T/plain.gz"
expect "xz is refused with the pipe to use" "c.xz: xz-compressed data is not read.*xz -dc FILE \| ctitan tokenize --input -" -- tok --input "$T/c.xz"
expect "a missing input" "nope.jsonl.gz: cannot open: No such file" -- tok --input "$T/nope.jsonl.gz"
expect "a second standard input" "--input - \(standard input\) can be given once" -- tok --input - --input -
# a missing field, or one that is not a string: file:line and the field; --skip-missing counts them
{ head -n 3 "$T/c.jsonl"; printf '{"id": 7, "text": "elsewhere"}\n'; printf '{"content": null}\n'; } >"$T/gaps.jsonl"
gzip -c "$T/gaps.jsonl" >"$T/gaps.jsonl.gz"
expect "a missing field" "gaps.jsonl:4: no \"content\" field \(name the text's field with --field NAME, or skip such lines with --skip-missing\)" -- tok --input "$T/gaps.jsonl"
expect "a missing field, gzip" "gaps.jsonl.gz:4: no \"content\" field" -- tok --input "$T/gaps.jsonl.gz"
expect "a missing field, stdin" "standard input:4: no \"content\" field" -- tok --input - <"$T/gaps.jsonl"
expect "a field that is not a string" "gaps.jsonl:1: \"id\" is not a string" -- "$CTITAN" tokenize --tokenizer "$VOCAB" --format jsonl --field id --input "$T/gaps.jsonl"
expect "--field on text" "--field applies to --format jsonl only" -- "$CTITAN" tokenize --tokenizer "$VOCAB" --field x --input "$T/gaps.jsonl"
tok --input "$T/gaps.jsonl.gz" --skip-missing --output "$T/gaps.bin" >"$T/out" 2>"$T/err" &&
  grep -q "^tokenize: 3 documents, .*, 2 lines skipped (no \"content\" string) -> " "$T/out" &&
  ok "--skip-missing: $(cat "$T/out")" || { bad "--skip-missing"; cat "$T/out" "$T/err"; }

# shards: --check, a flipped byte, version 1
"$CTITAN" tokenize --check "$T/base.bin" >"$T/out" 2>"$T/err" &&
  grep -qE "^$T/base.bin: token shard version 2, [0-9]+ tokens, CRC-32 0x[0-9a-f]{8} \(matches the header\)$" "$T/out" &&
  ok "--check: $(cat "$T/out")" || { bad "--check"; cat "$T/out" "$T/err"; }
cp "$T/base.bin" "$T/flipped.bin"; printf '\x01' | dd of="$T/flipped.bin" bs=1 seek=4099 conv=notrunc status=none
"$CTITAN" tokenize --check "$T/flipped.bin" >"$T/out" 2>"$T/err"; rc=$?
[ "$rc" -eq 2 ] && grep -qE "^ctitan tokenize: $T/flipped.bin: checksum mismatch: the header says 0x[0-9a-f]{8}, the tokens give 0x[0-9a-f]{8}; the file is corrupt$" "$T/err" &&
  ok "--check of a flipped byte: $(cat "$T/err")" || { bad "--check of a flipped byte: status $rc"; cat "$T/err"; }

# a training run: the data loader checks the same checksum; version 1 trains
. tests/cli/lib/data.sh
test_data "$T" 2048 || { bad "test data"; exit 1; }
run=(configs/llama3_debug.yaml --model.tokenizer_path="$T/tok.model" --training.steps=1 --training.seq_len=32
     --model.n_layers=1 --generate.max_new_tokens=0 --device.threads=1)
cp "$T/data.bin" "$T/flipdata.bin"; printf '\x7f' | dd of="$T/flipdata.bin" bs=1 seek=1001 conv=notrunc status=none
"$CTITAN" train "${run[@]}" --training.dataset_path="$T/flipdata.bin" --job.dump_folder="$T/r1" >"$T/out" 2>"$T/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "training.dataset_path: $T/flipdata.bin: checksum mismatch: the header says" "$T/err" &&
  ok "a training run refuses the flipped shard: $(tail -n 1 "$T/err")" || { bad "train on a flipped shard: status $rc"; tail -n 3 "$T/err"; }
# version 1: the same tokens, the version field 1 and the reserved field 0
cp "$T/data.bin" "$T/v1.bin"
printf '\x01' | dd of="$T/v1.bin" bs=1 seek=8 conv=notrunc status=none
head -c 8 /dev/zero | dd of="$T/v1.bin" bs=1 seek=24 conv=notrunc status=none
"$CTITAN" tokenize --check "$T/v1.bin" >"$T/out" 2>&1 && grep -q "token shard version 1, .* (version 1 stores none)" "$T/out" &&
  ok "--check of a version-1 shard: $(cat "$T/out")" || { bad "--check v1"; cat "$T/out"; }
"$CTITAN" train "${run[@]}" --training.dataset_path="$T/v1.bin" --job.dump_folder="$T/r2" >"$T/out" 2>&1 &&
  grep -qE "^step +1 " "$T/out" && ok "a training run reads the version-1 shard" || { bad "train on v1"; tail -n 3 "$T/out"; }
printf '\x05' | dd of="$T/v1.bin" bs=1 seek=8 conv=notrunc status=none
"$CTITAN" tokenize --check "$T/v1.bin" >"$T/out" 2>"$T/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "v1.bin: token shard version 5, this build reads versions 1, 2, 3 and 4" "$T/err" &&
  ok "version 5 is refused: $(cat "$T/err")" || { bad "version 5: status $rc"; cat "$T/err"; }

[ "$fails" -eq 0 ] && echo "tokenize_input: ok" || { echo "tokenize_input: $fails failed"; exit 1; }
