#!/usr/bin/env bash
# plugin_options: every plugin a manifest names has its options checked, whether or not the run
# creates it, and `ctitan plugins` says what a file is.
#   - a schedule's options (ReverseGPipe's reverse_group, built here from sdk/examples) are taken by
#     `ctitan schedule --parallelism.KEY=VALUE` and from a manifest, checked for type and range on
#     one rank and in --dry-run, and reach the schedule in a PP 2 run;
#   - a strategy's options (fsdp's reshard policy, a probe strategy's int in [0, 3]) and float8's
#     are accepted on one rank and in --dry-run, where the plugin is not created, and a wrong value
#     is refused naming the key;
#   - `ctitan plugins FOLDER` lists every file there (a plugin not named ctitan-*.so included) and
#     says why each other one is not a plugin; `ctitan plugins FILE` describes one plugin.
set -u
. tests/cli/lib/data.sh
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
fails=0
# expect NAME STATUS PATTERN... -- ARGS: runs ctitan ARGS; status STATUS and, for a failure, one
# stderr line matching every PATTERN (for success, the patterns are looked for in stdout)
expect() {
  local name=$1 want=$2; shift 2; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  "$CTITAN" "$@" >"$T/out" 2>"$T/err"; local rc=$? ok=1 where="$T/out"
  [ "$rc" -eq "$want" ] || ok=0
  if [ "$want" -ne 0 ]; then where="$T/err"; [ "$(wc -l <"$T/err")" -eq 1 ] || ok=0; fi
  for p in "${pats[@]}"; do grep -qE -- "$p" "$where" || ok=0; done
  if [ $ok -eq 1 ]; then echo "ok   $name (status $rc)"
  else echo "FAIL $name: status $rc (wanted $want), wanted /${pats[*]}/:"; cat "$T/err" "$T/out" | tail -8 | sed 's/^/     /'
       fails=$((fails+1)); fi
}
WARN=(-std=c11 -Wall -Wextra -Werror -O2 -shared -fPIC -fvisibility=hidden -Isdk/include)
cc "${WARN[@]}" -o "$T/rev.so" sdk/examples/schedule_reverse/reverse_gpipe.c || { echo "FAIL cannot build ReverseGPipe"; exit 1; }
cat >"$T/probe.c" <<'C'
#include <ctitan/strategy.h>
/* a strategy that declares one option and is never created (one rank, --dry-run) */
static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "probe_level", CT_OPT_INT, "1", "a level", "[0, 3]", NULL},
    {0},
};
static const ct_strategy_api api = {.struct_size = sizeof(ct_strategy_api)};
CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *h, ct_plugin_info *info) {
    (void)h;
    info->abi_major = CT_ABI_MAJOR; info->abi_minor = CT_ABI_MINOR; info->kind = CT_KIND_STRATEGY;
    info->name = "probe"; info->description = "declares parallelism.probe_level";
    info->options = options; info->api = &api;
    return CT_OK;
}
C
cc "${WARN[@]}" -o "$T/probe.so" "$T/probe.c" || { echo "FAIL cannot build the probe strategy"; exit 1; }

# ---- a schedule's options through ctitan schedule
sched=(schedule --name "$T/rev.so" --pp 2 --microbatches 4)
expect "schedule option on ctitan schedule" 0 "^rank 0  F0 F1 \.  \.  \.  B1--- B0--- F2 F3" "peak activations 2 " \
  -- "${sched[@]}" --parallelism.reverse_group=2
expect "schedule option as --KEY VALUE" 0 "peak activations 1 " -- "${sched[@]}" --parallelism.reverse_group 1
expect "schedule option default" 0 "peak activations 4 " -- "${sched[@]}"
expect "schedule option out of range" 2 "^ctitan schedule: ReverseGPipe: command line: --parallelism\.reverse_group: expected an integer in \[0, 1048576\], got '-1'$" \
  -- "${sched[@]}" --parallelism.reverse_group=-1
expect "schedule option of the wrong type" 2 "--parallelism\.reverse_group: expected an integer, got 'two'" \
  -- "${sched[@]}" --parallelism.reverse_group=two
