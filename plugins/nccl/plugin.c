/* plugin.c: the NCCL comm plugin (CT_KIND_COMM, "nccl"): collectives on GPU memory.
 *
 * create() bootstraps through MPI: it initialises MPI when nobody has (and then finalizes it in
 * destroy), picks this rank's GPU, has rank 0 make the NCCL unique id and broadcasts it, and builds
 * the world communicator. Every step that can fail on one rank only ends in an MPI agreement, so
 * either every rank gets a comm or every rank gets an error (and none hangs in a later collective).
 * The exchanges are non-blocking MPI calls polled within train_timeout_seconds; what cannot be
 * bounded is MPI_Init_thread itself and, without OMPI_COMM_WORLD_LOCAL_RANK in the environment,
 * the MPI_Comm_split_type that finds the rank's index on its node.
 * On a machine without a GPU create returns CT_ERR_UNSUPPORTED before touching MPI.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (ct_util_now) */
#include "nccl_comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "device", CT_OPT_INT, "-1",
     "CUDA device of this rank; -1 = the rank's index on its node modulo the visible GPUs", NULL, NULL},
    {sizeof(ct_option_spec), "train_timeout_seconds", CT_OPT_FLOAT, "300",
     "an operation (or init, split, wait) that does not complete in this many seconds fails with "
     "a timeout; the host then aborts the job", NULL, NULL},
    {0},
};

/* The rank's index among the ranks on its node: Open MPI says so in the environment; otherwise
 * MPI_Comm_split_type groups the ranks that share memory. -1 when neither works. */
static int local_rank(MPI_Comm boot, int rank) {
    const char *env = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v < INT_MAX)
            return (int)v;
    }
    MPI_Comm node;
    if (MPI_Comm_split_type(boot, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return -1;
    int r = -1;
    if (MPI_Comm_rank(node, &r) != MPI_SUCCESS)
        r = -1;
    MPI_Comm_free(&node);
    return r;
}

/* Completes a non-blocking MPI call of the bootstrap within train_timeout. On a timeout MPI keeps
 * the request and its buffers (the callers' buffers are on the heap and are then left behind),
 * and c->mpi_stuck stops the failure path from waiting in MPI_Finalize for the missing rank.
 * report = 0 keeps the message already set (this rank's own failure, which says more). */
static ct_status mpi_wait(ctnccl *c, MPI_Request *req, const char *what, int report) {
    double deadline = ct_util_now() + c->train_timeout;
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING] = "";
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            if (report)
                c->host->set_error(c->host, "%s: %s", what, msg);
            c->mpi_stuck = 1;
            return CT_ERR_IO;
        }
        if (done)
            return CT_OK;
        if (ct_util_now() >= deadline) {
            if (report)
                ctnccl_timeout_error(c, what);
            c->mpi_stuck = 1;
            return CT_ERR_TIMEOUT;
        }
        ctnccl_pause(spin);
    }
}

/* Every rank calls it after a step that may fail on some ranks only: returns `mine` when this rank
 * failed (its message stays), an error naming the step when another rank did, CT_OK when all
 * succeeded. */
static ct_status agree(ctnccl *c, ct_status mine, const char *step, int rank, int size) {
    char what[192];
    snprintf(what, sizeof what, "%s: agreement of rank %d of %d (MPI_Iallreduce)", step, rank, size);
    int *v = malloc(2 * sizeof *v); /* left to MPI if the exchange times out */
    ct_status st = CT_ERR_NOMEM;
    if (v) {
        v[0] = mine != CT_OK;
        v[1] = 1;
        MPI_Request req;
        if (MPI_Iallreduce(&v[0], &v[1], 1, MPI_INT, MPI_MAX, c->boot, &req) == MPI_SUCCESS) {
            st = mpi_wait(c, &req, what, !mine);
        } else {
            st = CT_ERR_IO;
            if (!mine)
                c->host->set_error(c->host, "%s failed", what);
        }
    }
    if (st)
        c->mpi_stuck = 1; /* the other ranks may still wait in the exchange */
    if (mine || st) {
        if (!st)
            free(v);
        return mine ? mine : st;
    }
    int any = v[1];
    free(v);
    if (any) {
        c->host->set_error(c->host, "rank %d of %d: %s failed on another rank (its log says why)", rank, size,
                           step);
        return CT_ERR_IO;
    }
    return CT_OK;
}

