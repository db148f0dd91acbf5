/* ops.c: the operations of the NCCL comm plugin. Each checks its arguments, (bound) makes the
 * group's stream wait for the compute stream, enqueues the NCCL call on the group's stream, waits
 * for the (non-blocking) call to settle, records an event after it and either hands out the
 * request or waits for it (wait.c).
 *
 * send/recv: NCCL matches point-to-point transfers between two ranks in the order they are
 * posted, not by tag; the tag is accepted for the contract and otherwise unused, so a pair of
 * ranks must post its sends and receives in the same order. A send may not complete until the
 * peer's receive runs, so an exchange posts send-then-recv on one side and recv-then-send on the
 * other (or uses all_to_all).
 */
#include "nccl_comm.h"

#include <stdio.h>
#include <stdlib.h>

const char *ctnccl_dtype_name(ct_dtype dt) {
    switch (dt) {
    case CT_F32: return "f32";
    case CT_BF16: return "bf16";
    case CT_F8_E4M3: return "fp8_e4m3";
    case CT_F8_E5M2: return "fp8_e5m2";
    case CT_I32: return "i32";
    case CT_F64: return "f64";
    default: return "?";
    }
}

/* What an operation needs once its arguments are checked. */
typedef struct op {
    ncclDataType_t type;
    ncclRedOp_t red;
    ctnccl_req *req; /* allocated before the launch, so the launch cannot be followed by NOMEM */
} op;

/* The NCCL type that carries dt. Moves of fp8 go as bytes (no GPU-generation question for a
 * copy); reductions of fp8 need NCCL's fp8 types (NCCL >= 2.24, and a GPU NCCL reduces fp8 on). */
static int nccl_type(const ctnccl *c, ct_dtype dt, int reduce, ncclDataType_t *t) {
    switch (dt) {
    case CT_F32: *t = ncclFloat32; return 1;
    case CT_BF16: *t = ncclBfloat16; return 1;
    case CT_I32: *t = ncclInt32; return 1;
    case CT_F64: *t = ncclFloat64; return 1;
    case CT_F8_E4M3:
    case CT_F8_E5M2:
        *t = ncclUint8;
        if (!reduce)
            return 1;
#if CTNCCL_HAS_FP8
        if (c->nccl_version >= NCCL_VERSION(2, 24, 0)) {
            *t = dt == CT_F8_E4M3 ? ncclFloat8e4m3 : ncclFloat8e5m2;
            return 1;
        }
#else
        (void)c;
#endif
        return 0;
    default: return 0;
    }
}

enum { MOVE = -1 }; /* the `reduce` of an operation that only moves data */

/* Checks what every operation shares, writes its description into o->req->what and allocates the
 * request. `reduce` is MOVE or the ct_reduce_op; `peer_word` ("to", "from", "from root") goes with
 * `peer`, or is NULL. */
static ct_status op_begin(ctnccl *c, ctnccl_group *g, const char *name, int64_t count, ct_dtype dt, int reduce,
                          const char *peer_word, int peer, op *o) {
    const ct_host *h = c->host;
    if (!g) {
        h->set_error(h, "%s: NULL group", name);
        return CT_ERR_INVALID;
    }
    char what[sizeof o->req->what];
    if (peer_word)
        snprintf(what, sizeof what, "%s of %lld %s %s rank %d on group %s (rank %d of %d)", name, (long long)count,
                 ctnccl_dtype_name(dt), peer_word, peer, g->name, g->rank, g->size);
    else
        snprintf(what, sizeof what, "%s of %lld %s on group %s (rank %d of %d)", name, (long long)count,
                 ctnccl_dtype_name(dt), g->name, g->rank, g->size);
    if (g->aborted) {
        h->set_error(h, "%s: the group was aborted after an earlier error or timeout", what);
        return CT_ERR_INVALID;
    }
    if (count < 0) {
        h->set_error(h, "%s: negative count", what);
        return CT_ERR_INVALID;
    }
    if (ct_dtype_size(dt) == 0) {
        h->set_error(h, "%s: unknown dtype %d", what, (int)dt);
        return CT_ERR_INVALID;
    }
    if (!nccl_type(c, dt, reduce != MOVE, &o->type)) {
        h->set_error(h, "%s: NCCL %d cannot reduce %s (fp8 needs 2.24 or newer)", what, c->nccl_version,
                     ctnccl_dtype_name(dt));
        return CT_ERR_UNSUPPORTED;
    }
    switch (reduce) {
    case MOVE: break;
    case CT_REDUCE_SUM: o->red = ncclSum; break;
    case CT_REDUCE_MAX: o->red = ncclMax; break;
    case CT_REDUCE_MIN: o->red = ncclMin; break;
    default: h->set_error(h, "%s: unknown reduce op %d", what, reduce); return CT_ERR_INVALID;
    }
    if (peer_word && (peer < 0 || peer >= g->size)) {
        h->set_error(h, "%s: rank %d is outside the group (0..%d)", what, peer, g->size - 1);
        return CT_ERR_INVALID;
    }
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess)
        return ctnccl_cuda_error(c, what, e);
    o->req = calloc(1, sizeof *o->req);
    if (!o->req)
        return CT_ERR_NOMEM;
    snprintf(o->req->what, sizeof o->req->what, "%s", what);
    o->req->g = g;
    if (count > 0) {
        e = cudaEventCreateWithFlags(&o->req->done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            free(o->req);
            return ctnccl_cuda_error(c, what, e);
        }
        ct_status st = ctnccl_group_order_after_bound(c, g, what);
        if (st) {
            cudaEventDestroy(o->req->done);
            free(o->req);
            return st;
        }
    }
    return CT_OK;
}

