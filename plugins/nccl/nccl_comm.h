/* nccl_comm.h: state shared by the files of the NCCL comm plugin (GPU memory).
 *
 *   plugin.c  entry, options, create (MPI bootstrap, GPU choice, world communicator), destroy, abort
 *   group.c   groups: world, split, free; polling a non-blocking communicator with a deadline
 *   ops.c     argument checks, dtype/op mapping and the NCCL call behind each operation
 *   wait.c    requests: a CUDA event recorded after the operation, polled with a deadline
 *
 * Every communicator is created non-blocking (ncclConfig_t.blocking = 0): no NCCL call holds the
 * thread, so init, split, connection setup and the kernels themselves are all bounded by
 * train_timeout_seconds; on a timeout the communicator is aborted (ncclCommAbort) and the call
 * returns CT_ERR_TIMEOUT.
 *
 * Ordering with the device plugin: each group runs on its own CUDA stream.
 *   Unbound (no bind_stream): the group streams are blocking streams (cudaStreamCreate), so a
 *     collective is ordered after earlier work on the legacy default stream (where the CUDA
 *     device plugin computes until share_stream) and before later work there; no events needed.
 *   Bound (bind_stream(s), s = the device's shared non-blocking stream): ordering comes from
 *     events, for every group. Each operation first records the group's `before` event on s and
 *     makes the group's stream wait for it, so it starts after the compute work queued so far;
 *     wait() and blocking calls, once the host has seen the operation's `done` event complete,
 *     make s wait for that event, so compute queued afterwards sees the result. In between, the
 *     collective overlaps with compute. Groups opened after the bind get non-blocking streams;
 *     older groups keep their blocking ones (still correct: the events order them with s, the
 *     legacy ordering they also have is merely unused). The stream stays the device's: the comm
 *     never destroys it, and the host must wait() for an operation before it frees or reuses its
 *     buffers on s (the device's allocator knows nothing of the comm's streams).
 */
#ifndef CTITAN_NCCL_COMM_H
#define CTITAN_NCCL_COMM_H

#include "ctitan/comm.h"
#include "ctitan/util.h" /* ct_util_now, where the file asked for POSIX */

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl plugin needs NCCL >= 2.18 (ncclCommSplit)"
#endif
/* fp8 reductions: NCCL >= 2.24 knows the two fp8 types; older ones move fp8 as bytes only. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define CTNCCL_HAS_FP8 1
#else
#define CTNCCL_HAS_FP8 0
#endif

typedef struct ct_comm_group { /* the ABI's opaque ct_comm_group */
    ncclComm_t nc;
    cudaStream_t stream; /* every operation on this group runs here */
    cudaEvent_t before;  /* bound: recorded on the bound stream, waited for here, before each
                            operation (made at the first bound operation; reused) */
    int *scratch;        /* one int of device memory: the barrier's all_reduce */
    int rank, size;
    int aborted;         /* ncclCommAbort was called: the group only awaits group_free/destroy */
    char name[64];       /* "world", or the name split was given (truncated) */
    struct ct_comm_group *next; /* in ctnccl.groups */
} ctnccl_group;

typedef struct ct_comm { /* the ABI's opaque ct_comm */
    const ct_host *host;
    double train_timeout; /* seconds; bounds every call, wait, init and split */
    int device;           /* the CUDA device of this rank */
    int nccl_version;     /* of the library loaded at run time */
    int mpi_inited_here;  /* we called MPI_Init_thread, so destroy calls MPI_Finalize */
    int mpi_stuck;        /* a bootstrap exchange timed out: MPI may still own our buffers, and
                             MPI_Finalize would wait for the missing rank */
    MPI_Comm boot;        /* a duplicate of MPI_COMM_WORLD: the bootstrap (unique id, agreement) */
    cudaStream_t bound;   /* bind_stream's: the device's compute stream; NULL until then */
    ctnccl_group *world;
    ctnccl_group *groups; /* every live group, newest first (the world is last) */
} ctnccl;

