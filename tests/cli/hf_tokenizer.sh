#!/usr/bin/env bash
# Hugging Face tokenizers from the command line: `ctitan tokenizer encode/decode` and `ctitan tokenize`
# read a tokenizer.json and a model folder (the committed tests/data/tokenizer/hf/ ones, whose ids
# tests/unit/test_hf_tokenizer.c checks against the tokenizers package), BOS/EOS per document follow
# the tokenizer, a training run samples through model.hf_assets_path (torchtitan's debug config with
# a tokenizer of its test tokenizer's shape too, which says once which bytes it drops), and a file in
# neither format is refused in one line that names the formats read.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
HF=tests/data/tokenizer/hf
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }

# the golden ids of "Hello, world!" (golden.txt: llama3 / gpt2, mode all)
got=$("$CTITAN" tokenizer encode --tokenizer "$HF/llama3/" --text "Hello, world!")
[ "$got" = "39 578 78 11 744 0" ] && ok "encode with the llama3 folder: $got" || bad "encode with the llama3 folder: '$got'"
got=$("$CTITAN" tokenizer encode --tokenizer "$HF/gpt2/tokenizer.json" --text "Hello, world!<|endoftext|>" --allow-special)
[ "$got" = "39 575 78 11 740 0 1500" ] && ok "encode with gpt2's tokenizer.json: $got" || bad "encode with gpt2's tokenizer.json: '$got'"
got=$("$CTITAN" tokenizer decode --tokenizer "$HF/llama3" 1500 39 578 78 11 744 0 1501)
[ "$got" = "<|begin_of_text|>Hello, world!<|end_of_text|>" ] && ok "decode: $got" || bad "decode: '$got'"

