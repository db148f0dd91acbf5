/* ops.c: the builder context parallel wraps. The pack's forward stays single-device: it is handed the
 * whole (B, T) token ids and targets, and this builder keeps this rank's rows (cp.h: chunks i and
 * 2cp-1-i of each sequence) where they enter and leave the model:
 *
 *   embedding      the local rows of the model's token ids (B, T/cp), then the next builder's embedding
 *   positions      the local rows' positions (for learned position embeddings)
 *   rope           RoPE at the local rows' real positions (a custom op on rope_forward_general)
 *   rope_freqs     the same with the model's frequency table (rope_forward_general with a table)
 *   attention      the local queries against every rank's keys (attention.c)
 *   cross_entropy  the local rows of the targets, the next builder's loss, then summed over cp, so
 *                  every cp rank holds the whole sequence's loss and each back-propagates its tokens'
 *   finish_output  the next builder's, then every rank's rows gathered back into sequence order
 *
 * Everything else passes through. On the planner's builder the same ops run on shapes only: no
 * device, no comm, no data (custom ops run their plan).
 */
#include "cp.h"

#include <stdlib.h>
#include <string.h>

#define CP(b) ((cp *)(b)->ctx)

/* positions' output is already local: the embedding must not cut it again */
static char local_ids_key;

static int64_t numel(const ct_tensor *t) { return ct_tensor_numel(t); }

/* ---- chunk moves between a rank's rows and the whole sequence ---- */

/* Moves rank r's two chunks (c rows of e elements each, per sequence) between local (b, 2c, e) and
 * global (b, 2 cp c, e); to_global chooses the direction. copy_2d where the device has it (f32 rows
 * of b sequences at once), else one copy per chunk per sequence (int32 always goes by copy). */
static int move_chunks(cp *c, char *global, char *local, int r, int64_t b, int64_t tl, int64_t e, size_t elem,
                       int to_global) {
    const ct_device_api *d = c->env.dapi;
    int64_t ch = tl / 2, T = tl * c->size;
    int use_2d = elem == sizeof(float) && CT_HAS_FIELD(d, ct_device_api, copy_2d) && d->copy_2d;
    for (int h = 0; h < 2; h++) {
        int64_t g = h == 0 ? r : 2 * c->size - 1 - r; /* the chunk's index in the sequence */
        char *gp = global + (size_t)(g * ch * e) * elem, *lp = local + (size_t)(h * ch * e) * elem;
        if (use_2d) {
            ct_status st = to_global ? d->copy_2d(c->env.dev, (float *)gp, T * e, (const float *)lp, tl * e, b, ch * e)
                                     : d->copy_2d(c->env.dev, (float *)lp, tl * e, (const float *)gp, T * e, b, ch * e);
            if (cp_failed(c, st, "copy_2d")) return -1;
            continue;
        }
        for (int64_t s = 0; s < b; s++) {
            char *gs = gp + (size_t)(s * T * e) * elem, *ls = lp + (size_t)(s * tl * e) * elem;
            ct_status st = d->copy(c->env.dev, to_global ? gs : ls, to_global ? ls : gs, (size_t)(ch * e) * elem,
                                   CT_COPY_D2D);
            if (cp_failed(c, st, "copy")) return -1;
        }
    }
    return 0;
}

int cp_chunks_to_global(cp *c, void *global, const void *local, int r, int64_t b, int64_t tl, int64_t e, size_t elem) {
    return move_chunks(c, global, (char *)local, r, b, tl, e, elem, 1);
}

int cp_chunks_to_local(cp *c, void *local, const void *global, int r, int64_t b, int64_t tl, int64_t e, size_t elem) {
    return move_chunks(c, (char *)global, local, r, b, tl, e, elem, 0);
}

/* ---- positions, made once per local length ---- */

