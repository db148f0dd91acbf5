# data.sh: sourced by the tests (run from the repository root) that train on the test corpus.
#   test_data DIR VOCAB   a byte-level BPE vocabulary of VOCAB tokens trained on the corpus into
#                         DIR/tok.model, and the corpus tokenized with it into DIR/data.bin
test_data() {
  local corpus=tests/data/tokenizer/corpus.txt
  "$CTITAN" tokenizer train --input "$corpus" --vocab-size "$2" --output "$1/tok.model" >/dev/null &&
    "$CTITAN" tokenize --tokenizer "$1/tok.model" --input "$corpus" --output "$1/data.bin" >/dev/null
}
