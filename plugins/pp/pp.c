/* pp.c: the pipeline runner (ctitan/pipeline.h), written against the public SDK only.
 *
 * It runs this rank's actions in the schedule's order and moves what crosses stage boundaries:
 *   - after F of stage s, when stage s + 1 is on another rank: the output goes there;
 *   - after B or I of stage s, when stage s - 1 is on another rank: the input gradient goes there.
 * Each message is a header (ndim and shape, int32) and the data, both sent non-blocking right after
 * the work that produced them. Every header this rank will receive in the step is posted before
 * the first action; between actions the runner tests them, and as soon as one has landed it asks
 * the host where the data goes and posts that receive too. An action waits only for what it reads.
 * Tags name (kind, destination stage, microbatch), so any order of arrival matches correctly.
 *
 * Memory does not depend on timing: a (stage, microbatch) whose last action ran is given back to
 * the host once its sends completed, and before this rank starts a microbatch it has not run yet
 * in the step it waits for every such send (a peer that had not posted the receive yet, being busy,
 * would otherwise make the host take one more microbatch context than the schedule holds). While
 * it waits, for that or for a message it reads, it keeps testing every message of the step, so a
 * peer that waits on this rank's sends is served (no cycle of waits), bounded by the comm's
 * train_timeout_seconds.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (ct_util_now), sched_yield */

#include "ctitan/pipeline.h"
#include "ctitan/util.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define HDR (1 + CT_MAX_DIMS)
#define TAG_LIMIT 32767 /* the smallest MPI_TAG_UB the MPI standard allows */

typedef struct incoming {
    int kind, stage, mb, peer;
    int32_t hdr[HDR];
    ct_comm_request *hreq, *dreq;
    int hdr_done, posted, done;
} incoming;

typedef struct outgoing {
    int stage, mb; /* the (stage, mb) whose buffers it reads */
    int32_t hdr[HDR];
    ct_comm_request *hreq, *dreq;
} outgoing;

typedef struct ct_runner { /* the ABI's opaque ct_runner */
    const ct_host *host;
    ct_pipeline_env env;
    incoming *in;
    int n_in;
    outgoing *out;
    int n_out, cap_out;
    int *sends_left; /* per (stage, mb): sends still in flight */
    int *finished;   /* per (stage, mb): its last action ran */
    int *released;
    int *started;   /* per microbatch: an action of it ran in this step */
    double timeout; /* comm.train_timeout_seconds */
} runner;

static int stage_rank(const runner *r, int stage) {
    int p = r->env.pp_size;
    if (r->env.placement == CT_PP_V) return stage < p ? stage : 2 * p - 1 - stage;
    return stage % p;
}

static int tag(const runner *r, int kind, int stage, int mb, int part) {
    return ((kind * r->env.n_stages + stage) * r->env.n_microbatches + mb) * 2 + part;
}

static int remote_prev(const runner *r, int s) { return s > 0 && stage_rank(r, s - 1) != r->env.pp_rank; }
static int remote_next(const runner *r, int s) {
    return s + 1 < r->env.n_stages && stage_rank(r, s + 1) != r->env.pp_rank;
}

/* The comm can test an operation without blocking (ct_comm_api.test): the runner moves messages along
 * between actions and while it waits; without it, receives block and sends complete at the step's end. */
static int has_test(const runner *r) { return CT_HAS_FIELD(r->env.capi, ct_comm_api, test) && r->env.capi->test; }

static void pp_destroy(ct_runner *p) {
    runner *r = p;
    if (!r) return;
    free(r->in);
    free(r->out);
    free(r->sends_left);
    free(r->finished);
    free(r->released);
    free(r->started);
    free(r);
}

