/* schedule.c: pipeline schedules on the host side: names, loading, every rank's actions, the checker
 * (a simulation of all ranks together) and the pictures of its result. See schedule.h. */
#include "schedule/schedule.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"

/* Past these a shape is a mistake, not a pipeline; they keep every count an int and memory small. */
#define SCHED_MAX_RANKS 4096
#define SCHED_MAX_CELLS (1 << 24) /* stages x microbatches */
#define SCHED_MAX_ACTIONS (1 << 24) /* per rank */
#define SCHED_MAX_COST 1000000

/* ---- names ---- */

static const struct {
    const char *alias, *canonical;
} sched_aliases[] = {
    {"gpipe", "gpipe"},
    {"1f1b", "1f1b"},
    {"onefoneb", "1f1b"},
    {"pipedreamflush", "1f1b"},
    {"interleaved1f1b", "interleaved1f1b"},
    {"interleave1f1b", "interleaved1f1b"},
    {"flexibleinterleaved1f1b", "interleaved1f1b"},
    {"looped1f1b", "interleaved1f1b"}, /* torchtitan's test pp_looped_1f1b */
    {"loopedbfs", "loopedbfs"},
    {"bfs", "loopedbfs"},
    {"interleavedzerobubble", "interleavedzerobubble"},
    {"interleavezerobubble", "interleavedzerobubble"},
    {"interleavedzb", "interleavedzerobubble"},
    {"interleavezb", "interleavedzerobubble"},
    {"loopedzerobubble", "interleavedzerobubble"}, /* torchtitan's test pp_looped_zero_bubble */
    {"zb1p", "interleavedzerobubble"},
    {"zbvzerobubble", "zbvzerobubble"},
    {"zbv", "zbvzerobubble"},
    {"zbvzb", "zbvzerobubble"},
    {"zerobubblev", "zbvzerobubble"},
    {"vzerobubble", "zbvzerobubble"},
    {"csv", "csv"},
    {"pipelineschedulemulti", "csv"}, /* PyTorch's names for a schedule loaded from a CSV file */
    {"pipelineschedulesingle", "csv"},
};

int schedule_normalize(const char *name, char *out, size_t len) {
    char key[96];
    size_t n = 0;
    for (const char *c = name ? name : ""; *c; c++) {
        if (*c == '_' || *c == '-' || *c == ' ') continue;
        if (!isalnum((unsigned char)*c) || n + 1 >= sizeof key) return -1;
        key[n++] = (char)tolower((unsigned char)*c);
    }
    key[n] = 0;
    const char *k = key;
    if (strncmp(k, "schedule", 8) == 0 && k[8]) k += 8; /* ScheduleGPipe, ScheduleZBVZeroBubble ... */
    if (!*k) return -1;
    for (size_t i = 0; i < sizeof sched_aliases / sizeof *sched_aliases; i++)
        if (strcmp(k, sched_aliases[i].alias) == 0) k = sched_aliases[i].canonical;
    int w = snprintf(out, len, "ctitan-schedule-%s.so", k);
    return w < 0 || (size_t)w >= len ? -1 : 0;
}

/* ---- loading ---- */

static int sched_is_path(const char *name) {
    size_t n = strlen(name);
    return strchr(name, '/') || (n > 3 && strcmp(name + n - 3, ".so") == 0);
}

static int sched_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int sched_cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Appends `s` to the list in out (", " between), unless it is there already. */
static void sched_list_add(char *out, size_t len, const char *s) {
    size_t used = strlen(out), n = strlen(s);
    for (const char *p = out; (p = strstr(p, s)); p += n)
        if ((p == out || p[-1] == ' ') && (p[n] == ',' || p[n] == 0)) return;
    snprintf(out + used, len - used, "%s%s", used ? ", " : "", s);
}

int schedule_list(const manifest *mf, char *out, size_t len) {
    (void)mf; /* the manifest's folder is not searched: a manifest names a schedule beside it by path */
    char dirs[16][PATH_MAX];
    int nd = plugin_search_dirs(NULL, dirs, 16), count = 0;
    if (len) out[0] = 0;
    for (int d = 0; d < nd; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir) continue;
        char **names = NULL;
        int nn = 0;
        for (struct dirent *e; (e = readdir(dir));) {
            size_t l = strlen(e->d_name);
            if (strncmp(e->d_name, "ctitan-schedule-", 16) || l < 20 || strcmp(e->d_name + l - 3, ".so")) continue;
            char **grown = realloc(names, sizeof *names * (size_t)(nn + 1));
            if (!grown || !(grown[nn] = strdup(e->d_name))) {
                names = grown ? grown : names;
                break;
            }
            names = grown;
            nn++;
        }
        closedir(dir);
        if (nn) qsort(names, (size_t)nn, sizeof *names, sched_cmp_names);
        for (int i = 0; i < nn; i++) {
            char path[PATH_MAX + 256];
            int fits = snprintf(path, sizeof path, "%s/%s", dirs[d], names[i]) < (int)sizeof path;
            plugin *p = fits ? plugin_load(path, CT_KIND_SCHEDULE, "parallelism", NULL) : NULL;
            if (p) {
                size_t before = strlen(out);
                sched_list_add(out, len, p->info.name);
                count += strlen(out) != before;
                plugin_unload(p);
            }
            free(names[i]);
        }
        free(names);
    }
    return count;
}

