/* test_plan_plugins.c: the shipped plugins' answers to the planner (ABI 2.1 report, ABI 2.2 plan,
 * plan_linear, plan_step) against what the same plugins really do, driven through their ABI tables
 * with a stand-in host, builder and comm in one process (the CPU device does the arithmetic):
 *
 *   tp        its custom ops' plan makes the same output shapes as their forward on a real run, with
 *             GEMM FLOPs and collectives counted by hand; its wrapped ops run on a planning builder
 *             (no data, no device, no comm); report names the sequence-parallel all-reduce
 *   fsdp      report's communication memory equals what its buffer cache allocates over a real
 *             microbatch (every reshard policy, float8 all-gather, pipeline parallel), and its bytes
 *             are the bytes sent (float8: one per element)
 *   zero      report's transient gradient memory equals the peak a real step holds
 *   ddp       one all-reduce per parameter per step
 *   float8    plan_linear's scratch equals the grow-only buffers a real forward and backward leave
 *             (every recipe), on an instance made without a device
 *   adamw, muon, lion   plan_step by hand
 *
 * The comm stand-in plays every rank's part of a group of two: a gather repeats this rank's block,
 * a reduction keeps it. Values are meaningless; sizes, shapes and allocations are what is checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctitan/comm.h"
#include "ctitan/device.h"
#include "ctitan/optimizer.h"
#include "ctitan/quantizer.h"
#include "ctitan/strategy.h"

/* ---------------------------------------------------------------- a minimal host */

static char last_error[512];
static const ct_option_spec *spec; /* the plugin being created */
static const char *const *overrides; /* key, value, ..., NULL: options set for the next create */
static int64_t mem_now[8], mem_peak[8];

static void h_log(const ct_host *h, ct_log_level l, const char *f, ...) { (void)h, (void)l, (void)f; }
static void h_err(const ct_host *h, const char *f, ...) {
    (void)h;
    va_list a;
    va_start(a, f);
    vsnprintf(last_error, sizeof last_error, f, a);
    va_end(a);
}
static void *h_alloc(const ct_host *h, size_t n, ct_mem_category c) {
    (void)h, (void)c;
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}
static void h_free(const ct_host *h, void *p) { (void)h, free(p); }
static void h_account(const ct_host *h, ct_mem_category c, int64_t d) {
    (void)h;
    mem_now[c] += d;
    if (mem_now[c] > mem_peak[c]) mem_peak[c] = mem_now[c];
}
static void mem_reset(void) {
    memset(mem_now, 0, sizeof mem_now);
    memset(mem_peak, 0, sizeof mem_peak);
}
static const char *opt_value(const char *key) {
    for (const char *const *o = overrides; o && *o; o += 2)
        if (!strcmp(o[0], key)) return o[1];
    for (const ct_option_spec *o = spec; o && o->key; o++)
        if (!strcmp(o->key, key)) return o->default_value;
    return NULL;
}
static ct_status h_float(const ct_host *h, const char *k, double *o) {
    (void)h;
    const char *v = opt_value(k);
    if (!v) return CT_ERR_INVALID;
    *o = strtod(v, NULL);
    return CT_OK;
}
static ct_status h_int(const ct_host *h, const char *k, int64_t *o) {
    (void)h;
    const char *v = opt_value(k);
    if (!v) return CT_ERR_INVALID;
    *o = strtoll(v, NULL, 10);
    return CT_OK;
}
static ct_status h_bool(const ct_host *h, const char *k, int *o) {
    (void)h;
    const char *v = opt_value(k);
    if (!v) return CT_ERR_INVALID;
    *o = !strcmp(v, "true");
    return CT_OK;
}
static ct_status h_string(const ct_host *h, const char *k, const char **o) {
    (void)h;
    *o = opt_value(k);
    return *o ? CT_OK : CT_ERR_INVALID;
}
static void h_trace(const ct_host *h, const char *n) { (void)h, (void)n; }
static const ct_host host = {.struct_size = sizeof(ct_host), .abi_major = CT_ABI_MAJOR, .abi_minor = CT_ABI_MINOR,
                             .log = h_log, .set_error = h_err, .mem_alloc = h_alloc, .mem_free = h_free,
                             .mem_account = h_account, .opt_int = h_int, .opt_float = h_float, .opt_bool = h_bool,
                             .opt_string = h_string, .trace_begin = h_trace, .trace_end = h_trace};

/* ---------------------------------------------------------------- plugins */

typedef struct loaded {
    const void *api;
    const ct_option_spec *options;
} loaded;

static loaded load(const char *file, ct_plugin_kind kind) {
    char path[1024];
    snprintf(path, sizeof path, "%s", file);
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* left open: the tables live as long as the test */
    if (!so) fail_msg("dlopen %s: %s", path, dlerror());
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    assert_non_null(entry);
    assert_int_equal(entry(&host, &info), CT_OK);
    assert_int_equal(info.kind, kind);
    return (loaded){info.api, info.options};
}

#define PLUGIN(name) CT_BUILD_PLUGIN_DIR "/ctitan-" name ".so"

static const ct_device_api *dapi;
static ct_device *dev;

