#!/usr/bin/env bash
# Plugin loading and start-up are safe on hostile or short input: a plugin file is checked before
# dlopen runs any of its code, the manifest's folder is never searched, a model too large (or
# declared badly) fails before allocating, a tight ulimit -v ends in one line within seconds instead
# of spinning in OpenBLAS, and an error seen by every rank of a job is printed once, with its rank.
set -u
CTITAN=${CTITAN:-build/ctitan}; BUILD=${BUILD:-build}
case $CTITAN in /*) ;; *) CTITAN=$(pwd)/$CTITAN ;; esac
. tests/cli/lib/common.sh
test_tmp
counting_fails
# expect NAME STATUS PATTERN... -- CMD...: CMD exits STATUS within 60 s, with one stderr line matching every PATTERN
expect() {
  local name=$1 want=$2; shift 2; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  local t0=$SECONDS
  timeout 60 "$@" >"$T/out" 2>"$T/err"; local rc=$?
  local lines ok=1; lines=$(wc -l <"$T/err")
  [ "$rc" -eq "$want" ] && [ "$lines" -eq 1 ] || ok=0
  for p in "${pats[@]}"; do grep -qE -- "$p" "$T/err" || ok=0; done
  if [ $ok -eq 1 ]; then echo "ok   $name ($((SECONDS-t0)) s): $(cat "$T/err")"
  else fail "$name: status $rc (wanted $want), $lines stderr lines, wanted /${pats[*]}/:"; sed 's/^/     /' "$T/err" | head -5; fi
}
manifest() { printf 'device:\n  name: %s\n' "$2" >"$T/$1.yaml"; }

# ---- the file is checked before dlopen
head -c 3000 "$BUILD/plugins/ctitan-cpu.so" >"$T/trunc.so"
manifest trunc ./trunc.so
expect "truncated ELF" 2 "trunc.yaml:2" "device.name" "trunc.so: truncated: 3000 bytes, the ELF headers say at least [0-9]+" -- "$CTITAN" train "$T/trunc.yaml"
head -c 20 /dev/zero >"$T/short.so"; manifest short ./short.so
expect "shorter than an ELF header" 2 "short.so: not a plugin: 20 bytes" -- "$CTITAN" train "$T/short.yaml"
yes 'not a shared object' | head -c 4096 >"$T/text.so"; manifest text ./text.so
expect "not an ELF file" 2 "text.so: not a plugin: no ELF magic" -- "$CTITAN" train "$T/text.yaml"
cp "$BUILD/plugins/ctitan-cpu.so" "$T/arm.so"; printf '\xb7\x00' | dd of="$T/arm.so" bs=1 seek=18 conv=notrunc 2>/dev/null
manifest arm ./arm.so
expect "ELF for another machine" 2 "arm.so: plugin built for ELF machine 183" -- "$CTITAN" train "$T/arm.yaml"
mkdir "$T/dir.so"; manifest dir ./dir.so
expect "directory named like a plugin" 2 "dir.so: not a plugin: a directory" -- "$CTITAN" train "$T/dir.yaml"
mkfifo "$T/fifo.so"; manifest fifo ./fifo.so
expect "FIFO named like a plugin (no hang)" 2 "fifo.so: not a plugin: a FIFO" -- "$CTITAN" train "$T/fifo.yaml"
# on the search path too: a directory is reported, not skipped for a later folder
mkdir -p "$T/path/ctitan-cpu.so"; manifest byname cpu
expect "directory on the search path" 2 "path/ctitan-cpu.so: not a plugin: a directory" -- \
  env CTITAN_PLUGIN_PATH="$T/path" "$CTITAN" train "$T/byname.yaml"

# ---- the manifest's folder is not searched: a planted ctitan-cpu.so beside it must not load
PC=$(PKG_CONFIG_PATH="$BUILD" pkg-config --cflags ctitan-sdk)
mkdir "$T/untrusted"
cat >"$T/planted.c" <<C
#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen("$T/marker", "w"); if (f) fclose(f); }
C
cc $PC -shared -fPIC -o "$T/untrusted/ctitan-cpu.so" "$T/planted.c" || fail "cannot build the planted plugin"
cat >"$T/untrusted/run.yaml" <<YAML
model: {name: llama3, flavor: debugmodel, n_layers: 1}
training: {steps: 1, seq_len: 16, local_batch_size: 1}
YAML
# (a dry run loads every plugin the manifest names, the device first)
"$CTITAN" train "$T/untrusted/run.yaml" --dry-run >"$T/out" 2>&1; rc=$?
if [ -e "$T/marker" ]; then fail "the ctitan-cpu.so beside the manifest was loaded"
elif [ $rc -eq 0 ]; then echo "ok   planted ctitan-cpu.so beside the manifest not loaded (the build's was)"
else fail "dry run exited $rc: $(head -3 "$T/out")"; fi
cp "$T/untrusted/ctitan-cpu.so" "$T/untrusted/ctitan-planted.so"
printf 'model:\n  name: planted\n' >"$T/untrusted/planted.yaml"
expect "a name found only beside the manifest" 2 "planted.yaml:2" "model plugin 'planted' not found" \
  "the manifest's folder is not searched: name ./ctitan-planted.so" -- "$CTITAN" train "$T/untrusted/planted.yaml"
[ -e "$T/marker" ] && fail "ctitan-planted.so beside the manifest was loaded"
# ... while a manifest that names it by path loads it (its constructor runs, and it is no plugin)
manifest named ./untrusted/ctitan-cpu.so
expect "a plugin named by path is the manifest's choice" 2 "does not export 'ctitan_plugin_entry'" -- "$CTITAN" train "$T/named.yaml"
[ -e "$T/marker" ] && echo "ok   by path it loads" || fail "the plugin named by path was not loaded"

# ---- parameter registration: linear, overflow-checked, and too-large models fail before allocating
cat >"$T/model.c" <<'C'
#include "ctitan/model.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* MODE=many: 300000 parameters of 2^20 floats (1.2 TB); dup: one name twice; huge: a 2^80 shape */
static const char *const flavors[] = {"x", NULL};
static const ct_host *host;
static ct_status create(const ct_host *h, const ct_model_config *c, ct_model **m) { (void)c; host = h; *m = (ct_model *)1; return CT_OK; }
static void destroy(ct_model *m) { (void)m; }
static ct_status describe(ct_model *m, ct_model_desc *d) {
    (void)m; d->n_units = 2; d->vocab_size = 16; d->dim = 4; d->n_layers = 0; d->n_params = 1;
    d->n_heads = d->n_kv_heads = 1; d->head_dim = d->ffn_hidden = 4; return CT_OK;
}
static ct_status declare(ct_model *m, ct_param_registry *r) {
    (void)m;
    const char *mode = getenv("MODE");
    ct_init in = {sizeof in, CT_INIT_CONSTANT, 0, 0, 0, 0};
    int64_t shape[2] = {1 << 20, 1};
    char name[32];
    int n = !strcmp(mode, "many") ? 300000 : 2;
    if (!strcmp(mode, "huge")) { shape[0] = (int64_t)1 << 40; shape[1] = (int64_t)1 << 40; }
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "p%d", !strcmp(mode, "dup") ? 0 : i);
        if (!r->add(r, i % 2, name, 2, shape, &in, 0)) return CT_ERR_INVALID;
    }
    return CT_OK;
}
static const char *unit_name(ct_model *m, int u) { (void)m; return u ? "head" : "embed"; }
static const ct_model_api api = {sizeof api, flavors, create, destroy, describe, declare, unit_name, NULL, NULL};
CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *h, ct_plugin_info *info) {
    (void)h; info->abi_major = CT_ABI_MAJOR; info->abi_minor = CT_ABI_MINOR; info->kind = CT_KIND_MODEL;
    info->name = "stress"; info->description = "declares what MODE says"; info->api = &api; return CT_OK;
}
C
cc $PC -shared -fPIC -o "$T/stress.so" "$T/model.c" || fail "cannot build the stress model"
printf 'model: {name: ./stress.so, flavor: x}\ntraining: {steps: 1, seq_len: 4, local_batch_size: 1}\n' >"$T/stress.yaml"
expect "300000 parameters of 4 MiB: linear check, refused before allocating" 2 "model: 314.57B parameters need 2343.75 GiB" "more than (the device's memory|what the address-space limit)" -- \
  env MODE=many "$CTITAN" train "$T/stress.yaml"
