/* memory.c: the CUDA plugin's caching allocator, copies, scratch memory and readbacks.
 *
 * Allocator: sizes round up to a class (512-byte steps up to 1 MiB, then 2 MiB steps), and a
 * freed block goes back to the cache, not to CUDA. An allocation takes the smallest free block
 * of at least its class that wastes at most an eighth of it; otherwise it calls cudaMalloc, and
 * when that fails it returns every free block to CUDA and tries once more. So the steady state
 * of a training loop (the host frees and re-allocates the same sizes) makes no cudaMalloc call.
 * Blocks are cudaMalloc's, 256-byte aligned (the ABI asks for 64). Everything runs on one stream,
 * d->stream (the legacy stream, or share_stream's: stream.c), so a block freed while kernels still
 * use it is only handed to work ordered after them. Work other plugins queue on their own streams
 * (collectives) is not: the host waits for it before freeing the buffers it uses. Nor are
 * copy_async's copies (their own stream, stream.c): the host frees a block a copy uses after
 * copy_wait, which orders d->stream after the copy.
 *
 * Accounting: the host counts what it allocates itself (as with the CPU plugin); the plugin
 * reports its own memory under CT_MEM_OTHER: cuBLASLt's workspace (blas.c) and scratch blocks
 * while an op holds them. Bytes cached but unused are not counted (as PyTorch's "allocated",
 * not "reserved").
 *
 * Graphs (graph.c): a block given back while a capture runs is held for that graph (its kernels
 * write it again at every launch) and handed out only to the same capture until graph_free, so
 * memory the host allocates later never aliases a graph's scratch. A capture never trims (cudaFree
 * cannot run during one); trimming skips held blocks.
 *
 * Copies run on the stream: host to device returns once CUDA has staged a pageable source (so
 * the caller may reuse it at once); a pinned source is waited for. Device to host waits for the
 * stream, so the host sees the data on return.
 */
#include "cuda_device.h"

#include <stdlib.h>
#include <string.h>

#define CUDA_SMALL_STEP ((size_t)512)
#define CUDA_LARGE_STEP ((size_t)2 << 20)
#define CUDA_SMALL_MAX ((size_t)1 << 20)

static size_t size_class(size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    size_t step = bytes <= CUDA_SMALL_MAX ? CUDA_SMALL_STEP : CUDA_LARGE_STEP;
    return (bytes + step - 1) / step * step;
}

/* ---------------------------------------------------------------- pointer map */

static size_t slot_of(const cuda_cache *c, const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p >> 8; /* blocks are 256-aligned */
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (c->nslots - 1);
}

/* index of p's block, or -1 */
static int64_t map_find(const cuda_cache *c, const void *p)
{
    for (size_t s = slot_of(c, p);; s = (s + 1) & (c->nslots - 1)) {
        int64_t i = c->slots[s];
        if (i < 0)
            return -1;
        if (c->blocks[i].ptr == p)
            return i;
    }
}

static void map_put(cuda_cache *c, const void *p, int64_t index)
{
    size_t s = slot_of(c, p);
    while (c->slots[s] >= 0)
        s = (s + 1) & (c->nslots - 1);
    c->slots[s] = index;
}

/* Rebuilds the map for the current blocks with room for twice as many. */
static int map_rebuild(cuda_cache *c, size_t want_slots)
{
    int64_t *slots = malloc(want_slots * sizeof *slots);
    if (!slots)
        return -1;
    free(c->slots);
    c->slots = slots;
    c->nslots = want_slots;
    for (size_t s = 0; s < want_slots; s++)
        c->slots[s] = -1;
    for (size_t i = 0; i < c->n; i++)
        map_put(c, c->blocks[i].ptr, (int64_t)i);
    return 0;
}

/* ---------------------------------------------------------------- the cache */

ct_status cuda_cache_init(cuda_device *d)
{
    memset(&d->cache, 0, sizeof d->cache);
    if (map_rebuild(&d->cache, 256) != 0)
        return cuda_fail(d, CT_ERR_NOMEM, "create", "cannot allocate the allocator's map");
    return CT_OK;
}

/* Returns the free blocks to CUDA and compacts the block list. Called with mem_lock held. */
static void cache_trim(cuda_device *d)
{
    cuda_cache *c = &d->cache;
    size_t kept = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->blocks[i].in_use || c->blocks[i].held) {
            c->blocks[kept++] = c->blocks[i];
        } else {
            cudaFree(c->blocks[i].ptr);
            c->reserved -= c->blocks[i].size;
        }
    }
    c->n = kept;
    (void)map_rebuild(c, c->nslots); /* same size: cannot fail for lack of room, only of memory */
}

void cuda_cache_trim_locked(cuda_device *d)
{
    if (!d->capture) /* cudaFree cannot run during a capture */
        cache_trim(d);
}