static int setup(void **state) {
    (void)state;
    loaded cpu = load(PLUGIN("cpu"), CT_KIND_DEVICE);
    dapi = cpu.api;
    spec = cpu.options;
    overrides = NULL;
    if (dapi->create(&host, &dev) != CT_OK) {
        fprintf(stderr, "cpu create: %s\n", last_error);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (dev) dapi->destroy(dev);
    return 0;
}

/* ---------------------------------------------------------------- a comm of two ranks in one process */

struct ct_comm_group {
    int size, rank;
};
struct ct_comm_request {
    int done;
};
static struct ct_comm_group group2 = {2, 0};
static struct ct_comm_request request;
static double sent_bytes[8]; /* by collective: 1 all-reduce, 2 all-gather, 3 reduce-scatter (gathered/reduced size) */

static ct_status c_all_reduce(ct_comm *c, ct_comm_group *g, const void *send, void *recv, int64_t count, ct_dtype dt,
                              ct_reduce_op op, ct_comm_request **req) {
    (void)c, (void)op;
    size_t b = (size_t)count * ct_dtype_size(dt);
    if (send != recv) memmove(recv, send, b);
    sent_bytes[1] += (double)b * (g->size > 1);
    if (req) *req = &request;
    return CT_OK;
}
static ct_status c_all_gather(ct_comm *c, ct_comm_group *g, const void *send, void *recv, int64_t count, ct_dtype dt,
                              ct_comm_request **req) {
    (void)c;
    size_t b = (size_t)count * ct_dtype_size(dt);
    for (int p = 0; p < g->size; p++) memmove((char *)recv + (size_t)p * b, send, b);
    sent_bytes[2] += (double)b * g->size;
    if (req) *req = &request;
    return CT_OK;
}
static ct_status c_reduce_scatter(ct_comm *c, ct_comm_group *g, const void *send, void *recv, int64_t count,
                                  ct_dtype dt, ct_reduce_op op, ct_comm_request **req) {
    (void)c, (void)op;
    size_t b = (size_t)count * ct_dtype_size(dt);
    memmove(recv, (const char *)send + (size_t)g->rank * b, b);
    sent_bytes[3] += (double)b * g->size;
    if (req) *req = &request;
    return CT_OK;
}
static ct_status c_wait(ct_comm *c, ct_comm_request *r) {
    (void)c, (void)r;
    return CT_OK;
}
static ct_status c_group_rank(ct_comm *c, ct_comm_group *g, int *rank, int *size) {
    (void)c;
    *rank = g->rank;
    *size = g->size;
    return CT_OK;
}
static const ct_comm_api capi = {.struct_size = sizeof(ct_comm_api), .group_rank = c_group_rank,
                                 .all_reduce = c_all_reduce, .all_gather = c_all_gather,
                                 .reduce_scatter = c_reduce_scatter, .wait = c_wait};
static ct_comm *const comm = (ct_comm *)&group2; /* never dereferenced by the stand-in */

static ct_mesh_info mesh_of(int pp, int rep, int shard, int tp) {
    ct_mesh_info m = {.struct_size = sizeof m, .world_size = pp * rep * shard * tp};
    int deg[CT_MESH_NAXES] = {pp, rep, shard, 1, tp};
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        m.degree[a] = deg[a];
        m.group[a] = &group2;
    }
    m.dp_size = rep * shard;
    m.dp_group = &group2;
    return m;
}

/* ---------------------------------------------------------------- a stand-in builder */

enum { MAX_T = 256, MAX_OPS = 16 };
typedef struct op_record {
    const char *name;
    const ct_custom_op *op; /* for the live backward: the op, its state and tensors */
    void *state;
    ct_tensor *in[4], *out[4];
    int n_in;
    int n_out;
    int ndim[4];
    int64_t shape[4][CT_MAX_DIMS];
    ct_op_cost cost;
} op_record;

typedef struct tbuilder {
    ct_builder b;
    ct_tensor *t[MAX_T];
    void *mem[MAX_T];
    int nt, nmem;
    struct {
        ct_tensor *x, *v;
        const void *key;
    } memo[32];
    int nmemo;
    op_record ops[MAX_OPS];
    int nops;
} tbuilder;

#define TB(b) ((tbuilder *)(b))

static void *tb_keep(tbuilder *tb, void *p) {
    assert_true(tb->nmem < MAX_T);
    return tb->mem[tb->nmem++] = p;
}

static ct_tensor *tb_new(ct_builder *b, ct_dtype dt, int ndim, const int64_t *shape) {
    tbuilder *tb = TB(b);
    assert_true(tb->nt < MAX_T);
    ct_tensor *t = calloc(1, sizeof *t);
    assert_non_null(t);
    *t = (ct_tensor){.struct_size = sizeof *t, .dtype = dt, .ndim = ndim};
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    if (!b->planning) t->data = tb_keep(tb, calloc((size_t)ct_tensor_numel(t) + 1, ct_dtype_size(dt)));
    return tb->t[tb->nt++] = t;
}

static void *tb_scratch(ct_builder *b, size_t bytes) {
    /* a plan may ask for scratch to say how much it takes (model.h); it gets a pointer it must not use */
    static char planned;
    if (b->planning) return &planned;
    return tb_keep(TB(b), calloc(1, bytes + 64));
}

static ct_tensor *tb_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) {
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = w->shape[0];
    ct_tensor *y = tb_new(b, CT_F32, x->ndim, shape);
    if (!b->planning)
        assert_int_equal(dapi->matmul(dev, y->data, x->data, w->data, ct_tensor_numel(x) / w->shape[1], w->shape[0],
                                      w->shape[1], 0, 1, 1.0f, 0.0f), CT_OK);
    return y;
}

/* The shape a collective over two ranks makes (the values do not matter here). */
static ct_tensor *tb_collective(ct_builder *b, ct_collective kind, ct_tensor *x, int axis, int dim) {
    (void)axis;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    int d = dim == CT_DIM_ROWS ? x->ndim - 2 : x->ndim - 1;
    if (kind == CT_COLL_ALL_GATHER || kind == CT_COLL_ALL_GATHER_SLICE) shape[d] *= 2;
    if (kind == CT_COLL_REDUCE_SCATTER) shape[d] /= 2;
    return tb_new(b, CT_F32, x->ndim, shape);
}

static ct_tensor *tb_memo(ct_builder *b, ct_tensor *x, const void *key, ct_tensor *v) {
    tbuilder *tb = TB(b);
    for (int i = 0; i < tb->nmemo; i++)
        if (tb->memo[i].x == x && tb->memo[i].key == key) return v ? (tb->memo[i].v = v) : tb->memo[i].v;
    if (!v) return NULL;
    assert_true(tb->nmemo < 32);
    tb->memo[tb->nmemo].x = x;
    tb->memo[tb->nmemo].key = key;
    tb->memo[tb->nmemo++].v = v;
    return v;
}

static ct_status tb_custom(ct_builder *b, const ct_custom_op *op, const void *state, size_t state_bytes,
                           ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    tbuilder *tb = TB(b);
    void *st = tb_keep(tb, calloc(1, state_bytes + 1));
    memcpy(st, state, state_bytes);
    assert_true(tb->nops < MAX_OPS && n_out <= 4);
    op_record *r = &tb->ops[tb->nops++];
    *r = (op_record){.name = op->name, .op = op, .state = st, .n_in = n_in, .n_out = n_out,
                     .cost = {.struct_size = sizeof(ct_op_cost)}};
    assert_true(n_in <= 4);
    memcpy(r->in, in, sizeof(ct_tensor *) * (size_t)n_in);
    ct_status s;
    if (b->planning) {
        assert_true(CT_HAS_FIELD(op, ct_custom_op, plan) && op->plan);
        for (int i = 0; i < n_in; i++) assert_null(in[i]->data);
        s = op->plan(b, st, in, n_in, out, n_out, &r->cost);
    } else {
        s = op->forward(b, st, in, n_in, out, n_out);
    }
    if (s != CT_OK) return s;
    for (int i = 0; i < n_out; i++) {
        assert_non_null(out[i]);
        r->out[i] = out[i];
        r->ndim[i] = out[i]->ndim;
        memcpy(r->shape[i], out[i]->shape, sizeof r->shape[i]);
    }
    return CT_OK;
}

