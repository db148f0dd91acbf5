/* attention.c: causal attention of this rank's queries against every cp rank's keys, forward and
 * backward, a custom op either way (context_parallel_rotate_method; its third value, ulysses, splits
 * heads instead and is ulysses.c's, reached through cp_attention here):
 *
 *   allgather  K and V all-gathered over cp, put in sequence order, one attention_block_forward of the
 *              local queries against the whole sequence; backward gathers them again, computes the
 *              whole sequence's dK and dV from the local queries and reduce-scatters them back to
 *              their owners.
 *   alltoall   the ring: step 0 attends the rank's own K/V block; step s = 1..cp-1 the block of rank
 *              i - s, received from rank i - 1 while the previous one goes on to i + 1, merged by its
 *              log-sum-exp. Backward passes (K, V) around the ring again and, behind them, each
 *              block's dK/dV sums, each rank adding its queries' share in ring order, so after cp hops
 *              the sum arrives at the block's owner; dQ accumulates locally.
 *
 * Under block-causal attention (the builder's doc_ids, ABI 2.13: the microbatch's (B, T) document ids,
 * the same on every cp rank) the op takes the ids as a fourth input, cuts each rank's rows of them as it
 * cuts the token ids, and every block call is attention_doc_forward/backward with the queries' and the
 * block's rows' documents beside their positions: a document that crosses chunks and ranks keeps its
 * keys wherever they are, and the rest of the op (gathers, the ring, merges) is unchanged.
 *
 * Only local tensors are kept for backward (q, k, v, out, lse: the op's inputs and outputs), so the
 * saved activations fall to 1/cp; gathered and passed blocks live in the builder's scratch for the
 * duration of one callback. Every sum runs in a fixed order: the results are deterministic.
 *
 * The ring overlaps its transfers with attention: each transfer is started before the block's compute,
 * which runs in pieces (per sequence of the batch, per quarter of each query chunk down to 128 rows) with a poke of the
 * transfers in flight between them (MPI progresses only inside its calls). Counted over the run: the
 * time the transfers were in flight (from their start until a poke or the wait first saw them
 * complete) and the time this rank spent in their waits and pokes (an MPI moves the bytes inside
 * those calls); the rest of the time in flight was spent computing. cp.c logs the share at the end
 * (an upper bound over MPI, see there); context_parallel_ring_overlap: false waits for each transfer
 * before the compute, for comparison.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime (ct_util_now) */
#include "cp.h"
#include "ctitan/util.h"

#include <string.h>

#define RING_TAG_KV 1801  /* a K/V block going round */
#define RING_TAG_ACC 1802 /* a block's dK/dV sum going round behind it */
#define PIECES_PER_CHUNK 4 /* query sub-blocks per chunk of a sequence, a poke after each (4 measured a
                             * little better than 2 over MPI; a GPU's comm needs none) ... */
#define PIECE_MIN_ROWS 128 /* ... but none under 128 query rows: below that a call's fixed cost outweighs
                            * the poke (seq 64 at cp 2 ran 30% slower than allgather in 4-row pieces) */

typedef struct {
    cp *c;
} attn_state;

/* The sizes of one call: q (b, tl, h, d), k and v (b, tl, kvh, d); the whole sequence is T = cp tl. */
typedef struct {
    int64_t b, tl, h, kvh, d, ch, T, e, n; /* ch = tl / 2 rows per chunk; e = kvh d; n = b tl e */
    const int32_t *docs; /* block-causal: the whole sequences' document ids (b, T); NULL: causal */
    int32_t *rdocs;      /* ... and every rank's rows of them, rank-major (cp, b, tl) (scratch) */
} dims;

static dims dims_of(const cp *c, const ct_tensor *q, const ct_tensor *k) {
    dims z = {q->shape[0], q->shape[1], q->shape[2], k->shape[2], q->shape[3], 0, 0, 0, 0, NULL, NULL};
    z.ch = z.tl / 2;
    z.T = z.tl * c->size;
    z.e = z.kvh * z.d;
    z.n = z.b * z.tl * z.e;
    return z;
}

static const char *trace_name(int backward) { return backward ? "cp_comm_bwd" : "cp_comm_fwd"; }

/* ---- communication, timed and reported as the cp axis's ---- */

