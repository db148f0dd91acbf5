/* search.c: plan_search, every layout that multiplies to N GPUs evaluated and ranked, and the guide's
 * rule for a model's size.
 *
 * A mesh is dp_replicate x dp_shard x cp x tp x pp, and for a model with experts an ep borrowed from
 * dp_shard x cp (each divisor of dp_shard x cp that divides the experts); its knobs are the schedule, the pp microbatch
 * size, the local batch (the global batch fixed), the AC mode, compile and every search knob the
 * plugins declare where their plugin runs (ABI 2.21, plan_knobs: tp's async TP at tp > 1, cp's rotate
 * method at cp > 1, the dense quantizer's switch and, where it is on, its format). Three
 * cuts keep 405B on 4096 GPUs to about five thousand evaluations, the first two assumptions about the
 * memory and time model that physics makes true, the third a heuristic:
 *   - a mesh whose parameters, gradients and optimizer states alone (from one evaluated FSDP layout,
 *     divided by the mesh's shards) exceed the capacity is not evaluated;
 *   - memory grows with the microbatch, and less AC saves more: the largest local batch that fits is
 *     found by bisection for each AC mode, and an AC mode that recomputes more is not tried where
 *     one that recomputes less fits (it could only be slower);
 *   - every mesh is evaluated with default knobs (no compile, 1F1B, each plugin knob at the first
 *     value it lists); on the best SEARCH_FULL_MESHES of them the knobs are tuned by
 *     coordinate descent (each knob's values with the others held, until a round changes nothing).
 * Without a pipeline, a mesh whose whole local batch fits in no AC mode is walked once more with
 * every block's saved activations offloaded to host memory (activation_offload.layers). The counts
 * (meshes, pruned, evaluated, refused) come back in plan_search_stats; the output prints them.
 */
#include "plan/search.h"
#include "schedule/schedule.h"
#include "base/error.h"
#include "base/util.h"
#include "engine/mesh.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEARCH_FULL_MESHES 16
#define SEARCH_MAX_DIVISORS 256

/* DualPipeV is not tried: without its overlapped F+B pair (no such action in schedule ABI 2.x) its
 * simulated step is ZBVZeroBubble's order with whole Bs and one more microbatch held, never faster
 * (tests/cli/plan_cli.sh); a manifest that names it is still planned. */
static const char *const search_schedules[] = {"1F1B", "Interleaved1F1B", "ZBVZeroBubble", "GPipe"};
#define N_SCHEDULES ((int)(sizeof search_schedules / sizeof search_schedules[0]))

typedef struct knobs {
    const char *schedule;
    int compile;
    char v[PLAN_MAX_KNOBS][48]; /* each plugin knob's value, in plan_knobs' order ("": the manifest's) */
} knobs;

#define SEARCH_MAX_VALUES 8 /* values tried per plugin knob */

/* The fewest tokens of a sequence the search leaves a context-parallel rank. */
#define CP_MIN_TOKENS 1024

typedef struct mesh {
    int rep, shard, cp, tp, pp;
    int ep; /* expert parallel, borrowed from shard x cp (0 or 1: none) */
    double best; /* tokens/s per GPU of its best fitting layout so far, 0 none */
    knobs k;     /* the knobs of that layout (the first pass's until one fits) */
} mesh;

typedef struct searcher {
    plan_ctx *ctx;
    const hw_profile *hw;
    const plan_search_opts *o;
    plan_search_stats *st;
    plan_layout tmpl;   /* the manifest's layout: sequence length, precision, fixed knobs */
    int64_t G;          /* global batch, sequences */
    double static_all;  /* parameters + gradients + optimizer states + master weights of all ranks (0: unknown) */
    double capacity;    /* bytes a layout may use */
    int have_sched[N_SCHEDULES];
    int min_spr[N_SCHEDULES]; /* each schedule's fewest stages per rank (interleaved ones: 2) */
    int n_layers;       /* the model's blocks (activation offload's candidates) */
    int n_experts;      /* experts per MoE layer (0: a dense model, which never gets ep > 1) */
    const plan_setting *kt;          /* the plugins' search knobs (plan_knobs) ... */
    const char *const *kv;           /* ... their values, "a|b" */
    int nk;
    int quant_knob;                  /* the dense quantizer's switch among them (-1: none) */
    int fp8;                         /* the hardware has a float8 rate: the quantizer may be switched on */
    plan_result *res;
    int n_res, cap_res;
    char err[256];      /* the last refusal */
    mesh closest;       /* the pruned mesh with the most shards (walked when every mesh is pruned) */
    int have_closest;
} searcher;

/* Divisors of n in ascending order (at most max). */
static int divisors(int64_t n, int64_t *d, int max) {
    int k = 0;
    for (int64_t i = 1; i * i <= n && k < max; i++)
        if (n % i == 0) d[k++] = i;
    int lo = k;
    for (int j = lo - 1; j >= 0 && k < max; j--)
        if (d[j] * d[j] != n) d[k++] = n / d[j];
    return k;
}

/* Evaluates l: 1 fits, 0 does not, -1 refused. Every layout it did not refuse is kept. */
static int try_layout(searcher *s, const plan_layout *l) {
    plan_result r;
    memset(&r, 0, sizeof r);
    s->st->evaluated++;
    if (plan_eval(s->ctx, l, s->hw, &r) != CT_OK) {
        s->st->refused++;
        snprintf(s->err, sizeof s->err, "%s", ct_last_error());
        if (!s->st->first_refusal[0]) snprintf(s->st->first_refusal, sizeof s->st->first_refusal, "%s", s->err);
        return -1;
    }
    r.layout = *l;
    if (s->n_res == s->cap_res) {
        int cap = s->cap_res ? 2 * s->cap_res : 256;
        plan_result *g = realloc(s->res, sizeof *g * (size_t)cap);
        if (!g) return r.fits ? 1 : 0; /* out of memory: the layout is lost, the search goes on */
        s->res = g, s->cap_res = cap;
    }
    s->res[s->n_res++] = r;
    if (r.fits) s->st->fitting++;
    return r.fits ? 1 : 0;
}