/* A buffer that must be there when count > 0. */
static ct_status need(ctnccl *c, op *o, int64_t count, const void *a, const void *b) {
    if (count == 0 || (a && b))
        return CT_OK;
    c->host->set_error(c->host, "%s: NULL buffer", o->req->what);
    if (o->req->done)
        cudaEventDestroy(o->req->done);
    free(o->req);
    return CT_ERR_INVALID;
}

/* After the NCCL call (or calls) returned r: settle, record the event, hand out or wait. */
static ct_status op_end(ctnccl *c, ctnccl_group *g, op *o, ncclResult_t r, ct_comm_request **req) {
    ctnccl_req *q = o->req;
    ct_status st = CT_OK;
    if (q->done) {
        st = ctnccl_group_settle(c, g, r, q->what);
        if (!st) {
            cudaError_t e = cudaEventRecord(q->done, g->stream);
            if (e != cudaSuccess)
                st = ctnccl_cuda_error(c, q->what, e);
        }
    }
    if (st) {
        if (q->done)
            cudaEventDestroy(q->done);
        free(q);
        return st;
    }
    if (req) {
        *req = q;
        return CT_OK;
    }
    return ctnccl_wait(c, q);
}

ct_status ctnccl_all_reduce(ct_comm *comm, ct_comm_group *group, const void *send, void *recv, int64_t count,
                            ct_dtype dt, ct_reduce_op rop, ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    ct_status st = op_begin(c, g, "all_reduce", count, dt, (int)rop, NULL, 0, &o);
    if (st || (st = need(c, &o, count, send, recv)))
        return st;
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = ncclAllReduce(send, recv, (size_t)count, o.type, o.red, g->nc, g->stream);
    return op_end(c, g, &o, r, req);
}

ct_status ctnccl_all_gather(ct_comm *comm, ct_comm_group *group, const void *send, void *recv, int64_t count,
                            ct_dtype dt, ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    ct_status st = op_begin(c, g, "all_gather", count, dt, MOVE, NULL, 0, &o);
    if (st || (st = need(c, &o, count, send, recv)))
        return st;
    ncclResult_t r = ncclSuccess;
    if (count > 0) /* count is per rank: recv holds size * count */
        r = ncclAllGather(send, recv, (size_t)count, o.type, g->nc, g->stream);
    return op_end(c, g, &o, r, req);
}

ct_status ctnccl_reduce_scatter(ct_comm *comm, ct_comm_group *group, const void *send, void *recv,
                                int64_t count, ct_dtype dt, ct_reduce_op rop, ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    ct_status st = op_begin(c, g, "reduce_scatter", count, dt, (int)rop, NULL, 0, &o);
    if (st || (st = need(c, &o, count, send, recv)))
        return st;
    ncclResult_t r = ncclSuccess;
    if (count > 0) /* count is what each rank receives: send holds size * count */
        r = ncclReduceScatter(send, recv, (size_t)count, o.type, o.red, g->nc, g->stream);
    return op_end(c, g, &o, r, req);
}

ct_status ctnccl_broadcast(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt, int root,
                           ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    ct_status st = op_begin(c, g, "broadcast", count, dt, MOVE, "from root", root, &o);
    if (st || (st = need(c, &o, count, buf, buf)))
        return st;
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = ncclBroadcast(buf, buf, (size_t)count, o.type, root, g->nc, g->stream);
    return op_end(c, g, &o, r, req);
}

