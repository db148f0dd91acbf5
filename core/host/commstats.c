/* commstats.c: byte counters around the comm plugin's collectives (see commstats.h). */
#include "host/commstats.h"

#include <string.h>

int64_t g_comm_bytes[CS_N];
const char *const commstats_names[CS_N] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
                                           "send"};
static const ct_comm_api *real;
static ct_comm_api wrapped;

#define BYTES(count, dt) ((count) * (int64_t)ct_dtype_size(dt))

static ct_status w_all_reduce(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                              ct_reduce_op op, ct_comm_request **req) {
    g_comm_bytes[CS_ALL_REDUCE] += BYTES(n, dt);
    return real->all_reduce(c, g, s, r, n, dt, op, req);
}
static ct_status w_all_gather(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                              ct_comm_request **req) {
    g_comm_bytes[CS_ALL_GATHER] += BYTES(n, dt);
    return real->all_gather(c, g, s, r, n, dt, req);
}
static ct_status w_reduce_scatter(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                                  ct_reduce_op op, ct_comm_request **req) {
    int rank = 0, size = 1;
    real->group_rank(c, g, &rank, &size);
    g_comm_bytes[CS_REDUCE_SCATTER] += BYTES(n, dt) * size;
    return real->reduce_scatter(c, g, s, r, n, dt, op, req);
}
static ct_status w_broadcast(ct_comm *c, ct_comm_group *g, void *b, int64_t n, ct_dtype dt, int root,
                             ct_comm_request **req) {
    g_comm_bytes[CS_BROADCAST] += BYTES(n, dt);
    return real->broadcast(c, g, b, n, dt, root, req);
}
static ct_status w_all_to_all(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                              ct_comm_request **req) {
    int rank = 0, size = 1;
    real->group_rank(c, g, &rank, &size);
    g_comm_bytes[CS_ALL_TO_ALL] += BYTES(n, dt) * size;
    return real->all_to_all(c, g, s, r, n, dt, req);
}
static ct_status w_send(ct_comm *c, ct_comm_group *g, const void *b, int64_t n, ct_dtype dt, int peer, int tag,
                        ct_comm_request **req) {
    g_comm_bytes[CS_SEND] += BYTES(n, dt);
    return real->send(c, g, b, n, dt, peer, tag, req);
}

const ct_comm_api *commstats_wrap(const ct_comm_api *r) {
    real = r;
    memset(&wrapped, 0, sizeof wrapped);
    memcpy(&wrapped, r, r->struct_size < sizeof wrapped ? r->struct_size : sizeof wrapped); /* an older table is shorter */
    wrapped.all_reduce = w_all_reduce;
    wrapped.all_gather = w_all_gather;
    wrapped.reduce_scatter = w_reduce_scatter;
    wrapped.broadcast = w_broadcast;
    wrapped.all_to_all = w_all_to_all;
    wrapped.send = w_send;
    return &wrapped;
}
