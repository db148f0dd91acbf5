/* whole.c: Muon's orthogonalisation sees the whole matrix. A rank holds a flat shard (FSDP) of a
 * block (tensor parallel) of it: gather the shard group's pieces into the block, the split group's
 * blocks into the whole, run Newton-Schulz on the whole (every rank the same computation on the same
 * values, so the same bits), and keep this rank's part. On one rank the slot is whole and nothing
 * is gathered. */
#include "muon.h"

#include <math.h>

#define D(o) ((o)->d)

/* dst rows of `cols` values at dst_stride from src rows at src_stride (f32 elements). */
static ct_status copy_rows(muon *o, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                           int64_t rows, int64_t cols) {
    if (D(o)->copy_2d) return D(o)->copy_2d(o->dev, dst, dst_stride, src, src_stride, rows, cols);
    for (int64_t r = 0; r < rows; r++) {
        ct_status st = D(o)->copy(o->dev, dst + r * dst_stride, src + r * src_stride, (size_t)cols * sizeof(float),
                                  CT_COPY_D2D);
        if (st) return st;
    }
    return CT_OK;
}

/* The group of `axis`, checking that this rank's place in it is `want` of `parts`. */
static ct_comm_group *axis_group(muon *o, const ct_param_slot *sl, int axis, int want, int parts, const char *what) {
    ct_comm_group *g = NULL;
    if (o->mesh && axis >= 0 && axis < CT_MESH_NAXES) g = o->mesh->group[axis];
    else if (o->mesh && axis == CT_AXIS_DP_SHARD_CP && CT_HAS_FIELD(o->mesh, ct_mesh_info, dp_shard_cp_group))
        g = o->mesh->dp_shard_cp_group; /* ABI 2.3: fsdp's shard under context parallel */
    if (!o->capi || !g) {
        o->host->set_error(o->host, "%s is %s over mesh axis %d, but the host attached no comm for it",
                           sl->param->name, what, axis);
        return NULL;
    }
    int rank, size;
    if (o->capi->group_rank(o->comm, g, &rank, &size) != CT_OK) return NULL;
    if (rank != want || size != parts) {
        o->host->set_error(o->host, "%s is %s as part %d of %d, but this rank is %d of %d in its group",
                           sl->param->name, what, want, parts, rank, size);
        return NULL;
    }
    return g;
}

/* Elements of the block before dim d's index changes (outer) and per block row along d (chunk). */
static void split_geometry(const ct_param_slot *sl, int64_t *outer, int64_t *chunk) {
    const ct_tensor *p = sl->param;
    *outer = 1;
    *chunk = 1;
    for (int i = 0; i < sl->split_dim; i++) *outer *= sl->global_shape[i];
    for (int i = sl->split_dim; i < p->ndim; i++) *chunk *= p->shape[i];
}

static int is_split(const ct_param_slot *sl) { return sl->split_dim >= 0 && sl->split_parts > 1; }
static int is_sharded(const ct_param_slot *sl) { return sl->placement == CT_PLACE_SHARD; }

/* u (local_numel) -> *whole (the global matrix, row-major), in a scratch buffer or u itself. */
static ct_status gather_whole(muon *o, const ct_param_slot *sl, float *u, float **whole) {
    float *block = u; /* numel values: the block this rank computes with */
    if (is_sharded(sl)) {
        int axis = sl->shard_axis, parts = muon_axis_degree(o->mesh, axis);
        int64_t want = sl->local_numel ? sl->offset / sl->local_numel : 0;
        ct_comm_group *g = axis_group(o, sl, axis, (int)want, parts, "sharded");
        if (!g) return CT_ERR_INVALID;
        if (sl->offset != want * sl->local_numel || sl->local_numel * parts < sl->numel) {
            o->host->set_error(o->host, "%s: shard at %lld of %lld values is not rank-ordered", sl->param->name,
                               (long long)sl->offset, (long long)sl->local_numel);
            return CT_ERR_INVALID;
        }
        if (!(block = muon_buf(o, BUF_SHARD, sl->local_numel * parts))) return CT_ERR_NOMEM;
        ct_status st = o->capi->all_gather(o->comm, g, u, block, sl->local_numel, CT_F32, NULL);
        if (st) return st;
    }
    *whole = block;
    if (!is_split(sl)) return CT_OK;
    ct_comm_group *g = axis_group(o, sl, sl->split_axis, sl->split_index, sl->split_parts, "split");
    if (!g) return CT_ERR_INVALID;
    int64_t outer, chunk, parts = sl->split_parts;
    split_geometry(sl, &outer, &chunk);
    float *blocks = muon_buf(o, BUF_SPLIT, sl->numel * parts), *w = muon_buf(o, BUF_Y, sl->numel * parts);
    if (!blocks || !w) return CT_ERR_NOMEM;
    ct_status st = o->capi->all_gather(o->comm, g, block, blocks, sl->numel, CT_F32, NULL);
    /* block r holds, per outer index, the r-th run of `chunk` values of the whole's row */
    for (int64_t r = 0; r < parts && !st; r++)
        st = copy_rows(o, w + r * chunk, parts * chunk, blocks + r * sl->numel, chunk, outer, chunk);
    *whole = w;
    return st;
}

