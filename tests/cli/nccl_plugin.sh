#!/usr/bin/env bash
# nccl_plugin: the NCCL comm plugin builds, exports one symbol, loads into a host built from the
# SDK alone, and on a machine without a GPU refuses cleanly (CT_ERR_UNSUPPORTED, the message that
# says to use comm.name: mpi) without crashing, hanging or touching MPI.
#
#   (a) $BUILD/plugins/ctitan-nccl.so exists when /usr/local/cuda/include/nccl.h does, and exports
#       only ctitan_plugin_entry
#   (b) a stand-in host (pkg-config --cflags ctitan-sdk, -ldl) checks the plugin info and options,
#       the option errors, and create: CT_ERR_UNSUPPORTED without a GPU; with one, a singleton
#       world (rank 0 of 1), a barrier and destroy
#   (c) tests/gpu/nccl_conformance.c compiles (mpicc + CUDA headers); it runs under mpirun only
#       where `nvidia-smi -L` lists a GPU (1 rank; 2 when there are 2 GPUs)
set -euo pipefail

ROOT=$(pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
SO=$BUILD/plugins/ctitan-nccl.so
CUDA=/usr/local/cuda

. tests/cli/lib/common.sh

if [ ! -f $CUDA/include/nccl.h ]; then
    [ ! -f "$SO" ] || fail "$SO exists although $CUDA/include/nccl.h does not (SKIP_nccl not honoured?)"
    echo "skip: no $CUDA/include/nccl.h, so the nccl plugin is not built here"
    exit 0
fi

# (a) built, one exported symbol
[ -f "$SO" ] || fail "$SO was not built (run make)"
syms=$(nm -D --defined-only "$SO" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sort -u | tr '\n' ' ')
[ "$syms" = "ctitan_plugin_entry " ] || fail "$SO exports [$syms], expected only ctitan_plugin_entry"
echo "ok: $(basename "$SO") exports only ctitan_plugin_entry"

# (b) a stand-in host from the SDK alone
[ -f "$BUILD/ctitan-sdk.pc" ] || fail "$BUILD/ctitan-sdk.pc is missing (run make)"
export PKG_CONFIG_PATH=$BUILD
SDK_CFLAGS=$(pkg-config --cflags ctitan-sdk)
WARN="-std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE"
# A plugin built with SANITIZE=1 needs the sanitizer runtime in the program that loads it.
SAN=""
if readelf -d "$SO" | grep -c 'NEEDED.*libasan' >/dev/null; then
    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer"
fi

GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cat >"$WORK/driver.c" <<'C'
#include <ctitan/abi.h>
#include <ctitan/comm.h>
#include <ctitan/host.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); } } while (0)

static char last_error[1024];
static void h_log(const ct_host *h, ct_log_level l, const char *f, ...) {
    (void)h; (void)l; va_list a; va_start(a, f); printf("log: "); vprintf(f, a); printf("\n"); va_end(a);
}
static void h_err(const ct_host *h, const char *f, ...) {
    (void)h; va_list a; va_start(a, f); vsnprintf(last_error, sizeof last_error, f, a); va_end(a);
}
static void *h_alloc(const ct_host *h, size_t n, ct_mem_category c) {
    (void)h; (void)c; void *p = NULL; return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}
static void h_free(const ct_host *h, void *p) { (void)h; free(p); }
static void h_account(const ct_host *h, ct_mem_category c, int64_t d) { (void)h; (void)c; (void)d; }

/* Options: the spec's defaults, and one (key, value) a check overrides. */
static const ct_option_spec *spec;
static const char *set_key, *set_value;
static const char *opt_value(const char *key, ct_opt_type type) {
    for (const ct_option_spec *o = spec; o && o->key; o++) {
        if (strcmp(o->key, key) != 0) continue;
        CHECK(o->type == type, "option %s asked for with type %d, declared %d", key, (int)type, (int)o->type);
        if (set_key && strcmp(key, set_key) == 0) return set_value;
        return o->default_value;
    }
    CHECK(0, "plugin asked for undeclared option '%s'", key);
    return NULL;
}
static ct_status h_int(const ct_host *h, const char *k, int64_t *o) {
    (void)h; const char *v = opt_value(k, CT_OPT_INT); if (!v) return CT_ERR_INVALID; *o = strtoll(v, NULL, 10); return CT_OK;
}
static ct_status h_float(const ct_host *h, const char *k, double *o) {
    (void)h; const char *v = opt_value(k, CT_OPT_FLOAT); if (!v) return CT_ERR_INVALID; *o = strtod(v, NULL); return CT_OK;
}
static ct_status h_bool(const ct_host *h, const char *k, int *o) {
    (void)h; const char *v = opt_value(k, CT_OPT_BOOL); if (!v) return CT_ERR_INVALID; *o = strcmp(v, "true") == 0; return CT_OK;
}
static ct_status h_string(const ct_host *h, const char *k, const char **o) {
    (void)h; const char *v = opt_value(k, CT_OPT_STRING); if (!v) return CT_ERR_INVALID; *o = v; return CT_OK;
}
static void h_trace(const ct_host *h, const char *n) { (void)h; (void)n; }
static const ct_host host = {
    .struct_size = sizeof(ct_host), .abi_major = CT_ABI_MAJOR, .abi_minor = CT_ABI_MINOR, .log = h_log,
    .set_error = h_err, .mem_alloc = h_alloc, .mem_free = h_free, .mem_account = h_account, .opt_int = h_int,
    .opt_float = h_float, .opt_bool = h_bool, .opt_string = h_string, .trace_begin = h_trace, .trace_end = h_trace};

static const ct_option_spec *find(const char *key) {
    for (const ct_option_spec *o = spec; o && o->key; o++) if (strcmp(o->key, key) == 0) return o;
    return NULL;
}

/* create with one option overridden must fail with CT_ERR_INVALID naming the option. */
static void bad_option(const ct_comm_api *api, const char *key, const char *value) {
    ct_comm *comm = (ct_comm *)&comm; /* a sentinel a failed create must clear */
    last_error[0] = '\0';
    set_key = key; set_value = value;
    ct_status st = api->create(&host, &comm);
    set_key = NULL;
    CHECK(st == CT_ERR_INVALID && comm == NULL && strstr(last_error, key),
          "%s = %s: status %d, comm %p, message '%s'", key, value, (int)st, comm, last_error);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: driver plugin.so gpu|nogpu\n"); return 2; }
    int gpu = strcmp(argv[2], "gpu") == 0;
    void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!so) { printf("FAIL dlopen %s: %s\n", argv[1], dlerror()); return 1; }
    ct_plugin_entry_fn entry = (ct_plugin_entry_fn)dlsym(so, CT_PLUGIN_ENTRY_NAME);
    if (!entry) { printf("FAIL no %s in %s\n", CT_PLUGIN_ENTRY_NAME, argv[1]); return 1; }
    ct_plugin_info info = {.struct_size = sizeof info};
    if (entry(&host, &info) != CT_OK) { printf("FAIL the entry function returned an error\n"); return 1; }
    CHECK(info.abi_major == CT_ABI_MAJOR, "abi_major %u, host %u", info.abi_major, (unsigned)CT_ABI_MAJOR);
    CHECK(info.kind == CT_KIND_COMM, "kind %d, expected comm (%d)", (int)info.kind, (int)CT_KIND_COMM);
    CHECK(info.name && strcmp(info.name, "nccl") == 0, "name '%s'", info.name ? info.name : "(null)");
    CHECK(info.description && *info.description, "no description");
    const ct_comm_api *api = info.api;
    if (!api) { printf("FAIL no api table\n"); return 1; }
    CHECK(api->struct_size >= sizeof(ct_comm_api), "api struct_size %zu < %zu", api->struct_size, sizeof(ct_comm_api));
    CHECK(api->create && api->destroy && api->world && api->group_rank && api->split && api->group_free &&
          api->all_reduce && api->all_gather && api->reduce_scatter && api->broadcast && api->all_to_all &&
          api->send && api->recv && api->barrier && api->wait && api->abort, "a function of the api table is NULL");
    spec = info.options;
    for (const ct_option_spec *o = spec; o && o->key; o++)
        CHECK(o->struct_size == sizeof *o && o->help && *o->help, "option %s incomplete", o->key);
    const ct_option_spec *t = find("train_timeout_seconds"), *d = find("device");
    CHECK(t && t->type == CT_OPT_FLOAT && t->default_value && strtod(t->default_value, NULL) == 300,
          "train_timeout_seconds: float, default 300");
    CHECK(d && d->type == CT_OPT_INT && d->default_value, "device: int with a default");

    /* Bad options are refused before anything else (with or without a GPU). */
    bad_option(api, "train_timeout_seconds", "0");
    bad_option(api, "train_timeout_seconds", "-5");
    bad_option(api, "device", "-2");

    ct_comm *comm = (ct_comm *)&comm; /* a sentinel a failed create must clear */
    last_error[0] = '\0';
    ct_status st = api->create(&host, &comm);
    if (!gpu) {
        const char *want = "no CUDA device: the nccl plugin needs a GPU; use comm.name: mpi for CPU tensors";
        CHECK(st == CT_ERR_UNSUPPORTED, "create without a GPU: status %d, expected CT_ERR_UNSUPPORTED (%d)",
              (int)st, (int)CT_ERR_UNSUPPORTED);
        CHECK(comm == NULL, "create failed but left comm = %p", comm);
        CHECK(strstr(last_error, want) != NULL, "message '%s' lacks '%s'", last_error, want);
        printf("create without a GPU: %s\n", last_error);
        comm = (ct_comm *)&comm;
        CHECK(api->create(&host, &comm) == CT_ERR_UNSUPPORTED && comm == NULL, "a second create differs");
    } else {
        CHECK(st == CT_OK && comm, "create on a GPU machine: status %d '%s'", (int)st, last_error);
        if (st == CT_OK) {
            ct_comm_group *world = NULL;
            int rank = -1, size = -1;
            CHECK(api->world(comm, &world) == CT_OK && world, "world");
            CHECK(api->group_rank(comm, world, &rank, &size) == CT_OK && rank == 0 && size == 1,
                  "singleton: rank %d of %d", rank, size);
            CHECK(api->barrier(comm, world) == CT_OK, "barrier: %s", last_error);
            api->destroy(comm);
        }
    }
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
C
cc $SDK_CFLAGS $WARN $SAN -o "$WORK/driver" "$WORK/driver.c" -ldl || fail "the stand-in host does not compile from the SDK alone"
mode=nogpu; [ "$GPUS" -gt 0 ] && mode=gpu
echo "== stand-in host ($mode, singleton, no mpirun)"
rc=0
timeout 120 "$WORK/driver" "$SO" $mode || rc=$?
[ $rc -ne 124 ] || fail "the stand-in host hung (killed after 120 s)"
[ $rc -eq 0 ] || fail "the stand-in host failed (exit $rc)"

# (c) the GPU conformance program: compiled here, run where there is a GPU
command -v mpicc >/dev/null 2>&1 || fail "mpicc is missing (libopenmpi-dev)"
echo "== compiling tests/gpu/nccl_conformance.c"
mpicc $SDK_CFLAGS $WARN $SAN -I$CUDA/include -o "$WORK/nccl_conformance" "$ROOT/tests/gpu/nccl_conformance.c" \
    -L$CUDA/lib64 -Wl,-rpath,$CUDA/lib64 -lcudart -ldl || fail "tests/gpu/nccl_conformance.c does not compile"
if [ "$GPUS" -eq 0 ]; then
    echo "note: nvidia-smi -L finds no GPU here: the NCCL conformance run (tests/gpu/nccl_conformance.c) is skipped"
    echo "nccl_plugin: ok"
    exit 0
fi
command -v mpirun >/dev/null 2>&1 || fail "mpirun is missing"
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# CUDA under AddressSanitizer: the shadow gap must stay mappable; the CUDA/NCCL/MPI runtimes keep
# memory to the end of the process, which LeakSanitizer would report.
[ -z "$SAN" ] || export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0
for np in 1 2; do
    [ "$np" -le "$GPUS" ] || { echo "note: $GPUS GPU(s): the $np-rank conformance run is skipped"; continue; }
    echo "== NCCL conformance, $np rank(s)"
    rc=0
    timeout 300 mpirun -np $np --oversubscribe "$WORK/nccl_conformance" "$SO" || rc=$?
    [ $rc -ne 124 ] || fail "the $np-rank conformance run hung (killed after 300 s)"
    [ $rc -eq 0 ] || fail "the $np-rank conformance run failed (exit $rc)"
done
echo "nccl_plugin: ok"
