/* cross_check: runs the same ops on two device plugins and compares the results, at the shapes a
 * Llama model uses and the conformance harness does not reach: attention at head dims 48, 64 and
 * 128 over several tiles with grouped heads, cross-entropy over a 128256 vocabulary, an embedding
 * backward with many repeated ids and several column slices, column sums over 300000 rows,
 * RoPE at head dim 128, a large matmul with transposes, long sums and a tensor-wide amax; the
 * elementwise ops of ABI 2.1 must match bit for bit. ABI 2.3's context-parallel ops: one rank's
 * ring of attention blocks at load-balanced (and shuffled) positions, merged, and their backward,
 * over 2 to 4 ranks at head dims 48 to 128, and RoPE at those positions. ABI 2.13's block-causal
 * attention over packed documents, whole rows and context-parallel-like halves, forward and backward.
 * ABI 2.14's MoE ops as a DeepSeek-V3-shaped layer (64 experts, 8 groups, a bias), forward and
 * backward, the routing identical.
 *
 *     cross_check REFERENCE.so TESTED.so [RTOL]
 *
 * REFERENCE is normally build/plugins/ctitan-cpu.so; TESTED the CUDA plugin (on a GPU, from
 * tests/gpu/run.sh) or its emulated build (tests/cli/cuda_emulated.sh). Each output must agree
 * within RTOL (default 2e-4) of the largest magnitude of the reference output; every op is also
 * run twice on TESTED and must give the same bits. Prints one line per check; exit 1 on any
 * mismatch. Both plugins get their default options.
 */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- a minimal host */

static const ct_option_spec *current_spec;
static char last_error[1024];

static void h_log(const ct_host *h, ct_log_level l, const char *f, ...)
{
    (void)h;
    if (l < CT_LOG_WARN)
        return;
    va_list a;
    va_start(a, f);
    vfprintf(stderr, f, a);
    fprintf(stderr, "\n");
    va_end(a);
}
static void h_err(const ct_host *h, const char *f, ...)
{
    (void)h;
    va_list a;
    va_start(a, f);
    vsnprintf(last_error, sizeof last_error, f, a);
    va_end(a);
}
static void *h_alloc(const ct_host *h, size_t n, ct_mem_category c)
{
    (void)h;
    (void)c;
    return aligned_alloc(64, (n + 63) / 64 * 64 + 64);
}
static void h_free(const ct_host *h, void *p)
{
    (void)h;
    free(p);
}
static void h_account(const ct_host *h, ct_mem_category c, int64_t d)
{
    (void)h;
    (void)c;
    (void)d;
}
static const char *opt_default(const char *key)
{
    for (const ct_option_spec *o = current_spec; o && o->key; o++)
        if (strcmp(o->key, key) == 0)
            return o->default_value;
    return NULL;
}
static ct_status h_int(const ct_host *h, const char *k, int64_t *o)
{
    (void)h;
    const char *v = opt_default(k);
    if (!v)
        return CT_ERR_INVALID;
    *o = strtoll(v, NULL, 10);
    return CT_OK;
}
static ct_status h_float(const ct_host *h, const char *k, double *o)
{
    (void)h;
    const char *v = opt_default(k);
    if (!v)
        return CT_ERR_INVALID;
    *o = strtod(v, NULL);
    return CT_OK;
}
static ct_status h_bool(const ct_host *h, const char *k, int *o)
{
    (void)h;
    const char *v = opt_default(k);
    if (!v)
        return CT_ERR_INVALID;
    *o = strcmp(v, "true") == 0;
    return CT_OK;
}
static ct_status h_string(const ct_host *h, const char *k, const char **o)
{
    (void)h;
    *o = opt_default(k);
    return *o ? CT_OK : CT_ERR_INVALID;
}
static void h_trace(const ct_host *h, const char *n)
{
    (void)h;
    (void)n;
}
static const ct_host host = {sizeof(ct_host), CT_ABI_MAJOR, CT_ABI_MINOR, NULL,     h_log,    h_err,   h_alloc,
                             h_free,          h_account,    h_int,        h_float,  h_bool,   h_string, h_trace,
                             h_trace};

/* ---------------------------------------------------------------- devices */

typedef struct device {
    const ct_device_api *api;
    ct_device *dev;
    const char *path;
} device;

static int open_device(device *d, const char *path)
{
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "cross_check: cannot load %s: %s\n", path, dlerror());
        return -1;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    if (!entry || entry(&host, &info) != CT_OK || info.kind != CT_KIND_DEVICE) {
        fprintf(stderr, "cross_check: %s is not a device plugin\n", path);
        return -1;
    }
    d->api = info.api;
    d->path = path;
    current_spec = info.options;
    if (d->api->create(&host, &d->dev) != CT_OK) {
        fprintf(stderr, "cross_check: %s: create failed: %s\n", path, last_error);
        return -1;
    }
    return 0;
}

static int failures;
static double rtol = 2e-4;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 4503599627370496.0 - 1.0);
}

static float *rand_host(int64_t n, float scale)
{
    float *x = malloc(sizeof(float) * (size_t)n + 4);
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * urand();
    return x;
}

static void *up(device *d, const void *host_data, size_t bytes)
{
    void *p = NULL;
    if (d->api->alloc(d->dev, bytes, &p) != CT_OK || !p) {
        fprintf(stderr, "cross_check: %s: alloc of %zu bytes failed: %s\n", d->path, bytes, last_error);
        exit(2);
    }
    if (host_data)
        d->api->copy(d->dev, p, host_data, bytes, CT_COPY_H2D);
    else
        d->api->zero(d->dev, p, bytes);
    return p;
}