/* A gradient buffer per tensor, zeroed on first use (the tape's rule). */
static float *tb_grad(ct_builder *b, ct_tensor *t) {
    if (!t->grad) t->grad = tb_keep(TB(b), calloc((size_t)ct_tensor_numel(t) + 1, sizeof(float)));
    return t->grad;
}

/* The live backward of every custom op recorded, in reverse, with zero output gradients: the
 * comm sees what each backward sends. */
static void tb_backward(tbuilder *tb) {
    for (int i = tb->nops - 1; i >= 0; i--) {
        op_record *r = &tb->ops[i];
        const float *dy[4] = {NULL};
        for (int j = 0; j < r->n_out; j++) dy[j] = tb_keep(tb, calloc((size_t)ct_tensor_numel(r->out[j]) + 1, sizeof(float)));
        assert_int_equal(r->op->backward(&tb->b, r->state, r->in, r->n_in, r->out, dy, r->n_out,
                                         CT_GRAD_INPUT | CT_GRAD_WEIGHT), CT_OK);
    }
}

static ct_tensor *tb_cross_entropy(ct_builder *b, ct_tensor *logits, const ct_tensor *targets) {
    (void)logits, (void)targets;
    return tb_new(b, CT_F32, 0, NULL);
}

static ct_tensor *tb_finish(ct_builder *b, ct_tensor *x) {
    (void)b;
    return x;
}
static void tb_account(ct_builder *b, int axis, double s) { (void)b, (void)axis, (void)s; }

static void tb_init(tbuilder *tb, int planning) {
    memset(tb, 0, sizeof *tb);
    tb->b = (ct_builder){.struct_size = sizeof(ct_builder), .linear = tb_linear, .collective = tb_collective,
                         .cross_entropy = tb_cross_entropy, .finish_output = tb_finish, .new_tensor = tb_new,
                         .scratch = tb_scratch, .custom = tb_custom, .grad = tb_grad, .memo = tb_memo,
                         .account_comm = tb_account,
                         .planning = planning};
}

static void tb_free(tbuilder *tb) {
    for (int i = 0; i < tb->nt; i++) free(tb->t[i]);
    for (int i = 0; i < tb->nmem; i++) free(tb->mem[i]);
}

/* ---------------------------------------------------------------- tp */

static const ct_tp_rule tp_rules[] = {
    {"tok_embeddings.weight", CT_TP_EMBED_ROWWISE}, {"wq.weight", CT_TP_COLWISE},
    {"wo.weight", CT_TP_ROWWISE},                   {"wo.bias", CT_TP_ROWWISE},
    {"norm.weight", CT_TP_SEQUENCE_PARALLEL},       {"output.weight", CT_TP_OUTPUT_COLWISE},
    {NULL, CT_TP_NONE},
};

enum { V = 16, D = 8, H = 16, T = 8 }; /* vocabulary, model width, wq's outputs, tokens */

typedef struct tp_model {
    ct_tensor emb, wq, wo, wo_bias, norm, out;
    ct_param_slot slots[6];
} tp_model;

static void tp_model_init(tp_model *m) {
    ct_tensor *t[6] = {&m->emb, &m->wq, &m->wo, &m->wo_bias, &m->norm, &m->out};
    static const char *names[6] = {"tok_embeddings.weight", "wq.weight", "wo.weight", "wo.bias", "norm.weight",
                                   "output.weight"};
    static const int64_t shapes[6][2] = {{V, D}, {H, D}, {D, H}, {D, 0}, {D, 0}, {V, D}};
    static const int units[6] = {0, 1, 1, 1, 2, 2};
    for (int i = 0; i < 6; i++) {
        int ndim = shapes[i][1] ? 2 : 1;
        *t[i] = (ct_tensor){.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = ndim, .name = names[i],
                            .flags = CT_TENSOR_PARAM | (ndim == 2 ? CT_TENSOR_LINEAR : 0)};
        t[i]->shape[0] = shapes[i][0];
        t[i]->shape[1] = shapes[i][1];
        m->slots[i] = (ct_param_slot){.struct_size = sizeof(ct_param_slot), .param = t[i], .unit = units[i],
                                      .numel = ct_tensor_numel(t[i]), .split_axis = -1, .split_dim = -1,
                                      .copy_of = -1};
        m->slots[i].local_numel = m->slots[i].numel;
    }
}

/* Weights' data after place() split them (zeros: the values do not matter). */
static void tp_model_data(tp_model *m, tbuilder *tb) {
    for (int i = 0; i < 6; i++) {
        ct_tensor *w = m->slots[i].param;
        w->data = tb_keep(tb, calloc((size_t)ct_tensor_numel(w), sizeof(float)));
    }
}

static const char *const tp_async_opts[] = {"enable_async_tensor_parallel", "true", "async_tensor_parallel_chunks", "2",
                                            NULL};

static double fwd_sent[8]; /* what the live forward sent, by collective (sent_bytes' index) */

/* Creates tp (rank 0 of 2) with options `set`, places the model, wraps tb, runs embedding -> wq -> wo
 * -> output -> loss. */