/* Finds a schedule by name on the plugin search path: its file name in `file`, or CT_ERR_INVALID with
 * the error listing the schedules that can be loaded. */
static ct_status sched_find(const char *name, const manifest *mf, char *file, size_t filelen) {
    char dirs[16][PATH_MAX], list[1024];
    int found = 0, nd = plugin_search_dirs(NULL, dirs, 16); /* never the manifest's folder */
    if (schedule_normalize(name, file, filelen) == 0)
        for (int d = 0; d < nd && !found; d++) {
            char path[PATH_MAX + 200];
            found = snprintf(path, sizeof path, "%s/%s", dirs[d], file) < (int)sizeof path && sched_file_exists(path);
        }
    if (found) return CT_OK;
    schedule_list(mf, list, sizeof list);
    return ct_fail(CT_ERR_INVALID, "unknown pipeline schedule '%s'; the schedules that can be loaded: %s (or give the "
                   "path of a .so)", name, *list ? list : "none found (set CTITAN_PLUGIN_PATH)");
}

plugin *schedule_load(const char *name, const manifest *mf) {
    char file[160], bare[160];
    const char *what = name;
    if (!name || !*name) {
        ct_set_error("no pipeline schedule named (e.g. 1F1B, GPipe, Interleaved1F1B, ZBVZeroBubble)");
        return NULL;
    }
    if (!sched_is_path(name)) {
        if (sched_find(name, mf, file, sizeof file) != CT_OK) return NULL;
        /* plugin_load looks a bare name up as ctitan-<name>.so */
        snprintf(bare, sizeof bare, "%.*s", (int)(strlen(file) - strlen("ctitan-") - strlen(".so")), file + 7);
        what = bare;
    }
    plugin *p = plugin_load(what, CT_KIND_SCHEDULE, "parallelism", mf);
    if (!p) {
        return NULL;
    }
    const ct_schedule_api *api = p->info.api;
    const char *bad = !CT_HAS_FIELD(api, ct_schedule_api, actions)           ? "its API table is too small"
                      : !api->actions                                         ? "it has no actions function"
                      : api->placement != CT_PP_LOOP && api->placement != CT_PP_V ? "its placement is unknown"
                      : api->min_stages_per_rank < 1 ||
                              (api->max_stages_per_rank && api->max_stages_per_rank < api->min_stages_per_rank)
                          ? "its stages-per-rank range is empty"
                          : NULL;
    if (bad) {
        ct_set_error("%s: schedule plugin '%s' is broken: %s (API table %zu bytes, this host needs %zu): rebuild it",
                     p->path, p->info.name, bad, api->struct_size,
                     offsetof(ct_schedule_api, actions) + sizeof api->actions);
        plugin_unload(p);
        return NULL;
    }
    return p;
}

const ct_schedule_api *schedule_api(const plugin *p) { return p->info.api; }

ct_status schedule_stages_per_rank(const plugin *p, int pp, int n_microbatches, const char *csv_path, int *spr) {
    const ct_schedule_api *api = p->info.api;
    *spr = api->min_stages_per_rank;
    if (!CT_HAS_FIELD(api, ct_schedule_api, stages_per_rank) || !api->stages_per_rank) return CT_OK;
    ct_schedule_shape shape = {.struct_size = sizeof shape, .pp_size = pp, .n_microbatches = n_microbatches,
                               .rank = -1, .csv_path = csv_path};
    ct_clear_error();
    ct_status st = api->stages_per_rank(&p->host, &shape, spr);
    if (st != CT_OK) {
        if (!ct_last_error()[0]) ct_set_error("schedule %s: stages_per_rank failed (status %d)", p->info.name, st);
        return st;
    }
    if (*spr < 1) return ct_fail(CT_ERR_INTERNAL, "schedule %s: stages_per_rank gave %d", p->info.name, *spr);
    return CT_OK;
}

int schedule_stage_rank(ct_pp_placement placement, int pp, int stage) {
    if (placement == CT_PP_V) return stage < pp ? stage : 2 * pp - 1 - stage;
    return stage % pp;
}

