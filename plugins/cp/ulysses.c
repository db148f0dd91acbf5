/* ulysses.c: DeepSpeed-Ulysses context parallel (context_parallel_rotate_method: ulysses). Attention
 * is split over cp by heads rather than by rows: each rank holds its rows of q (B, Tl, H, D) and k, v
 * (B, Tl, KVH, D), Tl = T / cp, and
 *
 *   q, k, v  all-to-all over cp on the builder (CT_DIM_COLS: rank r's run of H/cp heads goes to rank
 *            r, every rank's rows come back) -> (B, T, H/cp, D), the rows rank-major: rank r's two
 *            load-balanced chunks after rank r-1's; a custom op puts them in sequence order
 *   attend   the next builder's plain causal attention over the whole sequence on H/cp heads (H/cp a
 *            multiple of KVH/cp: the same query-to-kv-head groups)
 *   out      the inverse: rows back to rank-major, all-to-all (CT_DIM_ROWS) -> (B, Tl, H, D)
 *
 * Everything is a builder op, so the backward is the tape's (the all-to-alls' conjugates, the custom
 * op's inverse permutation), and the planner sees the four all-to-alls each way and the attention
 * at its real shape without a cost model of its own here; the permutation's plan gives its bytes.
 */
#include "cp.h"

#include <string.h>

typedef struct {
    cp *c;
    int to_global; /* 1: rank-major rows -> sequence order; 0: the inverse */
} perm_state;

/* src (b, T, e) -> dst: to_global, rows rank-major (rank r's block of b sequences x Tl rows, its chunks
 * r and 2cp-1-r) into sequence order; else sequence order into rank-major. 0, or -1 with the error set. */
static int permute(cp *c, float *dst, const float *src, int64_t b, int64_t tl, int64_t e, int to_global) {
    int64_t n = b * tl * e; /* one rank's block */
    for (int r = 0; r < c->size; r++)
        if (to_global ? cp_chunks_to_global(c, dst, src + r * n, r, b, tl, e, sizeof(float))
                      : cp_chunks_to_local(c, dst + r * n, src, r, b, tl, e, sizeof(float)))
            return -1;
    return 0;
}

static ct_status perm_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    perm_state *s = sp;
    const ct_tensor *x = in[0];
    (void)n_in;
    (void)n_out;
    if (!(out[0] = b->new_tensor(b, CT_F32, 3, x->shape))) return CT_ERR_NOMEM;
    return permute(s->c, out[0]->data, x->data, x->shape[0], x->shape[1] / s->c->size, x->shape[2], s->to_global)
               ? CT_ERR_INTERNAL
               : CT_OK;
}

/* The gradient goes the other way: x's += dy permuted back, through a temporary from the unit's
 * backward region where the builder has one (ABI 2.7). */
static ct_status perm_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                          const float *const *dy, int n_out, int halves) {
    perm_state *s = sp;
    ct_tensor *x = in[0];
    (void)n_in;
    (void)out;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    int64_t n = ct_tensor_numel(x);
    size_t bytes = sizeof(float) * (size_t)n;
    float *g = b->grad(b, x);
    float *tmp = CT_HAS_FIELD(b, ct_builder, backward_scratch) && b->backward_scratch ? b->backward_scratch(b, bytes)
                                                                                      : b->scratch(b, bytes);
    if (!g || !tmp) return CT_ERR_NOMEM;
    if (permute(s->c, tmp, dy[0], x->shape[0], x->shape[1] / s->c->size, x->shape[2], !s->to_global))
        return CT_ERR_INTERNAL;
    return s->c->env.dapi->axpy(s->c->env.dev, g, tmp, 1.0f, n);
}

/* Memory-bound: forward reads x and writes y; backward reads dy, writes the temporary, then reads it
 * and the gradient and writes the gradient. No GEMM, no collective. */
static ct_status perm_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                           ct_op_cost *cost) {
    const ct_tensor *x = in[0];
    (void)sp;
    (void)n_in;
    (void)n_out;
    if (!(out[0] = b->new_tensor(b, CT_F32, 3, x->shape))) return CT_ERR_NOMEM;
    double bytes = (double)ct_tensor_numel(x) * sizeof(float);
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = 2 * bytes;
    cost->bytes[1] = 5 * bytes;
    if (CT_HAS_FIELD(cost, ct_op_cost, backward_scratch) && CT_HAS_FIELD(b, ct_builder, backward_scratch) &&
        b->backward_scratch)
        cost->backward_scratch = bytes;
    else if (!b->scratch(b, (size_t)bytes))
        return CT_ERR_NOMEM;
    return CT_OK;
}