/* A blocking all-gather ('g') or reduce-scatter ('s') over cp. */
static int collective(cp *c, ct_builder *b, int backward, char kind, const float *send, float *recv, int64_t count) {
    const ct_comm_api *k = c->env.capi;
    c->host->trace_begin(c->host, trace_name(backward));
    double t0 = ct_util_now();
    ct_status st = kind == 'g' ? k->all_gather(c->env.comm, c->group, send, recv, count, CT_F32, NULL)
                               : k->reduce_scatter(c->env.comm, c->group, send, recv, count, CT_F32, CT_REDUCE_SUM, NULL);
    b->account_comm(b, CT_AXIS_CP, ct_util_now() - t0);
    c->host->trace_end(c->host, trace_name(backward));
    return cp_failed(c, st, kind == 'g' ? "all-gather of K and V over cp" : "reduce-scatter of dK and dV over cp");
}

/* A ring transfer: a send to the next rank and a receive from the previous one, started together. */
typedef struct {
    ct_comm_request *send, *recv;
    double posted, blocked;
    double done_at[2]; /* when the receive [0] and the send [1] were first seen complete; 0: not yet */
} transfer;

static int transfer_start(cp *c, transfer *t, const float *send, float *recv, int64_t count, int tag) {
    const ct_comm_api *k = c->env.capi;
    int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    memset(t, 0, sizeof *t);
    t->posted = ct_util_now();
    if (cp_failed(c, k->recv(c->env.comm, c->group, recv, count, CT_F32, left, tag, &t->recv), "ring receive"))
        return -1;
    return cp_failed(c, k->send(c->env.comm, c->group, send, count, CT_F32, right, tag, &t->send), "ring send");
}

/* Completes one side of a transfer, the time blocked counted for the cp axis and the ring. */
static int transfer_wait_one(cp *c, ct_builder *b, int backward, transfer *t, ct_comm_request **req, int side) {
    if (!*req) return 0;
    c->host->trace_begin(c->host, trace_name(backward));
    double t0 = ct_util_now();
    ct_status st = c->env.capi->wait(c->env.comm, *req);
    double dt = ct_util_now() - t0;
    *req = NULL;
    if (t->done_at[side] == 0) t->done_at[side] = t0 + dt;
    b->account_comm(b, CT_AXIS_CP, dt);
    c->host->trace_end(c->host, trace_name(backward));
    t->blocked += dt;
    return cp_failed(c, st, "ring transfer");
}

/* Completes a transfer (both sides; both are waited for even when one fails) and counts it: in flight
 * from its start until both sides were first seen complete (by a poke or the wait). */
static int transfer_wait(cp *c, ct_builder *b, int backward, transfer *t) {
    if (!t->send && !t->recv) return 0;
    int bad = transfer_wait_one(c, b, backward, t, &t->recv, 0);
    bad |= transfer_wait_one(c, b, backward, t, &t->send, 1);
    double done = t->done_at[0] > t->done_at[1] ? t->done_at[0] : t->done_at[1];
    c->ring_inflight_s += done > t->posted ? done - t->posted : 0;
    c->ring_blocked_s += t->blocked;
    c->ring_transfers++;
    return bad ? -1 : 0;
}

/* Lets the transfers in flight move while this rank computes. */
static void poke(cp *c, ct_builder *b, transfer *const *ts, int n) {
    const ct_comm_api *k = c->env.capi;
    if (!CT_HAS_FIELD(k, ct_comm_api, test) || !k->test) return;
    double t0 = ct_util_now();
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        ct_comm_request *r[2] = {ts[i]->recv, ts[i]->send};
        for (int j = 0; j < 2; j++) {
            int done = 0;
            if (!r[j] || ts[i]->done_at[j] != 0) continue;
            k->test(c->env.comm, r[j], &done); /* an error here resurfaces at the wait */
            if (done) ts[i]->done_at[j] = ct_util_now();
        }
    }
    double dt = ct_util_now() - t0; /* MPI copies the bytes inside these calls: not hidden, whatever else is */
    b->account_comm(b, CT_AXIS_CP, dt);
    c->ring_blocked_s += dt;
}

/* ---- small moves ---- */