expect "schedule option misspelt" 2 "--parallelism\.reverse_grup: unknown key \(known: reverse_group\)" \
  -- "${sched[@]}" --parallelism.reverse_grup=2
expect "option to a schedule without options" 2 "^ctitan schedule: command line: --parallelism\.zbh1_lag: 1F1B declares no options$" \
  -- schedule --name 1F1B --pp 2 --microbatches 4 --parallelism.zbh1_lag=1
expect "schedule option without a value" 2 "no value for --parallelism\.reverse_group" -- "${sched[@]}" --parallelism.reverse_group

# ---- ... and from a manifest: checked on one rank, reaching the schedule under PP 2
test_data "$T" 2048 || { echo "FAIL test data"; exit 1; }
cp "$T/rev.so" "$T/ctitan-rev.so"
printf 'model: {name: llama3, flavor: debugmodel, vocab_size: 2048, n_layers: 2}\nparallelism:\n  pipeline_parallel_schedule: ./ctitan-rev.so\n  reverse_group: 2\n' >"$T/pp.yaml"
run=(--training.dataset_path="$T/data.bin" --training.seq_len=32 --training.local_batch_size=4 --training.steps=1
     --generate.max_new_tokens=0 --device.threads=1 --metrics.log_freq=1)
expect "schedule option in a manifest, --dry-run" 0 "^dry run: " -- train "$T/pp.yaml" --dry-run
expect "schedule option in a manifest, one rank" 0 "^step +1 " -- train "$T/pp.yaml" "${run[@]}" --job.dump_folder="$T/one"
sed 's/reverse_group: 2/reverse_group: 99999999/' "$T/pp.yaml" >"$T/bad.yaml"
expect "schedule option out of range in a manifest" 2 "bad\.yaml:4: parallelism\.reverse_group: expected an integer in \[0, 1048576\]" \
  -- train "$T/bad.yaml" --dry-run
expect "schedule option reaches the schedule under PP 2" 0 "pipeline: ReverseGPipe, 2 stages on 2 ranks .* at most 2 microbatches held" \
  -- launch -n 2 train "$T/pp.yaml" "${run[@]}" --parallelism.pipeline_parallel_degree=2 \
     --parallelism.data_parallel_shard_degree=1 --parallelism.pipeline_parallel_microbatch_size=1 --job.dump_folder="$T/pp"

# ---- a strategy's options where the strategy is not created
m=configs/llama3_debug.yaml
expect "fsdp option on one rank" 0 "^step +1 " -- train $m "${run[@]}" --model.vocab_size=2048 --model.n_layers=1 \
  --parallelism.fsdp_reshard_after_forward=never --job.dump_folder="$T/fsdp1"
expect "fsdp option in --dry-run for 2 ranks" 0 "dp_shard 2" -- train $m --dry-run --parallelism.data_parallel_shard_degree=2 \
  --parallelism.fsdp_reshard_after_forward=always
expect "fsdp option, a choice it does not have" 2 "^ctitan: command line: --parallelism\.fsdp_reshard_after_forward: expected default, always or never, got 'sometimes'" \
  -- train $m --dry-run --parallelism.fsdp_reshard_after_forward=sometimes
expect "fsdp option with no data-parallel strategy" 2 "--parallelism\.fsdp_reshard_after_forward: unknown key" \
  -- train $m --dry-run --parallelism.dp_strategy=none --parallelism.fsdp_reshard_after_forward=never
expect "named strategy's option in --dry-run" 0 "^dry run: " -- train $m --dry-run --parallelism.dp_strategy="$T/probe.so" \
  --parallelism.probe_level=3
expect "named strategy's option out of range" 2 "command line: --parallelism\.probe_level: expected an integer in \[0, 3\], got '4'" \
  -- train $m --dry-run --parallelism.dp_strategy="$T/probe.so" --parallelism.probe_level=4