static const ct_custom_op perm_op = {sizeof(ct_custom_op), "cp.ulysses_reorder", perm_fwd, perm_bwd, perm_plan};

static ct_tensor *reorder(cp *c, ct_builder *b, ct_tensor *x, int to_global) {
    perm_state s = {c, to_global};
    ct_tensor *in[1] = {x}, *out[1] = {NULL};
    return b->custom(b, &perm_op, &s, sizeof s, in, 1, out, 1) == CT_OK ? out[0] : NULL;
}

/* x (B, Tl, h, D), this rank's rows of every head -> (B, T, h/cp, D), every row of this rank's heads
 * in sequence order. */
static ct_tensor *heads_out(cp *c, ct_builder *b, ct_tensor *x) {
    int64_t B = x->shape[0], tl = x->shape[1], h = x->shape[2], d = x->shape[3];
    int64_t rows[3] = {B, tl, h * d}, whole[4] = {B, tl * c->size, h / c->size, d};
    ct_tensor *flat = b->view(b, x, 3, rows);
    ct_tensor *mixed = flat ? b->collective(b, CT_COLL_ALL_TO_ALL, flat, CT_AXIS_CP, CT_DIM_COLS) : NULL;
    ct_tensor *ordered = mixed ? reorder(c, b, mixed, 1) : NULL; /* (B, T, h d / cp) */
    return ordered ? b->view(b, ordered, 4, whole) : NULL;
}

/* The inverse: o (B, T, h/cp, D) -> (B, Tl, h, D). */
static ct_tensor *heads_in(cp *c, ct_builder *b, ct_tensor *o) {
    int64_t B = o->shape[0], t = o->shape[1], hc = o->shape[2], d = o->shape[3];
    int64_t rows[3] = {B, t, hc * d}, mine[4] = {B, t / c->size, hc * c->size, d};
    ct_tensor *flat = b->view(b, o, 3, rows);
    ct_tensor *mixed = flat ? reorder(c, b, flat, 0) : NULL; /* rank r's rows, rank-major */
    ct_tensor *back = mixed ? b->collective(b, CT_COLL_ALL_TO_ALL, mixed, CT_AXIS_CP, CT_DIM_ROWS) : NULL;
    return back ? b->view(b, back, 4, mine) : NULL;
}

ct_tensor *cp_ulysses_attention(cp *c, ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v) {
    if (q->shape[2] % c->size || k->shape[2] % c->size) { /* a pack that did not describe its heads */
        c->host->set_error(c->host, "context_parallel_rotate_method: ulysses splits each rank's attention heads over "
                                    "context_parallel_degree %d, which must divide them: this rank's attention has "
                                    "%lld heads and %lld kv heads (per tp rank under tensor parallel); use a degree "
                                    "that divides both, or allgather or alltoall",
                           c->size, (long long)q->shape[2], (long long)k->shape[2]);
        return NULL;
    }
    if (!c->ulysses_said && !c->env.planning && c->mesh.world_rank == 0) /* once, what the run does */
        c->host->log(c->host, CT_LOG_INFO,
                     "context parallel ulysses: each of %d cp ranks attends %lld of the %lld query heads and %lld of the "
                     "%lld kv heads%s over the whole sequence of %lld tokens (4 all-to-alls per layer forward, 4 "
                     "backward)",
                     c->size, (long long)(q->shape[2] / c->size), (long long)q->shape[2],
                     (long long)(k->shape[2] / c->size), (long long)k->shape[2],
                     c->mesh.degree[CT_AXIS_TP] > 1 ? " of its tp rank" : "", (long long)(q->shape[1] * c->size));
    c->ulysses_said = 1;
    ct_tensor *qh = heads_out(c, b, q), *kh = qh ? heads_out(c, b, k) : NULL, *vh = kh ? heads_out(c, b, v) : NULL;
    ct_tensor *o = vh ? b->attention(b, qh, kh, vh) : NULL;
    return o ? heads_in(c, b, o) : NULL;
}
