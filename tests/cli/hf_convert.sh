#!/usr/bin/env bash
# `ctitan convert` between ctitan model files and Hugging Face Llama folders.
#   - llama3_tiny -> HF gives exactly the committed tests/golden/hf/from_ctitan (verified by transformers);
#   - HF -> .ctt gives llama3_tiny's parameter records byte for byte (convert keeps only parameters:
#     config.*, input.*, expected.*, grad.*, adamw.* entries are not model weights), and a second
#     round trip reproduces both files; bfloat16 exports are stable too;
#   - folders written by transformers (one file in float32; bfloat16 shards with an index) convert;
#   - DeepSeek-V3's YaRN rope_scaling reads into the pack's options and is written back (below);
#   - bad input (corrupt or truncated safetensors, missing config.json, unsupported config such as
#     YaRN RoPE scaling on Llama (Llama 3.1's llama3 type is read: tests/cli/hf_rope_scaling.sh), YaRN
#     the DeepSeek-V3 pack cannot run, bad flags)
#     gives one line on stderr and exit status 2; an unwritable output gives exit status 1.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
G=tests/golden
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
run() { "$CTITAN" convert "$@" >"$T/out" 2>"$T/err"; }
# expect_fail NAME STATUS PATTERN -- ARGS: wants that status and one stderr line matching PATTERN
expect_fail() {
    local name=$1 want=$2 pat=$3; shift 4
    run "$@"; local rc=$?
    if [ "$rc" -eq "$want" ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qE -- "$pat" "$T/err"; then
        ok "$name: $(cat "$T/err")"
    else
        bad "$name: status $rc (want $want), stderr:"; sed 's/^/     /' "$T/err"
    fi
}
# the byte range of llama3_tiny.ctt holding its 21 parameter records (they are contiguous, between
# the adamw.* settings and input.tokens; a record starts with the 4-byte length of its name)
offset_of() { grep -obUaF "$1" "$G/llama3_tiny.ctt" | head -n 1 | cut -d: -f1; }

run --help && grep -q -- "--to hf" "$T/out" && ok "--help" || bad "--help"

# ctitan -> HF: the folder transformers verified
if run --to hf --input "$G/llama3_tiny.ctt" --output "$T/hf" &&
    cmp "$T/hf/config.json" "$G/hf/from_ctitan/config.json" &&
    cmp "$T/hf/model.safetensors" "$G/hf/from_ctitan/model.safetensors"; then
    ok "llama3_tiny -> HF equals tests/golden/hf/from_ctitan"
else bad "llama3_tiny -> HF"; cat "$T/err"; fi

# HF -> ctitan: the model description (first), then llama3_tiny's parameters, bit for bit
start=$(( $(offset_of tok_embeddings.weight) - 4 )); end=$(( $(offset_of input.tokens) - 4 ))
if run --from hf --input "$T/hf" --output "$T/a.ctt" &&
    astart=$(( $(grep -obUaF tok_embeddings.weight "$T/a.ctt" | head -n 1 | cut -d: -f1) - 4 )) &&
    [ "$(dd if="$T/a.ctt" bs=1 skip=28 count=18 status=none)" = ctitan.description ] &&
    cmp <(tail -c +$((astart + 1)) "$T/a.ctt" | head -c $((end - start))) <(tail -c +$((start + 1)) "$G/llama3_tiny.ctt" | head -c $((end - start))) &&
    [ "$(od -An -tu4 -j12 -N4 "$T/a.ctt" | tr -d ' ')" = 22 ] &&
    [ "$(stat -c %s "$T/a.ctt")" -eq $((astart + end - start + 8 * 22)) ]; then
    ok "HF -> .ctt holds its description, then llama3_tiny's 21 parameter records byte for byte (then 22 checksums)"
else bad "HF -> .ctt"; cat "$T/err"; fi
# the same file without its description (as an older ctitan wrote it): header with count 21, the
# parameter records, their 21 checksums (the description's, the first of 22, dropped)
{ head -c 12 "$T/a.ctt"; printf '\x15\x00\x00\x00'; tail -c +17 "$T/a.ctt" | head -c 8
  tail -c +$((astart + 1)) "$T/a.ctt" | head -c $((end - start)); tail -c $((8 * 21)) "$T/a.ctt"; } >"$T/old.ctt"
run --to hf --input "$T/old.ctt" --output "$T/hf_old" --n-heads 4 && cmp "$T/hf/config.json" "$T/hf_old/config.json" &&
    ok "a description-less .ctt (an older ctitan's) converts with --n-heads" || { bad "description-less .ctt"; cat "$T/err"; }
grep -q "model: {name: llama3, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 256, ffn_hidden: 192, rope_theta: 500000, norm_eps: 1e-05}" "$T/out" &&
    ok "--from hf prints the model options" || { bad "--from hf model line"; cat "$T/out"; }

# a second round trip from the converted file: no config.* entries, no flags: its description gives
# the heads, theta and epsilon (flags that agree with it are accepted)
run --to hf --input "$T/a.ctt" --output "$T/hf3" --n-heads 4 --rope-theta 500000 && cmp "$T/hf/config.json" "$T/hf3/config.json" &&
    ok "flags that agree with the description are accepted" || { bad "agreeing flags"; cat "$T/err"; }
if run --to hf --input "$T/a.ctt" --output "$T/hf2" &&
    cmp "$T/hf/model.safetensors" "$T/hf2/model.safetensors" && cmp "$T/hf/config.json" "$T/hf2/config.json" &&
    run --from hf --input "$T/hf2" --output "$T/b.ctt" && cmp "$T/a.ctt" "$T/b.ctt"; then
    ok ".ctt -> HF -> .ctt is bit-exact"
else bad "second round trip"; cat "$T/err"; fi

# bfloat16: half the bytes, rounding is stable (bf16 -> f32 -> bf16 gives the same file)
if run --to hf --input "$G/llama3_tiny.ctt" --output "$T/hfb" --dtype bfloat16 &&
    grep -q '"torch_dtype": "bfloat16"' "$T/hfb/config.json" &&
    run --from hf --input "$T/hfb" --output "$T/c.ctt" &&
    run --to hf --input "$T/c.ctt" --output "$T/hfb2" --n-heads 4 --dtype=bf16 &&
    cmp "$T/hfb/model.safetensors" "$T/hfb2/model.safetensors" &&
    [ "$(stat -c %s "$T/hfb/model.safetensors")" -lt $(( $(stat -c %s "$T/hf/model.safetensors") / 2 + 4096 )) ]; then
    ok "bfloat16 export: half size, stable through a round trip"
else bad "bfloat16 export"; cat "$T/err"; fi

# folders written by transformers
for d in from_transformers from_transformers_bf16; do
    if run --from hf --input "$G/hf/$d" --output "$T/$d.ctt" && grep -q "rope_theta: 25000, norm_eps: 1e-06" "$T/out"; then
        ok "$d (transformers) -> .ctt"
    else bad "$d -> .ctt"; cat "$T/err" "$T/out"; fi
done

# bad input
cp -r "$T/hf" "$T/corrupt"; printf '\xff\xff\xff\xff\xff\xff\xff\x7f' | dd of="$T/corrupt/model.safetensors" conv=notrunc status=none
expect_fail "corrupt header" 2 "model.safetensors: header length .* over the limit" -- --from hf --input "$T/corrupt" --output "$T/x.ctt"
cp -r "$T/hf" "$T/cut"; truncate -s -10 "$T/cut/model.safetensors"
expect_fail "truncated file" 2 "model.safetensors: tensor '.*': data_offsets .* run past the data section" -- --from hf --input "$T/cut" --output "$T/x.ctt"
cp -r "$T/hf" "$T/noconf"; rm "$T/noconf/config.json"
expect_fail "missing config.json" 2 "noconf/config.json: cannot open" -- --from hf --input "$T/noconf" --output "$T/x.ctt"
cp -r "$T/hf" "$T/scaled"; sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "factor": 8.0, "mscale": 1.0, "mscale_all_dim": 1.0}/' "$T/scaled/config.json"
expect_fail "YaRN RoPE scaling on Llama" 2 "rope_scaling.rope_type 'yarn' is not supported \(the pack's model.rope_scaling takes none\|llama3\)" -- --from hf --input "$T/scaled" --output "$T/x.ctt"
cp -r "$T/hf" "$T/yarn2"; sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "factor": 8.0}/' "$T/yarn2/config.json"
expect_fail "YaRN scaling cos and sin" 2 "config.json: rope_scaling scales cos and sin by 1.20794 .*set rope_scaling.mscale equal to rope_scaling.mscale_all_dim" -- --from hf --input "$T/yarn2" --output "$T/x.ctt"
[ -e "$T/x.ctt" ] && bad "a failed conversion left $T/x.ctt" || ok "failed conversions write nothing"
expect_fail "missing .ctt" 2 "nope.ctt: cannot open" -- --to hf --input "$T/nope.ctt" --output "$T/o"
expect_fail "no head count" 2 "old.ctt has no model description nor config.n_heads; give --n-heads" -- --to hf --input "$T/old.ctt" --output "$T/o"
expect_fail "heads do not divide" 2 "n_heads 5 does not divide the model width 64" -- --to hf --input "$T/old.ctt" --output "$T/o" --n-heads 5
expect_fail "kv heads do not fit" 2 "tensor 'layers.0.attention.wk.weight' has shape \(32, 64\), expected \(16, 64\)" -- --to hf --input "$T/old.ctt" --output "$T/o" --n-heads 4 --n-kv-heads 1
expect_fail "a flag against the description" 2 "^ctitan convert: --n-heads 8 contradicts .*a.ctt's description \(n_heads 4\); leave the flag out$" -- --to hf --input "$T/a.ctt" --output "$T/o" --n-heads 8
expect_fail "a flag against the description" 2 "^ctitan convert: --rope-theta 10000 contradicts .*a.ctt's description \(rope_theta 500000\)" -- --to hf --input "$T/a.ctt" --output "$T/o" --rope-theta 10000
[ -e "$T/o" ] && bad "a failed export created $T/o" || ok "failed exports write nothing"
expect_fail "unknown option" 2 "unknown argument --frmo" -- --frmo hf --input a --output b
expect_fail "both directions" 2 "exactly one of --to hf and --from hf" -- --to hf --from hf --input a --output b
expect_fail "other format" 2 "the only other format is hf, not gguf" -- --to gguf --input a --output b
expect_fail "bad dtype" 2 "--dtype must be float32 or bfloat16, not fp8" -- --to hf --input a --output b --dtype fp8
expect_fail "bad number" 2 "bad value for --n-heads" -- --to hf --input a --output b --n-heads four
expect_fail "dtype with --from" 2 "apply to --to hf only" -- --from hf --input a --output b --dtype bfloat16
expect_fail "no output" 2 "--input and --output are required" -- --from hf --input a
# DeepSeek-V3's YaRN (tests/golden/hf/deepseek_v3_yarn_from_transformers, transformers 5's rope_parameters): the folder
# converts with model.rope_scaling yarn and its settings, and back to a folder whose rope_scaling is transformers 4's
# form of the same (then to the same .ctt again); DeepSeek's own config.json spelling ("type", integers) reads
# alike. YaRN the pack cannot run (cos and sin scaled: mscale unlike mscale_all_dim, or neither given), a
# truncate of false and another rope_type are refused, naming the key.
Y=$G/hf/deepseek_v3_yarn_from_transformers
ystr="rope_scaling: yarn, rope_factor: 40, original_seq_len: 4096, beta_fast: 32, beta_slow: 1, mscale: 1}"
if run --from hf --input "$Y" --output "$T/y.ctt" && grep -qF "$ystr" "$T/out" &&
    run --to hf --input "$T/y.ctt" --output "$T/yhf" &&
    tr -d ' \n' <"$T/yhf/config.json" | grep -qF '"rope_scaling":{"beta_fast":32.0,"beta_slow":1.0,"factor":40.0,"mscale":1.0,"mscale_all_dim":1.0,"original_max_position_embeddings":4096,"rope_type":"yarn"}' &&
    run --from hf --input "$T/yhf" --output "$T/y2.ctt" && cmp -s "$T/y.ctt" "$T/y2.ctt"; then
    ok "DeepSeek-V3's YaRN folder: $ystr; written back as rope_scaling yarn; the files equal"
