/* group.c: the groups of the NCCL comm plugin (world, split, free), the deadline-bounded
 * polling every non-blocking NCCL call goes through, and a group's ordering after the bound
 * compute stream (see nccl_comm.h). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (ct_util_now), nanosleep (plugins build without _GNU_SOURCE) */
#include "nccl_comm.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The first polls only yield (a collective of a few KB completes in tens of microseconds), then
 * the pause doubles from 10 us to 1 ms, so a long wait costs little CPU. */
void ctnccl_pause(unsigned spin) {
    if (spin < 100) {
        sched_yield();
        return;
    }
    unsigned k = (spin - 100) / 16;
    long ns = 10000L << (k < 7 ? k : 7);
    struct timespec ts = {0, ns < 1000000L ? ns : 1000000L};
    nanosleep(&ts, NULL);
}

ncclResult_t ctnccl_settle(ncclComm_t nc, ncclResult_t r, double deadline) {
    if ((r != ncclSuccess && r != ncclInProgress) || !nc)
        return r;
    /* Even after ncclSuccess a non-blocking communicator may still finish the call in NCCL's
     * thread (ncclCommSplit returns success with the parent in progress); polling also joins
     * NCCL's group job, which the API requires before the next call. */
    for (unsigned spin = 0;; spin++) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(nc, &state);
        if (q != ncclSuccess)
            return q;
        if (state != ncclInProgress)
            return state;
        if (ct_util_now() >= deadline)
            return ncclInProgress;
        ctnccl_pause(spin);
    }
}

static ct_status status_of(ncclResult_t r) {
    switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return CT_ERR_INVALID;
    case ncclSystemError:
    case ncclRemoteError: return CT_ERR_IO;
    default: return CT_ERR_INTERNAL;
    }
}

ct_status ctnccl_error(ctnccl *c, const char *what, ncclResult_t r, ncclComm_t nc) {
    const char *last = ncclGetLastError(nc);
    c->host->set_error(c->host, "%s: %s%s%s%s", what, ncclGetErrorString(r), last && *last ? " (" : "",
                       last && *last ? last : "", last && *last ? ")" : "");
    return status_of(r);
}

ct_status ctnccl_cuda_error(ctnccl *c, const char *what, cudaError_t e) {
    c->host->set_error(c->host, "%s: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError(); /* clear it, so the next call does not report it again */
    return CT_ERR_INTERNAL;
}

void ctnccl_timeout_error(ctnccl *c, const char *what) {
    c->host->set_error(c->host, "%s: no completion within %g s; a rank died or is stuck", what,
                       c->train_timeout);
}

void ctnccl_group_abort(ctnccl_group *g) {
    if (g->aborted)
        return;
    /* Sets NCCL's abort flag (its kernels poll it and return) and frees the communicator. */
    (void)ncclCommAbort(g->nc);
    g->nc = NULL;
    g->aborted = 1;
}

ct_status ctnccl_group_settle(ctnccl *c, ctnccl_group *g, ncclResult_t r, const char *what) {
    ncclResult_t s = ctnccl_settle(g->nc, r, ct_util_now() + c->train_timeout);
    if (s == ncclSuccess)
        return CT_OK;
    ct_status st;
    if (s == ncclInProgress) {
        ctnccl_timeout_error(c, what);
        st = CT_ERR_TIMEOUT;
    } else {
        st = ctnccl_error(c, what, s, g->nc);
    }
    /* After an error or a timeout NCCL promises nothing about the communicator: abort it. */
    ctnccl_group_abort(g);
    return st;
}

ct_status ctnccl_group_open(ctnccl *c, ncclComm_t nc, const char *name, ctnccl_group **out) {
    ctnccl_group *g = calloc(1, sizeof *g);
    if (!g)
        return CT_ERR_NOMEM;
    g->nc = nc;
    snprintf(g->name, sizeof g->name, "%s", name);
    ncclResult_t r = ncclCommUserRank(nc, &g->rank);
    if (r == ncclSuccess)
        r = ncclCommCount(nc, &g->size);
    if (r != ncclSuccess) {
        char what[128];
        snprintf(what, sizeof what, "group %s: rank and size", g->name);
        free(g);
        return ctnccl_error(c, what, r, nc);
    }
    /* Unbound, a blocking stream: ordered with the legacy default stream, where the device
     * computes. Bound, a non-blocking one: events order it with the bound stream. */
    cudaError_t e = c->bound ? cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)
                             : cudaStreamCreate(&g->stream);
    if (e == cudaSuccess) {
        e = cudaMalloc((void **)&g->scratch, sizeof(int));
        if (e == cudaSuccess) /* on the group's stream, before the barriers that use it */
            e = cudaMemsetAsync(g->scratch, 0, sizeof(int), g->stream);
    }
    if (e != cudaSuccess) {
        if (g->scratch)
            cudaFree(g->scratch);
        if (g->stream)
            cudaStreamDestroy(g->stream);
        free(g);
        char what[128];
        snprintf(what, sizeof what, "group %s: stream and scratch buffer on GPU %d", name, c->device);
        return ctnccl_cuda_error(c, what, e);
    }
    g->next = c->groups;
    c->groups = g;
    *out = g;
    return CT_OK;
}

