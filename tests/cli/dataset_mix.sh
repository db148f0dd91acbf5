#!/usr/bin/env bash
# training.dataset as a weighted mixture of two corpora and validation.* on a held-out one: llama3
# debugmodel (2 layers, fp32), 6 steps of 8 x 32 tokens, validation at steps 1, 2, 4, 6.
# - the two training corpora are compressed JSONL (gzip, zstd) piped into `ctitan tokenize --input -`;
# - the data line shows the mixture (weights 3:1 -> 750 and 250 sequences of every 1000);
# - FSDP 2, DDP 2, TP 2, PP 2, CP 2 and HSDP 2x2 give the single rank's training and validation
#   losses within 1e-6 (relative), and FSDP 2 with bf16 compute one rank's bf16 validation losses;
#   validation on or off leaves the training losses bit-identical (fp32 and bf16);
# - a run stopped after step 3 and resumed gives bit-identical training and validation losses to the
#   uninterrupted run; a resume under another mixture is refused naming training.dataset;
# - --print-config shows the list, --training.dataset=PATH replaces it, --training.dataset[N].weight
#   changes one source;
# - bad input (a weight of 0 or below, a missing or too short source, dataset and dataset_path both
#   set, validation on with no dataset, validation.freq 0, a weight on a validation source, an item
#   index past the list) ends with status 2 and one line naming file:line: key.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/curves.sh
corpus=tests/data/tokenizer/corpus.txt
n=$(wc -l <"$corpus")
head -n $((n / 2)) "$corpus" >"$T/a.txt"
tail -n +$((n / 2 + 1)) "$corpus" | head -n $((n / 2 - 40)) >"$T/b.txt"
tail -n 40 "$corpus" >"$T/v.txt" # held out: in neither training corpus
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null || fail "tokenizer"
# The two training corpora arrive as a user's exported datasets do: JSONL with the text under
# "content", compressed (a with gzip, b with zstd), piped into `ctitan tokenize --input -`.
jsonl() { LC_ALL=C tr -d '\000-\010\013-\037' <"$1" | awk '{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); printf "{\"id\": %d, \"content\": \"%s\"}\n", NR, $0 }'; } # control characters dropped
cc -O1 -o "$T/zstd_frames" tests/cli/lib/zstd_frames.c -lzstd || fail "cannot build tests/cli/lib/zstd_frames.c"
jsonl "$T/a.txt" | gzip -c >"$T/a.jsonl.gz"
jsonl "$T/b.txt" | "$T/zstd_frames" 4096 >"$T/b.jsonl.zst"
for x in a:gz b:zst; do
  "$CTITAN" tokenize --tokenizer "$T/tok.model" --format jsonl --field content --input - --output "$T/${x%%:*}.bin" \
    <"$T/${x%%:*}.jsonl.${x#*:}" >"$T/${x%%:*}.tok.log" 2>&1 || { cat "$T/${x%%:*}.tok.log"; fail "tokenize ${x%%:*} from stdin"; }
  docs=$(jsonl "$T/${x%%:*}.txt" | grep -vc "\"content\": \"\"")
  grep -q "^tokenize: .*$docs documents" "$T/${x%%:*}.tok.log" || { cat "$T/${x%%:*}.tok.log"; fail "tokenize ${x%%:*}: not $docs documents"; }
done
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$T/v.txt" --output "$T/v.bin" >/dev/null || fail "tokenize v"
printf 'tiny' >"$T/short.txt"
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$T/short.txt" --output "$T/short.bin" >/dev/null || fail "tokenize short"
cat >"$T/mix.yaml" <<YAML
model: {name: llama3, flavor: debugmodel, n_layers: 2, vocab_size: 512}
training:
  dataset:
    - path: a.bin
      weight: 3
    - {path: b.bin, weight: 1}
  seq_len: 32
  local_batch_size: 4
  global_batch_size: 8
  steps: 6
validation:
  enable: true
  dataset: v.bin
  freq: 2
YAML
common=("$T/mix.yaml" --metrics.log_freq=1 --generate.max_new_tokens=0 --device.threads=1 --lr_scheduler.warmup_steps=2
        --activation_checkpoint.mode=none --training.mixed_precision_param=float32 --comm.train_timeout_seconds=120)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi ||
    { tail -20 "$T/$name.log"; fail "$name run"; }
}
val() { grep '"event": "validation"' "$T/$1/metrics.jsonl" | sed 's/.*"step": \([0-9]*\), "validation_loss": \([^,]*\),.*/\1 \2/'; }
steps() { grep '"loss"' "$T/$1/metrics.jsonl" | cut -d, -f1-3; } # step, loss, grad_norm (9 digits)
same_val() { # ref run: the same validation steps, losses within CURVE_TOL
  paste -d' ' <(val "$1") <(val "$2") | awk -v name="$2" -v tol="$CURVE_TOL" '
    { d = $2 - $4; if (d < 0) d = -d; g = d / $2; if (g > w) w = g
      if ($1 != $3 || g > tol || NF != 4) bad = 1 }
    END { printf "%s %s: validation losses at %d steps, max rel gap %.1e\n", (bad || NR != 4) ? "FAIL" : "ok  ", name, NR, w
          exit bad || NR != 4 }'
}