const int32_t *cp_positions_for(cp *c, int64_t tl) {
    for (cp_positions *q = c->positions; q; q = q->next)
        if (q->tl == tl) return q->pos;
    int64_t n = tl * c->size, ch = tl / 2;
    size_t bytes = sizeof(int32_t) * (size_t)(2 * n);
    cp_positions *q = calloc(1, sizeof *q);
    int32_t *host = malloc(bytes);
    void *dev = NULL;
    if (!q || !host || c->env.dapi->alloc(c->env.dev, bytes, &dev) != CT_OK) {
        free(q);
        free(host);
        c->host->set_error(c->host, "context parallel: out of memory for the position table (%zu bytes)", bytes);
        return NULL;
    }
    for (int r = 0; r < c->size; r++) /* rank r's rows: chunk r, then chunk 2cp-1-r */
        for (int64_t j = 0; j < tl; j++) {
            int64_t g = j < ch ? r : 2 * c->size - 1 - r;
            host[r * tl + j] = (int32_t)(g * ch + j % ch);
        }
    for (int64_t j = 0; j < n; j++) host[n + j] = (int32_t)j;
    ct_status st = c->env.dapi->copy(c->env.dev, dev, host, bytes, CT_COPY_H2D);
    free(host);
    if (cp_failed(c, st, "copy of the position table")) {
        c->env.dapi->free(c->env.dev, dev);
        free(q);
        return NULL;
    }
    q->tl = tl;
    q->pos = dev;
    q->next = c->positions;
    c->positions = q;
    c->positions_bytes += (int64_t)bytes;
    c->host->mem_account(c->host, CT_MEM_OTHER, (int64_t)bytes);
    return q->pos;
}

/* The local row count of a sequence of t tokens, or -1 with the error set. */
static int64_t local_rows(cp *c, int64_t t, const char *what) {
    if (t <= 0 || t % (2 * c->size)) {
        c->host->set_error(c->host, "context parallel: %s of %lld tokens do not split into 2 x %d equal chunks", what,
                           (long long)t, c->size);
        return -1;
    }
    return t / c->size;
}

/* This rank's rows of int32 ids (..., T) -> (..., T/cp): a fresh tensor of the builder's. */
static ct_tensor *local_ids(cp *c, ct_builder *n, const ct_tensor *ids, const char *what) {
    if (!ids || ids->dtype != CT_I32 || ids->ndim < 1) {
        c->host->set_error(c->host, "context parallel: %s must be int32 (batch, seq)", what);
        return NULL;
    }
    int64_t t = ids->shape[ids->ndim - 1], tl = local_rows(c, t, what), shape[CT_MAX_DIMS];
    if (tl < 0) return NULL;
    memcpy(shape, ids->shape, sizeof shape);
    shape[ids->ndim - 1] = tl;
    ct_tensor *out = n->new_tensor(n, CT_I32, ids->ndim, shape);
    if (!out || cp_planning(n)) return out;
    int64_t b = numel(ids) / t;
    return cp_chunks_to_local(c, out->data, ids->data, c->rank, b, tl, 1, sizeof(int32_t)) ? NULL : out;
}

/* The model's token ids (the host marks them CT_TENSOR_TOKEN_IDS) are cut to this rank's rows; the
 * positions() output is local already; any other ids are the pack's own (a class label, a table
 * lookup that is not per token) and pass as they are; a per-token tensor of the pack's own would then
 * keep T rows where the activations have T/cp, and the next op that meets both refuses the shapes. */
static ct_tensor *cp_embedding(ct_builder *b, const ct_tensor *ids, ct_tensor *table) {
    cp *c = CP(b);
    ct_builder *n = c->next;
    if (!ids || !(ids->flags & CT_TENSOR_TOKEN_IDS) || n->memo(n, (ct_tensor *)ids, &local_ids_key, NULL))
        return n->embedding(n, ids, table);
    ct_tensor *mine = local_ids(c, n, ids, "token ids");
    return mine ? n->embedding(n, mine, table) : NULL;
}

/* seq is the whole sequence's length (what the single-device pack knows): the result is (batch,
 * seq/cp), this rank's rows' positions, which the embedding then takes as they are. */