# ctitan tokenize: llama3 writes BOS + tokens + EOS, gpt2 (no BOS) tokens + <|endoftext|>
printf 'Hello, world!' >"$T/doc.txt"
for t in llama3:8 gpt2:7; do
  name=${t%:*} want=${t#*:}
  if "$CTITAN" tokenize --tokenizer "$HF/$name" --input "$T/doc.txt" --output "$T/$name.bin" >"$T/out" 2>&1 &&
     grep -qE "\b1 documents?, $want tokens" "$T/out"; then ok "tokenize with $name: $want tokens"
  else bad "tokenize with $name: wanted $want tokens: $(cat "$T/out")"; fi
done

# a training run whose sample reads the tokenizer from model.hf_assets_path (tokenizer_path unset)
"$CTITAN" tokenize --tokenizer "$HF/llama3" --input tests/data/tokenizer/corpus.txt --output "$T/data.bin" >/dev/null \
  || bad "tokenize the corpus"
cat >"$T/m.yaml" <<YAML
job: {dump_folder: $T/run}
device: {threads: 1}
model: {name: llama3, flavor: debugmodel, n_layers: 1, vocab_size: 1792, hf_assets_path: $PWD/$HF/llama3}
training: {steps: 2, seq_len: 32, local_batch_size: 2, dataset_path: $T/data.bin, mixed_precision_param: float32}
generate: {prompt: "The meaning", max_new_tokens: 6, temperature: 0}
YAML
if "$CTITAN" train "$T/m.yaml" >"$T/train.log" 2>&1 && grep -qa '^The meaning' "$T/train.log"; then
  ok "train + sample via model.hf_assets_path: $(grep -a '^The meaning' "$T/train.log" | tail -1)"
else bad "train via model.hf_assets_path: $(tail -3 "$T/train.log")"; fi
# a model too small for the tokenizer's ids is refused before training, naming the key
"$CTITAN" train "$T/m.yaml" --model.vocab_size=1024 >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "model.hf_assets_path.*1756 tokens.*vocabulary is 1024" "$T/err"
then ok "small vocabulary refused: $(cat "$T/err")"; else bad "small vocabulary: status $rc: $(cat "$T/err")"; fi

# torchtitan's test tokenizer's shape (hf/torchtitan: a "\u0000" key, raw control characters, "\\x80"
# strings, no merges): the package's ids (golden.txt), its decode, and one note on stderr that 152
# bytes have no token and are dropped, as the package drops them
TT=$HF/torchtitan
note="$TT/tokenizer.json: 152 of the 256 bytes have no token of their own in model.vocab (0x00-0x20, "
got=$("$CTITAN" tokenizer encode --tokenizer "$TT" --text "Hello, world!" 2>"$T/err")
if [ "$got" = "72 101 108 108 111 44 119 111 114 108 100 33" ] && [ "$(wc -l <"$T/err")" -eq 1 ] &&
   grep -qF "ctitan tokenizer encode: note: $note" "$T/err" && grep -q "encoding drops them" "$T/err"
then ok "encode with torchtitan's shape: $got; $(cat "$T/err")"; else bad "encode with torchtitan's shape: '$got' $(cat "$T/err")"; fi
"$CTITAN" tokenizer decode --tokenizer "$TT/tokenizer.json" 1973 0 128 268 1974 >"$T/out" 2>"$T/err"
printf '<|begin_of_text|>\0\\x80 the<|end_of_text|>\n' >"$T/want"
if cmp -s "$T/out" "$T/want" && [ ! -s "$T/err" ]; then ok "decode with torchtitan's shape: NUL, \\x80, \" the\", specials"
else bad "decode with torchtitan's shape: $(od -c "$T/out" | head -3) $(cat "$T/err")"; fi
if "$CTITAN" tokenize --tokenizer "$TT" --input "$T/doc.txt" --output "$T/tt.bin" >"$T/out" 2>"$T/err" &&
   grep -qE "\b1 documents?, 14 tokens" "$T/out" && grep -qF "ctitan tokenize: note: $note" "$T/err"
then ok "tokenize with torchtitan's shape: BOS + 12 + EOS"; else bad "tokenize with torchtitan's shape: $(cat "$T/out" "$T/err")"; fi
# torchtitan's debug config with model.hf_assets_path at the folder, as torchtitan points it at its own
"$CTITAN" tokenize --tokenizer "$TT" --input tests/data/tokenizer/corpus.txt --output "$T/ttdata.bin" >/dev/null 2>&1 \
  || bad "tokenize the corpus with torchtitan's shape"
if "$CTITAN" train configs/torchtitan/llama3_debugmodel.toml --model.hf_assets_path="$PWD/$TT" --model.n_layers=1 \
     --training.steps=2 --training.seq_len=32 --training.local_batch_size=2 --training.dataset_path="$T/ttdata.bin" \
     --training.mixed_precision_param=float32 --job.dump_folder="$T/ttrun" --device.threads=1 \
     --generate.prompt="The meaning" --generate.max_new_tokens=6 --generate.temperature=0 >"$T/train.log" 2>&1 &&
   grep -qa '^The meaning' "$T/train.log" && [ "$(grep -c "^tokenizer: note: .*$note" "$T/train.log")" -eq 1 ]
then ok "torchtitan's debug config trains and samples via model.hf_assets_path: $(grep -a '^The meaning' "$T/train.log" | tail -1 | cat -v)"
else bad "torchtitan's debug config with model.hf_assets_path: $(tail -3 "$T/train.log")"; fi

# neither format: one line naming the formats read
"$CTITAN" tokenizer encode --tokenizer README.md --text x >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "README.md: not a tokenizer file: ctitan reads a Hugging Face tokenizer.json" "$T/err"
then ok "neither format: $(cat "$T/err")"; else bad "neither format: status $rc: $(cat "$T/err")"; fi
printf '{"model": {"type": "Unigram", "vocab": []}}' >"$T/tokenizer.json"
"$CTITAN" tokenize --tokenizer "$T" --input "$T/doc.txt" --output "$T/x.bin" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "$T/tokenizer.json: model.type: \"Unigram\" is not supported" "$T/err"
then ok "another model type: $(cat "$T/err")"; else bad "another model type: status $rc: $(cat "$T/err")"; fi

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
