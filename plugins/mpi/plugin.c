/* plugin.c: the MPI comm plugin (CT_KIND_COMM, "mpi"): entry, options, create/destroy, groups.
 *
 * Moves host-memory buffers between the ranks of a job launched by mpirun (or alone, as an MPI
 * singleton of one rank). Every operation is a non-blocking MPI call completed within
 * train_timeout_seconds (see wait.c), so a dead or stuck rank turns into CT_ERR_TIMEOUT and a
 * message instead of a hang.
 *
 * What the timeouts cannot bound:
 *  - MPI_Init_thread: under mpirun it blocks in the runtime's start-up exchange (a PMIx fence)
 *    until every rank has called it, and MPI offers no way to bound it (seen with OpenMPI 4.1: a
 *    rank started 6 s late holds the others in create for 6.2 s, whatever init_timeout_seconds
 *    says). init_timeout_seconds bounds the first collective after it (duplicating
 *    MPI_COMM_WORLD), which catches a missing rank only where MPI_Init does not wait for all.
 *  - MPI_Comm_split has no non-blocking form; split first waits (bounded) for a barrier of the
 *    parent group, so the split itself starts only once every rank has arrived.
 *  - MPI_Finalize (in destroy, only when this plugin started MPI) waits for every rank.
 *
 * Determinism: the result of a reduction depends on the algorithm OpenMPI's non-blocking
 * collectives (coll/libnbc) pick, which is a function of the group size, the count and the
 * datatype; for a fixed group and layout the bits are the same from run to run and on every rank.
 * Changing the coll MCA parameters can change the choice.
 *
 * MPI can be started once per process: create after a destroy that finalised MPI fails.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep, _exit */

#ifdef __SANITIZE_ADDRESS__
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NODELETE: see pin_object */
#endif
#include "mpi_comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <dlfcn.h>
#include <link.h>
#include <sanitizer/lsan_interface.h>
#endif

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "train_timeout_seconds", CT_OPT_FLOAT, "300",
     "seconds any collective, send/recv or wait may take before it returns a timeout error naming "
     "the operation and group (a rank died or is stuck)", NULL, NULL},
    {sizeof(ct_option_spec), "init_timeout_seconds", CT_OPT_FLOAT, "300",
     "seconds the first collective after MPI_Init (duplicating MPI_COMM_WORLD) may take; "
     "MPI_Init itself waits for every rank to start and cannot be bounded", NULL, NULL},
    {0},
};

/* Process-wide: MPI is started at most once per process and finalised by the last instance. */
static int started_mpi;
static int live_instances;

static ct_status read_timeout(const ct_host *h, const char *key, double *out)
{
    ct_status st = h->opt_float(h, key, out);
    if (st) {
        h->set_error(h, "option %s: cannot be read", key);
        return st;
    }
    if (!(*out > 0) || !isfinite(*out)) {
        h->set_error(h, "option %s: expected a positive number of seconds, got %g", key, *out);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

#ifdef __SANITIZE_ADDRESS__
/* Open MPI keeps blocks it never frees, allocated in components (and their libraries) that it
 * unloads at MPI_Finalize, before LeakSanitizer's check at exit: their frames would then have no
 * name for tests/lsan.supp to match. Under ASan, what MPI_Init_thread and MPI_Finalize allocate on
 * this thread is not counted as leaked, and every object loaded by MPI_Init stays mapped, so what
 * MPI's own threads allocate is named (libpmix, libevent) and suppressed. */
static int pin_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    if (info->dlpi_name && info->dlpi_name[0])
        dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    return 0;
}
#endif

/* MPI_Init_thread unless the host (or another instance) already did. */
static ct_status start_mpi(const ct_host *h)
{
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) {
        h->set_error(h, "create: MPI was already finalised in this process (by an earlier destroy); "
                        "MPI can start only once per process");
        return CT_ERR_UNSUPPORTED;
    }
    if (initialised)
        return CT_OK;
    int provided = 0;
    /* Errors in MPI_Init_thread go to MPI's default handler, which ends the process. */
#ifdef __SANITIZE_ADDRESS__
    __lsan_disable(); /* what this thread allocates in MPI's start-up is MPI's to free (see pin_object) */
#endif
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
#ifdef __SANITIZE_ADDRESS__
    __lsan_enable();
    dl_iterate_phdr(pin_object, NULL);
#endif
    if (rc != MPI_SUCCESS) {
        h->set_error(h, "create: MPI_Init_thread failed with MPI error %d", rc);
        return CT_ERR_IO;
    }
    started_mpi = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_FUNNELED)
        h->log(h, CT_LOG_WARN, "MPI provides thread level %d only; call the plugin from the thread "
                               "that created it", provided);
    return CT_OK;
}

