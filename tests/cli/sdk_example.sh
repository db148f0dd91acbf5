#!/usr/bin/env bash
# sdk_example: a third party can build plugins from the SDK alone.
#
# Copies sdk/template and sdk/examples/gpt2 out of the tree and builds them with nothing but the
# pkg-config file ($BUILD/ctitan-sdk.pc, written by `make`), checks each .so exports only
# ctitan_plugin_entry, and loads both into a stand-in host that checks their contracts without the
# core (entry info, options, declared parameter count = described count, errors for bad config,
# two Lion steps against the formula). Then trains gpt2 tiny with the Lion template for 30 steps
# from the example manifest and checks that the loss falls, and that an option outside its declared
# range is refused by the host (train_example below).
set -euo pipefail

ROOT=$(pwd)
BUILD=${BUILD:-build}
CTITAN=${CTITAN:-$BUILD/ctitan}
case $CTITAN in /*) ;; *) CTITAN=$ROOT/$CTITAN ;; esac

. tests/cli/lib/common.sh

[ -f "$BUILD/ctitan-sdk.pc" ] || fail "$BUILD/ctitan-sdk.pc is missing (run make)"
export PKG_CONFIG_PATH=$ROOT/$BUILD
pkg-config --exists ctitan-sdk || fail "pkg-config cannot find ctitan-sdk in $PKG_CONFIG_PATH"
SDK_CFLAGS=$(pkg-config --cflags ctitan-sdk)
WARN="-std=c11 -Wall -Wextra -Werror"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r sdk/template "$WORK/template"
cp -r sdk/examples/gpt2 "$WORK/gpt2"
rm -f "$WORK"/template/*.so "$WORK"/gpt2/*.so

# A clean make environment: nothing from the caller's make (flags, jobserver) reaches the plugins.
third_party_make() { env -u MAKEFLAGS -u MFLAGS -u CFLAGS -u CPPFLAGS -u LDFLAGS make --no-print-directory -C "$@"; }

build_plugins() {
    echo "== building out of tree in $WORK"
    third_party_make "$WORK/template"
    third_party_make "$WORK/gpt2"
    # docs/plugins.md's one-liner, as a user would type it (plus the warnings we hold ourselves to).
    (cd "$WORK/template" && cc $SDK_CFLAGS $WARN -shared -fPIC -o my.so lion.c)
    # The DDP strategy is written against the SDK alone: it builds out of tree the same way.
    cp "$ROOT/plugins/ddp/ddp.c" "$WORK/ddp.c"
    (cd "$WORK" && cc $SDK_CFLAGS $WARN -shared -fPIC -o ddp.so ddp.c) || fail "ddp.c does not build from the SDK alone"
    if grep -nE -- '-I|\.\./' "$WORK/template/Makefile" "$WORK/gpt2/Makefile"; then
        fail "an example Makefile reaches into the tree; only pkg-config may"
    fi
}

check_exports() {
    local so syms
    for so in "$WORK/template/lion.so" "$WORK/template/my.so" "$WORK/gpt2/gpt2.so" "$WORK/ddp.so"; do
        syms=$(nm -D --defined-only "$so" | awk '{print $3}' | sort -u | tr '\n' ' ')
        [ "$syms" = "ctitan_plugin_entry " ] || fail "$(basename "$so") exports [$syms], expected only ctitan_plugin_entry"
        echo "ok: $(basename "$so") exports only ctitan_plugin_entry"
    done
}

# A stand-in host: checks what the plugins promise without the core. It is itself a third-party
# program, built with the pkg-config flags only.
write_smoke_host() {
    cat >"$WORK/smoke.c" <<'C'
#include <ctitan/abi.h>
#include <ctitan/host.h>
#include <ctitan/model.h>
#include <ctitan/optimizer.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); } } while (0)

static char last_error[512];
static void h_log(const ct_host *h, ct_log_level l, const char *f, ...) { (void)h; (void)l; (void)f; }
static void h_err(const ct_host *h, const char *f, ...) {
    (void)h; va_list a; va_start(a, f); vsnprintf(last_error, sizeof last_error, f, a); va_end(a);
}
static void *h_alloc(const ct_host *h, size_t n, ct_mem_category c) {
    (void)h; (void)c; void *p = NULL; return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}
static void h_free(const ct_host *h, void *p) { (void)h; free(p); }
static void h_account(const ct_host *h, ct_mem_category c, int64_t d) { (void)h; (void)c; (void)d; }
/* Options: one (key, value) the test sets; everything else unset, defaults as the spec says. */
static const char *set_key; static double set_value;
static const ct_option_spec *spec;
static const ct_option_spec *find_spec(const char *key) {
    for (const ct_option_spec *o = spec; o && o->key; o++) if (strcmp(o->key, key) == 0) return o;
    return NULL;
}
static ct_status get(const char *key, double *out) {
    const ct_option_spec *o = find_spec(key);
    CHECK(o != NULL, "plugin asked for undeclared option '%s'", key);
    if (set_key && strcmp(key, set_key) == 0) { *out = set_value; return CT_OK; }
    if (!o || !o->default_value) return CT_ERR_INVALID;
    *out = atof(o->default_value); return CT_OK;
}
static ct_status h_int(const ct_host *h, const char *k, int64_t *o) { (void)h; double v; ct_status s = get(k, &v); if (!s) *o = (int64_t)v; return s; }
static ct_status h_float(const ct_host *h, const char *k, double *o) { (void)h; return get(k, o); }
static ct_status h_bool(const ct_host *h, const char *k, int *o) { (void)h; double v; ct_status s = get(k, &v); if (!s) *o = v != 0; return s; }
static ct_status h_string(const ct_host *h, const char *k, const char **o) { (void)h; (void)k; (void)o; return CT_ERR_INVALID; }
static void h_trace(const ct_host *h, const char *n) { (void)h; (void)n; }
static const ct_host host = {
    .struct_size = sizeof(ct_host), .abi_major = CT_ABI_MAJOR, .abi_minor = CT_ABI_MINOR, .log = h_log,
    .set_error = h_err, .mem_alloc = h_alloc, .mem_free = h_free, .mem_account = h_account, .opt_int = h_int,
    .opt_float = h_float, .opt_bool = h_bool, .opt_string = h_string, .trace_begin = h_trace, .trace_end = h_trace};

