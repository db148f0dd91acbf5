/* pipeline.c: pipeline parallel on the host side (see pipeline.h).
 *
 * Stages: units are split like torchtitan's generate_llm_fqn_per_model_part: the embedding counts
 * as pipeline_parallel_first_stage_less_layers layers and the output as ..._last_stage_less_layers,
 * every block as one, and the stages share that weight as evenly as integers allow (the first ones
 * take the remainder). pipeline_parallel_stage_units ("3,3,2,2") names the units per stage instead.
 *
 * Microbatch contexts: each microbatch in flight on this rank owns a context (its activation and
 * gradient arenas, its tape and its boundary tensors). The runtime works on one context at a time:
 * entering swaps the context's arenas and unit tables into the runtime, leaving swaps them back.
 * A context is reused once the runner released every local stage of its microbatch, so a 1F1B
 * schedule holds at most about pp microbatches' activations where GPipe holds all of them.
 *
 * Strategy hooks, per microbatch in the order of the schedule's actions (strategy.h, "Life of a
 * run"): a forward action runs pre_forward(u), forward, post_forward(u) for each unit of the stage
 * in order; a backward action (B, or the input half I) runs pre_backward(u) and the unit's backward
 * in reverse order; post_backward(u, last) follows u's part of the action that completes its weight
 * gradient for that microbatch (B, or W after I), with last on the step's final one for u (and only
 * on the last pipeline_step of a step). finish_backward runs once at the end of pipeline_step.
 * Under zero-bubble schedules a unit's backward windows of two microbatches may overlap; keeping
 * storage across microbatches (no resharding under PP, as in torchtitan) is the strategy's choice.
 */
#include "engine/pipeline.h"
#include "engine/mesh.h"

#include "host/host.h"
#include "engine/session.h"
#include "engine/tape.h"
#include "engine/moe.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pp_ctx {
    arena saved, grads;
    rt_tensor **unit_in, **unit_out;
    tape_entry **unit_tape;
    rt_unit_mark *unit_mark;
    struct rt_pack *unit_pack;
    int shared_grads; /* the schedule splits no backward: internal gradients in the runtime's arena */
    rt_tensor *tok, *tgt;
    rt_tensor **stage_in; /* per stage: the activation received for it (NULL: from a local stage) */
    int mb;               /* the microbatch it holds, -1 when free */
};

static ct_status bad_setting(const manifest *mf, const char *key, const char *fmt, const char *what) {
    char where[600];
    mf_where(mf, key, where, sizeof where);
    fprintf(stderr, "ctitan: %s: ", where);
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    return CT_ERR_INVALID;
}

/* Units per stage: explicit counts, or by weight (the embedding and the output as configured). */
static ct_status split_units(pipeline *pl, const pipeline_settings *ps, const manifest *mf, const ct_model_desc *desc) {
    int nu = desc->n_units, S = pl->n_stages;
    pl->stage_u0 = calloc((size_t)S, sizeof(int));
    pl->stage_u1 = calloc((size_t)S, sizeof(int));
    if (!pl->stage_u0 || !pl->stage_u1) return CT_ERR_NOMEM;
    const char *list = ps->stage_units;
    if (list) {
        int s = 0, u = 0;
        for (const char *p = list; *p && s <= S;) {
            char *end;
            long n = strtol(p, &end, 10);
            if (end == p || n < 1) return bad_setting(mf, "parallelism.pipeline_parallel_stage_units",
                                                     "expected positive unit counts separated by commas, got '%s'", list);
            if (s < S) {
                pl->stage_u0[s] = u;
                pl->stage_u1[s] = u + (int)n - 1;
            }
            u += (int)n;
            s++;
            p = end + strspn(end, ", ");
        }
        if (s != S || u != nu) {
            char what[200];
            snprintf(what, sizeof what, "'%s' gives %d stages of %d units; the pipeline has %d stages and the model %d units",
                     list, s, u, S, nu);
            return bad_setting(mf, "parallelism.pipeline_parallel_stage_units", "%s", what);
        }
        return CT_OK;
    }
    int64_t first = ps->first_less, last = ps->last_less;
    if (first < 0 || last < 0)
        return bad_setting(mf, "parallelism.pipeline_parallel_first_stage_less_layers", "%s", "must not be negative");
    int64_t *w = calloc((size_t)nu, sizeof(int64_t)), total = 0;
    if (!w) return CT_ERR_NOMEM;
    for (int u = 0; u < nu; u++) total += w[u] = u == 0 ? first : u == nu - 1 ? last : 1;
    int64_t per = total / S, extra = total % S, quota = 0, cum = 0;
    int s = 0;
    pl->stage_u0[0] = 0;
    for (int u = 0; u < nu; u++) {
        if (cum >= quota + (s < S ? per + (s < extra) : 0) && s + 1 < S && u > pl->stage_u0[s]) {
            quota += per + (s < extra); /* stage s is full: the next one starts here */
            pl->stage_u1[s] = u - 1;
            pl->stage_u0[++s] = u;
        }
        cum += w[u];
    }
    free(w);
    pl->stage_u1[s] = nu - 1;
    if (s != S - 1) {
        char what[160];
        snprintf(what, sizeof what, "%d stages need at least %d units; the model has %d", S, S, nu);
        return bad_setting(mf, mesh_degree_keys[CT_AXIS_PP], "%s", what);
    }
    return CT_OK;
}