static ct_tensor *cp_positions_op(ct_builder *b, int64_t batch, int64_t seq) {
    cp *c = CP(b);
    ct_builder *n = c->next;
    int64_t tl = local_rows(c, seq, "positions"), shape[2] = {batch, tl};
    if (tl < 0) return NULL;
    if (batch <= 0) {
        c->host->set_error(c->host, "positions: batch and seq must be positive");
        return NULL;
    }
    ct_tensor *p = n->new_tensor(n, CT_I32, 2, shape);
    if (!p || !n->memo(n, p, &local_ids_key, p)) return NULL;
    if (cp_planning(n)) return p;
    const int32_t *pos = cp_positions_for(c, tl);
    if (!pos) return NULL;
    for (int64_t s = 0; s < batch; s++)
        if (cp_failed(c, c->env.dapi->copy(c->env.dev, (int32_t *)p->data + s * tl, pos + c->rank * tl,
                                           sizeof(int32_t) * (size_t)tl, CT_COPY_D2D), "copy"))
            return NULL;
    return p;
}

/* ---- RoPE at the local rows' positions ---- */
typedef struct {
    cp *c;
    float theta;
    const float *inv_freq; /* rope_freqs: the model's table (device memory, the step's arena), else NULL */
} rope_state;

static ct_status rope_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    rope_state *s = sp;
    cp *c = s->c;
    const ct_tensor *x = in[0];
    (void)n_in;
    (void)n_out;
    const int32_t *pos = cp_positions_for(c, x->shape[1]);
    if (!pos || !(out[0] = b->new_tensor(b, CT_F32, 4, x->shape))) return CT_ERR_NOMEM;
    return c->env.dapi->rope_forward_general(c->env.dev, out[0]->data, x->data, pos + c->rank * x->shape[1],
                                             s->inv_freq, s->theta, x->shape[0], x->shape[1], x->shape[2],
                                             x->shape[3]);
}

static ct_status rope_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                          const float *const *dy, int n_out, int halves) {
    rope_state *s = sp;
    cp *c = s->c;
    ct_tensor *x = in[0];
    (void)n_in;
    (void)out;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    const int32_t *pos = cp_positions_for(c, x->shape[1]);
    float *g = b->grad(b, x);
    if (!pos || !g) return CT_ERR_NOMEM;
    return c->env.dapi->rope_backward_general(c->env.dev, g, dy[0], pos + c->rank * x->shape[1], s->inv_freq,
                                              s->theta, x->shape[0], x->shape[1], x->shape[2], x->shape[3]);
}

/* The planner's forward: y shaped like x; memory-bound (x read and y written; dy read, dx read and
 * written), no GEMM and no collective. */
static ct_status rope_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                           ct_op_cost *cost) {
    const ct_tensor *x = in[0];
    (void)sp;
    (void)n_in;
    (void)n_out;
    if (!(out[0] = b->new_tensor(b, CT_F32, 4, x->shape))) return CT_ERR_NOMEM;
    double bytes = (double)numel(x) * sizeof(float);
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = 2 * bytes;
    cost->bytes[1] = 3 * bytes;
    return CT_OK;
}

static const ct_custom_op rope_op = {sizeof(ct_custom_op), "cp.rope", rope_fwd, rope_bwd, rope_plan};

static ct_tensor *cp_rope(ct_builder *b, ct_tensor *x, float theta) {
    cp *c = CP(b);
    ct_builder *n = c->next;
    if (!x || x->dtype != CT_F32 || x->ndim != 4 || x->shape[3] % 2 || x->shape[1] % 2) {
        c->host->set_error(c->host, "rope: expects x of shape (B, T, H, D) with D even (context parallel: T this "
                                    "rank's rows, an even count)");
        return NULL;
    }
    rope_state s = {c, theta, NULL};
    ct_tensor *in[1] = {x}, *out[1] = {NULL};
    return n->custom(n, &rope_op, &s, sizeof s, in, 1, out, 1) == CT_OK ? out[0] : NULL;
}