static void tp_run(tbuilder *tb, int planning, const ct_strategy_api *api, const ct_option_spec *opts,
                   const char *const *set) {
    tp_model m;
    tp_model_init(&m);
    ct_mesh_info mesh = mesh_of(1, 1, 1, 2);
    ct_model_desc desc = {.struct_size = sizeof desc, .vocab_size = V, .dim = D, .n_heads = 2, .n_kv_heads = 2,
                          .ffn_hidden = H};
    ct_strategy_env env = {.struct_size = sizeof env, .mesh = &mesh, .tp_plan = tp_rules, .model = &desc, .seq_len = T,
                           .planning = planning};
    if (!planning) {
        env.dapi = dapi;
        env.dev = dev;
        env.capi = &capi;
        env.comm = comm;
    } else {
        for (int a = 0; a < CT_MESH_NAXES; a++) mesh.group[a] = NULL;
        mesh.dp_group = NULL;
    }
    spec = opts;
    overrides = set;
    ct_strategy *s = NULL;
    assert_int_equal(api->create(&host, &env, &s), CT_OK);
    assert_int_equal(api->place(s, m.slots, 6), CT_OK);
    tb_init(tb, planning);
    if (!planning) tp_model_data(&m, tb);
    ct_builder out = tb->b;
    assert_int_equal(api->wrap_builder(s, &tb->b, &out), CT_OK);

    int64_t bt[2] = {1, T};
    ct_tensor *ids = tb_new(&tb->b, CT_I32, 2, bt), *tg = tb_new(&tb->b, CT_I32, 2, bt);
    if (!planning)
        for (int i = 0; i < T; i++) ((int32_t *)ids->data)[i] = ((int32_t *)tg->data)[i] = (i * 5) % V;
    ct_tensor *e = out.embedding(&out, ids, &m.emb);         /* ranged lookup, reduce-scattered rows */
    assert_non_null(e);
    ct_tensor *h = out.linear(&out, e, &m.wq);               /* async all-gather + matmul */
    assert_non_null(h);
    ct_tensor *o = out.linear(&out, h, &m.wo);               /* async matmul + reduce-scatter */
    assert_non_null(o);
    ct_tensor *logits = out.linear(&out, o, &m.out);         /* async all-gather + matmul, sharded logits */
    assert_non_null(logits);
    ct_tensor *loss = out.cross_entropy(&out, logits, tg);   /* loss parallel */
    assert_non_null(loss);
    assert_int_equal(loss->ndim, 0);
    if (!planning) {
        memcpy(fwd_sent, sent_bytes, sizeof fwd_sent);
        tb_backward(tb);
    }
    api->destroy(s);
    overrides = NULL;
}

/* The custom ops a run recorded, live and planned: the same ops with the same output shapes. */
static void same_ops(const tbuilder *live, const tbuilder *plan, const char *const *want, int n) {
    assert_int_equal(live->nops, n);
    assert_int_equal(plan->nops, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(live->ops[i].name, want[i]);
        assert_string_equal(plan->ops[i].name, want[i]);
        assert_int_equal(plan->ops[i].n_out, live->ops[i].n_out);
        for (int j = 0; j < live->ops[i].n_out; j++) {
            assert_int_equal(plan->ops[i].ndim[j], live->ops[i].ndim[j]);
            for (int d = 0; d < live->ops[i].ndim[j]; d++)
                assert_int_equal(plan->ops[i].shape[j][d], live->ops[i].shape[j][d]);
        }
    }
}

/* Without async TP, and without sequence and loss parallel: the wrapped ops still run on a
 * planning builder, with fewer custom ops. */
static void test_tp_plans_without_async_tp(void **state) {
    (void)state;
    loaded tp = load(PLUGIN("tp"), CT_KIND_STRATEGY);
    static const char *const sync_opts[] = {NULL};
    static const char *const plain_opts[] = {"enable_sequence_parallel", "false", "disable_loss_parallel", "true", NULL};
    static const char *const want_sync[] = {"tp.embedding", "tp.cross_entropy"}, *const want_plain[] = {"tp.embedding"};
    const char *const *sets[2] = {sync_opts, plain_opts};
    for (int c = 0; c < 2; c++) {
        tbuilder *live = calloc(1, sizeof *live), *plan = calloc(1, sizeof *plan);
        assert_true(live && plan);
        tp_run(live, 0, tp.api, tp.options, sets[c]);
        tp_run(plan, 1, tp.api, tp.options, sets[c]);
        same_ops(live, plan, c ? want_plain : want_sync, c ? 1 : 2);
        tb_free(live);
        tb_free(plan);
        free(live);
        free(plan);
    }
}

static void test_tp_plans_make_forwards_shapes(void **state) {
    (void)state;
    loaded tp = load(PLUGIN("tp"), CT_KIND_STRATEGY);
    const ct_strategy_api *api = tp.api;
    tbuilder *live = calloc(1, sizeof *live), *plan = calloc(1, sizeof *plan);
    assert_non_null(live);
    assert_non_null(plan);
    memset(sent_bytes, 0, sizeof sent_bytes);
    tp_run(live, 0, api, tp.options, tp_async_opts);
    double live_fwd = fwd_sent[1] + fwd_sent[2] + fwd_sent[3];
    double live_bwd = sent_bytes[1] + sent_bytes[2] + sent_bytes[3] - live_fwd;
    tp_run(plan, 1, api, tp.options, tp_async_opts);
    static const char *want[] = {"tp.embedding", "tp.all_gather_matmul", "tp.matmul_reduce_scatter",
                                 "tp.all_gather_matmul", "tp.cross_entropy"};
    same_ops(live, plan, want, 5);
    /* the collectives the plans name are what the live forwards and backwards handed the comm */
    double planned[3] = {0};
    for (int i = 0; i < plan->nops; i++)
        for (int j = 0; j < plan->ops[i].cost.n_comm; j++)
            planned[plan->ops[i].cost.comm[j].phase] += plan->ops[i].cost.comm[j].bytes;
    if (planned[1] != live_fwd || planned[2] != live_bwd)
        fail_msg("tp plans name %.0f B forward and %.0f B backward of collectives, the ops sent %.0f and %.0f B",
                 planned[1], planned[2], live_fwd, live_bwd);
    /* by hand, tp = 2, sequence parallel: T / 2 = 4 rows per rank between the ops */
    const ct_op_cost *gq = &plan->ops[1].cost, *rs = &plan->ops[2].cost, *go = &plan->ops[3].cost,
                     *ce = &plan->ops[4].cost, *em = &plan->ops[0].cost;
    double f = sizeof(float);
    assert_int_equal(plan->ops[1].shape[1][1], T);                 /* X: every row */
    assert_true(gq->matmul_flops[0] == 2.0 * T * D * (H / 2));      /* (8 x 8) @ (8 x 8)^T */
    assert_true(gq->matmul_flops[1] == 2 * gq->matmul_flops[0]);
    assert_int_equal(gq->n_comm, 2);
    assert_int_equal(gq->comm[0].kind, CT_COLL_ALL_GATHER);
    assert_int_equal(gq->comm[0].axis, CT_AXIS_TP);
    assert_int_equal(gq->comm[0].phase, 1);
    assert_int_equal(gq->comm[0].overlapped, 1);
    assert_true(gq->comm[0].bytes == T * D * f);
    assert_int_equal(gq->comm[1].kind, CT_COLL_REDUCE_SCATTER);
    assert_int_equal(gq->comm[1].phase, 2);
    assert_int_equal(gq->comm[1].overlapped, 0);
    assert_true(rs->matmul_flops[0] == 2.0 * T * (H / 2) * D);     /* every row of h (8 x 8) @ wo block (8 x 8)^T */
    assert_int_equal(rs->comm[0].kind, CT_COLL_REDUCE_SCATTER);
    assert_int_equal(rs->comm[0].overlapped, 1);
    assert_true(rs->comm[0].bytes == T * D * f);                   /* P: every row's partial sums */
    assert_int_equal(rs->comm[1].kind, CT_COLL_ALL_GATHER);
    assert_true(go->matmul_flops[0] == 2.0 * T * D * (V / 2));
    assert_int_equal(ce->n_comm, 1);
    assert_int_equal(ce->comm[0].kind, CT_COLL_ALL_GATHER);
    assert_true(ce->comm[0].bytes == 3.0 * T * 2 * f);             /* (max, sum, target logit) per row, per rank */
    assert_true(ce->bytes[0] > T * (V / 2) * f);                   /* at least the logits read once */
    assert_int_equal(em->n_comm, 0);
    assert_true(em->bytes[0] == T * 4 + T * D * f + T / 2 * D * f);
    assert_int_equal(plan->ops[0].shape[0][2], D);
    tb_free(live);
    tb_free(plan);
    free(live);
    free(plan);
}