/* ---- every rank's actions ---- */

static const char *sched_op_letter(int op) {
    return op == CT_PP_F ? "F" : op == CT_PP_B ? "B" : op == CT_PP_I ? "I" : op == CT_PP_W ? "W" : "?";
}

/* "1B3": stage, op, microbatch (the CSV spelling); used in every message. */
static const char *act_name(const ct_pp_action *a, char *buf, size_t len) {
    snprintf(buf, len, "%d%s%d", a->stage, sched_op_letter(a->op), a->microbatch);
    return buf;
}

void schedule_action_name(const sched_plan *plan, const ct_pp_action *a, char *out, size_t len) {
    if (plan->stages_per_rank == 1) snprintf(out, len, "%s%d", sched_op_letter(a->op), a->microbatch);
    else act_name(a, out, len);
}

void schedule_plan_free(sched_plan *plan) {
    if (!plan) return;
    for (int r = 0; plan->ranks && r < plan->pp; r++) {
        free(plan->ranks[r].actions);
        free(plan->ranks[r].start);
    }
    free(plan->ranks);
    plan->ranks = NULL;
}

/* Calls the plugin for one rank, growing the list once if the plugin asks for more room. */
static ct_status sched_rank_actions(const plugin *p, const ct_schedule_shape *shape, sched_rank *out) {
    const ct_schedule_api *api = p->info.api;
    long long guess = 3LL * shape->stages_per_rank * shape->n_microbatches + 16;
    int cap = guess < SCHED_MAX_ACTIONS ? (int)guess : SCHED_MAX_ACTIONS;
    for (int attempt = 0; attempt < 2; attempt++) {
        ct_pp_action *grown = realloc(out->actions, sizeof *grown * (size_t)cap);
        if (!grown) return ct_fail(CT_ERR_NOMEM, "out of memory for %d actions of rank %d", cap, shape->rank);
        out->actions = grown;
        /* the plugin steps through them by this struct_size (ctitan/abi.h's rule for arrays) */
        for (int k = 0; k < cap; k++) grown[k] = (ct_pp_action){.struct_size = sizeof(ct_pp_action)};
        int n = 0;
        ct_clear_error();
        ct_status st = api->actions(&p->host, shape, out->actions, cap, &n);
        if (st == CT_OK && n >= 0 && n <= cap) {
            for (int k = 0; k < n; k++) {
                const ct_pp_action *a = CT_AT(const ct_pp_action, out->actions, k);
                if (a->struct_size == sizeof(ct_pp_action)) continue;
                return ct_fail(CT_ERR_INTERNAL, "schedule %s broke its contract for rank %d: it overwrote action %d's "
                               "struct_size (%zu, the host set %zu): write each field through CT_AT and leave "
                               "struct_size", p->info.name, shape->rank, k, a->struct_size, sizeof(ct_pp_action));
            }
            out->n = n;
            return CT_OK;
        }
        if (st == CT_ERR_INVALID && n > cap && attempt == 0 && n <= SCHED_MAX_ACTIONS) {
            cap = n;
            continue;
        }
        if (n > SCHED_MAX_ACTIONS)
            return ct_fail(CT_ERR_INVALID, "schedule %s asks for %d actions on rank %d, more than the %d a rank may "
                           "run", p->info.name, n, shape->rank, SCHED_MAX_ACTIONS);
        if (st == CT_OK || n > cap)
            return ct_fail(CT_ERR_INTERNAL, "schedule %s broke its contract for rank %d: %d actions for room for %d "
                           "(status %d)", p->info.name, shape->rank, n, cap, st);
        /* the host prefixed the plugin's message with its name; the line names it once */
        const char *why = ct_last_error();
        size_t nl = strlen(p->info.name);
        if (strncmp(why, p->info.name, nl) == 0 && strncmp(why + nl, ": ", 2) == 0) why += nl + 2;
        return ct_fail(CT_ERR_INVALID, "pipeline schedule %s, pp %d x %d stage%s per rank, %d microbatch%s: %s",
                       p->info.name, shape->pp_size, shape->stages_per_rank, shape->stages_per_rank == 1 ? "" : "s",
                       shape->n_microbatches, shape->n_microbatches == 1 ? "" : "es",
                       *why ? why : "refused (the plugin gave no reason)");
    }
    return CT_ERR_INTERNAL;   /* not reached: the second attempt returns */
}