expect "a parameter declared twice" 2 "parameter 'p0' declared twice" -- env MODE=dup "$CTITAN" train "$T/stress.yaml"
expect "a shape past 2^61 elements" 2 "parameter 'p0' has a dimension below 1 or more than 2\^61 elements" -- \
  env MODE=huge "$CTITAN" train "$T/stress.yaml"

# ---- tight address-space limits: one line and a non-zero exit, never a spin (sanitizers need more
# address space than any of these, so a sanitizer build skips them)
. tests/cli/lib/data.sh
test_data "$T" 512 || fail "test data"
run=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.tokenizer_path="$T/tok.model"
     --job.dump_folder="$T/dump" --training.steps=1 --training.seq_len=32 --model.vocab_size=512
     --generate.max_new_tokens=0 --metrics.log_freq=1)
if nm "$CTITAN" 2>/dev/null | grep -q __asan_init; then
  echo "skip ulimit cases: sanitizer build"
else
  for kb in 80000 150000 300000 450000 600000; do
    expect "ulimit -v $kb" 2 "ulimit -v $kb KiB" -- bash -c "ulimit -v $kb; exec \"\$0\" train \"\$@\"" "$CTITAN" "${run[@]}"
  done
  # OpenBLAS maps a buffer per OMP_NUM_THREADS thread as it loads: the loader has it load with one
  expect "ulimit -v 450000 with OMP_NUM_THREADS=16" 2 "ulimit -v 450000 KiB" -- \
    env OMP_NUM_THREADS=16 bash -c "ulimit -v 450000; exec \"\$0\" train \"\$@\"" "$CTITAN" "${run[@]}"
  # and with room enough the limited path trains (one thread: the room OpenBLAS needs is 128 MiB)
  (ulimit -v 1500000; timeout 60 "$CTITAN" train "${run[@]}" --device.threads=1 --model.n_layers=1) >"$T/out" 2>&1 \
    && grep -q '^step *1 ' "$T/out" && echo "ok   ulimit -v 1500000 with one thread trains" \
    || { fail "ulimit -v 1500000 one thread: $(tail -2 "$T/out")"; }
fi

# ---- an error every rank sees is printed once, with a rank
if command -v mpirun >/dev/null; then
  printf 'training:\n  stpes: 3\n' >"$T/bad.yaml"
  expect "2 ranks, bad manifest" 2 "^\[rank [01]\] ctitan: .*bad.yaml:2: training.stpes: unknown key" -- "$CTITAN" launch -n 2 train "$T/bad.yaml"
  expect "4 ranks, bad manifest" 2 "^\[rank [0-3]\] ctitan: .*bad.yaml:2" -- "$CTITAN" launch -n 4 train "$T/bad.yaml"
  # (the schema's range refuses it before the comm plugin reads it; the rank faults test covers the plugin's own lines)
  expect "2 ranks, comm option" 2 "^\[rank [01]\] ctitan: .*comm.train_timeout_seconds: expected a number" -- \
    "$CTITAN" launch -n 2 train "${run[@]}" --comm.train_timeout_seconds=-1
else
  echo "skip rank cases: mpirun not installed"
fi
[ $fails -eq 0 ] && echo "plugin_safety: ok" || { echo "plugin_safety: $fails failed"; exit 1; }