else bad "DeepSeek-V3's YaRN folder: $(cat "$T/err" "$T/out")"; fi
# yarn_config NAME JSON: the folder with rope_parameters gone and rope_scaling set to JSON (DeepSeek's own spelling)
yarn_config() {
    rm -rf "$T/$1"; cp -r "$Y" "$T/$1"
    sed -i '/"rope_parameters": {/,/}/d' "$T/$1/config.json"
    sed -i "s/\"rope_interleave\": true,/\"rope_interleave\": true, \"rope_scaling\": $2, \"rope_theta\": 10000.0,/" "$T/$1/config.json"
}
yarn_config ydeepseek '{"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}'
if run --from hf --input "$T/ydeepseek" --output "$T/y3.ctt" && cmp -s "$T/y.ctt" "$T/y3.ctt"; then
    ok "DeepSeek-V3's own rope_scaling spelling gives the same model file"
else bad "DeepSeek-V3's own rope_scaling spelling: $(cat "$T/err" "$T/out")"; fi
yarn_config ymscale '{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 0.707, "mscale_all_dim": 1.0}'
expect_fail "YaRN mscale unlike mscale_all_dim" 2 "rope_scaling scales cos and sin by 0.92.*set rope_scaling.mscale equal to rope_scaling.mscale_all_dim" -- --from hf --input "$T/ymscale" --output "$T/x.ctt"
yarn_config ybare '{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}'
expect_fail "YaRN without mscale" 2 "rope_scaling scales cos and sin by 1.36889" -- --from hf --input "$T/ybare" --output "$T/x.ctt"
yarn_config ytrunc '{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1, "mscale_all_dim": 1, "truncate": false}'
expect_fail "YaRN truncate false" 2 "rope_scaling.truncate must be true" -- --from hf --input "$T/ytrunc" --output "$T/x.ctt"
yarn_config yllama '{"rope_type": "llama3", "factor": 8.0}'
expect_fail "Llama 3.1 scaling on DeepSeek-V3" 2 "rope_scaling.rope_type 'llama3' is not supported \(the pack's model.rope_scaling takes auto\|yarn\|none\)" -- --from hf --input "$T/yllama" --output "$T/x.ctt"
yarn_config ydyn '{"rope_type": "dynamic", "factor": 8.0}'
expect_fail "dynamic scaling on DeepSeek-V3" 2 "rope_scaling rope_type 'dynamic' is not supported" -- --from hf --input "$T/ydyn" --output "$T/x.ctt"
touch "$T/file"
expect_fail "unwritable output" 1 "cannot create the folder" -- --to hf --input "$G/llama3_tiny.ctt" --output "$T/file/sub"

echo
[ "$fails" -eq 0 ] && echo "hf_convert: ok" || echo "hf_convert: $fails failed"
[ "$fails" -eq 0 ]