/* dst (rows, cols) at stride dst_stride <- src at stride src_stride (f32). */
static int copy_rows(cp *c, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                     int64_t cols) {
    const ct_device_api *d = c->env.dapi;
    if (CT_HAS_FIELD(d, ct_device_api, copy_2d) && d->copy_2d)
        return cp_failed(c, d->copy_2d(c->env.dev, dst, dst_stride, src, src_stride, rows, cols), "copy_2d");
    for (int64_t r = 0; r < rows; r++)
        if (cp_failed(c, d->copy(c->env.dev, dst + r * dst_stride, src + r * src_stride, sizeof(float) * (size_t)cols,
                                 CT_COPY_D2D), "copy"))
            return -1;
    return 0;
}

/* kv (2n) = [k | v]: the block this rank sends. */
static int pack_kv(cp *c, float *kv, const ct_tensor *k, const ct_tensor *v, int64_t n) {
    const ct_device_api *d = c->env.dapi;
    size_t bytes = sizeof(float) * (size_t)n;
    return cp_failed(c, d->copy(c->env.dev, kv, k->data, bytes, CT_COPY_D2D), "copy") ||
           cp_failed(c, d->copy(c->env.dev, kv + n, v->data, bytes, CT_COPY_D2D), "copy");
}

/* Block-causal: z->rdocs, every rank's rows of the document ids, cut as the token ids are (device
 * copies, so a captured graph replays them). 0 when causal or done, -1 with the error set. */
static int rank_docs(cp *c, ct_builder *b, dims *z, ct_tensor *const *in, int n_in) {
    if (n_in < 4 || !in[3]) return 0;
    z->docs = in[3]->data;
    z->rdocs = b->scratch(b, sizeof(int32_t) * (size_t)(c->size * z->b * z->tl));
    if (!z->rdocs) return -1;
    for (int r = 0; r < c->size; r++)
        if (cp_chunks_to_local(c, z->rdocs + (int64_t)r * z->b * z->tl, z->docs, r, z->b, z->tl, 1, sizeof(int32_t)))
            return -1;
    return 0;
}

/* Rank r's rows' document ids for sequence s of the batch (tl entries). */
static const int32_t *docs_of(const dims *z, int r, int64_t s) { return z->rdocs + ((int64_t)r * z->b + s) * z->tl; }

/* ---- allgather ---- */

/* K and V (b, T, kvh, d) each, in sequence order, from every rank's block: kv (2n) and all (cp 2n)
 * are scratch. */
static int gather_kv(cp *c, ct_builder *b, int backward, const dims *z, const ct_tensor *k, const ct_tensor *v,
                     float *kv, float *all, float *K, float *V) {
    if (pack_kv(c, kv, k, v, z->n) || collective(c, b, backward, 'g', kv, all, 2 * z->n)) return -1;
    for (int r = 0; r < c->size; r++) {
        const float *blk = all + (int64_t)r * 2 * z->n;
        if (cp_chunks_to_global(c, K, blk, r, z->b, z->tl, z->e, sizeof(float)) ||
            cp_chunks_to_global(c, V, blk + z->n, r, z->b, z->tl, z->e, sizeof(float)))
            return -1;
    }
    return 0;
}

static ct_status ag_fwd(ct_builder *b, cp *c, const dims *z, ct_tensor *const *in, ct_tensor **out) {
    const ct_tensor *q = in[0], *k = in[1], *v = in[2];
    const int32_t *pos = cp_positions_for(c, z->tl);
    float *kv = b->scratch(b, sizeof(float) * (size_t)(2 * z->n));
    float *all = b->scratch(b, sizeof(float) * (size_t)(2 * z->n * c->size));
    float *K = b->scratch(b, sizeof(float) * (size_t)(2 * z->n * c->size)), *V = K ? K + z->n * c->size : NULL;
    if (!pos || !kv || !all || !K) return CT_ERR_NOMEM;
    if (gather_kv(c, b, 0, z, k, v, kv, all, K, V)) return CT_ERR_INTERNAL;
    if (z->docs) { /* one sequence at a time: its queries' and the whole sequence's documents */
        int64_t qn = z->tl * z->h * z->d, kn = z->T * z->e;
        for (int64_t s = 0; s < z->b; s++) {
            float *o = (float *)out[0]->data + s * qn, *l = (float *)out[1]->data + s * z->h * z->tl;
            ct_status st = c->env.dapi->attention_doc_forward(
                c->env.dev, o, l, (const float *)q->data + s * qn, K + s * kn, V + s * kn, pos + c->rank * z->tl,
                pos + c->size * z->tl, docs_of(z, c->rank, s), z->docs + s * z->T, 1, z->tl, z->T, z->h, z->kvh, z->d);
            if (cp_failed(c, st, "attention_doc_forward")) return st;
        }
        return CT_OK;
    }
    ct_status st = c->env.dapi->attention_block_forward(c->env.dev, out[0]->data, out[1]->data, q->data, K, V,
                                                        pos + c->rank * z->tl, pos + c->size * z->tl, z->b, z->tl, z->T,
                                                        z->h, z->kvh, z->d);
    return cp_failed(c, st, "attention_block_forward") ? st : CT_OK;
}

