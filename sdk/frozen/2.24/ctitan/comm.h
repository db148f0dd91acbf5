/* ctitan/comm.h: the communication interface (plugin kind CT_KIND_COMM).
 *
 * A comm plugin moves tensors between the ranks of a job: MPI for host memory (plugins/mpi), NCCL
 * for GPU memory (plugins/nccl). The host creates it once per process, takes the world group, and
 * splits sub-groups from it (one per mesh axis). Buffers live in the memory of the device the
 * plugin serves (host memory for MPI, device memory for NCCL).
 *
 * Contract:
 *  - Every collective is called by every rank of the group, in the same order.
 *  - `req == NULL`: the call returns when the operation is complete. `req != NULL`: the call starts
 *    the operation and stores a handle in *req; `wait` completes it (and frees the handle): the
 *    ct_comm_request belongs to the comm and is valid until that wait. Buffers must not be touched
 *    between the start and the wait.
 *  - Nothing waits forever: a blocking call or `wait` that does not complete within the plugin's
 *    `train_timeout_seconds` option returns CT_ERR_TIMEOUT with a message naming the operation, the
 *    group and the count ("all_reduce of 4096 f32 on group dp (rank 1 of 4): no completion within
 *    30 s; a rank died or is stuck"). The host then calls `abort`, which ends every rank of the job.
 *  - After a timeout the handle is gone (wait took it back) but the operation may still write its
 *    buffers until the job is aborted: treat them as lost.
 *  - Reductions SUM/MAX/MIN only: there is no implicit averaging; the host normalises.
 *  - Results are deterministic for a fixed group size and layout.
 * `send`/`recv` pair by (peer, tag) within a group.
 */
#ifndef CTITAN_COMM_H
#define CTITAN_COMM_H

#include "ctitan/abi.h"
#include "ctitan/host.h"
#include "ctitan/tensor.h"

typedef enum ct_reduce_op { CT_REDUCE_SUM = 1, CT_REDUCE_MAX = 2, CT_REDUCE_MIN = 3 } ct_reduce_op;

typedef struct ct_comm_api {
    size_t struct_size;
    /* Joins the job (MPI_Init_thread, NCCL bootstrap). world_rank/size identify this process.
     * *comm is the caller's until destroy. */
    ct_status (*create)(const ct_host *host, ct_comm **comm);
    /* Leaves the job cleanly (every rank calls it). */
    void (*destroy)(ct_comm *comm);
    /* The group of every rank. Owned by the comm until its destroy; never freed by the caller. */
    ct_status (*world)(ct_comm *comm, ct_comm_group **group);
    ct_status (*group_rank)(ct_comm *comm, ct_comm_group *group, int *rank, int *size);
    /* Collective over `group`: ranks with the same color form a new group, ordered by key. The comm
     * copies `name` (for messages). *out is the caller's until group_free (before destroy). */
    ct_status (*split)(ct_comm *comm, ct_comm_group *group, int color, int key, const char *name,
                       ct_comm_group **out);
    void (*group_free)(ct_comm *comm, ct_comm_group *group);

    /* recv (count) = op over ranks of send (count); send == recv is in place. */
    ct_status (*all_reduce)(ct_comm *comm, ct_comm_group *group, const void *send, void *recv, int64_t count,
                            ct_dtype dt, ct_reduce_op op, ct_comm_request **req);
    /* recv (size * count) = every rank's send (count), in rank order. */
    ct_status (*all_gather)(ct_comm *comm, ct_comm_group *group, const void *send, void *recv, int64_t count,
                            ct_dtype dt, ct_comm_request **req);
    /* recv (count) = op over ranks of send[rank * count .. (rank + 1) * count). send is (size * count). */
    ct_status (*reduce_scatter)(ct_comm *comm, ct_comm_group *group, const void *send, void *recv, int64_t count,
                                ct_dtype dt, ct_reduce_op op, ct_comm_request **req);
    ct_status (*broadcast)(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt, int root,
                           ct_comm_request **req);
    /* send (size * count): block j goes to rank j; recv (size * count): block j came from rank j. */
    ct_status (*all_to_all)(ct_comm *comm, ct_comm_group *group, const void *send, void *recv, int64_t count,
                            ct_dtype dt, ct_comm_request **req);
    ct_status (*send)(ct_comm *comm, ct_comm_group *group, const void *buf, int64_t count, ct_dtype dt, int peer,
                      int tag, ct_comm_request **req);
    ct_status (*recv)(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt, int peer,
                      int tag, ct_comm_request **req);
    ct_status (*barrier)(ct_comm *comm, ct_comm_group *group);
    /* Completes a started operation (bounded by the timeout) and frees the handle. */
    ct_status (*wait)(ct_comm *comm, ct_comm_request *req);
    /* Ends every rank of the job with exit status `code` (after an unrecoverable error). */
    void (*abort)(ct_comm *comm, int code);
    /* Optional: moves a started operation along without blocking (a backend that progresses
     * only inside its calls, like MPI, needs these pokes to overlap work); *done = 1 once it completed.
     * The handle stays valid: wait() still completes and frees it. */
    ct_status (*test)(ct_comm *comm, ct_comm_request *req, int *done);
    /* Optional: the device's compute stream (device.h, share_stream). From now on every
     * operation starts after the work queued on `stream` when it was called (an event recorded there
     * and waited for on the comm's own stream), and wait() (or a blocking call) also makes `stream`
     * wait for the operation, so work queued on it afterwards sees the result. The comm's streams
     * overlap with the compute stream in between. The stream stays the device's; the comm uses it
     * until its destroy, so the device is destroyed after the comm. */
    ct_status (*bind_stream)(ct_comm *comm, ct_stream *stream);
    /* ---- ABI 2.17, optional (NULL: the comm has none; expert parallel needs it) ---- */
    /* The all-to-all with variable splits (MPI_Alltoallv): send_counts[j] elements from send +
     * send_offsets[j] go to rank j; recv_counts[j] elements from rank j land at recv + recv_offsets[j]
     * (offsets in elements). The four arrays hold one value per rank of the group, in host memory, and
     * are the caller's: the comm reads them before the call returns. Rank i's send_counts[j] must equal
     * rank j's recv_counts[i]. send and recv must not overlap. */
    ct_status (*all_to_allv)(ct_comm *comm, ct_comm_group *group, const void *send, const int64_t *send_counts,
                             const int64_t *send_offsets, void *recv, const int64_t *recv_counts,
                             const int64_t *recv_offsets, ct_dtype dt, ct_comm_request **req);
} ct_comm_api;

#endif