/* Microbatches: training.local_batch_size in pieces of pipeline_parallel_microbatch_size. */
static ct_status plan_microbatches(pipeline *pl, const pipeline_settings *ps, const manifest *mf) {
    int64_t L = ps->local_batch_size, mbs = ps->microbatch_size;
    if (mbs < 1 || L % mbs) {
        char what[160];
        snprintf(what, sizeof what, "%lld must divide training.local_batch_size (%lld) into microbatches", (long long)mbs,
                 (long long)L);
        return bad_setting(mf, "parallelism.pipeline_parallel_microbatch_size", "%s", what);
    }
    pl->mb_size = mbs;
    pl->n_mb = (int)(L / mbs);
    return CT_OK;
}

/* How many stages: the units list, layers per stage, or the schedule's stages per rank; they must
 * share evenly among the pp ranks, in a number per rank the schedule runs. */
static ct_status plan_stage_count(pipeline *pl, const pipeline_settings *ps, const manifest *mf,
                                  const ct_model_desc *desc, const char *csv) {
    const ct_schedule_api *sa = schedule_api(pl->schedp);
    const char *list = ps->stage_units;
    int64_t lps = ps->layers_per_stage;
    int n_stages;
    if (list) {
        n_stages = 1;
        for (const char *p = list; *p; p++) n_stages += *p == ',';
    } else if (lps > 0) {
        int64_t first = ps->first_less, last = ps->last_less;
        n_stages = (int)((desc->n_layers + first + last + lps - 1) / lps);
    } else { /* the schedule's own count (a CSV's stages), else its least */
        int spr = 1;
        if (schedule_stages_per_rank(pl->schedp, pl->pp, pl->n_mb, csv, &spr) != CT_OK)
            return bad_setting(mf, csv ? "parallelism.pipeline_parallel_schedule_csv" : "parallelism.pipeline_parallel_schedule",
                               "%s", ct_last_error());
        n_stages = pl->pp * spr;
    }
    char what[200];
    if (n_stages % pl->pp) {
        snprintf(what, sizeof what, "the split gives %d stages, which %d pipeline ranks cannot share evenly", n_stages,
                 pl->pp);
        return bad_setting(mf, list ? "parallelism.pipeline_parallel_stage_units"
                                    : "parallelism.pipeline_parallel_layers_per_stage", "%s", what);
    }
    pl->n_stages = n_stages;
    pl->spr = n_stages / pl->pp;
    if (pl->spr < sa->min_stages_per_rank || (sa->max_stages_per_rank > 0 && pl->spr > sa->max_stages_per_rank)) {
        snprintf(what, sizeof what, "%s runs %d to %d stages per rank; this split gives %d", pl->schedp->info.name,
                 sa->min_stages_per_rank, sa->max_stages_per_rank, pl->spr);
        return bad_setting(mf, "parallelism.pipeline_parallel_schedule", "%s", what);
    }
    return CT_OK;
}

/* Rank 0's start-up lines: the schedule's prediction and each stage's units. */
static void plan_print(const pipeline *pl, const char *(*unit_name)(ct_model *, int), ct_model *model) {
    printf("pipeline: %s, %d stages on %d ranks (%d per rank), %d microbatches of %lld; predicted bubble %.3f "
           "(F=1, B=2), at most %d microbatches held\n",
           pl->plan.name, pl->n_stages, pl->pp, pl->spr, pl->n_mb, (long long)pl->mb_size, pl->plan.bubble,
           pl->plan.peak_activations);
    for (int s = 0; s < pl->n_stages; s++)
        printf("  stage %d (rank %d): units %d-%d (%s .. %s)\n", s, schedule_stage_rank(pl->plan.placement, pl->pp, s),
               pl->stage_u0[s], pl->stage_u1[s], unit_name ? unit_name(model, pl->stage_u0[s]) : "",
               unit_name ? unit_name(model, pl->stage_u1[s]) : "");
}