static ct_status ag_bwd(ct_builder *b, cp *c, const dims *z, ct_tensor *const *in, ct_tensor *const *out,
                        const float *dout) {
    ct_tensor *q = in[0], *k = in[1], *v = in[2];
    const ct_device_api *d = c->env.dapi;
    int64_t whole = z->n * c->size; /* one of K, V, dK, dV: (b, T, kvh, d) */
    const int32_t *pos = cp_positions_for(c, z->tl);
    float *kv = b->scratch(b, sizeof(float) * (size_t)(2 * z->n));
    float *all = b->scratch(b, sizeof(float) * (size_t)(2 * whole));
    float *K = b->scratch(b, sizeof(float) * (size_t)(4 * whole)), *V = K ? K + whole : NULL;
    float *dK = K ? K + 2 * whole : NULL, *dV = K ? K + 3 * whole : NULL;
    float *dq = b->grad(b, q), *dk = b->grad(b, k), *dv = b->grad(b, v);
    if (!pos || !kv || !all || !K || !dq || !dk || !dv) return CT_ERR_NOMEM;
    if (gather_kv(c, b, 1, z, k, v, kv, all, K, V) ||
        cp_failed(c, d->zero(c->env.dev, dK, sizeof(float) * (size_t)(2 * whole)), "zero"))
        return CT_ERR_INTERNAL;
    if (z->docs) {
        int64_t qn = z->tl * z->h * z->d, kn = z->T * z->e;
        for (int64_t s = 0; s < z->b; s++)
            if (cp_failed(c, d->attention_doc_backward(c->env.dev, dq + s * qn, dK + s * kn, dV + s * kn, dout + s * qn,
                                                       (const float *)q->data + s * qn, K + s * kn, V + s * kn,
                                                       (const float *)out[0]->data + s * qn,
                                                       (const float *)out[1]->data + s * z->h * z->tl,
                                                       pos + c->rank * z->tl, pos + c->size * z->tl,
                                                       docs_of(z, c->rank, s), z->docs + s * z->T, 1, z->tl, z->T, z->h,
                                                       z->kvh, z->d), "attention_doc_backward"))
                return CT_ERR_INTERNAL;
    } else if (cp_failed(c, d->attention_block_backward(c->env.dev, dq, dK, dV, dout, q->data, K, V, out[0]->data,
                                                        out[1]->data, pos + c->rank * z->tl, pos + c->size * z->tl, z->b,
                                                        z->tl, z->T, z->h, z->kvh, z->d), "attention_block_backward"))
        return CT_ERR_INTERNAL;
    for (int r = 0; r < c->size; r++) { /* rank r's rows of dK and dV, rank-major for the reduce-scatter */
        float *blk = all + (int64_t)r * 2 * z->n;
        if (cp_chunks_to_local(c, blk, dK, r, z->b, z->tl, z->e, sizeof(float)) ||
            cp_chunks_to_local(c, blk + z->n, dV, r, z->b, z->tl, z->e, sizeof(float)))
            return CT_ERR_INTERNAL;
    }
    if (collective(c, b, 1, 's', all, kv, 2 * z->n) || cp_failed(c, d->axpy(c->env.dev, dk, kv, 1.0f, z->n), "axpy") ||
        cp_failed(c, d->axpy(c->env.dev, dv, kv + z->n, 1.0f, z->n), "axpy"))
        return CT_ERR_INTERNAL;
    return CT_OK;
}

/* ---- the ring ---- */

/* One query piece: rows [a, a + tq) of sequence s. */
typedef struct {
    int64_t s, a, tq;
} piece;