ct_status schedule_actions(const plugin *p, int pp, int stages_per_rank, int n_microbatches, const char *csv_path,
                           sched_plan *plan) {
    const ct_schedule_api *api = p->info.api;
    *plan = (sched_plan){.placement = api->placement, .pp = pp, .stages_per_rank = stages_per_rank,
                         .n_microbatches = n_microbatches};
    snprintf(plan->name, sizeof plan->name, "%s", p->info.name);
    if (pp < 1 || stages_per_rank < 1 || n_microbatches < 1)
        return ct_fail(CT_ERR_INVALID, "pp %d, stages per rank %d, microbatches %d: each must be at least 1", pp,
                       stages_per_rank, n_microbatches);
    if (pp > SCHED_MAX_RANKS || (long long)pp * stages_per_rank * n_microbatches > SCHED_MAX_CELLS)
        return ct_fail(CT_ERR_INVALID, "pp %d x %d stages per rank x %d microbatches is too large to schedule (at most "
                       "%d ranks, %d stage-microbatch pairs)", pp, stages_per_rank, n_microbatches, SCHED_MAX_RANKS,
                       SCHED_MAX_CELLS);
    plan->n_stages = pp * stages_per_rank;
    int lo = api->min_stages_per_rank, hi = api->max_stages_per_rank;
    if (stages_per_rank < lo || (hi && stages_per_rank > hi)) {
        if (lo == hi)
            return ct_fail(CT_ERR_INVALID, "pipeline schedule %s runs exactly %d stage%s per rank, got %d (%d stages "
                           "on %d ranks)", plan->name, lo, lo == 1 ? "" : "s", stages_per_rank, plan->n_stages, pp);
        if (hi)
            return ct_fail(CT_ERR_INVALID, "pipeline schedule %s needs %d to %d stages per rank, got %d (%d stages on "
                           "%d ranks)", plan->name, lo, hi, stages_per_rank, plan->n_stages, pp);
        return ct_fail(CT_ERR_INVALID, "pipeline schedule %s needs %d or more stages per rank, got %d (%d stages on "
                       "%d ranks)", plan->name, lo, stages_per_rank, plan->n_stages, pp);
    }
    if (api->placement == CT_PP_V && stages_per_rank != 2)
        return ct_fail(CT_ERR_INVALID, "pipeline schedule %s places stages in a V, which takes exactly 2 stages per "
                       "rank", plan->name);
    plan->ranks = calloc((size_t)pp, sizeof *plan->ranks);
    if (!plan->ranks) return ct_fail(CT_ERR_NOMEM, "out of memory for %d ranks", pp);
    for (int r = 0; r < pp; r++) {
        ct_schedule_shape shape = {.struct_size = sizeof shape, .pp_size = pp, .stages_per_rank = stages_per_rank,
                                   .n_microbatches = n_microbatches, .rank = r, .csv_path = csv_path};
        ct_status st = sched_rank_actions(p, &shape, &plan->ranks[r]);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* ---- the checker ---- */

/* What the checker knows of one (stage, microbatch): where in its rank's list each op sits (-1:
 * nowhere) and when it ends (-1: not yet). bi is the B or the I. */
typedef struct sched_cell {
    int f_at, bi_at, w_at, bi_op;
    int64_t f_end, bi_end, w_end;
} sched_cell;

typedef struct sched_sim {
    sched_plan *plan;
    sched_cell *cells; /* n_stages x n_microbatches */
    int *next;         /* per rank: index of the next action to run */
    int64_t *free_at;  /* per rank: when it finishes what it runs */
    int *work, n_work; /* ranks to try to advance */
    char *queued;
} sched_sim;

static sched_cell *sim_cell(const sched_sim *s, int stage, int mb) {
    return &s->cells[(size_t)stage * (size_t)s->plan->n_microbatches + (size_t)mb];
}

static int sched_cost(const schedule_costs *c, int op) {
    return op == CT_PP_F ? c->f : op == CT_PP_B ? c->b : op == CT_PP_I ? c->i : c->w;
}

/* Every action names a real op, stage and microbatch, on the rank that holds the stage, once. */
static ct_status sim_index(sched_sim *s) {
    const sched_plan *pl = s->plan;
    char a1[48];
    for (int r = 0; r < pl->pp; r++)
        for (int k = 0; k < pl->ranks[r].n; k++) {
            const ct_pp_action *a = &pl->ranks[r].actions[k];
            if (a->op < CT_PP_F || a->op > CT_PP_W)
                return ct_fail(CT_ERR_INTERNAL, "rank %d: action %d has op %d; expected F, B, I or W (1..4)", r, k,
                               a->op);
            if (a->stage < 0 || a->stage >= pl->n_stages)
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %s: stage %d is outside 0..%d", r,
                               act_name(a, a1, sizeof a1), a->stage, pl->n_stages - 1);
            if (a->microbatch < 0 || a->microbatch >= pl->n_microbatches)
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %s: microbatch %d is outside 0..%d", r,
                               act_name(a, a1, sizeof a1), a->microbatch, pl->n_microbatches - 1);
            int owner = schedule_stage_rank(pl->placement, pl->pp, a->stage);
            if (owner != r)
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %s, but stage %d is held by rank %d (%s placement)", r,
                               act_name(a, a1, sizeof a1), a->stage, owner, pl->placement == CT_PP_V ? "V" : "loop");
            sched_cell *c = sim_cell(s, a->stage, a->microbatch);
            int *at = a->op == CT_PP_F ? &c->f_at : a->op == CT_PP_W ? &c->w_at : &c->bi_at;
            if (*at >= 0 && (a->op == CT_PP_F || a->op == CT_PP_W || c->bi_op == a->op))
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %s twice (actions %d and %d of its list)", r,
                               act_name(a, a1, sizeof a1), *at, k);
            if (*at >= 0) /* the other of B and I for this (stage, microbatch) */
                return ct_fail(CT_ERR_INTERNAL, "rank %d mixes %dB%d with %dI%d: a backward is either B, or I then W",
                               r, a->stage, a->microbatch, a->stage, a->microbatch);
            *at = k;
            if (a->op == CT_PP_B || a->op == CT_PP_I) c->bi_op = a->op;
        }
    return CT_OK;
}

