/* commstats.c: byte counters around the comm plugin's collectives (see commstats.h). */
#include "host/commstats.h"

#include "host/trace.h"

#include <stdio.h>
#include <string.h>

int64_t g_comm_bytes[CS_N];
const char *const commstats_names[CS_N] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
                                           "send"};
static const ct_comm_api *real;
static ct_comm_api wrapped;

#define BYTES(count, dt) ((count) * (int64_t)ct_dtype_size(dt))

/* Mesh groups by name, so a traced collective says its axis. */
#define NAMED_MAX 16
static struct {
    const ct_comm_group *g;
    const char *name;
} named[NAMED_MAX];
static int n_named;

void commstats_name_group(const ct_comm_group *g, const char *name) {
    for (int i = 0; i < n_named; i++)
        if (named[i].g == g) {
            named[i].name = name;
            return;
        }
    if (g && n_named < NAMED_MAX) named[n_named++].g = g, named[n_named - 1].name = name;
}

static const char *axis_of(const ct_comm_group *g) {
    for (int i = 0; i < n_named; i++)
        if (named[i].g == g) return named[i].name;
    return "world";
}

/* Each call a complete event: a blocking call's time, or an async one's issue (req set). */
static void traced(int kind, const ct_comm_group *g, int64_t bytes, int async, double t0) {
    char args[160];
    snprintf(args, sizeof args, "{\"kind\":\"%s\",\"axis\":\"%s\",\"bytes\":%lld,\"async\":%s}",
             commstats_names[kind], axis_of(g), (long long)bytes, async ? "true" : "false");
    trace_complete(commstats_names[kind], "collective", t0, args);
}

#define TRACED(kind, g, bytes, req, call)                                                                              \
    do {                                                                                                               \
        g_comm_bytes[kind] += (bytes);                                                                                 \
        if (!trace_active()) return call;                                                                              \
        double t0_ = trace_now_us();                                                                                   \
        ct_status st_ = call;                                                                                          \
        traced(kind, g, bytes, (req) != NULL, t0_);                                                                    \
        return st_;                                                                                                    \
    } while (0)

static ct_status w_all_reduce(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                              ct_reduce_op op, ct_comm_request **req) {
    TRACED(CS_ALL_REDUCE, g, BYTES(n, dt), req, real->all_reduce(c, g, s, r, n, dt, op, req));
}
static ct_status w_all_gather(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                              ct_comm_request **req) {
    TRACED(CS_ALL_GATHER, g, BYTES(n, dt), req, real->all_gather(c, g, s, r, n, dt, req));
}
static ct_status w_reduce_scatter(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                                  ct_reduce_op op, ct_comm_request **req) {
    int rank = 0, size = 1;
    real->group_rank(c, g, &rank, &size);
    TRACED(CS_REDUCE_SCATTER, g, BYTES(n, dt) * size, req, real->reduce_scatter(c, g, s, r, n, dt, op, req));
}
static ct_status w_broadcast(ct_comm *c, ct_comm_group *g, void *b, int64_t n, ct_dtype dt, int root,
                             ct_comm_request **req) {
    TRACED(CS_BROADCAST, g, BYTES(n, dt), req, real->broadcast(c, g, b, n, dt, root, req));
}
static ct_status w_all_to_all(ct_comm *c, ct_comm_group *g, const void *s, void *r, int64_t n, ct_dtype dt,
                              ct_comm_request **req) {
    int rank = 0, size = 1;
    real->group_rank(c, g, &rank, &size);
    TRACED(CS_ALL_TO_ALL, g, BYTES(n, dt) * size, req, real->all_to_all(c, g, s, r, n, dt, req));
}
/* ABI 2.17: the bytes this rank sends */
static ct_status w_all_to_allv(ct_comm *c, ct_comm_group *g, const void *s, const int64_t *sc, const int64_t *so,
                               void *r, const int64_t *rc, const int64_t *ro, ct_dtype dt, ct_comm_request **req) {
    int rank = 0, size = 1;
    real->group_rank(c, g, &rank, &size);
    int64_t n = 0;
    for (int j = 0; j < size; j++) n += sc[j];
    TRACED(CS_ALL_TO_ALL, g, BYTES(n, dt), req, real->all_to_allv(c, g, s, sc, so, r, rc, ro, dt, req));
}
static ct_status w_send(ct_comm *c, ct_comm_group *g, const void *b, int64_t n, ct_dtype dt, int peer, int tag,
                        ct_comm_request **req) {
    TRACED(CS_SEND, g, BYTES(n, dt), req, real->send(c, g, b, n, dt, peer, tag, req));
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
    if (CT_HAS_FIELD(r, ct_comm_api, all_to_allv) && r->all_to_allv) wrapped.all_to_allv = w_all_to_allv;
    return &wrapped;
}