/* inv (half floats) on the device, copied on first use and kept until destroy; NULL with the error set. */
static const float *freqs_on_device(cp *c, const float *inv, int64_t half) {
    size_t bytes = sizeof(float) * (size_t)half;
    for (cp_freqs *f = c->freqs; f; f = f->next)
        if (f->half == half && !memcmp(f->host, inv, bytes)) return f->dev;
    cp_freqs *f = calloc(1, sizeof *f + bytes);
    void *dev = NULL;
    if (!f || c->env.dapi->alloc(c->env.dev, bytes, &dev) != CT_OK || !dev) {
        free(f);
        c->host->set_error(c->host, "context parallel: out of memory for the RoPE frequency table");
        return NULL;
    }
    if (cp_failed(c, c->env.dapi->copy(c->env.dev, dev, inv, bytes, CT_COPY_H2D), "copy of the RoPE table")) {
        c->env.dapi->free(c->env.dev, dev);
        free(f);
        return NULL;
    }
    f->dev = dev;
    f->half = half;
    memcpy(f->host, inv, bytes);
    f->next = c->freqs;
    c->freqs = f;
    return f->dev;
}

/* Scaled RoPE (ABI 2.4) at the local rows' real positions, with the model's table on the device. */
static ct_tensor *cp_rope_freqs(ct_builder *b, ct_tensor *x, const float *inv_freq) {
    cp *c = CP(b);
    ct_builder *n = c->next;
    const ct_device_api *d = c->env.dapi;
    if (!x || x->dtype != CT_F32 || x->ndim != 4 || x->shape[3] % 2 || x->shape[1] % 2 || !inv_freq) {
        c->host->set_error(c->host, "rope_freqs: expects x of shape (B, T, H, D) with D even and D/2 frequencies "
                                    "(context parallel: T this rank's rows, an even count)");
        return NULL;
    }
    if (!cp_planning(n) &&
        (!CT_HAS_FIELD(d, ct_device_api, rope_backward_general) || !d->rope_forward_general ||
         !d->rope_backward_general)) {
        c->host->set_error(c->host, "context parallel: the device lacks rope_forward_general/rope_backward_general "
                                    "(ABI 2.23), which scaled RoPE needs");
        return NULL;
    }
    const float *table = NULL;
    if (!cp_planning(n) && !(table = freqs_on_device(c, inv_freq, x->shape[3] / 2))) return NULL;
    rope_state s = {c, 0, table};
    ct_tensor *in[1] = {x}, *out[1] = {NULL};
    return n->custom(n, &rope_op, &s, sizeof s, in, 1, out, 1) == CT_OK ? out[0] : NULL;
}

static ct_tensor *cp_attention_op(ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v) {
    cp *c = CP(b);
    return cp_attention(c, c->next, q, k, v);
}

/* ---- the loss: this rank's tokens, summed over cp ---- */
static ct_tensor *cp_cross_entropy(ct_builder *b, ct_tensor *logits, const ct_tensor *targets) {
    cp *c = CP(b);
    ct_builder *n = c->next;
    ct_tensor *mine = local_ids(c, n, targets, "targets");
    ct_tensor *loss = mine ? n->cross_entropy(n, logits, mine) : NULL;
    if (!loss) return NULL;
    /* the host's collectives work on token rows: the scalar as one (1, 1) row and back */
    int64_t one[2] = {1, 1};
    ct_tensor *row = n->view(n, loss, 2, one);
    ct_tensor *sum = row ? n->collective(n, CT_COLL_ALL_REDUCE, row, CT_AXIS_CP, CT_DIM_ROWS) : NULL;
    return sum ? n->view(n, sum, 0, NULL) : NULL;
}

/* ---- the output without targets: every rank's rows, in sequence order ---- */
typedef struct {
    cp *c;
} gather_state;