/* Every (stage, microbatch) has its F and its backward (B, or I then W), in a possible order. */
static ct_status sim_complete(sched_sim *s) {
    const sched_plan *pl = s->plan;
    for (int st = 0; st < pl->n_stages; st++)
        for (int mb = 0; mb < pl->n_microbatches; mb++) {
            const sched_cell *c = sim_cell(s, st, mb);
            int r = schedule_stage_rank(pl->placement, pl->pp, st);
            if (c->f_at < 0) return ct_fail(CT_ERR_INTERNAL, "rank %d never runs %dF%d", r, st, mb);
            if (c->bi_op == CT_PP_B && c->w_at >= 0)
                return ct_fail(CT_ERR_INTERNAL, "rank %d mixes %dB%d with %dW%d: a backward is either B, or I then W",
                               r, st, mb, st, mb);
            if (c->bi_at < 0 && c->w_at >= 0)
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %dW%d but never %dI%d", r, st, mb, st, mb);
            if (c->bi_at < 0)
                return ct_fail(CT_ERR_INTERNAL, "rank %d never runs %dB%d (nor %dI%d and %dW%d)", r, st, mb, st, mb,
                               st, mb);
            if (c->bi_op == CT_PP_I && c->w_at < 0)
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %dI%d but never %dW%d", r, st, mb, st, mb);
            if (c->bi_at < c->f_at)
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %d%s%d before %dF%d", r, st,
                               c->bi_op == CT_PP_B ? "B" : "I", mb, st, mb);
            if (c->w_at >= 0 && c->w_at < c->bi_at)
                return ct_fail(CT_ERR_INTERNAL, "rank %d runs %dW%d before %dI%d", r, st, mb, st, mb);
        }
    return CT_OK;
}

/* The action a must wait for, if it is not done: its (stage, microbatch) and op, in *dep. 1 when a
 * can start; *ready_at is then when its inputs are there. */
static int sim_ready(const sched_sim *s, const ct_pp_action *a, int64_t *ready_at, ct_pp_action *dep) {
    const sched_plan *pl = s->plan;
    const sched_cell *c = sim_cell(s, a->stage, a->microbatch);
    int64_t t = 0;
    if (a->op == CT_PP_F) {
        if (a->stage > 0) {
            const sched_cell *prev = sim_cell(s, a->stage - 1, a->microbatch);
            *dep = (ct_pp_action){sizeof(ct_pp_action), CT_PP_F, a->stage - 1, a->microbatch};
            if (prev->f_end < 0) return 0;
            t = prev->f_end;
        }
    } else if (a->op == CT_PP_W) {
        *dep = (ct_pp_action){sizeof(ct_pp_action), CT_PP_I, a->stage, a->microbatch};
        if (c->bi_end < 0) return 0;
        t = c->bi_end;
    } else {
        *dep = (ct_pp_action){sizeof(ct_pp_action), CT_PP_F, a->stage, a->microbatch};
        if (c->f_end < 0) return 0;
        t = c->f_end;
        if (a->stage + 1 < pl->n_stages) {
            const sched_cell *next = sim_cell(s, a->stage + 1, a->microbatch);
            *dep = (ct_pp_action){sizeof(ct_pp_action), next->bi_op, a->stage + 1, a->microbatch};
            if (next->bi_end < 0) return 0;
            if (next->bi_end > t) t = next->bi_end;
        }
    }
    *ready_at = t;
    return 1;
}

