/* region.c: growable regions (ABI 2.8, device.h region_*) through CUDA's virtual memory
 * management, as PyTorch's expandable segments use it.
 *
 * A region is address space from cuMemAddressReserve. Growing it creates physical memory for the
 * new part (cuMemCreate, rounded up to the device's recommended granularity) and maps it at the
 * region's end with read-write access for this GPU; each such piece keeps its own handle.
 * Shrinking waits for the stream, then unmaps and releases whole pieces from the end (a piece
 * that straddles the new size stays), so `backed` may stay above what was asked. A GPU that is full
 * gets the caching allocator's free blocks back (as alloc does) before a second try. Nothing
 * changes while a graph is captured.
 *
 * The driver's functions: weak references, which the emulator (tests/cuda_emu) defines, or else
 * dlopen("libcuda.so.1") (the plugin does not link the driver). Where neither gives all of them,
 * or the GPU cannot map memory this way, region_reserve says CT_ERR_UNSUPPORTED and the host keeps
 * its arenas in blocks from alloc.
 */
#include "cuda_device.h"

#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#pragma weak cuMemAddressReserve
#pragma weak cuMemAddressFree
#pragma weak cuMemCreate
#pragma weak cuMemRelease
#pragma weak cuMemMap
#pragma weak cuMemUnmap
#pragma weak cuMemSetAccess
#pragma weak cuMemGetAllocationGranularity

typedef struct vmm_api {
    int tried, ok;
    __typeof__(cuMemAddressReserve) *reserve;
    __typeof__(cuMemAddressFree) *address_free;
    __typeof__(cuMemCreate) *create;
    __typeof__(cuMemRelease) *release;
    __typeof__(cuMemMap) *map;
    __typeof__(cuMemUnmap) *unmap;
    __typeof__(cuMemSetAccess) *set_access;
    __typeof__(cuMemGetAllocationGranularity) *granularity;
} vmm_api;

static vmm_api vmm;
static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

/* The driver's entry points, found once per process. */
static int vmm_load(void)
{
    pthread_mutex_lock(&vmm_lock);
    if (!vmm.tried) {
        vmm.tried = 1;
        vmm.reserve = cuMemAddressReserve;
        vmm.address_free = cuMemAddressFree;
        vmm.create = cuMemCreate;
        vmm.release = cuMemRelease;
        vmm.map = cuMemMap;
        vmm.unmap = cuMemUnmap;
        vmm.set_access = cuMemSetAccess;
        vmm.granularity = cuMemGetAllocationGranularity;
        if (!vmm.reserve) { /* not linked in: the driver's library, which the CUDA runtime has loaded */
            void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            if (lib) {
                *(void **)&vmm.reserve = dlsym(lib, "cuMemAddressReserve");
                *(void **)&vmm.address_free = dlsym(lib, "cuMemAddressFree");
                *(void **)&vmm.create = dlsym(lib, "cuMemCreate");
                *(void **)&vmm.release = dlsym(lib, "cuMemRelease");
                *(void **)&vmm.map = dlsym(lib, "cuMemMap");
                *(void **)&vmm.unmap = dlsym(lib, "cuMemUnmap");
                *(void **)&vmm.set_access = dlsym(lib, "cuMemSetAccess");
                *(void **)&vmm.granularity = dlsym(lib, "cuMemGetAllocationGranularity");
            }
        }
        vmm.ok = vmm.reserve && vmm.address_free && vmm.create && vmm.release && vmm.map && vmm.unmap &&
                 vmm.set_access && vmm.granularity;
    }
    int ok = vmm.ok;
    pthread_mutex_unlock(&vmm_lock);
    return ok;
}

typedef struct region_piece {
    CUmemGenericAllocationHandle handle;
    size_t off, size;
} region_piece;

typedef struct cuda_region {
    CUdeviceptr base;
    size_t reserved, backed, granularity;
    region_piece *pieces;
    int n, cap;
} cuda_region;

static CUmemAllocationProp region_prop(const cuda_device *d)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d->device;
    return prop;
}

/* d's region at base, or NULL. mem_lock held. */
static cuda_region *region_find(cuda_device *d, const void *base)
{
    for (int i = 0; i < d->n_regions; i++)
        if (d->regions[i]->base == (CUdeviceptr)(uintptr_t)base)
            return d->regions[i];
    return NULL;
}

static ct_status driver_fail(cuda_device *d, const char *op, const char *call, CUresult r)
{
    return cuda_fail(d, r == CUDA_ERROR_OUT_OF_MEMORY ? CT_ERR_NOMEM : CT_ERR_INTERNAL, op, "%s failed (CUresult %d)",
                     call, (int)r);
}

/* Unmaps and releases r's pieces above `keep` bytes. */
static void region_drop(cuda_region *r, size_t keep)
{
    while (r->n && r->pieces[r->n - 1].off >= keep) {
        region_piece *p = &r->pieces[--r->n];
        (void)vmm.unmap(r->base + p->off, p->size);
        (void)vmm.release(p->handle);
        r->backed = p->off;
    }
}