/* One operation in flight and what its messages say about it. */
typedef struct ct_comm_request { /* the ABI's opaque ct_comm_request */
    cudaEvent_t done;   /* recorded on the group's stream after the operation; NULL: nothing ran */
    ctnccl_group *g;
    char what[192];     /* "all_reduce of 4096 f32 on group dp (rank 1 of 4)" */
} ctnccl_req;

/* group.c */
/* Sleeps a little longer each time (spin = how many times already), up to 1 ms. */
void ctnccl_pause(unsigned spin);
/* Polls a non-blocking communicator until the call that returned `r` has finished. Returns its
 * final state (ncclSuccess or an error), or ncclInProgress when `deadline` passed first. */
ncclResult_t ctnccl_settle(ncclComm_t nc, ncclResult_t r, double deadline);
/* After an NCCL call on g that returned r: CT_OK once it has settled; otherwise aborts g and sets
 * the error ("<what>: ..." or the timeout message). */
ct_status ctnccl_group_settle(ctnccl *c, ctnccl_group *g, ncclResult_t r, const char *what);
/* Wraps a ready communicator: rank, size, stream, scratch; links it into c->groups. */
ct_status ctnccl_group_open(ctnccl *c, ncclComm_t nc, const char *name, ctnccl_group **out);
/* finalize = 1: flush and destroy (bounded; aborts on timeout); 0: abort. Frees g. */
void ctnccl_group_close(ctnccl *c, ctnccl_group *g, int finalize);
void ctnccl_group_abort(ctnccl_group *g);
/* Sets the host error "<what>: <NCCL error> (<last NCCL message>)" and returns the ct_status. */
ct_status ctnccl_error(ctnccl *c, const char *what, ncclResult_t r, ncclComm_t nc);
ct_status ctnccl_cuda_error(ctnccl *c, const char *what, cudaError_t e);
/* The message of a CT_ERR_TIMEOUT, in the words of comm.h. */
void ctnccl_timeout_error(ctnccl *c, const char *what);
ct_status ctnccl_world(ct_comm *comm, ct_comm_group **group);
ct_status ctnccl_group_rank(ct_comm *comm, ct_comm_group *group, int *rank, int *size);
ct_status ctnccl_split(ct_comm *comm, ct_comm_group *group, int color, int key, const char *name,
                       ct_comm_group **out);
void ctnccl_group_free(ct_comm *comm, ct_comm_group *group);

/* Bound: the group's stream waits for the work queued on c->bound so far (the group's `before`
 * event). Unbound: nothing. `what` names the operation in an error. */
ct_status ctnccl_group_order_after_bound(ctnccl *c, ctnccl_group *g, const char *what);

/* wait.c */
/* Polls r's event until done, a NCCL error or the deadline; bound, then makes c->bound wait for
 * it too; frees r. */
ct_status ctnccl_wait(ctnccl *c, ctnccl_req *r);
ct_status ctnccl_wait_api(ct_comm *comm, ct_comm_request *req);

/* ops.c */
const char *ctnccl_dtype_name(ct_dtype dt);
ct_status ctnccl_all_reduce(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                            int64_t count, ct_dtype dt, ct_reduce_op op, ct_comm_request **req);
ct_status ctnccl_all_gather(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                            int64_t count, ct_dtype dt, ct_comm_request **req);
ct_status ctnccl_reduce_scatter(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                                int64_t count, ct_dtype dt, ct_reduce_op op, ct_comm_request **req);
ct_status ctnccl_broadcast(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count,
                           ct_dtype dt, int root, ct_comm_request **req);
ct_status ctnccl_all_to_allv(ct_comm *comm, ct_comm_group *group, const void *send, const int64_t *send_counts,
                             const int64_t *send_offsets, void *recv, const int64_t *recv_counts,
                             const int64_t *recv_offsets, ct_dtype dt, ct_comm_request **req);
ct_status ctnccl_all_to_all(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                            int64_t count, ct_dtype dt, ct_comm_request **req);
ct_status ctnccl_send(ct_comm *comm, ct_comm_group *group, const void *buf, int64_t count,
                      ct_dtype dt, int peer, int tag, ct_comm_request **req);
ct_status ctnccl_recv(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt,
                      int peer, int tag, ct_comm_request **req);
ct_status ctnccl_barrier(ct_comm *comm, ct_comm_group *group);

#endif