static float *down(device *d, const void *p, int64_t n)
{
    float *h = malloc(sizeof(float) * (size_t)n + 4);
    if (d->api->copy(d->dev, h, p, sizeof(float) * (size_t)n, CT_COPY_D2H) != CT_OK ||
        d->api->synchronize(d->dev) != CT_OK) {
        fprintf(stderr, "cross_check: %s: copy back failed: %s\n", d->path, last_error);
        exit(2);
    }
    return h;
}

/* |test - ref| <= rtol * max(1e-3, max |ref|) everywhere */
static void compare(const char *what, const float *ref, const float *got, int64_t n)
{
    double scale = 1e-3, worst = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        if (!(e <= worst)) { /* NaN counts as worst */
            worst = isnan(e) ? INFINITY : e;
            at = i;
        }
    }
    int ok = worst <= rtol * scale;
    failures += !ok;
    printf("%s %-48s max error %.3g of scale %.3g%s", ok ? "ok  " : "FAIL", what, worst, scale, ok ? "\n" : "");
    if (!ok)
        printf(" at [%lld]: %.9g vs reference %.9g\n", (long long)at, (double)got[at], (double)ref[at]);
}

static void same_bits(const char *what, const float *a, const float *b, int64_t n)
{
    if (memcmp(a, b, sizeof(float) * (size_t)n) != 0) {
        failures++;
        printf("FAIL %-48s differs between two runs on the same inputs\n", what);
    }
}

static void must(ct_status st, device *d, const char *op)
{
    if (st != CT_OK) {
        failures++;
        printf("FAIL %s on %s: status %d: %s\n", op, d->path, (int)st, last_error);
    }
}

/* ---------------------------------------------------------------- cases */

/* Forward and backward on both devices; grads start from values so the backward's += shows. */
static void attention_case(device *R, device *T, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d)
{
    int64_t nq = b * t * h * d, nk = b * t * kvh * d, nl = b * h * t;
    float *q = rand_host(nq, 1.5f), *k = rand_host(nk, 1.5f), *v = rand_host(nk, 1), *g = rand_host(nq, 1);
    float *gq0 = rand_host(nq, 0.5f), *gk0 = rand_host(nk, 0.5f), *gv0 = rand_host(nk, 0.5f);
    float *res[2][6];
    device *devs[2] = {R, T};
    for (int r = 0; r < 3; r++) { /* R once, T twice (determinism) */
        device *D = devs[r > 0];
        float *dq = up(D, q, 4 * nq), *dk = up(D, k, 4 * nk), *dv = up(D, v, 4 * nk), *dg = up(D, g, 4 * nq);
        float *out = up(D, NULL, 4 * nq), *lse = up(D, NULL, 4 * nl);
        float *gq = up(D, gq0, 4 * nq), *gk = up(D, gk0, 4 * nk), *gv = up(D, gv0, 4 * nk);
        must(D->api->attention_forward(D->dev, out, lse, dq, dk, dv, b, t, h, kvh, d), D, "attention_forward");
        must(D->api->attention_backward(D->dev, gq, gk, gv, dg, dq, dk, dv, out, lse, b, t, h, kvh, d), D,
             "attention_backward");
        float *got[6] = {down(D, out, nq), down(D, lse, nl), down(D, gq, nq), down(D, gk, nk), down(D, gv, nk), NULL};
        if (r < 2)
            memcpy(res[r], got, sizeof got);
        else {
            int64_t ns[5] = {nq, nl, nq, nk, nk};
            for (int i = 0; i < 5; i++) {
                same_bits("attention (twice)", res[1][i], got[i], ns[i]);
                free(got[i]);
            }
        }
        void *bufs[] = {dq, dk, dv, dg, out, lse, gq, gk, gv};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            D->api->free(D->dev, bufs[i]);
    }
    char what[128];
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    int64_t ns[5] = {nq, nl, nq, nk, nk};
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "attention b%lld t%lld h%lld kvh%lld d%lld %s", (long long)b, (long long)t,
                 (long long)h, (long long)kvh, (long long)d, names[i]);
        compare(what, res[0][i], res[1][i], ns[i]);
        free(res[0][i]);
        free(res[1][i]);
    }
    free(q), free(k), free(v), free(g), free(gq0), free(gk0), free(gv0);
}

static void cross_entropy_case(device *R, device *T, int64_t n, int64_t v)
{
    float *logits = rand_host(n * v, 6.0f), *g0 = rand_host(n * v, 0.1f);
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        targets[i] = i % 4 == 3 ? -100 : (int32_t)((uint64_t)(i * 7919 + 13) % (uint64_t)v);
    float *res[2][2];
    device *devs[2] = {R, T};
    for (int r = 0; r < 2; r++) {
        device *D = devs[r];
        float *dl = up(D, logits, 4 * n * v), *loss = up(D, NULL, 4 * n), *dg = up(D, g0, 4 * n * v);
        int32_t *dt = up(D, targets, 4 * n);
        must(D->api->cross_entropy_forward(D->dev, loss, dl, dt, n, v, -100), D, "cross_entropy_forward");
        must(D->api->cross_entropy_backward_general(D->dev, dg, dl, dt, NULL, 1.0f / (float)n, NULL, n, v, 0, -100),
             D, "cross_entropy_backward_general");
        res[r][0] = down(D, loss, n);
        res[r][1] = down(D, dg, n * v);
        D->api->free(D->dev, dl), D->api->free(D->dev, loss), D->api->free(D->dev, dg), D->api->free(D->dev, dt);
    }
    char what[128];
    snprintf(what, sizeof what, "cross_entropy n%lld v%lld losses", (long long)n, (long long)v);
    compare(what, res[0][0], res[1][0], n);
    snprintf(what, sizeof what, "cross_entropy n%lld v%lld dlogits", (long long)n, (long long)v);
    compare(what, res[0][1], res[1][1], n * v);
    for (int r = 0; r < 2; r++)
        free(res[r][0]), free(res[r][1]);
    free(logits), free(g0), free(targets);
}

