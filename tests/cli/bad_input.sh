#!/usr/bin/env bash
# Bad input gets one clear line naming the file and line or key, and exit status 2; never a crash.
set -u
CTITAN=${CTITAN:-build/ctitan}; BUILD=${BUILD:-build}
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

good="$T/good.yaml"
cat >"$good" <<YAML
job: {dump_folder: $T/out}
model: {name: llama3, flavor: debugmodel, n_layers: 1}
training: {steps: 1, seq_len: 16, local_batch_size: 1, dataset_path: $T/data.bin}
YAML

printf 'job:\n  dump_folder: x\n training: [oops\n' >"$T/syntax.yaml"
expect "yaml syntax error" "syntax.yaml:[0-9]+" "YAML syntax error" -- train "$T/syntax.yaml"

printf 'training:\n  seq_len: 16\n  stpes: 10\n' >"$T/unknown.yaml"
expect "unknown key" "unknown.yaml:3" "training.stpes" "unknown key" -- train "$T/unknown.yaml"

printf 'trainning:\n  steps: 10\n' >"$T/section.yaml"
expect "unknown section" "section.yaml:2" "trainning.steps" "unknown key" -- train "$T/section.yaml"

printf 'training:\n  steps: ten\n' >"$T/type.yaml"
expect "wrong type" "type.yaml:2" "training.steps" "expected an integer" -- train "$T/type.yaml"

printf 'optimizer:\n  lr: fast\n' >"$T/float.yaml"
expect "wrong float" "float.yaml:2" "optimizer.lr" "expected a number" -- train "$T/float.yaml"

expect "unknown override key" "command line" "training.nope" "unknown key" -- train "$good" --training.nope=1
expect "wrong override type" "command line" "training.steps" "expected an integer" -- train "$good" --training.steps=1.5

printf 'model:\n  name: nosuchmodel\n' >"$T/plugin.yaml"
expect "unknown plugin" "plugin.yaml:2" "model.name" "not found" -- train "$T/plugin.yaml"

printf 'model:\n  name: cpu\n' >"$T/kind.yaml"
expect "plugin of the wrong kind" "kind.yaml:2" "model.name" "is a device plugin" -- train "$T/kind.yaml"

printf 'model:\n  flavor: 9000B\n' >"$T/flavor.yaml"
expect "unknown flavor" "flavor.yaml:2" "model.flavor" "unknown flavor" -- train "$T/flavor.yaml"

printf 'device:\n  thread: 2\n' >"$T/devopt.yaml"
expect "unknown plugin option" "devopt.yaml:2" "device.thread" "known: .*threads" -- train "$T/devopt.yaml"

# plugins built the way a third party would: one with the wrong ABI major, one without the entry symbol
PC=$(PKG_CONFIG_PATH="$BUILD" pkg-config --cflags ctitan-sdk)
cat >"$T/abi.c" <<'C'
#include "ctitan/model.h"
CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *h, ct_plugin_info *info) {
    (void)h; static const ct_model_api api = {sizeof api};
    info->abi_major = 99; info->abi_minor = 0; info->kind = CT_KIND_MODEL;
    info->name = "future"; info->api = &api; return CT_OK;
}
C
cat >"$T/noentry.c" <<'C'
#include "ctitan/model.h"
CT_EXPORT int some_other_symbol(void) { return 1; }
C
cc $PC -shared -o "$T/abi.so" "$T/abi.c" && cc $PC -shared -o "$T/noentry.so" "$T/noentry.c" || { echo "FAIL cannot build test plugins"; exit 1; }
printf 'model:\n  name: ./abi.so\n' >"$T/abi.yaml"
expect "plugin with a wrong ABI major" "abi.yaml:2" "model.name" "built against ctitan ABI 99\.0; this host speaks ABI [0-9]+\.[0-9]+" "rebuild" -- train "$T/abi.yaml"
printf 'model:\n  name: ./noentry.so\n' >"$T/noentry.yaml"
expect "plugin missing its entry symbol" "noentry.yaml:2" "model.name" "does not export 'ctitan_plugin_entry'" -- train "$T/noentry.yaml"

# token shards: corrupt magic, truncated, missing
printf 'NOTASHARD-------------------------------------' >"$T/data.bin"
expect "corrupt token shard" "good.yaml" "training.dataset_path" "data.bin" -- train "$good"
printf 'CTTOKENS\001\000\000\000\004\000\000\000\100\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\001\000\000\000' >"$T/data.bin"
expect "truncated token shard" "training.dataset_path" "data.bin" "truncated" -- train "$good"
rm -f "$T/data.bin"
expect "missing dataset" "training.dataset_path" "data.bin" "not found" -- train "$good"

expect "no manifest" "no manifest" -- train
expect "missing manifest" "nothere.yaml" "cannot open" -- train "$T/nothere.yaml"
expect "unknown command" "unknown command" -- frobnicate

# every command's usage errors are bad input (CT_ERR_INVALID, which main.c alone maps to 2) and its
# --help exits 0 with nothing on stderr
expect "launch usage" "launch" "expected -n N" -- launch
expect "launch ranks" "launch" "-n needs a positive number" -- launch -n 0 train
expect "generate usage" "no manifest" -- generate
expect "tokenize usage" "tokenize" "--tokenizer FILE is required" -- tokenize
expect "tokenizer usage" "tokenizer" "missing subcommand" -- tokenizer
expect "convert usage" "convert" "exactly one of --to hf and --from hf" -- convert
expect "schedule usage" "schedule" "--name is required" -- schedule
for c in train generate launch tokenize tokenizer convert schedule plugins; do
  if "$CTITAN" $c --help >/dev/null 2>"$T/err" && [ ! -s "$T/err" ]; then echo "ok   $c --help: status 0"
  else echo "FAIL $c --help: not status 0 with an empty stderr"; fails=$((fails+1)); fi
done

echo
[ $fails -eq 0 ] && echo "bad_input: all cases gave one line and status 2" || echo "bad_input: $fails case(s) failed"
exit $fails