int pipeline_splits_backward(const pipeline *pl) {
    for (int r = 0; r < pl->plan.pp; r++)
        for (int q = 0; q < pl->plan.ranks[r].n; q++)
            if (pl->plan.ranks[r].actions[q].op == CT_PP_I || pl->plan.ranks[r].actions[q].op == CT_PP_W) return 1;
    return 0;
}

ct_status pipeline_plan(pipeline *pl, const pipeline_settings *ps, const manifest *mf, const ct_model_desc *desc,
                        const ct_mesh_info *mesh, const char *(*unit_name)(ct_model *, int), ct_model *model) {
    char csv_path[4096];
    memset(pl, 0, sizeof *pl);
    pl->pp = mesh->degree[CT_AXIS_PP];
    pl->rank = mesh->coord[CT_AXIS_PP];
    const char *name = ps->schedule, *csv = ps->schedule_csv;
    if (csv) {
        session_resolve_path(mf, csv, csv_path, sizeof csv_path);
        csv = csv_path;
    }
    if (!(pl->schedp = schedule_load(name, mf)))
        return bad_setting(mf, "parallelism.pipeline_parallel_schedule", "%s", ct_last_error());
    ct_status st = plan_microbatches(pl, ps, mf);
    if (st == CT_OK) st = plan_stage_count(pl, ps, mf, desc, csv);
    if (st == CT_OK) st = split_units(pl, ps, mf, desc);
    if (st != CT_OK) return st;
    const char *key = csv ? "parallelism.pipeline_parallel_schedule_csv" : "parallelism.pipeline_parallel_schedule";
    if (schedule_actions(pl->schedp, pl->pp, pl->spr, pl->n_mb, csv, &pl->plan) != CT_OK)
        return bad_setting(mf, key, "%s", ct_last_error());
    schedule_costs costs = SCHEDULE_COSTS_DEFAULT;
    if (schedule_check(&pl->plan, &costs) != CT_OK) return bad_setting(mf, key, "%s", ct_last_error());
    pl->unit_rank = calloc((size_t)desc->n_units, sizeof(int));
    pl->stage_head = calloc((size_t)desc->n_units, sizeof(int));
    if (!pl->unit_rank || !pl->stage_head) return CT_ERR_NOMEM;
    for (int s = 0; s < pl->n_stages; s++) {
        pl->stage_head[pl->stage_u0[s]] = 1;
        for (int u = pl->stage_u0[s]; u <= pl->stage_u1[s]; u++)
            pl->unit_rank[u] = schedule_stage_rank(pl->plan.placement, pl->pp, s);
    }
    if (pl->rank == 0 && mesh->world_rank == 0) plan_print(pl, unit_name, model);
    return CT_OK;
}

