#!/usr/bin/env bash
# Hugging Face tokenizers from the command line: `ctitan tokenizer encode/decode` and `ctitan tokenize`
# read a tokenizer.json and a model folder (the committed tests/data/tokenizer/hf/ ones, whose ids
# tests/unit/test_hf_tokenizer.c checks against the tokenizers package), BOS/EOS per document follow
# the tokenizer, a training run samples through model.hf_assets_path, and a file in neither format is
# refused in one line that names the formats read.
set -u
CTITAN=${CTITAN:-build/ctitan}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
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

# neither format: one line naming the formats read
"$CTITAN" tokenizer encode --tokenizer README.md --text x >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "README.md: not a tokenizer file: ctitan reads a Hugging Face tokenizer.json" "$T/err"
then ok "neither format: $(cat "$T/err")"; else bad "neither format: status $rc: $(cat "$T/err")"; fi
printf '{"model": {"type": "Unigram", "vocab": []}}' >"$T/tokenizer.json"
"$CTITAN" tokenize --tokenizer "$T" --input "$T/doc.txt" --output "$T/x.bin" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "$T/tokenizer.json: model.type: \"Unigram\" is not supported" "$T/err"
then ok "another model type: $(cat "$T/err")"; else bad "another model type: status $rc: $(cat "$T/err")"; fi

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