static int ac_modes(const searcher *s, int *ac) {
    if (!s->o->vary_ac) {
        ac[0] = s->tmpl.ac;
        return 1;
    }
    ac[0] = PLAN_AC_NONE, ac[1] = PLAN_AC_SELECTIVE_OP, ac[2] = PLAN_AC_FULL;
    return 3;
}

/* Whether the search may give knob i other values: every knob with vary_knobs, the quantizer's
 * switch only on hardware with a float8 rate. */
static int knob_varied(const searcher *s, int i) {
    return s->o->vary_knobs && (i != s->quant_knob || s->fp8);
}

/* Whether knob i counts on mesh m with knobs k (its plugin runs there). */
static int knob_counts(const searcher *s, int i, const mesh *m, const knobs *k) {
    plan_layout l;
    l.dp_replicate = m->rep, l.dp_shard = m->shard, l.cp = m->cp, l.tp = m->tp, l.pp = m->pp;
    l.quant = s->quant_knob >= 0 ? !strcmp(k->v[s->quant_knob], "true") : s->tmpl.quant;
    return plan_knob_applies(&s->kt[i], &l);
}

static int knob_boolean(const searcher *s, int i) { return !strcmp(s->kv[i], "false|true") || !strcmp(s->kv[i], "true|false"); }

/* One mesh with one set of knobs: the batch walks described at the top. Returns the best tokens/s
 * per GPU that fit (0 none). */
static double walk(searcher *s, const mesh *m, const knobs *k) {
    plan_layout l = s->tmpl;
    l.dp_replicate = m->rep, l.dp_shard = m->shard, l.cp = m->cp, l.tp = m->tp, l.pp = m->pp;
    l.ep = m->ep > 1 ? m->ep : 1;
    snprintf(l.schedule, sizeof l.schedule, "%s", m->pp > 1 ? k->schedule : s->tmpl.schedule);
    l.compile = k->compile;
    for (int i = 0; i < s->nk; i++) plan_layout_set_knob(&l, i, k->v[i]);
    l.global_batch = s->G;
    if (m->pp > 1) l.offload = 0; /* (not with a pipeline yet) */
    int64_t B = s->G / ((int64_t)m->rep * m->shard), d[SEARCH_MAX_DIVISORS];
    int nd = divisors(B, d, SEARCH_MAX_DIVISORS), ac[3], nac = ac_modes(s, ac);
    /* a local batch past the manifest's limit on tokens per microbatch would not load */
    int64_t max_local = l.seq_len > 0 ? MF_MAX_MICROBATCH_TOKENS / l.seq_len : B;
    while (nd > 0 && d[nd - 1] > max_local) nd--;
    if (nd == 0) return 0;
    int first = s->n_res;
    /* without a pipeline, where the whole local batch fits in no AC mode, once more with every
     * block's activations in host memory: copies beside compute instead of more steps */
    int blocks = s->n_layers, passes = m->pp == 1 && s->o->vary_offload && blocks > 2 && !s->tmpl.offload ? 2 : 1;
    int fit_at = -1; /* the largest index that fit with less recomputation (or without offload) */
    for (int pass = 0; pass < passes && m->pp == 1 && fit_at < nd - 1; pass++) {
        /* the largest local batch that fits, per AC mode; gradient accumulation does the rest */
        l.pp_microbatch_size = s->tmpl.pp_microbatch_size;
        if (pass) l.offload = blocks;
        for (int a = 0; a < nac && fit_at < nd - 1; a++) {
            l.ac = ac[a];
            /* more recomputation fits at least where less did: only larger batches are news */
            int lo = fit_at + 1, hi = nd - 1, refused = 0;
            l.local_batch = d[lo];
            int r = try_layout(s, &l);
            if (r < 0) break; /* the knobs are refused at any batch */
            if (r == 0) continue; /* not even one step up: this mode gains nothing */
            fit_at = lo++;
            if (lo <= hi) { /* the whole batch first: the common case at scale */
                l.local_batch = d[hi];
                int q = try_layout(s, &l);
                if (q < 0) break;
                if (q) fit_at = hi, lo = hi + 1;
                else hi--;
            }
            while (lo <= hi) {
                int mid = (lo + hi) / 2;
                l.local_batch = d[mid];
                int q = try_layout(s, &l);
                if (q < 0) {
                    refused = 1;
                    break;
                }
                if (q) fit_at = mid, lo = mid + 1;
                else hi = mid - 1;
            }
            if (refused) break;
        }
    }
    if (m->pp > 1) { /* the whole local batch per step, split into pp microbatches; the microbatch walks up */
        l.local_batch = d[nd - 1]; /* B, or the largest part of it the limit allows (accumulating the rest) */
        nd = divisors(l.local_batch, d, SEARCH_MAX_DIVISORS);
        int a0 = 0; /* an AC mode that did not fit a smaller microbatch does not fit this one */
        for (int i = 0; i < nd && a0 < nac; i++) {
            l.pp_microbatch_size = (int)d[i];
            int fit = 0, refused = 0;
            for (int a = a0; a < nac && !fit && !refused; a++) {
                l.ac = ac[a];
                int r = try_layout(s, &l);
                refused = r < 0, fit = r == 1;
                if (r == 0) a0 = a + 1;
            }
            /* refused: fewer microbatches are refused too; nothing fits: larger ones do not either */
            if (refused || !fit) break;
        }
    }
    double best = 0;
    for (int i = first; i < s->n_res; i++)
        if (s->res[i].fits && s->res[i].tokens_per_s_per_gpu > best) best = s->res[i].tokens_per_s_per_gpu;
    return best;
}