static const void *load(const char *path, ct_plugin_kind kind, const char *name) {
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) { printf("FAIL dlopen %s: %s\n", path, dlerror()); exit(1); }
    ct_plugin_entry_fn entry = (ct_plugin_entry_fn)dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    if (!entry || entry(&host, &info) != CT_OK) { printf("FAIL entry of %s\n", path); exit(1); }
    CHECK(info.abi_major == CT_ABI_MAJOR && info.kind == kind && info.name && strcmp(info.name, name) == 0,
          "%s: abi %u kind %d name %s", path, info.abi_major, (int)info.kind, info.name ? info.name : "?");
    CHECK(info.description && info.api && *(const size_t *)info.api > 0, "%s: description/api missing", path);
    spec = info.options;
    for (const ct_option_spec *o = spec; o && o->key; o++)
        CHECK(o->struct_size == sizeof *o && o->help, "%s: option %s incomplete", path, o->key);
    return info.api;
}

static int64_t declared, n_tensors, bad_flags;
static ct_tensor tensors[4096];
static ct_tensor *reg_add(ct_param_registry *r, int unit, const char *name, int ndim, const int64_t *shape,
                          const ct_init *init, uint32_t flags) {
    (void)r; (void)unit;
    if (n_tensors == 4096) return NULL;
    ct_tensor *t = &tensors[n_tensors++];
    *t = (ct_tensor){.struct_size = sizeof *t, .dtype = CT_F32, .ndim = ndim, .name = name, .flags = flags};
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    declared += ct_tensor_numel(t);
    /* GPT-2: 1-D tensors (LayerNorm weights, biases) are constant-initialised and never decayed */
    if ((ndim == 1) != ((flags & CT_TENSOR_NO_DECAY) != 0) || (ndim == 1) != (init->kind == CT_INIT_CONSTANT)) bad_flags++;
    return t;
}