/* c->world = a duplicate of MPI_COMM_WORLD, within init_timeout. */
static ct_status world_create(ctmpi *c)
{
    ctmpi_group *w = &c->world;
    snprintf(w->name, sizeof w->name, "world");
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    w->comm = MPI_COMM_NULL;
    ctmpi_req *r = ctmpi_req_new(w, "create (MPI_Comm_idup of MPI_COMM_WORLD)", 0, (ct_dtype)0);
    if (!r) {
        c->host->set_error(c->host, "create: out of memory");
        return CT_ERR_NOMEM;
    }
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &w->comm, &r->req);
    if (rc != MPI_SUCCESS) {
        free(r);
        return ctmpi_mpi_error(c, "create: MPI_Comm_idup of MPI_COMM_WORLD", rc);
    }
    ct_status st = ctmpi_wait(c, r, c->init_timeout);
    if (st)
        return st;
    rc = MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS)
        return ctmpi_mpi_error(c, "create: MPI_Comm_set_errhandler", rc);
    return CT_OK;
}

static void log_started(ctmpi *c)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0, provided = 0;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, ",\n")] = '\0'; /* "Open MPI v4.1.4" */
    MPI_Query_thread(&provided);
    c->host->log(c->host, CT_LOG_INFO, "rank %d of %d, %s, thread level %d, timeout %g s",
                 c->world.rank, c->world.size, lib, provided, c->train_timeout);
}

static ct_status mpi_create(const ct_host *h, ct_comm **out)
{
    if (!out) {
        h->set_error(h, "create: NULL output pointer");
        return CT_ERR_INVALID;
    }
    *out = NULL;
    ctmpi *c = calloc(1, sizeof *c);
    if (!c) {
        h->set_error(h, "create: out of memory");
        return CT_ERR_NOMEM;
    }
    c->host = h;
    for (int i = 0; i < 3; i++)
        c->bf16_op[i] = MPI_OP_NULL;
    ct_status st = read_timeout(h, "train_timeout_seconds", &c->train_timeout);
    if (!st)
        st = read_timeout(h, "init_timeout_seconds", &c->init_timeout);
    if (!st)
        st = start_mpi(h);
    if (st) {
        free(c);
        return st;
    }
    live_instances++;
    int *tag_ub = NULL, found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
    c->tag_ub = found && tag_ub ? *tag_ub : 32767;
    st = world_create(c);
    if (st == CT_ERR_TIMEOUT)
        return st; /* c stays allocated: MPI may still complete the idup into c->world.comm */
    int rc = st ? MPI_SUCCESS : ctmpi_bf16_ops_create(c->bf16_op);
    if (!st && rc != MPI_SUCCESS)
        st = ctmpi_mpi_error(c, "create: MPI_Op_create for bf16", rc);
    if (st) {
        if (c->world.comm != MPI_COMM_NULL)
            MPI_Comm_free(&c->world.comm);
        live_instances--;
        free(c);
        return st;
    }
    log_started(c);
    *out = c;
    return CT_OK;
}

static void mpi_destroy(ct_comm *comm)
{
    ctmpi *c = comm;
    if (!c)
        return;
    int finalised = 0;
    MPI_Finalized(&finalised);
    /* Operations abandoned by a timeout complete within moments once the late rank has joined;
     * when a rank died they never will, and waiting the whole timeout again would only delay the
     * exit. */
    int left = finalised ? 0 : ctmpi_drain(c, c->train_timeout < 1.0 ? c->train_timeout : 1.0);
    if (left)
        c->host->log(c->host, CT_LOG_WARN,
                     "%d timed-out operation(s) never completed; MPI_Finalize skipped (after a "
                     "timeout the job should be ended with abort)", left);
    while (c->abandoned) {
        ctmpi_req *r = c->abandoned;
        c->abandoned = r->next;
        free(r);
    }
    if (!finalised) {
        ctmpi_bf16_ops_free(c->bf16_op);
        if (c->world.comm != MPI_COMM_NULL)
            MPI_Comm_free(&c->world.comm);
    }
    if (--live_instances == 0 && started_mpi && !finalised && !left) {
#ifdef __SANITIZE_ADDRESS__
        __lsan_disable(); /* and in its shut-down (see start_mpi) */
#endif
        MPI_Finalize();
#ifdef __SANITIZE_ADDRESS__
        __lsan_enable();
#endif
        started_mpi = 0;
    }
    free(c);
}

