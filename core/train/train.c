/* train.c: `ctitan train` and `ctitan generate`: the loop (datasets, validation, metrics lines and
 * metrics.jsonl, TensorBoard, signals, checkpoints driven, the profiler's calls around each step),
 * the dry run, and the end-of-run model save and sample. A step itself (microbatches, clipping, the
 * optimizer) is the session's (engine/session.c); the learning rate is engine/lr.c's. */
#include "checkpoint/checkpoint.h"
#include "base/util.h"
#include "host/commstats.h"
#include "data/data.h"
#include "engine/lr.h"
#include "engine/mesh.h"
#include "train/profile.h"
#include "host/runlock.h"
#include "host/tensorboard.h"
#include "engine/session.h"
#include "host/rank.h"
#include "train/settings.h"
#include "train/train.h"
#include "plan/plan.h"
#include "tokenizer/chat.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *train_usage =
    "usage: ctitan train MANIFEST.yaml [--section.key=value ...] [--print-config] [--dry-run]\n"
    "  Trains the model the manifest names. Overrides use torchtitan's keys; the last one wins.\n"
    "  --print-config   print the effective configuration and continue\n"
    "  --dry-run        load and check everything, print the planner's evaluation (memory; time with plan.hardware); do not train\n";

static double gib(int64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* compile.enable: the steady-state microbatch as one device graph (runtime.c) where the device
 * captures graphs (ABI 1.5) and nothing in the step needs the host mid-way: one rank (the
 * strategies' collectives are not captured), no quantizer (its scales are read back). */
static void compile_setup(session *s, int compile) {
    if (!compile) return;
    const ct_device_api *d = s->rt.d;
    const char *name = s->devp->info.name, *why = NULL;
    if (!CT_HAS_FIELD(d, ct_device_api, graph_free) || !d->graph_begin || !d->graph_end || !d->graph_launch ||
        !d->graph_free || !d->sum_to_device || !d->cross_entropy_backward_dev)
        why = "the device has no graph capture (ABI 1.5 graph_begin)";
    else if (s->world > 1 || s->rt.dist.n_st > 0 || s->pl)
        why = "not with several ranks or a parallelism plugin yet (their hooks and collectives are not captured)";
    else if (s->rt.qapi)
        why = "not with a quantizer (its scales are read back on the host)";
    else if (s->rt.offload.layers)
        why = "not with activation offload (its copies to and from the host are not captured)";
    if (why) {
        printf("compile.enable: no effect on the %s device: %s; the step runs eagerly\n", name, why);
        return;
    }
    s->rt.graph.enabled = 1;
    printf("compile.enable: each microbatch's forward and backward will be captured in a %s graph once the "
           "arenas are steady (the third microbatch), then replayed\n",
           name);
}

/* One line when a capture happened or failed since the last step. */
static void compile_report(const runtime_graph *g, int64_t step, int64_t *told) {
    if (g->failed && *told >= 0) {
        printf("compile.enable: the capture failed at step %lld (%s); the step runs eagerly\n", (long long)step,
               g->why);
        *told = -1;
    } else if (g->captures > *told && *told >= 0) {
        printf("compile.enable: step %lld: captured one microbatch's forward and backward as a graph of %lld "
               "device operations (capture %lld); later microbatches launch it\n",
               (long long)step, (long long)g->ops, (long long)g->captures);
        *told = g->captures;
    }
}

static void print_model_summary(session *s, int64_t seq_len) {
    const ct_model_desc *d = &s->rt.desc;
    printf("model: %s (%s): %.3fM parameters (%.3fM without embeddings), %d units, %.3f GFLOP per token at seq %lld\n",
           s->modelp->info.name, s->modelp->path, (double)d->n_params / 1e6,
           (double)(d->n_params - d->n_embedding_params) / 1e6, d->n_units, d->flops_per_token / 1e9,
           (long long)seq_len);
}

/* The GPUs the run would have: the job's ranks under `ctitan launch`, else the manifest's degrees
 * (data_parallel_shard_degree -1 then counts as 1). */
static int run_world(const train_settings *ts) {
    int env = mesh_env_world_size();
    if (env > 1) return env;
    int64_t world = 1;
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        int64_t v = ts->degree[a];
        if (v > 1 && v < (1 << 20)) world *= v;
    }
    return world < (1 << 20) ? (int)world : 1;
}

/* --dry-run: the planner's evaluation of this manifest for the world it would run on. */
static ct_status dry_run(session *s, const train_settings *ts, int argc, char **argv) {
    ct_model_desc d = {.struct_size = sizeof d};
    if (s->m->describe(s->model, &d) != CT_OK) {
        fprintf(stderr, "ctitan: model describe failed: %s\n", ct_last_error());
        return CT_ERR_INTERNAL;
    }
    int world = run_world(ts);
    printf("dry run: model %s, %d layers, dim %lld, vocab %lld, %.3fB parameters, %.3f GFLOP per token; %d GPUs\n",
           s->modelp->info.name, d.n_layers, (long long)d.dim, (long long)d.vocab_size, (double)d.n_params / 1e9,
           d.flops_per_token / 1e9, world);
    plan_result r;
    hw_profile hw;
    int have_hw;
    if (plan_for_run(argc, argv, train_usage, mdesc_from_checkpoint, world, NULL, &r, &hw, &have_hw) != CT_OK) {
        fprintf(stderr, "ctitan: plan: %s\n", ct_last_error());
        hw_profile_free(&hw);
        return CT_ERR_INVALID;
    }
    plan_print_text(stdout, &r, have_hw ? &hw : NULL);
    if (!have_hw) printf("  (plan.hardware is not set: memory only; name a profile of configs/hardware/ or write one with "
                         "`ctitan plan --calibrate` for step time)\n");
    hw_profile_free(&hw);
    return CT_OK;
}

/* checkpoint.last_save_in_hf: what the final export needs, checked before training (the names and
 * shapes of the parameters under the pack's Hugging Face table, and a checkpoint folder to write into). */
static ct_status check_hf_export(session *s, manifest *mf, const train_settings *ts) {
    char where[600];
    if (!ts->hf_export) return CT_OK;
    mf_where(mf, "checkpoint.last_save_in_hf", where, sizeof where);
    if (!ts->ckpt_enable) {
        fprintf(stderr, "ctitan: %s: the final Hugging Face export goes into the checkpoint folder; it needs "
                        "checkpoint.enable: true\n", where);
        return CT_ERR_INVALID;
    }
    ct_status rc = ckpt_hf_export_check(s, where);
    if (rc != CT_OK) fprintf(stderr, "ctitan: %s\n", ct_last_error());
    return rc;
}

/* ---- run history: metrics.jsonl is appended, never truncated; every record carries the wall-clock
 * time and the id of the start that wrote it, so the steps of a run resumed after a stop or crash
 * sit after those of the start before, each under its own run_id. ---- */
typedef struct run_log {
    FILE *f;         /* metrics.jsonl on rank 0; NULL on the other ranks */
    char path[4200]; /* job.dump_folder/metrics.jsonl */
    char id[64];     /* this start's run_id: UTC start time, pid, 16 random bits */
    tb_writer *tb;   /* metrics.enable_tensorboard: rank 0's event file under save_tb_folder/run_id */
} run_log;

static void run_id_make(char *out, size_t len) {
    uint16_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) r = (uint16_t)(ct_now() * 1e9);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(out, len, "%s-%ld-%04x", day, (long)getpid(), r);
}

/* s as a JSON string literal in out (quotes, backslashes and control bytes escaped; cut to fit). */
static void json_quote(char *out, size_t len, const char *s) {
    size_t k = 0;
    out[k++] = '"';
    for (; *s && k + 8 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') k += (size_t)snprintf(out + k, len - k, "\\%c", c);
        else if (c < 0x20) k += (size_t)snprintf(out + k, len - k, "\\u%04x", c);
        else out[k++] = (char)c;
    }
    out[k++] = '"';
    out[k] = 0;
}

/* Makes sure a write error (ENOSPC, EIO, a file size limit) is reported, not lost in a buffer: CT_OK,
 * or CT_ERR_IO with the file named. */
static ct_status log_flush(run_log *lg) {
    if (fflush(lg->f) == 0 && !ferror(lg->f)) return CT_OK;
    return ct_fail(CT_ERR_IO, "cannot write %s: %s", lg->path, strerror(errno ? errno : EIO));
}

/* Appends one record: the fields fmt gives (no braces), then time and run_id. CT_ERR_IO on a write
 * error (ct_last_error says which). */
__attribute__((format(printf, 2, 3))) static ct_status log_record(run_log *lg, const char *fmt, ...) {
    if (!lg->f) return CT_OK;
    char now[40];
    ct_utc_iso(now, sizeof now);
    va_list ap;
    va_start(ap, fmt);
    fputc('{', lg->f);
    vfprintf(lg->f, fmt, ap);
    va_end(ap);
    fprintf(lg->f, ", \"time\": \"%s\", \"run_id\": \"%s\"}\n", now, lg->id);
    errno = 0;
    return log_flush(lg);
}