# 1. one rank: the mixture and the validation schedule
run single 1
grep -q "^data: 2 sources mixed by weight, in periods of 1000 sequences: \[0\] [^ ]*/a.bin weight 3: 750 per period (75.00%), .*; \[1\] [^ ]*/b.bin weight 1: 250 per period (25.00%)" "$T/single.log" ||
  { grep "^data" "$T/single.log"; fail "the data line does not show the 3:1 mixture"; }
[ "$(val single | cut -d' ' -f1 | tr '\n' ' ')" = "1 2 4 6 " ] || fail "validation steps: $(val single | tr '\n' ' ')"
seqs=$(sed -n 's/^validation: .* held-out tokens in 1 source, \([0-9]*\) sequences of 32; at step 1 and every 2 steps, .*: the whole set$/\1/p' "$T/single.log")
[ -n "$seqs" ] || fail "no validation line: $(grep '^validation' "$T/single.log")"
grep -qE "^validate: step 6  loss +[0-9.]+  \($(((seqs + 7) / 8)) batches, $((seqs * 32)) tokens, " "$T/single.log" ||
  fail "the validate line does not cover the $seqs held-out sequences once: $(grep '^validate: step 6' "$T/single.log")"
echo "ok   mixture 3:1 in the data line; $(grep '^validation:' "$T/single.log")"

# 2. validation off: the training losses are bit-identical
run off 1 --validation.enable=false
cmp -s <(steps single) <(steps off) || { diff <(steps single) <(steps off); fail "validation changed the training losses"; }
grep -q validation "$T/off/metrics.jsonl" && fail "validation records with validation off"
echo "ok   validation on vs off: 6 training losses and grad norms bit-identical"

# 3. every layout: the same training and validation losses as one rank
one=(--training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1)
run fsdp2 2 --parallelism.data_parallel_shard_degree=2
run ddp2 2 --training.local_batch_size=4 --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1
run tp2 2 "${one[@]}" --parallelism.tensor_parallel_degree=2
run pp2 2 "${one[@]}" --parallelism.pipeline_parallel_degree=2
run cp2 2 "${one[@]}" --parallelism.context_parallel_degree=2
run hsdp2x2 4 --training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=2
grep -q "strategy fsdp" "$T/fsdp2.log" || fail "fsdp2 did not run FSDP"
for r in fsdp2 ddp2 tp2 pp2 cp2 hsdp2x2; do
  same_curve "$r vs single (training)" "$T/single/metrics.jsonl" "$T/$r/metrics.jsonl" 6 || exit 1
  same_val single $r || exit 1
done

# bf16 compute: validation reads the bf16 copies of the weights the last step left
bf=--training.mixed_precision_param=bfloat16
run bf16 1 $bf
run bf16_off 1 $bf --validation.enable=false
run bf16_fsdp2 2 $bf --parallelism.data_parallel_shard_degree=2
cmp -s <(steps bf16) <(steps bf16_off) || fail "bf16: validation changed the training losses"
same_val bf16 bf16_fsdp2 || exit 1

# 4. stopped after step 3 and resumed: bit-identical training and validation losses
ck=(--checkpoint.enable=true --checkpoint.interval=3 --checkpoint.last_save_model_only=false)
run part 1 "${ck[@]}" --training.steps=3 --lr_scheduler.total_steps=6 # the schedule of the whole run
run part 1 "${ck[@]}"
grep -q "resuming after step 3" "$T/part.log" || fail "did not resume after step 3"
cmp -s <(steps single) <(steps part) || { diff <(steps single) <(steps part); fail "resumed training losses differ"; }
cmp -s <(val single) <(val part) || { diff <(val single) <(val part); fail "resumed validation losses differ"; }
echo "ok   stopped after step 3 and resumed: training and validation losses bit-identical to the whole run"
# another mixture reads other sequences at the same positions: a resume under it is refused, naming it
"$CTITAN" train "${common[@]}" --job.dump_folder="$T/part" "${ck[@]}" --training.steps=8 "--training.dataset[1].weight=2" \
  >"$T/mixchg.out" 2>"$T/mixchg.err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$T/mixchg.err")" -eq 1 ] &&
  grep -q 'written with training.dataset "a.bin weight 3; b.bin weight 1"; this run has "a.bin weight 3; b.bin weight 2" (set checkpoint.allow_config_change' "$T/mixchg.err" ||
  { cat "$T/mixchg.err"; fail "a resume under another mixture: status $rc"; }
echo "ok   a resume under another mixture is refused: $(cat "$T/mixchg.err")"