void cuda_cache_release(cuda_device *d)
{
    cuda_cache *c = &d->cache;
    for (size_t i = 0; i < c->n; i++)
        cudaFree(c->blocks[i].ptr);
    if (d->host && d->host->log && c->blocks)
        d->host->log(d->host, CT_LOG_DEBUG, "%s: allocator made %zu cudaMalloc calls, held %.1f MiB at the end",
                     d->name, c->mallocs, (double)c->reserved / (1 << 20));
    free(c->blocks);
    free(c->slots);
    memset(c, 0, sizeof *c);
}

/* A block of at least `bytes` (*size: how many), from the cache or from CUDA. mem_lock held. */
static void *cache_get(cuda_device *d, size_t bytes, cudaError_t *err, size_t *size)
{
    cuda_cache *c = &d->cache;
    size_t want = size_class(bytes);
    int64_t best = -1;
    for (size_t i = 0; i < c->n; i++) {
        const cuda_block *b = &c->blocks[i];
        if (!b->in_use && (b->held == 0 || b->held == d->capture) && b->size >= want && b->size - want <= want / 8 &&
            (best < 0 || b->size < c->blocks[best].size))
            best = (int64_t)i;
    }
    if (best >= 0) {
        c->blocks[best].in_use = 1;
        c->in_use += c->blocks[best].size;
        *size = c->blocks[best].size;
        return c->blocks[best].ptr;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        cuda_block *grown = realloc(c->blocks, cap * sizeof *grown);
        if (!grown) {
            *err = cudaErrorMemoryAllocation;
            return NULL;
        }
        c->blocks = grown;
        c->cap = cap;
    }
    if (2 * (c->n + 1) > c->nslots && map_rebuild(c, 2 * c->nslots) != 0) {
        *err = cudaErrorMemoryAllocation;
        return NULL;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e == cudaErrorMemoryAllocation && !d->capture) { /* cudaFree cannot run during a capture */
        (void)cudaGetLastError();
        cache_trim(d);
        e = cudaMalloc(&p, want);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *err = e;
        return NULL;
    }
    c->blocks[c->n] = (cuda_block){p, want, 1, 0};
    map_put(c, p, (int64_t)c->n);
    c->n++;
    c->reserved += want;
    c->in_use += want;
    c->mallocs++;
    *size = want;
    return p;
}

/* Marks p's block free; returns its size, or 0 when p is not one of ours. mem_lock held. */
static size_t cache_put(cuda_device *d, void *p)
{
    cuda_cache *c = &d->cache;
    int64_t i = map_find(c, p);
    if (i < 0 || !c->blocks[i].in_use)
        return 0;
    c->blocks[i].in_use = 0;
    if (d->capture) /* the graph's kernels use it again at every launch */
        c->blocks[i].held = d->capture;
    c->in_use -= c->blocks[i].size;
    return c->blocks[i].size;
}

void cuda_cache_unhold(cuda_device *d, unsigned serial)
{
    pthread_mutex_lock(&d->mem_lock);
    for (size_t i = 0; i < d->cache.n; i++)
        if (d->cache.blocks[i].held == serial)
            d->cache.blocks[i].held = 0;
    pthread_mutex_unlock(&d->mem_lock);
}

ct_status cuda_no_capture(cuda_device *d, const char *op, const char *what)
{
    if (!d->capture)
        return CT_OK;
    return cuda_fail(d, CT_ERR_INVALID, op, "%s cannot be part of a graph (a capture is running)", what);
}

ct_status cuda_alloc(ct_device *dev, size_t bytes, void **out)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!out)
        return cuda_fail(d, CT_ERR_INVALID, "alloc", "null output");
    *out = NULL;
    if (bytes > SIZE_MAX - CUDA_LARGE_STEP)
        return cuda_fail(d, CT_ERR_INVALID, "alloc", "size %zu is too large", bytes);
    ct_status st = cuda_enter(d, "alloc");
    if (st != CT_OK)
        return st;
    cudaError_t err = cudaSuccess;
    size_t size;
    pthread_mutex_lock(&d->mem_lock);
    void *p = cache_get(d, bytes, &err, &size);
    pthread_mutex_unlock(&d->mem_lock);
    if (!p) {
        if (err == cudaErrorMemoryAllocation)
            return cuda_fail(d, CT_ERR_NOMEM, "alloc", "cannot allocate %zu bytes on %s (%.2f GiB held by ctitan)",
                             bytes, d->name, (double)d->cache.reserved / (1 << 30));
        return cuda_error(d, "alloc", "cudaMalloc", err);
    }
    *out = p;
    return CT_OK;
}

/* NULL and pointers that are not ours are ignored (the ABI's free returns nothing to complain
 * with; a debug log notes the foreign pointer). */