static void test_tp_reports_the_sequence_parallel_all_reduce(void **state) {
    (void)state;
    loaded tp = load(PLUGIN("tp"), CT_KIND_STRATEGY);
    const ct_strategy_api *api = tp.api;
    for (int sp = 0; sp < 2; sp++) {
        tp_model m;
        tp_model_init(&m);
        ct_mesh_info mesh = mesh_of(1, 1, 1, 2);
        for (int a = 0; a < CT_MESH_NAXES; a++) mesh.group[a] = NULL;
        ct_strategy_env env = {.struct_size = sizeof env, .mesh = &mesh, .tp_plan = tp_rules, .seq_len = T, .planning = 1};
        const char *const opts[] = {"enable_sequence_parallel", sp ? "true" : "false", NULL};
        spec = tp.options;
        overrides = opts;
        ct_strategy *s = NULL;
        assert_int_equal(api->create(&host, &env, &s), CT_OK);
        assert_int_equal(api->place(s, m.slots, 6), CT_OK);
        ct_comm_cost c[8];
        for (int i = 0; i < 8; i++) c[i].struct_size = sizeof c[i];
        ct_strategy_report r = {sizeof r, {0}, c, 8, 0};
        assert_int_equal(api->report(s, 4, &r), CT_OK);
        for (int k = 0; k < 8; k++) assert_int_equal(r.mem_bytes[k], 0);
        assert_int_equal(r.n_comms, sp ? 2 : 0); /* wo.bias and norm.weight, whole, summed over tp once per step */
        for (int i = 0; i < r.n_comms; i++) {
            assert_int_equal(c[i].axis, CT_AXIS_TP);
            assert_int_equal(c[i].kind, CT_COLL_ALL_REDUCE);
            assert_true(c[i].bytes == D * sizeof(float));
            assert_true(c[i].count == 1);
        }
        api->destroy(s);
        overrides = NULL;
    }
}

/* ---------------------------------------------------------------- fsdp, zero, ddp */

/* A small model in four units: embedding (65 x 8: rows not dividing by 2), two blocks of two
 * linears and a norm, the head (a norm and the output 64 x 8). The embedding and the head are the
 * largest units and never neighbours. */
enum { NP = 9 };
typedef struct dp_model {
    ct_tensor t[NP];
    ct_param_slot slots[NP];
    float *local[NP], *grad[NP], *whole[NP], *wgrad[NP];
} dp_model;

static void dp_model_init(dp_model *m, uint32_t linear_flags) {
    static const int64_t shapes[NP][2] = {{65, 8}, {16, 8}, {8, 16}, {8, 0}, {16, 8}, {8, 16}, {8, 0}, {8, 0}, {64, 8}};
    static const int units[NP] = {0, 1, 1, 1, 2, 2, 2, 3, 3};
    static const char *names[NP] = {"tok", "l0.w1", "l0.w2", "l0.norm", "l1.w1", "l1.w2", "l1.norm", "norm", "output"};
    memset(m, 0, sizeof *m);
    for (int i = 0; i < NP; i++) {
        int ndim = shapes[i][1] ? 2 : 1;
        m->t[i] = (ct_tensor){.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = ndim, .name = names[i],
                              .flags = CT_TENSOR_PARAM | (ndim == 2 && i > 0 && i < 8 ? linear_flags : 0)};
        m->t[i].shape[0] = shapes[i][0];
        m->t[i].shape[1] = shapes[i][1];
        m->slots[i] = (ct_param_slot){.struct_size = sizeof(ct_param_slot), .param = &m->t[i], .unit = units[i],
                                      .numel = ct_tensor_numel(&m->t[i]), .split_axis = -1, .split_dim = -1,
                                      .copy_of = -1};
    }
}

/* The host's part after place(): local (and whole) storage. */
static void dp_model_alloc(dp_model *m) {
    for (int i = 0; i < NP; i++) {
        ct_param_slot *s = &m->slots[i];
        s->local_data = m->local[i] = calloc((size_t)s->local_numel + 1, sizeof(float));
        s->local_grad = m->grad[i] = calloc((size_t)s->local_numel + 1, sizeof(float));
        if (s->whole & CT_WHOLE_DATA) s->whole_data = m->whole[i] = calloc((size_t)s->numel, sizeof(float));
        if (s->whole & CT_WHOLE_GRAD) s->whole_grad = m->wgrad[i] = calloc((size_t)s->numel, sizeof(float));
        if (s->whole_data) s->param->data = s->whole_data;
        if (s->whole_grad) s->param->grad = s->whole_grad;
    }
}