static int64_t pieces_per_chunk(const dims *z) {
    int64_t n = z->ch / PIECE_MIN_ROWS;
    return n < 1 ? 1 : n > PIECES_PER_CHUNK ? PIECES_PER_CHUNK : n;
}

static int n_pieces(const dims *z) { return (int)(z->b * 2 * pieces_per_chunk(z)); }

static piece piece_at(const dims *z, int i) {
    int64_t pc = pieces_per_chunk(z), per = 2 * pc, s = i / per, j = i % per, h = j / pc, p = j % pc;
    int64_t a = z->ch * p / pc, e = z->ch * (p + 1) / pc;
    return (piece){s, h * z->ch + a, e - a};
}

/* The local queries against one K/V block (kb, vb: (b, tl, kvh, d), at positions kpos) into o
 * (b, tl, h, d) and lse (b, h, tl), piece by piece, the transfers in flight poked between pieces.
 * plse (h, tl / 2) is scratch for a piece's lse. */
static int block_forward(cp *c, ct_builder *b, const dims *z, float *o, float *lse, float *plse, const float *q,
                         const float *kb, const float *vb, const int32_t *qpos, const int32_t *kpos, int src,
                         transfer *const *ts, int nts) {
    const ct_device_api *d = c->env.dapi;
    for (int i = 0; i < n_pieces(z); i++) {
        piece p = piece_at(z, i);
        if (p.tq <= 0) continue;
        int64_t qo = (p.s * z->tl + p.a) * z->h * z->d, ko = p.s * z->tl * z->e;
        ct_status st = z->docs ? d->attention_doc_forward(c->env.dev, o + qo, plse, q + qo, kb + ko, vb + ko, qpos + p.a,
                                                          kpos, docs_of(z, c->rank, p.s) + p.a, docs_of(z, src, p.s), 1,
                                                          p.tq, z->tl, z->h, z->kvh, z->d)
                               : d->attention_block_forward(c->env.dev, o + qo, plse, q + qo, kb + ko, vb + ko,
                                                            qpos + p.a, kpos, 1, p.tq, z->tl, z->h, z->kvh, z->d);
        if (cp_failed(c, st, "attention_block_forward") ||
            copy_rows(c, lse + p.s * z->h * z->tl + p.a, z->tl, plse, p.tq, z->h, p.tq))
            return -1;
        poke(c, b, ts, nts);
    }
    return 0;
}

/* One block's backward: dq (b, tl, h, d) and the block's dkb, dvb += the local queries' share. */
static int block_backward(cp *c, ct_builder *b, const dims *z, float *dq, float *dkb, float *dvb, const float *dout,
                          const float *q, const float *kb, const float *vb, const float *o, const float *lse,
                          float *plse, const int32_t *qpos, const int32_t *kpos, int src, transfer *const *ts,
                          int nts) {
    const ct_device_api *d = c->env.dapi;
    for (int i = 0; i < n_pieces(z); i++) {
        piece p = piece_at(z, i);
        if (p.tq <= 0) continue;
        int64_t qo = (p.s * z->tl + p.a) * z->h * z->d, ko = p.s * z->tl * z->e;
        if (copy_rows(c, plse, p.tq, lse + p.s * z->h * z->tl + p.a, z->tl, z->h, p.tq))
            return -1;
        ct_status st =
            z->docs ? d->attention_doc_backward(c->env.dev, dq + qo, dkb + ko, dvb + ko, dout + qo, q + qo, kb + ko,
                                                vb + ko, o + qo, plse, qpos + p.a, kpos,
                                                docs_of(z, c->rank, p.s) + p.a, docs_of(z, src, p.s), 1, p.tq, z->tl,
                                                z->h, z->kvh, z->d)
                    : d->attention_block_backward(c->env.dev, dq + qo, dkb + ko, dvb + ko, dout + qo, q + qo, kb + ko,
                                                  vb + ko, o + qo, plse, qpos + p.a, kpos, 1, p.tq, z->tl, z->h, z->kvh,
                                                  z->d);
        if (cp_failed(c, st, "attention_block_backward"))
            return -1;
        poke(c, b, ts, nts);
    }
    return 0;
}