/* Closes the TensorBoard file and metrics.jsonl: CT_OK, or CT_ERR_IO with the first failure's line. */
static ct_status log_close(run_log *lg) {
    if (!lg->f) return CT_OK;
    ct_status st = tb_close(lg->tb);
    lg->tb = NULL;
    ct_status flushed = log_flush(lg);
    if (st == CT_OK) st = flushed;
    errno = 0;
    if (fclose(lg->f) && st == CT_OK)
        st = ct_fail(CT_ERR_IO, "cannot write %s: %s", lg->path, strerror(errno ? errno : EIO));
    lg->f = NULL;
    return st;
}

/* v's maximum over every rank of the job (itself on one rank): how the ranks agree on a refusal at
 * start-up and on a stop signal each step (one 4-byte-sized collective). CT_OK, or the comm's status. */
static ct_status world_max(session *s, int v, int *out) {
    *out = v;
    if (!s->capi) return CT_OK;
    ct_comm_group *world;
    double x = v;
    ct_status st = s->capi->world(s->comm, &world);
    if (st == CT_OK) st = s->capi->all_reduce(s->comm, world, &x, &x, 1, CT_F64, CT_REDUCE_MAX, NULL);
    if (st != CT_OK) return st;
    *out = (int)x;
    return CT_OK;
}

/* metrics.enable_tensorboard: rank 0's event file in its own folder per start, save_tb_folder/run_id,
 * so a rerun or a resume in the same dump folder shows in TensorBoard as a run of its own. CT_OK, or a
 * status with the line set (naming the key). */
static ct_status tb_log_open(const manifest *mf, const train_settings *ts, const char *dump, run_log *lg) {
    const char *sub = ts->tb_folder;
    char folder[4200], where[600];
    if (!ts->tensorboard) return CT_OK;
    mf_where(mf, "metrics.save_tb_folder", where, sizeof where);
    if (!*sub)
        return ct_fail(CT_ERR_INVALID, "%s: empty; expected a folder name (under job.dump_folder) or an absolute path",
                       where);
    if (sub[0] == '/') snprintf(folder, sizeof folder, "%s/%s", sub, lg->id);
    else snprintf(folder, sizeof folder, "%s/%s/%s", dump, sub, lg->id);
    if (!(lg->tb = tb_open(folder))) return ct_fail(CT_ERR_IO, "%s: %s", where, ct_last_error());
    printf("tensorboard: writing %s\n", tb_path(lg->tb));
    return CT_OK;
}

/* Rank 0 takes the dump folder's lock and opens metrics.jsonl to append; every rank learns whether
 * that worked, so a refused job ends on all of them. */
static ct_status run_log_open(session *s, const manifest *mf, const train_settings *ts, const char *dump, run_log *lg) {
    int bad = 0;
    memset(lg, 0, sizeof *lg);
    snprintf(lg->path, sizeof lg->path, "%s/metrics.jsonl", dump);
    if (s->rank == 0) {
        char where[600];
        run_id_make(lg->id, sizeof lg->id);
        mf_where(mf, "job.dump_folder", where, sizeof where);
        if (runlock_acquire(dump, lg->id) != CT_OK) {
            fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
            bad = 1;
        } else if (!(lg->f = ct_fopen_nofollow(lg->path, "a"))) {
            fprintf(stderr, "ctitan: %s: cannot open %s to append: %s\n", where, lg->path, ct_open_strerror(errno));
            bad = 1;
        } else if (tb_log_open(mf, ts, dump, lg) != CT_OK) {
            fprintf(stderr, "ctitan: %s\n", ct_last_error());
            bad = 1;
        }
    }
    if (world_max(s, bad, &bad) != CT_OK) {
        fprintf(stderr, "ctitan: start-up: %s\n", ct_last_error());
        return CT_ERR_INTERNAL;
    }
    if (!bad) printf("run: id %s; appending to %s\n", lg->id, lg->path);
    return bad ? CT_ERR_INVALID : CT_OK;
}

/* ---- stop signals: SIGTERM (Slurm preemption, a forwarded stop) and SIGINT end the run after the
 * current step, with a checkpoint when checkpoints are on; a second one ends it at once. ---- */
static volatile sig_atomic_t g_stop_signal; /* the first stop signal seen; 0 while none */

static void on_stop_signal(int sig) {
    if (g_stop_signal) {
        static const char msg[] = "ctitan: a second stop signal: exiting now, nothing saved\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + sig); /* the process ends in the handler, not through main.c: the shell's convention */
    }
    g_stop_signal = sig;
}

/* on: the stop handler for SIGTERM and SIGINT; off: back to what they were (a shell's background job
 * ignores SIGINT, for one). */
