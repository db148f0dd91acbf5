/* wait.c: completing an operation of the NCCL comm plugin. The operation's event is polled
 * (cudaEventQuery never blocks) together with the communicator's asynchronous error, until it is
 * done, NCCL reports an error (a peer's network went away), or train_timeout_seconds pass; the
 * last two abort the group's communicator, which makes NCCL's kernels return. When a compute
 * stream is bound, a completed operation also makes it wait for the event (nccl_comm.h). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (ct_util_now) */
#include "nccl_comm.h"

#include <stdlib.h>

static void req_free(ctnccl_req *r) {
    if (r->done)
        cudaEventDestroy(r->done); /* safe while pending: released when the event completes */
    free(r);
}

ct_status ctnccl_wait(ctnccl *c, ctnccl_req *r) {
    ctnccl_group *g = r->g;
    if (!r->done) { /* nothing was enqueued (count 0) */
        req_free(r);
        return CT_OK;
    }
    if (g->aborted) {
        c->host->set_error(c->host, "%s: the group was aborted after an earlier error or timeout", r->what);
        req_free(r);
        return CT_ERR_INVALID;
    }
    double deadline = ct_util_now() + c->train_timeout;
    ct_status st = CT_OK;
    for (unsigned spin = 0;; spin++) {
        cudaError_t e = cudaEventQuery(r->done);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady) {
            st = ctnccl_cuda_error(c, r->what, e);
            ctnccl_group_abort(g);
            break;
        }
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(g->nc, &state);
        if (q == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
            q = state;
        if (q != ncclSuccess) {
            st = ctnccl_error(c, r->what, q, g->nc);
            ctnccl_group_abort(g);
            break;
        }
        if (ct_util_now() >= deadline) {
            ctnccl_timeout_error(c, r->what);
            ctnccl_group_abort(g);
            st = CT_ERR_TIMEOUT;
            break;
        }
        ctnccl_pause(spin);
    }
    /* The host saw the event complete; the bound stream is ordered by it too, as comm.h promises
     * (waiting on a recorded event, then destroying it, is legal). */
    if (!st && c->bound) {
        cudaError_t e = cudaStreamWaitEvent(c->bound, r->done, 0);
        if (e != cudaSuccess)
            st = ctnccl_cuda_error(c, r->what, e);
    }
    req_free(r);
    return st;
}

ct_status ctnccl_wait_api(ct_comm *comm, ct_comm_request *req) {
    ctnccl *c = comm;
    if (!req) {
        c->host->set_error(c->host, "wait: NULL request");
        return CT_ERR_INVALID;
    }
    return ctnccl_wait(c, req);
}