/* u (local_numel) = this rank's part of the whole matrix o_whole. */
static ct_status keep_part(muon *o, const ct_param_slot *sl, const float *o_whole, float *u) {
    const float *block = o_whole;
    ct_status st = CT_OK;
    if (is_split(sl)) {
        int64_t outer, chunk;
        split_geometry(sl, &outer, &chunk);
        float *b = muon_buf(o, BUF_SPLIT, sl->numel);
        if (!b) return CT_ERR_NOMEM;
        st = copy_rows(o, b, chunk, o_whole + sl->split_index * chunk, sl->split_parts * chunk, outer, chunk);
        block = b;
    }
    if (st) return st;
    if (!is_sharded(sl)) return D(o)->copy(o->dev, u, block, (size_t)sl->numel * sizeof(float), CT_COPY_D2D);
    /* [offset, offset + local_numel) of the flat block; past its end, zero padding */
    int64_t n = sl->numel - sl->offset;
    if (n > sl->local_numel) n = sl->local_numel;
    if ((st = D(o)->zero(o->dev, u, (size_t)sl->local_numel * sizeof(float)))) return st;
    if (n <= 0) return CT_OK;
    return D(o)->copy(o->dev, u, block + sl->offset, (size_t)n * sizeof(float), CT_COPY_D2D);
}

/* Newton-Schulz on x (rows, cols), normalised first; *out is x or y, whichever holds the result.
 * Keller Jordan's quintic: A = X X^T, B = b A + c A A, X = a X + B X, on the wide orientation; a tall
 * matrix (rows > cols) runs the same on X^T, written here without transposing:
 * A = X^T X, X = a X + X B (B is symmetric). */
static ct_status newton_schulz(muon *o, float *x, float *y, int64_t rows, int64_t cols, float **out) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    int tall = rows > cols;
    int64_t k = tall ? cols : rows, n = rows * cols;
    float *A = muon_buf(o, BUF_A, k * k), *B = muon_buf(o, BUF_B, k * k);
    if (!A || !B) return CT_ERR_NOMEM;
    double ss;
    ct_status st = D(o)->sum_squares(o->dev, &ss, x, n);
    if (!st) st = D(o)->scale(o->dev, x, (float)(1.0 / (sqrt(ss) + 1e-7)), n);
    for (int64_t it = 0; it < o->ns_steps && !st; it++) {
        if (tall) st = D(o)->matmul(o->dev, A, x, x, k, k, rows, 1, 0, 1.0f, 0.0f); /* A (k,k) = X^T X */
        else st = D(o)->matmul(o->dev, A, x, x, k, k, cols, 0, 1, 1.0f, 0.0f);     /* A (k,k) = X X^T */
        if (!st) st = D(o)->matmul(o->dev, B, A, A, k, k, k, 0, 0, c, 0.0f);       /* B = c A A */
        if (!st) st = D(o)->axpy(o->dev, B, A, b, k * k);                             /* B += b A */
        if (!st) st = D(o)->copy(o->dev, y, x, (size_t)n * sizeof(float), CT_COPY_D2D);
        if (st) break;
        if (tall) st = D(o)->matmul(o->dev, y, x, B, rows, cols, k, 0, 0, 1.0f, a); /* Y = X B + a X */
        else st = D(o)->matmul(o->dev, y, B, x, rows, cols, k, 0, 0, 1.0f, a);      /* Y = B X + a X */
        float *t = x;
        x = y;
        y = t;
    }
    *out = x;
    return st;
}

ct_status muon_orthogonalise(muon *o, const ct_param_slot *sl, float *u) {
    int64_t rows = sl->global_shape[0], cols = sl->global_shape[1], n = rows * cols;
    float *whole, *x = muon_buf(o, BUF_X, n), *y, *result;
    if (!x) return CT_ERR_NOMEM;
    ct_status st = gather_whole(o, sl, u, &whole);
    if (st) return st;
    /* the whole may sit in BUF_Y: copy it to X before Y is grown or overwritten */
    if ((st = D(o)->copy(o->dev, x, whole, (size_t)n * sizeof(float), CT_COPY_D2D))) return st;
    if (!(y = muon_buf(o, BUF_Y, n))) return CT_ERR_NOMEM;
    if ((st = newton_schulz(o, x, y, rows, cols, &result))) return st;
    return keep_part(o, sl, result, u);
}