/* Joins MPI (initialising it when nobody has) and duplicates MPI_COMM_WORLD into c->boot. */
static ct_status mpi_join(ctnccl *c) {
    int done = 0;
    MPI_Finalized(&done);
    if (done) {
        c->host->set_error(c->host, "MPI was already finalized in this process; create the comm once per process");
        return CT_ERR_UNSUPPORTED;
    }
    MPI_Initialized(&done);
    if (!done) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            c->host->set_error(c->host, "MPI_Init_thread failed (is this run under mpirun?)");
            return CT_ERR_IO;
        }
        c->mpi_inited_here = 1;
    }
    MPI_Request req;
    if (MPI_Comm_idup(MPI_COMM_WORLD, &c->boot, &req) != MPI_SUCCESS) {
        c->host->set_error(c->host, "MPI_Comm_idup(MPI_COMM_WORLD) failed");
        c->boot = MPI_COMM_NULL;
        return CT_ERR_IO;
    }
    ct_status st = mpi_wait(c, &req, "bootstrap: MPI_Comm_idup of MPI_COMM_WORLD", 1);
    if (st)
        return st;
    /* Our MPI calls report errors as values; the default handler would kill the job. */
    MPI_Comm_set_errhandler(c->boot, MPI_ERRORS_RETURN);
    return CT_OK;
}

/* Frees what create/destroy hold in MPI, and finalizes MPI if we started it, unless a bootstrap
 * exchange is stuck (then c, which MPI may still write into, is left behind too). */
static void mpi_leave(ctnccl *c) {
    if (c->mpi_stuck)
        return;
    if (c->boot != MPI_COMM_NULL)
        MPI_Comm_free(&c->boot);
    int done = 0;
    MPI_Finalized(&done);
    if (c->mpi_inited_here && !done)
        MPI_Finalize();
    c->mpi_inited_here = 0;
    free(c);
}

/* This rank's GPU: the `device` option, or the local rank modulo the GPUs. */
static ct_status pick_device(ctnccl *c, int64_t want, int ndev, int rank, int size) {
    int dev;
    if (want >= 0) {
        if (want >= ndev) {
            c->host->set_error(c->host, "rank %d of %d: device = %lld, but this node has %d GPU(s) (0..%d)", rank,
                               size, (long long)want, ndev, ndev - 1);
            return CT_ERR_INVALID;
        }
        dev = (int)want;
    } else {
        int lr = local_rank(c->boot, rank);
        if (lr < 0) {
            c->host->set_error(c->host, "rank %d of %d: cannot tell this rank's index on its node; set the "
                               "device option", rank, size);
            return CT_ERR_INVALID;
        }
        dev = lr % ndev;
    }
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "rank %d of %d: cudaSetDevice(%d)", rank, size, dev);
        return ctnccl_cuda_error(c, what, e);
    }
    c->device = dev;
    return CT_OK;
}

/* Rank 0's ncclGetUniqueId, broadcast to every rank. */
typedef struct boot_msg {
    int ok;
    ncclUniqueId id;
} boot_msg;

static ct_status unique_id(ctnccl *c, int rank, int size, ncclUniqueId *id) {
    boot_msg *m = calloc(1, sizeof *m); /* left to MPI if the broadcast times out */
    if (!m) {
        c->mpi_stuck = 1;
        return CT_ERR_NOMEM;
    }
    ncclResult_t r = ncclSuccess;
    if (rank == 0) {
        r = ncclGetUniqueId(&m->id);
        m->ok = r == ncclSuccess;
    }
    char what[128];
    snprintf(what, sizeof what, "bootstrap: MPI_Ibcast of the NCCL unique id to rank %d of %d", rank, size);
    MPI_Request req;
    if (MPI_Ibcast(m, (int)sizeof *m, MPI_BYTE, 0, c->boot, &req) != MPI_SUCCESS) {
        c->host->set_error(c->host, "%s failed", what);
        c->mpi_stuck = 1;
        return CT_ERR_IO;
    }
    ct_status st = mpi_wait(c, &req, what, 1);
    if (st)
        return st;
    int ok = m->ok;
    *id = m->id;
    free(m);
    if (ok)
        return CT_OK;
    if (rank == 0)
        return ctnccl_error(c, "ncclGetUniqueId", r, NULL);
    c->host->set_error(c->host, "rank %d of %d: ncclGetUniqueId failed on rank 0 (its log says why)", rank, size);
    return CT_ERR_IO;
}

/* The world communicator: a non-blocking ncclCommInitRankConfig, bounded by train_timeout. */
static ct_status world_init(ctnccl *c, const ncclUniqueId *id, int rank, int size) {
    char what[128];
    snprintf(what, sizeof what, "NCCL init of group world (rank %d of %d, GPU %d)", rank, size, c->device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nc, size, *id, rank, &cfg);
    r = ctnccl_settle(nc, r, ct_util_now() + c->train_timeout);
    ct_status st;
    if (r == ncclInProgress) {
        ctnccl_timeout_error(c, what);
        st = CT_ERR_TIMEOUT;
    } else if (r != ncclSuccess) {
        st = ctnccl_error(c, what, r, nc);
    } else {
        st = ctnccl_group_open(c, nc, "world", &c->world);
    }
    if (st && nc && !c->world)
        (void)ncclCommAbort(nc);
    return st;
}

