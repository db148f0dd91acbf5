#!/usr/bin/env bash
# A message a plugin sets on a thread of its own (an async writer, a progress thread) reaches the
# one-line error when a later call on the main thread fails, both at start-up (exit 2) and while
# training (exit 1).
set -u
CTITAN=${CTITAN:-build/ctitan}; BUILD=${BUILD:-build}
case $CTITAN in /*) ;; *) CTITAN=$(pwd)/$CTITAN ;; esac
. tests/cli/lib/common.sh
test_tmp
counting_fails
# expect NAME STATUS PATTERN -- CMD...: CMD exits STATUS with one stderr line matching PATTERN
expect() {
  local name=$1 want=$2 pat=$3; shift 4
  timeout 60 "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" -eq "$want" ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qE -- "$pat" "$T/err"; then
    echo "ok   $name: $(cat "$T/err")"
  else fail "$name: status $rc (wanted $want), wanted one line /$pat/:"; sed 's/^/     /' "$T/err" | head -5; fi
}

# An optimizer that does its work on a thread: the thread sets the error, the main call returns it.
# FAIL_AT says where: "create" or "step".
PC=$(PKG_CONFIG_PATH="$BUILD" pkg-config --cflags ctitan-sdk)
cat >"$T/threaderr.c" <<'C'
#include "ctitan/optimizer.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
static const ct_host *host;
static void *worker(void *arg) {
    host->set_error(host, "worker thread: %s", (const char *)arg);
    return NULL;
}
static ct_status fail_on_thread(const char *why) {
    pthread_t t;
    if (pthread_create(&t, NULL, worker, (void *)why)) return CT_ERR_INTERNAL;
    pthread_join(t, NULL);
    return CT_ERR_INTERNAL;
}
static int fails_at(const char *where) { const char *e = getenv("FAIL_AT"); return e && !strcmp(e, where); }
static ct_status create(const ct_host *h, const ct_device_api *dapi, ct_device *dev, ct_optimizer **opt) {
    (void)dapi; (void)dev;
    host = h;
    *opt = (ct_optimizer *)(void *)h; /* any non-NULL handle: this optimizer keeps no state */
    if (fails_at("create")) return fail_on_thread("cannot open the state file");
    return CT_OK;
}
static void destroy(ct_optimizer *opt) { (void)opt; }
static int state_count(ct_optimizer *opt) { (void)opt; return 0; }
static ct_status step(ct_optimizer *opt, ct_tensor *p, float *const *state, int64_t n, float lr, int64_t s) {
    (void)opt; (void)p; (void)state; (void)n; (void)lr; (void)s;
    if (fails_at("step")) return fail_on_thread("the device stream lost its queue");
    return CT_OK;
}
static const ct_optimizer_api api = {.struct_size = sizeof api, .create = create, .destroy = destroy,
                                     .state_count = state_count, .step = step};
CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *h, ct_plugin_info *info) {
    (void)h;
    info->abi_major = CT_ABI_MAJOR; info->abi_minor = CT_ABI_MINOR; info->kind = CT_KIND_OPTIMIZER;
    info->name = "threaderr"; info->api = &api;
    return CT_OK;
}
C
cc $PC -std=c11 -Wall -Wextra -Werror -shared -fPIC -pthread -o "$T/threaderr.so" "$T/threaderr.c" ||
  { echo "FAIL cannot build the test plugin"; exit 1; }
source tests/cli/lib/data.sh
test_data "$T" 512 || { echo "FAIL cannot make the test data"; exit 1; }
cat >"$T/run.yaml" <<YAML
model: {name: llama3, flavor: debugmodel, n_layers: 1, dim: 64, n_heads: 2, n_kv_heads: 2, vocab_size: 512}
optimizer: {name: ./threaderr.so}
training: {dataset_path: $T/data.bin, steps: 2, seq_len: 16, local_batch_size: 1}
YAML
expect "set on a thread, failed in create" 2 "threaderr: worker thread: cannot open the state file" -- \
  env FAIL_AT=create "$CTITAN" train "$T/run.yaml"
expect "set on a thread, failed in step" 1 "training failed: threaderr: worker thread: the device stream lost its queue" -- \
  env FAIL_AT=step "$CTITAN" train "$T/run.yaml"
echo
[ $fails -eq 0 ] && echo "plugin_thread_error: every case passed" || echo "plugin_thread_error: $fails case(s) failed"
exit $fails
