/* pool.c: bump allocators with marks for activations (device) and their descriptors (host), and
 * the holes a region in heap mode gives back (runtime.h). On a device with growable regions a
 * pool's first chunk is one, reserved as large as the device and backed as far as the pool's top
 * has reached; the host counts the bytes it asked to be backed, as it counts blocks by their
 * size. */
#include "host/host.h"
#include "engine/runtime.h"

#include <stdlib.h>
#include <string.h>

#define POOL_ALIGN 64

/* Backs a region chunk's first `want` bytes: CT_OK, or the device's status (its error set). */
static ct_status region_back(pool *p, pool_chunk *c, size_t want) {
    if (want == c->backed) return CT_OK;
    size_t got = 0;
    ct_status st = p->d->region_resize(p->dev, c->base, want, &got);
    if (st != CT_OK) return st;
    mem_account(p->cat, (int64_t)want - (int64_t)c->backed);
    p->cap_total = p->cap_total - c->backed + want;
    c->backed = want;
    return CT_OK;
}

static int has_regions(const pool *p) {
    return p->dev && !p->no_region && !p->first_chunk && CT_HAS_FIELD(p->d, ct_device_api, region_release) &&
           p->d->region_reserve && p->d->region_resize && p->d->region_release;
}

/* A pool's first chunk as a region backed for `bytes`, reserved as large as the device's memory:
 * CT_OK; CT_ERR_UNSUPPORTED with nothing set when no region can be reserved (the pool uses blocks
 * from now on: no_region); the device's status when it cannot back the bytes. */
static ct_status region_open(pool *p, pool_chunk *c, size_t bytes) {
    ct_device_info info = {.struct_size = sizeof info};
    size_t reserve = p->d->info && p->d->info(p->dev, &info) == CT_OK && info.memory_bytes > 0
                         ? (size_t)info.memory_bytes : (size_t)1 << 36;
    void *base = NULL;
    if (reserve < bytes || p->d->region_reserve(p->dev, reserve, &base) != CT_OK) {
        ct_clear_error();
        p->no_region = 1;
        return CT_ERR_UNSUPPORTED;
    }
    *c = (pool_chunk){base, reserve, 0};
    ct_status st = region_back(p, c, bytes);
    if (st != CT_OK) {
        p->d->region_release(p->dev, base);
        return st; /* the device is full: the error stays set */
    }
    return CT_OK;
}

static void *chunk_alloc(pool *p, size_t bytes) {
    void *mem = NULL;
    if (p->dev) {
        if (p->d->alloc(p->dev, bytes, &mem) != CT_OK) return NULL;
    } else {
        mem = aligned_alloc(POOL_ALIGN, bytes);
    }
    if (mem) {
        mem_account(p->cat, (int64_t)bytes);
        p->cap_total += bytes;
    }
    return mem;
}

static void chunk_free(pool *p, pool_chunk *c) {
    if (c->backed) {
        p->d->region_release(p->dev, c->base);
        mem_account(p->cat, -(int64_t)c->backed);
        p->cap_total -= c->backed;
        return;
    }
    if (p->dev) p->d->free(p->dev, c->base);
    else free(c->base);
    mem_account(p->cat, -(int64_t)c->cap);
    p->cap_total -= c->cap;
}

void pool_init(pool *p, const ct_device_api *d, ct_device *dev, ct_mem_category cat) {
    memset(p, 0, sizeof *p);
    p->d = d;
    p->dev = dev;
    p->cat = cat;
}

void pool_destroy(pool *p) {
    for (int i = 0; i < p->n_chunks; i++) chunk_free(p, &p->chunks[i]);
    free(p->chunks);
    memset(p, 0, sizeof *p);
}

static size_t round_bytes(size_t bytes) {
    bytes = (bytes + POOL_ALIGN - 1) & ~(size_t)(POOL_ALIGN - 1);
    return bytes ? bytes : POOL_ALIGN;
}

static void hole_remove(pool *p, int i) {
    memmove(&p->holes[i], &p->holes[i + 1], sizeof p->holes[0] * (size_t)(p->n_holes - i - 1));
    p->n_holes--;
}

/* The smallest hole that takes `bytes`, shrunk from its start; NULL when none does. */
static void *hole_take(pool *p, size_t bytes) {
    int best = -1;
    for (int i = 0; i < p->n_holes; i++)
        if (p->holes[i].size >= bytes && (best < 0 || p->holes[i].size < p->holes[best].size)) best = i;
    if (best < 0) return NULL;
    pool_hole *h = &p->holes[best];
    void *r = p->chunks[h->chunk].base + h->off;
    h->off += bytes;
    h->size -= bytes;
    if (!h->size) hole_remove(p, best);
    return r;
}

