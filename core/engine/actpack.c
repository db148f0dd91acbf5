/* actpack.c: under bf16 compute, what a unit keeps from its forward for its backward is held in
 * bf16 in between, as an autocast run holds it.
 *
 * Units run forward in order and backward in reverse (no pipeline), so the saved arena is a stack
 * and unit u's forward is its top region when the forward ends. runtime_pack_unit compacts that
 * region in place: every tensor the unit's tape, its per-op checkpoint chain or its output holds
 * is kept (f32 activations as bf16; saved statistics, ids and anything shared as they are) and the
 * rest (temporaries nothing reads again) is dropped, in address order toward the region's start.
 * The output then gets a fresh f32 copy (the "handoff", from its bf16 value, so the next unit
 * computes from what backward will see) above the packed region; the next unit's own compaction
 * drops that copy again. runtime_unpack_unit, when the unit's backward starts (everything above
 * it given back), re-extends the region and expands every tensor to the address it had, in reverse
 * order, so the tape's descriptors are valid unchanged; the unit's input, the previous unit's
 * handoff, is expanded last from that unit's packed output.
 *
 * Moves overlap (a packed tensor lands at or below where it was): each goes in pieces through a
 * small bounce buffer so a piece never overwrites bytes not yet read (compaction runs first to
 * last, expansion last to first).
 *
 * Where nothing may move -- a custom op whose forward made activations it did not return (its
 * state may point at them), a pipeline schedule that splits backward (a unit's input half would
 * expand it under a later unit's weight half) -- the same tensors are rounded to bf16 where they
 * are: no memory is saved there, but every layout computes with the same values, so a layout's
 * bf16 run follows one rank's.
 */
#include "host/host.h"
#include "engine/runtime.h"
#include "engine/tape.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PACK_PIECE ((size_t)16 << 20) /* bytes of f32 moved per bounce */

typedef struct pack_item {
    char *orig, *packed;
    size_t bytes; /* at orig */
    int bf16;     /* held as bf16 (bytes / 2 at packed); else copied as it is */
    int aux;      /* (while collecting) read as something other than a plain f32 activation */
    int chunk;    /* (while collecting) the pool chunk of orig */
} pack_item;

struct rt_pack {
    pack_item *items;
    int n;
    pool_mark lo, top;         /* the region compacted and the arena's top before */
    rt_tensor *out;            /* the unit's output: at its handoff while packed */
    char *out_orig, *out_packed;
    int out_bf16;
    pool_mark handoff_at, after_handoff; /* the output's f32 copy for the next unit */
    char *in_handoff;          /* the unit's input, the previous unit's handoff: expanded last */
    char *blob;                /* offloaded (offload.c): the device memory the items are packed into */
    int packed;
};

struct rt_pack *runtime_pack_new(int n_units) {
    struct rt_pack *p = calloc((size_t)(n_units > 0 ? n_units : 1), sizeof *p);
    if (!p) ct_set_error("out of memory");
    return p;
}

void runtime_pack_clear(struct rt_pack *p, int n_units) {
    if (p) memset(p, 0, sizeof *p * (size_t)n_units);
}

/* The chunk of p holding a, or -1. */
static int chunk_of(const pool *p, const char *a) {
    for (int i = 0; i < p->n_chunks; i++)
        if ((uintptr_t)a >= (uintptr_t)p->chunks[i].base && (uintptr_t)a < (uintptr_t)p->chunks[i].base + p->chunks[i].cap)
            return i;
    return -1;
}

typedef struct collect {
    const pool *p;
    pool_mark from, to; /* the unit's own region */
    pack_item *v;
    int n, cap, bad;
} collect;

static void collect_one(void *ctx, rt_tensor *t, int aux) {
    collect *c = ctx;
    rt_tensor *o = t->base ? t->base : t;
    char *a = o->t.data;
    if (!a || c->bad) return;
    int k = chunk_of(c->p, a);
    if (k < 0) return; /* a parameter, a gathered weight, a table: not the arena's */
    size_t off = (size_t)(a - c->p->chunks[k].base);
    if (k < c->from.cur || (k == c->from.cur && off < c->from.top)) return; /* below the unit */
    if (k > c->to.cur || (k == c->to.cur && off >= c->to.top)) return;     /* above (none should be) */
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        pack_item *v = realloc(c->v, sizeof *v * (size_t)cap);
        if (!v) {
            c->bad = 1;
            return;
        }
        c->v = v;
        c->cap = cap;
    }
    size_t bytes = (size_t)ct_tensor_numel(&o->t) * ct_dtype_size(o->t.dtype);
    c->v[c->n++] = (pack_item){a, NULL, bytes, 0, aux || o->t.dtype != CT_F32, k};
}