void ctnccl_group_close(ctnccl *c, ctnccl_group *g, int finalize) {
    for (ctnccl_group **p = &c->groups; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            break;
        }
    }
    if (!g->aborted && finalize) {
        /* Finalize flushes what is still queued; bounded, then abort if a peer never answers. */
        ncclResult_t r = ctnccl_settle(g->nc, ncclCommFinalize(g->nc), ct_util_now() + c->train_timeout);
        if (r == ncclSuccess) {
            (void)ncclCommDestroy(g->nc);
            g->nc = NULL;
        } else {
            c->host->log(c->host, CT_LOG_WARN, "group %s: finalize %s; aborting it", g->name,
                         r == ncclInProgress ? "timed out" : ncclGetErrorString(r));
        }
    }
    int clean = !g->aborted && !g->nc;
    if (g->nc)
        ctnccl_group_abort(g);
    /* After an abort NCCL's kernels may still be winding down, and cudaFree would synchronize
     * with them: leave the 4 bytes (the job is ending). Destroying a busy stream does not wait. */
    if (clean)
        cudaFree(g->scratch);
    if (g->before)
        cudaEventDestroy(g->before); /* safe while a wait on it is pending */
    cudaStreamDestroy(g->stream);
    free(g);
}

ct_status ctnccl_group_order_after_bound(ctnccl *c, ctnccl_group *g, const char *what) {
    if (!c->bound)
        return CT_OK;
    cudaError_t e;
    if (!g->before && (e = cudaEventCreateWithFlags(&g->before, cudaEventDisableTiming)) != cudaSuccess) {
        g->before = NULL;
        return ctnccl_cuda_error(c, what, e);
    }
    /* One event serves every operation: a wait takes the record made just before it, and a
     * later record does not change what an earlier wait waits for. */
    e = cudaEventRecord(g->before, c->bound);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(g->stream, g->before, 0);
    return e == cudaSuccess ? CT_OK : ctnccl_cuda_error(c, what, e);
}

ct_status ctnccl_world(ct_comm *comm, ct_comm_group **group) {
    ctnccl *c = comm;
    if (!group)
        return CT_ERR_INVALID;
    *group = c->world;
    return CT_OK;
}

ct_status ctnccl_group_rank(ct_comm *comm, ct_comm_group *group, int *rank, int *size) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    if (!g) {
        c->host->set_error(c->host, "group_rank: NULL group");
        return CT_ERR_INVALID;
    }
    if (rank)
        *rank = g->rank;
    if (size)
        *size = g->size;
    return CT_OK;
}

ct_status ctnccl_split(ct_comm *comm, ct_comm_group *group, int color, int key, const char *name,
                       ct_comm_group **out) {
    ctnccl *c = comm;
    ctnccl_group *p = group;
    if (!p || !out) {
        c->host->set_error(c->host, "split: NULL %s", p ? "output" : "group");
        return CT_ERR_INVALID;
    }
    *out = NULL;
    const char *nm = name && *name ? name : "(unnamed)";
    char what[192];
    snprintf(what, sizeof what, "split of group %s (rank %d of %d) into %s (color %d, key %d)", p->name,
             p->rank, p->size, nm, color, key);
    if (p->aborted) {
        c->host->set_error(c->host, "%s: the group was aborted after an earlier error", what);
        return CT_ERR_INVALID;
    }
    if (color < 0) {
        c->host->set_error(c->host, "%s: expected a color >= 0", what);
        return CT_ERR_INVALID;
    }
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess)
        return ctnccl_cuda_error(c, what, e);
    /* NCCL's init thread writes the new communicator here when the split completes, so it lives
     * on the heap: after a timeout it is left behind rather than freed under that thread. */
    ncclComm_t *slot = calloc(1, sizeof *slot);
    if (!slot)
        return CT_ERR_NOMEM;
    /* config NULL: the child inherits the parent's (non-blocking) configuration. The split runs
     * as a job of the parent, so the parent is what reports progress and errors. */
    ct_status st = ctnccl_group_settle(c, p, ncclCommSplit(p->nc, color, key, slot, NULL), what);
    if (st)
        return st;
    ncclComm_t nc = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    free(slot);
    if (!nc) {
        c->host->set_error(c->host, "%s: NCCL returned no communicator", what);
        return CT_ERR_INTERNAL;
    }
    ncclResult_t r = ctnccl_settle(nc, ncclInProgress, ct_util_now() + c->train_timeout);
    if (r != ncclSuccess) {
        if (r == ncclInProgress) {
            ctnccl_timeout_error(c, what);
            st = CT_ERR_TIMEOUT;
        } else {
            st = ctnccl_error(c, what, r, nc);
        }
        (void)ncclCommAbort(nc);
        return st;
    }
    ctnccl_group *g = NULL;
    st = ctnccl_group_open(c, nc, nm, &g);
    if (st) {
        (void)ncclCommAbort(nc);
        return st;
    }
    *out = g;
    return CT_OK;
}

void ctnccl_group_free(ct_comm *comm, ct_comm_group *group) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    if (!g || g == c->world)
        return; /* the world belongs to the comm and goes with destroy */
    ctnccl_group_close(c, g, 1);
}