/* Holes that end at the top of the current chunk lower the top. */
static void holes_to_top(pool *p) {
    while (p->n_holes) {
        pool_hole *h = &p->holes[p->n_holes - 1];
        if (h->chunk != p->cur || h->off + h->size != p->top) return;
        p->top = h->off;
        p->used -= h->size;
        hole_remove(p, p->n_holes - 1);
    }
}

void *pool_alloc(pool *p, size_t bytes) {
    bytes = round_bytes(bytes);
    if (p->heap && p->n_holes) {
        void *r = hole_take(p, bytes);
        if (r) return r;
    }
    while (p->cur < p->n_chunks) {
        pool_chunk *c = &p->chunks[p->cur];
        if (c->cap - p->top >= bytes) {
            if (c->backed && p->top + bytes > c->backed && region_back(p, c, p->top + bytes) != CT_OK) return NULL;
            void *r = c->base + p->top;
            p->top += bytes;
            p->used += bytes;
            if (p->used > p->peak_used) p->peak_used = p->used;
            if (p->used > p->high) p->high = p->used;
            return r;
        }
        if (c->backed) { /* a region is as large as the device */
            ct_set_error("an arena needs %zu bytes more than the device's %zu", p->top + bytes - c->cap, c->cap);
            return NULL;
        }
        if (p->cur + 1 >= p->n_chunks) break;
        p->used += c->cap - p->top; /* the tail of a chunk is lost until release */
        p->cur++;
        p->top = 0;
    }
    /* grow: a new chunk at least as big as everything so far */
    size_t cap = p->cap_total > bytes ? p->cap_total : bytes;
    if (cap < POOL_MIN_CHUNK) cap = POOL_MIN_CHUNK;
    if (!p->n_chunks && cap < p->first_chunk) cap = p->first_chunk;
    pool_chunk *grown = realloc(p->chunks, sizeof(*grown) * (size_t)(p->n_chunks + 1));
    if (!grown) return NULL;
    p->chunks = grown;
    pool_chunk nc = {0};
    /* the first chunk: a region, backed for what it holds, where the device has them */
    if (!p->n_chunks && has_regions(p) &&
        region_open(p, &nc, bytes > POOL_MIN_CHUNK ? bytes : POOL_MIN_CHUNK) != CT_OK && !p->no_region)
        return NULL; /* the device is full */
    if (!nc.backed) {
        char *mem = chunk_alloc(p, cap);
        while (!mem && cap > bytes && cap > POOL_MIN_CHUNK) { /* a device near its capacity: smaller chunks first */
            size_t half = (cap / 2 + POOL_ALIGN - 1) & ~(size_t)(POOL_ALIGN - 1);
            cap = half > bytes ? half : bytes;
            if (cap < POOL_MIN_CHUNK) cap = bytes > POOL_MIN_CHUNK ? bytes : POOL_MIN_CHUNK;
            ct_clear_error();
            mem = chunk_alloc(p, cap);
        }
        if (!mem) return NULL;
        nc = (pool_chunk){mem, cap, 0};
    }
    if (p->n_chunks) p->used += p->chunks[p->cur].cap - p->top;
    p->chunks[p->n_chunks] = nc;
    p->cur = p->n_chunks++;
    p->top = bytes;
    p->used += bytes;
    if (p->used > p->peak_used) p->peak_used = p->used;
    if (p->used > p->high) p->high = p->used;
    return nc.base;
}

pool_mark pool_get_mark(const pool *p) { return (pool_mark){p->cur, p->top, p->used}; }

static int mark_le(pool_mark a, pool_mark b) { return a.cur < b.cur || (a.cur == b.cur && a.top <= b.top); }

void pool_release(pool *p, pool_mark m) {
    p->cur = m.cur;
    p->top = m.top;
    p->used = m.used;
    if (!p->heap) return;
    if (mark_le(m, p->heap_at)) { /* the heap region is gone */
        p->heap = 0;
        p->n_holes = 0;
        return;
    }
    while (p->n_holes) { /* holes above the mark are gone; one across it ends there */
        pool_hole *h = &p->holes[p->n_holes - 1];
        if (h->chunk > m.cur || (h->chunk == m.cur && h->off >= m.top)) hole_remove(p, p->n_holes - 1);
        else {
            if (h->chunk == m.cur && h->off + h->size > m.top) h->size = m.top - h->off;
            break;
        }
    }
    holes_to_top(p);
}

