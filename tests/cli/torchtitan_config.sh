#!/usr/bin/env bash
# torchtitan's config habits: bare boolean flags (--key, --no-key, --section.no-key, --key=false), values
# of inactive features checked on every run, torchtitan v0.2.2 TOML configs (its debug config trains),
# torchtitan keys ctitan has none of accepted or refused by name, and TOML errors. Every refusal is
# status 2 and one line naming where.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
fails=0
# expect NAME PATTERN... -- ARGS: runs ctitan ARGS, wants status 2, one stderr line matching every PATTERN
expect() {
  local name=$1; shift; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  "$CTITAN" "$@" >"$T/out" 2>"$T/err"; local rc=$?
  local lines; lines=$(wc -l <"$T/err")
  local ok=1
  [ "$rc" -eq 2 ] || ok=0
  [ "$lines" -eq 1 ] || ok=0
  for p in "${pats[@]}"; do grep -qE -- "$p" "$T/err" || ok=0; done
  if [ $ok -eq 1 ]; then echo "ok   $name: $(cat "$T/err")"
  else echo "FAIL $name: status $rc, $lines stderr lines, wanted /${pats[*]}/:"; sed 's/^/     /' "$T/err"; fails=$((fails+1)); fi
}
# value NAME KEY WANT ARGS...: `ctitan train ARGS --print-config --dry-run` succeeds and prints KEY: WANT
value() {
  local name=$1 key=$2 want=$3; shift 3
  if ! "$CTITAN" train "$@" --print-config --dry-run >"$T/out" 2>"$T/err"; then
    echo "FAIL $name: status $?:"; sed 's/^/     /' "$T/err"; fails=$((fails+1)); return
  fi
  local got; got=$(awk -v s="${key%%.*}:" -v k="  ${key#*.}:" '$0 == s {on = 1; next} /^[^ ]/ {on = 0} on && index($0, k) == 1 {gsub(/"/, "", $2); print $2}' "$T/out")
  if [ "$got" = "$want" ]; then echo "ok   $name: $key = $got"
  else echo "FAIL $name: $key = '$got', wanted '$want'"; fails=$((fails+1)); fi
}

. tests/cli/lib/data.sh
test_data "$T" 512 || { echo "FAIL test data"; exit 1; }
good="$T/good.yaml"
cat >"$good" <<YAML
job: {dump_folder: $T/out}
model: {name: llama3, flavor: debugmodel, n_layers: 1, vocab_size: 512}
training: {steps: 1, seq_len: 16, local_batch_size: 1, dataset_path: $T/data.bin}
device: {threads: 1}
YAML

# ---- bare booleans, as torchtitan's command line takes them ----
value "bare flag is true" checkpoint.enable true "$good" --checkpoint.enable
value "bare flag before another flag" checkpoint.enable true "$good" --checkpoint.enable --training.steps=2
value "bare flag before the manifest" checkpoint.enable true --checkpoint.enable "$good"
value "--no-section.key is false" checkpoint.create_seed_checkpoint false "$good" --checkpoint.create_seed_checkpoint --no-checkpoint.create_seed_checkpoint
value "--section.no-key (tyro) is false" checkpoint.initial_load_model_only false "$good" --checkpoint.no-initial-load-model-only
value "--section.no_key is false" checkpoint.initial_load_model_only false "$good" --checkpoint.no_initial_load_model_only
value "--key=false" checkpoint.enable false "$good" --checkpoint.enable=false
value "--key false" checkpoint.enable false "$good" --checkpoint.enable false
value "a plugin's boolean bare" parallelism.enable_sequence_parallel false "$good" --parallelism.no-enable-sequence-parallel
value "--key value still works" training.steps 7 "$good" --training.steps 7
value "tyro's dashes" training.local_batch_size 2 "$good" --training.local-batch-size=2
if "$CTITAN" plan "$good" --checkpoint.enable --hardware h100-sxm --gpus 1 --no-compile.enable >/dev/null 2>"$T/err"; then
  echo "ok   ctitan plan takes bare flags before its own options"
else echo "FAIL ctitan plan with bare flags:"; sed 's/^/     /' "$T/err"; fails=$((fails+1)); fi
expect "bare non-boolean" "command line: --training.steps" "needs a value" "an integer" -- train "$good" --training.steps
expect "bare non-boolean before a flag" "command line: --training.steps" "needs a value" -- train "$good" --training.steps --checkpoint.enable
expect "bare plugin string" "command line: --parallelism.fsdp_reshard_after_forward" "needs a value" -- train "$good" --parallelism.fsdp_reshard_after_forward
expect "negated non-boolean" "command line: --no-training.steps" "not a true/false key" -- train "$good" --no-training.steps
expect "negated with a value" "command line: --no-checkpoint.enable=true" "takes no value" -- train "$good" --no-checkpoint.enable=true
expect "bare flag with a bad value" "command line: --checkpoint.enable" "expected true or false" -- train "$good" --checkpoint.enable=maybe