static void check_gpt2(const char *path) {
    const ct_model_api *api = load(path, CT_KIND_MODEL, "gpt2");
    ct_model_config mc = {.struct_size = sizeof mc, .flavor = "tiny", .seq_len = 64};
    ct_model *m = NULL;
    CHECK(api->create(&host, &mc, &m) == CT_OK, "create tiny: %s", last_error);
    if (!m) return;
    ct_model_desc d = {.struct_size = sizeof d};
    CHECK(api->describe(m, &d) == CT_OK, "describe: %s", last_error);
    ct_param_registry reg = {.struct_size = sizeof reg, .add = reg_add};
    CHECK(api->declare_params(m, &reg) == CT_OK, "declare_params: %s", last_error);
    CHECK(d.n_units == d.n_layers + 2 && d.n_layers == 2 && d.dim == 64 && d.vocab_size == 2048,
          "tiny described as units %d layers %d dim %lld vocab %lld", d.n_units, d.n_layers, (long long)d.dim,
          (long long)d.vocab_size);
    CHECK(declared == d.n_params, "declared %lld parameters, describe says %lld", (long long)declared, (long long)d.n_params);
    CHECK(bad_flags == 0, "%lld tensors with the wrong init/no-decay flags", (long long)bad_flags);
    CHECK(d.n_embedding_params == (2048 + 256) * 64, "n_embedding_params %lld", (long long)d.n_embedding_params);
    double flops = 6.0 * (double)(d.n_params - d.n_embedding_params) + 12.0 * 2 * 64 * 64;
    CHECK(d.flops_per_token == flops, "flops_per_token %g, expected %g", d.flops_per_token, flops);
    for (int64_t i = 0; i < n_tensors; i++)
        for (int64_t j = 0; j < i; j++)
            CHECK(strcmp(tensors[i].name, tensors[j].name) != 0, "parameter name %s twice", tensors[i].name);
    CHECK(strcmp(api->unit_name(m, 1), api->unit_name(m, 2)) != 0, "unit names not distinct");
    api->destroy(m);

    set_key = "vocab_size"; set_value = 300;  /* an option overrides the flavor */
    CHECK(api->create(&host, &mc, &m) == CT_OK && api->describe(m, &d) == CT_OK && d.vocab_size == 300,
          "model.vocab_size=300 not applied");
    api->destroy(m);
    set_key = "n_heads"; set_value = 5;       /* 5 does not divide 64 */
    CHECK(api->create(&host, &mc, &m) == CT_ERR_INVALID && strstr(last_error, "n_heads"), "n_heads=5: '%s'", last_error);
    set_key = NULL;
    mc.seq_len = 257;                         /* tiny has 256 positions */
    CHECK(api->create(&host, &mc, &m) == CT_ERR_INVALID && strstr(last_error, "seq_len"), "seq_len 257: '%s'", last_error);
    mc.seq_len = 64; mc.flavor = "medium";
    CHECK(api->create(&host, &mc, &m) == CT_ERR_INVALID && strstr(last_error, "tiny"), "bad flavor: '%s'", last_error);
}

/* The stand-in device runs on host memory, with the ops Lion calls. */
static ct_status d_alloc(ct_device *d, size_t n, void **out) { (void)d; *out = malloc(n); return *out ? CT_OK : CT_ERR_NOMEM; }
static void d_free(ct_device *d, void *p) { (void)d; free(p); }
static ct_status d_axpby(ct_device *d, float *out, float a, const float *x, float b, const float *y, int64_t n) {
    (void)d; for (int64_t i = 0; i < n; i++) out[i] = a * x[i] + b * y[i]; return CT_OK; }
static ct_status d_sign(ct_device *d, float *out, const float *x, int64_t n) {
    (void)d; for (int64_t i = 0; i < n; i++) out[i] = x[i] > 0 ? 1.0f : x[i] < 0 ? -1.0f : x[i]; return CT_OK; }

