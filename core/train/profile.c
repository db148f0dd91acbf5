/* profile.c: torchtitan's profiling schedule and memory snapshots.
 *
 * torchtitan's torch.profiler schedule repeats every profile_freq steps: wait, profiler_warmup steps,
 * then profiler_active steps traced; the trace is written at the window's last step into
 * iteration_<step>/rank<R>_trace.json. Here recording starts only at the active steps (warmup has
 * nothing to warm up), so memory holds one window's events. Each rank writes its file; after a
 * barrier rank 0 joins them into iteration_<step>/trace.json, one process track per rank. */
#include "train/profile.h"

#include "host/host.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ct_status profiler_open(profiler *p, const manifest *mf, const profile_settings *ps, const char *dump) {
    char where[600];
    memset(p, 0, sizeof *p);
    p->trace = ps->trace;
    p->snapshot = ps->snapshot;
    p->freq = ps->freq;
    p->warmup = ps->warmup;
    p->active = ps->active;
    const char *key = p->freq < 1 ? "profiling.profile_freq" : p->active < 1 ? "profiling.profiler_active"
                      : p->warmup < 0 || p->warmup + p->active > p->freq ? "profiling.profiler_warmup" : NULL;
    if (key) {
        mf_where(mf, key, where, sizeof where);
        fprintf(stderr, "ctitan: %s: need profile_freq >= 1, profiler_active >= 1, profiler_warmup >= 0 and "
                        "profiler_warmup + profiler_active <= profile_freq (got %lld, %lld, %lld)\n",
                where, (long long)p->freq, (long long)p->active, (long long)p->warmup);
        return CT_ERR_INVALID;
    }
    snprintf(p->traces, sizeof p->traces, "%s/%s", dump, ps->traces);
    snprintf(p->snaps, sizeof p->snaps, "%s/%s", dump, ps->snaps);
    return CT_OK;
}

/* The last profiler_active steps of each profile_freq window (steps count from 1). */
static int in_window(const profiler *p, int64_t step) { return (step - 1) % p->freq >= p->freq - p->active; }
static int window_end(const profiler *p, int64_t step) { return step % p->freq == 0; }

void profiler_step_begin(profiler *p, int64_t step) {
    if (p->trace) trace_set_on(in_window(p, step));
    if (p->snapshot && window_end(p, step)) memsnap_arm();
}

/* Every rank reaches this point (an all-reduce on the world group): CT_OK, or the comm's status. */
static ct_status barrier(session *s) {
    if (!s->capi || s->world <= 1) return CT_OK;
    ct_comm_group *world;
    double x = 0;
    ct_status st = s->capi->world(s->comm, &world);
    if (st == CT_OK) st = s->capi->all_reduce(s->comm, world, &x, &x, 1, CT_F64, CT_REDUCE_MAX, NULL);
    return st;
}

/* Makes base/iteration_<step> (in out): CT_OK, or CT_ERR_IO after a warning line (no error: the
 * training goes on without this window's files). */
static ct_status iteration_dir(const char *base, int64_t step, char *out, size_t len) {
    snprintf(out, len, "%s/iteration_%lld", base, (long long)step);
    if (!ct_mkdir_p(out)) return CT_OK;
    fprintf(stderr, "ctitan: warning: cannot create %s (the training goes on)\n", out);
    return CT_ERR_IO;
}

/* The window's trace files; a file that cannot be written is a warning. CT_OK, or the barrier's
 * status. */
static ct_status trace_finish(const profiler *p, session *s, int64_t step) {
    char dir[2200], path[2400];
    int world = s->world > 1 ? s->world : 1, rank = world > 1 ? s->rank : 0;
    if (iteration_dir(p->traces, step, dir, sizeof dir) != CT_OK) trace_discard();
    else {
        snprintf(path, sizeof path, "%s/rank%d_trace.json", dir, rank);
        if (trace_write_rank(path, rank) != CT_OK)
            fprintf(stderr, "ctitan: warning: %s (the training goes on)\n", ct_last_error());
    }
    ct_status st = barrier(s); /* every rank's file is complete before rank 0 reads them */
    if (st != CT_OK) return st;
    if (rank != 0) return CT_OK;
    snprintf(path, sizeof path, "%s/trace.json", dir);
    if (trace_merge(path, dir, world) != CT_OK)
        fprintf(stderr, "ctitan: warning: %s (the training goes on)\n", ct_last_error());
    else printf("trace: %s\n", path);
    return CT_OK;
}

/* The snapshot, its parameters and gradients named by tensor (this rank's local bytes of each). */
static void snapshot_finish(const profiler *p, session *s, int64_t step) {
    char dir[2200], path[2400];
    int n = s->rt.n_params, rank = s->world > 1 ? s->rank : 0;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    int64_t *bytes = calloc((size_t)n + 1, sizeof *bytes);
    if (!names || !bytes) {
        fprintf(stderr, "ctitan: warning: out of memory for the memory snapshot (the training goes on)\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        names[i] = s->rt.params[i]->t.name;
        bytes[i] = s->rt.slots[i].local_numel * (int64_t)sizeof(float);
    }
    if (iteration_dir(p->snaps, step, dir, sizeof dir) != CT_OK) goto out;
    snprintf(path, sizeof path, "%s/rank%d_memory_snapshot.json", dir, rank);
    if (memsnap_write(path, rank, step, names, bytes, n) != CT_OK)
        fprintf(stderr, "ctitan: warning: %s (the training goes on)\n", ct_last_error());
    else if (rank == 0) printf("memory snapshot: %s\n", path);
out:
    free(names);
    free(bytes);
}

void profiler_step_end(profiler *p, int64_t step) {
    if (p->trace) trace_set_on(0);
    if (p->snapshot && window_end(p, step)) memsnap_freeze();
}

ct_status profiler_write(profiler *p, session *s, int64_t step) {
    if (p->snapshot && window_end(p, step)) snapshot_finish(p, s, step);
    if (p->trace && window_end(p, step)) return trace_finish(p, s, step);
    return CT_OK;
}
