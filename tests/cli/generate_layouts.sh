#!/usr/bin/env bash
# Sampling under every layout gives the single-rank sample of the same model and seed: TP 2 (the
# prompt is padded to a multiple of the degree), PP 2, PP 2 x TP 2, at the end of a training and in
# `ctitan generate`. What the end of a run needs is checked before training (exit 2 naming the key),
# and a huge generate.max_new_tokens allocates nothing from it.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/data.sh
test_data "$T" 2048 || fail "test data"
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.tokenizer_path="$T/tok.model"
      --training.seq_len=32 --device.threads=1 --generate.max_new_tokens=24 --generate.prompt="The meaning of life is"
      --training.mixed_precision_param=float32)
tp=(--parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=1)
pp=(--parallelism.pipeline_parallel_degree=2 --parallelism.data_parallel_shard_degree=1)
sample() { grep -a '^The meaning of life is' "$1" | tail -1; }

# a TP training: its end-of-run sample equals one rank's sample of the model it saved
"$CTITAN" launch -n 2 train "${base[@]}" "${tp[@]}" --training.steps=3 --job.dump_folder="$T/tp" >"$T/tp.log" 2>&1 \
  || { tail -5 "$T/tp.log"; fail "TP 2 training exited $?"; }
grep -qi warning "$T/tp.log" && fail "TP 2 training warned: $(grep -i warning "$T/tp.log")"
want=$("$CTITAN" generate "${base[@]}" --job.dump_folder="$T/tp" 2>&1 | tail -1)
[ -n "$want" ] && [ "$(sample "$T/tp.log")" = "$want" ] || fail "TP 2 end-of-run sample '$(sample "$T/tp.log")' vs one rank '$want'"
echo "ok   TP 2 end-of-run sample = one rank's: $want"
for layout in "tp 2" "pp 2" "pptp 4"; do
  set -- $layout
  case $1 in tp) args=("${tp[@]}") ;; pp) args=("${pp[@]}") ;; pptp) args=("${pp[@]}" --parallelism.tensor_parallel_degree=2) ;; esac
  "$CTITAN" launch -n "$2" generate "${base[@]}" "${args[@]}" --job.dump_folder="$T/tp" >"$T/g_$1.log" 2>&1 \
    || { tail -3 "$T/g_$1.log"; fail "generate $1 exited $?"; }
  [ "$(sample "$T/g_$1.log")" = "$want" ] || fail "generate $1: '$(sample "$T/g_$1.log")' vs one rank '$want'"
  echo "ok   ctitan generate under $1 ($2 ranks) = one rank's sample"
done

# a PP training samples at its end too, and exits 0
"$CTITAN" launch -n 2 train "${base[@]}" "${pp[@]}" --training.steps=2 --job.dump_folder="$T/pp" >"$T/pp.log" 2>&1 \
  || { tail -5 "$T/pp.log"; fail "PP 2 training exited $?"; }
want=$("$CTITAN" generate "${base[@]}" --job.dump_folder="$T/pp" 2>&1 | tail -1)
[ "$(sample "$T/pp.log")" = "$want" ] || fail "PP 2 end-of-run sample '$(sample "$T/pp.log")' vs one rank '$want'"
echo "ok   PP 2 end-of-run sample = one rank's"

# expect NAME PATTERN ARGS...: exit 2, one stderr line matching PATTERN, no training step ran
expect() {
  local name=$1 pat=$2; shift 2
  "$CTITAN" train "${base[@]}" --training.steps=2 --job.dump_folder="$T/$name" "$@" >"$T/$name.out" 2>"$T/$name.err"
  local rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$T/$name.err")" -eq 1 ] && grep -qE -- "$pat" "$T/$name.err" && ! grep -q '^step' "$T/$name.out" \
    || { cat "$T/$name.err"; fail "$name: exit $rc, wanted 2 and /$pat/ before any step"; }
  echo "ok   $name: $(cat "$T/$name.err")"
}
expect missing_tokenizer "model.tokenizer_path.*cannot open" --model.tokenizer_path="$T/none.model"
expect tokenizer_too_big "model.tokenizer_path.*2048 tokens.*vocabulary is 1024" --model.vocab_size=1024
printf 'not a tokenizer\n' >"$T/bad.model"
expect bad_tokenizer "model.tokenizer_path" --model.tokenizer_path="$T/bad.model"
expect hf_without_checkpoints "checkpoint.last_save_in_hf.*checkpoint.enable" --checkpoint.last_save_in_hf=true
"$CTITAN" train "${base[@]}" --training.steps=1 --generate.max_new_tokens=0 --model.tokenizer_path="$T/none.model" \
  --job.dump_folder="$T/nosample" >/dev/null 2>&1 || fail "no sample: the tokenizer is not needed, yet the run failed"
echo "ok   generate.max_new_tokens: 0 needs no tokenizer"

# an untrained model's sample: its reserved special tokens (an eighth of its vocabulary here) are
# never emitted, at a high temperature over the whole vocabulary, for several seeds
"$CTITAN" train "${base[@]}" --training.steps=1 --generate.max_new_tokens=0 --job.dump_folder="$T/raw" \
  >/dev/null 2>&1 || fail "raw: training one step"
for seed in 1 2 3; do
  "$CTITAN" generate "${base[@]}" --job.dump_folder="$T/raw" --generate.max_new_tokens=200 --generate.temperature=2 \
    --generate.top_k=0 --generate.seed=$seed >"$T/raw$seed.out" 2>"$T/raw$seed.err" || { cat "$T/raw$seed.err"; fail "raw sample"; }
  ! grep -aq '<|' "$T/raw$seed.out" || { grep -ao '<|[^>]*>' "$T/raw$seed.out" | head -3; fail "seed $seed: a special token in the sample"; }
done
echo "ok   an untrained model's samples (3 seeds, 200 tokens at temperature 2): no special token"

# max_new_tokens near INT64_MAX: the context grows with the tokens made (it used to overflow a
# malloc size); stopped after a few seconds, it must not have crashed (124 = the timeout's kill)
timeout 4 "$CTITAN" generate "${base[@]}" --job.dump_folder="$T/tp" --generate.max_new_tokens=4611686018427387891 \
  >"$T/huge.out" 2>"$T/huge.err"
rc=$?
[ $rc -eq 124 ] || [ $rc -eq 0 ] || [ $rc -eq 2 ] || { head -5 "$T/huge.err"; fail "huge max_new_tokens: exit $rc"; }
grep -q "Sanitizer\|overflow" "$T/huge.err" && { head -5 "$T/huge.err"; fail "huge max_new_tokens: memory error"; }
echo "ok   generate.max_new_tokens=4611686018427387891: no overflow (exit $rc)"