# ---- values of features that are off are checked all the same ----
inactive() { # name key value pattern
  printf '%s\n' "$(cat "$good")" "$2" >"$T/inactive.yaml"
  expect "$1" "inactive.yaml:5" "$3" -- train "$T/inactive.yaml" --dry-run
}
inactive "float8 format with float8 off" "quantize: {dense: {float8: {format: mxpf8}}}" "did you mean 'mxfp8'"
inactive "schedule at pipeline degree 1" "parallelism: {pipeline_parallel_schedule: 1FB1}" "unknown pipeline schedule '1FB1'"
inactive "selective option with ac off" "activation_checkpoint: {mode: none, selective_ac_option: every2}" "selective_ac_option: expected 'op'"
inactive "stage units at pipeline degree 1" "parallelism: {pipeline_parallel_stage_units: \"3;3\"}" "pipeline_parallel_stage_units: expected positive unit counts"
inactive "exclude list with checkpoints off" "checkpoint: {exclude_from_loading: [optimiser]}" "expected a list of optimizer, lr_scheduler, dataloader"
inactive "validation seq_len with validation off" "validation: {seq_len: 32}" "validation.seq_len: 32; validation windows"
inactive "unknown converter" "model: {converters: [float8, quantize.grouped_mm.fp8]}" "unknown converter 'quantize.grouped_mm.fp8'.*quantize.grouped_mm.float8"
inactive "plugin choice with cp 1" "parallelism: {context_parallel_rotate_method: ring}" "expected allgather, alltoall or ulysses"

# ---- torchtitan's TOML: the debug config trains ----
("$CTITAN" train configs/torchtitan/llama3_debugmodel.toml --training.steps=3 --training.seq_len=32 \
  --training.local_batch_size=2 --training.dataset_path="$T/data.bin" --job.dump_folder="$T/tt" --device.threads=1 \
  --model.vocab_size=512 >"$T/tt.log" 2>&1)