int plan_layout_kind(const plan_layout *l) { return l->pp > 1 ? 2 : l->tp > 1 ? 1 : 0; }

void plan_model_sizes_get(const plan_ctx *ctx, plan_model_sizes *ms) {
    const ct_model_desc *d = plan_model(ctx);
    memset(ms, 0, sizeof *ms);
    ms->n_params = (double)d->n_params;
    ms->n_heads = (int)d->n_heads, ms->n_kv_heads = (int)d->n_kv_heads;
    ms->n_layers = d->n_layers > 0 ? d->n_layers : (d->n_units > 2 ? d->n_units - 2 : 1);
}

/* Parameters, gradients, optimizer states and master weights of every rank, from one FSDP layout
 * over every GPU (their sum on the largest rank times the ranks: at least the true total). */
static void static_memory(searcher *s) {
    plan_layout l = s->tmpl;
    plan_result r;
    l.dp_replicate = 1, l.dp_shard = s->o->gpus, l.cp = 1, l.tp = 1, l.pp = 1, l.ep = 1;
    l.local_batch = 1, l.global_batch = s->o->gpus, l.pp_microbatch_size = 1;
    l.ac = PLAN_AC_FULL, l.compile = 0;
    if (s->quant_knob >= 0) plan_layout_set_knob(&l, s->quant_knob, "false");
    l.quant = 0;
    memset(&r, 0, sizeof r);
    s->st->evaluated++;
    if (plan_eval(s->ctx, &l, s->hw, &r) != CT_OK) {
        s->st->refused++;
        return; /* no pruning: every mesh is evaluated */
    }
    s->capacity = s->hw->mem_bytes > 0 ? s->hw->mem_bytes * (1.0 - s->hw->headroom_frac) : r.mem_capacity;
    s->n_experts = r.n_experts;
    s->static_all = (r.mem[PLAN_MEM_PARAMS] + r.mem[PLAN_MEM_GRADS] + r.mem[PLAN_MEM_OPTIMIZER] + r.mem[PLAN_MEM_MASTER]) *
                    (double)s->o->gpus;
}

/* 1 when the mesh cannot fit: 90% of its even share of the static memory exceeds the capacity (the
 * 10% covers padding and parameters a shard keeps whole). */
static int pruned(const searcher *s, const mesh *m) {
    if (s->static_all <= 0 || s->capacity <= 0) return 0;
    return 0.9 * s->static_all / ((double)m->shard * m->cp * m->tp * m->pp) > s->capacity;
}

/* Whether a and b set every knob that counts in them alike. */
static int same_knob_values(const plan_layout *a, const plan_layout *b) {
    if (a->n_knobs != b->n_knobs) return 0;
    for (int i = 0; i < a->n_knobs; i++) {
        int in_a = plan_knob_applies(&a->knob[i], a), in_b = plan_knob_applies(&b->knob[i], b);
        if (in_a != in_b || (in_a && strcmp(a->knob[i].value, b->knob[i].value))) return 0;
    }
    return 1;
}

static int same_layout_but_strategy_knobs(const plan_layout *a, const plan_layout *b);

static int same_layout(const plan_layout *a, const plan_layout *b) {
    return a->dp_replicate == b->dp_replicate && a->dp_shard == b->dp_shard && a->cp == b->cp && a->tp == b->tp &&
           (a->ep > 1 ? a->ep : 1) == (b->ep > 1 ? b->ep : 1) &&
           a->pp == b->pp && (a->pp == 1 || (!strcmp(a->schedule, b->schedule) && a->pp_microbatch_size == b->pp_microbatch_size)) &&
           a->local_batch == b->local_batch && a->global_batch == b->global_batch && a->ac == b->ac &&
           a->quant == b->quant && a->compile == b->compile && same_knob_values(a, b);
}

static int same_layout_but_strategy_knobs(const plan_layout *a, const plan_layout *b) {
    plan_layout x = *a, y = *b;
    for (int i = 0; i < x.n_knobs && i < y.n_knobs; i++)
        if (!x.knob[i].quantizer) snprintf(x.knob[i].value, sizeof x.knob[i].value, "%s", y.knob[i].value);
    return same_layout(&x, &y);
}

/* A knob the model gives no effect (compile, a strategy's knob where nothing changes, such as async
 * TP where nothing overlaps): the same layout but for those, planned to the same memory and time, is
 * not a second choice. */
static int same_outcome(const plan_result *a, const plan_result *b) {
    plan_layout x = a->layout, y = b->layout;
    x.compile = y.compile;
    return same_layout_but_strategy_knobs(&x, &y) && a->mem_total == b->mem_total && a->step_time == b->step_time;
}