static void embedding_backward_case(device *R, device *T, int64_t n, int64_t c, int64_t vocab)
{
    float *dout = rand_host(n * c, 1), *g0 = rand_host(vocab * c, 0.5f);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) /* skewed: id 0 is a third of the tokens */
        ids[i] = i % 3 == 0 ? 0 : (int32_t)((uint64_t)(i * 2654435761u) % (uint64_t)vocab);
    float *res[3];
    device *devs[3] = {R, T, T};
    for (int r = 0; r < 3; r++) {
        device *D = devs[r];
        float *dd = up(D, dout, 4 * n * c), *dg = up(D, g0, 4 * vocab * c);
        int32_t *di = up(D, ids, 4 * n);
        must(D->api->embedding_backward_general(D->dev, dg, di, dd, n, c, 0, vocab, 1), D, "embedding_backward_general");
        res[r] = down(D, dg, vocab * c);
        D->api->free(D->dev, dd), D->api->free(D->dev, dg), D->api->free(D->dev, di);
    }
    char what[128];
    snprintf(what, sizeof what, "embedding_backward n%lld c%lld vocab%lld", (long long)n, (long long)c,
             (long long)vocab);
    compare(what, res[0], res[1], vocab * c);
    same_bits(what, res[1], res[2], vocab * c);
    free(res[0]), free(res[1]), free(res[2]), free(dout), free(g0), free(ids);
}

/* Column sums over many rows (more than 1024 chunks of 256: the chunk grows with n). rstd is
 * given (a forward over 300000 rows would be slow on the emulator and is covered elsewhere). */
static void norm_weight_case(device *R, device *T, int64_t n, int64_t c)
{
    float *x = rand_host(n * c, 2), *g = rand_host(n * c, 1), *rs = rand_host(n, 0.5f);
    for (int64_t i = 0; i < n; i++)
        rs[i] += 1.0f;
    float *res[3][2];
    device *devs[3] = {R, T, T};
    for (int r = 0; r < 3; r++) {
        device *D = devs[r];
        float *dx = up(D, x, 4 * n * c), *dg = up(D, g, 4 * n * c), *rstd = up(D, rs, 4 * n);
        float *gw = up(D, NULL, 4 * c), *gb = up(D, NULL, 4 * c);
        must(D->api->rmsnorm_backward_weight(D->dev, gw, dg, dx, rstd, n, c), D, "rmsnorm_backward_weight");
        must(D->api->bias_backward(D->dev, gb, dg, n, c), D, "bias_backward");
        res[r][0] = down(D, gw, c);
        res[r][1] = down(D, gb, c);
        void *bufs[] = {dx, dg, rstd, gw, gb};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            D->api->free(D->dev, bufs[i]);
    }
    char what[128];
    const char *names[2] = {"rmsnorm_backward_weight", "bias_backward"};
    for (int i = 0; i < 2; i++) {
        snprintf(what, sizeof what, "%s n%lld c%lld", names[i], (long long)n, (long long)c);
        compare(what, res[0][i], res[1][i], c);
        same_bits(what, res[1][i], res[2][i], c);
        for (int r = 0; r < 3; r++)
            free(res[r][i]);
    }
    free(x), free(g), free(rs);
}

/* Context parallel's ring (ABI 2.3) for one query rank: rank qr of cp holds chunks qr and 2cp-1-qr of
 * a t-row sequence (shuffled within the rank when `shuffle`); its queries meet every rank's keys one
 * block at a time, merged by log-sum-exp, then each block's backward from the merged out and lse,
 * the key ranks' dk, dv starting from values. RoPE at the rank's positions too. */
static void cp_positions(int32_t *pos, int64_t t, int cp, int rank, int shuffle)
{
    int64_t chunk = t / (2 * cp), n = 0;
    for (int64_t i = 0; i < chunk; i++)
        pos[n++] = (int32_t)(rank * chunk + i);
    for (int64_t i = 0; i < chunk; i++)
        pos[n++] = (int32_t)((2 * cp - 1 - rank) * chunk + i);
    for (int64_t i = n - 1; shuffle && i > 0; i--) {
        int64_t j = (int64_t)((urand() + 1.0f) * 0.5f * (float)(i + 1));
        j = j > i ? i : j;
        int32_t tmp = pos[i];
        pos[i] = pos[j];
        pos[j] = tmp;
    }
}