static ct_status ring_fwd(ct_builder *b, cp *c, const dims *z, ct_tensor *const *in, ct_tensor **out) {
    const ct_tensor *q = in[0], *k = in[1], *v = in[2];
    const ct_device_api *d = c->env.dapi;
    const int32_t *pos = cp_positions_for(c, z->tl);
    int64_t nq = z->b * z->tl * z->h * z->d, nl = z->b * z->h * z->tl;
    float *kv[2] = {b->scratch(b, sizeof(float) * (size_t)(2 * z->n)), b->scratch(b, sizeof(float) * (size_t)(2 * z->n))};
    float *o2 = b->scratch(b, sizeof(float) * (size_t)nq), *lse2 = b->scratch(b, sizeof(float) * (size_t)nl);
    float *plse = b->scratch(b, sizeof(float) * (size_t)(z->h * z->ch));
    float *o = out[0]->data, *lse = out[1]->data;
    if (!pos || !kv[0] || !kv[1] || !o2 || !lse2 || !plse) return CT_ERR_NOMEM;
    if (pack_kv(c, kv[0], k, v, z->n)) return CT_ERR_INTERNAL;
    transfer t = {0};
    transfer *inflight = &t;
    int bad = 0;
    for (int s = 0; s < c->size && !bad; s++) {
        int src = (c->rank - s + c->size) % c->size; /* whose block this step attends */
        float *cur = kv[s % 2];
        if (s + 1 < c->size) {
            bad = transfer_start(c, &t, cur, kv[(s + 1) % 2], 2 * z->n, RING_TAG_KV);
            if (!bad && !c->ring_overlap) bad = transfer_wait(c, b, 0, &t);
        }
        bad = bad || block_forward(c, b, z, s ? o2 : o, s ? lse2 : lse, plse, q->data, cur, cur + z->n,
                                   pos + c->rank * z->tl, pos + src * z->tl, src, &inflight, 1);
        bad = bad || (s > 0 && cp_failed(c, d->attention_merge(c->env.dev, o, lse, o2, lse2, z->b, z->tl, z->h, z->d),
                                         "attention_merge"));
        bad |= transfer_wait(c, b, 0, &t); /* also on failure: nothing may stay in flight */
    }
    return bad ? CT_ERR_INTERNAL : CT_OK;
}

/* Backward step s on rank i handles the block of rank i - s: its K/V arrived with step s's transfer
 * and its dK/dV sum so far (ranks i - s .. i - 1) with the previous step's; this rank adds its share
 * and sends the sum on. After step cp - 1 the sum is sent to the block's owner, rank i + 1, which
 * receives its own from rank i - 1. */
static ct_status ring_bwd(ct_builder *b, cp *c, const dims *z, ct_tensor *const *in, ct_tensor *const *out,
                          const float *dout) {
    ct_tensor *q = in[0], *k = in[1], *v = in[2];
    const ct_device_api *d = c->env.dapi;
    const int32_t *pos = cp_positions_for(c, z->tl);
    size_t blk = sizeof(float) * (size_t)(2 * z->n);
    float *kv[2] = {b->scratch(b, blk), b->scratch(b, blk)}, *acc[2] = {b->scratch(b, blk), b->scratch(b, blk)};
    float *got[2] = {b->scratch(b, blk), b->scratch(b, blk)};
    float *plse = b->scratch(b, sizeof(float) * (size_t)(z->h * z->ch));
    float *dq = b->grad(b, q), *dk = b->grad(b, k), *dv = b->grad(b, v);
    if (!pos || !kv[0] || !kv[1] || !acc[0] || !acc[1] || !got[0] || !got[1] || !plse || !dq || !dk || !dv)
        return CT_ERR_NOMEM;
    if (pack_kv(c, kv[0], k, v, z->n)) return CT_ERR_INTERNAL;
    transfer tkv = {0}, tacc = {0};
    transfer *inflight[2] = {&tkv, &tacc};
    int bad = 0;
    for (int s = 0; s < c->size && !bad; s++) {
        int src = (c->rank - s + c->size) % c->size;
        float *cur = kv[s % 2], *sum = acc[s % 2];
        if (s + 1 < c->size) {
            bad = transfer_start(c, &tkv, cur, kv[(s + 1) % 2], 2 * z->n, RING_TAG_KV);
            if (!bad && !c->ring_overlap) bad = transfer_wait(c, b, 1, &tkv);
        }
        if (!bad && !c->ring_overlap) bad = transfer_wait(c, b, 1, &tacc);
        bad = bad || cp_failed(c, d->zero(c->env.dev, sum, blk), "zero");
        bad = bad || block_backward(c, b, z, dq, sum, sum + z->n, dout, q->data, cur, cur + z->n, out[0]->data,
                                    out[1]->data, plse, pos + c->rank * z->tl, pos + src * z->tl, src, inflight, 2);
        /* the sum so far arrived with the previous step's transfer (which also sent that step's sum on) */
        if (s > 0) bad |= transfer_wait(c, b, 1, &tacc);
        bad = bad || (s > 0 && cp_failed(c, d->axpy(c->env.dev, sum, got[s % 2], 1.0f, 2 * z->n), "axpy"));
        bad = bad || transfer_start(c, &tacc, sum, got[(s + 1) % 2], 2 * z->n, RING_TAG_ACC);
        bad |= transfer_wait(c, b, 1, &tkv);
    }
    bad |= transfer_wait(c, b, 1, &tacc); /* this rank's own block's sum, complete */
    if (bad) return CT_ERR_INTERNAL;
    const float *mine = got[c->size % 2];
    if (cp_failed(c, d->axpy(c->env.dev, dk, mine, 1.0f, z->n), "axpy") ||
        cp_failed(c, d->axpy(c->env.dev, dv, mine + z->n, 1.0f, z->n), "axpy"))
        return CT_ERR_INTERNAL;
    return CT_OK;
}

