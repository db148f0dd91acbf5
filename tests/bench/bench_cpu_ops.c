/* bench_cpu_ops: times the hot ops of a device plugin at the shapes of the benchmarked models.
 *
 *     cc -std=c11 -O2 -D_GNU_SOURCE -Isdk/include -o build/bench_cpu_ops tests/bench/bench_cpu_ops.c -ldl -lm
 *     build/bench_cpu_ops [path/to/ctitan-cpu.so]      # default build/plugins/ctitan-cpu.so
 *
 * Env CT_BENCH_THREADS sets the plugin's `threads` option (default: its own default).
 * Prints one line per op: shape, milliseconds per call (best of a few), GFLOP/s where it means
 * something. Shapes: llama debugmodel (dim 256, 16 heads of 16, seq 256, batch 8, vocab 2000) and
 * a 124M-class model (dim 768, 12 heads of 64, seq 512, batch 4, vocab 50257).
 */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"

#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host.h"
#include "ctitan/util.h"

static const ct_device_api *api;
static ct_device *dev;

static float *buf(int64_t n, float scale)
{
    void *p;
    if (api->alloc(dev, (size_t)n * sizeof(float), &p) != CT_OK)
        exit(1);
    float *f = malloc((size_t)n * sizeof(float));
    uint64_t s = 12345;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        f[i] = scale * ((float)(s >> 40) / 8388608.0f - 1.0f);
    }
    api->copy(dev, p, f, (size_t)n * sizeof(float), CT_COPY_H2D);
    free(f);
    return p;
}

#define TIME(label, flops, call)                                                                   \
    do {                                                                                           \
        double best = 1e30;                                                                        \
        for (int rep = 0; rep < 5; rep++) {                                                        \
            double t0 = ct_util_now();                                                                     \
            if ((call) != CT_OK)                                                                   \
                exit(1);                                                                           \
            api->synchronize(dev);                                                                 \
            double dt = ct_util_now() - t0;                                                                \
            best = dt < best ? dt : best;                                                          \
        }                                                                                          \
        if ((flops) > 0)                                                                           \
            printf("%-58s %9.2f ms %8.1f GFLOP/s\n", label, best * 1e3, (flops) / best / 1e9);     \
        else                                                                                       \
            printf("%-58s %9.2f ms\n", label, best * 1e3);                                         \
    } while (0)

static void bench_attention(int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d)
{
    int64_t nq = b * t * h * d, nk = b * t * kvh * d;
    float *q = buf(nq, 1), *k = buf(nk, 1), *v = buf(nk, 1), *out = buf(nq, 0),
          *lse = buf(b * h * t, 0);
    float *dq = buf(nq, 0), *dk = buf(nk, 0), *dv = buf(nk, 0), *dout = buf(nq, 1);
    double fwd = 4.0 * b * h * t * t * d / 2; /* causal: half the scores */
    char label[128];
    snprintf(label, sizeof label, "attention_forward  b=%ld t=%ld h=%ld kvh=%ld d=%ld", (long)b,
             (long)t, (long)h, (long)kvh, (long)d);
    TIME(label, fwd, api->attention_forward(dev, out, lse, q, k, v, b, t, h, kvh, d));
    snprintf(label, sizeof label, "attention_backward b=%ld t=%ld h=%ld kvh=%ld d=%ld", (long)b,
             (long)t, (long)h, (long)kvh, (long)d);
    TIME(label, 2.5 * fwd,
         api->attention_backward(dev, dq, dk, dv, dout, q, k, v, out, lse, b, t, h, kvh, d));
    float *bufs[] = {q, k, v, out, lse, dq, dk, dv, dout};
    for (int i = 0; i < 9; i++)
        api->free(dev, bufs[i]);
}

/* One context-parallel rank's buffers: queries at qpos against cp key blocks at kpos[s]. */
typedef struct cp_rank {
    float *q, *k, *v, *out, *o2, *lse, *l2, *dout, *dq, *dk, *dv;
    int32_t *qpos, *kpos[8];
    int64_t b, tl, h, kvh, d;
    int cp;
} cp_rank;