void pool_heap_begin(pool *p) {
    if (p->heap) return;
    p->heap = 1;
    p->heap_at = pool_get_mark(p);
    p->n_holes = 0;
}

void pool_heap_end(pool *p) {
    p->heap = 0;
    p->n_holes = 0;
}

void pool_free(pool *p, void *ptr, size_t bytes) {
    if (!p->heap || !ptr) return;
    bytes = round_bytes(bytes);
    int c = p->cur;
    while (c >= 0 && !(p->chunks[c].base <= (char *)ptr && (char *)ptr < p->chunks[c].base + p->chunks[c].cap)) c--;
    if (c < 0) return;
    size_t off = (size_t)((char *)ptr - p->chunks[c].base);
    if (c == p->cur && off + bytes == p->top) { /* the top comes down, and with it the holes below it */
        p->top = off;
        p->used -= bytes;
        holes_to_top(p);
        return;
    }
    int i = 0; /* where it goes in order, merged with the holes on either side */
    while (i < p->n_holes && (p->holes[i].chunk < c || (p->holes[i].chunk == c && p->holes[i].off < off))) i++;
    pool_hole h = {c, off, bytes};
    if (i > 0 && p->holes[i - 1].chunk == c && p->holes[i - 1].off + p->holes[i - 1].size == off) {
        h.off = p->holes[i - 1].off;
        h.size += p->holes[i - 1].size;
        hole_remove(p, --i);
    }
    if (i < p->n_holes && p->holes[i].chunk == c && h.off + h.size == p->holes[i].off) {
        h.size += p->holes[i].size;
        hole_remove(p, i);
    }
    if (p->n_holes == POOL_MAX_HOLES) { /* full: the smallest is forgotten until the release */
        int s = 0;
        for (int j = 1; j < p->n_holes; j++)
            if (p->holes[j].size < p->holes[s].size) s = j;
        if (p->holes[s].size >= h.size) return;
        hole_remove(p, s);
        if (s < i) i--;
    }
    memmove(&p->holes[i + 1], &p->holes[i], sizeof p->holes[0] * (size_t)(p->n_holes - i));
    p->holes[i] = h;
    p->n_holes++;
}

size_t pool_steady_bytes(const pool *p) { return !p->high ? 0 : p->high > POOL_MIN_CHUNK ? p->high : POOL_MIN_CHUNK; }

/* Replaces the pool's chunks by one of `want` bytes (a region backed for them, where it can). CT_OK,
 * or a status (CT_ERR_NOMEM when the block cannot be had; the device's error set, if any). */
static ct_status one_chunk(pool *p, size_t want) {
    for (int i = 0; i < p->n_chunks; i++) chunk_free(p, &p->chunks[i]);
    p->n_chunks = 0;
    if (has_regions(p)) {
        ct_status st = region_open(p, &p->chunks[0], want);
        if (st == CT_OK) {
            p->n_chunks = 1;
            return CT_OK;
        }
        if (!p->no_region) return st;
    }
    char *mem = chunk_alloc(p, want);
    if (!mem) return CT_ERR_NOMEM;
    p->chunks[0] = (pool_chunk){mem, want, 0};
    p->n_chunks = 1;
    return CT_OK;
}

/* Empties the pool. When the pass had to grow, its chunks become one of the pass's extent (which
 * counts the tails the growth left unused); a pass that ran in one chunk and needed less than it
 * (the pass after a growth, or once liveness.c gives memory back from the second step on) shrinks
 * the chunk to what it needed, twice at most, so passes that alternate between sizes cannot
 * reallocate forever. A region has no tails and grows in place: it only gives back its backing
 * above what the pass needed, on the same terms. */
ct_status pool_reset(pool *p) {
    size_t pass = p->high;
    p->cur = 0;
    p->top = 0;
    p->used = 0;
    p->high = 0;
    p->heap = 0;
    p->n_holes = 0;
    if (p->n_chunks > 1) {
        return one_chunk(p, pass);
    }
    if (p->n_chunks == 1 && pass) {
        size_t want = pass > POOL_MIN_CHUNK ? pass : POOL_MIN_CHUNK;
        pool_chunk *c = &p->chunks[0];
        if (want < (c->backed ? c->backed : c->cap) && p->shrinks < 2) {
            p->shrinks++;
            return c->backed ? region_back(p, c, want) : one_chunk(p, want);
        }
    }
    return CT_OK;
}