# 5. the list on the command line and in --print-config
"$CTITAN" train "${common[@]}" --job.dump_folder="$T/cfg" --training.steps=1 --print-config >"$T/cfg.log" 2>&1 || fail "print-config run"
grep -A4 '^  dataset:$' "$T/cfg.log" | tr -s ' ' | tr '\n' '|' | grep -q '| - path: "a.bin"| weight: 3| - path: "b.bin"| weight: 1|' ||
  { grep -A4 '^  dataset:$' "$T/cfg.log"; fail "print-config does not show the list"; }
run w1 1 --training.steps=1 "--training.dataset[0].weight=1" --validation.steps=2
grep -q "\[0\] [^ ]*/a.bin weight 1: 500 per period (50.00%)" "$T/w1.log" || fail "--training.dataset[0].weight=1: $(grep '^data' "$T/w1.log")"
grep -q "^validate: step 1  loss .*(2 batches, 512 tokens" "$T/w1.log" || fail "validation.steps=2: $(grep '^validate' "$T/w1.log")"
run path 1 --training.steps=1 --training.dataset="$T/a.bin"
a_tokens=$("$CTITAN" tokenize --check "$T/a.bin" | sed -n 's/.*, \([0-9]*\) tokens, .*/\1/p')
grep -q "^data: $a_tokens tokens" "$T/path.log" && ! grep -q "sources mixed" "$T/path.log" || fail "--training.dataset=PATH: $(grep '^data' "$T/path.log")"
echo "ok   --print-config shows the list; --training.dataset[0].weight=1 gives 1:1; --training.dataset=PATH replaces the list; validation.steps=2: 2 batches"

# 6. bad input: status 2, one line naming file:line: key
fails=0
expect() { # name pattern yaml-text [args...]
  local name=$1 pat=$2 text=$3; shift 3
  printf '%s\n' "$text" >"$T/bad.yaml"
  "$CTITAN" train "$T/bad.yaml" --job.dump_folder="$T/bad" "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qE -- "$pat" "$T/err"; then echo "ok   $name: $(cat "$T/err")"
  else echo "FAIL $name: status $rc, wanted /$pat/:"; sed 's/^/     /' "$T/err"; fails=$((fails + 1)); fi
}
m='model: {name: llama3, flavor: debugmodel, n_layers: 1, vocab_size: 512}'
tr="training: {seq_len: 32, local_batch_size: 2, steps: 1"
expect "weight 0" "bad.yaml:4: training.dataset\[1\].weight: expected a number in \(0, 1e12\], got '0'" \
  "$m
$tr, dataset: [{path: a.bin, weight: 1},
  {path: b.bin,
   weight: 0}]}"
expect "negative weight" "bad.yaml:2: training.dataset\[0\].weight: .* got '-2'" "$m
$tr, dataset: [{path: a.bin, weight: -2}]}"
expect "missing source" "bad.yaml:3: training.dataset\[1\].path: (.*/)?nothing.bin: dataset not found" "$m
training:
  dataset: [{path: a.bin}, {path: nothing.bin}]
  seq_len: 32"
expect "source too short" "bad.yaml:3: training.dataset\[1\].path: .*short.bin: [0-9]+ tokens are not enough for one sequence of 32 \+ 1" "$m
$tr, dataset: [{path: a.bin},
  {path: short.bin}]}"
expect "no path" "bad.yaml:2: training.dataset\[0\].path: not set" "$m
$tr, dataset: [{weight: 2}]}"
expect "dataset and dataset_path" "bad.yaml:4: training.dataset: set together with .*bad.yaml:3: training.dataset_path" "$m
training:
  dataset_path: a.bin
  dataset: b.bin"
expect "validation without a dataset" "bad.yaml:3: validation.enable: true, but neither validation.dataset nor validation.dataset_path" "$m
$tr, dataset: a.bin}
validation: {enable: true}"
expect "validation.freq 0" "bad.yaml:3: validation.freq: expected an integer in \[1, 1e12\], got '0'" "$m
$tr, dataset: a.bin}
validation: {enable: true, dataset: v.bin, freq: 0}"
expect "validation.steps 0" "bad.yaml:3: validation.steps: 0 batches" "$m
$tr, dataset: a.bin}
validation: {enable: true, dataset: v.bin, steps: 0}"
expect "weight on a validation source" "bad.yaml:3: validation.dataset\[0\].weight: validation reads every source whole" "$m
$tr, dataset: a.bin}
validation: {enable: true, dataset: [{path: v.bin, weight: 2}]}"
expect "item index past the list" "command line: --training.dataset\[2\].weight: training.dataset has 2 items \(0 to 1\)" "$m
$tr, dataset: [{path: a.bin}, {path: b.bin}]}" "--training.dataset[2].weight=2"
expect "list of plain values" "bad.yaml:2: training.dataset\[1\]: a list of maps takes maps only" "$m
$tr, dataset: [{path: a.bin}, b.bin]}"
[ $fails -eq 0 ] || exit 1