static ct_status pp_create(const ct_host *h, const ct_pipeline_env *env, ct_runner **out) {
    if (4 * env->n_stages * env->n_microbatches > TAG_LIMIT) {
        h->set_error(h, "pp: %d stages x %d microbatches need more message tags than MPI guarantees (%d)", env->n_stages,
                     env->n_microbatches, TAG_LIMIT);
        return CT_ERR_INVALID;
    }
    if (env->n_actions > 0 && (!env->actions || !CT_HAS_FIELD(env->actions, ct_pp_action, microbatch))) {
        h->set_error(h, "pp: the action list's elements are %zu bytes, too small for op, stage and microbatch",
                     env->actions ? env->actions->struct_size : (size_t)0);
        return CT_ERR_INVALID;
    }
    double timeout = 0;
    if (h->opt_float(h, "comm.train_timeout_seconds", &timeout) != CT_OK || !(timeout > 0)) {
        h->set_error(h, "pp: comm.train_timeout_seconds: expected seconds above 0");
        return CT_ERR_INVALID;
    }
    runner *r = calloc(1, sizeof *r);
    if (!r) return CT_ERR_NOMEM;
    r->host = h;
    r->timeout = timeout;
    r->env = *env;
    int n = env->n_stages * env->n_microbatches;
    r->in = calloc((size_t)env->n_actions + 1, sizeof(incoming));
    r->out = calloc((size_t)env->n_actions + 1, sizeof(outgoing));
    r->cap_out = env->n_actions;
    r->sends_left = calloc((size_t)n, sizeof(int));
    r->finished = calloc((size_t)n, sizeof(int));
    r->released = calloc((size_t)n, sizeof(int));
    r->started = calloc((size_t)env->n_microbatches + 1, sizeof(int));
    if (!r->in || !r->out || !r->sends_left || !r->finished || !r->released || !r->started) {
        pp_destroy(r);
        return CT_ERR_NOMEM;
    }
    /* what this rank will receive: an input for each F after a remote stage, an output gradient for
     * each B or I before a remote stage */
    for (int i = 0; i < env->n_actions; i++) {
        const ct_pp_action *a = CT_AT(const ct_pp_action, env->actions, i);
        if (a->op == CT_PP_F && remote_prev(r, a->stage))
            r->in[r->n_in++] = (incoming){.kind = CT_PP_ACTIVATION, .stage = a->stage, .mb = a->microbatch,
                                          .peer = stage_rank(r, a->stage - 1)};
        else if ((a->op == CT_PP_B || a->op == CT_PP_I) && remote_next(r, a->stage))
            r->in[r->n_in++] = (incoming){.kind = CT_PP_GRADIENT, .stage = a->stage, .mb = a->microbatch,
                                          .peer = stage_rank(r, a->stage + 1)};
    }
    *out = r;
    return CT_OK;
}


static incoming *find_in(runner *r, int kind, int stage, int mb) {
    for (int i = 0; i < r->n_in; i++)
        if (r->in[i].kind == kind && r->in[i].stage == stage && r->in[i].mb == mb) return &r->in[i];
    return NULL;
}

/* Header landed: ask the host for the destination and post the data receive. */
static ct_status post_data(runner *r, const ct_pipeline_host *ph, incoming *m) {
    int ndim = m->hdr[0];
    int64_t shape[CT_MAX_DIMS], count = 1;
    if (ndim < 0 || ndim > CT_MAX_DIMS) {
        r->host->set_error(r->host, "pp: a message header with %d dims from pp rank %d", ndim, m->peer);
        return CT_ERR_IO;
    }
    for (int d = 0; d < ndim; d++) count *= shape[d] = m->hdr[1 + d];
    float *data;
    ct_status st = ph->input(ph->ctx, m->stage, m->mb, m->kind, ndim, shape, &data);
    if (st) return st;
    st = r->env.capi->recv(r->env.comm, r->env.group, data, count, CT_F32, m->peer, tag(r, m->kind, m->stage, m->mb, 1),
                           &m->dreq);
    m->posted = 1;
    return st;
}

static void maybe_release(runner *r, const ct_pipeline_host *ph, int stage, int mb) {
    int k = stage * r->env.n_microbatches + mb;
    if (r->finished[k] && !r->sends_left[k] && !r->released[k]) {
        r->released[k] = 1;
        ph->release(ph->ctx, stage, mb);
    }
}