expect "named strategy's option of the wrong type" 2 "command line: --parallelism\.probe_level: expected an integer, got 'high'" \
  -- train $m --dry-run --parallelism.dp_strategy="$T/probe.so" --parallelism.probe_level=high
expect "float8 option with float8 off" 0 "^dry run: " -- train $m --dry-run --quantize.dense.float8.enable=false \
  --quantize.dense.float8.emulate=true
expect "float8 option of the wrong type with float8 off" 2 "command line: --quantize\.dense\.float8\.emulate: expected true or false" \
  -- train $m --dry-run --quantize.dense.float8.emulate=maybe
expect "named strategy that does not exist" 2 "command line: --parallelism\.dp_strategy: strategy plugin 'nosuch' not found" \
  -- train $m --dry-run --parallelism.dp_strategy=nosuch

# ---- ctitan plugins FOLDER: every file, and why each non-plugin is not one
D="$T/folder"; mkdir -p "$D/subfolder"
cp "$T/rev.so" "$D/any_name.so"
head -c 200 tests/data/tokenizer/corpus.txt >"$D/notes.txt"
echo 'int f(void) { return 1; }' >"$T/lib.c" && cc -shared -fPIC -o "$D/libother.so" "$T/lib.c"
cp "$T/probe.so" "$D/arm.so" && printf '\267\000' | dd of="$D/arm.so" bs=1 seek=18 conv=notrunc 2>/dev/null # e_machine: AArch64
expect "plugins FOLDER: a plugin not named ctitan-*.so" 0 "^schedule +ReverseGPipe +[0-9]+\.[0-9]+ +$D/any_name\.so$" -- plugins "$D"
for want in "arm\.so .*plugin built for ELF machine 183, this process is machine" \
            "libother\.so .*not a ctitan plugin: it does not export 'ctitan_plugin_entry'" \
            "notes\.txt .*not a plugin: no ELF magic"; do
  grep -qE "^\? +$want" "$T/out" && echo "ok   plugins FOLDER: $(grep -oE "$want" "$T/out" | head -1)" \
    || { echo "FAIL plugins FOLDER: no line /$want/"; fails=$((fails+1)); }
done
[ "$(grep -c . "$T/out")" -eq 7 ] && ! grep -q subfolder "$T/out" && echo "ok   plugins FOLDER: a line for each of its 4 files (2 for the plugin) under the 2-line header; the subfolder skipped" \
  || { echo "FAIL plugins FOLDER: $(cat "$T/out")"; fails=$((fails+1)); }
mkdir "$T/empty"
expect "plugins FOLDER without a plugin" 2 "^ctitan plugins: $T/empty: no loadable plugin among its 0 files$" -- plugins "$T/empty"
expect "plugins PATH that does not exist" 2 "^ctitan plugins: $T/nothere\.so: no such file or folder" -- plugins "$T/nothere.so"
expect "plugins FILE that is not a plugin" 2 "^ctitan plugins: $D/libother\.so: not a ctitan plugin" -- plugins "$D/libother.so"

# ---- ctitan plugins FILE: one plugin in full
expect "plugins FILE: a schedule" 0 "^  kind +schedule$" "^  name +ReverseGPipe$" "^  ABI +[0-9]+\.[0-9]+ \(built against; this host speaks" \
  "^  description +pipeline schedule: GPipe" "^    parallelism\.reverse_group  int, default 0, in \[0, 1048576\]$" \
  "^      microbatches per group" -- plugins "$T/rev.so"
expect "plugins FILE: fsdp's choices" 0 "^  kind +strategy$" \
  "^    parallelism\.fsdp_reshard_after_forward  string, default default, one of default\|always\|never$" \
  -- plugins "$(dirname "$CTITAN")/plugins/ctitan-fsdp.so"
expect "plugins --help says what it lists" 0 "every ctitan-\*\.so on the search path" "every file in FOLDER" -- plugins --help
expect "schedule --help documents options" 0 "--parallelism\.KEY=VALUE" -- schedule --help

echo
[ $fails -eq 0 ] && echo "plugin_options: ok" || echo "plugin_options: $fails case(s) failed"
exit $fails