/* ---- the op ---- */

static ct_status attn_outputs(ct_builder *b, const ct_tensor *q, ct_tensor **out) {
    int64_t lse_shape[3] = {q->shape[0], q->shape[2], q->shape[1]};
    out[0] = b->new_tensor(b, CT_F32, 4, q->shape);
    out[1] = b->new_tensor(b, CT_F32, 3, lse_shape);
    return out[0] && out[1] ? CT_OK : CT_ERR_NOMEM;
}

static ct_status attn_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    cp *c = ((attn_state *)sp)->c;
    (void)n_out;
    dims z = dims_of(c, in[0], in[1]);
    ct_status st = attn_outputs(b, in[0], out);
    if (st != CT_OK) return st;
    if (rank_docs(c, b, &z, in, n_in)) return CT_ERR_NOMEM;
    return c->ring ? ring_fwd(b, c, &z, in, out) : ag_fwd(b, c, &z, in, out);
}

static ct_status attn_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                          const float *const *dy, int n_out, int halves) {
    cp *c = ((attn_state *)sp)->c;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK; /* lse's gradient never flows */
    dims z = dims_of(c, in[0], in[1]);
    if (rank_docs(c, b, &z, in, n_in)) return CT_ERR_NOMEM;
    return c->ring ? ring_bwd(b, c, &z, in, out, dy[0]) : ag_bwd(b, c, &z, in, out, dy[0]);
}

/* The planner's forward: (out, lse) as attn_fwd makes them, the larger of forward's and backward's
 * scratch reserved (the planner counts the builder's scratch), the attention FLOPs of the causal
 * pairs this rank computes (ct_op_cost.attention_flops) and the transfers over cp. Load-balanced, every rank has the same pairs: chunks
 * i and 2cp-1-i see c^2 (2cp - 1) + c (c + 1) keys in all (c rows per chunk). Counted as the host
 * counts its attention: QK^T and PV forward, 2.5 times that backward (the scores are recomputed). */
