/* comm_conformance: the contract of ctitan/comm.h, run under mpirun against a comm plugin.
 *
 * Usage:
 *     mpirun -n N build/tests/mpi/comm_conformance build/plugins/ctitan-mpi.so [key=value ...]
 *     build/tests/mpi/comm_conformance build/plugins/ctitan-mpi.so     # one rank, MPI singleton
 *     mpirun -n N ... comm_conformance PLUGIN --abort CODE             # the last rank calls abort
 *     mpirun -n N ... comm_conformance PLUGIN --loop      # all_reduce until one fails (kill a rank)
 *
 * key=value pairs are the plugin's options, as its manifest section would set them. Unless given,
 * train_timeout_seconds is 2 here so that the timeout checks take seconds, not minutes.
 *
 * Output: rank 0 prints "ok <check>" or "FAIL <check>" for each check (every rank's verdict, combined
 * over MPI_COMM_WORLD); a rank that sees a failure prints "FAIL [rank r] <detail>". The exit status
 * is 0 when every check passed on every rank.
 *
 * What it checks, on the world group and on split sub-groups (color rank/2 and rank%2, the two axes
 * of a 2 x N/2 mesh, and a group ordered by a reversed key):
 *   - the plugin info and API table; split ranks follow the key;
 *   - all_reduce SUM/MAX/MIN of f32, f64, i32 and bf16, in place and not, against exact values;
 *     bf16 sums rounded to nearest even; the same inputs give the same bits on every rank and run;
 *   - all_gather, reduce_scatter, broadcast (every root), all_to_all, in place and not, of every
 *     dtype they move; send/recv around a ring, paired by tag; barrier;
 *   - several operations in flight at once, on two groups, waited in reverse order;
 *   - bad arguments fail locally with a message (the ranks stay in step);
 *   - timeouts: a recv nobody sends and an all_reduce rank 0 skips return CT_ERR_TIMEOUT within
 *     twice the timeout, with a message naming the operation and group; then the late sends and
 *     the late rank arrive, every rank continues, and the abandoned operations complete.
 *
 * The program dlopens the plugin and hands it a minimal ct_host written here; it links no part of
 * the core. It uses MPI directly (MPI_COMM_WORLD, which the plugin never uses) only to combine the
 * verdicts and to tell rank 0 when the others have timed out, after the plugin has started MPI.
 */
#include "ctitan/abi.h"
#include "ctitan/comm.h"
#include "ctitan/host.h"

#include <mpi.h>

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the minimal host */

static char last_error[1024];
static const ct_option_spec *plugin_options;
static char **option_args; /* "key=value" from the command line */
static int option_nargs;