void cuda_free(ct_device *dev, void *p)
{
    cuda_device *d = dev;
    if (!d || !p)
        return;
    pthread_mutex_lock(&d->mem_lock);
    size_t size = cache_put(d, p);
    pthread_mutex_unlock(&d->mem_lock);
    if (!size && d->host && d->host->log)
        d->host->log(d->host, CT_LOG_WARN, "free: %p was not allocated by %s (ignored)", p, d->name);
}

void *cuda_scratch_get(struct ct_device *d, size_t bytes)
{
    cudaError_t err = cudaSuccess;
    size_t size = 0;
    pthread_mutex_lock(&d->mem_lock);
    void *p = cache_get(d, bytes, &err, &size);
    pthread_mutex_unlock(&d->mem_lock);
    if (p && d->host && d->host->mem_account)
        d->host->mem_account(d->host, CT_MEM_OTHER, (int64_t)size);
    return p;
}

void cuda_scratch_put(struct ct_device *d, void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&d->mem_lock);
    size_t size = cache_put(d, p);
    pthread_mutex_unlock(&d->mem_lock);
    if (size && d->host && d->host->mem_account)
        d->host->mem_account(d->host, CT_MEM_OTHER, -(int64_t)size);
}

/* ---------------------------------------------------------------- copies */

/* True when host pointer p is page-locked (then an async copy from it really is async). */
static int host_is_pinned(const void *p)
{
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return attr.type == cudaMemoryTypeHost;
}

/* [a, a + n) and [b, b + n) overlap */
static int overlaps(const void *a, const void *b, size_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + n && y < x + n;
}

ct_status cuda_copy(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind)
{
    cuda_device *d = dev;
    if (bytes == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "copy");
    if (st != CT_OK)
        return st;
    cudaError_t e;
    if (kind != CT_COPY_D2D) {
        ct_status st = cuda_no_capture(d, "copy", kind == CT_COPY_H2D ? "a copy from the host" : "a copy to the host");
        if (st != CT_OK)
            return st;
    }
    if (kind == CT_COPY_H2D) {
        e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, d->stream);
        if (e == cudaSuccess && host_is_pinned(src))
            e = cudaStreamSynchronize(d->stream);
        return e == cudaSuccess ? CT_OK : cuda_error(d, "copy", "cudaMemcpyAsync (host to device)", e);
    }
    if (kind == CT_COPY_D2H) {
        e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(d->stream);
        return e == cudaSuccess ? CT_OK : cuda_error(d, "copy", "cudaMemcpyAsync (device to host)", e);
    }
    if (dst == src)
        return CT_OK;
    if (!overlaps(dst, src, bytes)) {
        e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->stream);
        return e == cudaSuccess ? CT_OK : cuda_error(d, "copy", "cudaMemcpyAsync (device to device)", e);
    }
    /* overlapping ranges (memmove's contract): through a scratch block */
    void *tmp = cuda_scratch_get(d, bytes);
    if (!tmp)
        return cuda_fail(d, CT_ERR_NOMEM, "copy", "cannot allocate %zu bytes of scratch for an overlapping copy",
                         bytes);
    e = cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, d->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, d->stream);
    cuda_scratch_put(d, tmp);
    return e == cudaSuccess ? CT_OK : cuda_error(d, "copy", "cudaMemcpyAsync (overlapping device to device)", e);
}

ct_status cuda_zero(ct_device *dev, void *p, size_t bytes)
{
    cuda_device *d = dev;
    if (bytes == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "zero");
    if (st != CT_OK)
        return st;
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, d->stream);
    return e == cudaSuccess ? CT_OK : cuda_error(d, "zero", "cudaMemsetAsync", e);
}

ct_status cuda_synchronize(ct_device *dev)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    ct_status st = cuda_no_capture(d, "synchronize", "waiting for the device");
    if (st != CT_OK)
        return st;
    st = cuda_enter(d, "synchronize");
    if (st != CT_OK)
        return st;
    cudaError_t e = cudaStreamSynchronize(d->stream);
    if (e != cudaSuccess)
        return cuda_error(d, "synchronize", "cudaStreamSynchronize", e);
    return cuda_copies_synchronize(d, "synchronize"); /* and copy_async's copies (stream.c) */
}

ct_status cuda_readback(cuda_device *d, const char *op, void *dst, const void *src, size_t bytes)
{
    ct_status st = cuda_no_capture(d, op, "reading a result back to the host");
    if (st != CT_OK)
        return st;
    cudaError_t e = cudaMemcpyAsync(d->pinned, src, bytes, cudaMemcpyDeviceToHost, d->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->stream);
    if (e != cudaSuccess)
        return cuda_error(d, op, "reading a result back (cudaMemcpyAsync, cudaStreamSynchronize)", e);
    memcpy(dst, d->pinned, bytes);
    return CT_OK;
}