/* Moves every pending message along without blocking. */
static ct_status progress(runner *r, const ct_pipeline_host *ph) {
    const ct_comm_api *c = r->env.capi;
    if (!has_test(r)) return CT_OK;
    for (int i = 0; i < r->n_in; i++) {
        incoming *m = &r->in[i];
        int done = 0;
        if (!m->hdr_done) {
            ct_status st = c->test(r->env.comm, m->hreq, &done);
            if (st) return st;
            if (!done) continue;
            if ((st = c->wait(r->env.comm, m->hreq))) return st;
            m->hreq = NULL;
            m->hdr_done = 1;
        }
        if (!m->posted) {
            ct_status st = post_data(r, ph, m);
            if (st) return st;
        }
    }
    for (int i = 0; i < r->n_out; i++) {
        outgoing *o = &r->out[i];
        if (!o->dreq) continue;
        int hd = 0, dd = 0;
        ct_status st = c->test(r->env.comm, o->hreq, &hd);
        if (!st) st = c->test(r->env.comm, o->dreq, &dd);
        if (st) return st;
        if (!hd || !dd) continue;
        if ((st = c->wait(r->env.comm, o->hreq)) || (st = c->wait(r->env.comm, o->dreq))) return st;
        o->hreq = o->dreq = NULL;
        r->sends_left[o->stage * r->env.n_microbatches + o->mb]--;
        maybe_release(r, ph, o->stage, o->mb);
    }
    return CT_OK;
}

/* The error of a wait that passed comm.train_timeout_seconds. */
static ct_status timed_out(runner *r, const char *what, int stage, int mb) {
    r->host->set_error(r->host,
                       "pp: rank %d waited %g s (comm.train_timeout_seconds) for %s of stage %d, microbatch %d: a "
                       "pipeline neighbour died or is stuck",
                       r->env.pp_rank, r->timeout, what, stage, mb);
    return CT_ERR_TIMEOUT;
}

/* Tests m's data receive (posted): *done once it completed. */
static ct_status test_data(runner *r, incoming *m) {
    int done = 0;
    ct_status st = r->env.capi->test(r->env.comm, m->dreq, &done);
    if (st || !done) return st;
    st = r->env.capi->wait(r->env.comm, m->dreq);
    m->dreq = NULL;
    m->done = !st;
    return st;
}

/* One turn of a wait that began at t0: every message of the step moved along, then the timeout's error
 * (naming what is awaited) once comm.train_timeout_seconds passed, else the core yielded. */
static ct_status wait_turn(runner *r, const ct_pipeline_host *ph, double t0, const char *what, int stage, int mb) {
    ct_status st = progress(r, ph);
    if (st) return st;
    if (ct_util_now() - t0 > r->timeout) return timed_out(r, what, stage, mb);
    sched_yield();
    return CT_OK;
}

/* Until what (kind, stage, mb) reads has arrived: testing every message of the step meanwhile (a
 * comm with test), else blocked on this one. */
static ct_status await(runner *r, const ct_pipeline_host *ph, int kind, int stage, int mb, double *waited) {
    incoming *m = find_in(r, kind, stage, mb);
    if (!m) return CT_OK; /* a local neighbour: nothing to receive */
    double t0 = ct_util_now();
    ct_status st = CT_OK;
    r->host->trace_begin(r->host, "pp_wait");
    if (has_test(r)) {
        while (!st && !m->done) {
            if (m->posted && (st = test_data(r, m))) break;
            if (!m->done) st = wait_turn(r, ph, t0, "a message", stage, mb);
        }
    } else {
        if (!m->hdr_done) {
            st = r->env.capi->wait(r->env.comm, m->hreq);
            m->hreq = NULL;
            m->hdr_done = !st;
        }
        if (!st && !m->posted) st = post_data(r, ph, m);
        if (!st && !m->done) {
            st = r->env.capi->wait(r->env.comm, m->dreq);
            m->dreq = NULL;
            m->done = !st;
        }
    }
    r->host->trace_end(r->host, "pp_wait");
    *waited += ct_util_now() - t0;
    return st;
}