static void sim_queue(sched_sim *s, int rank) {
    if (!s->queued[rank]) {
        s->queued[rank] = 1;
        s->work[s->n_work++] = rank;
    }
}

/* Runs rank r's list as far as its dependencies allow; wakes the ranks that wait on what it ran. */
static void sim_advance(sched_sim *s, int r) {
    sched_plan *pl = s->plan;
    sched_rank *rk = &pl->ranks[r];
    while (s->next[r] < rk->n) {
        const ct_pp_action *a = &rk->actions[s->next[r]];
        int64_t ready;
        ct_pp_action dep;
        if (!sim_ready(s, a, &ready, &dep)) return;
        int64_t start = ready > s->free_at[r] ? ready : s->free_at[r];
        int64_t end = start + sched_cost(&pl->costs, a->op);
        rk->start[s->next[r]++] = start;
        rk->busy += end - start;
        s->free_at[r] = end;
        sched_cell *c = sim_cell(s, a->stage, a->microbatch);
        if (a->op == CT_PP_F) {
            c->f_end = end;
            if (a->stage + 1 < pl->n_stages) sim_queue(s, schedule_stage_rank(pl->placement, pl->pp, a->stage + 1));
        } else if (a->op == CT_PP_W) {
            c->w_end = end;
        } else {
            c->bi_end = end;
            if (a->stage > 0) sim_queue(s, schedule_stage_rank(pl->placement, pl->pp, a->stage - 1));
        }
    }
}

/* Names what each stuck rank waits for: "deadlock: rank 0 waits at 0B2 for 1B2 (rank 1), ...". */
static ct_status sim_deadlock(const sched_sim *s) {
    const sched_plan *pl = s->plan;
    char msg[2048];
    size_t used = (size_t)snprintf(msg, sizeof msg, "deadlock:");
    for (int r = 0; r < pl->pp && used < sizeof msg; r++) {
        if (s->next[r] >= pl->ranks[r].n) continue;
        const ct_pp_action *a = &pl->ranks[r].actions[s->next[r]];
        int64_t ready;
        ct_pp_action dep = {sizeof dep, 0, 0, 0};
        sim_ready(s, a, &ready, &dep);
        char a1[48], a2[48];
        int w = snprintf(msg + used, sizeof msg - used, "%s rank %d waits at %s for %s (rank %d)",
                         used > strlen("deadlock:") ? "," : "", r, act_name(a, a1, sizeof a1),
                         act_name(&dep, a2, sizeof a2), schedule_stage_rank(pl->placement, pl->pp, dep.stage));
        if (w < 0) break;
        used += (size_t)w;
    }
    return ct_fail(CT_ERR_INTERNAL, "%s", msg);
}

/* Peak microbatches with activations held, per rank: from each F until its B or W. */
static void sim_activations(sched_plan *pl) {
    pl->peak_activations = 0;
    for (int r = 0; r < pl->pp; r++) {
        sched_rank *rk = &pl->ranks[r];
        int held = 0;
        rk->peak_activations = 0;
        for (int k = 0; k < rk->n; k++) {
            int op = rk->actions[k].op;
            held += op == CT_PP_F ? 1 : op == CT_PP_B || op == CT_PP_W ? -1 : 0;
            if (held > rk->peak_activations) rk->peak_activations = held;
        }
        if (rk->peak_activations > pl->peak_activations) pl->peak_activations = rk->peak_activations;
    }
}