#define CC_MAX_CP 4
static void cp_ring_case(device *R, device *T, int64_t b, int64_t t, int cp, int qr, int64_t h, int64_t kvh,
                         int64_t d, int shuffle)
{
    int64_t tl = t / cp, nq = b * tl * h * d, nk = b * tl * kvh * d, nl = b * h * tl;
    int32_t *pos[CC_MAX_CP];
    float *k[CC_MAX_CP], *v[CC_MAX_CP], *gk0[CC_MAX_CP], *gv0[CC_MAX_CP];
    for (int s = 0; s < cp; s++) {
        pos[s] = malloc(sizeof(int32_t) * (size_t)tl);
        cp_positions(pos[s], t, cp, s, shuffle);
        k[s] = rand_host(nk, 1.5f), v[s] = rand_host(nk, 1), gk0[s] = rand_host(nk, 0.5f), gv0[s] = rand_host(nk, 0.5f);
    }
    float *q = rand_host(nq, 1.5f), *g = rand_host(nq, 1), *gq0 = rand_host(nq, 0.5f);
    float *res[2][5 + 2 * CC_MAX_CP];
    int64_t ns[5 + 2 * CC_MAX_CP] = {nq, nl, nq, nq, nq};
    device *devs[2] = {R, T};
    for (int r = 0; r < 3; r++) { /* R once, T twice (determinism) */
        device *D = devs[r > 0];
        float *dq = up(D, q, 4 * nq), *dg = up(D, g, 4 * nq), *gq = up(D, gq0, 4 * nq);
        float *out = up(D, NULL, 4 * nq), *lse = up(D, NULL, 4 * nl), *o2 = up(D, NULL, 4 * nq), *l2 = up(D, NULL, 4 * nl);
        float *rq = up(D, q, 4 * nq), *rg = up(D, gq0, 4 * nq);
        float *dk[CC_MAX_CP], *dv[CC_MAX_CP], *gk[CC_MAX_CP], *gv[CC_MAX_CP];
        int32_t *dpos[CC_MAX_CP];
        for (int s = 0; s < cp; s++) {
            dk[s] = up(D, k[s], 4 * nk), dv[s] = up(D, v[s], 4 * nk);
            gk[s] = up(D, gk0[s], 4 * nk), gv[s] = up(D, gv0[s], 4 * nk);
            dpos[s] = up(D, pos[s], 4 * tl);
        }
        for (int step = 0; step < cp; step++) {
            int s = (qr - step + cp) % cp;
            must(D->api->attention_block_forward(D->dev, step ? o2 : out, step ? l2 : lse, dq, dk[s], dv[s], dpos[qr],
                                                 dpos[s], b, tl, tl, h, kvh, d),
                 D, "attention_block_forward");
            if (step)
                must(D->api->attention_merge(D->dev, out, lse, o2, l2, b, tl, h, d), D, "attention_merge");
        }
        for (int s = 0; s < cp; s++)
            must(D->api->attention_block_backward(D->dev, gq, gk[s], gv[s], dg, dq, dk[s], dv[s], out, lse, dpos[qr],
                                                  dpos[s], b, tl, tl, h, kvh, d),
                 D, "attention_block_backward");
        must(D->api->rope_forward_general(D->dev, rq, rq, dpos[qr], NULL, 500000.0f, b, tl, h, d), D,
             "rope_forward_general (positions)");
        must(D->api->rope_backward_general(D->dev, rg, dg, dpos[qr], NULL, 500000.0f, b, tl, h, d), D,
             "rope_backward_general (positions)");
        float *got[5 + 2 * CC_MAX_CP] = {down(D, out, nq), down(D, lse, nl), down(D, gq, nq), down(D, rq, nq),
                                         down(D, rg, nq)};
        for (int s = 0; s < cp; s++) {
            got[5 + 2 * s] = down(D, gk[s], nk);
            got[6 + 2 * s] = down(D, gv[s], nk);
            ns[5 + 2 * s] = ns[6 + 2 * s] = nk;
        }
        if (r < 2)
            memcpy(res[r], got, sizeof got);
        else
            for (int i = 0; i < 5 + 2 * cp; i++) {
                same_bits("cp ring (twice)", res[1][i], got[i], ns[i]);
                free(got[i]);
            }
        void *bufs[] = {dq, dg, gq, out, lse, o2, l2, rq, rg};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            D->api->free(D->dev, bufs[i]);
        for (int s = 0; s < cp; s++) {
            void *kb[] = {dk[s], dv[s], gk[s], gv[s], dpos[s]};
            for (size_t i = 0; i < sizeof kb / sizeof kb[0]; i++)
                D->api->free(D->dev, kb[i]);
        }
    }
    char what[128];
    const char *names[5] = {"merged out", "merged lse", "dq", "rope_forward_pos", "rope_backward_pos"};
    for (int i = 0; i < 5 + 2 * cp; i++) {
        char kname[32];
        if (i >= 5)
            snprintf(kname, sizeof kname, "%s of rank %d", (i - 5) % 2 ? "dv" : "dk", (i - 5) / 2);
        snprintf(what, sizeof what, "cp%d%s t%lld h%lld kvh%lld d%lld %s", cp, shuffle ? " shuffled" : "",
                 (long long)t, (long long)h, (long long)kvh, (long long)d, i < 5 ? names[i] : kname);
        compare(what, res[0][i], res[1][i], ns[i]);
        free(res[0][i]);
        free(res[1][i]);
    }
    for (int s = 0; s < cp; s++)
        free(pos[s]), free(k[s]), free(v[s]), free(gk0[s]), free(gv0[s]);
    free(q), free(g), free(gq0);
}

/* ABI 2.13: block-causal attention over packed documents of random lengths (up to maxlen) at
 * positions 0..t-1 of each row, forward and backward, the rows whole or (shuffled) a query half
 * against a key half as context parallel would cut them. */
