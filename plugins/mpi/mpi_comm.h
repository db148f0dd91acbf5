/* mpi_comm.h: state shared by the files of the MPI comm plugin.
 *
 *   plugin.c       entry, options, create/destroy, groups (world, split, free), abort
 *   collectives.c  argument checks and the non-blocking MPI call behind each operation
 *   wait.c         completion: an MPI_Test loop with a deadline, the timeout message, and the
 *                  operations abandoned by a timeout
 *   dtype.c        ct_dtype -> MPI datatype, and the bf16 reduction ops MPI lacks
 *
 * Every operation is started with the non-blocking MPI call and completed by ctmpi_wait, so no
 * call can block longer than the plugin's train_timeout_seconds.
 */
#ifndef CTITAN_MPI_COMM_H
#define CTITAN_MPI_COMM_H

#include "ctitan/comm.h"

#include <mpi.h>

/* A communicator and what error messages say about it. */
typedef struct ct_comm_group { /* the ABI's opaque ct_comm_group */
    MPI_Comm comm;
    char name[64]; /* "world", or the name split was given (truncated) */
    int rank, size;
} ctmpi_group;

/* One operation in flight, and what its timeout message needs ("all_reduce of 4096 f32 on group
 * dp (rank 1 of 4)"). A snapshot, not a pointer to the group: an abandoned operation can outlive
 * its group. */
typedef struct ct_comm_request { /* the ABI's opaque ct_comm_request */
    MPI_Request req;
    const char *op;       /* "all_reduce", "send", ... (a string literal) */
    int64_t count;        /* elements; with dt == 0 the message shows no count (barrier) */
    ct_dtype dt;
    const char *peer_word; /* "to" / "from" for send, recv, broadcast; NULL for the others */
    int peer;
    char group[64];
    int rank, size;
    struct ct_comm_request *next; /* in ctmpi.abandoned */
} ctmpi_req;

typedef struct ct_comm { /* the ABI's opaque ct_comm */
    const ct_host *host;
    double train_timeout; /* seconds, bounds every blocking call and wait */
    double init_timeout;  /* seconds, bounds the first collective after MPI_Init (see plugin.c) */
    int tag_ub;           /* largest tag MPI accepts (MPI_TAG_UB) */
    ctmpi_group world;    /* a duplicate of MPI_COMM_WORLD, so our traffic never meets the host's */
    MPI_Op bf16_op[3];    /* indexed by ct_reduce_op - 1 */
    /* Operations whose wait timed out: MPI may still complete them (a late rank joins), and a
     * collective request may not be freed before it completes. Tested on every wait, drained by
     * destroy. */
    ctmpi_req *abandoned;
} ctmpi;

/* wait.c */
ctmpi_req *ctmpi_req_new(const ctmpi_group *g, const char *op, int64_t count, ct_dtype dt);
/* Completes r within `timeout` seconds and frees it. On CT_ERR_TIMEOUT r is kept on c->abandoned
 * (its buffers stay in use by MPI); on any return the caller no longer owns r. */
ct_status ctmpi_wait(ctmpi *c, ctmpi_req *r, double timeout);
/* After starting r with MPI status `rc`: the error, or r handed out (req != NULL), or completed. */
ct_status ctmpi_finish(ctmpi *c, ctmpi_req *r, int rc, ct_comm_request **req);
/* Tests every abandoned operation once; frees the completed ones. Returns how many remain. */
int ctmpi_reap(ctmpi *c);
/* Reaps abandoned operations until none is left or `timeout` seconds pass; returns how many are
 * left (those never completed: a rank died or never called them). */
int ctmpi_drain(ctmpi *c, double timeout);
/* "all_reduce of 4096 f32 on group dp (rank 1 of 4)" */
void ctmpi_describe(const ctmpi_req *r, char *buf, size_t len);
/* Sets the host error "<what>: <MPI's error string>" and returns CT_ERR_IO. */
ct_status ctmpi_mpi_error(ctmpi *c, const char *what, int rc);

/* dtype.c */
const char *ctmpi_dtype_name(ct_dtype dt);
/* The MPI type that moves elements of dt (bf16 and fp8 move as 2- and 1-byte integers).
 * 0 when dt is not a ct_dtype. */
int ctmpi_dtype_type(ct_dtype dt, MPI_Datatype *type);
/* The type and op for a reduction of dt; CT_ERR_UNSUPPORTED (message set) for fp8. */
ct_status ctmpi_reduce_types(ctmpi *c, const char *what, ct_dtype dt, ct_reduce_op op,
                             MPI_Datatype *type, MPI_Op *mop);
int ctmpi_bf16_ops_create(MPI_Op ops[3]);
void ctmpi_bf16_ops_free(MPI_Op ops[3]);

/* collectives.c: the ct_comm_api functions that move data */
ct_status ctmpi_all_reduce(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                           int64_t count, ct_dtype dt, ct_reduce_op op, ct_comm_request **req);
ct_status ctmpi_all_gather(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                           int64_t count, ct_dtype dt, ct_comm_request **req);
ct_status ctmpi_reduce_scatter(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                               int64_t count, ct_dtype dt, ct_reduce_op op, ct_comm_request **req);
ct_status ctmpi_broadcast(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count,
                          ct_dtype dt, int root, ct_comm_request **req);
ct_status ctmpi_all_to_allv(ct_comm *comm, ct_comm_group *group, const void *send, const int64_t *send_counts,
                            const int64_t *send_offsets, void *recv, const int64_t *recv_counts,
                            const int64_t *recv_offsets, ct_dtype dt, ct_comm_request **req);
ct_status ctmpi_all_to_all(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                           int64_t count, ct_dtype dt, ct_comm_request **req);
ct_status ctmpi_send(ct_comm *comm, ct_comm_group *group, const void *buf, int64_t count,
                     ct_dtype dt, int peer, int tag, ct_comm_request **req);
ct_status ctmpi_recv(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt,
                     int peer, int tag, ct_comm_request **req);
ct_status ctmpi_barrier(ct_comm *comm, ct_comm_group *group);
ct_status ctmpi_wait_api(ct_comm *comm, ct_comm_request *req);
ct_status ctmpi_test_api(ct_comm *comm, ct_comm_request *req, int *done);

#endif