ct_status schedule_check(sched_plan *plan, const schedule_costs *costs) {
    const schedule_costs *c = costs;
    if (c->f < 1 || c->b < 1 || c->i < 1 || c->w < 1 || c->f > SCHED_MAX_COST || c->b > SCHED_MAX_COST ||
        c->i > SCHED_MAX_COST || c->w > SCHED_MAX_COST)
        return ct_fail(CT_ERR_INVALID, "action costs F=%d B=%d I=%d W=%d: each must be 1..%d time units", c->f, c->b,
                       c->i, c->w, SCHED_MAX_COST);
    if (!plan->ranks || plan->pp < 1 || plan->n_stages != plan->pp * plan->stages_per_rank || plan->n_microbatches < 1 ||
        (long long)plan->n_stages * plan->n_microbatches > SCHED_MAX_CELLS)
        return ct_fail(CT_ERR_INVALID, "schedule_check: an empty or inconsistent plan");
    plan->costs = *c;
    plan->makespan = 0;
    plan->bubble = 0;
    size_t n_cells = (size_t)plan->n_stages * (size_t)plan->n_microbatches;
    sched_sim s = {.plan = plan};
    s.cells = malloc(n_cells * sizeof *s.cells);
    s.next = calloc((size_t)plan->pp, sizeof *s.next);
    s.free_at = calloc((size_t)plan->pp, sizeof *s.free_at);
    s.work = malloc((size_t)plan->pp * sizeof *s.work);
    s.queued = calloc((size_t)plan->pp, 1);
    ct_status rc = CT_ERR_NOMEM;
    if (!s.cells || !s.next || !s.free_at || !s.work || !s.queued) {
        ct_set_error("out of memory checking a %d-rank schedule", plan->pp);
        goto done;
    }
    for (size_t i = 0; i < n_cells; i++) s.cells[i] = (sched_cell){-1, -1, -1, 0, -1, -1, -1};
    for (int r = 0; r < plan->pp; r++) {
        sched_rank *rk = &plan->ranks[r];
        free(rk->start);
        rk->start = malloc(((size_t)rk->n + 1) * sizeof *rk->start);
        rk->busy = 0;
        if (!rk->start) {
            ct_set_error("out of memory checking a %d-rank schedule", plan->pp);
            goto done;
        }
    }
    if ((rc = sim_index(&s)) != CT_OK || (rc = sim_complete(&s)) != CT_OK) goto done;

    for (int r = 0; r < plan->pp; r++) sim_queue(&s, r);
    while (s.n_work > 0) {
        int r = s.work[--s.n_work];
        s.queued[r] = 0;
        sim_advance(&s, r);
    }
    for (int r = 0; r < plan->pp; r++)
        if (s.next[r] < plan->ranks[r].n) {
            rc = sim_deadlock(&s);
            goto done;
        }
    int64_t busy = 0;
    for (int r = 0; r < plan->pp; r++) {
        busy += plan->ranks[r].busy;
        if (s.free_at[r] > plan->makespan) plan->makespan = s.free_at[r];
    }
    plan->bubble = plan->makespan ? 1.0 - (double)busy / ((double)plan->pp * (double)plan->makespan) : 0;
    sim_activations(plan);
    rc = CT_OK;
done:
    free(s.cells);
    free(s.next);
    free(s.free_at);
    free(s.work);
    free(s.queued);
    return rc;
}

/* ---- pictures ---- */

#define TIMELINE_MAX_WIDTH 20000

void schedule_timeline(const sched_plan *plan, FILE *out) {
    int cw = 2; /* a column per time unit: the longest action name and a space */
    char name[48];
    for (int r = 0; r < plan->pp; r++)
        for (int k = 0; k < plan->ranks[r].n; k++) {
            schedule_action_name(plan, &plan->ranks[r].actions[k], name, sizeof name);
            if ((int)strlen(name) + 1 > cw) cw = (int)strlen(name) + 1;
        }
    int64_t width = plan->makespan * cw;
    if (width > TIMELINE_MAX_WIDTH || !plan->ranks) {
        fprintf(out, "(timeline of %lld time units left out: too wide for text; use --svg)\n", (long long)plan->makespan);
        return;
    }
    char *line = malloc((size_t)width + 1);
    if (!line) return;
    int label = snprintf(NULL, 0, "rank %d", plan->pp - 1) + 2;
    /* the axis: a tick label every `every` units, far enough apart to read */
    int every = 1;
    while (every * cw < 6) every = every == 1 ? 2 : every == 2 ? 5 : every * 2;
    memset(line, ' ', (size_t)width);
    for (int64_t t = 0; t < plan->makespan; t += every) {
        char num[24];
        int n = snprintf(num, sizeof num, "%lld", (long long)t);
        if (t * cw + n <= width) memcpy(line + t * cw, num, (size_t)n);
    }
    int64_t used = width;
    while (used > 0 && line[used - 1] == ' ') used--;
    line[used] = 0;
    fprintf(out, "%-*s%s\n", label, "time", line);
    for (int r = 0; r < plan->pp; r++) {
        const sched_rank *rk = &plan->ranks[r];
        for (int64_t t = 0; t < plan->makespan; t++) { /* idle: '.' */
            memset(line + t * cw, ' ', (size_t)cw);
            line[t * cw] = '.';
        }
        for (int k = 0; k < rk->n; k++) { /* busy: the name, '-' to the end of the action */
            const ct_pp_action *a = &rk->actions[k];
            int64_t at = rk->start[k] * cw, len = (int64_t)sched_cost(&plan->costs, a->op) * cw;
            schedule_action_name(plan, a, name, sizeof name);
            memset(line + at, '-', (size_t)len - 1);
            line[at + len - 1] = ' ';
            memcpy(line + at, name, strlen(name));
        }
        used = width;
        while (used > 0 && line[used - 1] == ' ') used--;
        line[used] = 0;
        char who[24];
        snprintf(who, sizeof who, "rank %d", r);
        fprintf(out, "%-*s%s\n", label, who, line);
    }
    free(line);
}