static void check_lion(const char *path) {
    const ct_optimizer_api *api = load(path, CT_KIND_OPTIMIZER, "lion");
    ct_device_api dapi = {.struct_size = sizeof dapi, .alloc = d_alloc, .free = d_free, .ew_axpby = d_axpby, .ew_sign = d_sign};
    ct_optimizer *o = NULL;
    set_key = "weight_decay"; set_value = 0.5;
    CHECK(api->create(&host, &dapi, NULL, &o) == CT_OK && api->state_count(o) == 1, "create: %s", last_error);
    if (!o) return;
    float p[3] = {1, 2, 3}, g[3] = {0.5f, -1, 2}, m[3] = {0}, *state[1] = {m};
    ct_tensor t = {.struct_size = sizeof t, .dtype = CT_F32, .ndim = 1, .shape = {3}, .data = p, .grad = g, .name = "w"};
    for (int s = 1; s <= 2; s++) CHECK(api->step(o, &t, state, 3, 0.1f, s) == CT_OK, "step %d", s);
    /* sign(c) = sign(g) both steps (m has g's sign), so p2 = (p 0.95 - 0.1 s) 0.95 - 0.1 s */
    for (int i = 0; i < 3; i++) {
        float s = g[i] > 0 ? 1.0f : -1.0f, want = ((float)(i + 1) * 0.95f - 0.1f * s) * 0.95f - 0.1f * s;
        float wm = 0.99f * 0.01f * g[i] + 0.01f * g[i], diff = p[i] - want, dm = m[i] - wm;
        CHECK(diff * diff < 1e-12f && dm * dm < 1e-14f, "p[%d] = %g, m = %g after two steps, expected %g, %g",
              i, p[i], m[i], want, wm);
    }
    api->destroy(o);
    dapi.ew_sign = NULL;
    CHECK(api->create(&host, &dapi, NULL, &o) == CT_ERR_UNSUPPORTED && strstr(last_error, "ew_sign"),
          "a device without ew_sign: '%s'", last_error);
    set_key = NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    check_gpt2(argv[1]);
    check_lion(argv[2]);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
C
}

smoke_test() {
    echo "== stand-in host"
    write_smoke_host
    cc $SDK_CFLAGS $WARN -D_GNU_SOURCE -o "$WORK/smoke" "$WORK/smoke.c" -ldl
    "$WORK/smoke" "$WORK/gpt2/gpt2.so" "$WORK/template/lion.so"
}

# Whether the core can train: the placeholder binary answers anything with one word, so ask for
# option text (lines with "--") from `train --help`.

# Trains gpt2 tiny with the Lion template, both loaded by path from the manifest's folder, and
# checks the loss falls; then beta1 = 1.5, outside the range Lion declares, must be refused.
train_example() {
    local run=$WORK/gpt2 log=$WORK/train.log
    cp "$WORK/template/lion.so" "$run/"
    # the data: a 512-token vocabulary and a shard made from the committed test corpus
    "$CTITAN" tokenizer train --input "$ROOT/tests/data/tokenizer/corpus.txt" --vocab-size 512 \
        --output "$run/tok.model" >/dev/null || fail "tokenizer train"
    "$CTITAN" tokenize --tokenizer "$run/tok.model" --input "$ROOT/tests/data/tokenizer/corpus.txt" \
        --output "$run/data.bin" >/dev/null || fail "tokenize"
    echo "== training gpt2 tiny + lion for 30 steps"
    (cd "$run" && "$CTITAN" train gpt2_tiny.yaml --model.vocab_size=512 \
        --job.dump_folder="$run/outputs" --training.steps=30) >"$log" 2>&1 \
        || { tail -n 20 "$log"; fail "ctitan train exited non-zero"; }
    local losses
    losses=$(grep -oE 'loss[:= ]+[0-9]+(\.[0-9]+)?' "$log" | grep -oE '[0-9]+(\.[0-9]+)?$' || true)
    [ "$(echo "$losses" | grep -c .)" -ge 10 ] || { tail -n 20 "$log"; fail "fewer than 10 loss values logged"; }
    echo "$losses" | awk '
        NR == 1 { first = $1 } { v[NR] = $1 }
        END {
            last = (v[NR] + v[NR-1] + v[NR-2]) / 3
            printf "loss: first %.4f, mean of last three %.4f\n", first, last
            if (!(last < 0.9 * first)) { print "FAIL: the loss did not fall by 10%"; exit 1 }
        }' || fail "the loss did not fall"
    local rc=0
    (cd "$run" && "$CTITAN" train gpt2_tiny.yaml --model.vocab_size=512 --optimizer.beta1=1.5 \
        --job.dump_folder="$run/bad") >"$WORK/bad.log" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q "optimizer.beta1: expected a number in \[0, 1\], got '1.5'" "$WORK/bad.log" \
        || { cat "$WORK/bad.log"; fail "beta1 = 1.5: exit $rc, expected 2 and a message naming the key and range"; }
    echo "ok: beta1 = 1.5 is refused: $(head -1 "$WORK/bad.log")"
}

build_plugins
check_exports
smoke_test
train_example
echo "sdk_example: ok"