static void doc_case(device *R, device *T, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d, int maxlen,
                     int split)
{
    int64_t tq = split ? t / 2 : t, tk = split ? t - t / 3 : t;
    int64_t nq = b * tq * h * d, nk = b * tk * kvh * d, nl = b * h * tq;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)t), *pos = malloc(sizeof(int32_t) * (size_t)(b * t));
    int32_t *doc = malloc(sizeof(int32_t) * (size_t)(b * t));
    int32_t *qp = malloc(sizeof(int32_t) * (size_t)(b * tq)), *qd = malloc(sizeof(int32_t) * (size_t)(b * tq));
    int32_t *kp = malloc(sizeof(int32_t) * (size_t)(b * tk)), *kd = malloc(sizeof(int32_t) * (size_t)(b * tk));
    for (int64_t i = 0; i < t; i++)
        rows[i] = (int32_t)i;
    for (int64_t i = t - 1; split && i > 0; i--) {
        int64_t j = (int64_t)((urand() + 1.0f) * 0.5f * (float)(i + 1));
        j = j > i ? i : j;
        int32_t x = rows[i];
        rows[i] = rows[j];
        rows[j] = x;
    }
    for (int64_t bi = 0; bi < b; bi++) {
        int32_t dc = 0, left = 1 + (int32_t)((urand() + 1.0f) * 0.5f * (float)maxlen);
        for (int64_t i = 0; i < t; i++) {
            pos[bi * t + i] = (int32_t)i;
            doc[bi * t + i] = dc;
            if (--left <= 0) {
                dc++;
                left = 1 + (int32_t)((urand() + 1.0f) * 0.5f * (float)maxlen);
            }
        }
        for (int64_t i = 0; i < tq; i++)
            qp[bi * tq + i] = pos[bi * t + rows[i]], qd[bi * tq + i] = doc[bi * t + rows[i]];
        for (int64_t j = 0; j < tk; j++)
            kp[bi * tk + j] = pos[bi * t + rows[t - tk + j]], kd[bi * tk + j] = doc[bi * t + rows[t - tk + j]];
    }
    float *q = rand_host(nq, 1.5f), *k = rand_host(nk, 1.5f), *v = rand_host(nk, 1), *g = rand_host(nq, 1);
    float *gq0 = rand_host(nq, 0.5f), *gk0 = rand_host(nk, 0.5f), *gv0 = rand_host(nk, 0.5f);
    float *res[2][5];
    int64_t ns[5] = {nq, nl, nq, nk, nk};
    device *devs[2] = {R, T};
    for (int r = 0; r < 3; r++) { /* R once, T twice (determinism) */
        device *D = devs[r > 0];
        float *dq = up(D, q, 4 * nq), *dk = up(D, k, 4 * nk), *dv = up(D, v, 4 * nk), *dg = up(D, g, 4 * nq);
        float *gq = up(D, gq0, 4 * nq), *gk = up(D, gk0, 4 * nk), *gv = up(D, gv0, 4 * nk);
        float *out = up(D, NULL, 4 * nq), *lse = up(D, NULL, 4 * nl);
        int32_t *dqp = up(D, qp, 4 * b * tq), *dqd = up(D, qd, 4 * b * tq), *dkp = up(D, kp, 4 * b * tk),
                *dkd = up(D, kd, 4 * b * tk);
        must(D->api->attention_doc_forward(D->dev, out, lse, dq, dk, dv, dqp, dkp, dqd, dkd, b, tq, tk, h, kvh, d), D,
             "attention_doc_forward");
        must(D->api->attention_doc_backward(D->dev, gq, gk, gv, dg, dq, dk, dv, out, lse, dqp, dkp, dqd, dkd, b, tq, tk,
                                            h, kvh, d),
             D, "attention_doc_backward");
        float *got[5] = {down(D, out, nq), down(D, lse, nl), down(D, gq, nq), down(D, gk, nk), down(D, gv, nk)};
        for (int64_t i = 0; i < nl; i++) /* a query with no key: -inf on both, compared as 0 */
            if (isinf(got[1][i]))
                got[1][i] = 0;
        if (r < 2)
            memcpy(res[r], got, sizeof got);
        else
            for (int i = 0; i < 5; i++) {
                same_bits("attention_doc (twice)", res[1][i], got[i], ns[i]);
                free(got[i]);
            }
        void *bufs[] = {dq, dk, dv, dg, gq, gk, gv, out, lse, dqp, dqd, dkp, dkd};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            D->api->free(D->dev, bufs[i]);
    }
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        char what[128];
        snprintf(what, sizeof what, "attention_doc%s t%lld docs<=%d h%lld kvh%lld d%lld %s", split ? " split" : "",
                 (long long)t, maxlen, (long long)h, (long long)kvh, (long long)d, names[i]);
        compare(what, res[0][i], res[1][i], ns[i]);
        free(res[0][i]);
        free(res[1][i]);
    }
    free(rows), free(pos), free(doc), free(qp), free(qd), free(kp), free(kd);
    free(q), free(k), free(v), free(g), free(gq0), free(gk0), free(gv0);
}

/* ABI 2.4: rope with Llama 3.1's scaled table (theta 5e5, factor 8, original 8192, as the llama3
 * pack computes it), rows 0..t-1 and positions far into a long context (out of order). */