static const char *svg_colour(int op) {
    return op == CT_PP_F ? "#4c72b0" : op == CT_PP_B ? "#55a868" : op == CT_PP_I ? "#dd8452" : "#8172b3";
}

/* Text as XML character data (a third party's schedule name may hold anything). */
static void svg_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else fputc(*s, f);
    }
}

static void svg_body(const sched_plan *pl, FILE *f) {
    const int left = 70, top = 40, row = 30, bar = 24;
    double px = 1100.0 / (double)(pl->makespan ? pl->makespan : 1);
    if (px > 40) px = 40;
    if (px < 2) px = 2;
    double width = left + px * (double)pl->makespan + 30;
    int height = top + row * pl->pp + 70;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%d\" viewBox=\"0 0 %.0f %d\" "
               "font-family=\"monospace\" font-size=\"11\">\n", width, height, width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"13\">", left);
    svg_text(f, pl->name);
    fprintf(f, ": pp %d, %d stages, %d microbatches; bubble %.3f, peak activations %d, makespan %lld</text>\n",
            pl->pp, pl->n_stages, pl->n_microbatches, pl->bubble, pl->peak_activations, (long long)pl->makespan);
    for (int r = 0; r < pl->pp; r++) {
        int y = top + r * row;
        fprintf(f, "<text x=\"8\" y=\"%d\">rank %d</text>\n", y + bar / 2 + 4, r);
        for (int k = 0; k < pl->ranks[r].n; k++) {
            const ct_pp_action *a = &pl->ranks[r].actions[k];
            double x = left + px * (double)pl->ranks[r].start[k], w = px * sched_cost(&pl->costs, a->op);
            char name[48];
            schedule_action_name(pl, a, name, sizeof name);
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" stroke=\"white\">"
                       "<title>rank %d: %s</title></rect>\n",
                    x, y, w, bar, svg_colour(a->op), r, name);
            if (w >= 5.6 * (double)strlen(name) + 2) /* the label fits in the bar */
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" fill=\"white\" font-size=\"9\" text-anchor=\"middle\">%s</text>\n",
                        x + w / 2, y + bar / 2 + 3, name);
        }
    }
    int axis = top + row * pl->pp + 4, every = 1;
    while (every * px < 40) every = every == 1 ? 2 : every == 2 ? 5 : every * 2;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n", left, axis,
            left + px * (double)pl->makespan, axis);
    for (int64_t t = 0; t <= pl->makespan; t += every) {
        double x = left + px * (double)t;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>", x, axis, x, axis + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%lld</text>\n", x, axis + 17, (long long)t);
    }
    static const int ops[] = {CT_PP_F, CT_PP_B, CT_PP_I, CT_PP_W};
    static const char *what[] = {"F forward", "B backward", "I input grad", "W weight grad"};
    for (int i = 0; i < 4; i++) {
        int x = left + i * 130, y = axis + 32;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y, svg_colour(ops[i]));
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", x + 16, y + 10, what[i]);
    }
    fprintf(f, "</svg>\n");
}

/* Writes a file through `body` under a temporary name, then renames it into place. */
static ct_status sched_write_file(const sched_plan *plan, const char *path, void (*body)(const sched_plan *, FILE *)) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return ct_fail(CT_ERR_INVALID, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return ct_fail(CT_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    body(plan, f);
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int saved = errno;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        if (!bad) saved = errno;
        unlink(tmp);
        return ct_fail(CT_ERR_IO, "cannot write %s: %s", path, strerror(saved));
    }
    return CT_OK;
}

ct_status schedule_svg(const sched_plan *plan, const char *path) { return sched_write_file(plan, path, svg_body); }

static void csv_body(const sched_plan *pl, FILE *f) {
    fprintf(f, "# %s: pp %d, %d stages (%s placement), %d microbatches; one row per rank\n", pl->name, pl->pp,
            pl->n_stages, pl->placement == CT_PP_V ? "V" : "loop", pl->n_microbatches);
    for (int r = 0; r < pl->pp; r++) {
        char name[48];
        for (int k = 0; k < pl->ranks[r].n; k++)
            fprintf(f, "%s%s", k ? "," : "", act_name(&pl->ranks[r].actions[k], name, sizeof name));
        fputc('\n', f);
    }
}

ct_status schedule_write_csv(const sched_plan *plan, const char *path) {
    return sched_write_file(plan, path, csv_body);
}
