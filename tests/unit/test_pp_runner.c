/* test_pp_runner.c: the pipeline runner (plugins/pp, ctitan/pipeline.h) driven through its ABI table
 * with a stand-in host, comm and pipeline host, as rank 1 of ZBVZeroBubble on pp 2 (V placement:
 * stages 1 and 2 here, 0 and 3 on the peer), 8 microbatches.
 *
 * The host counts microbatch contexts as core/engine/pipeline.c does: a microbatch takes one at its
 * first action on the rank and gives it back once release() came for each of the rank's stages.
 * The peer is scripted: what it sends is there as soon as it can be (an activation at once, a
 * gradient once it has this rank's activation), but it posts its receives late, so a send of this
 * rank completes only after it has been tested TESTS_TO_TAKE times. The runner must still hold no
 * more microbatches than the schedule plans (3), give every (stage, microbatch) back exactly once,
 * only after its sends completed, and time out naming comm.train_timeout_seconds when the peer
 * stops taking sends. Needs the pp plugin built (make all); CT_PP_PLUGIN=PATH runs another build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctitan/pipeline.h"

#define PP 2
#define RANK 1
#define PEER 0
#define N_STAGES 4
#define N_MB 8
#define ROWS 4
#define COLS 8
#define ELEMS (ROWS * COLS)   /* every boundary tensor is (ROWS, COLS) */
#define TESTS_TO_TAKE 50      /* test() calls before the peer has posted the receive of a send */
#define MAX_REQ 128           /* handles alive at once: 64 at most here (16 messages each way x 2) */
#define STEP_TIMEOUT 10.0     /* comm.train_timeout_seconds when nothing should time out */
#define TINY_TIMEOUT 0.2      /* ... when the peer never takes a send */
#define PEER_VALUE 7.0f       /* what the peer's data messages hold */
#define ALL_SENDS INT_MAX     /* the peer takes every send */
#define SCHEDULE_PEAK 3       /* microbatches rank 1 holds at once when every release comes at once */

/* build/ctitan schedule --name zbv --pp 2 --microbatches 8 --write-csv F, rank 1's row */
static const char zbv_rank1[] =
    "1F0,2F0,1F1,2F1,2I0,2W0,1F2,1I0,1W0,2F2,2I1,2W1,1F3,1I1,1W1,2F3,2I2,2W2,1F4,1I2,1W2,2F4,2I3,2W3,"
    "1F5,1I3,1W3,2F5,2I4,2W4,1F6,1I4,1W4,2F6,2I5,2W5,1F7,1I5,1W5,2F7,2I6,2W6,1I6,2I7,1I7,1W6,2W7,1W7";

static ct_pp_action actions[3 * N_MB * PP];
static int n_actions;

static char violation[512]; /* the first contract breach a fake saw: the test fails on it */