static void rope_freqs_case(device *R, device *T)
{
    const int64_t b = 2, t = 300, h = 4, d = 128, n = b * t * h * d;
    float inv[64];
    for (int64_t i = 0; i < d / 2; i++) {
        float f = 1.0f / powf(500000.0f, (float)(2 * i) / (float)d), wavelen = (1.0f / f) * 6.2831855f;
        float scaled = wavelen > 8192.0f ? f / 8.0f : f;
        if (!(wavelen < 2048.0f) && !(wavelen > 8192.0f)) {
            float smooth = ((1.0f / wavelen) * 8192.0f - 1.0f) / 3.0f;
            scaled = (1.0f - smooth) * scaled / 8.0f + smooth * scaled;
        }
        inv[i] = scaled;
    }
    int32_t pos[300];
    for (int64_t i = 0; i < t; i++)
        pos[i] = (int32_t)(120000 + (i * 37) % t * 3);
    float *x = rand_host(n, 1), *g0 = rand_host(n, 0.5f);
    float *res[2][4];
    device *devs[2] = {R, T};
    for (int r = 0; r < 2; r++) {
        device *D = devs[r];
        float *dinv = up(D, inv, sizeof inv);
        int32_t *dpos = up(D, pos, sizeof pos);
        for (int with_pos = 0; with_pos < 2; with_pos++) {
            float *dx = up(D, x, 4 * n), *dg = up(D, g0, 4 * n);
            must(D->api->rope_forward_general(D->dev, dx, dx, with_pos ? dpos : NULL, dinv, 1.0f, b, t, h, d), D,
                 "rope_forward_general (table)");
            must(D->api->rope_backward_general(D->dev, dg, dx, with_pos ? dpos : NULL, dinv, 1.0f, b, t, h, d), D,
                 "rope_backward_general (table)");
            res[r][2 * with_pos] = down(D, dx, n);
            res[r][2 * with_pos + 1] = down(D, dg, n);
            D->api->free(D->dev, dx);
            D->api->free(D->dev, dg);
        }
        D->api->free(D->dev, dinv);
        D->api->free(D->dev, dpos);
    }
    compare("rope_freqs_forward llama3 table t300 d128", res[0][0], res[1][0], n);
    compare("rope_freqs_backward llama3 table t300 d128", res[0][1], res[1][1], n);
    compare("rope_freqs_forward llama3 table, positions 120000+", res[0][2], res[1][2], n);
    compare("rope_freqs_backward llama3 table, positions 120000+", res[0][3], res[1][3], n);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++)
            free(res[r][i]);
    free(x), free(g0);
}

static void rope_matmul_sum_case(device *R, device *T)
{
    const int64_t b = 1, t = 300, h = 4, d = 128, n = b * t * h * d;
    const int64_t m = 300, nn = 257, k = 1000, big = 5000003;
    float *x = rand_host(n, 1), *g0 = rand_host(n, 0.5f);
    float *A = rand_host(k * m, 1), *B = rand_host(nn * k, 1), *C = rand_host(m * nn, 1);
    float *xb = rand_host(big, 1);
    float *res[2][3];
    double sums[2][2];
    device *devs[2] = {R, T};
    for (int r = 0; r < 2; r++) {
        device *D = devs[r];
        float *dx = up(D, x, 4 * n), *dg = up(D, g0, 4 * n);
        must(D->api->rope_forward_general(D->dev, dx, dx, NULL, NULL, 500000.0f, b, t, h, d), D, "rope_forward_general");
        must(D->api->rope_backward_general(D->dev, dg, dx, NULL, NULL, 500000.0f, b, t, h, d), D,
             "rope_backward_general");
        res[r][0] = down(D, dx, n);
        res[r][1] = down(D, dg, n);
        float *da = up(D, A, 4 * k * m), *db = up(D, B, 4 * nn * k), *dc = up(D, C, 4 * m * nn);
        must(D->api->matmul(D->dev, dc, da, db, m, nn, k, 1, 1, 0.5f, 0.25f), D, "matmul TT");
        res[r][2] = down(D, dc, m * nn);
        float *dbig = up(D, xb, 4 * (size_t)big);
        must(D->api->sum(D->dev, &sums[r][0], dbig, big), D, "sum");
        must(D->api->sum_squares(D->dev, &sums[r][1], dbig, big), D, "sum_squares");
        void *bufs[] = {dx, dg, da, db, dc, dbig};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            D->api->free(D->dev, bufs[i]);
    }
    compare("rope_forward t300 d128 theta 5e5", res[0][0], res[1][0], n);
    compare("rope_backward t300 d128 theta 5e5", res[0][1], res[1][1], n);
    compare("matmul TT m300 n257 k1000 alpha .5 beta .25", res[0][2], res[1][2], m * nn);
    for (int i = 0; i < 2; i++) {
        double e = fabs(sums[1][i] - sums[0][i]), tol = 1e-9 * (double)big;
        int ok = e <= tol;
        failures += !ok;
        printf("%s %-48s %.12g vs reference %.12g\n", ok ? "ok  " : "FAIL", i ? "sum_squares n5000003" : "sum n5000003",
               sums[1][i], sums[0][i]);
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++)
            free(res[r][i]);
    free(x), free(g0), free(A), free(B), free(C), free(xb);
}

static void amax_case(device *R, device *T, int64_t n)
{
    float *x = rand_host(n, 3);
    x[n / 2 + 17] = -7.5f; /* the maximum, past the first chunks */
    float got[2];
    device *devs[2] = {R, T};
    for (int r = 0; r < 2; r++) {
        device *D = devs[r];
        float *dx = up(D, x, 4 * n), *da = up(D, NULL, 4);
        must(D->api->amax(D->dev, da, dx, n, n), D, "amax");
        float *h = down(D, da, 1);
        got[r] = h[0];
        free(h);
        D->api->free(D->dev, dx), D->api->free(D->dev, da);
    }
    int ok = got[0] == got[1] && got[1] == 7.5f;
    failures += !ok;
    printf("%s %-48s %g vs reference %g\n", ok ? "ok  " : "FAIL", "amax tensorwise n3000001", (double)got[1],
           (double)got[0]);
    free(x);
}

/* The ABI 2.1 elementwise ops are one f32 expression each: the tested device must give the
 * reference's bits (NaNs aside, which need only both be NaN), with out aliasing x and n past a
 * grid's worth of blocks; and n = 0 does nothing on either. */