static ct_status gather_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    cp *c = ((gather_state *)sp)->c;
    const ct_tensor *x = in[0];
    (void)n_in;
    (void)n_out;
    int64_t nd = x->ndim, tl = x->shape[nd - 2], e = x->shape[nd - 1], bs = numel(x) / (tl * e), n = numel(x);
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[nd - 2] = tl * c->size;
    out[0] = b->new_tensor(b, CT_F32, (int)nd, shape);
    float *all = b->scratch(b, sizeof(float) * (size_t)(n * c->size));
    if (!out[0] || !all) return CT_ERR_NOMEM;
    ct_status st = c->env.capi->all_gather(c->env.comm, c->group, x->data, all, n, CT_F32, NULL);
    if (cp_failed(c, st, "all-gather of the output rows")) return st;
    for (int r = 0; r < c->size; r++)
        if (cp_chunks_to_global(c, out[0]->data, all + r * n, r, bs, tl, e, sizeof(float))) return CT_ERR_INTERNAL;
    return CT_OK;
}

/* Every cp rank computed the same whole-sequence gradient: x's is its own rows of it. */
static ct_status gather_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                            const float *const *dy, int n_out, int halves) {
    cp *c = ((gather_state *)sp)->c;
    ct_tensor *x = in[0];
    (void)n_in;
    (void)out;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    int64_t nd = x->ndim, tl = x->shape[nd - 2], e = x->shape[nd - 1], bs = numel(x) / (tl * e), n = numel(x);
    float *g = b->grad(b, x), *tmp = b->scratch(b, sizeof(float) * (size_t)n);
    if (!g || !tmp) return CT_ERR_NOMEM;
    if (cp_chunks_to_local(c, tmp, dy[0], c->rank, bs, tl, e, sizeof(float))) return CT_ERR_INTERNAL;
    return c->env.dapi->axpy(c->env.dev, g, tmp, 1.0f, n);
}

static ct_status gather_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                             ct_op_cost *cost) {
    cp *c = ((gather_state *)sp)->c;
    const ct_tensor *x = in[0];
    (void)n_in;
    (void)n_out;
    int64_t nd = x->ndim, n = numel(x), shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[nd - 2] *= c->size;
    if (!(out[0] = b->new_tensor(b, CT_F32, (int)nd, shape)) || !b->scratch(b, sizeof(float) * (size_t)(n * c->size)))
        return CT_ERR_NOMEM;
    double whole = (double)n * c->size * sizeof(float);
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = 2 * whole;                        /* the gathered rows moved into place */
    cost->bytes[1] = 3.0 * (double)n * sizeof(float); /* x's rows of dy added into its gradient */
    cp_plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_FORWARD, 0, (double)n * c->size, 1);
    return CT_OK;
}

static const ct_custom_op gather_op = {sizeof(ct_custom_op), "cp.gather_rows", gather_fwd, gather_bwd, gather_plan};

static ct_tensor *cp_finish_output(ct_builder *b, ct_tensor *x) {
    cp *c = CP(b);
    ct_builder *n = c->next;
    if (!(x = n->finish_output(n, x))) return NULL;
    if (x->dtype != CT_F32 || x->ndim < 2 || x->shape[x->ndim - 2] % 2) {
        c->host->set_error(c->host, "context parallel: the model's output must be f32 (..., rows, columns) with this "
                                    "rank's rows");
        return NULL;
    }
    gather_state s = {c};
    ct_tensor *in[1] = {x}, *out[1] = {NULL};
    return n->custom(n, &gather_op, &s, sizeof s, in, 1, out, 1) == CT_OK ? out[0] : NULL;
}

void cp_plan_comm(ct_op_cost *cost, int kind, int phase, int overlapped, double elems, int calls) {
    if (cost->n_comm >= (int)(sizeof cost->comm / sizeof cost->comm[0])) return;
    cost->comm[cost->n_comm++] = (ct_op_comm){CT_AXIS_CP, kind, phase, overlapped, elems * sizeof(float), calls};
}

void cp_builder_init(cp *c, ct_builder *next, ct_builder *out) {
    c->next = next;
    out->ctx = c; /* every other op already forwards to next */
    out->embedding = cp_embedding;
    out->positions = cp_positions_op;
    out->rope = cp_rope;
    if (CT_HAS_FIELD(next, ct_builder, rope_freqs) && next->rope_freqs) out->rope_freqs = cp_rope_freqs;
    out->attention = cp_attention_op;
    out->cross_entropy = cp_cross_entropy;
    out->finish_output = cp_finish_output;
}
