/* collectives.c: each ct_comm_api operation as its non-blocking MPI call.
 *
 * Every function validates its arguments locally (so a bad call fails on the rank that made it
 * without sending anything), starts the MPI call, and hands the request to ctmpi_finish: returned
 * to the caller when it passed `req`, completed within the timeout otherwise.
 *
 * In place: all_reduce and all_to_all with send == recv; all_gather with send at this rank's
 * block of recv (send == recv + rank * count, MPI's convention); reduce_scatter with recv == send
 * (the result lands in the first `count` elements). Any other overlap is an error.
 */
#include "mpi_comm.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Sets "<operation description>: <detail>" as the error, frees r, returns st. */
__attribute__((format(printf, 4, 5))) static ct_status op_error(ctmpi *c, ctmpi_req *r,
                                                                 ct_status st, const char *fmt,
                                                                 ...)
{
    char what[256], detail[256];
    ctmpi_describe(r, what, sizeof what);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    c->host->set_error(c->host, "%s: %s", what, detail);
    free(r);
    return st;
}

/* What every operation checks first; on success *out is its request and *type its MPI type. */
static ct_status op_begin(ctmpi *c, ct_comm_group *group, const char *op, int64_t count, ct_dtype dt,
                          ct_comm_request **req, ctmpi_req **out, MPI_Datatype *type)
{
    if (req)
        *req = NULL;
    if (!group) {
        c->host->set_error(c->host, "%s: NULL group", op);
        return CT_ERR_INVALID;
    }
    ctmpi_req *r = ctmpi_req_new(group, op, count, dt);
    if (!r) {
        c->host->set_error(c->host, "%s: out of memory for a request", op);
        return CT_ERR_NOMEM;
    }
    if (count < 0)
        return op_error(c, r, CT_ERR_INVALID, "negative count");
    if (count > INT_MAX)
        return op_error(c, r, CT_ERR_UNSUPPORTED,
                        "more than %d elements in one call (MPI counts are int); split the buffer",
                        INT_MAX);
    if (!ctmpi_dtype_type(dt, type))
        return op_error(c, r, CT_ERR_INVALID, "dtype %d is not a ct_dtype", (int)dt);
    *out = r;
    return CT_OK;
}

static ct_status op_reduce_types(ctmpi *c, ctmpi_req *r, ct_reduce_op op, MPI_Datatype *type,
                                 MPI_Op *mop)
{
    char what[256];
    ctmpi_describe(r, what, sizeof what);
    ct_status st = ctmpi_reduce_types(c, what, r->dt, op, type, mop);
    if (st)
        free(r);
    return st;
}

static int overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

ct_status ctmpi_all_reduce(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                           int64_t count, ct_dtype dt, ct_reduce_op op, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    MPI_Op mop;
    ct_status st = op_begin(c, group, "all_reduce", count, dt, req, &r, &type);
    if (st || (st = op_reduce_types(c, r, op, &type, &mop)))
        return st;
    size_t bytes = (size_t)count * ct_dtype_size(dt);
    if (count && (!send || !recv))
        return op_error(c, r, CT_ERR_INVALID, "NULL buffer");
    if (send != recv && overlap(send, bytes, recv, bytes))
        return op_error(c, r, CT_ERR_INVALID, "send and recv overlap (in place is send == recv)");
    ctmpi_group *g = group;
    int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, type, mop, g->comm,
                            &r->req);
    return ctmpi_finish(c, r, rc, req);
}

ct_status ctmpi_all_gather(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                           int64_t count, ct_dtype dt, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    ct_status st = op_begin(c, group, "all_gather", count, dt, req, &r, &type);
    if (st)
        return st;
    ctmpi_group *g = group;
    size_t block = (size_t)count * ct_dtype_size(dt);
    if (count && (!send || !recv))
        return op_error(c, r, CT_ERR_INVALID, "NULL buffer");
    int in_place = count && (const char *)send == (const char *)recv + (size_t)g->rank * block;
    if (!in_place && overlap(send, block, recv, block * (size_t)g->size))
        return op_error(c, r, CT_ERR_INVALID,
                        "send overlaps recv but is not this rank's block of it (in place is send "
                        "== recv + rank * count)");
    int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)count, type, recv, (int)count, type,
                            g->comm, &r->req);
    return ctmpi_finish(c, r, rc, req);
}