static void host_log(const ct_host *h, ct_log_level level, const char *fmt, ...)
{
    (void)h;
    if (!getenv("CT_CONFORMANCE_VERBOSE") && level < CT_LOG_WARN)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "plugin log: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static void host_set_error(const ct_host *h, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

static void *host_mem_alloc(const ct_host *h, size_t bytes, ct_mem_category cat)
{
    (void)h;
    (void)cat;
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

static void host_mem_free(const ct_host *h, void *p)
{
    (void)h;
    free(p);
}

static void host_mem_account(const ct_host *h, ct_mem_category cat, int64_t delta)
{
    (void)h;
    (void)cat;
    (void)delta;
}

/* The option's text: key=value from the command line, else this harness's default for
 * train_timeout_seconds, else the spec's default. NULL when the spec does not declare the key with
 * this type (*known = 0: a plugin bug) or it is unset. */
static const char *host_option_text(const char *key, ct_opt_type type, int *known)
{
    const ct_option_spec *spec = NULL;
    for (const ct_option_spec *o = plugin_options; o && o->key; o++)
        if (strcmp(o->key, key) == 0)
            spec = o;
    *known = spec && spec->type == type;
    if (!*known)
        return NULL;
    size_t klen = strlen(key);
    for (int i = 0; i < option_nargs; i++)
        if (strncmp(option_args[i], key, klen) == 0 && option_args[i][klen] == '=')
            return option_args[i] + klen + 1;
    if (strcmp(key, "train_timeout_seconds") == 0)
        return "2";
    return spec->default_value;
}

static ct_status host_opt_int(const ct_host *h, const char *key, int64_t *out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_INT, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = strtoll(s, NULL, 10);
    return CT_OK;
}

static ct_status host_opt_float(const ct_host *h, const char *key, double *out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_FLOAT, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = strtod(s, NULL);
    return CT_OK;
}

static ct_status host_opt_bool(const ct_host *h, const char *key, int *out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_BOOL, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = strcmp(s, "true") == 0 || strcmp(s, "1") == 0;
    return CT_OK;
}

static ct_status host_opt_string(const ct_host *h, const char *key, const char **out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_STRING, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = s;
    return CT_OK;
}

static void host_trace(const ct_host *h, const char *name)
{
    (void)h;
    (void)name;
}

static const ct_host test_host = {
    .struct_size = sizeof(ct_host),
    .abi_major = CT_ABI_MAJOR,
    .abi_minor = CT_ABI_MINOR,
    .log = host_log,
    .set_error = host_set_error,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_account = host_mem_account,
    .opt_int = host_opt_int,
    .opt_float = host_opt_float,
    .opt_bool = host_opt_bool,
    .opt_string = host_opt_string,
    .trace_begin = host_trace,
    .trace_end = host_trace,
};

/* ---------------------------------------------------------------- verdicts */

static const ct_comm_api *api;
static ct_comm *comm;
static int wrank, wsize;    /* in the world group */
static int local_fails;     /* failures on this rank in the current check */
static int failed_checks;   /* checks that failed on some rank */

__attribute__((format(printf, 1, 2))) static void failf(const char *fmt, ...)
{
    if (++local_fails > 6)
        return; /* the first few say enough */
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL [rank %d] ", wrank);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

/* Ends a check: every rank's verdict, combined over MPI_COMM_WORLD, printed by rank 0. */
static void check_done(const char *name)
{
    int fails = local_fails;
    MPI_Allreduce(MPI_IN_PLACE, &fails, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (fails)
        failed_checks++;
    if (wrank == 0) {
        printf("%s %s\n", fails ? "FAIL" : "ok", name);
        fflush(stdout);
    }
    local_fails = 0;
}

static void expect_status(ct_status got, ct_status want, const char *what)
{
    if (got != want)
        failf("%s: status %d, expected %d (%s)", what, (int)got, (int)want,
              got ? last_error : "no error");
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- values */

typedef struct group {
    ct_comm_group *g;
    const char *name;
    int rank, size;
} group;

static const char *dtype_name(ct_dtype dt)
{
    switch (dt) {
    case CT_F32: return "f32";
    case CT_F64: return "f64";
    case CT_I32: return "i32";
    case CT_BF16: return "bf16";
    case CT_F8_E4M3: return "f8_e4m3";
    case CT_F8_E5M2: return "f8_e5m2";
    }
    return "?";
}

static const char *op_name(ct_reduce_op op)
{
    return op == CT_REDUCE_SUM ? "sum" : op == CT_REDUCE_MAX ? "max" : "min";
}

/* Element i of rank r's input: small multiples of 1/4 (1/2 for bf16), so every partial sum over
 * up to 8 ranks is exact in the dtype and the expected result does not depend on the order. */
static double value(ct_dtype dt, int r, int64_t i)
{
    switch (dt) {
    case CT_I32: return (double)(((i % 1001) - 500) * (r + 1) * 1000 + r);
    case CT_BF16: return (double)((i % 9) - 4) * (r + 1) * 0.5;
    default: return (double)((i % 17) - 8) * (r + 1) + 0.25 * (double)(i % 4);
    }
}

static void put(ct_dtype dt, void *buf, int64_t i, double v)
{
    switch (dt) {
    case CT_F32: ((float *)buf)[i] = (float)v; break;
    case CT_F64: ((double *)buf)[i] = v; break;
    case CT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case CT_BF16: {
        float f = (float)v; /* exactly representable: the top 16 bits are the bf16 value */
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        break;
    }
    default: break;
    }
}

static double get(ct_dtype dt, const void *buf, int64_t i)
{
    switch (dt) {
    case CT_F32: return ((const float *)buf)[i];
    case CT_F64: return ((const double *)buf)[i];
    case CT_I32: return ((const int32_t *)buf)[i];
    case CT_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    default: return NAN;
    }
}

static double reduce_expected(ct_dtype dt, ct_reduce_op op, int size, int64_t i)
{
    double acc = value(dt, 0, i);
    for (int q = 1; q < size; q++) {
        double v = value(dt, q, i);
        acc = op == CT_REDUCE_SUM ? acc + v : op == CT_REDUCE_MAX ? fmax(acc, v) : fmin(acc, v);
    }
    return acc;
}

/* Bytes that identify (seed, byte index): what data-movement checks send and expect. */
static void fill_bytes(void *buf, size_t n, unsigned seed)
{
    unsigned char *p = buf;
    for (size_t k = 0; k < n; k++)
        p[k] = (unsigned char)((seed * 131u + k * 7u + (k >> 8)) & 0xFFu);
}

static int bytes_match(const void *buf, size_t n, unsigned seed)
{
    const unsigned char *p = buf;
    for (size_t k = 0; k < n; k++)
        if (p[k] != (unsigned char)((seed * 131u + k * 7u + (k >> 8)) & 0xFFu))
            return 0;
    return 1;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(p, 0xA5, n); /* not a valid result anywhere */
    return p;
}

/* ---------------------------------------------------------------- plugin info, groups */

static void check_plugin_info(const ct_plugin_info *info)
{
    if (info->kind != CT_KIND_COMM)
        failf("kind %d, expected CT_KIND_COMM", (int)info->kind);
    if (info->abi_major != CT_ABI_MAJOR)
        failf("abi_major %u, expected %d", info->abi_major, CT_ABI_MAJOR);
    if (!info->name || !*info->name)
        failf("no name");
    int has_train = 0, has_init = 0;
    for (const ct_option_spec *o = info->options; o && o->key; o++) {
        has_train |= strcmp(o->key, "train_timeout_seconds") == 0 && o->type == CT_OPT_FLOAT;
        has_init |= strcmp(o->key, "init_timeout_seconds") == 0 && o->type == CT_OPT_FLOAT;
    }
    if (!has_train || !has_init)
        failf("options lack train_timeout_seconds or init_timeout_seconds (float)");
    const ct_comm_api *a = info->api;
    if (!a || a->struct_size < offsetof(ct_comm_api, test)) {
        failf("API table missing or smaller than ct_comm_api");
        return;
    }
    if (!a->create || !a->destroy || !a->world || !a->group_rank || !a->split || !a->group_free ||
        !a->all_reduce || !a->all_gather || !a->reduce_scatter || !a->broadcast ||
        !a->all_to_all || !a->send || !a->recv || !a->barrier || !a->wait || !a->abort)
        failf("a function of ct_comm_api is NULL");
}

static group split_group(group *parent, int color, int key, const char *name)
{
    group g = {NULL, name, -1, -1};
    expect_status(api->split(comm, parent->g, color, key, name, &g.g), CT_OK, name);
    if (g.g)
        expect_status(api->group_rank(comm, g.g, &g.rank, &g.size), CT_OK, "group_rank");
    return g;
}

/* The reversed-key group: its rank order is the world's backwards, which all_gather shows. */
static void check_split_order(group *rev)
{
    if (rev->rank != wsize - 1 - wrank || rev->size != wsize)
        failf("split with key -rank: rank %d of %d, expected %d of %d", rev->rank, rev->size,
              wsize - 1 - wrank, wsize);
    int32_t mine = wrank, *all = xmalloc(sizeof(int32_t) * (size_t)wsize);
    expect_status(api->all_gather(comm, rev->g, &mine, all, 1, CT_I32, NULL), CT_OK,
                  "all_gather on rev");
    for (int q = 0; q < wsize; q++)
        if (all[q] != wsize - 1 - q)
            failf("rev group: block %d came from world rank %d, expected %d", q, all[q],
                  wsize - 1 - q);
    free(all);
}

/* ---------------------------------------------------------------- collectives */

static const ct_dtype reduce_dtypes[] = {CT_F32, CT_F64, CT_I32, CT_BF16};
static const ct_dtype move_dtypes[] = {CT_F32, CT_F64, CT_I32, CT_BF16, CT_F8_E4M3, CT_F8_E5M2};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void check_all_reduce_one(group *g, ct_dtype dt, ct_reduce_op op, int in_place, int64_t n)
{
    size_t es = ct_dtype_size(dt);
    void *send = xmalloc(es * (size_t)n), *recv = in_place ? send : xmalloc(es * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        put(dt, send, i, value(dt, g->rank, i));
    char what[128];
    snprintf(what, sizeof what, "all_reduce %s of %lld %s on %s%s", op_name(op), (long long)n,
             dtype_name(dt), g->name, in_place ? " in place" : "");
    expect_status(api->all_reduce(comm, g->g, send, recv, n, dt, op, NULL), CT_OK, what);
    for (int64_t i = 0; i < n; i++) {
        double want = reduce_expected(dt, op, g->size, i), got = get(dt, recv, i);
        if (got != want) {
            failf("%s: element %lld is %.9g, expected %.9g", what, (long long)i, got, want);
            break;
        }
    }
    if (!in_place)
        free(recv);
    free(send);
}

static void check_all_reduce(group *g)
{
    const ct_reduce_op ops[] = {CT_REDUCE_SUM, CT_REDUCE_MAX, CT_REDUCE_MIN};
    for (int d = 0; d < NELEM(reduce_dtypes); d++)
        for (int o = 0; o < 3; o++)
            for (int in_place = 0; in_place < 2; in_place++)
                check_all_reduce_one(g, reduce_dtypes[d], ops[o], in_place, 1031);
    check_all_reduce_one(g, CT_F32, CT_REDUCE_SUM, 0, 1);
    check_all_reduce_one(g, CT_F32, CT_REDUCE_SUM, 0, 0);
}

/* bf16 sums round to nearest, ties to even. Rank 0 gives x, rank 1 gives y, the others +0: the
 * result is round(x + y) whatever order the ranks are combined in. */
static void check_bf16_rounding(group *g)
{
    static const struct { uint16_t x, y, sum; } cases[] = {
        {0x3F80, 0x3B80, 0x3F80}, /* 1 + 2^-8: a tie, to even (down) */
        {0x3F81, 0x3B80, 0x3F82}, /* (1 + 2^-7) + 2^-8: a tie, to even (up) */
        {0x3F80, 0x3BC0, 0x3F81}, /* 1 + 1.5 * 2^-8: nearer the upper neighbour */
        {0xBF80, 0xBB80, 0xBF80}, /* -1 - 2^-8: a tie, to even */
        {0x7F7F, 0x7F7F, 0x7F80}, /* largest + largest: infinity */
        {0x4000, 0xC000, 0x0000}, /* 2 - 2 = +0 */
        {0x3F80, 0x7FC0, 0x7FC0}, /* 1 + NaN: NaN (any NaN) */
    };
    enum { N = (int)(sizeof cases / sizeof cases[0]) };
    if (g->size < 2)
        return;
    uint16_t buf[N];
    for (int i = 0; i < N; i++)
        buf[i] = g->rank == 0 ? cases[i].x : g->rank == 1 ? cases[i].y : 0;
    expect_status(api->all_reduce(comm, g->g, buf, buf, N, CT_BF16, CT_REDUCE_SUM, NULL), CT_OK,
                  "bf16 rounding all_reduce");
    for (int i = 0; i < N; i++) {
        int want_nan = (cases[i].sum & 0x7F80) == 0x7F80 && (cases[i].sum & 0x7F);
        int is_nan = (buf[i] & 0x7F80) == 0x7F80 && (buf[i] & 0x7F);
        if (want_nan ? !is_nan : buf[i] != cases[i].sum)
            failf("bf16 %04x + %04x on %s = %04x, expected %04x", cases[i].x, cases[i].y, g->name,
                  buf[i], cases[i].sum);
    }
}

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < n; k++)
        h = (h ^ b[k]) * 1099511628211ull;
    return h;
}

/* Random f32 (not exactly summable): two runs give the same bits, and every rank the same. */
static void check_deterministic(group *g)
{
    const int64_t n = 100003;
    float *x = xmalloc(sizeof(float) * (size_t)n), *a = xmalloc(sizeof(float) * (size_t)n),
          *b = xmalloc(sizeof(float) * (size_t)n);
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(wrank + 1);
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 1000.0f;
    }
    expect_status(api->all_reduce(comm, g->g, x, a, n, CT_F32, CT_REDUCE_SUM, NULL), CT_OK,
                  "determinism run 1");
    expect_status(api->all_reduce(comm, g->g, x, b, n, CT_F32, CT_REDUCE_SUM, NULL), CT_OK,
                  "determinism run 2");
    if (memcmp(a, b, sizeof(float) * (size_t)n) != 0)
        failf("all_reduce of random f32 on %s: two runs differ", g->name);
    uint64_t h = fnv1a(a, sizeof(float) * (size_t)n);
    /* every rank holds the same bits: the hash (as two i32 halves) has equal max and min */
    int32_t mine[2] = {(int32_t)(h >> 33), (int32_t)((h >> 2) & 0x7FFFFFFF)}, mx[2], mn[2];
    expect_status(api->all_reduce(comm, g->g, mine, mx, 2, CT_I32, CT_REDUCE_MAX, NULL), CT_OK,
                  "hash max");
    expect_status(api->all_reduce(comm, g->g, mine, mn, 2, CT_I32, CT_REDUCE_MIN, NULL), CT_OK,
                  "hash min");
    if (mx[0] != mn[0] || mx[1] != mn[1])
        failf("all_reduce of random f32 on %s: ranks hold different bits", g->name);
    free(x);
    free(a);
    free(b);
}

static void check_all_gather(group *g)
{
    const int64_t n = 257;
    for (int d = 0; d < NELEM(move_dtypes); d++) {
        ct_dtype dt = move_dtypes[d];
        size_t block = (size_t)n * ct_dtype_size(dt);
        for (int in_place = 0; in_place < 2; in_place++) {
            char *recv = xmalloc(block * (size_t)g->size);
            char *send = in_place ? recv + block * (size_t)g->rank : xmalloc(block);
            fill_bytes(send, block, (unsigned)g->rank + 1);
            char what[128];
            snprintf(what, sizeof what, "all_gather of %lld %s on %s%s", (long long)n,
                     dtype_name(dt), g->name, in_place ? " in place" : "");
            expect_status(api->all_gather(comm, g->g, send, recv, n, dt, NULL), CT_OK, what);
            for (int q = 0; q < g->size; q++)
                if (!bytes_match(recv + block * (size_t)q, block, (unsigned)q + 1))
                    failf("%s: block %d is not rank %d's", what, q, q);
            if (!in_place)
                free(send);
            free(recv);
        }
    }
}

static void check_reduce_scatter(group *g)
{
    const int64_t n = 129;
    const struct { ct_dtype dt; ct_reduce_op op; } cases[] = {
        {CT_F32, CT_REDUCE_SUM}, {CT_F64, CT_REDUCE_SUM}, {CT_I32, CT_REDUCE_MAX},
        {CT_BF16, CT_REDUCE_SUM}, {CT_F32, CT_REDUCE_MIN},
    };
    for (int c = 0; c < NELEM(cases); c++) {
        ct_dtype dt = cases[c].dt;
        size_t es = ct_dtype_size(dt);
        for (int in_place = 0; in_place < 2; in_place++) {
            int64_t total = n * g->size;
            void *send = xmalloc(es * (size_t)total), *recv = in_place ? send : xmalloc(es * (size_t)n);
            for (int64_t i = 0; i < total; i++)
                put(dt, send, i, value(dt, g->rank, i));
            char what[128];
            snprintf(what, sizeof what, "reduce_scatter %s of %lld %s on %s%s",
                     op_name(cases[c].op), (long long)n, dtype_name(dt), g->name,
                     in_place ? " in place" : "");
            expect_status(api->reduce_scatter(comm, g->g, send, recv, n, dt, cases[c].op, NULL),
                          CT_OK, what);
            for (int64_t i = 0; i < n; i++) {
                double want = reduce_expected(dt, cases[c].op, g->size, g->rank * n + i);
                if (get(dt, recv, i) != want) {
                    failf("%s: element %lld is %.9g, expected %.9g", what, (long long)i,
                          get(dt, recv, i), want);
                    break;
                }
            }
            if (!in_place)
                free(recv);
            free(send);
        }
    }
}

static void check_broadcast(group *g)
{
    const struct { ct_dtype dt; int64_t n; } cases[] = {{CT_F32, 1000}, {CT_F8_E4M3, 333},
                                                       {CT_BF16, 1}};
    for (int c = 0; c < NELEM(cases); c++)
        for (int root = 0; root < g->size; root++) {
            size_t bytes = (size_t)cases[c].n * ct_dtype_size(cases[c].dt);
            char *buf = xmalloc(bytes);
            if (g->rank == root)
                fill_bytes(buf, bytes, 100u + (unsigned)root);
            char what[128];
            snprintf(what, sizeof what, "broadcast of %lld %s from %d on %s",
                     (long long)cases[c].n, dtype_name(cases[c].dt), root, g->name);
            expect_status(api->broadcast(comm, g->g, buf, cases[c].n, cases[c].dt, root, NULL),
                          CT_OK, what);
            if (!bytes_match(buf, bytes, 100u + (unsigned)root))
                failf("%s: wrong data", what);
            free(buf);
        }
}

static void check_all_to_all(group *g)
{
    const int64_t n = 65;
    const ct_dtype dts[] = {CT_F32, CT_I32, CT_BF16, CT_F8_E5M2};
    for (int d = 0; d < NELEM(dts); d++) {
        size_t block = (size_t)n * ct_dtype_size(dts[d]);
        for (int in_place = 0; in_place < 2; in_place++) {
            char *send = xmalloc(block * (size_t)g->size);
            char *recv = in_place ? send : xmalloc(block * (size_t)g->size);
            for (int j = 0; j < g->size; j++) /* block j goes to rank j */
                fill_bytes(send + block * (size_t)j, block, (unsigned)(g->rank * 100 + j));
            char what[128];
            snprintf(what, sizeof what, "all_to_all of %lld %s on %s%s", (long long)n,
                     dtype_name(dts[d]), g->name, in_place ? " in place" : "");
            expect_status(api->all_to_all(comm, g->g, send, recv, n, dts[d], NULL), CT_OK, what);
            for (int j = 0; j < g->size; j++) /* block j came from rank j */
                if (!bytes_match(recv + block * (size_t)j, block, (unsigned)(j * 100 + g->rank)))
                    failf("%s: block %d is not what rank %d sent here", what, j, j);
            if (!in_place)
                free(recv);
            free(send);
        }
    }
}

/* ABI 2.17: all_to_allv with a different count for every (sender, receiver) pair, zero included
 * (rank i sends (i + 2 j) % 5 elements to rank j), packed at uneven offsets; started and waited for. */
static void check_all_to_allv(group *g)
{
    if (!CT_HAS_FIELD(api, ct_comm_api, all_to_allv) || !api->all_to_allv)
        return;
    int P = g->size;
    int64_t *v = xmalloc(sizeof(int64_t) * 4 * (size_t)P), *sc = v, *so = v + P, *rc = v + 2 * P, *ro = v + 3 * P;
    int64_t st = 0, rt = 0;
    for (int j = 0; j < P; j++) {
        sc[j] = (g->rank + 2 * j) % 5, rc[j] = (j + 2 * g->rank) % 5;
        so[j] = st + 1, ro[j] = rt + 2; /* a gap before each block */
        st += sc[j] + 1, rt += rc[j] + 2;
    }
    float *send = xmalloc(sizeof(float) * (size_t)(st + 1)), *recv = xmalloc(sizeof(float) * (size_t)(rt + 1));
    for (int j = 0; j < P; j++)
        for (int64_t k = 0; k < sc[j]; k++)
            send[so[j] + k] = (float)(g->rank * 1000 + j * 10 + k);
    char what[128];
    snprintf(what, sizeof what, "all_to_allv of uneven f32 counts on %s", g->name);
    ct_comm_request *req = NULL;
    expect_status(api->all_to_allv(comm, g->g, send, sc, so, recv, rc, ro, CT_F32, &req), CT_OK, what);
    expect_status(api->wait(comm, req), CT_OK, what);
    for (int j = 0; j < P; j++)
        for (int64_t k = 0; k < rc[j]; k++)
            if (recv[ro[j] + k] != (float)(j * 1000 + g->rank * 10 + k))
                failf("%s: element %lld from rank %d is %g", what, (long long)k, j, (double)recv[ro[j] + k]);
    free(send);
    free(recv);
    free(v);
}

/* Around the ring: non-blocking both ways; two tags received in the opposite order of sending;
 * then blocking sends and receives, ordered so the ring cannot deadlock. */
static void check_send_recv(group *g)
{
    const int64_t n = 300;
    const size_t bytes = sizeof(float) * (size_t)n;
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
    char *out1 = xmalloc(bytes), *out2 = xmalloc(bytes), *in1 = xmalloc(bytes),
         *in2 = xmalloc(bytes);
    fill_bytes(out1, bytes, 1000u + (unsigned)g->rank);
    fill_bytes(out2, bytes, 2000u + (unsigned)g->rank);
    ct_comm_request *r[4] = {0};
    expect_status(api->recv(comm, g->g, in2, n, CT_F32, prev, 2, &r[0]), CT_OK, "recv tag 2");
    expect_status(api->recv(comm, g->g, in1, n, CT_F32, prev, 1, &r[1]), CT_OK, "recv tag 1");
    expect_status(api->send(comm, g->g, out1, n, CT_F32, next, 1, &r[2]), CT_OK, "send tag 1");
    expect_status(api->send(comm, g->g, out2, n, CT_F32, next, 2, &r[3]), CT_OK, "send tag 2");
    for (int i = 3; i >= 0; i--)
        if (r[i])
            expect_status(api->wait(comm, r[i]), CT_OK, "wait send/recv");
    if (!bytes_match(in1, bytes, 1000u + (unsigned)prev) ||
        !bytes_match(in2, bytes, 2000u + (unsigned)prev))
        failf("send/recv ring on %s: wrong data or tags crossed", g->name);

    if (g->size > 1) {
        memset(in1, 0, bytes);
        if (g->rank % 2 == 0) {
            expect_status(api->send(comm, g->g, out1, n, CT_F32, next, 5, NULL), CT_OK, "send");
            expect_status(api->recv(comm, g->g, in1, n, CT_F32, prev, 5, NULL), CT_OK, "recv");
        } else {
            expect_status(api->recv(comm, g->g, in1, n, CT_F32, prev, 5, NULL), CT_OK, "recv");
            expect_status(api->send(comm, g->g, out1, n, CT_F32, next, 5, NULL), CT_OK, "send");
        }
        if (!bytes_match(in1, bytes, 1000u + (unsigned)prev))
            failf("blocking send/recv ring on %s: wrong data", g->name);
    }
    free(out1);
    free(out2);
    free(in1);
    free(in2);
}

/* Four operations in flight on g and one on `other`, waited in reverse order of starting. */
static void check_in_flight(group *g, group *other)
{
    const int64_t n = 4099, m = 100, k = 50, rs = 33;
    float *ar = xmalloc(sizeof(float) * (size_t)n);
    int32_t *ag_send = xmalloc(sizeof(int32_t) * (size_t)m),
            *ag = xmalloc(sizeof(int32_t) * (size_t)m * (size_t)g->size);
    uint16_t *bc = xmalloc(sizeof(uint16_t) * (size_t)k);
    float *rs_send = xmalloc(sizeof(float) * (size_t)(rs * g->size)),
          *rs_recv = xmalloc(sizeof(float) * (size_t)rs);
    float *oar = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        put(CT_F32, ar, i, value(CT_F32, g->rank, i));
        put(CT_F32, oar, i, value(CT_F32, other->rank, i));
    }
    for (int64_t i = 0; i < m; i++)
        ag_send[i] = (int32_t)(g->rank * 1000 + i);
    int root = g->size - 1;
    if (g->rank == root)
        fill_bytes(bc, sizeof(uint16_t) * (size_t)k, 77u);
    for (int64_t i = 0; i < rs * g->size; i++)
        put(CT_F32, rs_send, i, value(CT_F32, g->rank, i));

    ct_comm_request *r[5] = {0};
    expect_status(api->all_reduce(comm, g->g, ar, ar, n, CT_F32, CT_REDUCE_SUM, &r[0]), CT_OK,
                  "start all_reduce");
    expect_status(api->all_gather(comm, g->g, ag_send, ag, m, CT_I32, &r[1]), CT_OK,
                  "start all_gather");
    expect_status(api->broadcast(comm, g->g, bc, k, CT_BF16, root, &r[2]), CT_OK,
                  "start broadcast");
    expect_status(api->all_reduce(comm, other->g, oar, oar, n, CT_F32, CT_REDUCE_MAX, &r[3]),
                  CT_OK, "start all_reduce on the other group");
    expect_status(
        api->reduce_scatter(comm, g->g, rs_send, rs_recv, rs, CT_F32, CT_REDUCE_SUM, &r[4]),
        CT_OK, "start reduce_scatter");
    for (int i = 4; i >= 0; i--)
        if (r[i])
            expect_status(api->wait(comm, r[i]), CT_OK, "wait");

    for (int64_t i = 0; i < n; i++)
        if (get(CT_F32, ar, i) != reduce_expected(CT_F32, CT_REDUCE_SUM, g->size, i) ||
            get(CT_F32, oar, i) != reduce_expected(CT_F32, CT_REDUCE_MAX, other->size, i)) {
            failf("in flight on %s and %s: all_reduce element %lld wrong", g->name, other->name,
                  (long long)i);
            break;
        }
    for (int q = 0; q < g->size; q++)
        for (int64_t i = 0; i < m; i++)
            if (ag[q * m + i] != q * 1000 + i) {
                failf("in flight on %s: all_gather block %d wrong", g->name, q);
                q = g->size;
                break;
            }
    if (!bytes_match(bc, sizeof(uint16_t) * (size_t)k, 77u))
        failf("in flight on %s: broadcast wrong", g->name);
    for (int64_t i = 0; i < rs; i++)
        if (get(CT_F32, rs_recv, i) !=
            reduce_expected(CT_F32, CT_REDUCE_SUM, g->size, g->rank * rs + i)) {
            failf("in flight on %s: reduce_scatter element %lld wrong", g->name, (long long)i);
            break;
        }
    free(ar);
    free(ag_send);
    free(ag);
    free(bc);
    free(rs_send);
    free(rs_recv);
    free(oar);
}

/* ---------------------------------------------------------------- errors */

static void expect_error(ct_status got, ct_status want, const char *what, const char *needle)
{
    if (got != want)
        failf("%s: status %d, expected %d", what, (int)got, (int)want);
    else if (needle && !strstr(last_error, needle))
        failf("%s: message \"%s\" does not mention \"%s\"", what, last_error, needle);
    last_error[0] = '\0';
}

/* Every case fails before anything is sent, so the ranks stay in step (the barrier shows it). */
static void check_bad_arguments(group *w)
{
    float buf[64] = {0};
    ct_comm_request *req = (ct_comm_request *)&buf; /* a sentinel a failed start must clear */
    expect_error(api->all_reduce(comm, w->g, buf, buf, -1, CT_F32, CT_REDUCE_SUM, NULL),
                 CT_ERR_INVALID, "count -1", "all_reduce");
    expect_error(api->all_reduce(comm, w->g, buf, buf, 4, (ct_dtype)99, CT_REDUCE_SUM, NULL),
                 CT_ERR_INVALID, "dtype 99", "dtype");
    expect_error(api->all_reduce(comm, w->g, buf, buf, 4, CT_F32, (ct_reduce_op)7, &req),
                 CT_ERR_INVALID, "reduce op 7", "op");
    if (req)
        failf("a failed start left *req set");
    expect_error(api->all_reduce(comm, w->g, buf, buf, 4, CT_F8_E4M3, CT_REDUCE_SUM, NULL),
                 CT_ERR_UNSUPPORTED, "f8 all_reduce", "f8_e4m3");
    expect_error(api->reduce_scatter(comm, w->g, buf, buf, 4, CT_F8_E5M2, CT_REDUCE_MAX, NULL),
                 CT_ERR_UNSUPPORTED, "f8 reduce_scatter", "f8_e5m2");
    expect_error(api->all_reduce(comm, w->g, buf, buf, (int64_t)INT_MAX + 1, CT_F32,
                                 CT_REDUCE_SUM, NULL),
                 CT_ERR_UNSUPPORTED, "count 2^31", "split");
    expect_error(api->all_reduce(comm, NULL, buf, buf, 4, CT_F32, CT_REDUCE_SUM, NULL),
                 CT_ERR_INVALID, "NULL group", "group");
    expect_error(api->all_reduce(comm, w->g, buf, buf + 1, 4, CT_F32, CT_REDUCE_SUM, NULL),
                 CT_ERR_INVALID, "overlapping all_reduce", "overlap");
    expect_error(api->all_gather(comm, w->g, buf, buf + 1, 2, CT_F32, NULL), CT_ERR_INVALID,
                 "all_gather send inside recv but not at this rank's block", "overlap");
    expect_error(api->broadcast(comm, w->g, buf, 4, CT_F32, w->size, NULL), CT_ERR_INVALID,
                 "broadcast root = size", "root");
    expect_error(api->send(comm, w->g, buf, 4, CT_F32, w->size, 0, NULL), CT_ERR_INVALID,
                 "send to rank size", "peer");
    expect_error(api->recv(comm, w->g, buf, 4, CT_F32, 0, -1, NULL), CT_ERR_INVALID, "tag -1",
                 "tag");
    expect_error(api->wait(comm, NULL), CT_ERR_INVALID, "wait(NULL)", "wait");
    ct_comm_group *g = NULL;
    expect_error(api->split(comm, w->g, -1, 0, "bad", &g), CT_ERR_INVALID, "split color -1",
                 "color");
    expect_status(api->barrier(comm, w->g), CT_OK, "barrier after the bad calls");
}

/* ---------------------------------------------------------------- timeouts */

static double train_timeout(void)
{
    double t = 0;
    test_host.opt_float(&test_host, "train_timeout_seconds", &t);
    return t;
}

static void expect_timeout(ct_status st, double t0, const char *what, const char *needle)
{
    double took = now_seconds() - t0, limit = train_timeout();
    if (st != CT_ERR_TIMEOUT)
        failf("%s: status %d, expected CT_ERR_TIMEOUT (%s)", what, (int)st, last_error);
    else if (took < 0.9 * limit || took > 2 * limit)
        failf("%s: timed out after %.2f s, expected between %.2f and %.2f s", what, took,
              0.9 * limit, 2 * limit);
    else if (!strstr(last_error, needle) || !strstr(last_error, "no completion within"))
        failf("%s: message \"%s\" lacks \"%s\" or \"no completion within\"", what, last_error,
              needle);
    else if (wrank == 1 || wsize == 1)
        printf("info: %s after %.2f s: %s\n", what, took, last_error);
}

/* A recv nobody has sent times out; the matching send then arrives and completes it late. */
static float late_recv[4];
static void check_recv_timeout(group *w)
{
    ct_comm_request *req = NULL;
    memset(late_recv, 0, sizeof late_recv);
    expect_status(api->recv(comm, w->g, late_recv, 4, CT_F32, w->rank, 99, &req), CT_OK,
                  "start recv");
    double t0 = now_seconds();
    char needle[128];
    snprintf(needle, sizeof needle, "recv of 4 f32 from rank %d on group world (rank %d of %d)",
             w->rank, w->rank, w->size);
    expect_timeout(req ? api->wait(comm, req) : CT_ERR_INTERNAL, t0, "wait on a recv nobody sent",
                   needle);
    const float out[4] = {1, 2, 3, 4};
    expect_status(api->send(comm, w->g, out, 4, CT_F32, w->rank, 99, NULL), CT_OK,
                  "the late send");
}

/* Rank 0 skips an all_reduce on a fresh group; the others time out, tell rank 0 (over
 * MPI_COMM_WORLD), and rank 0 then joins: its all_reduce completes with everyone's values because
 * the others' timed-out operations are still pending inside MPI. */
static float late_sum[16];
static void check_collective_timeout(group *w)
{
    group probe = split_group(w, 0, w->rank, "probe");
    if (!probe.g)
        return;
    for (int i = 0; i < 16; i++)
        late_sum[i] = (float)(w->rank + 1);
    if (w->rank != 0) {
        double t0 = now_seconds();
        ct_status st =
            api->all_reduce(comm, probe.g, late_sum, late_sum, 16, CT_F32, CT_REDUCE_SUM, NULL);
        char needle[128];
        snprintf(needle, sizeof needle, "all_reduce of 16 f32 on group probe (rank %d of %d)",
                 w->rank, w->size);
        expect_timeout(st, t0, "all_reduce that rank 0 skips", needle);
        int done = 1;
        MPI_Send(&done, 1, MPI_INT, 0, 4242, MPI_COMM_WORLD);
    } else {
        for (int q = 1; q < w->size; q++) {
            int done;
            MPI_Recv(&done, 1, MPI_INT, q, 4242, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        expect_status(api->all_reduce(comm, probe.g, late_sum, late_sum, 16, CT_F32,
                                      CT_REDUCE_SUM, NULL),
                      CT_OK, "rank 0's late all_reduce");
        float want = (float)(w->size * (w->size + 1) / 2);
        if (late_sum[0] != want)
            failf("rank 0's late all_reduce gave %g, expected %g", late_sum[0], want);
    }
    expect_status(api->barrier(comm, probe.g), CT_OK, "barrier after the timeout");
    expect_status(api->barrier(comm, w->g), CT_OK, "world barrier after the timeout");
    api->group_free(comm, probe.g);
}

/* ---------------------------------------------------------------- timing */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void measure_all_reduce(group *w, ct_dtype dt)
{
    enum { REPS = 7 };
    const int64_t n = 1 << 20;
    void *buf = xmalloc(ct_dtype_size(dt) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        put(dt, buf, i, 0.5);
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        expect_status(api->barrier(comm, w->g), CT_OK, "barrier");
        double t0 = now_seconds();
        expect_status(api->all_reduce(comm, w->g, buf, buf, n, dt, CT_REDUCE_SUM, NULL), CT_OK,
                      "timed all_reduce");
        t[r] = now_seconds() - t0;
        for (int64_t i = 0; i < n; i++) {
            if (get(dt, buf, i) != 0.5 * w->size) {
                failf("timed all_reduce of %s: element %lld is %g, expected %g", dtype_name(dt),
                      (long long)i, get(dt, buf, i), 0.5 * w->size);
                break;
            }
        }
        for (int64_t i = 0; i < n; i++)
            put(dt, buf, i, 0.5);
    }
    MPI_Allreduce(MPI_IN_PLACE, t, REPS, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(t, REPS, sizeof t[0], cmp_double);
    if (wrank == 0)
        printf("info: all_reduce of %lld %s over %d ranks: median %.2f ms, min %.2f ms\n",
               (long long)n, dtype_name(dt), wsize, 1e3 * t[REPS / 2], 1e3 * t[0]);
    free(buf);
}

/* ---------------------------------------------------------------- main */

static void run_group_checks(group *g, group *other)
{
    char name[128];
#define DONE(what)                                                        \
    do {                                                                  \
        snprintf(name, sizeof name, "%s on %s (size %d)", what, g->name, g->size); \
        check_done(name);                                                 \
    } while (0)
    check_all_reduce(g);
    DONE("all_reduce sum/max/min of f32, f64, i32, bf16");
    check_bf16_rounding(g);
    DONE("bf16 sums round to nearest even");
    check_deterministic(g);
    DONE("same inputs give the same bits on every rank and run");
    check_all_gather(g);
    DONE("all_gather");
    check_reduce_scatter(g);
    DONE("reduce_scatter");
    check_broadcast(g);
    DONE("broadcast from every root");
    check_all_to_all(g);
    DONE("all_to_all");
    check_all_to_allv(g);
    DONE("all_to_allv");
    check_send_recv(g);
    DONE("send/recv ring");
    expect_status(api->barrier(comm, g->g), CT_OK, "barrier");
    DONE("barrier");
    check_in_flight(g, other);
    DONE("several operations in flight, waited in reverse order");
#undef DONE
}

static int run_abort(int code)
{
    group w = {NULL, "world", -1, -1};
    api->world(comm, &w.g);
    api->group_rank(comm, w.g, &w.rank, &w.size);
    if (w.rank == w.size - 1) {
        printf("rank %d calls abort(%d)\n", w.rank, code);
        fflush(stdout);
        api->abort(comm, code);
        printf("FAIL abort returned\n");
        return 1;
    }
    /* the others wait in a barrier the last rank never joins: abort must end them first */
    ct_status st = api->barrier(comm, w.g);
    printf("FAIL [rank %d] still running after another rank's abort (barrier: %d %s)\n", w.rank,
           (int)st, last_error);
    return 1;
}

/* The fault experiment: all_reduce on the world until one fails, e.g. after `kill -9` of a rank.
 * Each rank prints how it ended, then calls abort(5) as the host does after an error. */
static int run_loop(void)
{
    group w = {NULL, "world", -1, -1};
    api->world(comm, &w.g);
    api->group_rank(comm, w.g, &w.rank, &w.size);
    printf("rank %d pid %d: all_reduce loop\n", w.rank, (int)getpid());
    fflush(stdout);
    float buf[1024] = {0};
    long iters = 0;
    double t0 = now_seconds(), last = t0;
    ct_status st;
    while ((st = api->all_reduce(comm, w.g, buf, buf, 1024, CT_F32, CT_REDUCE_SUM, NULL)) == CT_OK) {
        iters++;
        last = now_seconds();
    }
    printf("rank %d: all_reduce %ld failed %.2f s after the last success (%.1f s in): status %d: "
           "%s\n", w.rank, iters + 1, now_seconds() - last, now_seconds() - t0, (int)st, last_error);
    fflush(stdout);
    api->abort(comm, 5);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PLUGIN.so [key=value ...] [--abort CODE | --loop]\n", argv[0]);
        return 2;
    }
    int abort_code = -1, loop = 0;
    option_args = argv + 2;
    option_nargs = argc - 2;
    if (argc >= 4 && strcmp(argv[argc - 2], "--abort") == 0) {
        abort_code = atoi(argv[argc - 1]);
        option_nargs -= 2;
    } else if (argc >= 3 && strcmp(argv[argc - 1], "--loop") == 0) {
        loop = 1;
        option_nargs -= 1;
    }
    void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        printf("FAIL cannot load %s: %s\n", argv[1], dlerror());
        return 1;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    if (!entry || entry(&test_host, &info) != CT_OK || !info.api) {
        printf("FAIL %s: no entry, or it failed: %s\n", argv[1], last_error);
        return 1;
    }
    plugin_options = info.options;
    api = info.api;
    if (api->struct_size < offsetof(ct_comm_api, test) || !api->create) {
        printf("FAIL %s: not a comm API table\n", argv[1]);
        return 1;
    }
    ct_status st = api->create(&test_host, &comm);
    if (st != CT_OK || !comm) {
        printf("FAIL create: status %d: %s\n", (int)st, last_error);
        return 1;
    }
    if (abort_code >= 0)
        return run_abort(abort_code);
    if (loop)
        return run_loop();

    group w = {NULL, "world", -1, -1};
    expect_status(api->world(comm, &w.g), CT_OK, "world");
    expect_status(api->group_rank(comm, w.g, &w.rank, &w.size), CT_OK, "group_rank");
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (w.rank != wrank || w.size != wsize)
        failf("world group: rank %d of %d, MPI says %d of %d", w.rank, w.size, wrank, wsize);
    check_plugin_info(&info);
    check_done("plugin info, API table, world group");

    /* a 2 x size/2 mesh: tp = ranks with the same rank / 2, dp = ranks with the same rank % 2 */
    group tp = split_group(&w, wrank / 2, wrank, "tp");
    group dp = split_group(&w, wrank % 2, wrank, "dp");
    group rev = split_group(&w, 0, -wrank, "rev");
    if (rev.g)
        check_split_order(&rev);
    if (tp.g && (tp.size != (wrank / 2 * 2 + 1 < wsize ? 2 : 1) || tp.rank != wrank % 2))
        failf("tp group: rank %d of %d", tp.rank, tp.size);
    if (dp.g && dp.rank != wrank / 2)
        failf("dp group: rank %d, expected %d", dp.rank, wrank / 2);
    check_done("split: groups by color, ranks by key");
    if (!tp.g || !dp.g || !rev.g) {
        printf("FAIL [rank %d] split failed; stopping\n", wrank);
        api->abort(comm, 1);
    }

    run_group_checks(&w, &w);
    run_group_checks(&tp, &dp);
    run_group_checks(&dp, &tp);
    check_bad_arguments(&w);
    check_done("bad arguments fail locally with a message");
    measure_all_reduce(&w, CT_F32);
    measure_all_reduce(&w, CT_BF16);
    check_done("all_reduce of 1M f32 and bf16 (timed)");

    check_recv_timeout(&w);
    check_done("wait on a recv nobody sent times out, naming the operation and group");
    if (wsize > 1) {
        check_collective_timeout(&w);
        check_done("all_reduce with a missing rank times out; the late rank then completes it");
    }

    api->group_free(comm, tp.g);
    api->group_free(comm, dp.g);
    api->group_free(comm, rev.g);
    api->group_free(comm, w.g); /* the world group: ignored */
    int ok = failed_checks == 0;
    if (wrank == 0)
        printf("%d checks failed\n", failed_checks);
    fflush(stdout);
    int rank = wrank, size = wsize;
    api->destroy(comm);

    /* destroy drained the operations abandoned by the timeouts: their results are in place */
    const float late_want[4] = {1, 2, 3, 4};
    if (memcmp(late_recv, late_want, sizeof late_want) != 0) {
        printf("FAIL [rank %d] the timed-out recv never received the late send\n", rank);
        ok = 0;
    }
    if (size > 1 && rank != 0 && late_sum[0] != (float)(size * (size + 1) / 2)) {
        printf("FAIL [rank %d] the timed-out all_reduce gave %g after rank 0 joined, expected %g\n",
               rank, late_sum[0], (double)(size * (size + 1) / 2));
        ok = 0;
    }
    return ok ? 0 : 1;
}