static ct_status mpi_world(ct_comm *comm, ct_comm_group **group)
{
    ctmpi *c = comm;
    if (!group) {
        c->host->set_error(c->host, "world: NULL output pointer");
        return CT_ERR_INVALID;
    }
    *group = &c->world;
    return CT_OK;
}

static ct_status mpi_group_rank(ct_comm *comm, ct_comm_group *group, int *rank, int *size)
{
    ctmpi *c = comm;
    const ctmpi_group *g = group;
    if (!g || !rank || !size) {
        c->host->set_error(c->host, "group_rank: NULL group or output pointer");
        return CT_ERR_INVALID;
    }
    *rank = g->rank;
    *size = g->size;
    return CT_OK;
}

static ct_status mpi_split(ct_comm *comm, ct_comm_group *group, int color, int key, const char *name,
                           ct_comm_group **out)
{
    ctmpi *c = comm;
    ctmpi_group *parent = group;
    const ct_host *h = c->host;
    if (!out || !parent) {
        h->set_error(h, "split: NULL group or output pointer");
        return CT_ERR_INVALID;
    }
    *out = NULL;
    if (color < 0) {
        h->set_error(h, "split of group %s into %s: color %d is negative", parent->name,
                     name ? name : "(unnamed)", color);
        return CT_ERR_INVALID;
    }
    ctmpi_group *g = calloc(1, sizeof *g);
    ctmpi_req *r = ctmpi_req_new(parent, "split", 0, (ct_dtype)0);
    if (!g || !r) {
        free(g);
        free(r);
        h->set_error(h, "split of group %s: out of memory", parent->name);
        return CT_ERR_NOMEM;
    }
    /* MPI_Comm_split has no non-blocking form: wait (bounded) until every rank of the parent has
     * arrived, so the split itself cannot hang on a missing rank. */
    ct_status st = ctmpi_finish(c, r, MPI_Ibarrier(parent->comm, &r->req), NULL);
    if (st) {
        free(g);
        return st;
    }
    int rc = MPI_Comm_split(parent->comm, color, key, &g->comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        free(g);
        char what[128];
        snprintf(what, sizeof what, "split of group %s", parent->name);
        return ctmpi_mpi_error(c, what, rc);
    }
    MPI_Comm_rank(g->comm, &g->rank);
    MPI_Comm_size(g->comm, &g->size);
    snprintf(g->name, sizeof g->name, "%s", name && *name ? name : "(unnamed)");
    *out = g;
    return CT_OK;
}

static void mpi_group_free(ct_comm *comm, ct_comm_group *group)
{
    ctmpi *c = comm;
    ctmpi_group *g = group;
    if (!g || g == &c->world)
        return;
    MPI_Comm_free(&g->comm);
    free(g);
}

static void mpi_abort(ct_comm *comm, int code)
{
    (void)comm;
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (initialised && !finalised)
        MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code); /* MPI is not running: this process is the whole job */
}

static const ct_comm_api api = {
    .struct_size = sizeof(ct_comm_api),
    .create = mpi_create,
    .destroy = mpi_destroy,
    .world = mpi_world,
    .group_rank = mpi_group_rank,
    .split = mpi_split,
    .group_free = mpi_group_free,
    .all_reduce = ctmpi_all_reduce,
    .all_gather = ctmpi_all_gather,
    .reduce_scatter = ctmpi_reduce_scatter,
    .broadcast = ctmpi_broadcast,
    .all_to_all = ctmpi_all_to_all,
    .all_to_allv = ctmpi_all_to_allv,
    .send = ctmpi_send,
    .recv = ctmpi_recv,
    .barrier = ctmpi_barrier,
    .wait = ctmpi_wait_api,
    .abort = mpi_abort,
    .test = ctmpi_test_api,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info)
{
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_COMM;
    info->name = "mpi";
    info->description = "MPI (OpenMPI) collectives on host memory, every call bounded by a timeout";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