ct_status pipeline_start(pipeline *pl, const pipeline_settings *ps, const manifest *mf, runtime *rt,
                         const ct_comm_api *capi, ct_comm *comm, const ct_mesh_info *mesh) {
    const char *name = ps->runner;
    if (!(pl->runp = plugin_load(name, CT_KIND_PIPELINE, "parallelism", mf)))
        return bad_setting(mf, "parallelism.pipeline_runner", "%s", ct_last_error());
    pl->api = pl->runp->info.api;
    if (pl->api->struct_size < sizeof(ct_pipeline_api))
        return bad_setting(mf, "parallelism.pipeline_runner", "%s", "the runner's API table is too small: rebuild it");
    int nu = rt->desc.n_units;
    pl->rt = rt;
    rt->in_order = 0; /* contexts interleave: each keeps its stages' input gradients in its own arena */
    const sched_rank *acts = &pl->plan.ranks[pl->rank];
    for (int q = 0; q < acts->n; q++) /* an input half keeps a unit's gradients until its weight half */
        pl->split_backward |= acts->actions[q].op == CT_PP_I || acts->actions[q].op == CT_PP_W;
    rt->pack_units = !pl->split_backward; /* each context's arena is a stack only without I/W */
    /* a B action runs a stage's units back to back: only the stage's input gradient (sent to the
     * stage before) outlives it, the others alternate in the runtime's two shared buffers */
    rt->bgrad_keep = pl->split_backward ? NULL : pl->stage_head;
    pl->stage_left = calloc((size_t)pl->n_mb, sizeof(int));
    pl->mb_ctx = calloc((size_t)pl->n_mb, sizeof(int));
    pl->bwd_done = calloc((size_t)nu, sizeof(int));
    pl->inbox_of = malloc(sizeof(int) * (size_t)pl->n_stages * (size_t)pl->n_mb);
    if (!pl->stage_left || !pl->mb_ctx || !pl->bwd_done || !pl->inbox_of) return CT_ERR_NOMEM;
    for (int i = 0; i < pl->n_stages * pl->n_mb; i++) pl->inbox_of[i] = -1;
    const sched_rank *mine = &pl->plan.ranks[pl->rank];
    ct_pipeline_env env = {sizeof env, capi, comm, mesh->group[CT_AXIS_PP], pl->rank, pl->pp, pl->n_stages,
                           pl->n_mb, pl->plan.placement, mine->actions, mine->n};
    ct_clear_error();
    if (pl->api->create(&pl->runp->host, &env, &pl->runner) != CT_OK) {
        fprintf(stderr, "ctitan: pipeline runner '%s': %s\n", name, ct_last_error());
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* ---- microbatch contexts ---- */

#define SWAP(type, a, b) \
    do {                   \
        type t_ = (a);     \
        (a) = (b);         \
        (b) = t_;          \
    } while (0)

/* The runtime's per-step state (arenas, unit boundaries, tape) and a microbatch's trade places
 * (called again to trade back). With shared_grads the context's grads arena holds only its
 * boundary gradients and the units' internal ones go to the runtime's own, shared arena. */
static void swap_ctx(runtime *rt, pp_ctx *c) {
    SWAP(arena, rt->saved, c->saved);
    if (c->shared_grads) rt->bgrad_ctx = rt->bgrad_ctx == &c->grads.data ? NULL : &c->grads.data;
    else SWAP(arena, rt->grads, c->grads);
    SWAP(rt_tensor **, rt->unit_in, c->unit_in);
    SWAP(rt_tensor **, rt->unit_out, c->unit_out);
    SWAP(tape_entry **, rt->unit_tape, c->unit_tape);
    SWAP(rt_unit_mark *, rt->unit_mark, c->unit_mark);
    SWAP(struct rt_pack *, rt->unit_pack, c->unit_pack);
}

static pp_ctx *ctx_new(pipeline *pl) {
    runtime *rt = pl->rt;
    int nu = rt->desc.n_units;
    pp_ctx *c = calloc(1, sizeof *c);
    pp_ctx **grown = realloc(pl->ctx, sizeof(*grown) * (size_t)(pl->n_ctx + 1));
    if (!c || !grown) {
        free(c);
        if (grown) pl->ctx = grown;
        return NULL;
    }
    pl->ctx = grown;
    pool_init(&c->saved.data, rt->d, rt->dev, CT_MEM_ACTIVATIONS);
    pool_init(&c->saved.desc, NULL, NULL, CT_MEM_OTHER);
    pool_init(&c->grads.data, rt->d, rt->dev, CT_MEM_ACTIVATIONS);
    pool_init(&c->grads.desc, NULL, NULL, CT_MEM_OTHER);
    if (rt->planning) c->saved.data.first_chunk = c->grads.data.first_chunk = RT_PLAN_CHUNK;
    c->unit_in = calloc((size_t)nu, sizeof(rt_tensor *));
    c->unit_out = calloc((size_t)nu, sizeof(rt_tensor *));
    c->unit_tape = calloc((size_t)nu, sizeof(tape_entry *));
    c->unit_mark = calloc((size_t)nu, sizeof(rt_unit_mark));
    c->unit_pack = runtime_pack_new(nu);
    c->stage_in = calloc((size_t)pl->n_stages, sizeof(rt_tensor *));
    c->mb = -1;
    c->shared_grads = !pl->split_backward;
    pl->ctx[pl->n_ctx++] = c;
    if (!c->unit_in || !c->unit_out || !c->unit_tape || !c->unit_mark || !c->unit_pack || !c->stage_in) return NULL;
    return c;
}

static void ctx_free(pp_ctx *c) {
    if (!c) return;
    pool_destroy(&c->saved.data);
    pool_destroy(&c->saved.desc);
    pool_destroy(&c->grads.data);
    pool_destroy(&c->grads.desc);
    free(c->unit_in);
    free(c->unit_out);
    free(c->unit_tape);
    free(c->unit_mark);
    free(c->unit_pack);
    free(c->stage_in);
    free(c);
}

/* The context of microbatch mb, taken (a free one, or a new one) on first use: its tokens uploaded. */
static pp_ctx *ctx_get(pipeline *pl, int mb) {
    if (mb < 0 || mb >= pl->n_mb) {
        ct_set_error("pipeline: microbatch %d out of range (0..%d)", mb, pl->n_mb - 1);
        return NULL;
    }
    if (pl->mb_ctx[mb] >= 0) return pl->ctx[pl->mb_ctx[mb]];
    int k = 0, live = 0;
    for (int i = 0; i < pl->n_ctx; i++) live += pl->ctx[i]->mb >= 0;
    while (k < pl->n_ctx && pl->ctx[k]->mb >= 0) k++;
    pp_ctx *c = k < pl->n_ctx ? pl->ctx[k] : ctx_new(pl);
    if (!c) {
        ct_set_error("pipeline: out of memory for a microbatch context");
        return NULL;
    }
    ct_status reset[4] = {pool_reset(&c->saved.data), pool_reset(&c->saved.desc), pool_reset(&c->grads.data),
                          pool_reset(&c->grads.desc)}; /* every one, whatever failed before */
    if (reset[0] != CT_OK || reset[1] != CT_OK || reset[2] != CT_OK || reset[3] != CT_OK) {
        ct_set_error("pipeline: out of memory for activations");
        return NULL;
    }
    int nu = pl->rt->desc.n_units;
    memset(c->unit_in, 0, sizeof(rt_tensor *) * (size_t)nu);
    memset(c->unit_out, 0, sizeof(rt_tensor *) * (size_t)nu);
    memset(c->unit_tape, 0, sizeof(tape_entry *) * (size_t)nu);
    memset(c->unit_mark, 0, sizeof(rt_unit_mark) * (size_t)nu);
    runtime_pack_clear(c->unit_pack, nu);
    memset(c->stage_in, 0, sizeof(rt_tensor *) * (size_t)pl->n_stages);
    c->mb = mb;
    pl->mb_ctx[mb] = k; /* a new context went in at index k too */
    if (live + 1 > pl->peak_ctx) pl->peak_ctx = live + 1;
    runtime *rt = pl->rt;
    swap_ctx(rt, c);
    rt->act = &rt->saved;
    int64_t n = pl->mb_size * pl->T;
    c->tok = runtime_upload_tokens(rt, pl->tokens + (int64_t)mb * n, pl->starts ? pl->starts + mb * n : NULL,
                                   pl->mb_size, pl->T);
    c->tgt = runtime_upload_ids(rt, pl->targets + (int64_t)mb * n, pl->mb_size, pl->T);
    swap_ctx(rt, c);
    if (!c->tok || !c->tgt) {
        if (!ct_last_error()[0]) ct_set_error("pipeline: cannot upload microbatch %d", mb);
        return NULL;
    }
    return c;
}

static ct_status check_stage(pipeline *pl, int stage) {
    if (stage < 0 || stage >= pl->n_stages || schedule_stage_rank(pl->plan.placement, pl->pp, stage) != pl->rank)
        return ct_fail(CT_ERR_INVALID, "pipeline: stage %d does not run on pp rank %d", stage, pl->rank);
    return CT_OK;
}

static ct_status fail(void) {
    if (!ct_last_error()[0]) ct_set_error("pipeline stage failed");
    return CT_ERR_INTERNAL;
}

/* ---- what the runner calls ----
 * A failed callback returns CT_ERR_INTERNAL (fail) with the error set, whatever the status inside:
 * the runner passes it on and pipeline_step reports the runner's. */

static ct_status cb_forward(void *p, int stage, int mb) {
    pipeline *pl = p;
    runtime *rt = pl->rt;
    pp_ctx *c;
    if (check_stage(pl, stage) != CT_OK || !(c = ctx_get(pl, mb))) return fail();
    int u0 = pl->stage_u0[stage], u1 = pl->stage_u1[stage], bad = 0;
    swap_ctx(rt, c);
    int box = pl->inbox_of[stage * pl->n_mb + mb];
    if (box >= 0 && !c->stage_in[stage]) { /* the received input, where it waited */
        rt_tensor *t = pool_alloc(&rt->saved.desc, sizeof *t);
        if (t) {
            memset(t, 0, sizeof *t);
            t->t.struct_size = sizeof t->t;
            t->t.dtype = CT_F32;
            t->t.ndim = pl->inbox[box].ndim;
            memcpy(t->t.shape, pl->inbox[box].shape, sizeof t->t.shape);
            t->t.data = pl->inbox[box].data;
        }
        c->stage_in[stage] = t;
    }
    rt_tensor *x = stage == 0 ? NULL : c->stage_in[stage] ? c->stage_in[stage] : rt->unit_out[u0 - 1];
    if (stage > 0 && !x) {
        ct_set_error("pipeline: stage %d has no input for microbatch %d", stage, mb);
        bad = 1;
    }
    for (int u = u0; u <= u1 && !bad; u++)
        bad = runtime_hook(rt, HOOK_PRE_FORWARD, u, 0) != CT_OK ||
              runtime_unit_fwd(rt, u, x, c->tok, c->tgt, 1, &x) != CT_OK ||
              runtime_hook(rt, HOOK_POST_FORWARD, u, 0) != CT_OK;
    if (!bad && stage == pl->n_stages - 1) {
        float lf = 0;
        if (x->t.ndim != 0 || rt->d->copy(rt->dev, &lf, x->t.data, sizeof lf, CT_COPY_D2H) != CT_OK) {
            ct_set_error("model: the last unit must return a scalar loss when given targets");
            bad = 1;
        }
        pl->loss_sum += lf;
    }
    swap_ctx(rt, c);
    return bad ? fail() : CT_OK;
}

static ct_status cb_backward(void *p, int stage, int mb, int op) {
    pipeline *pl = p;
    runtime *rt = pl->rt;
    if (check_stage(pl, stage) != CT_OK || mb < 0 || mb >= pl->n_mb || pl->mb_ctx[mb] < 0) {
        if (!ct_last_error()[0]) ct_set_error("pipeline: backward of microbatch %d before its forward", mb);
        return fail();
    }
    if (op != CT_PP_B && op != CT_PP_I && op != CT_PP_W) {
        ct_set_error("pipeline: backward op %d", op);
        return CT_ERR_INVALID;
    }
    pp_ctx *c = pl->ctx[pl->mb_ctx[mb]];
    int u0 = pl->stage_u0[stage], u1 = pl->stage_u1[stage], bad = 0;
    int halves = op == CT_PP_B ? TAPE_BOTH : op == CT_PP_I ? TAPE_INPUT : TAPE_WEIGHT;
    swap_ctx(rt, c);
    if (stage == pl->n_stages - 1 && op != CT_PP_W) { /* d(loss)/d(loss) = 1 / global valid tokens */
        float *g = rt->unit_out[u1] ? runtime_boundary_grad(rt, rt->unit_out[u1]) : NULL;
        bad = !g || rt->d->copy(rt->dev, g, &pl->loss_scale, sizeof pl->loss_scale, CT_COPY_H2D) != CT_OK;
    }
    for (int u = u1; u >= u0 && !bad; u--) { /* W opens no window: its I did */
        bad = (op != CT_PP_W && runtime_hook(rt, HOOK_PRE_BACKWARD, u, 0) != CT_OK) ||
              runtime_unit_bwd(rt, u, c->tok, c->tgt, halves) != CT_OK;
        if (!bad && op != CT_PP_I) {
            int final = ++pl->bwd_done[u] == pl->n_mb;
            bad = runtime_hook(rt, HOOK_POST_BACKWARD, u, pl->last && final) != CT_OK;
        }
    }
    swap_ctx(rt, c);
    return bad ? fail() : CT_OK;
}

static ct_status cb_output(void *p, int stage, int mb, int kind, const float **data, int *ndim, int64_t *shape) {
    pipeline *pl = p;
    runtime *rt = pl->rt;
    if (check_stage(pl, stage) != CT_OK || mb < 0 || mb >= pl->n_mb || pl->mb_ctx[mb] < 0) return fail();
    pp_ctx *c = pl->ctx[pl->mb_ctx[mb]];
    swap_ctx(rt, c);
    rt_tensor *t = kind == CT_PP_ACTIVATION ? rt->unit_out[pl->stage_u1[stage]] : rt->unit_in[pl->stage_u0[stage]];
    const float *d = !t ? NULL : kind == CT_PP_ACTIVATION ? t->t.data : runtime_boundary_grad(rt, t);
    swap_ctx(rt, c);
    if (!d) {
        ct_set_error("pipeline: stage %d has no %s for microbatch %d yet", stage,
                     kind == CT_PP_ACTIVATION ? "output" : "input gradient", mb);
        return fail();
    }
    *data = d;
    *ndim = t->t.ndim;
    memcpy(shape, t->t.shape, sizeof(int64_t) * (size_t)t->t.ndim);
    return CT_OK;
}

/* A buffer for a received activation: the index of a free one large enough, or of a new one; -1 when
 * out of memory (the caller says so). */
static int inbox_take(pipeline *pl, size_t bytes) {
    int best = -1;
    for (int i = 0; i < pl->n_inbox; i++)
        if (!pl->inbox[i].used && pl->inbox[i].cap >= bytes && (best < 0 || pl->inbox[i].cap < pl->inbox[best].cap)) best = i;
    if (best >= 0) return best;
    pp_inbox *grown = realloc(pl->inbox, sizeof *grown * (size_t)(pl->n_inbox + 1));
    if (!grown) return -1;
    pl->inbox = grown;
    pp_inbox *b = &pl->inbox[pl->n_inbox];
    memset(b, 0, sizeof *b);
    if (pl->rt->d->alloc(pl->rt->dev, bytes ? bytes : 64, (void **)&b->data) != CT_OK) return -1;
    b->cap = bytes ? bytes : 64;
    mem_account(CT_MEM_ACTIVATIONS, (int64_t)b->cap);
    return pl->n_inbox++;
}

static ct_status cb_input(void *p, int stage, int mb, int kind, int ndim, const int64_t *shape, float **data) {
    pipeline *pl = p;
    runtime *rt = pl->rt;
    pp_ctx *c = NULL;
    if (check_stage(pl, stage) != CT_OK || mb < 0 || mb >= pl->n_mb) {
        if (!ct_last_error()[0]) ct_set_error("pipeline: microbatch %d out of range (0..%d)", mb, pl->n_mb - 1);
        return fail();
    }
    if (kind != CT_PP_ACTIVATION && !(c = ctx_get(pl, mb))) return fail();
    if (ndim < 0 || ndim > CT_MAX_DIMS) {
        ct_set_error("pipeline: a boundary tensor of %d dims", ndim);
        return CT_ERR_INVALID;
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || shape[d] > ((int64_t)1 << 40)) {
            ct_set_error("pipeline: a boundary tensor of bad shape");
            return CT_ERR_INVALID;
        }
    float *out = NULL;
    if (kind == CT_PP_ACTIVATION) { /* it waits in a buffer of its own until its F takes a context */
        int64_t n = 1;
        for (int d = 0; d < ndim; d++) n *= shape[d];
        int box = inbox_take(pl, (size_t)n * sizeof(float));
        if (box < 0) {
            ct_set_error("pipeline: out of memory for a received activation");
            return fail();
        }
        pp_inbox *b = &pl->inbox[box];
        b->used = 1;
        b->ndim = ndim;
        memset(b->shape, 0, sizeof b->shape);
        memcpy(b->shape, shape, sizeof(int64_t) * (size_t)ndim);
        pl->inbox_of[stage * pl->n_mb + mb] = box;
        *data = b->data;
        return CT_OK;
    }
    swap_ctx(rt, c);
    rt->act = &rt->saved;
    {
        rt_tensor *t = rt->unit_out[pl->stage_u1[stage]];
        if (t && t->t.ndim == ndim && !memcmp(t->t.shape, shape, sizeof(int64_t) * (size_t)ndim)) out = runtime_boundary_grad(rt, t);
        else ct_set_error("pipeline: the gradient for stage %d, microbatch %d has another shape than its output", stage, mb);
    }
    swap_ctx(rt, c);
    if (!out) return fail();
    *data = out;
    return CT_OK;
}

static void cb_release(void *p, int stage, int mb) {
    pipeline *pl = p;
    (void)stage;
    if (mb < 0 || mb >= pl->n_mb || pl->mb_ctx[mb] < 0) return;
    if (--pl->stage_left[mb] > 0) return;
    for (int s = 0; s < pl->n_stages; s++) { /* its received inputs' buffers are free again */
        int *box = &pl->inbox_of[s * pl->n_mb + mb];
        if (*box >= 0) pl->inbox[*box].used = 0;
        *box = -1;
    }
    pl->ctx[pl->mb_ctx[mb]]->mb = -1; /* free for the next microbatch */
    pl->mb_ctx[mb] = -1;
}

ct_status pipeline_step(pipeline *pl, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                        float loss_scale, int last, double *loss_sum) {
    runtime *rt = pl->rt;
    if (B != pl->mb_size * pl->n_mb)
        return ct_fail(CT_ERR_INVALID, "pipeline: a batch of %lld sequences, planned for %d microbatches of %lld",
                       (long long)B, pl->n_mb, (long long)pl->mb_size);
    int nu = rt->desc.n_units;
    pl->tokens = tokens;
    pl->starts = rt->doc_starts; /* the session's, for this call */
    pl->targets = targets;
    pl->T = T;
    pl->loss_scale = loss_scale;
    runtime_moe_set_loss_scale(rt, loss_scale);
    pl->last = last;
    pl->loss_sum = 0;
    memset(pl->bwd_done, 0, sizeof(int) * (size_t)nu);
    for (int m = 0; m < pl->n_mb; m++) {
        pl->mb_ctx[m] = -1;
        pl->stage_left[m] = pl->spr;
    }
    for (int i = 0; i < pl->n_ctx; i++) pl->ctx[i]->mb = -1;
    for (int i = 0; i < pl->n_inbox; i++) pl->inbox[i].used = 0;
    for (int i = 0; i < pl->n_stages * pl->n_mb; i++) pl->inbox_of[i] = -1;
    ct_status st = runtime_reset_arenas(rt); /* the runtime's own arenas: scratch for checkpointed units */
    if (st != CT_OK) return st;
    runtime_use_shadow(rt, 1);
    ct_pipeline_host ph = {sizeof ph, pl, cb_forward, cb_backward, cb_output, cb_input, cb_release};
    ct_pipeline_stats stats = {sizeof stats, 0, 0, 0};
    ct_clear_error();
    st = pl->api->run_step(pl->runner, &ph, &stats);
    runtime_use_shadow(rt, 0);
    if (st != CT_OK) {
        if (!ct_last_error()[0]) ct_set_error("pipeline runner failed (status %d)", st);
        return st;
    }
    for (int u = 0; u < nu; u++)
        if (pl->unit_rank[u] == pl->rank && pl->bwd_done[u] != pl->n_mb)
            return ct_fail(CT_ERR_INTERNAL, "pipeline: unit %d finished %d of %d backwards this step", u,
                           pl->bwd_done[u], pl->n_mb);
    if ((st = runtime_hook(rt, HOOK_FINISH_BACKWARD, 0, 0)) != CT_OK) return st;
    pl->busy_seconds += stats.busy_seconds;
    pl->step_seconds += stats.step_seconds;
    /* the loss lives on the last stage: every pp rank gets it */
    double loss = pl->loss_sum;
    ct_clear_error();
    double t0 = ct_now();
    st = rt->dist.capi->all_reduce(rt->dist.comm, rt->dist.mesh->group[CT_AXIS_PP], &loss, &loss, 1, CT_F64,
                                   CT_REDUCE_SUM, NULL);
    rt->comm_seconds += ct_now() - t0;
    if (st != CT_OK) return st;
    *loss_sum = loss;
    return CT_OK;
}

void pipeline_free(pipeline *pl) {
    if (pl->runner) pl->api->destroy(pl->runner);
    for (int i = 0; i < pl->n_ctx; i++) ctx_free(pl->ctx[i]);
    free(pl->ctx);
    schedule_plan_free(&pl->plan);
    plugin_unload(pl->runp);
    plugin_unload(pl->schedp);
    free(pl->stage_u0);
    free(pl->stage_u1);
    free(pl->stage_head);
    free(pl->unit_rank);
    free(pl->stage_left);
    free(pl->mb_ctx);
    free(pl->bwd_done);
    for (int i = 0; i < pl->n_inbox; i++) {
        pl->rt->d->free(pl->rt->dev, pl->inbox[i].data);
        mem_account(CT_MEM_ACTIVATIONS, -(int64_t)pl->inbox[i].cap);
    }
    free(pl->inbox);
    free(pl->inbox_of);
    memset(pl, 0, sizeof *pl);
}