static int mesh_cmp(const void *a, const void *b) {
    double x = ((const mesh *)a)->best, y = ((const mesh *)b)->best;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int result_cmp(const void *a, const void *b) {
    const plan_result *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (x->fits) {
        if (x->tokens_per_s_per_gpu != y->tokens_per_s_per_gpu) return x->tokens_per_s_per_gpu < y->tokens_per_s_per_gpu ? 1 : -1;
    }
    return x->mem_total < y->mem_total ? -1 : x->mem_total > y->mem_total;
}

/* The meshes of opts->gpus that divide the model and the global batch; NULL with *n 0 when none. */
static mesh *meshes_list(searcher *s, int *n) {
    const plan_search_opts *o = s->o;
    const plan_model_sizes *ms = &s->st->model;
    int64_t d[SEARCH_MAX_DIVISORS];
    int nd = divisors(o->gpus, d, SEARCH_MAX_DIVISORS), cap = 64, k = 0;
    mesh *list = malloc(sizeof *list * (size_t)cap);
    if (!list) return NULL;
    for (int a = 0; a < nd; a++) {
        int tp = (int)d[a];
        if (tp > o->gpus_per_node) break;
        if (ms->n_heads && ms->n_heads % tp) continue;
        if (ms->n_kv_heads && ms->n_kv_heads % tp) continue;
        for (int b = 0; b < nd; b++) {
            int pp = (int)d[b];
            if ((o->gpus / tp) % pp) continue;
            if (pp > ms->n_layers) break;
            for (int e = 0; e < nd; e++) {
                /* context parallel: a degree cutting each sequence into 2 x cp chunks of whole tokens, each
                 * rank keeping at least CP_MIN_TOKENS of it (below that its K/V traffic outweighs what it saves) */
                int cp = (int)d[e];
                if ((o->gpus / tp / pp) % cp) continue;
                if (cp > 1 && (s->tmpl.seq_len % (2 * cp) || s->tmpl.seq_len / cp < CP_MIN_TOKENS)) continue;
                int dp = o->gpus / tp / pp / cp;
                if (s->G % dp) continue; /* the global batch does not split over the replicas */
                for (int c = 0; c < nd; c++) {
                    int rep = (int)d[c];
                    if (rep > dp) break;
                    if (dp % rep) continue;
                    /* expert parallel (MoE models): ep divides dp_shard x cp, the ranks it borrows, as
                     * torchtitan requires, and the experts, which it splits */
                    int64_t de[SEARCH_MAX_DIVISORS];
                    int nde = s->n_experts > 0 ? divisors((int64_t)(dp / rep) * cp, de, SEARCH_MAX_DIVISORS) : 1;
                    if (s->n_experts <= 0) de[0] = 1;
                    for (int x = 0; x < nde; x++) {
                        if (s->n_experts > 0 && s->n_experts % de[x]) continue;
                        mesh m = {.rep = rep, .shard = dp / rep, .cp = cp, .tp = tp, .pp = pp, .ep = (int)de[x]};
                        s->st->meshes++;
                        if (pruned(s, &m)) {
                            s->st->pruned++;
                            int64_t sh = (int64_t)m.shard * m.cp * m.tp * m.pp;
                            if (!s->have_closest || sh > (int64_t)s->closest.shard * s->closest.cp * s->closest.tp * s->closest.pp)
                                s->closest = m, s->have_closest = 1;
                            continue;
                        }
                        if (k == cap) {
                            mesh *g = realloc(list, sizeof *g * (size_t)(cap *= 2));
                            if (!g) {
                                *n = k;
                                return list;
                            }
                            list = g;
                        }
                        list[k++] = m;
                    }
                }
            }
        }
    }
    *n = k;
    return list;
}

/* The first pass's knobs: no compile, 1F1B, each plugin knob the search varies at the first value it
 * lists (the quantizer off: its casts add memory, and the first pass keeps every mesh that fits). */
static knobs first_knobs(const searcher *s) {
    const plan_search_opts *o = s->o;
    knobs k;
    memset(&k, 0, sizeof k);
    k.schedule = "1F1B";
    k.compile = o->vary_compile ? 0 : s->tmpl.compile;
    if (!o->vary_schedule && s->tmpl.schedule[0]) k.schedule = s->tmpl.schedule;
    for (int i = 0; i < s->nk; i++) {
        if (knob_varied(s, i)) plan_knob_value(s->kv[i], 0, k.v[i], sizeof k.v[i]);
        else snprintf(k.v[i], sizeof k.v[i], "%s", s->tmpl.knob[i].value);
    }
    return k;
}

static int same_knobs(const searcher *s, const knobs *a, const knobs *b, const mesh *m) {
    if (a->compile != b->compile || (m->pp > 1 && strcmp(a->schedule, b->schedule))) return 0;
    for (int i = 0; i < s->nk; i++) {
        int in_a = knob_counts(s, i, m, a), in_b = knob_counts(s, i, m, b);
        if (in_a != in_b || (in_a && strcmp(a->v[i], b->v[i]))) return 0;
    }
    return 1;
}

/* The knobs of one mesh by coordinate descent from the first pass's: each knob's other values
 * tried with the rest held, the best kept, until a round changes nothing. The quantizer's switch and
 * compile move together (four pairs): they interact (compile may refuse the quantizer). Dimension 0
 * is the schedule, 1 that pair, 2 + i plugin knob i. */
static int schedule_fits(const searcher *s, const char *name, int pp);

static int knob_alternatives(searcher *s, const mesh *m, const knobs *cur, int dim, knobs *alt) {
    const plan_search_opts *o = s->o;
    int na = 0;
    if (dim == 0 && m->pp > 1 && o->vary_schedule)
        for (int i = 0; i < N_SCHEDULES; i++)
            if (s->have_sched[i] && schedule_fits(s, search_schedules[i], m->pp))
                alt[na] = *cur, alt[na++].schedule = search_schedules[i];
    int q = s->quant_knob, vq = q >= 0 && knob_varied(s, q);
    if (dim == 1)
        for (int f = 0; f < (vq ? 2 : 1); f++)
            for (int c = 0; c < (o->vary_compile ? 2 : 1); c++) {
                alt[na] = *cur;
                if (vq) plan_knob_value(s->kv[q], f, alt[na].v[q], sizeof alt[na].v[q]);
                if (o->vary_compile) alt[na].compile = c;
                na++;
            }
    int i = dim - 2;
    if (i >= 0 && i < s->nk && i != q && knob_varied(s, i) && knob_counts(s, i, m, cur))
        for (int j = 0; j < SEARCH_MAX_VALUES; j++) {
            alt[na] = *cur;
            if (!plan_knob_value(s->kv[i], j, alt[na].v[i], sizeof alt[na].v[i])) break;
            na++;
        }
    return na;
}

static void tune_mesh(searcher *s, mesh *m, const knobs *k1) {
    knobs tried[64], cur = m->k;
    int nt = 0;
    tried[nt++] = *k1; /* walked in the first pass, like m->k */
    if (!same_knobs(s, &cur, k1, m)) tried[nt++] = cur;
    for (int round = 0; round < 3; round++) {
        int moved = 0;
        for (int dim = 0; dim < 2 + s->nk; dim++) {
            knobs alt[N_SCHEDULES + SEARCH_MAX_VALUES + 4];
            int na = knob_alternatives(s, m, &cur, dim, alt);
            knobs best = cur;
            for (int i = 0; i < na; i++) {
                int seen = 0;
                for (int j = 0; j < nt && !seen; j++) seen = same_knobs(s, &tried[j], &alt[i], m);
                if (seen || nt == 64) continue;
                tried[nt++] = alt[i];
                double b = walk(s, m, &alt[i]);
                if (b > m->best) m->best = b, m->k = alt[i], best = alt[i], moved = 1;
            }
            cur = best;
        }
        if (!moved) break;
    }
}

/* knobs k with the quantizer off and no compile, where the search varies those */
static knobs plain_knobs(const searcher *s, knobs k) {
    if (s->quant_knob >= 0 && knob_varied(s, s->quant_knob))
        plan_knob_value(s->kv[s->quant_knob], 0, k.v[s->quant_knob], sizeof k.v[0]);
    if (s->o->vary_compile) k.compile = 0;
    return k;
}

/* One GPU count: every mesh with the first pass's knobs, then the best meshes' knobs tuned. s->res
 * holds what was evaluated. */
static void search_count(searcher *s) {
    int nm = 0;
    mesh *ms = meshes_list(s, &nm); /* NULL: none divides (or no memory): no layout */
    if (nm == 0 && s->have_closest) { /* all pruned: the most sharded one shows how far from fitting */
        knobs plain = plain_knobs(s, first_knobs(s));
        walk(s, &s->closest, &plain);
    }
    knobs k1 = first_knobs(s);
    for (int i = 0; i < nm; i++) {
        ms[i].k = k1;
        ms[i].best = walk(s, &ms[i], &k1);
        if (ms[i].best == 0 && (s->o->vary_knobs || s->o->vary_compile)) {
            /* nothing fits or every probe was refused: the quantizer's copies, or the quantizer or
             * compile the plugins cannot plan here, may be why; the plain knobs */
            knobs plain = plain_knobs(s, k1);
            if (!same_knobs(s, &plain, &k1, &ms[i])) ms[i].k = plain, ms[i].best = walk(s, &ms[i], &plain);
        }
    }
    qsort(ms, (size_t)nm, sizeof *ms, mesh_cmp);
    for (int i = 0; i < nm && i < SEARCH_FULL_MESHES && ms[i].best > 0; i++) {
        tune_mesh(s, &ms[i], &k1);
        s->st->full_meshes++;
    }
    free(ms);
}

/* The global batch every layout keeps: training.global_batch_size, else the manifest's local batch
 * times its data-parallel degree at these GPUs. */
static int64_t global_batch(const plan_layout *t) {
    if (t->global_batch > 0) return t->global_batch;
    return t->local_batch * (int64_t)t->dp_replicate * t->dp_shard;
}

static void searcher_init(searcher *s, plan_ctx *ctx, const plan_search_opts *o, const hw_profile *hw,
                          plan_search_stats *st, const plan_layout *tmpl, int64_t G) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx, s->hw = hw, s->o = o, s->st = st, s->tmpl = *tmpl, s->G = G;
    if (!s->tmpl.schedule[0]) snprintf(s->tmpl.schedule, sizeof s->tmpl.schedule, "1F1B");
    char names[1024], norm[128], mine[128];
    schedule_list(NULL, names, sizeof names);
    for (int i = 0; i < N_SCHEDULES; i++) {
        if (schedule_normalize(search_schedules[i], mine, sizeof mine)) continue;
        for (char *p = names; *p;) {
            size_t len = strcspn(p, ",");
            char one[128];
            snprintf(one, sizeof one, "%.*s", (int)len, p);
            char *q = one;
            while (*q == ' ') q++;
            if (!schedule_normalize(q, norm, sizeof norm) && !strcmp(norm, mine)) s->have_sched[i] = 1;
            p += len;
            if (*p == ',') p++;
        }
    }
    for (int i = 0; i < N_SCHEDULES; i++) { /* a stage per unit at most: pp x stages per rank <= units */
        plugin *p = s->have_sched[i] ? schedule_load(search_schedules[i], NULL) : NULL;
        s->min_spr[i] = p ? schedule_api(p)->min_stages_per_rank : 1;
        if (s->min_spr[i] < 1) s->min_spr[i] = 1;
        if (p) plugin_unload(p);
    }
    const ct_model_desc *d = plan_model(ctx);
    s->n_layers = d->n_layers > 0 ? d->n_layers : d->n_units - 2;
    s->nk = plan_knobs(ctx, &s->kt, &s->kv);
    s->quant_knob = -1;
    for (int i = 0; i < s->nk; i++)
        if (s->kt[i].enables) s->quant_knob = i;
    s->fp8 = hw->peak_flops[PLAN_FP8] > 0;
    static_memory(s);
}