/* the ring forward: the rank's own block, then every other block merged in */
static ct_status cp_ring_forward(const cp_rank *c)
{
    ct_status st = CT_OK;
    for (int s = 0; s < c->cp && st == CT_OK; s++) {
        st = api->attention_block_forward(dev, s ? c->o2 : c->out, s ? c->l2 : c->lse, c->q, c->k, c->v, c->qpos,
                                          c->kpos[s], c->b, c->tl, c->tl, c->h, c->kvh, c->d);
        if (s && st == CT_OK)
            st = api->attention_merge(dev, c->out, c->lse, c->o2, c->l2, c->b, c->tl, c->h, c->d);
    }
    return st;
}

static ct_status cp_ring_backward(const cp_rank *c)
{
    ct_status st = CT_OK;
    for (int s = 0; s < c->cp && st == CT_OK; s++)
        st = api->attention_block_backward(dev, c->dq, c->dk, c->dv, c->dout, c->q, c->k, c->v, c->out, c->lse,
                                           c->qpos, c->kpos[s], c->b, c->tl, c->tl, c->h, c->kvh, c->d);
    return st;
}

/* Context parallel (ABI 2.3): a t-row sequence over cp ranks in load-balanced chunks (rank r
 * holds chunks r and 2cp-1-r of 2cp), each rank's ring of cp key blocks (block forward + merge,
 * then the cp block backwards) timed per rank. Balanced and mask-skipping, each rank's time is
 * about the whole sequence's attention (bench_attention at t) over cp. */
static void bench_attention_cp(int64_t b, int64_t t, int cp, int64_t h, int64_t kvh, int64_t d)
{
    if (api->struct_size < offsetof(ct_device_api, attention_block_backward) + sizeof(void *) ||
        !api->attention_block_forward || !api->attention_merge || !api->attention_block_backward || cp > 8)
        return;
    int64_t tl = t / cp, chunk = t / (2 * cp), nq = b * tl * h * d, nk = b * tl * kvh * d;
    cp_rank c = {.q = buf(nq, 1), .k = buf(nk, 1), .v = buf(nk, 1), .out = buf(nq, 0), .o2 = buf(nq, 0),
                 .lse = buf(b * h * tl, 0), .l2 = buf(b * h * tl, 0), .dout = buf(nq, 1), .dq = buf(nq, 0),
                 .dk = buf(nk, 0), .dv = buf(nk, 0), .b = b, .tl = tl, .h = h, .kvh = kvh, .d = d, .cp = cp};
    int32_t *host_pos = malloc((size_t)tl * sizeof(int32_t));
    for (int r = 0; r < cp; r++) {
        for (int64_t i = 0; i < chunk; i++) {
            host_pos[i] = (int32_t)(r * chunk + i);
            host_pos[chunk + i] = (int32_t)((2 * cp - 1 - r) * chunk + i);
        }
        void *p;
        if (api->alloc(dev, (size_t)tl * sizeof(int32_t), &p) != CT_OK)
            exit(1);
        api->copy(dev, p, host_pos, (size_t)tl * sizeof(int32_t), CT_COPY_H2D);
        c.kpos[r] = p;
    }
    double fwd = 4.0 * b * h * t * t * d / 2 / cp; /* a rank's share of the causal scores */
    char label[128];
    for (int r = 0; r < cp; r++) {
        c.qpos = c.kpos[r];
        snprintf(label, sizeof label, "cp ring fwd rank %d/%d b=%ld t=%ld h=%ld kvh=%ld d=%ld", r, cp, (long)b,
                 (long)t, (long)h, (long)kvh, (long)d);
        TIME(label, fwd, cp_ring_forward(&c));
        snprintf(label, sizeof label, "cp ring bwd rank %d/%d b=%ld t=%ld h=%ld kvh=%ld d=%ld", r, cp, (long)b,
                 (long)t, (long)h, (long)kvh, (long)d);
        TIME(label, 2.5 * fwd, cp_ring_backward(&c));
    }
    float *bufs[] = {c.q, c.k, c.v, c.out, c.o2, c.lse, c.l2, c.dout, c.dq, c.dk, c.dv};
    for (int i = 0; i < 11; i++)
        api->free(dev, bufs[i]);
    for (int r = 0; r < cp; r++)
        api->free(dev, c.kpos[r]);
    free(host_pos);
}