static void dp_model_free(dp_model *m) {
    for (int i = 0; i < NP; i++) {
        free(m->local[i]);
        free(m->grad[i]);
        free(m->whole[i]);
        free(m->wgrad[i]);
    }
}

/* One microbatch through the hooks, as the host runs them: forward units in order, backward in
 * reverse, finish_backward, post_step. */
static void run_step(const ct_strategy_api *api, ct_strategy *s, int nu) {
    for (int k = 0; k < nu; k++) {
        assert_int_equal(api->pre_forward(s, k), CT_OK);
        assert_int_equal(api->post_forward(s, k), CT_OK);
    }
    for (int k = nu - 1; k >= 0; k--) {
        assert_int_equal(api->pre_backward(s, k), CT_OK);
        assert_int_equal(api->post_backward(s, k, 1), CT_OK);
    }
    assert_int_equal(api->finish_backward(s), CT_OK);
    if (api->post_step) assert_int_equal(api->post_step(s), CT_OK);
}

typedef struct dp_case {
    const char *plugin;
    int pp, rep, shard;
    int fp8;
    const char *reshard;
} dp_case;

/* The report of a planning instance on the same placement, and the peak a live instance's step
 * accounted in category cat, both for one case. */
static void dp_report_and_run(const dp_case *c, ct_strategy_report *r, int64_t live_peak[8], double *live_sent) {
    loaded pl = load(c->plugin, CT_KIND_STRATEGY);
    const ct_strategy_api *api = pl.api;
    const char *const opts[] = {"fsdp_reshard_after_forward", c->reshard ? c->reshard : "default", NULL};
    ct_mesh_info mesh = mesh_of(c->pp, c->rep, c->shard, 1);
    ct_strategy_env env = {.struct_size = sizeof env, .mesh = &mesh, .fp8_all_gather = c->fp8, .has_quantizer = c->fp8,
                           .planning = 1};
    /* planning: no device, no comm, no groups */
    ct_mesh_info pmesh = mesh;
    for (int a = 0; a < CT_MESH_NAXES; a++) pmesh.group[a] = NULL;
    pmesh.dp_group = NULL;
    env.mesh = &pmesh;
    dp_model pm;
    dp_model_init(&pm, c->fp8 ? CT_TENSOR_LINEAR | CT_TENSOR_QUANTIZED : CT_TENSOR_LINEAR);
    spec = pl.options;
    overrides = opts;
    ct_strategy *s = NULL;
    assert_int_equal(api->create(&host, &env, &s), CT_OK);
    assert_int_equal(api->place(s, pm.slots, NP), CT_OK);
    assert_int_equal(api->report(s, 1, r), CT_OK);
    api->destroy(s);

    /* live: the CPU device and the two-rank comm */
    dp_model lm;
    dp_model_init(&lm, c->fp8 ? CT_TENSOR_LINEAR | CT_TENSOR_QUANTIZED : CT_TENSOR_LINEAR);
    env = (ct_strategy_env){.struct_size = sizeof env, .dapi = dapi, .dev = dev, .capi = &capi, .comm = comm,
                            .mesh = &mesh, .fp8_all_gather = c->fp8, .has_quantizer = c->fp8};
    assert_int_equal(api->create(&host, &env, &s), CT_OK);
    assert_int_equal(api->place(s, lm.slots, NP), CT_OK);
    for (int i = 0; i < NP; i++) { /* the same placement as the planning instance's */
        assert_int_equal(lm.slots[i].local_numel, pm.slots[i].local_numel);
        assert_int_equal(lm.slots[i].whole, pm.slots[i].whole);
    }
    dp_model_alloc(&lm);
    mem_reset();
    memset(sent_bytes, 0, sizeof sent_bytes);
    assert_int_equal(api->setup(s, lm.slots, NP, 4), CT_OK);
    run_step(api, s, 4);
    memcpy(live_peak, mem_peak, sizeof mem_peak);
    memcpy(live_sent, sent_bytes, sizeof sent_bytes);
    api->destroy(s);
    dp_model_free(&lm);
    overrides = NULL;
}

/* Sums a report's bytes x count for one collective kind and axis. */
static double reported(const ct_strategy_report *r, int kind, int axis) {
    double b = 0;
    for (int i = 0; i < r->n_comms && i < r->max_comms; i++)
        if ((int)r->comms[i].kind == kind && r->comms[i].axis == axis) b += r->comms[i].bytes * r->comms[i].count;
    return b;
}