static ct_status attn_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                           ct_op_cost *cost) {
    cp *c = ((attn_state *)sp)->c;
    (void)n_in;
    (void)n_out;
    dims z = dims_of(c, in[0], in[1]);
    ct_status st = attn_outputs(b, in[0], out);
    if (st != CT_OK) return st;
    double n = (double)z.n, cpn = (double)c->size, nq = (double)(z.b * z.tl * z.h * z.d), F = sizeof(float);
    double ring_fwd = 4 * n + nq + (double)(z.b * z.h * z.tl), ring_bwd = 12 * n;
    double scratch = c->ring ? (ring_fwd > ring_bwd ? ring_fwd : ring_bwd) + (double)(z.h * z.ch)
                             : 2 * n + 6 * n * cpn; /* allgather: the backward's, the larger */
    if (!b->scratch(b, (size_t)(scratch * F))) return CT_ERR_NOMEM;
    double ch = (double)z.ch, pairs = ch * ch * (2 * cpn - 1) + ch * (ch + 1);
    double fwd = 4.0 * (double)(z.b * z.h * z.d) * pairs;
    double *flops = CT_HAS_FIELD(cost, ct_op_cost, attention_flops) ? cost->attention_flops : cost->matmul_flops;
    flops[0] = fwd; /* attention, timed at the attention rate (a 2.2 host: as GEMMs) */
    flops[1] = 2.5 * fwd;
    cost->matmul_dtype = c->env.bf16_compute ? CT_BF16 : CT_F32;
    double keys = c->ring ? 2 * n * cpn : 2 * n * cpn * 2; /* every block read, or gathered and reordered too */
    cost->bytes[0] = F * (2 * nq + keys + (double)(z.b * z.h * z.tl));
    cost->bytes[1] = 2 * cost->bytes[0];
    int ring_calls = c->size - 1;
    if (c->ring) {
        cp_plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_FORWARD, c->ring_overlap, 2 * n * cpn, ring_calls);
        cp_plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_BACKWARD, c->ring_overlap, 2 * n * cpn, ring_calls);
        cp_plan_comm(cost, CT_COLL_REDUCE_SCATTER, CT_PHASE_BACKWARD, c->ring_overlap, 2 * n * cpn, c->size);
    } else {
        cp_plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_FORWARD, 0, 2 * n * cpn, 1);
        cp_plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_BACKWARD, 0, 2 * n * cpn, 1);
        cp_plan_comm(cost, CT_COLL_REDUCE_SCATTER, CT_PHASE_BACKWARD, 0, 2 * n * cpn, 1);
    }
    return CT_OK;
}

static const ct_custom_op ring_op = {sizeof(ct_custom_op), "cp.ring_attention", attn_fwd, attn_bwd, attn_plan};
static const ct_custom_op gather_op = {sizeof(ct_custom_op), "cp.allgather_attention", attn_fwd, attn_bwd, attn_plan};

ct_tensor *cp_attention(cp *c, ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v) {
    const int64_t *qs = q ? q->shape : NULL, *ks = k ? k->shape : NULL;
    if (!q || !k || !v || q->dtype != CT_F32 || k->dtype != CT_F32 || v->dtype != CT_F32 || q->ndim != 4 ||
        k->ndim != 4 || v->ndim != 4 || ks[0] != qs[0] || ks[1] != qs[1] || ks[3] != qs[3] ||
        memcmp(k->shape, v->shape, sizeof(int64_t) * 4) || qs[2] % ks[2] || qs[1] % 2) {
        c->host->set_error(c->host, "attention: expects q (B,T,H,D), k and v (B,T,KVH,D) with H a multiple of KVH "
                                    "(context parallel: T this rank's rows, an even count)");
        return NULL;
    }
    if (c->ulysses) return cp_ulysses_attention(c, b, q, k, v); /* the next builder's attention sees the ids */
    /* block-causal (ABI 2.13): the microbatch's document ids, kept with the op for its backward */
    ct_tensor *docs = CT_HAS_FIELD(b, ct_builder, doc_ids) && b->doc_ids ? (ct_tensor *)b->doc_ids(b) : NULL;
    const ct_device_api *d = c->env.dapi;
    if (docs && (docs->ndim != 2 || docs->shape[0] != qs[0] || docs->shape[1] != qs[1] * c->size)) {
        c->host->set_error(c->host, "attention: the document ids are not (B, T) = (%lld, %lld)", (long long)qs[0],
                           (long long)(qs[1] * c->size));
        return NULL;
    }
    if (docs && (!CT_HAS_FIELD(d, ct_device_api, attention_doc_backward) || !d->attention_doc_forward ||
                 !d->attention_doc_backward)) {
        c->host->set_error(c->host, "context parallel: block-causal attention needs the device's "
                                    "attention_doc_forward/backward (ABI 2.13)");
        return NULL;
    }
    attn_state s = {c};
    ct_tensor *in[4] = {q, k, v, docs}, *out[2] = {NULL, NULL};
    return b->custom(b, c->ring ? &ring_op : &gather_op, &s, sizeof s, in, docs ? 4 : 3, out, 2) == CT_OK ? out[0]
                                                                                                           : NULL;
}
