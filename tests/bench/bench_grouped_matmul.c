/* bench_grouped_matmul: the MoE experts' grouped GEMMs (ABI 2.14) against one dense sgemm of the
 * same total size, on one device plugin.
 *
 *     cc -std=c11 -O2 -D_GNU_SOURCE -Isdk/include -o build/bench_grouped_matmul tests/bench/bench_grouped_matmul.c -ldl
 *     build/bench_grouped_matmul [path/to/ctitan-DEVICE.so]     # default build/plugins/ctitan-cpu.so
 *
 * m routed rows over e experts in uneven segments (expert g gets a share growing with g, one gets
 * none), i input and o output features: forward, backward_input and backward_weight each do
 * 2 m o i FLOPs, as matmul does for (m, o, i). Prints GFLOP/s (best of 5) and the ratio to the
 * dense GEMM. Env CT_BENCH_THREADS sets the plugin's `threads` option.
 */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host.h"
#include "ctitan/util.h"

static const ct_device_api *api;
static ct_device *dev;

static void *buf(size_t bytes, const void *init)
{
    void *p;
    if (api->alloc(dev, bytes, &p) != CT_OK)
        exit(1);
    if (init)
        api->copy(dev, p, init, bytes, CT_COPY_H2D);
    else
        api->zero(dev, p, bytes);
    return p;
}

/* The four timed calls: 0 dense matmul, 1 forward, 2 backward_input, 3 backward_weight. */
typedef struct bench_bufs {
    float *x, *w, *y, *dx, *dw;
    int32_t *offsets;
    int64_t m, e, o, i;
} bench_bufs;

static ct_status bench_call(const bench_bufs *b, int which)
{
    switch (which) {
    case 0:
        return api->matmul(dev, b->y, b->x, b->w, b->m, b->o, b->i, 0, 1, 1, 0);
    case 1:
        return api->grouped_matmul_forward(dev, b->y, b->x, b->w, b->offsets, b->m, b->e, b->o, b->i);
    case 2:
        return api->grouped_matmul_backward_input(dev, b->dx, b->y, b->w, b->offsets, b->m, b->e, b->o, b->i);
    default:
        return api->grouped_matmul_backward_weight(dev, b->dw, b->y, b->x, b->offsets, b->m, b->e, b->o, b->i);
    }
}

/* seconds of the best of 5 calls, after one warm-up */
static double best_of(const bench_bufs *b, int which)
{
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = ct_util_now();
        if (bench_call(b, which) != CT_OK)
            exit(1);
        api->synchronize(dev);
        double dt = ct_util_now() - t0;
        if (rep > 0 && dt < best)
            best = dt;
    }
    return best;
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
    if (api->struct_size < offsetof(ct_device_api, moe_combine_backward) + sizeof(void *) ||
        !api->grouped_matmul_forward) {
        printf("%s has no grouped GEMM (ABI 2.14): skipped\n", path);
        return 0;
    }
    if (api->create(&host, &dev) != CT_OK)
        return 1;
    const int64_t e = 8, m = 2048, in = 512, o = 704;
    int32_t offsets[9];
    int64_t weight_sum = e * (e - 1) / 2; /* expert g gets m * g / sum(g): 0 rows for expert 0 */
    offsets[0] = 0;
    for (int64_t g = 0, acc = 0; g < e; g++) {
        acc += g;
        offsets[g + 1] = (int32_t)(g + 1 == e ? m : m * acc / weight_sum);
    }
    float *host_x = malloc((size_t)(m * in) * sizeof(float)), *host_w = malloc((size_t)(e * o * in) * sizeof(float));
    for (int64_t j = 0; j < m * in; j++)
        host_x[j] = (float)((j * 7919) % 1000) / 1000.0f - 0.5f;
    for (int64_t j = 0; j < e * o * in; j++)
        host_w[j] = (float)((j * 104729) % 1000) / 1000.0f - 0.5f;
    float *x = buf((size_t)(m * in) * 4, host_x), *w = buf((size_t)(e * o * in) * 4, host_w),
          *y = buf((size_t)(m * o) * 4, NULL), *dx = buf((size_t)(m * in) * 4, NULL),
          *dw = buf((size_t)(e * o * in) * 4, NULL);
    int32_t *doff = buf(sizeof offsets, offsets);
    const double flops = 2.0 * (double)m * (double)o * (double)in;
    const bench_bufs bb = {x, w, y, dx, dw, doff, m, e, o, in};
    double dense = best_of(&bb, 0), fwd = best_of(&bb, 1), bin = best_of(&bb, 2), bw = best_of(&bb, 3);
    ct_device_info di = {.struct_size = sizeof di};
    api->info(dev, &di);
    printf("grouped GEMM on %s, %lld experts (uneven segments, one empty), m=%lld rows, i=%lld, o=%lld:\n",
           di.name, (long long)e, (long long)m, (long long)in, (long long)o);
    printf("  one dense sgemm (%lld,%lld)x(%lld,%lld)^T  %8.1f GFLOP/s\n", (long long)m, (long long)in, (long long)o,
           (long long)in, flops / dense / 1e9);
    printf("  grouped_matmul_forward          %8.1f GFLOP/s (%.2f of dense)\n", flops / fwd / 1e9, dense / fwd);
    printf("  grouped_matmul_backward_input   %8.1f GFLOP/s (%.2f of dense)\n", flops / bin / 1e9, dense / bin);
    printf("  grouped_matmul_backward_weight  %8.1f GFLOP/s (%.2f of dense)\n", flops / bw / 1e9, dense / bw);
    api->free(dev, x), api->free(dev, w), api->free(dev, y), api->free(dev, dx), api->free(dev, dw);
    api->free(dev, doff);
    api->destroy(dev);
    free(host_x);
    free(host_w);
    return 0;
}