static void test_fsdp_report_matches_its_buffers_and_bytes(void **state) {
    (void)state;
    static const dp_case cases[] = {
        {PLUGIN("fsdp"), 1, 1, 2, 0, "default"}, {PLUGIN("fsdp"), 1, 1, 2, 0, "always"},
        {PLUGIN("fsdp"), 1, 1, 2, 0, "never"},   {PLUGIN("fsdp"), 1, 1, 2, 1, "default"},
        {PLUGIN("fsdp"), 1, 2, 2, 0, "default"}, {PLUGIN("fsdp"), 2, 1, 2, 1, "default"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const dp_case *c = &cases[i];
        ct_comm_cost comms[64];
        for (int j = 0; j < 64; j++) comms[j].struct_size = sizeof comms[j];
        ct_strategy_report r = {sizeof r, {0}, comms, 64, 0};
        int64_t peak[8];
        double sent[8];
        dp_report_and_run(c, &r, peak, sent);
        assert_true(r.n_comms <= 64);
        if (r.mem_bytes[CT_MEM_COMM] != peak[CT_MEM_COMM])
            fail_msg("fsdp case %zu: reported %lld B of buffers, the step allocated %lld B", i,
                     (long long)r.mem_bytes[CT_MEM_COMM], (long long)peak[CT_MEM_COMM]);
        /* bytes by hand: every parameter's padded rows gathered; converted ones at one byte each */
        double ag = 0, rs = 0;
        for (int p = 0; p < NP; p++) {
            static const int64_t rows[NP] = {65, 16, 8, 8, 16, 8, 8, 8, 64}, cols[NP] = {8, 8, 16, 1, 8, 16, 1, 1, 8};
            double full = (double)((rows[p] + 1) / 2 * 2 * cols[p]) * sizeof(float);
            int quant = c->fp8 && p > 0 && p < 8 && cols[p] > 1;
            int unit = p == 0 ? 0 : p < 4 ? 1 : p < 7 ? 2 : 3;
            int regather = c->pp > 1 || !strcmp(c->reshard, "never") ? 0 : !strcmp(c->reshard, "always") ? 1 : unit != 3;
            ag += (quant ? full / 4 : full) * (1 + regather);
            rs += full;
        }
        assert_true(fabs(reported(&r, CT_COLL_ALL_GATHER, CT_AXIS_DP_SHARD) - ag) < 0.5);
        assert_true(fabs(reported(&r, CT_COLL_REDUCE_SCATTER, CT_AXIS_DP_SHARD) - rs) < 0.5);
        /* and what the live step handed its comm (the amax all-reduce aside) */
        assert_true(fabs(sent[2] - ag) < 0.5);
        assert_true(fabs(sent[3] - rs) < 0.5);
        if (c->rep > 1) assert_true(fabs(reported(&r, CT_COLL_ALL_REDUCE, CT_AXIS_DP_REPLICATE) - rs / 2) < 0.5);
        if (c->fp8) assert_true(reported(&r, CT_COLL_ALL_REDUCE, CT_AXIS_DP_SHARD) == 4 * sizeof(float));
    }
}

static void test_zero_report_matches_its_transient_buffers(void **state) {
    (void)state;
    static const dp_case cases[] = {{PLUGIN("zero1"), 1, 1, 2, 0, NULL}, {PLUGIN("zero2"), 1, 1, 2, 0, NULL}};
    for (size_t i = 0; i < 2; i++) {
        ct_comm_cost comms[64];
        for (int j = 0; j < 64; j++) comms[j].struct_size = sizeof comms[j];
        ct_strategy_report r = {sizeof r, {0}, comms, 64, 0};
        int64_t peak[8];
        double sent[8];
        dp_report_and_run(&cases[i], &r, peak, sent);
        if (r.mem_bytes[CT_MEM_GRADS] != peak[CT_MEM_GRADS] || r.mem_bytes[CT_MEM_COMM] != peak[CT_MEM_COMM])
            fail_msg("%s: reported grads %lld comm %lld B, the step held %lld and %lld B", cases[i].plugin,
                     (long long)r.mem_bytes[CT_MEM_GRADS], (long long)r.mem_bytes[CT_MEM_COMM],
                     (long long)peak[CT_MEM_GRADS], (long long)peak[CT_MEM_COMM]);
        assert_true(fabs(reported(&r, CT_COLL_REDUCE_SCATTER, CT_AXIS_DP_SHARD) - sent[3]) < 0.5);
        assert_true(fabs(reported(&r, CT_COLL_ALL_GATHER, CT_AXIS_DP_SHARD) - sent[2]) < 0.5);
    }
}

static void test_ddp_reports_one_all_reduce_per_parameter(void **state) {
    (void)state;
    loaded pl = load(PLUGIN("ddp"), CT_KIND_STRATEGY);
    const ct_strategy_api *api = pl.api;
    ct_mesh_info mesh = mesh_of(1, 2, 1, 1);
    for (int a = 0; a < CT_MESH_NAXES; a++) mesh.group[a] = NULL;
    ct_strategy_env env = {.struct_size = sizeof env, .mesh = &mesh, .planning = 1};
    dp_model m;
    dp_model_init(&m, CT_TENSOR_LINEAR);
    ct_strategy *s = NULL;
    spec = NULL;
    assert_int_equal(api->create(&host, &env, &s), CT_OK);
    assert_int_equal(api->place(s, m.slots, NP), CT_OK);
    ct_comm_cost comms[16];
    for (int j = 0; j < 16; j++) comms[j].struct_size = sizeof comms[j];
    ct_strategy_report r = {sizeof r, {0}, comms, 16, 0};
    assert_int_equal(api->report(s, 4, &r), CT_OK);
    assert_int_equal(r.n_comms, NP);
    double total = 0;
    for (int i = 0; i < NP; i++) total += (double)m.slots[i].numel * sizeof(float);
    assert_true(reported(&r, CT_COLL_ALL_REDUCE, CT_AXIS_DP_REPLICATE) == total); /* once per step, 4 microbatches */
    for (int k = 0; k < 8; k++) assert_int_equal(r.mem_bytes[k], 0);
    api->destroy(s);
}

/* ---------------------------------------------------------------- float8 */

static void test_float8_plan_linear_matches_its_scratch(void **state) {
    (void)state;
    loaded pl = load(PLUGIN("float8"), CT_KIND_QUANTIZER);
    const ct_quantizer_api *api = pl.api;
    static const char *recipes[] = {"tensorwise", "e4m3", "e5m2", "rowwise", "rowwise_with_gw_hp", "mxfp8"};
    enum { N = 64, OUT = 32, IN = 64 };
    ct_tensor w = {.struct_size = sizeof w, .dtype = CT_F32, .ndim = 2, .shape = {OUT, IN}, .name = "l0.w1"};
    float *x = calloc(N * IN, sizeof(float)), *wd = calloc(OUT * IN, sizeof(float)), *y = calloc(N * OUT, sizeof(float));
    float *dx = calloc(N * IN, sizeof(float)), *dw = calloc(OUT * IN, sizeof(float));
    assert_true(x && wd && y && dx && dw);
    for (int i = 0; i < N * IN; i++) x[i] = (float)((i % 7) - 3);
    for (int i = 0; i < OUT * IN; i++) wd[i] = (float)((i % 5) - 2) * 0.25f;
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++) {
        const char *const opts[] = {"format", recipes[i], NULL};
        spec = pl.options;
        overrides = opts;
        /* live: what the three GEMMs leave in its grow-only scratch */
        ct_quantizer *q = NULL;
        mem_reset();
        assert_int_equal(api->create(&host, dapi, dev, &q), CT_OK);
        const char *why = NULL;
        assert_int_equal(api->converts(q, &w, &why), 1);
        assert_int_equal(api->forward(q, y, x, wd, N, OUT, IN), CT_OK);
        assert_int_equal(api->backward_input(q, dx, y, wd, N, OUT, IN), CT_OK);
        assert_int_equal(api->backward_weight(q, dw, y, x, N, OUT, IN), CT_OK);
        int64_t held = mem_now[CT_MEM_OTHER];
        ct_quant_cost live = {.struct_size = sizeof live};
        assert_int_equal(api->plan_linear(q, &w, N, &live), CT_OK);
        api->destroy(q);
        /* planning: no device */
        ct_quantizer *pq = NULL;
        assert_int_equal(api->create(&host, NULL, NULL, &pq), CT_OK);
        ct_quant_cost c = {.struct_size = sizeof c};
        assert_int_equal(api->plan_linear(pq, &w, N, &c), CT_OK);
        assert_int_not_equal(api->forward(pq, y, x, wd, N, OUT, IN), CT_OK); /* a planning instance runs nothing */
        api->destroy(pq);
        if ((double)held != live.scratch_bytes)
            fail_msg("float8 %s: plan_linear says %.0f B of scratch, the GEMMs left %lld B", recipes[i],
                     live.scratch_bytes, (long long)held);
        assert_true(c.saved_bytes == 0 && c.weight_bytes == 0);
        int mx = !strcmp(recipes[i], "mxfp8");
        /* the CPU device has the scaled fp8 matmuls: a planning instance assumes them too, but MX blocks
         * are always emulated (f32 GEMMs) */
        assert_int_equal(live.gemm_dtype, mx ? CT_F32 : CT_F8_E4M3);
        assert_int_equal(c.gemm_dtype, live.gemm_dtype);
        assert_true(c.scratch_bytes == live.scratch_bytes);
        if (!strcmp(recipes[i], "tensorwise")) { /* x and w cast once each: amax 4e, cast 4e + e */
            assert_true(c.cast_bytes[0] == 9.0 * (N * IN + OUT * IN));
            /* dx: dy as is, w transposed first (+8e); dw: dy and x transposed */
            assert_true(c.cast_bytes[1] == 9.0 * (N * OUT + OUT * IN) + 8.0 * OUT * IN + 9.0 * (OUT * N + IN * N) +
                                               8.0 * (OUT * N + IN * N));
        }
    }
    overrides = NULL;
    free(x);
    free(wd);
    free(y);
    free(dx);
    free(dw);
}