static void ew_case(device *R, device *T, int64_t n)
{
    float *x = rand_host(n, 2), *y = rand_host(n, 2);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f};
    for (int64_t i = 0; i + 1 < n; i += 101) { /* y's a place later: specials meet finite values */
        x[i] = special[(i / 101) % 6];
        y[i + 1] = special[(i / 101 + 3) % 6];
    }
    const char *names[7] = {"ew_axpby", "ew_mul", "ew_div", "ew_sqrt", "ew_sign", "ew_clamp", "ew_greater"};
    float *res[2][7];
    device *devs[2] = {R, T};
    for (int r = 0; r < 2; r++) {
        device *D = devs[r];
        const ct_device_api *a = D->api;
        if (!a->ew_axpby || !a->ew_mul || !a->ew_div || !a->ew_sqrt || !a->ew_sign || !a->ew_clamp || !a->ew_greater) {
            failures++;
            printf("FAIL %s has not every ew_* op\n", D->path);
            free(x), free(y);
            return;
        }
        for (int op = 0; op < 7; op++) {
            float *dx = up(D, x, 4 * (size_t)n), *dy = up(D, y, 4 * (size_t)n);
            ct_status st;
            switch (op) { /* out == x throughout */
            case 0: st = a->ew_axpby(D->dev, dx, 0.9f, dx, 0.1f, dy, n); break;
            case 1: st = a->ew_mul(D->dev, dx, dx, dy, n); break;
            case 2: st = a->ew_div(D->dev, dx, dx, dy, 1e-8f, n); break;
            case 3: st = a->ew_sqrt(D->dev, dx, dx, n); break;
            case 4: st = a->ew_sign(D->dev, dx, dx, n); break;
            case 5: st = a->ew_clamp(D->dev, dx, dx, -0.5f, 0.75f, n); break;
            default: st = a->ew_greater(D->dev, dx, dx, dy, n); break;
            }
            must(st, D, names[op]);
            must(a->ew_mul(D->dev, NULL, NULL, NULL, 0), D, "ew_mul n = 0");
            res[r][op] = down(D, dx, n);
            D->api->free(D->dev, dx), D->api->free(D->dev, dy);
        }
    }
    for (int op = 0; op < 7; op++) {
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++) {
            float u = res[0][op][i], v = res[1][op][i];
            if (!(isnan(u) && isnan(v)) && memcmp(&u, &v, sizeof u) != 0)
                bad = i;
        }
        char what[64];
        snprintf(what, sizeof what, "%s n%lld (out == x), bit for bit", names[op], (long long)n);
        failures += bad >= 0;
        if (bad < 0)
            printf("ok   %s\n", what);
        else
            printf("FAIL %s: at [%lld] %.9g vs reference %.9g\n", what, (long long)bad, (double)res[1][op][bad],
                   (double)res[0][op][bad]);
        free(res[0][op]), free(res[1][op]);
    }
    free(x), free(y);
}

/* A DeepSeek-V3-shaped MoE layer on both devices (sigmoid scores, a bias, 8 groups of which 3
 * eligible, normalised weights, 64 experts, 6 per token), forward and backward, each op's result
 * compared; the routing (indices, order, offsets) must be identical. The tested device runs twice
 * for bits. Top-k reads the reference's scores on both devices: a last-ulp difference in a sigmoid
 * must not be able to flip a near tie. */