static int item_cmp(const void *x, const void *y) {
    const pack_item *a = x, *b = y;
    if (a->chunk != b->chunk) return a->chunk < b->chunk ? -1 : 1;
    if (a->orig != b->orig) return (uintptr_t)a->orig < (uintptr_t)b->orig ? -1 : 1;
    return a->bytes < b->bytes ? -1 : a->bytes > b->bytes;
}

/* Sorted by address; overlapping ranges become one item, kept as it is unless it is one plain f32
 * activation seen only as such. */
static int merge(collect *c) {
    qsort(c->v, (size_t)c->n, sizeof *c->v, item_cmp);
    int m = 0;
    for (int i = 0; i < c->n; i++) {
        pack_item *it = &c->v[i];
        if (m && c->v[m - 1].chunk == it->chunk && it->orig < c->v[m - 1].orig + c->v[m - 1].bytes) {
            pack_item *last = &c->v[m - 1];
            if (it->orig != last->orig || it->bytes != last->bytes) last->aux = 1; /* partial: as it is */
            last->aux |= it->aux;
            if (it->orig + it->bytes > last->orig + last->bytes) last->bytes = (size_t)(it->orig + it->bytes - last->orig);
            continue;
        }
        c->v[m++] = *it;
    }
    c->n = m;
    for (int i = 0; i < m; i++) c->v[i].bf16 = !c->v[i].aux && c->v[i].bytes % 4 == 0;
    return m;
}

/* Moves `bytes` f32 (to_bf16: into bf16, half the bytes) or raw bytes from src down to dst <= src,
 * or (expand) from packed src up to dst >= src, in pieces through a bounce buffer when they
 * overlap. CT_OK, or the device's status (CT_ERR_NOMEM for the bounce buffer, its error set). */
static ct_status move(runtime *rt, char *dst, char *src, size_t bytes, int bf16, int expand) {
    const ct_device_api *d = rt->d;
    if (!bytes || (dst == src && !bf16)) return CT_OK;
    size_t out_bytes = bf16 ? (expand ? bytes : bytes / 2) : bytes, in_bytes = bf16 ? (expand ? bytes / 2 : bytes) : bytes;
    int overlap = (uintptr_t)dst < (uintptr_t)src + in_bytes && (uintptr_t)src < (uintptr_t)dst + out_bytes;
    if (!overlap) {
        if (rt->planning) return CT_OK;
        return !bf16   ? d->copy(rt->dev, dst, src, bytes, CT_COPY_D2D)
               : expand ? d->cast_bf16_to_f32(rt->dev, (float *)dst, (const uint16_t *)src, (int64_t)(bytes / 4))
                        : d->cast_f32_to_bf16(rt->dev, (uint16_t *)dst, (const float *)src, (int64_t)(bytes / 4));
    }
    /* pieces of `piece` f32 bytes (raw: bytes), first to last when compacting, last to first when
     * expanding; a piece's write never reaches a byte of a piece not yet read */
    size_t f32_bytes = bytes, piece = bytes < PACK_PIECE ? bytes : PACK_PIECE;
    pool_mark m = pool_get_mark(&rt->opscratch);
    char *bounce = pool_alloc(&rt->opscratch, piece);
    if (!bounce) return CT_ERR_NOMEM;
    size_t np = (f32_bytes + piece - 1) / piece;
    ct_status st = CT_OK;
    for (size_t j = 0; j < np && st == CT_OK && !rt->planning; j++) { /* the planner: the bounce counted, nothing moved */
        size_t k = expand ? np - 1 - j : j;
        size_t off = k * piece, len = f32_bytes - off < piece ? f32_bytes - off : piece; /* in f32 (raw) bytes */
        if (!bf16) {
            st = d->copy(rt->dev, bounce, src + off, len, CT_COPY_D2D);
            if (st == CT_OK) st = d->copy(rt->dev, dst + off, bounce, len, CT_COPY_D2D);
        } else if (!expand) {
            st = d->cast_f32_to_bf16(rt->dev, (uint16_t *)bounce, (const float *)(src + off), (int64_t)(len / 4));
            if (st == CT_OK) st = d->copy(rt->dev, dst + off / 2, bounce, len / 2, CT_COPY_D2D);
        } else {
            st = d->copy(rt->dev, bounce, src + off / 2, len / 2, CT_COPY_D2D);
            if (st == CT_OK)
                st = d->cast_bf16_to_f32(rt->dev, (float *)(dst + off), (const uint16_t *)bounce, (int64_t)(len / 4));
        }
    }
    pool_release(&rt->opscratch, m);
    return st;
}