/* ---------------------------------------------------------------- optimizers */

static ct_param_slot slot_of(ct_tensor *t, int64_t local, int placement) {
    ct_param_slot s = {.struct_size = sizeof s, .param = t, .numel = ct_tensor_numel(t), .placement = placement,
                       .shard_axis = CT_AXIS_DP_SHARD, .local_numel = local, .split_axis = -1, .split_dim = -1,
                       .copy_of = -1};
    for (int d = 0; d < t->ndim; d++) s.global_shape[d] = t->shape[d];
    return s;
}

static void test_optimizers_plan_step_by_hand(void **state) {
    (void)state;
    ct_tensor w = {.struct_size = sizeof w, .dtype = CT_F32, .ndim = 2, .shape = {64, 32}, .name = "layers.0.wq.weight",
                   .flags = CT_TENSOR_PARAM | CT_TENSOR_LINEAR};
    ct_tensor norm = {.struct_size = sizeof norm, .dtype = CT_F32, .ndim = 1, .shape = {32}, .name = "norm.weight",
                      .flags = CT_TENSOR_PARAM | CT_TENSOR_NO_DECAY};
    ct_param_slot whole = slot_of(&w, 64 * 32, CT_PLACE_REPLICATE), shard = slot_of(&w, 32 * 32, CT_PLACE_SHARD),
                  ns = slot_of(&norm, 32, CT_PLACE_REPLICATE);
    ct_optimizer_cost c;

    loaded a = load(PLUGIN("adamw"), CT_KIND_OPTIMIZER);
    const ct_optimizer_api *aapi = a.api;
    ct_optimizer *o = NULL;
    spec = a.options;
    assert_int_equal(aapi->create(&host, NULL, NULL, &o), CT_OK); /* planning: no device */
    c = (ct_optimizer_cost){.struct_size = sizeof c};
    assert_int_equal(aapi->plan_step(o, &shard, &c), CT_OK);
    assert_true(c.bytes == 1024.0 * 4 * 7); /* read p, g, m, v; write p, m, v */
    assert_true(c.flops == 1024.0 * 14 && c.matmul_flops == 0 && c.comm_bytes == 0);
    aapi->destroy(o);

    loaded l = load(CT_LION_SO, CT_KIND_OPTIMIZER);
    const ct_optimizer_api *lapi = l.api;
    spec = l.options;
    assert_int_equal(lapi->create(&host, NULL, NULL, &o), CT_OK);
    c = (ct_optimizer_cost){.struct_size = sizeof c};
    assert_int_equal(lapi->plan_step(o, &whole, &c), CT_OK);
    assert_true(c.bytes == 2048.0 * 4 * 11 && c.flops == 2048.0 * 10); /* four axpby/sign passes */
    lapi->destroy(o);

    loaded m = load(PLUGIN("muon"), CT_KIND_OPTIMIZER);
    const ct_optimizer_api *mapi = m.api;
    spec = m.options;
    assert_int_equal(mapi->create(&host, NULL, NULL, &o), CT_OK);
    c = (ct_optimizer_cost){.struct_size = sizeof c};
    assert_int_equal(mapi->plan_step(o, &ns, &c), CT_OK); /* a norm: AdamW's update */
    assert_true(c.bytes == 32.0 * 4 * 7 && c.matmul_flops == 0);
    c = (ct_optimizer_cost){.struct_size = sizeof c};
    assert_int_equal(mapi->plan_step(o, &whole, &c), CT_OK);
    double k = 32, lg = 64, want = 5 * (4 * k * k * lg + 2 * k * k * k); /* 5 steps: X X^T, A A, B X */
    assert_true(c.matmul_flops == want);
    assert_true(c.comm_bytes == 0);
    c = (ct_optimizer_cost){.struct_size = sizeof c};
    assert_int_equal(mapi->plan_step(o, &shard, &c), CT_OK);
    assert_true(c.matmul_flops == want);             /* on the whole matrix, whatever the shard */
    assert_true(c.comm_bytes == 64.0 * 32 * 4);      /* the shard gathered into the whole */
    mapi->destroy(o);
    spec = NULL;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_plans_make_forwards_shapes),
        cmocka_unit_test(test_tp_plans_without_async_tp),
        cmocka_unit_test(test_tp_reports_the_sequence_parallel_all_reduce),
        cmocka_unit_test(test_fsdp_report_matches_its_buffers_and_bytes),
        cmocka_unit_test(test_zero_report_matches_its_transient_buffers),
        cmocka_unit_test(test_ddp_reports_one_all_reduce_per_parameter),
        cmocka_unit_test(test_float8_plan_linear_matches_its_scratch),
        cmocka_unit_test(test_optimizers_plan_step_by_hand),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