static void moe_layer_case(device *R, device *T, int64_t n, int64_t e, int64_t k, int64_t dm, int64_t o)
{
    const int64_t nk = n * k;
    for (int r = 0; r < 2; r++) {
        const ct_device_api *A = r ? T->api : R->api;
        if (A->struct_size < offsetof(ct_device_api, moe_combine_backward) + sizeof(void *) ||
            !A->moe_combine_backward) {
            printf("skip moe layer: %s has no mixture-of-experts ops (ABI 2.14)\n", r ? T->path : R->path);
            return;
        }
    }
    float *logits = rand_host(n * e, 4), *bias = rand_host(e, 0.05f), *x = rand_host(n * dm, 1),
          *w = rand_host(e * o * dm, 0.3f), *dout = rand_host(n * o, 1);
    float *ref_scores = NULL;
    int32_t *routing[3][3] = {{0}};
    float *res[3][6];
    device *devs[3] = {R, T, T};
    for (int r = 0; r < 3; r++) {
        device *D = devs[r];
        const ct_device_api *A = D->api;
        float *dl = up(D, logits, 4 * n * e), *ds = up(D, NULL, 4 * n * e), *db = up(D, bias, 4 * e),
              *dwt = up(D, NULL, 4 * nk), *dx = up(D, x, 4 * n * dm), *dgx = up(D, NULL, 4 * nk * dm),
              *dw = up(D, w, 4 * e * o * dm), *dh = up(D, NULL, 4 * nk * o), *dy = up(D, NULL, 4 * n * o),
              *ddy = up(D, dout, 4 * n * o), *gh = up(D, NULL, 4 * nk * o), *gwt = up(D, NULL, 4 * nk),
              *ggx = up(D, NULL, 4 * nk * dm), *gw = up(D, NULL, 4 * e * o * dm), *gx = up(D, NULL, 4 * n * dm),
              *gs = up(D, NULL, 4 * n * e), *gl = up(D, NULL, 4 * n * e);
        int32_t *idx = up(D, NULL, 4 * nk), *order = up(D, NULL, 4 * nk), *inv = up(D, NULL, 4 * nk),
                *offsets = up(D, NULL, 4 * (e + 1));
        must(A->moe_scores_forward(D->dev, ds, dl, n, e, CT_MOE_SIGMOID), D, "moe_scores_forward");
        res[r][0] = down(D, ds, n * e);
        if (r == 0)
            ref_scores = res[0][0];
        else
            A->copy(D->dev, ds, ref_scores, 4 * (size_t)(n * e), CT_COPY_H2D);
        must(A->moe_topk_forward(D->dev, idx, dwt, ds, db, n, e, k, 8, 3, 1, 2.5f), D, "moe_topk_forward");
        must(A->moe_permute(D->dev, order, inv, offsets, idx, nk, e), D, "moe_permute");
        must(A->moe_gather_forward(D->dev, dgx, dx, order, n, k, dm), D, "moe_gather_forward");
        must(A->grouped_matmul_forward(D->dev, dh, dgx, dw, offsets, nk, e, o, dm), D, "grouped_matmul_forward");
        must(A->moe_combine_forward(D->dev, dy, dh, dwt, inv, n, k, o), D, "moe_combine_forward");
        must(A->moe_combine_backward(D->dev, gh, gwt, ddy, dh, dwt, inv, n, k, o), D, "moe_combine_backward");
        must(A->grouped_matmul_backward_input(D->dev, ggx, gh, dw, offsets, nk, e, o, dm), D,
             "grouped_matmul_backward_input");
        must(A->grouped_matmul_backward_weight(D->dev, gw, gh, dgx, offsets, nk, e, o, dm), D,
             "grouped_matmul_backward_weight");
        must(A->moe_gather_backward(D->dev, gx, ggx, inv, n, k, dm), D, "moe_gather_backward");
        must(A->moe_topk_backward(D->dev, gs, gwt, ds, idx, n, e, k, 1, 2.5f), D, "moe_topk_backward");
        must(A->moe_scores_backward(D->dev, gl, gs, ds, n, e, CT_MOE_SIGMOID), D, "moe_scores_backward");
        res[r][1] = down(D, dy, n * o);
        res[r][2] = down(D, gl, n * e);
        res[r][3] = down(D, gx, n * dm);
        res[r][4] = down(D, gw, e * o * dm);
        res[r][5] = down(D, dwt, nk);
        routing[r][0] = (int32_t *)down(D, idx, nk);
        routing[r][1] = (int32_t *)down(D, order, nk);
        routing[r][2] = (int32_t *)down(D, offsets, e + 1);
        float *fb[] = {dl, ds, db, dwt, dx, dgx, dw, dh, dy, ddy, gh, gwt, ggx, gw, gx, gs, gl};
        for (size_t b = 0; b < sizeof fb / sizeof fb[0]; b++)
            A->free(D->dev, fb[b]);
        A->free(D->dev, idx), A->free(D->dev, order), A->free(D->dev, inv), A->free(D->dev, offsets);
    }
    const char *names[] = {"scores", "out", "dlogits", "dx", "dw", "weights"};
    const int64_t sizes[] = {n * e, n * o, n * e, n * dm, e * o * dm, nk};
    char what[128];
    for (int q = 0; q < 6; q++) {
        snprintf(what, sizeof what, "moe layer n%lld e%lld k%lld %s", (long long)n, (long long)e, (long long)k,
                 names[q]);
        compare(what, res[0][q], res[1][q], sizes[q]);
        same_bits(what, res[1][q], res[2][q], sizes[q]);
    }
    const int64_t isz[] = {nk, nk, e + 1};
    const char *inames[] = {"idx", "order", "offsets"};
    for (int q = 0; q < 3; q++) {
        int same = memcmp(routing[0][q], routing[1][q], 4 * (size_t)isz[q]) == 0 &&
                   memcmp(routing[1][q], routing[2][q], 4 * (size_t)isz[q]) == 0;
        failures += !same;
        printf("%s moe layer %-38s %s\n", same ? "ok  " : "FAIL", inames[q], same ? "identical" : "differ");
    }
    for (int r = 0; r < 3; r++)
        for (int q = 0; q < 6; q++)
            free(res[r][q]);
    for (int r = 0; r < 3; r++)
        for (int q = 0; q < 3; q++)
            free(routing[r][q]);
    free(logits), free(bias), free(x), free(w), free(dout);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cross_check REFERENCE.so TESTED.so [RTOL]\n");
        return 2;
    }
    if (argc > 3)
        rtol = strtod(argv[3], NULL);
    device R, T;
    if (open_device(&R, argv[1]) || open_device(&T, argv[2]))
        return 2;
    attention_case(&R, &T, 1, 200, 4, 2, 64);
    attention_case(&R, &T, 1, 130, 2, 1, 128);
    attention_case(&R, &T, 2, 70, 3, 3, 48);
    cp_ring_case(&R, &T, 1, 512, 4, 1, 4, 2, 64, 0);
    cp_ring_case(&R, &T, 2, 264, 2, 0, 2, 1, 128, 1);
    cp_ring_case(&R, &T, 1, 300, 3, 2, 3, 3, 48, 1);
    doc_case(&R, &T, 2, 300, 4, 2, 64, 40, 0);
    doc_case(&R, &T, 1, 264, 2, 1, 128, 150, 1);
    doc_case(&R, &T, 2, 200, 3, 3, 48, 20, 1);
    cross_entropy_case(&R, &T, 5, 128256);
    embedding_backward_case(&R, &T, 6000, 300, 50);
    norm_weight_case(&R, &T, 300000, 8);
    rope_matmul_sum_case(&R, &T);
    rope_freqs_case(&R, &T);
    amax_case(&R, &T, 3000001);
    ew_case(&R, &T, 1000003);
    moe_layer_case(&R, &T, 509, 64, 6, 96, 80);
    R.api->destroy(R.dev);
    T.api->destroy(T.dev);
    printf("cross_check: %s (%d failure(s)), rtol %g\n", failures ? "FAIL" : "ok", failures, rtol);
    return failures ? 1 : 0;
}