__attribute__((format(printf, 1, 2))) static void breach(const char *fmt, ...) {
    if (violation[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(violation, sizeof violation, fmt, ap);
    va_end(ap);
}

static int rank_of(int stage) { return stage < PP ? stage : 2 * PP - 1 - stage; } /* V placement */
static int local(int stage) { return stage >= 0 && stage < N_STAGES && rank_of(stage) == RANK; }
static int remote_prev(int stage) { return stage > 0 && rank_of(stage - 1) != RANK; }
static int remote_next(int stage) { return stage + 1 < N_STAGES && rank_of(stage + 1) != RANK; }

/* ---------------------------------------------------------------- the host table */

static char last_error[512];
static double timeout_seconds;

static void h_log(const ct_host *h, ct_log_level level, const char *fmt, ...) {
    (void)h;
    (void)level;
    (void)fmt;
}
static void h_set_error(const ct_host *h, const char *fmt, ...) {
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}
static void *h_mem_alloc(const ct_host *h, size_t bytes, ct_mem_category cat) {
    (void)h;
    (void)bytes;
    (void)cat;
    return NULL;
}
static void h_mem_free(const ct_host *h, void *p) {
    (void)h;
    (void)p;
}
static void h_mem_account(const ct_host *h, ct_mem_category cat, int64_t delta) {
    (void)h;
    (void)cat;
    (void)delta;
}
static ct_status h_opt_int(const ct_host *h, const char *key, int64_t *out) {
    (void)h;
    (void)key;
    (void)out;
    return CT_ERR_INVALID;
}
static ct_status h_opt_float(const ct_host *h, const char *key, double *out) {
    (void)h;
    if (strcmp(key, "comm.train_timeout_seconds")) return CT_ERR_INVALID;
    *out = timeout_seconds;
    return CT_OK;
}
static ct_status h_opt_bool(const ct_host *h, const char *key, int *out) {
    (void)h;
    (void)key;
    (void)out;
    return CT_ERR_INVALID;
}
static ct_status h_opt_string(const ct_host *h, const char *key, const char **out) {
    (void)h;
    (void)key;
    (void)out;
    return CT_ERR_INVALID;
}
static void h_trace(const ct_host *h, const char *name) {
    (void)h;
    (void)name;
}

static const ct_host host = {
    .struct_size = sizeof(ct_host),
    .abi_major = CT_ABI_MAJOR,
    .abi_minor = CT_ABI_MINOR,
    .log = h_log,
    .set_error = h_set_error,
    .mem_alloc = h_mem_alloc,
    .mem_free = h_mem_free,
    .mem_account = h_mem_account,
    .opt_int = h_opt_int,
    .opt_float = h_opt_float,
    .opt_bool = h_opt_bool,
    .opt_string = h_opt_string,
    .trace_begin = h_trace,
    .trace_end = h_trace,
};

/* ---------------------------------------------------------------- the comm and the scripted peer */

/* The peer is rank 0 running stages 0 and 3 with the same runner, so its messages carry the runner's
 * tags (pp.c: kind, destination stage, microbatch, part). It takes this rank's sends in the order
 * they were posted, the first `takes` of them (INT_MAX: all), each once the send has been tested
 * TESTS_TO_TAKE times (it posts its receives late) or waited for. It sends what it owes in causal
 * order: an activation for stage 1 at once, the gradient for stage s of microbatch m once it took
 * this rank's activation for stage s + 1 of m; a header lands when tested or waited, data at once. */

struct ct_comm_request {
    int used, is_send, done, tests, order;
    int kind, stage, mb, part; /* from the tag; stage is the message's destination */
    const void *src;           /* a send's buffer, checked unchanged when the send completes */
    unsigned char copy[ELEMS * sizeof(float)];
    size_t bytes;
    int32_t *header; /* a header receive's buffer, written when it lands */
};

struct ct_comm {
    int takes, sends_posted;
    int taken[N_STAGES][N_MB]; /* the peer has this rank's activation for stage s, microbatch m */
    struct ct_comm_request req[MAX_REQ];
    int live; /* handles not yet waited */
    int test_calls;
};

struct ct_comm_group {
    int unused;
};

static ct_comm comm;
static ct_comm_group group;

static int tag_decode(int tag, ct_comm_request *r) {
    r->part = tag % 2;
    r->mb = tag / 2 % N_MB;
    r->stage = tag / 2 / N_MB % N_STAGES;
    r->kind = tag / 2 / N_MB / N_STAGES;
    return tag >= 0 && (r->kind == CT_PP_ACTIVATION || r->kind == CT_PP_GRADIENT);
}

static ct_comm_request *req_new(int tag) {
    for (int i = 0; i < MAX_REQ; i++)
        if (!comm.req[i].used) {
            ct_comm_request *r = &comm.req[i];
            memset(r, 0, sizeof *r);
            if (!tag_decode(tag, r)) {
                breach("comm: tag %d is no message of the runner's", tag);
                return NULL;
            }
            r->used = 1;
            comm.live++;
            return r;
        }
    breach("comm: more than %d operations in flight", MAX_REQ);
    return NULL;
}

/* It completes: a header lands, or a send has been read (its buffer as it was when posted). */
static void req_complete(ct_comm_request *r) {
    if (r->done) return;
    r->done = 1;
    if (r->header) {
        r->header[0] = 2;
        r->header[1] = ROWS;
        r->header[2] = COLS;
    }
    if (!r->is_send) return;
    if (memcmp(r->src, r->copy, r->bytes))
        breach("comm: a send's buffer changed before the send completed (its microbatch released too early?)");
    if (r->kind == CT_PP_ACTIVATION && r->part == 1) comm.taken[r->stage][r->mb] = 1;
}

static int peer_takes(const ct_comm_request *r) { return r->order < comm.takes; }

static int header_can_land(const ct_comm_request *r) {
    return r->kind == CT_PP_ACTIVATION || (r->stage + 1 < N_STAGES && comm.taken[r->stage + 1][r->mb]);
}

/* While this rank blocks, the peer takes what it can of the activation for stage s, microbatch m. */
static void peer_runs(int stage, int mb) {
    for (int i = 0; i < MAX_REQ; i++) {
        ct_comm_request *r = &comm.req[i];
        if (r->used && r->is_send && r->kind == CT_PP_ACTIVATION && r->stage == stage && r->mb == mb && peer_takes(r))
            req_complete(r);
    }
}

static ct_status c_send(ct_comm *c, ct_comm_group *g, const void *buf, int64_t count, ct_dtype dt, int peer, int tag,
                        ct_comm_request **req) {
    if (c != &comm || g != &group || peer != PEER || !req || !buf || count < 1 ||
        (size_t)count * sizeof(float) > sizeof comm.req[0].copy || (dt != CT_F32 && dt != CT_I32)) {
        breach("comm: send of %lld elements (dtype %d) to rank %d, req %p", (long long)count, (int)dt, peer,
               (void *)req);
        return CT_ERR_INVALID;
    }
    ct_comm_request *r = req_new(tag);
    if (!r) return CT_ERR_INVALID;
    if (local(r->stage)) breach("comm: a send to stage %d, which this rank holds", r->stage);
    r->is_send = 1;
    r->order = comm.sends_posted++;
    r->src = buf;
    r->bytes = (size_t)count * 4;
    memcpy(r->copy, buf, r->bytes);
    *req = r;
    return CT_OK;
}

static ct_status c_recv(ct_comm *c, ct_comm_group *g, void *buf, int64_t count, ct_dtype dt, int peer, int tag,
                        ct_comm_request **req) {
    int header = dt == CT_I32 && count >= 3, data = dt == CT_F32 && count == ELEMS;
    if (c != &comm || g != &group || peer != PEER || !req || !buf || !(header || data)) {
        breach("comm: receive of %lld elements (dtype %d) from rank %d, req %p", (long long)count, (int)dt, peer,
               (void *)req);
        return CT_ERR_INVALID;
    }
    ct_comm_request *r = req_new(tag);
    if (!r) return CT_ERR_INVALID;
    if (!local(r->stage)) breach("comm: a receive for stage %d, which this rank does not hold", r->stage);
    if (header) {
        r->header = buf;
    } else {
        for (int i = 0; i < ELEMS; i++) ((float *)buf)[i] = PEER_VALUE;
        r->done = 1;
    }
    *req = r;
    return CT_OK;
}

static ct_status c_test(ct_comm *c, ct_comm_request *r, int *done) {
    comm.test_calls++;
    if (c != &comm || !r || !r->used) {
        breach("comm: test of a handle that is not in flight");
        return CT_ERR_INVALID;
    }
    if (r->is_send ? peer_takes(r) && ++r->tests >= TESTS_TO_TAKE : header_can_land(r)) req_complete(r);
    *done = r->done;
    return CT_OK;
}

/* What never completes: a real comm gives up after its own timeout, this one at once, so the test
 * times the runner's own waits. */
static ct_status c_wait(ct_comm *c, ct_comm_request *r) {
    if (c != &comm || !r || !r->used) {
        breach("comm: wait on a handle that is not in flight");
        return CT_ERR_INVALID;
    }
    r->used = 0;
    comm.live--;
    if (!r->done && !r->is_send && r->kind == CT_PP_GRADIENT) peer_runs(r->stage + 1, r->mb);
    if (!r->done && (r->is_send ? !peer_takes(r) : !header_can_land(r))) return CT_ERR_TIMEOUT;
    req_complete(r);
    return CT_OK;
}

static const ct_comm_api comm_with_test = {
    .struct_size = sizeof(ct_comm_api), .send = c_send, .recv = c_recv, .wait = c_wait, .test = c_test};
/* A comm of an ABI without test (the runner must not read the field) and one that has none (NULL). */
static const ct_comm_api comm_cut_before_test = {
    .struct_size = offsetof(ct_comm_api, test), .send = c_send, .recv = c_recv, .wait = c_wait, .test = c_test};
static const ct_comm_api comm_test_null = {
    .struct_size = sizeof(ct_comm_api), .send = c_send, .recv = c_recv, .wait = c_wait, .test = NULL};

/* ---------------------------------------------------------------- the pipeline host */

static struct {
    int runs[CT_PP_W + 1][N_STAGES][N_MB]; /* [op][stage][mb] */
    int released[N_STAGES][N_MB];
    int has_ctx[N_MB], stages_left[N_MB]; /* a context per microbatch, as ctx_get / cb_release */
    int live, peak;
    int given[N_STAGES][N_MB][2]; /* input() handed out [kind] */
    float out[N_STAGES][N_MB][2][ELEMS], in[N_STAGES][N_MB][2][ELEMS];
} ph;

static void ph_reset(void) { /* the host's state at the start of a step */
    memset(&ph, 0, sizeof ph);
    for (int m = 0; m < N_MB; m++) ph.stages_left[m] = N_STAGES / PP; /* the rank's stages */
}

static void ctx_take(int mb) {
    if (ph.has_ctx[mb]) return;
    ph.has_ctx[mb] = 1;
    if (++ph.live > ph.peak) ph.peak = ph.live;
}

static int bad_call(const char *what, int stage, int mb) {
    if (local(stage) && mb >= 0 && mb < N_MB) return 0;
    breach("host: %s of stage %d, microbatch %d, not rank %d's", what, stage, mb, RANK);
    return 1;
}

static void fill(float *x, float v) {
    for (int i = 0; i < ELEMS; i++) x[i] = v;
}

/* What a stage reads from the peer arrived before its work: the runner waited for it. */
static int received(int stage, int mb, int kind) {
    const float *x = ph.in[stage][mb][kind];
    return ph.given[stage][mb][kind] && x[0] == PEER_VALUE && x[ELEMS - 1] == PEER_VALUE;
}

static ct_status p_forward(void *ctx, int stage, int mb) {
    (void)ctx;
    if (bad_call("forward", stage, mb)) return CT_ERR_INTERNAL;
    if (remote_prev(stage) && !received(stage, mb, CT_PP_ACTIVATION))
        breach("host: F%d of microbatch %d before its input arrived", stage, mb);
    ctx_take(mb);
    ph.runs[CT_PP_F][stage][mb]++;
    fill(ph.out[stage][mb][CT_PP_ACTIVATION], (float)(100 * stage + mb + 1));
    return CT_OK;
}

static ct_status p_backward(void *ctx, int stage, int mb, int op) {
    (void)ctx;
    if (bad_call("backward", stage, mb)) return CT_ERR_INTERNAL;
    if (op < CT_PP_B || op > CT_PP_W) {
        breach("host: backward with op %d", op);
        return CT_ERR_INTERNAL;
    }
    if (op != CT_PP_W && remote_next(stage) && !received(stage, mb, CT_PP_GRADIENT))
        breach("host: backward of stage %d, microbatch %d before its output gradient arrived", stage, mb);
    if (op == CT_PP_W && !ph.runs[CT_PP_I][stage][mb]) breach("host: W%d of microbatch %d before its I", stage, mb);
    ctx_take(mb);
    ph.runs[op][stage][mb]++;
    if (op != CT_PP_W) fill(ph.out[stage][mb][CT_PP_GRADIENT], (float)(-100 * stage - mb - 1));
    return CT_OK;
}

static ct_status p_output(void *ctx, int stage, int mb, int kind, const float **data, int *ndim, int64_t *shape) {
    (void)ctx;
    if (bad_call("output", stage, mb)) return CT_ERR_INTERNAL;
    int ran = kind == CT_PP_ACTIVATION ? ph.runs[CT_PP_F][stage][mb]
                                       : ph.runs[CT_PP_B][stage][mb] + ph.runs[CT_PP_I][stage][mb];
    int crosses = kind == CT_PP_ACTIVATION ? remote_next(stage) : kind == CT_PP_GRADIENT && remote_prev(stage);
    if (!ran || !crosses) breach("host: output kind %d of stage %d, microbatch %d", kind, stage, mb);
    if (kind != CT_PP_ACTIVATION && kind != CT_PP_GRADIENT) return CT_ERR_INTERNAL;
    *data = ph.out[stage][mb][kind];
    *ndim = 2;
    shape[0] = ROWS;
    shape[1] = COLS;
    return CT_OK;
}

static ct_status p_input(void *ctx, int stage, int mb, int kind, int ndim, const int64_t *shape, float **data) {
    (void)ctx;
    if (bad_call("input", stage, mb)) return CT_ERR_INTERNAL;
    int crosses = kind == CT_PP_ACTIVATION ? remote_prev(stage) : kind == CT_PP_GRADIENT && remote_next(stage);
    if (!crosses || ndim != 2 || shape[0] != ROWS || shape[1] != COLS || ph.given[stage][mb][kind]) {
        breach("host: input kind %d of stage %d, microbatch %d, %d dims", kind, stage, mb, ndim);
        return CT_ERR_INTERNAL;
    }
    if (kind == CT_PP_GRADIENT) ctx_take(mb); /* an activation waits in a buffer of its own */
    ph.given[stage][mb][kind] = 1;
    fill(ph.in[stage][mb][kind], 0);
    *data = ph.in[stage][mb][kind];
    return CT_OK;
}

static void p_release(void *ctx, int stage, int mb) {
    (void)ctx;
    if (bad_call("release", stage, mb)) return;
    if (ph.runs[CT_PP_B][stage][mb] + ph.runs[CT_PP_W][stage][mb] != 1)
        breach("host: stage %d, microbatch %d released before its last action", stage, mb);
    if (!ph.has_ctx[mb]) breach("host: stage %d, microbatch %d released without a context", stage, mb);
    ph.released[stage][mb]++;
    fill(ph.out[stage][mb][CT_PP_ACTIVATION], -1); /* the memory goes to another microbatch */
    fill(ph.out[stage][mb][CT_PP_GRADIENT], -1);
    if (--ph.stages_left[mb] > 0 || !ph.has_ctx[mb]) return;
    ph.has_ctx[mb] = 0;
    ph.live--;
}

static const ct_pipeline_host pipeline_host = {
    .struct_size = sizeof(ct_pipeline_host),
    .forward = p_forward,
    .backward = p_backward,
    .output = p_output,
    .input = p_input,
    .release = p_release,
};

/* ---------------------------------------------------------------- the runner under test */

static void *so;
static const ct_pipeline_api *api;

static int parse_schedule(void) {
    n_actions = 0;
    for (const char *p = zbv_rank1; *p;) {
        int stage, mb, used = 0;
        char op;
        if (sscanf(p, "%d%c%d%n", &stage, &op, &mb, &used) != 3 || n_actions == (int)(sizeof actions / sizeof *actions))
            return -1;
        ct_pp_action *a = &actions[n_actions++];
        a->struct_size = sizeof *a;
        a->op = op == 'F' ? CT_PP_F : op == 'B' ? CT_PP_B : op == 'I' ? CT_PP_I : CT_PP_W;
        a->stage = stage;
        a->microbatch = mb;
        p += used;
        if (*p == ',') p++;
    }
    return n_actions == 3 * N_MB * PP ? 0 : -1;
}

static int load(void **state) {
    (void)state;
    if (parse_schedule()) {
        fprintf(stderr, "test_pp_runner: cannot parse the schedule\n");
        return -1;
    }
    const char *env = getenv("CT_PP_PLUGIN"), *path = env && *env ? env : CT_BUILD_PLUGIN_DIR "/ctitan-pp.so";
    so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        return -1;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    if (!entry || entry(&host, &info) != CT_OK || info.kind != CT_KIND_PIPELINE || info.abi_major != CT_ABI_MAJOR ||
        !info.api) {
        fprintf(stderr, "%s: not a pipeline plugin of ABI %d\n", path, CT_ABI_MAJOR);
        return -1;
    }
    api = info.api;
    return 0;
}

static int unload(void **state) {
    (void)state;
    if (so) dlclose(so);
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A runner for rank 1 over `capi`, the peer taking the first `takes` sends, the option at `timeout`. */
static ct_runner *runner_new(const ct_comm_api *capi, int takes, double timeout) {
    memset(&comm, 0, sizeof comm);
    comm.takes = takes;
    violation[0] = last_error[0] = 0;
    timeout_seconds = timeout;
    ct_pipeline_env env = {
        .struct_size = sizeof env,
        .capi = capi,
        .comm = &comm,
        .group = &group,
        .pp_rank = RANK,
        .pp_size = PP,
        .n_stages = N_STAGES,
        .n_microbatches = N_MB,
        .placement = CT_PP_V,
        .actions = actions,
        .n_actions = n_actions,
    };
    ct_runner *r = NULL;
    if (api->create(&host, &env, &r) != CT_OK || !r) fail_msg("create: %s", last_error);
    return r;
}

/* One step; *seconds is its wall time. */
static ct_status step(ct_runner *r, double *seconds) {
    ph_reset();
    comm.sends_posted = 0; /* the peer starts its step too */
    memset(comm.taken, 0, sizeof comm.taken);
    last_error[0] = 0;
    ct_pipeline_stats stats = {.struct_size = sizeof stats};
    double t0 = now();
    ct_status st = api->run_step(r, &pipeline_host, &stats);
    *seconds = now() - t0;
    if (st == CT_OK && (stats.step_seconds < 0 || stats.busy_seconds < 0 || stats.wait_seconds < 0 ||
                        stats.busy_seconds + stats.wait_seconds > stats.step_seconds + 1e-6))
        fail_msg("stats: busy %g + wait %g s against a step of %g s", stats.busy_seconds, stats.wait_seconds,
                 stats.step_seconds);
    return st;
}

/* After a finished step: every action ran once and nothing else ran; no fake saw a breach; every
 * handle was waited; each local (stage, mb) was released exactly once. */
static void check_step(void) {
    if (violation[0]) fail_msg("%s", violation);
    assert_int_equal(comm.live, 0);
    int total = 0;
    for (int op = CT_PP_F; op <= CT_PP_W; op++)
        for (int s = 0; s < N_STAGES; s++)
            for (int m = 0; m < N_MB; m++) total += ph.runs[op][s][m];
    assert_int_equal(total, n_actions);
    for (int i = 0; i < n_actions; i++) {
        const ct_pp_action *a = &actions[i];
        if (ph.runs[a->op][a->stage][a->microbatch] != 1)
            fail_msg("action %d (op %d, stage %d, microbatch %d) ran %d times", i, a->op, a->stage, a->microbatch,
                     ph.runs[a->op][a->stage][a->microbatch]);
    }
    for (int s = 0; s < N_STAGES; s++)
        for (int m = 0; m < N_MB; m++) {
            if (ph.released[s][m] != local(s))
                fail_msg("stage %d, microbatch %d released %d times, expected %s", s, m, ph.released[s][m],
                         local(s) ? "once" : "never");
        }
}

/* ---------------------------------------------------------------- the tests */

/* The reference: the host alone, every (stage, mb) released right after its last action. */
static void test_schedule_holds_three_microbatches_with_immediate_releases(void **state) {
    (void)state;
    ph_reset();
    violation[0] = 0;
    for (int i = 0; i < n_actions; i++) {
        const ct_pp_action *a = &actions[i];
        if (a->op == CT_PP_F) {
            if (remote_prev(a->stage)) {
                float *x;
                int64_t shape[2] = {ROWS, COLS};
                assert_int_equal(p_input(NULL, a->stage, a->microbatch, CT_PP_ACTIVATION, 2, shape, &x), CT_OK);
                fill(x, PEER_VALUE);
            }
            assert_int_equal(p_forward(NULL, a->stage, a->microbatch), CT_OK);
        } else {
            if (a->op == CT_PP_I && remote_next(a->stage)) {
                float *x;
                int64_t shape[2] = {ROWS, COLS};
                assert_int_equal(p_input(NULL, a->stage, a->microbatch, CT_PP_GRADIENT, 2, shape, &x), CT_OK);
                fill(x, PEER_VALUE);
            }
            assert_int_equal(p_backward(NULL, a->stage, a->microbatch, a->op), CT_OK);
        }
        if (a->op == CT_PP_W || a->op == CT_PP_B) p_release(NULL, a->stage, a->microbatch);
    }
    check_step();
    assert_int_equal(ph.live, 0);
    assert_int_equal(ph.peak, SCHEDULE_PEAK);
}

/* A peer that posts its receives late: the runner waits for a finished microbatch's sends before it
 * starts the next microbatch, so contexts are reused as the schedule plans (a runner that only tests
 * between actions leaves them held, and the host takes one more context per late send). */
static void test_late_sends_hold_no_more_microbatches_than_the_schedule(void **state) {
    (void)state;
    ct_runner *r = runner_new(&comm_with_test, ALL_SENDS, STEP_TIMEOUT);
    double seconds;
    ct_status st = step(r, &seconds);
    if (st != CT_OK) fail_msg("run_step: status %d: %s", st, last_error);
    if (ph.peak != SCHEDULE_PEAK)
        fail_msg("rank 1 held %d microbatch contexts at once; the schedule holds %d", ph.peak, SCHEDULE_PEAK);
    check_step();
    assert_int_equal(ph.live, 0);
    assert_true(comm.test_calls > 0);
    api->destroy(r);
}

/* A peer that stops taking sends: the runner gives up within about comm.train_timeout_seconds and
 * says so, handing every handle back. Taking none, the peer never answers, and the wait for the first
 * gradient times out; taking this rank's first two activations (two sends each: header and data) it
 * answers them, and the wait before microbatch 3 for microbatch 0's gradient send times out. */
static void test_sends_never_taken_time_out_naming_the_option(void **state) {
    (void)state;
    static const int takes[] = {0, 4};
    for (int k = 0; k < 2; k++) {
        ct_runner *r = runner_new(&comm_with_test, takes[k], TINY_TIMEOUT);
        double seconds;
        ct_status st = step(r, &seconds);
        if (st != CT_ERR_TIMEOUT)
            fail_msg("peer takes %d: status %d, expected a timeout: %s", takes[k], st, last_error);
        if (!strstr(last_error, "comm.train_timeout_seconds"))
            fail_msg("peer takes %d: the message does not name comm.train_timeout_seconds: '%s'", takes[k], last_error);
        if (seconds < TINY_TIMEOUT || seconds > TINY_TIMEOUT + 1.0)
            fail_msg("peer takes %d: timed out after %.3f s with comm.train_timeout_seconds = %g", takes[k], seconds,
                     TINY_TIMEOUT);
        if (violation[0]) fail_msg("%s", violation);
        assert_int_equal(comm.live, 0);
        api->destroy(r);
    }
}

/* A comm without test (NCCL): nothing is tested, the sends complete in the step's closing waits (as
 * before the runner waited for them between microbatches) and everything is released there. */
static void test_comm_without_test_completes_sends_at_wait(void **state) {
    (void)state;
    const ct_comm_api *apis[] = {&comm_cut_before_test, &comm_test_null};
    for (int k = 0; k < 2; k++) {
        ct_runner *r = runner_new(apis[k], ALL_SENDS, STEP_TIMEOUT);
        double seconds;
        ct_status st = step(r, &seconds);
        if (st != CT_OK) fail_msg("comm %d: run_step: status %d: %s", k, st, last_error);
        check_step();
        assert_int_equal(comm.test_calls, 0);
        api->destroy(r);
    }
}

/* The runner's per-step state starts over: a second step runs, sends and releases like the first. */
static void test_second_step_on_the_same_runner(void **state) {
    (void)state;
    ct_runner *r = runner_new(&comm_with_test, ALL_SENDS, STEP_TIMEOUT);
    for (int i = 0; i < 2; i++) {
        double seconds;
        ct_status st = step(r, &seconds);
        if (st != CT_OK) fail_msg("step %d: run_step: status %d: %s", i, st, last_error);
        if (ph.peak != SCHEDULE_PEAK) fail_msg("step %d: peak %d microbatches", i, ph.peak);
        check_step();
    }
    api->destroy(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_holds_three_microbatches_with_immediate_releases),
        cmocka_unit_test(test_late_sends_hold_no_more_microbatches_than_the_schedule),
        cmocka_unit_test(test_sends_never_taken_time_out_naming_the_option),
        cmocka_unit_test(test_comm_without_test_completes_sends_at_wait),
        cmocka_unit_test(test_second_step_on_the_same_runner),
    };
    return cmocka_run_group_tests(tests, load, unload);
}
