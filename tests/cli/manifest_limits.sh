#!/usr/bin/env bash
# A manifest is untrusted input: each limit (size, nesting, aliases, keys), an explicit null, a second
# document, a TOML file and every value out of its range or choices is refused with status 2 and one
# line naming the file and line or key, and the limit or the expected values. The stress inputs run
# under `timeout 10` (without the limits they ran for minutes), and each must finish in 2 s.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
fails=0
# expect NAME PATTERN... -- ARGS: runs ctitan train ARGS, wants status 2 within 2 s, one stderr line matching every PATTERN
expect() {
  local name=$1; shift; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  local t0; t0=$(date +%s%N)
  timeout 10 "$CTITAN" train "$@" >"$T/out" 2>"$T/err"; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  local lines; lines=$(wc -l <"$T/err")
  local ok=1
  [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && [ "$ms" -lt 2000 ] || ok=0
  for p in "${pats[@]}"; do grep -qE -- "$p" "$T/err" || ok=0; done
  if [ $ok -eq 1 ]; then echo "ok   $name (${ms} ms): $(cut -c1-200 "$T/err")"
  else echo "FAIL $name: status $rc, $lines stderr lines, ${ms} ms, wanted /${pats[*]}/:"; cut -c1-300 "$T/err" | sed 's/^/     /'; fails=$((fails+1)); fi
}
debug=configs/llama3_debug.yaml

# ---- limits on reading: all generated here, the same shapes as tests/fuzz/corpus/manifest/stress-*
# an alias bomb: 9 levels of maps holding 9 aliases of the level below (9^9 nodes expanded)
{ echo "s:"; echo "  a0: &a0 {x: 1}"
  for i in 1 2 3 4 5 6 7 8 9; do p=$((i-1)); printf '  a%d: &a%d {' $i $i
    for j in 0 1 2 3 4 5 6 7 8; do printf '%sk%d: *a%d' "$([ $j -gt 0 ] && echo ', ')" $j $p; done; echo "}"; done; } >"$T/bomb.yaml"
expect "alias bomb ($(wc -c <"$T/bomb.yaml") bytes)" "bomb.yaml:[0-9]+:" "expands to more than 262144 nodes" -- "$T/bomb.yaml"
head -7 "$T/bomb.yaml" >"$T/bomb5.yaml"  # 5 levels, 59049 keys (was 33 s)
expect "alias bomb, 5 levels" "bomb5.yaml:[0-9]+:" "expands to more than 262144 nodes" -- "$T/bomb5.yaml"
sed 's/{x: 1}/{}/' "$T/bomb.yaml" >"$T/empty.yaml"
expect "alias bomb of empty maps" "empty.yaml:[0-9]+:" "expands to more than 262144 nodes" -- "$T/empty.yaml"
printf 'x: &a {b: *a}\n' >"$T/self.yaml"
expect "a map holding an alias of itself" "self.yaml:1:" "nested deeper than 64 levels" -- "$T/self.yaml"
awk 'BEGIN { printf "x: "; for (i = 0; i < 100000; i++) printf "{a: "; printf "1"; for (i = 0; i < 100000; i++) printf "}"; print "" }' >"$T/deep.yaml"
expect "100,000 nested flow maps" "deep.yaml:1:" "nested deeper than 64 levels" -- "$T/deep.yaml"
awk 'BEGIN { for (i = 0; i < 70; i++) { for (j = 0; j < i; j++) printf " "; print "k:" } }' >"$T/block.yaml"
expect "70 nested block maps" "block.yaml:65:" "nested deeper than 64 levels" -- "$T/block.yaml"
awk 'BEGIN { print "training:"; for (i = 0; i < 120000; i++) printf "  k%d: 1\n", i }' >"$T/keys.yaml"
expect "120,000 keys in one section" "keys.yaml:65538:" "more than 65536 keys" -- "$T/keys.yaml"
head -60001 "$T/keys.yaml" >"$T/keys60k.yaml"  # under the limit: validation names the first unknown key (was 8 s)
expect "60,000 keys in one section" "keys60k.yaml:2:" "training.k0: unknown key" -- "$T/keys60k.yaml"
awk 'BEGIN { print "training:"; for (i = 0; i < 1100; i++) printf "  k%d: &a%d 1\n", i, i }' >"$T/anchors.yaml"
expect "too many anchors" "anchors.yaml:1026:" "more than 1024 anchors" -- "$T/anchors.yaml"
awk 'BEGIN { print "training:"; print "  k: &a 1"; for (i = 0; i < 5000; i++) printf "  k%d: *a\n", i }' >"$T/aliases.yaml"
expect "too many aliases" "aliases.yaml:4099:" "more than 4096 aliases" -- "$T/aliases.yaml"
awk 'BEGIN { printf "job:\n  description: \""; for (i = 0; i < 5 * 1024; i++) printf "%01024d", 0; print "\"" }' >"$T/big.yaml"
expect "a 5 MiB manifest" "big.yaml:1:" "larger than 4 MiB" -- "$T/big.yaml"
awk 'BEGIN { printf "job:\n  "; for (i = 0; i < 300; i++) printf "k"; print ": 1" }' >"$T/longkey.yaml"
expect "a 300-character key" "longkey.yaml:2:" "longer than 255 characters" -- "$T/longkey.yaml"

# ---- nulls, documents, TOML
for v in "~" "null" ""; do
  printf 'training:\n  seq_len: 32\n  steps: %s\n' "$v" >"$T/null.yaml"
  expect "explicit null 'steps: $v'" "null.yaml:3: training.steps: no value" -- "$T/null.yaml"
done
printf 'model: {tokenizer_path: null}\n' >"$T/null2.yaml"
expect "explicit null of a key without default" "null2.yaml:1: model.tokenizer_path: no value" -- "$T/null2.yaml"
printf 'training:\n  steps: 2\n---\ntraining:\n  steps: 3\n' >"$T/docs.yaml"
expect "a second YAML document" "docs.yaml:3:" "second YAML document" -- "$T/docs.yaml"
printf '# torchtitan job config\n[job]\ndump_folder = "./outputs"\n\n[training]\nsteps = 10\n' >"$T/llama3.toml"
printf '# torchtitan job config\n[job]\ndump_folder = "./outputs"\n\n[training]\nsteps = = 10\n' >"$T/llama3.toml"
expect "torchtitan TOML config with a syntax error" "llama3.toml:6:[0-9]+: TOML syntax error" -- "$T/llama3.toml"

# ---- ranges and choices, checked whether or not the feature is on (and before any allocation)
range() { local key=$1 value=$2; shift 2; expect "$key: $value" "command line: --$key" "$@" -- $debug --dry-run "--$key=$value"; }
range optimizer.lr -1 "expected a number in \[0, 1000\]"
range optimizer.lr 1e308 "expected a number in \[0, 1000\]"
range generate.temperature -1 "expected a number in \[0, 100\]"
range generate.top_k -1 "expected an integer in \[0,"
range generate.top_p 0 "expected a number in \(0, 1\]"
range generate.top_p 1.5 "expected a number in \(0, 1\]"
range generate.max_new_tokens -1 "expected an integer in \[0, 1048576\]"
range generate.max_new_tokens 4611686018427387891 "expected an integer in \[0, 1048576\]"
range training.steps 0 "expected an integer in \[1,"
range training.steps -5 "expected an integer in \[1,"
range training.seq_len 0 "expected an integer in \[1, 1048576\]"
range training.local_batch_size 1000000000 "expected an integer in \[1, 1048576\]"
range training.local_batch_size 100000 "tokens per microbatch; the limit is 16777216"
range training.global_batch_size 10000000 "tokens per step; the limit is"
range lr_scheduler.decay_type exponential "expected linear, sqrt or cosine"
range lr_scheduler.min_lr_factor 2 "expected a number in \[0, 1\]"
range activation_checkpoint.mode partial "expected none, full or selective"
range checkpoint.async_mode sync "expected disabled or async"
range checkpoint.interval 0 "expected an integer in \[1,"
range parallelism.fsdp_reshard_after_forward sometimes "expected default, always or never"
range quantize.dense.float8.format mxpf8 "expected tensorwise, rowwise, .* or mxfp8_rceil, got 'mxpf8'"
range parallelism.pipeline_parallel_schedule 1F2B "unknown pipeline schedule '1F2B'" "GPipe"
range parallelism.tensor_parallel_degree 0 "expected an integer in \[1, 1048576\]"
range parallelism.data_parallel_shard_degree -2 "expected an integer in \[-1, 1048576\]"
range parallelism.pipeline_parallel_degree 99999999999 "expected an integer in \[1, 1048576\]"
range comm.train_timeout_seconds 0 "expected a number in \(0, 1e9\]"
# the model pack's own options, reported at their key (not at model.flavor)
range model.n_layers 0 "llama3: expected a value in \[1, 1024\], got 0"
range model.n_layers 100000 "llama3: expected a value in \[1, 1024\], got 100000"
range model.ffn_dim_multiplier 0 "llama3: expected a value in \(0, 100\]"
range model.ffn_dim_multiplier 1e-9 "the SwiGLU hidden size comes out as 0"
range model.ffn_hidden 0 "llama3: expected a value in \[1, 4194304\]"
range model.rope_theta 0 "llama3: expected a value in \(0,"
range model.norm_eps -1 "llama3: expected a value in \(0, 1\]"
range model.dim -4 "llama3: expected a value in \[1,"
range model.dim 100 "dim 100 must split into n_heads 16 heads of even size"
range model.n_kv_heads 3 "n_heads 16 must be a multiple of n_kv_heads 3"
printf 'model:\n  flavor: debugmodel\n  n_layers: 0\n' >"$T/layers.yaml"
expect "model.n_layers in a file" "layers.yaml:3: model.n_layers: llama3" -- "$T/layers.yaml" --dry-run
# the optimizer is created only by a real run: a tiny one that fails before its data
opt=($debug --training.dataset_path="$T/none.bin" --model.n_layers=1 --training.seq_len=16 --training.steps=1)
expect "optimizer.implementation" "command line: --optimizer.implementation: adamw: expected fused, foreach, for-loop or fused_opt_states_bf16, got 'turbo'" -- \
  "${opt[@]}" --optimizer.implementation=turbo
expect "optimizer.beta2" "command line: --optimizer.beta2: adamw: expected 0 <= beta2 < 1" -- "${opt[@]}" --optimizer.beta2=1

echo
[ $fails -eq 0 ] && echo "manifest_limits: all cases gave one line and status 2" || echo "manifest_limits: $fails case(s) failed"
exit $fails