/* Whether the schedule places pp x its stages per rank on the model's units (layers + embedding + output). */
static int schedule_fits(const searcher *s, const char *name, int pp) {
    for (int i = 0; i < N_SCHEDULES; i++)
        if (!strcmp(name, search_schedules[i])) return (int64_t)pp * s->min_spr[i] <= (int64_t)s->st->model.n_layers + 2;
    return 1; /* the manifest's own schedule: the plugins say */
}

/* The best fitting tokens/s per GPU at `gpus` (0 when nothing fits there). */
static double best_at(plan_ctx *ctx, const plan_search_opts *o, const hw_profile *hw, plan_search_stats *st,
                      const plan_layout *tmpl, int64_t G, int gpus) {
    plan_search_opts so = *o;
    so.gpus = gpus;
    plan_search_stats sub;
    memset(&sub, 0, sizeof sub);
    sub.model = st->model;
    searcher s;
    searcher_init(&s, ctx, &so, hw, &sub, tmpl, G);
    search_count(&s);
    double best = 0;
    for (int i = 0; i < s.n_res; i++)
        if (s.res[i].fits && s.res[i].tokens_per_s_per_gpu > best) best = s.res[i].tokens_per_s_per_gpu;
    st->evaluated += sub.evaluated, st->refused += sub.refused;
    free(s.res);
    return best;
}