static ct_status nccl_create(const ct_host *h, ct_comm **out) {
    if (!out)
        return CT_ERR_INVALID;
    *out = NULL;
    int64_t want = -1;
    double timeout = 300;
    ct_status st = h->opt_int(h, "device", &want);
    if (!st)
        st = h->opt_float(h, "train_timeout_seconds", &timeout);
    if (st)
        return st;
    if (!(timeout > 0) || timeout > 1e9) {
        h->set_error(h, "train_timeout_seconds = %g: expected a number of seconds in (0, 1e9]", timeout);
        return CT_ERR_INVALID;
    }
    if (want < -1 || want > INT_MAX) {
        h->set_error(h, "device = %lld: expected a GPU index >= 0, or -1 for the local rank", (long long)want);
        return CT_ERR_INVALID;
    }
    /* No GPU: say so before joining MPI, so a singleton exits cleanly. */
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev <= 0) {
        h->set_error(h, "no CUDA device: the nccl plugin needs a GPU; use comm.name: mpi for CPU tensors (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0");
        (void)cudaGetLastError();
        return CT_ERR_UNSUPPORTED;
    }
    int version = 0;
    if (ncclGetVersion(&version) != ncclSuccess || version < NCCL_VERSION(2, 18, 0)) {
        h->set_error(h, "the NCCL library loaded (version code %d) is older than 2.18, which ncclCommSplit needs",
                     version);
        return CT_ERR_UNSUPPORTED;
    }

    ctnccl *c = calloc(1, sizeof *c);
    if (!c)
        return CT_ERR_NOMEM;
    c->host = h;
    c->train_timeout = timeout;
    c->nccl_version = version;
    c->boot = MPI_COMM_NULL;
    if ((st = mpi_join(c))) {
        mpi_leave(c);
        return st;
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(c->boot, &rank);
    MPI_Comm_size(c->boot, &size);

    /* Each step ends in an agreement, so every rank takes the same path out. */
    ncclUniqueId id;
    st = agree(c, pick_device(c, want, ndev, rank, size), "choosing a GPU", rank, size);
    if (!st)
        st = unique_id(c, rank, size, &id);
    if (!st)
        st = agree(c, world_init(c, &id, rank, size), "NCCL init of group world", rank, size);
    if (st) {
        if (c->world)
            ctnccl_group_close(c, c->world, 0);
        mpi_leave(c); /* every rank is here (or MPI is stuck and it does nothing) */
        return st;
    }
    h->log(h, CT_LOG_INFO, "nccl: rank %d of %d on GPU %d (NCCL %d), timeout %g s", rank, size, c->device,
           version, timeout);
    *out = c;
    return CT_OK;
}

static void nccl_destroy(ct_comm *comm) {
    ctnccl *c = comm;
    if (!c)
        return;
    (void)cudaSetDevice(c->device);
    /* Newest first: every split group before the world it came from. */
    while (c->groups)
        ctnccl_group_close(c, c->groups, 1);
    c->world = NULL;
    mpi_leave(c);
}

static void nccl_abort(ct_comm *comm, int code) {
    ctnccl *c = comm;
    if (c) {
        for (ctnccl_group *g = c->groups; g; g = g->next)
            ctnccl_group_abort(g);
    }
    int up = 0;
    MPI_Initialized(&up);
    if (up)
        MPI_Abort(MPI_COMM_WORLD, code);
}

/* ABI 1.4: from now on ops order themselves after `stream` and wait() orders it after them with
 * events (nccl_comm.h). A second bind replaces the first; the stream stays the caller's. */
static ct_status nccl_bind_stream(ct_comm *comm, ct_stream *stream) {
    ctnccl *c = comm;
    if (!c)
        return CT_ERR_INVALID;
    if (!stream) {
        c->host->set_error(c->host, "bind_stream: NULL stream (expected the device's share_stream)");
        return CT_ERR_INVALID;
    }
    c->bound = (cudaStream_t)stream; /* a ct_stream from a CUDA device is its cudaStream_t */
    c->host->log(c->host, CT_LOG_DEBUG, "nccl: collectives ordered with the device's stream by events");
    return CT_OK;
}

static const ct_comm_api api = {
    .struct_size = sizeof(ct_comm_api),
    .create = nccl_create,
    .destroy = nccl_destroy,
    .world = ctnccl_world,
    .group_rank = ctnccl_group_rank,
    .split = ctnccl_split,
    .group_free = ctnccl_group_free,
    .all_reduce = ctnccl_all_reduce,
    .all_gather = ctnccl_all_gather,
    .reduce_scatter = ctnccl_reduce_scatter,
    .broadcast = ctnccl_broadcast,
    .all_to_all = ctnccl_all_to_all,
    .all_to_allv = ctnccl_all_to_allv,
    .send = ctnccl_send,
    .recv = ctnccl_recv,
    .barrier = ctnccl_barrier,
    .wait = ctnccl_wait_api,
    .abort = nccl_abort,
    .bind_stream = nccl_bind_stream,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_COMM;
    info->name = "nccl";
    info->description = "NCCL collectives on GPU memory (MPI bootstrap, one GPU per rank)";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