static void stop_signals_catch(int on) {
    static struct sigaction old_term, old_int;
    static int caught;
    if (!on) {
        if (caught) {
            sigaction(SIGTERM, &old_term, NULL);
            sigaction(SIGINT, &old_int, NULL);
        }
        caught = 0;
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* file writes and reads in flight go on */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    caught = 1;
}

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

/* After the step all ranks agreed to stop at: a full, resumable checkpoint (when checkpoints are
 * on), the stop record, one line. CT_OK (the caller ends the run on the signal: exit 128 + it, the
 * shell's convention for a process ended by a signal), or CT_ERR_IO if the save or the record
 * failed. */
static ct_status stop_after(session *s, ckpt_plan *ck, run_log *lg, int sig, int64_t step) {
    int saved = ck->enable;
    if (ckpt_save_now(s, ck, step) != CT_OK) {
        fprintf(stderr, "ctitan: stopped by %s after step %lld, but the checkpoint failed: %s\n", signal_name(sig),
                (long long)step, ct_last_error());
        return CT_ERR_IO;
    }
    char ckname[64] = "null";
    if (saved) snprintf(ckname, sizeof ckname, "\"step-%lld\"", (long long)step);
    if (log_record(lg, "\"event\": \"stop\", \"signal\": \"%s\", \"last_step\": %lld, \"checkpoint\": %s",
                   signal_name(sig), (long long)step, ckname) != CT_OK ||
        log_close(lg) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_IO;
    }
    if (s->rank == 0) {
        if (saved)
            fprintf(stderr, "ctitan: stopped by %s after step %lld; checkpoint step-%lld saved\n", signal_name(sig),
                    (long long)step, (long long)step);
        else
            fprintf(stderr, "ctitan: stopped by %s after step %lld (checkpoints are off: nothing saved)\n",
                    signal_name(sig), (long long)step);
    }
    return CT_OK;
}

/* What the loop does after a step (or the finish): go on; end the run with train_run.status (CT_OK
 * after a clean stop, train_run.stop_signal naming the signal, or an error already printed); or fail
 * (ct_last_error says which; the job is aborted, since the other ranks would wait forever). */
typedef enum step_next { STEP_GO_ON, STEP_END, STEP_FAILED } step_next;

/* One start of `ctitan train`: its settings, its data, its files and what the steps measure. */
typedef struct train_run {
    session *s;
    manifest *mf;              /* for resolving paths and naming keys in errors */
    const train_settings *cfg; /* the keys, read once at the command's start */
    int64_t steps, L, G, T, log_freq, seed; /* training.*, metrics.log_freq */
    double max_norm;
    const char *dump;
    int64_t dp, dp_rank;  /* data-parallel ranks, and this rank's place among them */
    int64_t G_local;      /* this rank's slice of the global batch: accum microbatches of L */
    int64_t accum;
    int64_t non_dp;       /* ranks that share one data-parallel rank's batch */
    lr_schedule sched;
    dataloader dl;
    int32_t *inputs, *targets; /* (accum, L, T) on the host */
    uint8_t *starts;           /* (accum, L, T): block-causal documents, where a loader's shards record them */
    /* validation.*: the held-out loader (ordered), its microbatch, how often and how many batches */
    int val_on;
    dataloader vdl;
    int64_t val_freq, val_steps, val_L, val_batches;
    run_log lg;
    ckpt_plan ck;
    /* steady-state timing: the steps after the first warmup_steps */
    int64_t warmup_steps, timed_steps, tokens_since;
    double t_log, step_time_sum, comm_time_sum, pp_sums[2];
    runtime_axis_comm axis_sum[CT_MESH_NAXES]; /* the tape's collectives per mesh axis, timed steps */
    int told_opt;       /* the optimizer's calls per step were printed */
    int64_t told_graph; /* compile_report's state */
    ct_status status;   /* STEP_END: how the run ends */
    int stop_signal;    /* STEP_END with CT_OK: the stop signal the run ended on, 0 for none */
    int64_t mem_peak_max, act_peak_max; /* this rank's over the whole run (the records' peaks restart) */
    profiler prof; /* profiling.*: trace windows and memory snapshots */
} train_run;

/* The start record: where this start begins and with what, so a reader can tell runs apart (the
 * layout and tokens per step are what `ctitan plot` labels a curve and counts tokens by). */
static ct_status log_start(run_log *lg, train_run *r, int64_t after_step) {
    if (!lg->f) return CT_OK;
    session *s = r->s;
    manifest *mf = r->mf;
    char abs[4096], quoted[8300], f8[80] = "null", recipe[64];
    const char *mp = r->cfg->mixed_precision_param;
    json_quote(quoted, sizeof quoted, realpath(mf->path, abs) ? abs : mf->path);
    if (s->quantp) json_quote(f8, sizeof f8, session_quant_recipe(s, recipe, sizeof recipe));
    const int *d = s->mesh.degree;
    return log_record(lg, "\"event\": \"start\", \"first_step\": %lld, \"steps\": %lld, \"world_size\": %d, "
                          "\"seed\": %lld, \"manifest\": %s, \"pid\": %ld, \"tokens_per_step\": %lld, "
                          "\"layout\": {\"pp\": %d, \"dp_replicate\": %d, \"dp_shard\": %d, \"cp\": %d, \"tp\": %d, "
                          "\"param_dtype\": \"%s\", \"float8\": %s}",
                      (long long)(after_step + 1), (long long)r->steps, s->world, (long long)r->seed, quoted,
                      (long)getpid(), (long long)(r->G * r->T), d[CT_AXIS_PP], d[CT_AXIS_DP_REPLICATE],
                      d[CT_AXIS_DP_SHARD], d[CT_AXIS_CP], d[CT_AXIS_TP], mp, f8);
}

/* The training keys, checked. */
static ct_status train_settings_check(train_run *r) {
    manifest *mf = r->mf;
    const train_settings *ts = r->cfg;
    char where[600];
    r->steps = ts->steps;
    r->L = ts->local_batch_size;
    r->G = ts->global_batch_size;
    r->T = ts->seq_len;
    r->log_freq = ts->log_freq;
    r->seed = ts->seed;
    r->max_norm = ts->max_norm;
    r->dump = ts->dump_folder;
    r->dp = r->s->mesh.dp_size > 0 ? r->s->mesh.dp_size : 1;
    r->dp_rank = r->s->mesh.dp_rank;
    int64_t L = r->L, dp = r->dp;
    if (r->G == -1) r->G = L * dp; /* one microbatch per data-parallel rank */
    if (L < 1 || r->G < L * dp || r->G % (L * dp) || r->steps < 0 || r->log_freq < 1) {
        mf_where(mf, "training.global_batch_size", where, sizeof where);
        fprintf(stderr, "ctitan: %s: need local_batch_size >= 1 and global_batch_size a multiple of local_batch_size x "
                        "%lld data-parallel ranks (or -1), steps >= 0, metrics.log_freq >= 1 (got local %lld, global "
                        "%lld)\n",
                where, (long long)dp, (long long)L, (long long)r->G);
        return CT_ERR_INVALID;
    }
    if (ts->wandb) {
        mf_where(mf, "metrics.enable_wandb", where, sizeof where);
        fprintf(stderr, "ctitan: %s: true is not supported (no network here); TensorBoard is the supported logger: set "
                        "this to false and metrics.enable_tensorboard to true\n",
                where);
        return CT_ERR_INVALID;
    }
    r->G_local = r->G / dp;
    r->accum = r->G_local / L;
    r->non_dp = r->s->world / dp > 0 ? r->s->world / dp : 1;
    if (profiler_open(&r->prof, mf, &ts->profiling, r->dump) != CT_OK) return CT_ERR_INVALID;
    ct_status st = lr_setup(&r->s->cfg.lr, mf, r->steps, &r->sched);
    if (st != CT_OK) fprintf(stderr, "ctitan: %s\n", ct_last_error());
    return st;
}

/* "file:line: key" of a list item's key ("training.dataset[1].path"), or the list's own line with the
 * item named when the key was not given. */
static void item_where(const manifest *mf, const char *list, int i, const char *field, char *out, size_t len) {
    char key[300];
    snprintf(key, sizeof key, "%s[%d].%s", list, i, field);
    mf_where(mf, key, out, len);
    if (!strstr(out, "(default)")) return;
    char where[600];
    mf_where(mf, list, where, sizeof where);
    snprintf(out, len, "%.500s[%d].%.16s", where, i, field);
}

/* One source into dl: its path resolved from the manifest's folder; an error names `where`. */
static ct_status source_add(train_run *r, dataloader *dl, const char *where, const char *path, double weight) {
    char dpath[4096];
    session_resolve_path(r->mf, path, dpath, sizeof dpath);
    if (dataloader_add(dl, dpath, weight, r->s->rt.desc.vocab_size) == CT_OK) return CT_OK;
    fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
    return CT_ERR_INVALID;
}

/* SECTION.dataset (a path, or a list of {path, weight}) or SECTION.dataset_path, into dl (initialised
 * by the caller; ordered: validation, where weights do not apply). */
static ct_status dataset_open(train_run *r, const char *section, const train_dataset *ds, dataloader *dl) {
    manifest *mf = r->mf;
    char key[64], old_key[64], where[600], where2[600];
    const char *path = ds->path, *old_path = ds->old_path;
    snprintf(key, sizeof key, "%s.dataset", section);
    snprintf(old_key, sizeof old_key, "%s.dataset_path", section);
    int n = ds->n_items, has = ds->has, has_old = ds->has_old;
    mf_where(mf, key, where, sizeof where);
    if (has && has_old) {
        mf_where(mf, old_key, where2, sizeof where2);
        fprintf(stderr, "ctitan: %s: set together with %s; give one (dataset_path is the older spelling of a single "
                        "path)\n", where, where2);
        return CT_ERR_INVALID;
    }
    if (!has && !has_old) {
        fprintf(stderr, "ctitan: %s: %s is not set (a token shard from `ctitan tokenize`, a folder of them, or a list "
                        "of {path, weight})\n", mf->path, key);
        return CT_ERR_INVALID;
    }
    if (n < 0) {
        if (has_old) mf_where(mf, old_key, where, sizeof where);
        return source_add(r, dl, where, has ? path : old_path, 1.0);
    }
    if (n == 0) {
        fprintf(stderr, "ctitan: %s: an empty list; expected a path or a list of {path, weight}\n", where);
        return CT_ERR_INVALID;
    }
    for (int i = 0; i < n; i++) {
        double weight = ds->items[i].weight;
        if (dl->ordered && ds->items[i].has_weight) {
            item_where(mf, key, i, "weight", where, sizeof where);
            fprintf(stderr, "ctitan: %s: validation reads every source whole, in order; weights do not apply (leave "
                            "it out)\n", where);
            return CT_ERR_INVALID;
        }
        item_where(mf, key, i, "path", where, sizeof where);
        path = ds->items[i].path;
        if (!path || !*path) {
            fprintf(stderr, "ctitan: %s: not set; each source is {path: SHARD_OR_FOLDER, weight: W}\n", where);
            return CT_ERR_INVALID;
        }
        if (source_add(r, dl, where, path, weight)) return CT_ERR_INVALID;
    }
    if (dataloader_mix(dl) != CT_OK) {
        mf_where(mf, key, where, sizeof where);
        fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* validation.*: checked and its dataset opened when validation.enable is true. */
static ct_status validation_open(train_run *r) {
    manifest *mf = r->mf;
    const validation_settings *v = &r->cfg->validation;
    char where[600];
    int64_t T = v->has_seq_len ? v->seq_len : r->T;
    r->val_on = v->enable;
    if (!r->val_on) return CT_OK;
    r->val_freq = v->freq;
    r->val_steps = v->steps;
    r->val_L = v->local_batch_size;
    if (r->val_steps == 0) {
        mf_where(mf, "validation.steps", where, sizeof where);
        fprintf(stderr, "ctitan: %s: 0 batches; expected -1 (the whole held-out set) or a count >= 1\n", where);
        return CT_ERR_INVALID;
    }
    if (v->has_seq_len && T != r->T) {
        mf_where(mf, "validation.seq_len", where, sizeof where);
        fprintf(stderr, "ctitan: %s: %lld; validation windows have training.seq_len's length (%lld): expected that or "
                        "leave it out\n", where, (long long)T, (long long)r->T);
        return CT_ERR_INVALID;
    }
    if (r->G_local % r->val_L) {
        mf_where(mf, "validation.local_batch_size", where, sizeof where);
        fprintf(stderr, "ctitan: %s: %lld does not divide each data-parallel rank's %lld sequences of a batch "
                        "(training.global_batch_size %lld over %lld ranks)\n",
                where, (long long)r->val_L, (long long)r->G_local, (long long)r->G, (long long)r->dp);
        return CT_ERR_INVALID;
    }
    if (!v->data.has && !v->data.has_old) {
        mf_where(mf, "validation.enable", where, sizeof where);
        fprintf(stderr, "ctitan: %s: true, but neither validation.dataset nor validation.dataset_path names the "
                        "held-out tokens\n", where);
        return CT_ERR_INVALID;
    }
    dataloader_init(&r->vdl, r->T, (uint64_t)r->seed, 1);
    if (dataset_open(r, "validation", &v->data, &r->vdl)) return CT_ERR_INVALID;
    int64_t whole = (r->vdl.n_windows + r->G - 1) / r->G; /* the last batch padded with ignored targets */
    r->val_batches = r->val_steps < 0 || r->val_steps > whole ? whole : r->val_steps;
    return CT_OK;
}

/* Opens the datasets and makes the dump folder; on CT_ERR_INVALID the loaders are closed again. */
static ct_status train_data_open(train_run *r) {
    manifest *mf = r->mf;
    char where[600];
    dataloader_init(&r->dl, r->T, (uint64_t)r->seed, 0);
    if (dataset_open(r, "training", &r->cfg->data, &r->dl) || validation_open(r)) goto fail;
    if (ct_mkdir_p(r->dump) || ct_require_dir(r->dump)) {
        mf_where(mf, "job.dump_folder", where, sizeof where);
        if (errno == ENOTDIR) fprintf(stderr, "ctitan: %s: %s is not a folder (a file is in the way)\n", where, r->dump);
        else fprintf(stderr, "ctitan: %s: cannot create %s: %s\n", where, r->dump, strerror(errno));
        goto fail;
    }
    return CT_OK;
fail:
    dataloader_close(&r->dl);
    dataloader_close(&r->vdl);
    return CT_ERR_INVALID;
}

/* The mixture in the data line: each source's weight, share of a period, tokens and sequences. */
static void mixture_print(const train_run *r) {
    const dataloader *dl = &r->dl;
    printf("data: %d sources mixed by weight, in periods of %lld sequences:", dl->n_src, (long long)dl->period);
    for (int i = 0; i < dl->n_src; i++) {
        const data_source *src = &dl->src[i];
        printf("%s [%d] %s weight %g: %lld per period (%.2f%%), %llu tokens, %lld sequences", i ? ";" : "", i,
               src->path, src->weight, (long long)src->count, 100.0 * (double)src->count / (double)dl->period, (unsigned long long)src->n_tokens,
               (long long)src->n_windows);
    }
    printf("\n");
}

/* The lines that open a run: model, data, mesh, device. */
static void train_banner_print(const train_run *r) {
    session *s = r->s;
    print_model_summary(s, r->T);
    if (r->dl.n_src > 1) mixture_print(r);
    printf("data: %llu tokens, %lld sequences of %lld; global batch %lld = %lld data-parallel ranks x %lld "
           "microbatches x %lld; %lld steps\n",
           (unsigned long long)r->dl.n_tokens, (long long)r->dl.n_windows, (long long)r->T, (long long)r->G,
           (long long)r->dp, (long long)r->accum, (long long)r->L, (long long)r->steps);
    if (r->starts)
        printf("documents: block_causal takes them from the document starts the shards record (version 4)%s\n",
               r->dl.docs ? "" : ", in the held-out set; the training set's end at each EOS");
    const char *whole = r->val_steps < 0                   ? ": the whole set"
                        : r->val_steps > r->val_batches ? ": the whole set (fewer than validation.steps)"
                                                          : "";
    if (r->val_on)
        printf("validation: %llu held-out tokens in %d source%s, %lld sequences of %lld; at step 1 and every %lld steps, "
               "%lld batch%s of %lld (microbatches of %lld)%s\n",
               (unsigned long long)r->vdl.n_tokens, r->vdl.n_src, r->vdl.n_src == 1 ? "" : "s",
               (long long)r->vdl.n_windows, (long long)r->T, (long long)r->val_freq, (long long)r->val_batches,
               r->val_batches == 1 ? "" : "es", (long long)r->G, (long long)r->val_L, whole);
    if (s->world > 1)
    {
        char ep[96] = "";
        if (s->mesh.ep_size > 1) /* borrowed from dp_shard x cp: no axis of its own */
            snprintf(ep, sizeof ep, " (ep %d x efsdp %d of dp_shard x cp)", s->mesh.ep_size, s->mesh.efsdp_size);
        printf("mesh: %d ranks: pp %d, dp_replicate %d, dp_shard %d, cp %d, tp %d%s; strategy %s\n", s->world,
               s->mesh.degree[0], s->mesh.degree[1], s->mesh.degree[2], s->mesh.degree[3], s->mesh.degree[4], ep,
               session_dp_strategy(s) ? session_dp_strategy(s)->info.name : "none");
    }
    if (s->peak_flops > 0)
        printf("device: %s, %s matmul peak %.1f GFLOP/s (%s; MFU below is against it)\n", s->devp->info.name,
               s->matmul_precision ? s->matmul_precision : "f32", s->peak_flops / 1e9,
               s->peak_stated ? "as metrics.peak_tflops states it" : "the device's figure, how it got it above");
}

/* After the log is open: the batch buffers, the opening lines, compile, and the checkpoint to resume
 * from. */
static ct_status train_start(train_run *r) {
    size_t bytes = sizeof(int32_t) * (size_t)(r->G_local * r->T);
    r->inputs = malloc(bytes);
    r->targets = malloc(bytes);
    int docs = r->s->rt.doc_eos >= 0 && (r->dl.docs || (r->val_on && r->vdl.docs));
    if (docs) r->starts = malloc((size_t)(r->G_local * r->T));
    if (!r->inputs || !r->targets || (docs && !r->starts)) {
        fprintf(stderr, "ctitan: cannot allocate the batch: %lld sequences of %lld tokens\n", (long long)r->G_local,
                (long long)r->T);
        return CT_ERR_NOMEM;
    }
    train_banner_print(r);
    compile_setup(r->s, r->cfg->compile);
    r->t_log = ct_now();
    r->warmup_steps = r->steps > 2 ? 2 : r->steps > 1 ? 1 : 0;
    if (ckpt_begin(r->s, r->mf, r->dump, &r->ck) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    /* whole compute copies (ZeRO) follow what local storage now holds, loaded or initialised */
    if (session_post_step(r->s) != CT_OK) {
        fprintf(stderr, "ctitan: parallelism: post_step: %s\n", ct_last_error());
        return CT_ERR_INTERNAL;
    }
    return CT_OK;
}

/* The memory record of the rank whose peak is largest (every rank's own on one rank): its peak
 * total, its peak by category and its live activation peak. CT_OK, or the comm's status. */
static ct_status largest_rank_memory(session *s, double v[CT_MEM_NCATEGORIES + 2]) {
    v[0] = (double)g_mem.peak_total;
    for (int k = 0; k < CT_MEM_NCATEGORIES; k++) v[1 + k] = (double)g_mem.peak[k];
    v[CT_MEM_NCATEGORIES + 1] = (double)s->rt.peak_act_bytes;
    if (!s->capi) return CT_OK;
    ct_comm_group *world;
    double top = v[0];
    ct_status st = s->capi->world(s->comm, &world);
    if (st == CT_OK) st = s->capi->all_reduce(s->comm, world, &top, &top, 1, CT_F64, CT_REDUCE_MAX, NULL);
    if (st != CT_OK) return st;
    if (v[0] < top) memset(v, 0, sizeof(double) * (CT_MEM_NCATEGORIES + 2)); /* another rank's is larger */
    return s->capi->all_reduce(s->comm, world, v, v, CT_MEM_NCATEGORIES + 2, CT_F64, CT_REDUCE_MAX, NULL);
}

/* v as metrics.jsonl writes it with fmt: TensorBoard gets the record's numbers, not more digits. */
static double as_logged(const char *fmt, double v) {
    char t[64];
    snprintf(t, sizeof t, fmt, v);
    return strtod(t, NULL);
}

/* A step record's numbers as TensorBoard scalars (the tags docs/observability.md's table lists). CT_OK, or
 * CT_ERR_IO on a write error (ct_last_error names the file). */
static ct_status step_tb(run_log *lg, int64_t step, double loss, double norm, double lr, double tps, double tflops,
                         double mfu, const double mem[CT_MEM_NCATEGORIES + 2]) {
    if (!lg->tb) return CT_OK;
    const tb_scalar v[] = {
        {"loss_metrics/global_avg_loss", loss},
        {"grad_norm", norm},
        {"lr", lr},
        {"throughput(tps)", tps},
        {"tflops", tflops},
        {"mfu(%)", mfu},
        {"memory/peak(bytes)", mem[0]},
        {"memory/params(bytes)", mem[1 + CT_MEM_PARAMS]},
        {"memory/grads(bytes)", mem[1 + CT_MEM_GRADS]},
        {"memory/optimizer(bytes)", mem[1 + CT_MEM_OPTIMIZER]},
        {"memory/activations(bytes)", mem[1 + CT_MEM_ACTIVATIONS]},
        {"memory/activations_live_peak(bytes)", mem[CT_MEM_NCATEGORIES + 1]},
        {"memory/master(bytes)", mem[1 + CT_MEM_MASTER]},
        {"memory/comm(bytes)", mem[1 + CT_MEM_COMM]},
        {"comm/all_gather(bytes)", (double)g_comm_bytes[CS_ALL_GATHER]},
        {"comm/reduce_scatter(bytes)", (double)g_comm_bytes[CS_REDUCE_SCATTER]},
        {"comm/all_reduce(bytes)", (double)g_comm_bytes[CS_ALL_REDUCE]},
        {"comm/all_to_all(bytes)", (double)g_comm_bytes[CS_ALL_TO_ALL]},
    };
    return tb_write(lg->tb, step, v, (int)(sizeof v / sizeof v[0]));
}

/* The console metrics line, its metrics.jsonl record and its TensorBoard scalars. CT_OK, or the status of
 * what failed (a write error, the comm). */
static ct_status step_log(train_run *r, int64_t step, double loss, double norm, double lr) {
    const session *s = r->s;
    double mem[CT_MEM_NCATEGORIES + 2];
    ct_status st = largest_rank_memory(r->s, mem);
    if (st != CT_OK) return st;
    double elapsed = ct_now() - r->t_log;
    double tps = (double)r->tokens_since / elapsed;
    double tflops = s->rt.desc.flops_per_token * tps / 1e12;
    double mfu = s->peak_flops > 0 ? 100.0 * tflops * 1e12 / s->peak_flops : 0.0;
    /* above 100% the peak figure is wrong (a bug to report); the line says it was clamped */
    const char *clamped = mfu > 100.0 ? ", clamped: achieved exceeds the peak figure" : "";
    if (mfu > 100.0) mfu = 100.0;
    char aux[96] = ""; /* auxiliary losses (MoE load balancing), included in the loss */
    if (s->has_aux) snprintf(aux, sizeof aux, "  aux_loss %.4f", s->aux_loss);
    printf("step %5lld  loss %8.4f  grad_norm %8.4f  lr %.3e  tps %8.0f  tflops %7.4f  mfu %5.1f%% (of %s peak%s)"
           "  memory %.3f GiB%s\n",
           (long long)step, loss, norm, lr, tps, tflops, mfu, s->devp->info.name, clamped, gib((int64_t)mem[0]), aux);
    fflush(stdout);
    char offload[224] = ""; /* activation offload: host memory, and the bytes copied since the last record */
    if (s->rt.offload.layers)
        snprintf(offload, sizeof offload, ", \"offload\": {\"host_bytes\": %.0f, \"copied_bytes\": %.0f}",
                 s->rt.offload.host_bytes, s->rt.offload.step_bytes_out + s->rt.offload.step_bytes_in);
    if (s->has_aux)
        snprintf(offload + strlen(offload), sizeof offload - strlen(offload), ", \"aux_loss\": %.9g", s->aux_loss);
    loss = as_logged("%.9g", loss);
    norm = as_logged("%.9g", norm);
    lr = as_logged("%.6e", lr);
    tps = as_logged("%.1f", tps);
    tflops = as_logged("%.6f", tflops);
    mfu = as_logged("%.3f", mfu);
    st = log_record(&r->lg,
            "\"step\": %lld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.6e, \"tps\": %.1f, "
            "\"tflops\": %.6f, \"mfu\": %.3f, \"memory\": {\"peak_bytes\": %lld, \"params\": %lld, "
            "\"grads\": %lld, \"optimizer\": %lld, \"activations\": %lld, \"activations_live_peak\": %lld, "
            "\"master\": %lld, \"comm\": %lld}, "
            "\"comm_bytes\": {\"all_gather\": %lld, \"reduce_scatter\": %lld, \"all_reduce\": %lld, "
            "\"all_to_all\": %lld}%s",
            (long long)step, loss, norm, lr, tps, tflops, mfu, (long long)mem[0], (long long)mem[1 + CT_MEM_PARAMS],
            (long long)mem[1 + CT_MEM_GRADS], (long long)mem[1 + CT_MEM_OPTIMIZER], (long long)mem[1 + CT_MEM_ACTIVATIONS],
            (long long)mem[CT_MEM_NCATEGORIES + 1], (long long)mem[1 + CT_MEM_MASTER], (long long)mem[1 + CT_MEM_COMM],
            (long long)g_comm_bytes[CS_ALL_GATHER],
            (long long)g_comm_bytes[CS_REDUCE_SCATTER], (long long)g_comm_bytes[CS_ALL_REDUCE],
            (long long)g_comm_bytes[CS_ALL_TO_ALL], offload);
    if (st == CT_OK) st = step_tb(&r->lg, step, loss, norm, lr, tps, tflops, mfu, mem);
    if (st != CT_OK) return st;
    r->t_log = ct_now();
    r->tokens_since = 0;
    r->s->rt.offload.step_bytes_out = r->s->rt.offload.step_bytes_in = 0;
    if (g_mem.peak_total > r->mem_peak_max) r->mem_peak_max = g_mem.peak_total;
    if (r->s->rt.peak_act_bytes > r->act_peak_max) r->act_peak_max = r->s->rt.peak_act_bytes;
    mem_reset_peaks(); /* the next record reports its own interval's peaks */
    r->s->rt.peak_act_bytes = 0;
    return CT_OK;
}

/* Sequence s of a loader into row i of the batch, with its document starts when the loader's shards
 * record them and attention keeps to documents (r->starts); returns the starts to pass on, or NULL. */
static const uint8_t *row_read(train_run *r, dataloader *dl, int64_t s, int64_t i) {
    int docs = r->starts && dl->docs;
    dataloader_sequence_docs(dl, s, r->inputs + i * r->T, r->targets + i * r->T, docs ? r->starts + i * r->T : NULL,
                             r->s->rt.doc_eos);
    return docs ? r->starts : NULL;
}

/* The whole global batch is read first: the loss is normalised by its valid-token count. */
static const uint8_t *batch_read(train_run *r) {
    const uint8_t *starts = NULL;
    for (int64_t i = 0; i < r->G_local; i++) /* this data-parallel rank's contiguous slice */
        starts = row_read(r, &r->dl, dataloader_global_index(r->dl.position, r->G, r->dp_rank, r->dp, i), i);
    r->dl.position += r->G;
    r->ck.state.tokens_seen += r->G * r->T;
    return starts;
}

/* validation.*: the held-out set from its first sequence, in batches of the training's global batch
 * (each data-parallel rank its slice, as in training), forward only; the mean loss over every valid
 * target token, in a console line and a metrics.jsonl record. CT_OK, or the status of what failed. */
static ct_status validate(train_run *r, int64_t step) {
    double t0 = ct_now(), sum = 0;
    int64_t tokens = 0;
    trace_begin("validate");
    for (int64_t b = 0; b < r->val_batches; b++) {
        const uint8_t *starts = NULL;
        for (int64_t i = 0; i < r->G_local; i++)
            starts = row_read(r, &r->vdl, dataloader_global_index(b * r->G, r->G, r->dp_rank, r->dp, i), i);
        double ls;
        int64_t valid;
        ct_status st =
            session_eval_step(r->s, r->inputs, r->targets, starts, r->G_local, r->val_L, r->T, &ls, &valid);
        if (st != CT_OK) return st;
        sum += ls;
        tokens += valid;
    }
    trace_end("validate");
    double loss = tokens > 0 ? sum / (double)tokens : 0.0, dt = ct_now() - t0;
    r->t_log += dt; /* the next metrics line's tokens/s counts training time only */
    printf("validate: step %lld  loss %8.4f  (%lld batch%s, %lld tokens, %.3f s)\n", (long long)step, loss,
           (long long)r->val_batches, r->val_batches == 1 ? "" : "es", (long long)tokens, dt);
    fflush(stdout);
    /* its own record: readers that take every record with a "loss" as a step's see none here */
    loss = as_logged("%.9g", loss);
    ct_status st = log_record(&r->lg, "\"event\": \"validation\", \"step\": %lld, \"validation_loss\": %.9g, "
                                      "\"validation_tokens\": %lld, \"validation_batches\": %lld, \"seconds\": %.3f",
                              (long long)step, loss, (long long)tokens, (long long)r->val_batches, dt);
    if (st != CT_OK) return st;
    const tb_scalar v[] = {{"validation_metrics/loss", loss}, {"validation_metrics/tokens", (double)tokens}};
    return r->lg.tb ? tb_write(r->lg.tb, step, v, 2) : CT_OK;
}

/* One step: its batch, the forward, backward and update, the stop every rank agrees on, the timing,
 * the metrics line and the checkpoint. */
static step_next train_step(train_run *r, int64_t step) {
    session *s = r->s;
    double t0 = ct_now(), comm_before = s->rt.comm_seconds, pp_busy_before = s->pl ? s->pl->busy_seconds : 0,
           pp_step_before = s->pl ? s->pl->step_seconds : 0;
    runtime_axis_comm axis_before[CT_MESH_NAXES];
    memcpy(axis_before, s->rt.axis_comm, sizeof axis_before);
    profiler_step_begin(&r->prof, step);
    trace_begin("step");
    double lr = lr_at(&r->sched, step - r->ck.lr_offset);
    const uint8_t *starts = batch_read(r);
    double loss, norm;
    int64_t valid;
    if (session_train_step(s, r->inputs, r->targets, starts, r->G_local, r->L, r->T, lr, r->max_norm, step, &loss,
                           &norm, &valid) != CT_OK)
        return STEP_FAILED;
    if (!isfinite(norm)) {
        fprintf(stderr, "ctitan: step %lld: gradient norm is %g; stopping (lower optimizer.lr?)\n", (long long)step,
                norm);
        r->status = CT_ERR_INTERNAL; /* every rank saw the same norm: all end here, none waits */
        return STEP_END;
    }
    trace_end("step");
    profiler_step_end(&r->prof, step);
    if (!r->told_opt++) {
        printf("optimizer: %s: %d parameter tensors updated in %d call%s per step\n", s->optp->info.name, s->rt.n_params,
               s->opt_calls, s->opt_calls == 1 ? "" : "s");
        runtime_offload_report(&s->rt, stdout);
    }
    compile_report(&s->rt.graph, step, &r->told_graph);
    /* a stop takes effect after a step every rank has finished; the last step ends the run anyway */
    int stop = 0;
    if (step < r->steps && world_max(s, g_stop_signal, &stop) != CT_OK) return STEP_FAILED;
    double dt = ct_now() - t0, tw = ct_now();
    if (profiler_write(&r->prof, s, step) != CT_OK) return STEP_FAILED;
    r->t_log += ct_now() - tw; /* writing traces is not training time */
    if (step > r->warmup_steps) { /* the first steps touch fresh arena memory: not steady state */
        r->step_time_sum += dt;
        r->comm_time_sum += s->rt.comm_seconds - comm_before;
        for (int a = 0; a < CT_MESH_NAXES; a++) {
            r->axis_sum[a].seconds += s->rt.axis_comm[a].seconds - axis_before[a].seconds;
            r->axis_sum[a].bwd_seconds += s->rt.axis_comm[a].bwd_seconds - axis_before[a].bwd_seconds;
            r->axis_sum[a].collectives += s->rt.axis_comm[a].collectives - axis_before[a].collectives;
        }
        if (s->pl) {
            r->pp_sums[0] += s->pl->busy_seconds - pp_busy_before;
            r->pp_sums[1] += s->pl->step_seconds - pp_step_before;
        }
        r->timed_steps++;
    }
    r->tokens_since += r->G_local * r->T / r->non_dp; /* per device: tp (and pp, cp) ranks share a dp rank's tokens */
    if (step == 1 || step % r->log_freq == 0 || step == r->steps || stop)
        if (step_log(r, step, loss, norm, lr) != CT_OK) return STEP_FAILED;
    if (r->val_on && (step == 1 || step % r->val_freq == 0) && validate(r, step) != CT_OK) return STEP_FAILED;
    r->ck.state.step = step;
    r->ck.state.data_position = r->dl.position;
    if (ckpt_step(s, &r->ck, step, r->steps) != CT_OK) return STEP_FAILED;
    if (!stop) return STEP_GO_ON;
    r->status = stop_after(s, &r->ck, &r->lg, stop, step);
    r->stop_signal = r->status == CT_OK ? stop : 0;
    return STEP_END;
}

/* The summary lines over the steady-state steps. */
static void train_summary_print(train_run *r) {
    session *s = r->s;
    double step_time_sum = r->step_time_sum, comm_time_sum = r->comm_time_sum, *pp_sums = r->pp_sums;
    int64_t timed_steps = r->timed_steps;
    if (timed_steps <= 0) return;
    double tps = (double)(r->G_local * r->T / r->non_dp) * (double)timed_steps / step_time_sum;
    double gflops = s->rt.desc.flops_per_token * tps / 1e9;
    printf("summary: %lld steps after the first %lld: %.0f tokens/s, %.2f GFLOP/s achieved, %.2f GFLOP/s %s "
           "matmul peak, ratio %.3f, peak memory %.3f GiB (activations live peak %.3f GiB)\n",
           (long long)timed_steps, (long long)r->warmup_steps, tps, gflops, s->peak_flops / 1e9, s->devp->info.name,
           s->peak_flops > 0 ? gflops * 1e9 / s->peak_flops : 0.0, gib(r->mem_peak_max > g_mem.peak_total ? r->mem_peak_max : g_mem.peak_total),
           gib(r->act_peak_max > s->rt.peak_act_bytes ? r->act_peak_max : s->rt.peak_act_bytes));
    if (s->rt.graph.launches > 0)
        printf("summary: compile: %lld microbatches ran as one graph launch each (%lld device operations; "
               "%lld capture%s)\n",
               (long long)s->rt.graph.launches, (long long)s->rt.graph.ops, (long long)s->rt.graph.captures,
               s->rt.graph.captures == 1 ? "" : "s");
    if (s->world > 1)
        printf("summary: communication (time in strategy hooks and collectives, not hidden by compute) %.1f%% of "
               "step time on rank 0\n",
               100.0 * comm_time_sum / step_time_sum);
    /* every pp rank's time inside stage work against its time in the runner: the measured bubble */
    if (s->pl && s->capi->all_reduce(s->comm, s->mesh.group[CT_AXIS_PP], pp_sums, pp_sums, 2, CT_F64, CT_REDUCE_SUM,
                                     NULL) == CT_OK && pp_sums[1] > 0)
        printf("summary: pipeline %s: measured bubble %.3f (time outside stage work, all %d pp ranks), schedule "
               "predicts %.3f; at most %d microbatches held on rank 0\n",
               s->pl->plan.name, 1.0 - pp_sums[0] / pp_sums[1], s->pl->pp, s->pl->plan.bubble, s->pl->peak_ctx);
    for (int a = 0; a < CT_MESH_NAXES; a++) { /* op-level strategies' collectives (tp's, cp's) */
        const runtime_axis_comm *c = &r->axis_sum[a];
        if (c->collectives > 0 || c->seconds > 0)
            printf("summary: %s axis: %.2f ms per step blocked in its op-level collectives (forward %.2f, backward "
                   "%.2f; %.1f%% of step time)\n",
                   mesh_axis_names[a], 1e3 * c->seconds / (double)timed_steps,
                   1e3 * (c->seconds - c->bwd_seconds) / (double)timed_steps, 1e3 * c->bwd_seconds / (double)timed_steps,
                   100.0 * c->seconds / step_time_sum);
    }
}

/* After the last step: the final saves, the model, the end record. STEP_END with r->status CT_OK
 * (r->stop_signal set when a signal came in the last step) or CT_ERR_IO if the model could not be
 * saved; STEP_FAILED on a failure. */
static step_next train_finish(train_run *r) {
    session *s = r->s;
    char path[4096];
    if (ckpt_end(s, &r->ck, r->steps) != CT_OK) return STEP_FAILED;
    /* a stop signal in the last step or the final saves: the run is complete; the model is saved, the
     * sample and traces are skipped. From here a signal ends the process at once. */
    int late = 0;
    if (world_max(s, g_stop_signal, &late) != CT_OK) return STEP_FAILED;
    stop_signals_catch(0);
    snprintf(path, sizeof path, "%s/model.ctt", r->dump);
    if (r->steps > 0 && ckpt_save_model(s, path) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        r->status = CT_ERR_IO;
        return STEP_END;
    }
    if (log_record(&r->lg, "\"event\": \"end\", \"last_step\": %lld", (long long)r->steps) != CT_OK ||
        log_close(&r->lg) != CT_OK)
        return STEP_FAILED;
    r->status = CT_OK;
    r->stop_signal = late;
    if (!late) return STEP_END;
    if (s->rank == 0)
        fprintf(stderr, "ctitan: stopped by %s after the last step %lld; the run is complete and saved (the "
                        "end-of-run sample and traces are skipped)\n",
                signal_name(late), (long long)r->steps);
    return STEP_END;
}

/* One start of the run. CT_OK with *stop_signal set when a stop signal ended it cleanly (after a
 * step, or in the last one); else *stop_signal is 0. */
static ct_status train_loop(session *s, manifest *mf, const train_settings *ts, int *stop_signal) {
    train_run r = {.s = s, .mf = mf, .cfg = ts};
    step_next next = STEP_GO_ON;
    ct_status rc = train_settings_check(&r);
    *stop_signal = 0;
    if (!rc) rc = train_data_open(&r);
    if (rc) return rc;
    rc = run_log_open(s, mf, ts, r.dump, &r.lg);
    if (!rc) rc = train_start(&r);
    if (rc || r.ck.finished) goto done; /* finished: restarted after its last step: said so; writes nothing */
    r.dl.position = r.ck.state.data_position;
    if (log_start(&r.lg, &r, r.ck.state.step) != CT_OK) goto runfail;
    stop_signals_catch(1);
    for (int64_t step = r.ck.state.step + 1; step <= r.steps && next == STEP_GO_ON; step++)
        next = train_step(&r, step);
    if (next == STEP_GO_ON) {
        train_summary_print(&r);
        next = train_finish(&r);
    }
    rc = r.status;
    *stop_signal = r.stop_signal;
    if (next == STEP_END) goto done;
runfail:
    rc = CT_ERR_INTERNAL;
    *stop_signal = 0;
    fprintf(stderr, "ctitan: training failed: %s\n", ct_last_error());
    if (s->capi) { /* the other ranks would wait forever in their next collective */
        fflush(stderr);
        /* the job ends here, not through main.c: 1 is the exit status main.c gives a failure while running */
        launch_record_status(1);
        s->capi->abort(s->comm, 1);
    }
done:
    stop_signals_catch(0);
    if (r.lg.f && log_close(&r.lg) != CT_OK && !rc) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        rc = CT_ERR_IO;
        *stop_signal = 0;
    }
    free(r.inputs);
    free(r.targets);
    free(r.starts);
    dataloader_close(&r.dl);
    dataloader_close(&r.vdl);
    return rc;
}

/* `ctitan train --help`: the usage and every core key. */
static void train_help_print(void) {
    fputs(train_usage, stdout);
    printf("\nkeys (plugins add theirs once loaded; see --print-config, or ctitan plugins FILE.so for one plugin's):\n");
    manifest *m0 = manifest_new();
    if (!m0) return;
    manifest_add_core_schema(m0);
    manifest_print_schema(m0, stdout);
    manifest_free(m0);
    /* the parallelism keys of the strategies a manifest that names none gets on two ranks (each axis's
     * default, and the data-parallel one the degrees pick), loaded by name as a run does */
    strategy_list l;
    engine_settings es;
    manifest *m0l = manifest_new();
    if (m0l) engine_settings_read(m0l, &es);
    if (!m0l || strategy_list_read(&es, m0l, 2, 1, &l) != CT_OK) l.n = 0;
    manifest_free(m0l);
    for (int i = 0; i < l.n; i++) {
        manifest *m1 = manifest_new();
        const char *name = m1 ? l.item[i].name : NULL;
        plugin *p = name ? plugin_load(name, CT_KIND_STRATEGY, "parallelism", m1) : NULL;
        if (p && p->info.options && p->info.options->key) {
            printf("\nkeys of the %s strategy (%s):\n", p->info.name, p->info.description ? p->info.description : "");
            manifest_add_plugin_schema(m1, "parallelism", p->info.options);
            manifest_print_schema(m1, stdout);
        }
        plugin_unload(p);
        manifest_free(m1);
    }
}

/* checkpoint.create_seed_checkpoint: writes step-0 into the folder, under its lock like any run. */
static ct_status seed_checkpoint_write(session *s, manifest *mf, const char *dump) {
    char id[64], where[600];
    int bad = 0;
    if (s->rank == 0) {
        run_id_make(id, sizeof id);
        mf_where(mf, "job.dump_folder", where, sizeof where);
        if (ct_mkdir_p(dump) || ct_require_dir(dump)) {
            fprintf(stderr, "ctitan: %s: cannot create %s: %s\n", where, dump,
                    errno == ENOTDIR ? "a file is in the way" : strerror(errno));
            bad = 1;
        } else if (runlock_acquire(dump, id) != CT_OK) {
            fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
            bad = 1;
        }
    }
    if (world_max(s, bad, &bad) != CT_OK) return CT_ERR_INTERNAL;
    if (bad) return CT_ERR_INVALID;
    if (ckpt_seed(s, mf, dump) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_IO;
    }
    return CT_OK;
}

/* The end-of-run sample: optional, so its failure is a warning; the training stands. */
static void sample_print(session *s, const train_settings *ts, ct_tokenizer *tok, int64_t max_new) {
    const generate_settings *g = &ts->generate;
    printf("sample:\n");
    if (session_generate(s, tok, g->prompt, max_new, g->temperature, g->top_k, g->top_p, (uint64_t)g->seed,
                         ts->seq_len))
        fprintf(stderr, "ctitan: warning: the end-of-run sample failed (above); the training itself completed "
                        "and was saved\n");
}

/* The start-up line: what the planner predicts for this run, next to which each step's line then
 * shows what it measures. A plan that cannot be made is said, and the run goes on. */
static void plan_line(int argc, char **argv, const session *run, int world) {
    plan_result r;
    hw_profile hw;
    int have_hw;
    if (plan_for_run(argc, argv, train_usage, mdesc_from_checkpoint, world, run, &r, &hw, &have_hw) != CT_OK) {
        printf("plan: none (%s)\n", ct_last_error());
    } else {
        printf("plan: peak memory %.3f GiB on the largest rank (activations %.3f GiB)", gib((int64_t)r.mem_total),
               gib((int64_t)(r.mem[PLAN_MEM_ACTIVATIONS] + r.mem[PLAN_MEM_TRANSIENT] + r.mem[PLAN_MEM_LOGITS])));
        if (have_hw) printf(", step %.4f s, %.0f tokens/s per device (profile %s)", r.step_time, r.tokens_per_s_per_gpu,
                            hw.name);
        printf("\n");
    }
    hw_profile_free(&hw);
}

ct_status cmd_train(int argc, char **argv, int *stop_signal) {
    run_args a = {0};
    ct_status st;
    *stop_signal = 0;
    manifest *mf = session_parse(argc, argv, &a, train_usage, &st);
    if (mf && (a.chat || a.chat_template || a.print_prompt_ids || a.logits_out)) {
        fprintf(stderr, "ctitan: train: --chat, --chat-template, --print-prompt-ids and --logits-out belong to "
                        "`ctitan generate`\n");
        manifest_free(mf);
        return CT_ERR_INVALID;
    }
    if (a.help) {
        train_help_print();
        manifest_free(mf);
        return CT_OK;
    }
    if (!mf) return st;
    session s;
    memset(&s, 0, sizeof s); /* closed at out (freeing mf) also when mf is refused before the session opens */
    s.mf = mf;
    ct_tokenizer *tok = NULL;
    train_settings ts = {0};
    int dry = a.dry_run;
    if ((st = mdesc_from_checkpoint(mf)) == CT_OK) st = session_open(&s, mf, !dry, !dry);
    if (st) goto out;
    if ((st = train_settings_read(mf, &ts))) { /* the keys, once, from the validated manifest */
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        goto out;
    }
    if (a.print_config || ts.print_config) manifest_print(mf, stdout);
    if (dry) { /* like the dataset, the files the run reads are not opened */
        st = dry_run(&s, &ts, argc, argv);
        goto out;
    }
    /* what the end of the run needs is checked now, not after the training */
    int64_t max_new = ts.generate.max_new;
    if (max_new > 0 && (st = session_open_tokenizer(&s, &tok))) goto out;
    if ((st = check_hf_export(&s, mf, &ts))) goto out;
    trace_enable(ts.profiling.trace); /* recording starts at the profiling windows' steps (train/profile.c) */
    if (ts.description && *ts.description) printf("job: %s\n", ts.description);
    if (ts.seed_checkpoint) {
        st = seed_checkpoint_write(&s, mf, ts.dump_folder);
        goto out;
    }
    double stated = 0; /* metrics.peak_tflops: the peak as the user states it, no probe */
    mf_get_float(mf, "metrics.peak_tflops", &stated);
    if (stated > 0) s.peak_flops = stated * 1e12, s.peak_stated = 1;
    else if (s.d->measure_peak_flops && s.d->measure_peak_flops(s.dev, &s.peak_flops) != CT_OK) s.peak_flops = 0;
    if (s.rank == 0) plan_line(argc, argv, &s, s.world > 1 ? s.world : 1);
    st = train_loop(&s, mf, &ts, stop_signal);
    if (!st && !*stop_signal && max_new > 0) sample_print(&s, &ts, tok, max_new);
out:
    train_settings_free(&ts);
    tokenizer_free(tok);
    runlock_release();
    session_close(&s);
    return st;
}

static void ids_print(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "generate: %s: %zu tokens:", what, n);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* --logits-out FILE: the model's logits at each of the prompt's n positions, (n, vocab) float32 in the
 * host's byte order (little-endian on every host ctitan runs on), written whole or not at all. */
static ct_status logits_write(session *s, const char *path, const int32_t *ids, size_t n) {
    int64_t V = s->rt.desc.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V * n + 1);
    if (!logits) return ct_fail(CT_ERR_NOMEM, "out of memory for the prompt's logits");
    ct_status st = runtime_forward_logits(&s->rt, ids, 1, (int64_t)n, logits);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = st == CT_OK ? fopen(tmp, "wb") : NULL;
    if (st == CT_OK && !f) st = ct_fail(CT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (f) {
        size_t put = fwrite(logits, sizeof(float), (size_t)V * n, f);
        if ((fclose(f) != 0 || put != (size_t)V * n || rename(tmp, path) != 0) && st == CT_OK)
            st = ct_fail(CT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        if (st != CT_OK) unlink(tmp);
    }
    free(logits);
    if (st == CT_OK) fprintf(stderr, "generate: logits of the %zu prompt positions (%zu x %lld float32) -> %s\n", n, n,
                             (long long)V, path);
    return st;
}

/* --print-prompt-ids and --logits-out: what the sample starts from (ids, n). */
static ct_status prompt_extras(session *s, const run_args *a, const char *what, const int32_t *ids, size_t n) {
    if (a->print_prompt_ids) ids_print(what, ids, n);
    if (a->logits_out && logits_write(s, a->logits_out, ids, n) != CT_OK) {
        fprintf(stderr, "ctitan: generate: %s\n", ct_last_error());
        return CT_ERR_IO;
    }
    return CT_OK;
}

/* The same without --chat: BOS (else EOS) and the prompt's ids, as the sample starts from. */
static ct_status prompt_extras_text(session *s, const run_args *a, const ct_tokenizer *tok, const char *prompt) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(tok, prompt, strlen(prompt), 0, &ids, &n) != CT_OK) {
        fprintf(stderr, "ctitan: generate: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    int32_t start = tokenizer_bos_id(tok) >= 0 ? tokenizer_bos_id(tok) : tokenizer_eos_id(tok);
    int32_t *all = malloc(sizeof(int32_t) * (n + 1));
    if (!all) {
        free(ids);
        return CT_ERR_NOMEM;
    }
    size_t k = 0;
    if (start >= 0) all[k++] = start;
    for (size_t i = 0; i < n; i++) all[k++] = ids[i];
    ct_status st = k ? prompt_extras(s, a, "prompt ids", all, k) : CT_OK;
    free(all);
    free(ids);
    return st;
}

/* ctitan generate --chat: the prompt as one user message through the chat template (--chat-template,
 * else the tokenizer_config.json beside the tokenizer), stopped at the template's end-of-turn token. */
static ct_status generate_chat(session *s, const run_args *a, const train_settings *ts, const ct_tokenizer *tok,
                               const char *prompt, int64_t max_new, double temp, int64_t top_k, double top_p,
                               uint64_t seed, int64_t T) {
    const char *tok_path = ts->tokenizer_path;
    char path[4096];
    if ((!tok_path || !*tok_path) && (!(tok_path = ts->hf_assets_path) || !*tok_path))
        tok_path = ""; /* session_open_tokenizer has refused this already */
    session_resolve_path(s->mf, tok_path, path, sizeof path);
    chat_template *tpl = NULL;
    int32_t *ids = NULL, eot = -1;
    size_t n = 0;
    ct_status st = chat_template_load(path, a->chat_template, tok, &tpl);
    if (st == CT_OK) st = chat_end_of_turn(tpl, tok, &eot);
    if (st == CT_OK) st = chat_encode_prompt(tpl, tok, prompt, &ids, &n);
    if (st != CT_OK) {
        fprintf(stderr, "ctitan: generate: %s\n", ct_last_error());
        chat_template_free(tpl);
        return st == CT_ERR_NOMEM ? st : CT_ERR_INVALID;
    }
    size_t l = 0;
    const char *eot_text = tokenizer_token_bytes(tok, eot, &l);
    fprintf(stderr, "generate: chat template %s; the reply ends at %.*s (id %d)\n", chat_template_origin(tpl),
            (int)l, eot_text ? eot_text : "", eot);
    st = prompt_extras(s, a, "chat prompt ids", ids, n);
    if (st == CT_OK) st = session_generate_chat(s, tok, ids, n, eot, max_new, temp, top_k, top_p, seed, T);
    free(ids);
    chat_template_free(tpl);
    return st;
}

static const char *generate_usage =
    "usage: ctitan generate MANIFEST.yaml [--checkpoint MODEL.ctt|STEP_FOLDER|CHECKPOINT_FOLDER] [--prompt TEXT]\n"
    "                       [--chat] [--chat-template llama3|chatml|FILE] [--print-prompt-ids] [--logits-out FILE]\n"
    "                       [--section.key=value ...]\n"
    "  Samples text from a trained model: by default job.dump_folder/model.ctt, written by `ctitan train`;\n"
    "  or any checkpoint (a step-N folder, or a checkpoint folder: its newest step), whatever its layout.\n"
    "  The model is the one the file describes (model.name, flavor and options need not be given; keys\n"
    "  given must agree with it). Files of older ctitan carry no description: the manifest says.\n"
    "  generate.max_new_tokens (default here 64), temperature, top_k, top_p and seed apply.\n"
    "  --chat               the prompt is one user message, rendered with the chat template and its\n"
    "                       generation prompt (as transformers' apply_chat_template(..., add_generation_prompt\n"
    "                       =True)); the reply stops at the template's end-of-turn token, and only the\n"
    "                       reply is printed\n"
    "  --chat-template T    (implies --chat) llama3 or chatml (built in), or a file holding a Jinja template;\n"
    "                       default: chat_template of the tokenizer_config.json beside the tokenizer\n"
    "  --print-prompt-ids   print the prompt's token ids on stderr before sampling\n"
    "  --logits-out FILE    write the model's logits at each of those ids' positions: (ids, vocab) float32,\n"
    "                       little-endian, before sampling\n";

ct_status cmd_generate(int argc, char **argv) {
    run_args a = {.reads_no_data = 1};
    ct_status st;
    manifest *mf = session_parse(argc, argv, &a, generate_usage, &st);
    if (a.help) {
        fputs(generate_usage, stdout);
        manifest_free(mf);
        return CT_OK;
    }
    if (!mf) return st;
    session s;
    memset(&s, 0, sizeof s);
    s.mf = mf;
    ct_tokenizer *tok = NULL;
    char path[4096];
    /* the keys, once: the model's keys the file's description sets below are none of them */
    train_settings ts;
    if ((st = train_settings_read(mf, &ts))) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        train_settings_free(&ts);
        manifest_free(mf);
        return st;
    }
    if (a.checkpoint) snprintf(path, sizeof path, "%s", a.checkpoint);
    else snprintf(path, sizeof path, "%s/model.ctt", ts.dump_folder);
    if ((st = mdesc_for_load(mf, path))) { /* the model the file describes: no shape keys needed */
        train_settings_free(&ts);
        manifest_free(mf);
        return st;
    }
    if ((st = mdesc_from_checkpoint(mf)) == CT_OK) st = session_open(&s, mf, 1, 0);
    if (st || (st = session_open_tokenizer(&s, &tok))) goto out;
    struct stat sb;
    int is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if ((is_dir ? ckpt_load_model_from(&s, path) : session_load_model(&s, path)) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        st = CT_ERR_INVALID;
        goto out;
    }
    if (session_post_step(&s) != CT_OK) { /* whole compute copies (ZeRO) take the loaded values */
        fprintf(stderr, "ctitan: parallelism: post_step: %s\n", ct_last_error());
        st = CT_ERR_INTERNAL;
        goto out;
    }
    const generate_settings *g = &ts.generate;
    int64_t max_new = g->max_new > 0 ? g->max_new : 64, T = ts.seq_len;
    const char *prompt = a.prompt ? a.prompt : g->prompt;
    if (a.chat || a.chat_template)
        st = generate_chat(&s, &a, &ts, tok, prompt, max_new, g->temperature, g->top_k, g->top_p, (uint64_t)g->seed, T);
    else if ((st = prompt_extras_text(&s, &a, tok, prompt)) == CT_OK)
        st = session_generate(&s, tok, prompt, max_new, g->temperature, g->top_k, g->top_p, (uint64_t)g->seed, T);
out:
    train_settings_free(&ts);
    tokenizer_free(tok);
    session_close(&s);
    return st;
}