/* The guide's layout: its mesh and knobs (schedule, compile, the quantizer, async TP) as the rule
 * says, the AC mode and microbatch tuned to the memory as for any mesh (the guide's second step);
 * compile, then the quantizer, dropped where the plugins refuse them, and that said. Its best variant
 * that fits, else the one that needs the least memory. The guide's "async TP" is every boolean knob
 * the tp axis's strategy declares, on; its other knobs are the manifest's (else their first value). */
static void rule_eval(searcher *s, const plan_result *winner) {
    plan_search_stats *st = s->st;
    plan_layout rl;
    st->rule = plan_guide_rule(st->model.n_params, s->o->gpus, s->o->gpus_per_node, &rl);
    mesh m = {.rep = rl.dp_replicate, .shard = rl.dp_shard, .cp = rl.cp, .tp = rl.tp, .pp = rl.pp};
    knobs k;
    memset(&k, 0, sizeof k);
    k.schedule = rl.pp > 1 ? rl.schedule : s->tmpl.schedule;
    k.compile = rl.compile;
    for (int i = 0; i < s->nk; i++) {
        snprintf(k.v[i], sizeof k.v[i], "%s", s->tmpl.knob[i].value);
        if (!k.v[i][0]) plan_knob_value(s->kv[i], 0, k.v[i], sizeof k.v[i]);
        if (s->kt[i].axis == CT_AXIS_TP && rl.tp > 1 && knob_boolean(s, i)) snprintf(k.v[i], sizeof k.v[i], "true");
    }
    int q = s->quant_knob;
    if (q >= 0) snprintf(k.v[q], sizeof k.v[q], "%s", rl.quant && s->fp8 ? "true" : "false");
    searcher rs = *s; /* its own results: s->res is sorted and pointed into */
    rs.res = NULL, rs.n_res = rs.cap_res = 0, rs.err[0] = 0;
    int64_t dp = (int64_t)m.rep * m.shard;
    if (rs.G % dp) rs.G = (rs.G / dp > 0 ? rs.G / dp : 1) * dp; /* the nearest batch that splits */
    walk(&rs, &m, &k);
    for (int drop = 0; rs.n_res == 0 && drop < 2; drop++) {
        if (drop == 0 ? !k.compile : q < 0 || strcmp(k.v[q], "true")) continue;
        size_t used = strlen(st->rule_err);
        snprintf(st->rule_err + used, sizeof st->rule_err - used, "%s%s off: %.150s", used ? "; " : "",
                 drop == 0 ? "compile" : s->tmpl.quant_name, rs.err);
        if (drop == 0) k.compile = 0;
        else snprintf(k.v[q], sizeof k.v[q], "false");
        walk(&rs, &m, &k);
    }
    int pick = -1;
    for (int i = 0; i < rs.n_res; i++) {
        const plan_result *r = &rs.res[i];
        if (pick < 0) pick = i;
        else if (r->fits != rs.res[pick].fits) pick = r->fits ? i : pick;
        else if (r->fits ? r->tokens_per_s_per_gpu > rs.res[pick].tokens_per_s_per_gpu : r->mem_total < rs.res[pick].mem_total)
            pick = i;
    }
    memset(&st->rule_result, 0, sizeof st->rule_result);
    st->rule_evaluated = pick >= 0;
    if (pick >= 0) {
        st->rule_result = rs.res[pick];
    } else { /* for the text: the rule's layout as it would have been tried */
        plan_layout l = s->tmpl;
        l.dp_replicate = m.rep, l.dp_shard = m.shard, l.cp = m.cp, l.tp = m.tp, l.pp = m.pp, l.ep = 1;
        snprintf(l.schedule, sizeof l.schedule, "%s", k.schedule);
        l.compile = k.compile, l.ac = rl.ac;
        for (int i = 0; i < s->nk; i++) plan_layout_set_knob(&l, i, k.v[i]);
        l.global_batch = rs.G, l.local_batch = rs.G / dp;
        st->rule_result.layout = l;
        snprintf(st->rule_err, sizeof st->rule_err, "%s", rs.err);
    }
    st->rule_layout = st->rule_result.layout;
    st->agrees = winner && winner->fits && plan_layout_kind(&winner->layout) == plan_layout_kind(&st->rule_layout);
    free(rs.res);
}