ct_status ctmpi_reduce_scatter(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                               int64_t count, ct_dtype dt, ct_reduce_op op, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    MPI_Op mop;
    ct_status st = op_begin(c, group, "reduce_scatter", count, dt, req, &r, &type);
    if (st || (st = op_reduce_types(c, r, op, &type, &mop)))
        return st;
    ctmpi_group *g = group;
    size_t block = (size_t)count * ct_dtype_size(dt);
    if (count && (!send || !recv))
        return op_error(c, r, CT_ERR_INVALID, "NULL buffer");
    if (send != recv && overlap(send, block * (size_t)g->size, recv, block))
        return op_error(c, r, CT_ERR_INVALID, "send and recv overlap (in place is recv == send)");
    /* In place, MPI reads all size * count inputs from recv and writes the result to its start. */
    int rc = MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, (int)count, type,
                                       mop, g->comm, &r->req);
    return ctmpi_finish(c, r, rc, req);
}

ct_status ctmpi_broadcast(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt,
                          int root, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    ct_status st = op_begin(c, group, "broadcast", count, dt, req, &r, &type);
    if (st)
        return st;
    ctmpi_group *g = group;
    r->peer_word = "from";
    r->peer = root;
    if (root < 0 || root >= g->size)
        return op_error(c, r, CT_ERR_INVALID, "root out of range [0, %d)", g->size);
    if (count && !buf)
        return op_error(c, r, CT_ERR_INVALID, "NULL buffer");
    int rc = MPI_Ibcast(buf, (int)count, type, root, g->comm, &r->req);
    return ctmpi_finish(c, r, rc, req);
}

ct_status ctmpi_all_to_all(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                           int64_t count, ct_dtype dt, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    ct_status st = op_begin(c, group, "all_to_all", count, dt, req, &r, &type);
    if (st)
        return st;
    ctmpi_group *g = group;
    size_t bytes = (size_t)count * ct_dtype_size(dt) * (size_t)g->size;
    if (count && (!send || !recv))
        return op_error(c, r, CT_ERR_INVALID, "NULL buffer");
    if (send != recv && overlap(send, bytes, recv, bytes))
        return op_error(c, r, CT_ERR_INVALID, "send and recv overlap (in place is send == recv)");
    int rc = MPI_Ialltoall(send == recv ? MPI_IN_PLACE : send, (int)count, type, recv, (int)count,
                           type, g->comm, &r->req);
    return ctmpi_finish(c, r, rc, req);
}

/* ABI 2.17. MPI's counts and displacements are ints, and a started MPI_Ialltoallv reads them until it
 * completes (an abandoned one, until the job ends): they live at the end of the request, freed with it. */