ct_status runtime_pack_unit(runtime *rt, int u) {
    struct rt_pack *r = &rt->unit_pack[u];
    pool *p = &rt->saved.data;
    rt_tensor *out = rt->unit_out[u];
    memset(r, 0, sizeof *r);
    if (!out || !CT_HAS_FIELD(rt->d, ct_device_api, cast_bf16_to_f32) || !rt->d->cast_f32_to_bf16 ||
        !rt->d->cast_bf16_to_f32)
        return CT_OK;
    collect c = {p, rt->unit_mark[u].data, pool_get_mark(p), NULL, 0, 0, 0};
    int hidden = tape_visit(rt->unit_tape[u], collect_one, &c);
    for (rt_tensor *t = out->sac_next; t; t = t->sac_next) collect_one(&c, t, 0);
    collect_one(&c, out, 0);
    if (c.bad) {
        free(c.v);
        ct_set_error("out of memory");
        return CT_ERR_NOMEM;
    }
    merge(&c);
    if (!rt->bf16_compute) /* fp32 packs only to offload: every tensor as it is */
        for (int i = 0; i < c.n; i++) c.v[i].bf16 = 0;
    size_t ob = (size_t)ct_tensor_numel(&out->t) * ct_dtype_size(out->t.dtype);
    int found = 0;
    for (int i = 0; i < c.n; i++) found |= c.v[i].orig == (char *)out->t.data && c.v[i].bytes == ob;
    int64_t elements = 0;
    for (int i = 0; i < c.n; i++) elements += c.v[i].bf16 ? (int64_t)(c.v[i].bytes / 4) : 0;
    if (!found || hidden || !rt->pack_units) { /* nothing may move: the same values, rounded where they are */
        if (runtime_offloads(rt, u)) rt->offload.unit[u].stayed = 1; /* (said after the first step) */
        if (!rt->bf16_compute) { /* (fp32: nothing to round; the unit is not offloaded) */
            free(c.v);
            return CT_OK;
        }
        int bad = tape_note_cast(rt, elements, 1) != CT_OK;
        for (int i = 0; i < c.n && !bad && !rt->planning; i++)
            if (c.v[i].bf16) bad = rt->d->round_bf16(rt->dev, (float *)c.v[i].orig, (int64_t)(c.v[i].bytes / 4)) != CT_OK;
        if (!found && !bad && !rt->planning && out->t.dtype == CT_F32 && (out->base ? out->base : out) == out)
            bad = rt->d->round_bf16(rt->dev, out->t.data, ct_tensor_numel(&out->t)) != CT_OK;
        free(c.v);
        if (bad && !ct_last_error()[0]) ct_set_error("rounding unit %d's activations to bf16 failed", u);
        return bad ? CT_ERR_INTERNAL : CT_OK;
    }
    /* the region starts at the unit's input when that is the previous unit's handoff (dropped here,
     * expanded from that unit's packed output when this one's backward starts) */
    struct rt_pack *prev = u > 0 ? &rt->unit_pack[u - 1] : NULL;
    r->lo = rt->unit_mark[u].data;
    if (prev && prev->packed && rt->unit_in[u] == prev->out && prev->after_handoff.cur == r->lo.cur &&
        prev->after_handoff.top == r->lo.top) { /* the handoff is the last thing below this unit */
        r->in_handoff = rt->unit_in[u]->t.data;
        r->lo = prev->handoff_at;
    }
    if (tape_note_cast(rt, elements, 0) != CT_OK) {
        free(c.v);
        return CT_ERR_NOMEM;
    }
    r->top = pool_get_mark(p);
    r->items = pool_alloc(&rt->saved.desc, sizeof *r->items * (size_t)(c.n ? c.n : 1));
    if (!r->items) {
        free(c.v);
        ct_set_error("out of memory for the tape");
        return CT_ERR_NOMEM;
    }
    r->n = c.n;
    /* offloaded: packed into a slot of their own, off the saved arena (offload.c) */
    size_t blob_bytes = 0;
    for (int i = 0; i < c.n; i++) blob_bytes += align64(c.v[i].bf16 ? c.v[i].bytes / 2 : c.v[i].bytes);
    r->blob = runtime_offloads(rt, u) ? runtime_offload_take(rt, u, blob_bytes) : NULL;
    if (runtime_offloads(rt, u) && !r->blob) {
        free(c.v);
        if (!ct_last_error()[0]) ct_set_error("out of memory for offloaded activations");
        return CT_ERR_NOMEM;
    }
    pool_release(p, r->lo);
    int bad = 0;
    size_t at = 0;
    for (int i = 0; i < c.n && !bad; i++) {
        pack_item *it = &c.v[i];
        size_t pb = it->bf16 ? it->bytes / 2 : it->bytes;
        it->packed = r->blob ? r->blob + at : pool_alloc(p, pb);
        at += align64(pb);
        bad = !it->packed || move(rt, it->packed, it->orig, it->bytes, it->bf16, 0) != CT_OK;
        r->items[i] = *it;
        if (it->orig == (char *)out->t.data) {
            r->out_packed = it->packed;
            r->out_bf16 = it->bf16;
        }
    }
    free(c.v);
    if (bad || !r->out_packed) {
        if (!ct_last_error()[0]) ct_set_error("packing unit %d's activations failed", u);
        return CT_ERR_NOMEM;
    }
    /* the output again in f32 for the next unit, from the value backward will see */
    r->handoff_at = pool_get_mark(p);
    char *h = pool_alloc(p, ob);
    r->after_handoff = pool_get_mark(p);
    if (!h || move(rt, h, r->out_packed, ob, r->out_bf16, 1) != CT_OK) {
        if (!ct_last_error()[0]) ct_set_error("out of memory for activations");
        return CT_ERR_NOMEM;
    }
    r->out = out;
    r->out_orig = out->t.data;
    out->t.data = h;
    r->packed = 1;
    rt->unit_mark[u].data = r->lo; /* the unit's backward gives back from here */
    return r->blob ? runtime_offload_out(rt, u) : CT_OK;
}

