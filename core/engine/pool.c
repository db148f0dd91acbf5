/* pool.c: bump allocators with marks for activations (device) and their descriptors (host). */
#include "host/host.h"
#include "engine/runtime.h"

#include <stdlib.h>
#include <string.h>

#define POOL_ALIGN 64

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

void *pool_alloc(pool *p, size_t bytes) {
    bytes = (bytes + POOL_ALIGN - 1) & ~(size_t)(POOL_ALIGN - 1);
    if (!bytes) bytes = POOL_ALIGN;
    while (p->cur < p->n_chunks) {
        pool_chunk *c = &p->chunks[p->cur];
        if (c->cap - p->top >= bytes) {
            void *r = c->base + p->top;
            p->top += bytes;
            p->used += bytes;
            if (p->used > p->peak_used) p->peak_used = p->used;
            return r;
        }
        if (p->cur + 1 >= p->n_chunks) break;
        p->used += c->cap - p->top; /* the tail of a chunk is lost until release */
        p->cur++;
        p->top = 0;
    }
    /* grow: a new chunk at least as big as everything so far */
    size_t cap = p->cap_total > bytes ? p->cap_total : bytes;
    if (cap < POOL_MIN_CHUNK) cap = POOL_MIN_CHUNK;
    pool_chunk *grown = realloc(p->chunks, sizeof(*grown) * (size_t)(p->n_chunks + 1));
    if (!grown) return NULL;
    p->chunks = grown;
    char *mem = chunk_alloc(p, cap);
    while (!mem && cap > bytes && cap > POOL_MIN_CHUNK) { /* a device near its capacity: smaller chunks first */
        size_t half = (cap / 2 + POOL_ALIGN - 1) & ~(size_t)(POOL_ALIGN - 1);
        cap = half > bytes ? half : bytes;
        if (cap < POOL_MIN_CHUNK) cap = bytes > POOL_MIN_CHUNK ? bytes : POOL_MIN_CHUNK;
        ct_clear_error();
        mem = chunk_alloc(p, cap);
    }
    if (!mem) return NULL;
    if (p->n_chunks) p->used += p->chunks[p->cur].cap - p->top;
    p->chunks[p->n_chunks] = (pool_chunk){mem, cap};
    p->cur = p->n_chunks++;
    p->top = bytes;
    p->used += bytes;
    if (p->used > p->peak_used) p->peak_used = p->used;
    return mem;
}

pool_mark pool_get_mark(const pool *p) { return (pool_mark){p->cur, p->top, p->used}; }

void pool_release(pool *p, pool_mark m) {
    p->cur = m.cur;
    p->top = m.top;
    p->used = m.used;
}

size_t pool_steady_bytes(const pool *p) { return p->n_chunks <= 1 ? p->cap_total : p->peak_used; }

/* Empties the pool; when it had to grow, replaces its chunks by one of the peak size. */
int pool_reset(pool *p) {
    p->cur = 0;
    p->top = 0;
    p->used = 0;
    if (p->n_chunks <= 1) return 0;
    size_t want = p->peak_used;
    for (int i = 0; i < p->n_chunks; i++) chunk_free(p, &p->chunks[i]);
    p->n_chunks = 0;
    char *mem = chunk_alloc(p, want);
    if (!mem) return -1;
    p->chunks[0] = (pool_chunk){mem, want};
    p->n_chunks = 1;
    return 0;
}