/* The winner's layout with each value of the string knob the cp axis's strategy declares (its rotate
 * method), its other settings held: the numbers that say why its value won (a value the plugin
 * refuses there says why instead). */
static void cp_methods_eval(searcher *s, const plan_result *win) {
    plan_search_stats *st = s->st;
    const plan_layout *w = &win->layout;
    int ki = -1;
    for (int i = 0; i < s->nk && ki < 0; i++)
        if (s->kt[i].axis == CT_AXIS_CP && !knob_boolean(s, i) && knob_varied(s, i)) ki = i;
    char value[48];
    if (w->cp <= 1 || ki < 0 || !plan_knob_value(s->kv[ki], 1, value, sizeof value)) return;
    st->cp_knob = ki;
    for (int i = 0; i < (int)(sizeof st->cp_methods / sizeof st->cp_methods[0]); i++) {
        if (!plan_knob_value(s->kv[ki], i, value, sizeof value)) break;
        struct plan_cp_method *e = &st->cp_methods[st->n_cp_methods++];
        memset(e, 0, sizeof *e);
        e->r.layout = *w;
        plan_layout_set_knob(&e->r.layout, ki, value);
        if (!strcmp(w->knob[ki].value, value)) {
            e->r = *win, e->evaluated = 1;
            continue;
        }
        plan_layout l = e->r.layout;
        st->evaluated++;
        if (plan_eval(s->ctx, &l, s->hw, &e->r) != CT_OK) {
            st->refused++;
            e->r.layout = l;
            snprintf(e->note, sizeof e->note, "%s", ct_last_error());
        } else {
            e->r.layout = l, e->evaluated = 1;
        }
    }
}

/* The manifest's degrees do not fit `gpus` (tp 8 on 1 GPU): its layout at its own size still gives
 * the search its knobs and batch; the global batch, when the manifest leaves it to the data-parallel
 * degree, is its local batch times the data-parallel ranks its tp x pp x cp leave of `gpus`. CT_OK, or
 * the manifest layout's error at `gpus` (the one set before the call) set again. */
static ct_status template_elsewhere(plan_ctx *ctx, int gpus, plan_layout *t) {
    char first[2048];
    snprintf(first, sizeof first, "%s", ct_last_error());
    const manifest *mf = plan_manifest(ctx);
    int64_t rep = 1, shard = -1, tp = 1, pp = 1, cp = 1;
    mf_get_int(mf, mesh_degree_keys[CT_AXIS_DP_REPLICATE], &rep);
    mf_get_int(mf, mesh_degree_keys[CT_AXIS_DP_SHARD], &shard);
    mf_get_int(mf, mesh_degree_keys[CT_AXIS_TP], &tp);
    mf_get_int(mf, mesh_degree_keys[CT_AXIS_PP], &pp);
    mf_get_int(mf, mesh_degree_keys[CT_AXIS_CP], &cp);
    int64_t others = rep * tp * pp * cp, world = others * (shard > 0 ? shard : 1);
    if (rep < 1 || tp < 1 || pp < 1 || cp < 1 || world < 1 || world > 1000000)
        return CT_ERR_INVALID; /* the message as it was */
    if (plan_layout_from_manifest(ctx, (int)world, t) != CT_OK) return ct_fail(CT_ERR_INVALID, "%s", first);
    if (t->global_batch <= 0) {
        int64_t dp = gpus / (tp * pp * cp);
        t->global_batch = t->local_batch * (dp > 0 ? dp : 1);
    }
    return CT_OK;
}

