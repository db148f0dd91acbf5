#!/usr/bin/env bash
# hf_third_party: a model pack the core knows nothing of (tests/plugins/hfpack.c, model_type
# "ctitan_toy") converts from and exports to a Hugging Face folder through its own tables (ABI 2.16's
# hf_import, 2.12's hf_export): `ctitan convert --from hf` finds it on CTITAN_PLUGIN_PATH by the
# folder's model_type, sets its options from config.json, un-permutes the rows it marks
# CT_HF_ROPE_ROWS and writes its description; `--to hf` exports the file back through the pack the
# description names, and the round trip is bit-exact. A folder with a checked key the pack runs no
# other way, and a model_type no pack runs, are refused in one line, exit 2.
set -u
CTITAN=${CTITAN:-build/ctitan}
BUILD=${BUILD:-build}
. tests/cli/lib/common.sh
test_tmp
[ -f "$BUILD/tests/plugins/ctitan-hfpack.so" ] || fail "$BUILD/tests/plugins/ctitan-hfpack.so is missing (make it)"
export CTITAN_PLUGIN_PATH=$BUILD/tests/plugins

# a folder as another tool writes it: dim 4, 1 layer, vocab 8; the values 1..48 in order
mkdir -p "$T/toy"
cat >"$T/toy/config.json" <<'JSON'
{"architectures": ["ToyMixerForCausalLM"], "model_type": "ctitan_toy", "hidden_size": 4,
 "num_hidden_layers": 1, "vocab_size": 8, "toy_kind": "mixer", "toy_scale": 0.5, "torch_dtype": "float32"}
JSON
perl -e '
  my $h = q({"toy.blocks.0.mix.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]},) .
          q("toy.embed_tokens.weight":{"dtype":"F32","shape":[8,4],"data_offsets":[64,192]}});
  $h .= " " x ((8 - length($h) % 8) % 8);
  print pack("Q<", length($h)), $h, pack("f<*", 1..16), pack("f<*", 17..48);' >"$T/toy/model.safetensors"

"$CTITAN" convert --from hf --input "$T/toy" --output "$T/a.ctt" >"$T/out" 2>"$T/err" ||
  { cat "$T/err"; fail "convert --from hf of the toy folder"; }
grep -q "(ctitan_toy, 2 tensors, float32)" "$T/out" && grep -q "^model: {name: hfpack, dim: 4, n_layers: 1, vocab_size: 8, scale: 0.5}$" "$T/out" ||
  { cat "$T/out"; fail "--from hf: the pack, its tensors and its options"; }
echo "ok   --from hf: found the pack by model_type ctitan_toy, options from config.json: $(tail -1 "$T/out")"
# the mixing matrix's rows come back in ctitan's order: HF rows 0 1 2 3 are ctitan rows 0 2 1 3
perl -e 'local $/; open my $f, "<", $ARGV[0] or exit 1; my $d = <$f>;
  exit(index($d, pack("f<*", 1..4, 9..12, 5..8, 13..16)) >= 0 && index($d, pack("f<*", 17..48)) >= 0 ? 0 : 1)' "$T/a.ctt" ||
  fail "the marked rows were not un-permuted (or the table not copied)"
echo "ok   the rows the pack marks CT_HF_ROPE_ROWS are un-permuted, the others copied"
grep -q '"name":"hfpack"' "$T/a.ctt" && grep -q '"scale":0.5' "$T/a.ctt" || fail "the description names the pack and its options"

"$CTITAN" convert --to hf --input "$T/a.ctt" --output "$T/hf" >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "--to hf"; }
grep -q '"architectures": \[' "$T/hf/config.json" && grep -q '"ToyMixerForCausalLM"' "$T/hf/config.json" &&
  grep -q '"toy_note": "written by the toy pack"' "$T/hf/config.json" && grep -q '"toy_scale": 0.5' "$T/hf/config.json" &&
  grep -q '"model_type": "ctitan_toy"' "$T/hf/config.json" || { cat "$T/hf/config.json"; fail "--to hf: the pack's config.json"; }
perl -e 'local $/; open my $f, "<", $ARGV[0] or exit 1; my $d = <$f>;
  exit(index($d, pack("f<*", 1..48)) >= 0 ? 0 : 1)' "$T/hf/model.safetensors" || fail "--to hf: the tensors are not the folder's"
"$CTITAN" convert --from hf --input "$T/hf" --output "$T/b.ctt" >/dev/null 2>"$T/err" && cmp -s "$T/a.ctt" "$T/b.ctt" ||
  { cat "$T/err"; fail "HF -> .ctt -> HF -> .ctt is not bit-exact"; }
echo "ok   --to hf through the pack's table (its names, rows, fields); HF -> .ctt -> HF -> .ctt bit-exact"

refused() { # name pattern dir
  "$CTITAN" convert --from hf --input "$3" --output "$T/x.ctt" >/dev/null 2>"$T/err"; local st=$?
  [ $st -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q -- "$2" "$T/err" || { cat "$T/err"; fail "$1: status $st"; }
  [ ! -e "$T/x.ctt" ] || fail "$1: wrote $T/x.ctt"
  echo "ok   $1: $(cat "$T/err")"
}
cp -r "$T/toy" "$T/kind" && sed -i 's/"toy_kind": "mixer"/"toy_kind": "other"/' "$T/kind/config.json"
refused "a checked key with another value" 'kind/config.json: toy_kind must be "mixer" (model hfpack runs no other)' "$T/kind"
cp -r "$T/toy" "$T/other" && sed -i 's/"ctitan_toy"/"gpt_neo"/' "$T/other/config.json"
refused "a model_type no pack runs" "other/config.json: model_type 'gpt_neo' is not supported (the model packs on the plugin search path run .*\"ctitan_toy\"" "$T/other"
echo "hf_third_party: ok"