/* Before this rank's first action of a microbatch: every (stage, mb) whose last action ran is given
 * back, its sends waited for, so the host reuses its context as the schedule plans (a comm without
 * test: its sends complete at the step's end). */
static ct_status drain(runner *r, const ct_pipeline_host *ph, double *waited) {
    if (!has_test(r)) return CT_OK;
    int n = r->env.n_stages * r->env.n_microbatches, nm = r->env.n_microbatches;
    double t0 = ct_util_now();
    ct_status st = CT_OK;
    for (int k = 0; k < n && !st; k++)
        while (!st && r->finished[k] && !r->released[k])
            st = wait_turn(r, ph, t0, "a neighbour to take the sends", k / nm, k % nm);
    *waited += ct_util_now() - t0;
    return st;
}

static ct_status send_out(runner *r, const ct_pipeline_host *ph, int kind, int stage, int mb) {
    int to = kind == CT_PP_ACTIVATION ? stage + 1 : stage - 1, peer = stage_rank(r, to);
    const float *data;
    int ndim;
    int64_t shape[CT_MAX_DIMS], count = 1;
    ct_status st = ph->output(ph->ctx, stage, mb, kind, &data, &ndim, shape);
    if (st) return st;
    if (r->n_out >= r->cap_out) {
        r->host->set_error(r->host, "pp: more sends than actions");
        return CT_ERR_INTERNAL;
    }
    outgoing *o = &r->out[r->n_out++];
    memset(o, 0, sizeof *o);
    o->stage = stage;
    o->mb = mb;
    o->hdr[0] = ndim;
    for (int d = 0; d < ndim; d++) count *= o->hdr[1 + d] = (int32_t)shape[d];
    const ct_comm_api *c = r->env.capi;
    st = c->send(r->env.comm, r->env.group, o->hdr, HDR, CT_I32, peer, tag(r, kind, to, mb, 0), &o->hreq);
    if (!st) st = c->send(r->env.comm, r->env.group, data, count, CT_F32, peer, tag(r, kind, to, mb, 1), &o->dreq);
    if (!st) r->sends_left[stage * r->env.n_microbatches + mb]++;
    return st;
}