ct_status cuda_region_reserve(ct_device *dev, size_t max_bytes, void **base)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!base)
        return cuda_fail(d, CT_ERR_INVALID, "region_reserve", "null output");
    *base = NULL;
    if (!max_bytes)
        return cuda_fail(d, CT_ERR_INVALID, "region_reserve", "size 0");
    if (!vmm_load())
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "region_reserve", "the CUDA driver's virtual memory calls are not there");
    ct_status st = cuda_enter(d, "region_reserve");
    if (st != CT_OK)
        return st;
    if ((st = cuda_no_capture(d, "region_reserve", "a region")) != CT_OK)
        return st;
    CUmemAllocationProp prop = region_prop(d);
    size_t g = 0;
    CUresult cr = vmm.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (cr != CUDA_SUCCESS || !g)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "region_reserve", "this GPU maps no memory that way (CUresult %d)",
                         (int)cr);
    if (max_bytes > SIZE_MAX - g)
        return cuda_fail(d, CT_ERR_INVALID, "region_reserve", "size %zu is too large", max_bytes);
    cuda_region *r = calloc(1, sizeof *r);
    if (!r)
        return cuda_fail(d, CT_ERR_NOMEM, "region_reserve", "out of host memory");
    r->granularity = g;
    r->reserved = (max_bytes + g - 1) / g * g;
    if ((cr = vmm.reserve(&r->base, r->reserved, g, 0, 0)) != CUDA_SUCCESS) {
        free(r);
        return driver_fail(d, "region_reserve", "cuMemAddressReserve", cr);
    }
    pthread_mutex_lock(&d->mem_lock);
    int room = d->n_regions < d->cap_regions;
    if (!room) {
        int cap = d->cap_regions ? 2 * d->cap_regions : 16;
        cuda_region **grown = realloc(d->regions, sizeof *grown * (size_t)cap);
        if (grown) {
            d->regions = grown;
            d->cap_regions = cap;
            room = 1;
        }
    }
    if (room)
        d->regions[d->n_regions++] = r;
    pthread_mutex_unlock(&d->mem_lock);
    if (!room) {
        (void)vmm.address_free(r->base, r->reserved);
        free(r);
        return cuda_fail(d, CT_ERR_NOMEM, "region_reserve", "out of host memory");
    }
    *base = (void *)(uintptr_t)r->base;
    return CT_OK;
}

/* Backs [backed, want) with one new piece. mem_lock held. */
static ct_status region_grow(cuda_device *d, cuda_region *r, size_t want)
{
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        region_piece *p = realloc(r->pieces, sizeof *p * (size_t)cap);
        if (!p)
            return cuda_fail(d, CT_ERR_NOMEM, "region_resize", "out of host memory");
        r->pieces = p;
        r->cap = cap;
    }
    size_t size = want - r->backed;
    CUmemAllocationProp prop = region_prop(d);
    CUmemGenericAllocationHandle h;
    CUresult cr = vmm.create(&h, size, &prop, 0);
    if (cr == CUDA_ERROR_OUT_OF_MEMORY) { /* the cache's free blocks back to CUDA, then once more */
        cuda_cache_trim_locked(d);
        cr = vmm.create(&h, size, &prop, 0);
    }
    if (cr != CUDA_SUCCESS)
        return driver_fail(d, "region_resize", "cuMemCreate", cr);
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((cr = vmm.map(r->base + r->backed, size, 0, h, 0)) != CUDA_SUCCESS) {
        (void)vmm.release(h);
        return driver_fail(d, "region_resize", "cuMemMap", cr);
    }
    if ((cr = vmm.set_access(r->base + r->backed, size, &access, 1)) != CUDA_SUCCESS) {
        (void)vmm.unmap(r->base + r->backed, size);
        (void)vmm.release(h);
        return driver_fail(d, "region_resize", "cuMemSetAccess", cr);
    }
    r->pieces[r->n++] = (region_piece){h, r->backed, size};
    r->backed = want;
    return CT_OK;
}

ct_status cuda_region_resize(ct_device *dev, void *base, size_t bytes, size_t *backed)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    ct_status st = cuda_enter(d, "region_resize");
    if (st != CT_OK)
        return st;
    pthread_mutex_lock(&d->mem_lock);
    cuda_region *r = region_find(d, base);
    if (!r)
        st = cuda_fail(d, CT_ERR_INVALID, "region_resize", "%p is not a region of %s", base, d->name);
    else if (bytes > r->reserved)
        st = cuda_fail(d, CT_ERR_INVALID, "region_resize", "%zu bytes is more than the region's %zu", bytes,
                       r->reserved);
    else {
        size_t want = (bytes + r->granularity - 1) / r->granularity * r->granularity;
        if (want != r->backed && d->capture)
            st = cuda_no_capture(d, "region_resize", "resizing a region");
        else if (want > r->backed)
            st = region_grow(d, r, want);
        else if (want < r->backed && r->n && r->pieces[r->n - 1].off >= want) {
            cudaError_t e = cudaStreamSynchronize(d->stream); /* queued kernels may still use it */
            if (e != cudaSuccess)
                st = cuda_error(d, "region_resize", "cudaStreamSynchronize", e);
            else
                region_drop(r, want);
        }
        if (st == CT_OK && backed)
            *backed = r->backed;
    }
    pthread_mutex_unlock(&d->mem_lock);
    return st;
}

void cuda_region_release(ct_device *dev, void *base)
{
    cuda_device *d = dev;
    if (!d || cuda_enter(d, "region_release") != CT_OK)
        return;
    pthread_mutex_lock(&d->mem_lock);
    cuda_region *r = region_find(d, base);
    if (r) {
        (void)cudaStreamSynchronize(d->stream);
        region_drop(r, 0);
        (void)vmm.address_free(r->base, r->reserved);
        for (int i = 0; i < d->n_regions; i++)
            if (d->regions[i] == r) {
                d->regions[i] = d->regions[--d->n_regions];
                break;
            }
        free(r->pieces);
        free(r);
    }
    pthread_mutex_unlock(&d->mem_lock);
}

void cuda_regions_release(cuda_device *d)
{
    while (d->n_regions)
        cuda_region_release(d, (void *)(uintptr_t)d->regions[0]->base);
    free(d->regions);
    d->regions = NULL;
    d->cap_regions = 0;
}