static void bench_model(const char *name, int64_t n, int64_t c, int64_t ffn, int64_t vocab)
{
    char label[128];
    float *x = buf(n * c, 1), *w = buf(c, 1), *y = buf(n * c, 0), *rstd = buf(n, 0),
          *dx = buf(n * c, 0);
    float *W = buf(c * c, 0.05f), *a = buf(n * ffn, 2), *g = buf(n * ffn, 1), *o = buf(n * ffn, 0);
    float *da = buf(n * ffn, 0), *dg = buf(n * ffn, 0), *dw = buf(c, 0);
    snprintf(label, sizeof label, "%s matmul x@W^T (%ld,%ld)x(%ld,%ld)", name, (long)n, (long)c,
             (long)c, (long)c);
    TIME(label, 2.0 * n * c * c, api->matmul(dev, y, x, W, n, c, c, 0, 1, 1, 0));
    snprintf(label, sizeof label, "%s rmsnorm fwd+bwd (%ld,%ld)", name, (long)n, (long)c);
    TIME(label, 0,
         api->rmsnorm_forward(dev, y, rstd, x, w, n, c, 1e-5f) ||
             api->rmsnorm_backward_input(dev, dx, x, x, w, rstd, n, c) ||
             api->rmsnorm_backward_weight(dev, dw, x, x, rstd, n, c));
    snprintf(label, sizeof label, "%s swiglu fwd+bwd (%ld)", name, (long)(n * ffn));
    TIME(label, 0,
         api->swiglu_forward(dev, o, a, g, n * ffn) ||
             api->swiglu_backward(dev, da, dg, o, a, g, n * ffn));
    snprintf(label, sizeof label, "%s gelu fwd+bwd (%ld)", name, (long)(n * ffn));
    TIME(label, 0,
         api->gelu_forward(dev, o, a, n * ffn) || api->gelu_backward(dev, da, o, a, n * ffn));
    float *bufs[] = {x, w, y, rstd, dx, W, a, g, o, da, dg, dw};
    for (int i = 0; i < 12; i++)
        api->free(dev, bufs[i]);

    float *logits = buf(n * vocab, 3), *dl = buf(n * vocab, 0), *losses = buf(n, 0);
    int32_t *tg;
    api->alloc(dev, sizeof(int32_t) * (size_t)n, (void **)&tg);
    int32_t *ht = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ht[i] = (int32_t)((i * 7919) % vocab);
    api->copy(dev, tg, ht, sizeof(int32_t) * (size_t)n, CT_COPY_H2D);
    snprintf(label, sizeof label, "%s cross_entropy fwd+bwd (%ld,%ld)", name, (long)n, (long)vocab);
    TIME(label, 0,
         api->cross_entropy_forward(dev, losses, logits, tg, n, vocab, -100) ||
             api->cross_entropy_backward_general(dev, dl, logits, tg, NULL, 1.0f / n, NULL, n, vocab, 0, -100));
    free(ht);
    api->free(dev, tg);
    api->free(dev, logits);
    api->free(dev, dl);
    api->free(dev, losses);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "build/plugins/ctitan-cpu.so";
    void *so = dlopen(path, RTLD_NOW);
    if (!so) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    if (!entry || entry(&host, &info) != CT_OK || info.kind != CT_KIND_DEVICE)
        return 1;
    options = info.options;
    api = info.api;
    if (api->create(&host, &dev) != CT_OK)
        return 1;
    ct_device_info di = {.struct_size = sizeof di};
    api->info(dev, &di);
    double peak = 0;
    if (api->measure_peak_flops)
        api->measure_peak_flops(dev, &peak);
    printf("device %s, %d threads, sgemm peak %.1f GFLOP/s\n", di.name, di.threads, peak / 1e9);
    bench_attention(8, 256, 16, 16, 16);
    bench_attention(4, 512, 12, 12, 64);
    bench_attention(1, 2048, 12, 12, 64);
    bench_attention_cp(1, 2048, 4, 12, 12, 64);
    bench_model("debugmodel", 8 * 256, 256, 768, 2000);
    bench_model("124M", 4 * 512, 768, 3072, 50257);
    api->destroy(dev);
    return 0;
}