ct_status plan_search_ex(plan_ctx *ctx, const plan_search_opts *o, const hw_profile *hw, plan_result **out, int *n,
                         plan_search_stats *stats) {
    plan_search_stats local;
    plan_search_stats *st = stats ? stats : &local;
    memset(st, 0, sizeof *st);
    *out = NULL, *n = 0;
    double t0 = ct_now();
    if (o->gpus < 1 || o->gpus_per_node < 1)
        return ct_fail(CT_ERR_INVALID, "the search needs at least 1 GPU and 1 GPU per node (got %d and %d)", o->gpus,
                       o->gpus_per_node);
    plan_layout tmpl;
    if (plan_layout_from_manifest(ctx, o->gpus, &tmpl) != CT_OK && template_elsewhere(ctx, o->gpus, &tmpl) != CT_OK)
        return CT_ERR_INVALID;
    plan_model_sizes_get(ctx, &st->model);
    st->global_batch = global_batch(&tmpl);
    if (st->global_batch < 1)
        return ct_fail(CT_ERR_INVALID, "the manifest's global batch (%lld sequences) is not positive",
                       (long long)st->global_batch);
    searcher s;
    searcher_init(&s, ctx, o, hw, st, &tmpl, st->global_batch);
    search_count(&s);
    qsort(s.res, (size_t)s.n_res, sizeof *s.res, result_cmp);
    const plan_result *win = s.n_res && s.res[0].fits ? &s.res[0] : NULL;

    /* the largest microbatch that fits with the winner's other settings */
    if (win) {
        plan_layout l = win->layout;
        int64_t B = l.pp > 1 ? l.local_batch : st->global_batch / ((int64_t)l.dp_replicate * l.dp_shard);
        int64_t d[SEARCH_MAX_DIVISORS], cur = l.pp > 1 ? l.pp_microbatch_size : l.local_batch;
        int nd = divisors(B, d, SEARCH_MAX_DIVISORS);
        st->max_microbatch = cur;
        for (int i = 0; i < nd; i++) {
            if (d[i] <= cur) continue;
            if (l.pp == 1 && l.seq_len > 0 && d[i] > MF_MAX_MICROBATCH_TOKENS / l.seq_len) break;
            if (l.pp > 1) l.pp_microbatch_size = (int)d[i];
            else l.local_batch = d[i];
            plan_result r;
            memset(&r, 0, sizeof r);
            st->evaluated++;
            if (plan_eval(ctx, &l, hw, &r) != CT_OK) {
                st->refused++;
                break;
            }
            if (!r.fits) break;
            st->max_microbatch = d[i];
        }
    }

    /* scaling efficiency's reference: the smallest count gpus / 2^k that fits, from the static
     * memory's bound up */
    if (win && s.static_all > 0 && s.capacity > 0) {
        double need = 0.9 * s.static_all / s.capacity;
        int c = o->gpus;
        while (c % 2 == 0 && c / 2 >= need && c / 2 >= 1) c /= 2;
        for (; c < o->gpus; c *= 2) {
            double b = best_at(ctx, o, hw, st, &tmpl, st->global_batch, c);
            if (b > 0) {
                st->ref_gpus = c, st->ref_tokens_per_s_per_gpu = b;
                break;
            }
        }
    }
    if (win) { /* no smaller count fits (or the bound is unknown): this count is the reference */
        if (!st->ref_gpus) st->ref_gpus = o->gpus, st->ref_tokens_per_s_per_gpu = win->tokens_per_s_per_gpu;
        for (int i = 0; i < s.n_res; i++)
            if (s.res[i].fits) s.res[i].scaling_efficiency = s.res[i].tokens_per_s_per_gpu / st->ref_tokens_per_s_per_gpu;
    }
    if (win) cp_methods_eval(&s, win);
    rule_eval(&s, win);
    if (win) st->rule_result.scaling_efficiency = st->rule_result.fits ? st->rule_result.tokens_per_s_per_gpu / st->ref_tokens_per_s_per_gpu : 0;

    int k = o->top_k > 0 ? o->top_k : 5;
    if (k > s.n_res) k = s.n_res;
    if (win) { /* only layouts that fit; when none does, the closest ones say why */
        int nf = 0;
        while (nf < s.n_res && s.res[nf].fits) nf++;
        if (k > nf) k = nf;
    }
    if (k > 0) {
        *out = malloc(sizeof **out * (size_t)k);
        if (!*out) {
            free(s.res);
            return ct_fail(CT_ERR_NOMEM, "out of memory");
        }
        int got = 0; /* a layout reached twice (a fallback, a tuning round) is shown once */
        for (int i = 0; i < s.n_res && got < k; i++) {
            int dup = 0;
            for (int j = 0; j < got && !dup; j++) dup = same_layout(&(*out)[j].layout, &s.res[i].layout) ||
                                                       same_outcome(&(*out)[j], &s.res[i]);
            if (!dup && (s.res[i].fits || !win)) (*out)[got++] = s.res[i];
        }
        k = got;
    }
    *n = k;
    free(s.res);
    st->seconds = ct_now() - t0;
    return CT_OK;
}

ct_status plan_search(plan_ctx *ctx, const plan_search_opts *o, const hw_profile *hw, plan_result **out, int *n) {
    return plan_search_ex(ctx, o, hw, out, n, NULL);
}

/* The guide: up to 10B, FSDP alone with compile and float8; 10B to 100B, FSDP x TP with async TP
 * (its recipe: data_parallel_shard_degree 4 x tensor_parallel_degree 2 on 8 GPUs); beyond 100B, 3D
 * (FSDP x TP x PP) with the interleaved 1F1B schedule, TP within a node and PP across nodes. */
const char *plan_guide_rule(double n_params, int gpus, int gpus_per_node, plan_layout *l) {
    memset(l, 0, sizeof *l);
    l->dp_replicate = l->cp = l->tp = l->pp = 1;
    l->pp_microbatch_size = 1;
    l->ac = PLAN_AC_SELECTIVE_OP;
    l->bf16 = 1;
    snprintf(l->schedule, sizeof l->schedule, "1F1B");
    if (gpus < 1) gpus = 1;
    if (gpus_per_node < 1) gpus_per_node = 1;
    if (n_params <= 10e9) {
        l->dp_shard = gpus;
        l->compile = 1, l->quant = 1;
        return "up to 10B parameters: FSDP alone (data_parallel_shard_degree over every GPU), with compile and float8";
    }
    if (n_params <= 100e9) {
        l->tp = gpus % 2 == 0 && gpus_per_node >= 2 ? 2 : 1;
        l->dp_shard = gpus / l->tp;
        l->compile = 1;
        return "10B to 100B parameters: FSDP x TP with async TP (the guide's recipe: data_parallel_shard_degree 4 x "
               "tensor_parallel_degree 2 on 8 GPUs, FSDP over the rest when there are more)";
    }
    int tp = 8 < gpus_per_node ? 8 : gpus_per_node;
    while (tp > 1 && gpus % tp) tp /= 2;
    int pp = 8;
    while (pp > 1 && (gpus / tp) % pp) pp /= 2;
    l->tp = tp, l->pp = pp, l->dp_shard = gpus / tp / pp;
    snprintf(l->schedule, sizeof l->schedule, "Interleaved1F1B");
    return "beyond 100B parameters: 3D, FSDP x TP x PP with the Interleaved1F1B schedule (TP within a node, up to 8; "
           "PP up to 8 across nodes; FSDP over the rest)";
}