ct_status ctmpi_all_to_allv(ct_comm *comm, ct_comm_group *group, const void *send, const int64_t *send_counts,
                            const int64_t *send_offsets, void *recv, const int64_t *recv_counts,
                            const int64_t *recv_offsets, ct_dtype dt, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    ct_status st = op_begin(c, group, "all_to_allv", 0, dt, req, &r, &type);
    if (st)
        return st;
    ctmpi_group *g = group;
    if (!send_counts || !send_offsets || !recv_counts || !recv_offsets)
        return op_error(c, r, CT_ERR_INVALID, "NULL counts or offsets");
    ctmpi_req *grown = realloc(r, sizeof *r + 4 * sizeof(int) * (size_t)g->size);
    if (!grown)
        return op_error(c, r, CT_ERR_NOMEM, "out of memory for %d ranks' counts", g->size);
    r = grown;
    int *v = (int *)(r + 1), *sc = v, *sd = v + g->size, *rc = v + 2 * g->size, *rd = v + 3 * g->size;
    int64_t sent = 0, got = 0, send_end = 0, recv_end = 0;
    for (int j = 0; j < g->size; j++) {
        const int64_t a[4] = {send_counts[j], send_offsets[j], recv_counts[j], recv_offsets[j]};
        for (int k = 0; k < 4; k++)
            if (a[k] < 0 || a[k] > INT_MAX)
                return op_error(c, r, a[k] < 0 ? CT_ERR_INVALID : CT_ERR_UNSUPPORTED,
                                "rank %d's count or offset %lld is negative or above %d (MPI counts are int)", j,
                                (long long)a[k], INT_MAX);
        sc[j] = (int)a[0], sd[j] = (int)a[1], rc[j] = (int)a[2], rd[j] = (int)a[3];
        sent += a[0], got += a[2];
        if (a[0] + a[1] > send_end)
            send_end = a[0] + a[1];
        if (a[2] + a[3] > recv_end)
            recv_end = a[2] + a[3];
    }
    r->count = sent;
    size_t sz = ct_dtype_size(dt);
    if ((send_end && !send) || (recv_end && !recv))
        return op_error(c, r, CT_ERR_INVALID, "NULL buffer");
    if (send_end && recv_end && overlap(send, (size_t)send_end * sz, recv, (size_t)recv_end * sz))
        return op_error(c, r, CT_ERR_INVALID, "send and recv overlap");
    (void)got;
    int rc_ = MPI_Ialltoallv(send, sc, sd, type, recv, rc, rd, type, g->comm, &r->req);
    return ctmpi_finish(c, r, rc_, req);
}

/* send and recv: the peer is a rank of the group; tags are MPI's (0 .. MPI_TAG_UB, at least
 * 32767). On error r is freed. */
static ct_status check_peer(ctmpi *c, ctmpi_req *r, const void *buf, int peer, int tag)
{
    if (peer < 0 || peer >= r->size)
        return op_error(c, r, CT_ERR_INVALID, "peer out of range [0, %d)", r->size);
    if (tag < 0 || tag > c->tag_ub)
        return op_error(c, r, CT_ERR_INVALID, "tag %d out of range [0, %d]", tag, c->tag_ub);
    if (r->count && !buf)
        return op_error(c, r, CT_ERR_INVALID, "NULL buffer");
    return CT_OK;
}

ct_status ctmpi_send(ct_comm *comm, ct_comm_group *group, const void *buf, int64_t count,
                     ct_dtype dt, int peer, int tag, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    ct_status st = op_begin(c, group, "send", count, dt, req, &r, &type);
    if (st)
        return st;
    r->peer_word = "to";
    r->peer = peer;
    if ((st = check_peer(c, r, buf, peer, tag)))
        return st;
    ctmpi_group *g = group;
    int rc = MPI_Isend(buf, (int)count, type, peer, tag, g->comm, &r->req);
    return ctmpi_finish(c, r, rc, req);
}

ct_status ctmpi_recv(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt,
                     int peer, int tag, ct_comm_request **req)
{
    ctmpi *c = comm;
    ctmpi_req *r;
    MPI_Datatype type;
    ct_status st = op_begin(c, group, "recv", count, dt, req, &r, &type);
    if (st)
        return st;
    r->peer_word = "from";
    r->peer = peer;
    if ((st = check_peer(c, r, buf, peer, tag)))
        return st;
    ctmpi_group *g = group;
    int rc = MPI_Irecv(buf, (int)count, type, peer, tag, g->comm, &r->req);
    return ctmpi_finish(c, r, rc, req);
}

ct_status ctmpi_barrier(ct_comm *comm, ct_comm_group *group)
{
    ctmpi *c = comm;
    if (!group) {
        c->host->set_error(c->host, "barrier: NULL group");
        return CT_ERR_INVALID;
    }
    ctmpi_group *g = group;
    ctmpi_req *r = ctmpi_req_new(g, "barrier", 0, (ct_dtype)0);
    if (!r) {
        c->host->set_error(c->host, "barrier: out of memory for a request");
        return CT_ERR_NOMEM;
    }
    int rc = MPI_Ibarrier(g->comm, &r->req);
    return ctmpi_finish(c, r, rc, NULL);
}
