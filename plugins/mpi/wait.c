/* wait.c: completing operations within a deadline.
 *
 * MPI's blocking calls cannot be bounded, so every operation is started with the non-blocking
 * call and completed here by MPI_Test in a loop until the request completes or the deadline
 * passes. MPI progresses non-blocking collectives only inside MPI calls, so the loop must keep
 * testing; between tests it backs off in three steps:
 *   - the first SPIN_SECONDS: test back to back (most operations between ranks that arrive
 *     together finish here: a 16-element all_reduce over 2 ranks takes ~2 us);
 *   - up to YIELD_SECONDS: sched_yield, which hands the core to a rank that still computes when
 *     ranks outnumber cores (tests run 4 ranks on 2 cores) and costs nothing otherwise;
 *   - then nanosleep, growing from 1 to 100 us (the kernel's timer slack makes even 1 us ~50 us),
 *     so a rank waiting for a slow peer uses almost no CPU.
 *
 * A request that misses its deadline can be neither freed nor cancelled (MPI forbids both for
 * collectives), and MPI may still write its buffers. It moves to c->abandoned; every later wait
 * tests it again and frees it once a late rank has completed it, and destroy drains what is left.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (ct_util_now), nanosleep */

#include "mpi_comm.h"
#include "ctitan/util.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPIN_SECONDS 50e-6
#define YIELD_SECONDS 1e-3
#define PAUSE_FIRST_NS 1000L
#define PAUSE_MAX_NS 100000L

ctmpi_req *ctmpi_req_new(const ctmpi_group *g, const char *op, int64_t count, ct_dtype dt)
{
    ctmpi_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->req = MPI_REQUEST_NULL;
    r->op = op;
    r->count = count;
    r->dt = dt;
    r->peer = -1;
    snprintf(r->group, sizeof r->group, "%s", g->name);
    r->rank = g->rank;
    r->size = g->size;
    return r;
}

void ctmpi_describe(const ctmpi_req *r, char *buf, size_t len)
{
    char count[64] = "", peer[32] = "";
    if (r->dt)
        snprintf(count, sizeof count, " of %lld %s", (long long)r->count,
                 ctmpi_dtype_name(r->dt));
    if (r->peer_word)
        snprintf(peer, sizeof peer, " %s rank %d", r->peer_word, r->peer);
    snprintf(buf, len, "%s%s%s on group %s (rank %d of %d)", r->op, count, peer, r->group, r->rank,
             r->size);
}

ct_status ctmpi_mpi_error(ctmpi *c, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "unknown error");
    c->host->set_error(c->host, "%s: MPI error %d: %s", what, rc, msg);
    return CT_ERR_IO;
}

int ctmpi_reap(ctmpi *c)
{
    int left = 0;
    for (ctmpi_req **p = &c->abandoned; *p;) {
        ctmpi_req *r = *p;
        int done = 0;
        /* an error also ends it: MPI has given up on the operation */
        if (MPI_Test(&r->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
            *p = r->next;
            free(r);
        } else {
            p = &r->next;
            left++;
        }
    }
    return left;
}

/* One step of the back-off described at the top; `waited` is the time since the wait began. */
static void back_off(double waited, long *pause_ns)
{
    if (waited < SPIN_SECONDS)
        return;
    if (waited < YIELD_SECONDS) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, *pause_ns};
    nanosleep(&ts, NULL);
    *pause_ns = 2 * *pause_ns < PAUSE_MAX_NS ? 2 * *pause_ns : PAUSE_MAX_NS;
}

int ctmpi_drain(ctmpi *c, double timeout)
{
    const double start = ct_util_now();
    long pause_ns = PAUSE_FIRST_NS;
    int left;
    while ((left = ctmpi_reap(c)) > 0 && ct_util_now() - start < timeout)
        back_off(ct_util_now() - start, &pause_ns);
    return left;
}

ct_status ctmpi_wait(ctmpi *c, ctmpi_req *r, double timeout)
{
    const double start = ct_util_now();
    long pause_ns = PAUSE_FIRST_NS;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(&r->req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char what[256];
            ctmpi_describe(r, what, sizeof what);
            free(r);
            return ctmpi_mpi_error(c, what, rc);
        }
        if (done) {
            free(r);
            return CT_OK;
        }
        double waited = ct_util_now() - start;
        if (waited >= timeout)
            break;
        if (c->abandoned)
            ctmpi_reap(c);
        back_off(waited, &pause_ns);
    }
    char what[256];
    ctmpi_describe(r, what, sizeof what);
    c->host->set_error(c->host, "%s: no completion within %g s; a rank died or is stuck", what,
                       timeout);
    r->next = c->abandoned;
    c->abandoned = r;
    return CT_ERR_TIMEOUT;
}

ct_status ctmpi_finish(ctmpi *c, ctmpi_req *r, int rc, ct_comm_request **req)
{
    if (rc != MPI_SUCCESS) {
        char what[256];
        ctmpi_describe(r, what, sizeof what);
        free(r);
        return ctmpi_mpi_error(c, what, rc);
    }
    if (req) {
        *req = r;
        return CT_OK;
    }
    return ctmpi_wait(c, r, c->train_timeout);
}

ct_status ctmpi_wait_api(ct_comm *comm, ct_comm_request *req)
{
    ctmpi *c = comm;
    if (!req) {
        c->host->set_error(c->host, "wait: NULL request");
        return CT_ERR_INVALID;
    }
    return ctmpi_wait(c, req, c->train_timeout);
}

ct_status ctmpi_test_api(ct_comm *comm, ct_comm_request *req, int *done)
{
    ctmpi *c = comm;
    ctmpi_req *r = req;
    *done = 0;
    if (!r) {
        c->host->set_error(c->host, "test: NULL request");
        return CT_ERR_INVALID;
    }
    if (r->req == MPI_REQUEST_NULL) { /* completed by an earlier test */
        *done = 1;
        return CT_OK;
    }
    int rc = MPI_Test(&r->req, done, MPI_STATUS_IGNORE); /* a completed request becomes MPI_REQUEST_NULL */
    if (rc != MPI_SUCCESS) return ctmpi_mpi_error(c, r->op, rc);
    return CT_OK;
}