static ct_status pp_run_step(ct_runner *p, const ct_pipeline_host *ph, ct_pipeline_stats *stats) {
    runner *r = p;
    const ct_comm_api *c = r->env.capi;
    const ct_host *h = r->host;
    double t_step = ct_util_now(), busy = 0, waited = 0;
    int n = r->env.n_stages * r->env.n_microbatches;
    memset(r->sends_left, 0, sizeof(int) * (size_t)n);
    memset(r->finished, 0, sizeof(int) * (size_t)n);
    memset(r->released, 0, sizeof(int) * (size_t)n);
    memset(r->started, 0, sizeof(int) * (size_t)r->env.n_microbatches);
    r->n_out = 0;
    ct_status st = CT_OK;
    for (int i = 0; i < r->n_in && !st; i++) { /* every header of the step, posted before any work */
        incoming *m = &r->in[i];
        m->hdr_done = m->posted = m->done = 0;
        m->hreq = m->dreq = NULL;
        st = c->recv(r->env.comm, r->env.group, m->hdr, HDR, CT_I32, m->peer, tag(r, m->kind, m->stage, m->mb, 0),
                     &m->hreq);
    }
    static const char *names[] = {"", "pp_F", "pp_B", "pp_I", "pp_W"};
    for (int i = 0; i < r->env.n_actions && !st; i++) {
        const ct_pp_action *a = CT_AT(const ct_pp_action, r->env.actions, i);
        int s = a->stage, mb = a->microbatch;
        if ((st = progress(r, ph))) break;
        if (mb >= 0 && mb < r->env.n_microbatches && !r->started[mb]) {
            if ((st = drain(r, ph, &waited))) break;
            r->started[mb] = 1;
        }
        if (a->op == CT_PP_F && (st = await(r, ph, CT_PP_ACTIVATION, s, mb, &waited))) break;
        if ((a->op == CT_PP_B || a->op == CT_PP_I) && (st = await(r, ph, CT_PP_GRADIENT, s, mb, &waited))) break;
        if (a->op < CT_PP_F || a->op > CT_PP_W) {
            h->set_error(h, "pp: action %d of rank %d has op %d", i, r->env.pp_rank, a->op);
            st = CT_ERR_INVALID;
            break;
        }
        h->trace_begin(h, names[a->op]);
        double t0 = ct_util_now();
        st = a->op == CT_PP_F ? ph->forward(ph->ctx, s, mb) : ph->backward(ph->ctx, s, mb, a->op);
        busy += ct_util_now() - t0;
        h->trace_end(h, names[a->op]);
        if (st) break;
        if (a->op == CT_PP_F && remote_next(r, s)) st = send_out(r, ph, CT_PP_ACTIVATION, s, mb);
        if ((a->op == CT_PP_B || a->op == CT_PP_I) && remote_prev(r, s)) st = send_out(r, ph, CT_PP_GRADIENT, s, mb);
        if (!st && (a->op == CT_PP_B || a->op == CT_PP_W)) {
            r->finished[s * r->env.n_microbatches + mb] = 1;
            maybe_release(r, ph, s, mb);
        }
    }
    /* every send completes before the step ends (its buffers belong to the step's microbatches), and
     * what it held back is released: the step's last microbatches, everything under a comm without test */
    for (int i = 0; i < r->n_out; i++) {
        outgoing *o = &r->out[i];
        int in_flight = o->dreq != NULL; /* both sends started, counted in sends_left */
        ct_status s1 = o->hreq ? c->wait(r->env.comm, o->hreq) : CT_OK;
        ct_status s2 = o->dreq ? c->wait(r->env.comm, o->dreq) : CT_OK;
        o->hreq = o->dreq = NULL;
        if (!st) st = s1 ? s1 : s2;
        if (!st && in_flight) {
            r->sends_left[o->stage * r->env.n_microbatches + o->mb]--;
            maybe_release(r, ph, o->stage, o->mb);
        }
    }
    if (st) { /* leave nothing half-done behind: complete or time out what is still posted */
        for (int i = 0; i < r->n_in; i++) {
            if (r->in[i].hreq) c->wait(r->env.comm, r->in[i].hreq);
            if (r->in[i].dreq) c->wait(r->env.comm, r->in[i].dreq);
            r->in[i].hreq = r->in[i].dreq = NULL;
        }
        return st;
    }
    for (int i = 0; i < r->n_in; i++)
        if (!r->in[i].done) {
            h->set_error(h, "pp: rank %d received a message for stage %d, microbatch %d that no action read",
                         r->env.pp_rank, r->in[i].stage, r->in[i].mb);
            return CT_ERR_INTERNAL;
        }
    stats->busy_seconds = busy;
    stats->wait_seconds = waited;
    stats->step_seconds = ct_util_now() - t_step;
    return CT_OK;
}

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "comm.train_timeout_seconds", CT_OPT_FLOAT, "300",
     "seconds a pipeline rank waits for a neighbour's message, or for a neighbour to take its own, before it "
     "fails naming the stage and microbatch (the comm plugin's key: one timeout for every wait)",
     NULL, NULL},
    {0},
};

static const ct_pipeline_api api = {
    .struct_size = sizeof(ct_pipeline_api),
    .create = pp_create,
    .destroy = pp_destroy,
    .run_step = pp_run_step,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_PIPELINE;
    info->name = "pp";
    info->description = "pipeline runner: a schedule's actions with non-blocking stage-to-stage sends, receives posted early";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