void runtime_pack_rebase(runtime *rt, int u, char *blob) {
    struct rt_pack *r = &rt->unit_pack[u];
    if (!r->blob || r->blob == blob) return;
    for (int i = 0; i < r->n; i++) r->items[i].packed = blob + (r->items[i].packed - r->blob);
    r->out_packed = blob + (r->out_packed - r->blob);
    r->blob = blob;
}

ct_status runtime_unpack_unit(runtime *rt, int u) {
    struct rt_pack *r = rt->unit_pack ? &rt->unit_pack[u] : NULL;
    if (!r || !r->packed) return CT_OK;
    pool_release(&rt->saved.data, r->top);
    for (int i = r->n - 1; i >= 0; i--) {
        pack_item *it = &r->items[i];
        ct_status st = move(rt, it->orig, it->packed, it->bytes, it->bf16, 1);
        if (st != CT_OK) return st;
    }
    r->out->t.data = r->out_orig;
    if (r->in_handoff) {
        struct rt_pack *prev = &rt->unit_pack[u - 1];
        size_t ib = (size_t)ct_tensor_numel(&prev->out->t) * ct_dtype_size(prev->out->t.dtype);
        ct_status st = move(rt, r->in_handoff, prev->out_packed, ib, prev->out_bf16, 1);
        if (st != CT_OK) return st;
    }
    r->packed = 0;
    return CT_OK;
}

/* Per-op checkpointing with units in order (runtime_unit_fwd): the unit's forward ran in the saved
 * arena from `from`, its temporaries among the outputs it keeps. The kept outputs (the chain from
 * rt->sac_head) move down over the temporaries, in order, their descriptors following them (the
 * recompute reads the chain's descriptors; nothing else holds their addresses), and the output is
 * copied after them; the rest of the region is given back. Where the layout is not that (a chunk
 * boundary crossed, the output below a kept tensor), nothing moves and the region stays whole. */
ct_status runtime_keep_op_unit(runtime *rt, pool_mark from, rt_tensor **out) {
    pool *p = &rt->saved.data;
    rt_tensor *o = *out, *head = rt->sac_head;
    pool_mark top = pool_get_mark(p);
    size_t ob = (size_t)ct_tensor_numel(&o->t) * ct_dtype_size(o->t.dtype);
    int movable = top.cur == from.cur && from.cur < p->n_chunks && !p->heap;
    char *base = movable ? p->chunks[from.cur].base : NULL, *end = base ? base + from.top : NULL;
    for (rt_tensor *t = head; t && movable; t = t->sac_next) {
        char *a = t->t.data;
        movable = !t->base && a >= end && a < base + top.top;
        end = a + (size_t)ct_tensor_numel(&t->t) * ct_dtype_size(t->t.dtype);
    }
    movable = movable && (char *)o->t.data >= end;
    if (movable) {
        size_t off = from.top;
        for (rt_tensor *t = head; t; t = t->sac_next) {
            size_t bytes = (size_t)ct_tensor_numel(&t->t) * ct_dtype_size(t->t.dtype);
            ct_status st = move(rt, base + off, t->t.data, bytes, 0, 0);
            if (st != CT_OK) return st;
            t->t.data = base + off;
            off += align64(bytes); /* pool.c's alignment */
        }
        pool_release(p, (pool_mark){from.cur, off, from.used + (off - from.top)});
    }
    rt_tensor *keep = tape_new_activation(rt, o->t.dtype, o->t.ndim, o->t.shape);
    if (!keep) return CT_ERR_NOMEM;
    ct_status st = move(rt, keep->t.data, o->t.data, ob, 0, 0);
    if (st != CT_OK) return st;
    keep->sac_next = head; /* the recompute finds the saved outputs here */
    *out = keep;
    return CT_OK;
}