ct_status ctnccl_all_to_all(ct_comm *comm, ct_comm_group *group, const void *send, void *recv, int64_t count,
                            ct_dtype dt, ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    ct_status st = op_begin(c, g, "all_to_all", count, dt, MOVE, NULL, 0, &o);
    if (st || (st = need(c, &o, count, send, recv)))
        return st;
    ncclResult_t r = ncclSuccess;
    if (count > 0) {
        /* One group of size sends and size receives: NCCL starts them together, so no pair waits
         * on another (block j of send goes to rank j; block j of recv comes from rank j). */
        size_t block = (size_t)count * ct_dtype_size(dt);
        r = ncclGroupStart();
        for (int j = 0; j < g->size && r == ncclSuccess; j++) {
            r = ncclSend((const char *)send + (size_t)j * block, (size_t)count, o.type, j, g->nc, g->stream);
            if (r == ncclSuccess)
                r = ncclRecv((char *)recv + (size_t)j * block, (size_t)count, o.type, j, g->nc, g->stream);
        }
        ncclResult_t end = ncclGroupEnd(); /* always closes the group, even after an error */
        if (r == ncclSuccess)
            r = end;
    }
    return op_end(c, g, &o, r, req);
}

/* ABI 2.17: the same grouped sends and receives, each pair with its own count and offset. */
ct_status ctnccl_all_to_allv(ct_comm *comm, ct_comm_group *group, const void *send, const int64_t *send_counts,
                             const int64_t *send_offsets, void *recv, const int64_t *recv_counts,
                             const int64_t *recv_offsets, ct_dtype dt, ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    int64_t sent = 0;
    if (g && (!send_counts || !send_offsets || !recv_counts || !recv_offsets)) {
        c->host->set_error(c->host, "all_to_allv on group %s: NULL counts or offsets", g->name);
        return CT_ERR_INVALID;
    }
    for (int j = 0; g && j < g->size; j++) {
        if (send_counts[j] < 0 || send_offsets[j] < 0 || recv_counts[j] < 0 || recv_offsets[j] < 0) {
            c->host->set_error(c->host, "all_to_allv on group %s: rank %d's count or offset is negative", g->name, j);
            return CT_ERR_INVALID;
        }
        sent += send_counts[j];
    }
    ct_status st = op_begin(c, g, "all_to_allv", sent, dt, MOVE, NULL, 0, &o);
    if (st) return st;
    size_t sz = ct_dtype_size(dt);
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < g->size && r == ncclSuccess; j++) {
        if (send_counts[j])
            r = ncclSend((const char *)send + (size_t)send_offsets[j] * sz, (size_t)send_counts[j], o.type, j, g->nc,
                         g->stream);
        if (r == ncclSuccess && recv_counts[j])
            r = ncclRecv((char *)recv + (size_t)recv_offsets[j] * sz, (size_t)recv_counts[j], o.type, j, g->nc,
                         g->stream);
    }
    ncclResult_t end = ncclGroupEnd(); /* always closes the group, even after an error */
    if (r == ncclSuccess) r = end;
    return op_end(c, g, &o, r, req);
}

ct_status ctnccl_send(ct_comm *comm, ct_comm_group *group, const void *buf, int64_t count, ct_dtype dt, int peer,
                      int tag, ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    (void)tag; /* NCCL pairs by posting order (see the top of this file) */
    ct_status st = op_begin(c, g, "send", count, dt, MOVE, "to", peer, &o);
    if (st || (st = need(c, &o, count, buf, buf)))
        return st;
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = ncclSend(buf, (size_t)count, o.type, peer, g->nc, g->stream);
    return op_end(c, g, &o, r, req);
}

ct_status ctnccl_recv(ct_comm *comm, ct_comm_group *group, void *buf, int64_t count, ct_dtype dt, int peer,
                      int tag, ct_comm_request **req) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    (void)tag;
    ct_status st = op_begin(c, g, "recv", count, dt, MOVE, "from", peer, &o);
    if (st || (st = need(c, &o, count, buf, buf)))
        return st;
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = ncclRecv(buf, (size_t)count, o.type, peer, g->nc, g->stream);
    return op_end(c, g, &o, r, req);
}

/* An all_reduce of one int on the group's scratch buffer: returns when every rank has reached it. */
ct_status ctnccl_barrier(ct_comm *comm, ct_comm_group *group) {
    ctnccl *c = comm;
    ctnccl_group *g = group;
    op o = {0};
    ct_status st = op_begin(c, g, "barrier", 1, CT_I32, CT_REDUCE_SUM, NULL, 0, &o);
    if (st)
        return st;
    ncclResult_t r = ncclAllReduce(g->scratch, g->scratch, 1, ncclInt32, ncclSum, g->nc, g->stream);
    return op_end(c, g, &o, r, NULL);
}