rc=$?; steps=$(grep -c '"step"' "$T/tt/metrics.jsonl" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$steps" = 3 ] && grep -q '^step     3  loss' "$T/tt.log"; then echo "ok   debug TOML trains 3 steps"
else echo "FAIL debug TOML: status $rc, $steps metrics lines"; tail -5 "$T/tt.log" | sed 's/^/     /'; fails=$((fails+1)); fi
# generating reads no data: the config's dataset name (c4_test) is no reason to refuse it
out=$("$CTITAN" generate configs/torchtitan/llama3_debugmodel.toml --job.dump_folder="$T/tt" --device.threads=1 \
  --model.tokenizer_path="$T/tok.model" --prompt "the" --generate.max_new_tokens=4 2>&1); rc=$?
if [ $rc -eq 0 ]; then echo "ok   generate on the debug TOML (training.dataset = \"c4_test\") samples"
else echo "FAIL generate on the debug TOML: status $rc"; echo "$out" | tail -3 | sed 's/^/     /'; fails=$((fails+1)); fi
tt=configs/torchtitan/llama3_debugmodel.toml
value "TOML float" optimizer.lr 0.0008 "$tt" --training.dataset_path="$T/data.bin"
value "TOML list" quantize.linear.float8.filter_fqns output "$tt" --training.dataset_path="$T/data.bin"
value "TOML string" activation_checkpoint.selective_ac_option 2 "$tt" --training.dataset_path="$T/data.bin"
value "bare flag over TOML" checkpoint.enable true "$tt" --training.dataset_path="$T/data.bin" --checkpoint.enable
expect "named dataset without a path" "llama3_debugmodel.toml:52: training.dataset" "'c4_test' is a torchtitan dataset name" "training.dataset_path" -- train "$tt"
expect "named validation set when on" "llama3_debugmodel.toml:86: validation.dataset" "c4_validation" -- train "$tt" --training.dataset_path="$T/data.bin" --validation.enable

# ---- TOML errors and torchtitan's keys ----
toml() { printf "$2" >"$T/$1.toml"; }
toml syntax '[training]\nsteps = 3\nseq_len = = 4\n'
expect "TOML syntax error" "syntax.toml:3:[0-9]+: TOML syntax error" -- train "$T/syntax.toml"
toml type '[job]\ndump_folder = "x"\n\n[training]\nsteps = "three"\n'
expect "TOML wrong type" "type.toml:5: training.steps: expected an integer, got 'three'" -- train "$T/type.toml"
toml bool '[checkpoint]\nenable = 1\n'
expect "TOML number for a boolean" "bool.toml:2: checkpoint.enable: expected true or false" -- train "$T/bool.toml"
toml date '[job]\ndescription = 2024-01-01\n'
expect "TOML date" "date.toml:2: job.description: a date or time" -- train "$T/date.toml"
toml top 'steps = 3\n'
expect "TOML top-level key" "top.toml:1: steps: a top-level key must be a section" -- train "$T/top.toml"
toml nested '[training]\nsteps = [[1, 2]]\n'
expect "TOML list of lists" "nested.toml:2: training.steps: list items must be plain values" -- train "$T/nested.toml"
toml unknown '[training]\nstpes = 3\n'
expect "TOML unknown key" "unknown.toml:2: training.stpes: unknown key" -- train "$T/unknown.toml"
printf '[training]\nsteps = 3\n' >"$T/toml_named.yaml" # TOML text under another suffix
value "TOML in a .yaml file" training.steps 3 "$T/toml_named.yaml"
toml refused '[training]\nsteps = 3\n[parallelism]\nmodule_fqns_per_model_part = [["tok_embeddings"]]\n'
expect "refused key" "refused.toml:4: parallelism.module_fqns_per_model_part" "pipeline_parallel_stage_units" -- train "$T/refused.toml"
toml refused2 '[parallelism]\nmodule_fqns_per_model_part = "a"\n'
expect "refused key by name" "refused2.toml:2: parallelism.module_fqns_per_model_part: torchtitan's key is not supported" -- train "$T/refused2.toml"
toml wandb '[metrics]\nenable_wandb = true\n'
expect "wandb refused naming TensorBoard" "wandb.toml:2: metrics.enable_wandb" "TensorBoard" -- train "$T/wandb.toml"
toml offload '[training]\nenable_cpu_offload = true\n'
expect "cpu offload refused" "offload.toml:2: training.enable_cpu_offload: only false is accepted" -- train "$T/offload.toml"
toml components '[compile]\ncomponents = ["model", "optimizer"]\n'
expect "compile.components" "components.toml:2: compile.components: only model or loss" -- train "$T/components.toml"
toml seed '[debug]\nseed = 5\n[training]\nseed = 6\n'
expect "debug.seed against training.seed" "seed.toml:2: debug.seed: '5' disagrees with .*seed.toml:4: training.seed" -- train "$T/seed.toml"
value "debug.seed maps" training.seed 5 "$good" --debug.seed=5
value "old [float8] section maps" quantize.dense.float8.filter_fqns "output,wo" "$good" --float8.filter_fqns=output,wo --model.converters=float8
value "color printing accepted" metrics.log_freq 10 "$good" --metrics.disable_color_printing
value "precompute accepted" metrics.log_freq 10 "$good" --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp
value "dataloader workers accepted (no effect)" metrics.log_freq 10 "$good" --training.dataloader.num_workers=2 \
  --training.dataloader.persistent_workers=true --validation.dataloader.num_workers=2

# ---- ctitan config import: the debug config as a YAML manifest that reads the same ----
if "$CTITAN" config import "$tt" --output "$T/imported.yaml" 2>"$T/err" &&
   "$CTITAN" train "$tt" --training.dataset_path="$T/data.bin" --print-config --dry-run >"$T/from_toml" 2>&1 &&
   "$CTITAN" train "$T/imported.yaml" --training.dataset_path="$T/data.bin" --print-config --dry-run >"$T/from_yaml" 2>&1 &&
   diff <(sed -n '/^[a-z_]*:$/,$p' "$T/from_toml" | grep -v "^  description:") \
        <(sed -n '/^[a-z_]*:$/,$p' "$T/from_yaml" | grep -v "^  description:") >"$T/diff" &&
   grep -q "^# metrics.disable_color_printing: " "$T/imported.yaml" &&
   grep -q "^# training.dataset: c4_test  (line 52: a torchtitan dataset name" "$T/imported.yaml"; then
  echo "ok   config import: the YAML manifest's effective config is the TOML's"
else echo "FAIL config import:"; cat "$T/err" "$T/diff" 2>/dev/null | head -20 | sed 's/^/     /'; fails=$((fails+1)); fi
expect "config import of a refused key" "refused2.toml:2: parallelism.module_fqns_per_model_part" -- config import "$T/refused2.toml"
expect "config import of a syntax error" "syntax.toml:3:[0-9]+: TOML syntax error" -- config import "$T/syntax.toml" --output "$T/never.yaml"
[ ! -e "$T/never.yaml" ] && echo "ok   config import writes nothing on an error" || { echo "FAIL config import left $T/never.yaml"; fails=$((fails+1)); }
expect "config without import" "expected .import." -- config export x

# ---- docs/torchtitan_keys.md lists every key of the table ----
missing=0
for k in $(grep -o '^ *{"[a-z0-9_.]*"' core/config/torchtitan_keys.c | sed 's/.*{"//; s/"//'); do
  grep -q "| \`$k\` |" docs/torchtitan_keys.md || { echo "FAIL docs/torchtitan_keys.md does not list $k"; missing=1; }
done
[ $missing -eq 0 ] && echo "ok   docs/torchtitan_keys.md lists every key" || fails=$((fails+1))

[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"
