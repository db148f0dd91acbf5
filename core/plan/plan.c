/* plan.c: the planner's context (one manifest's plugins and model) and the evaluation of a layout.
 *
 * A layout is evaluated by the same code that trains it, minus the arithmetic: the manifest's keys
 * are set to the layout, the strategies are created as planning instances on rank 0's coordinates
 * and place the parameters (runtime_plan), and one microbatch runs forward and backward through the
 * host's own tape on the planner's device (nulldev.c), under the strategies' wrapped builders. The
 * tape's arenas then hold exactly what training holds; the trace (trace.c) lists every op and
 * collective. Memory comes from the placement, the arenas, the strategies' reports and the
 * quantizer's and optimizer's plan calls; time from the ops' FLOPs and bytes at the hardware's
 * rates (or the calibrated seconds of each op at its shape), the collectives' algorithms, and the
 * schedule's own action lists simulated with the stages' costs. */
#include "plan/plan.h"
#include "plan/plan_internal.h"

#include "engine/mesh.h"
#include "engine/pipeline.h"
#include "engine/session.h"
#include "engine/quantize.h"
#include "engine/tape.h"
#include "host/host.h"
#include "base/util.h"
#include "schedule/schedule.h"
#include "tokenizer/tokenizer.h"
#include "data/shard.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PLUGINS 8

struct plan_ctx {
    session s;
    manifest *mf;
    ct_model_desc desc;
    plugin *strat[MAX_PLUGINS]; /* strategy plugins loaded so far ... */
    char *strat_name[MAX_PLUGINS]; /* ... by the name the manifest gives (a path for a third party's) */
    int n_strat;
    int quant_asked;            /* the manifest turns the dense quantizer on */
    char quant_sig[512];        /* the quantizer's knob settings s.quant was created with */
    plan_knob_table knobs;      /* the search knobs the manifest's plugins declare */
    int borrowed;               /* s.opt and s.quant are a running session's */
    double doc_len;             /* block-causal attention: the mean document length it is priced at (0: causal) */
    char doc_note[200];         /* where that length came from, for the plan's assumptions */
};

const char *const plan_mem_names[PLAN_MEM_N] = {"params", "grads", "optimizer", "master", "fsdp_buffers", "tp_buffers",
                                                "pp_buffers", "activations", "transient", "float8", "logits", "overhead"};

/* a mesh axis's name, or the flattened dp_shard x cp's (CT_AXIS_DP_SHARD_CP) */
static const char *axis_name(int axis) {
    return axis >= 0 && axis < CT_MESH_NAXES ? mesh_axis_names[axis]
           : axis == CT_AXIS_EP                ? "ep"
           : axis == CT_AXIS_EFSDP             ? "efsdp"
                                               : "dp_shard_cp";
}

/* `what` failed: its line, with the plugin's or the runtime's detail when one was left. */
static ct_status fail(const char *what) {
    return ct_fail(CT_ERR_INVALID, "%s%s%s", what, ct_last_error()[0] ? ": " : "", ct_last_error());
}

/* The data's mean document length: tokens per document of the training shard (a single file of at
 * most 2^26 tokens, read whole), its documents those a version 4 shard marks (SHARD_DOC_START, as
 * training splits them), else one per EOS (masked or not); 0 where it cannot be measured. */
static double measure_doc_len(const manifest *mf, int32_t eos) {
    const char *p;
    char path[4096];
    uint64_t n = 0, docs = 0;
    uint32_t *tokens = NULL;
    shard_info info = {0};
    if (mf_get_str(mf, "training.dataset_path", &p) || !*p) return 0;
    session_resolve_path(mf, p, path, sizeof path);
    if (shard_count(path, &n) != CT_OK || n == 0 || n > ((uint64_t)1 << 26) ||
        shard_read_info(path, &tokens, &n, &info) != CT_OK) {
        ct_clear_error();
        return 0;
    }
    if (info.version == SHARD_VERSION_DOCS)
        for (uint64_t i = 0; i < n; i++) docs += (tokens[i] & SHARD_DOC_START) != 0;
    else if (eos >= 0)
        for (uint64_t i = 0; i < n; i++)
            docs += (info.version == SHARD_VERSION_MASKED ? tokens[i] & SHARD_ID_MASK : tokens[i]) == (uint32_t)eos;
    shard_free(tokens);
    return docs ? (double)n / (double)docs : 0;
}

/* Block-causal attention (model.attn_mask_type, or one of torchtitan's *_flex_attn flavors) costs the
 * pairs within documents: priced at plan.mean_document_length, else at the training data's mean
 * document length (EOS from the run's tokenizer, or the manifest's), else as causal with a note. */
static void plan_doc_len(plan_ctx *c, const session *run) {
    const char *mask = "causal";
    mf_get_str(c->mf, "model.attn_mask_type", &mask);
    if (!(run ? run->rt.doc_eos >= 0 : c->s.flavor_doc || !strcmp(mask, "block_causal"))) return;
    double given = 0;
    mf_get_float(c->mf, "plan.mean_document_length", &given);
    if (given > 0) {
        c->doc_len = given;
        snprintf(c->doc_note, sizeof c->doc_note,
                 "block-causal attention priced at documents of %.0f tokens (plan.mean_document_length)", given);
        return;
    }
    int32_t eos = run ? run->rt.doc_eos : -1;
    const char *tok_path;
    if (eos < 0 && ((!mf_get_str(c->mf, "model.tokenizer_path", &tok_path) && *tok_path) ||
                    (!mf_get_str(c->mf, "model.hf_assets_path", &tok_path) && *tok_path))) {
        char path[4096];
        session_resolve_path(c->mf, tok_path, path, sizeof path);
        ct_tokenizer *tok = tokenizer_load(path);
        if (tok) eos = tokenizer_eos_id(tok), tokenizer_free(tok);
        ct_clear_error();
    }
    c->doc_len = measure_doc_len(c->mf, eos);
    if (c->doc_len > 0)
        snprintf(c->doc_note, sizeof c->doc_note,
                 "block-causal attention priced at the training data's mean document length, %.1f tokens", c->doc_len);
    else
        snprintf(c->doc_note, sizeof c->doc_note,
                 "block-causal attention priced as causal: the data's mean document length could not be measured "
                 "(set plan.mean_document_length)");
}

static plugin *strategy_plugin(plan_ctx *c, const char *key, const char *name);

/* The search knobs of the strategies the manifest lists for the mesh axes and of the dense quantizer
 * (loaded here, not created, when the manifest does not turn it on: the search may). A plugin that
 * does not load declares none here (its layouts fail where they would in a run). */
static void plan_knobs_collect(plan_ctx *c) {
    c->quant_asked = c->s.quantp != NULL;
    c->quant_sig[0] = 0;
    strategy_list list; /* the mesh axes' strategies (the data-parallel one declares no knob here) */
    if (strategy_list_read(&c->s.cfg, c->mf, 1, 0, &list) == CT_OK)
        for (int k = 0; k < list.n; k++) {
            strategy_item *it = &list.item[k];
            plugin *p = strategy_plugin(c, it->key, it->name);
            if (p && strategy_resolve(c->mf, it, p->info.api, p->info.name) == CT_OK && it->serves == CT_SERVES_AXIS)
                plan_knobs_add(&c->knobs, p, "parallelism", it->axis, 0, NULL);
        }
    char enable_key[200];
    if (session_load_quantizer(&c->s, enable_key, sizeof enable_key) == CT_OK)
        plan_knobs_add(&c->knobs, c->s.quantp, c->s.quant_section, -1, 1, enable_key);
    for (int i = 0; i < c->knobs.n; i++) c->knobs.vp[i] = c->knobs.values[i];
    ct_clear_error();
}

int plan_knobs(const plan_ctx *c, const plan_setting **knobs, const char *const **values) {
    if (knobs) *knobs = c->knobs.k;
    if (values) *values = c->knobs.vp;
    return c->knobs.n;
}

/* run: a running session whose optimizer and quantizer the plan borrows instead of creating its
 * own (a plugin may keep its host table in a global that a second instance would overwrite). */
static ct_status open_ctx(plan_ctx **out, manifest *mf, const session *run) {
    plan_ctx *c = calloc(1, sizeof *c);
    if (!c) return ct_fail(CT_ERR_NOMEM, "out of memory");
    c->mf = mf;
    int own = session_open_plan(&c->s, mf, !run);
    if (own == CT_OK && run) {
        c->borrowed = 1;
        c->s.opt = run->opt;
        c->s.n_state = run->n_state;
        if (run->quant && c->s.quantp) c->s.qapi = c->s.quantp->info.api, c->s.quant = run->quant;
    }
    if (own != CT_OK) {
        c->s.mf = NULL; /* the caller's */
        session_close(&c->s);
        free(c);
        return ct_fail(own, "the manifest cannot be planned (see above)");
    }
    c->desc.struct_size = sizeof c->desc;
    ct_clear_error();
    if (c->s.m->describe(c->s.model, &c->desc) != CT_OK) {
        ct_status st = fail("model describe failed");
        plan_close(c);
        return st;
    }
    plan_knobs_collect(c);
    plan_doc_len(c, run);
    *out = c;
    return CT_OK;
}

ct_status plan_open(plan_ctx **out, manifest *mf) { return open_ctx(out, mf, NULL); }

void plan_close(plan_ctx *c) {
    if (!c) return;
    if (c->borrowed) c->s.opt = NULL, c->s.quant = NULL; /* the run's */
    for (int i = 0; i < c->n_strat; i++) plugin_unload(c->strat[i]), free(c->strat_name[i]);
    c->s.mf = NULL; /* the caller's manifest */
    session_close(&c->s);
    free(c);
}

const ct_model_desc *plan_model(const plan_ctx *c) { return &c->desc; }
manifest *plan_manifest(const plan_ctx *c) { return c->mf; }

void plan_trace_free(plan_trace *t) {
    free(t->ops);
    free(t->units);
    memset(t, 0, sizeof *t);
}

/* ---- layouts <-> manifest keys ---- */

static int64_t get_int(const manifest *mf, const char *key, int64_t dflt) {
    int64_t v;
    return mf_get_int(mf, key, &v) ? dflt : v;
}

ct_status plan_layout_from_manifest(plan_ctx *c, int gpus, plan_layout *l) {
    const manifest *mf = c->mf;
    memset(l, 0, sizeof *l);
    l->dp_replicate = (int)get_int(mf, mesh_degree_keys[CT_AXIS_DP_REPLICATE], 1);
    int64_t shard = get_int(mf, mesh_degree_keys[CT_AXIS_DP_SHARD], -1);
    l->cp = (int)get_int(mf, mesh_degree_keys[CT_AXIS_CP], 1);
    l->tp = (int)get_int(mf, mesh_degree_keys[CT_AXIS_TP], 1);
    l->pp = (int)get_int(mf, mesh_degree_keys[CT_AXIS_PP], 1);
    int64_t ep = get_int(mf, MESH_EP_DEGREE_KEY, 1);
    int64_t others = (int64_t)l->dp_replicate * l->cp * l->tp * l->pp;
    if (others < 1 || l->dp_replicate < 1 || l->cp < 1 || l->tp < 1 || l->pp < 1)
        return ct_fail(CT_ERR_INVALID, "parallelism degrees must be positive");
    if (shard == -1) {
        if (gpus % others)
            return ct_fail(CT_ERR_INVALID, "%d GPUs cannot be shared by dp_replicate %d x cp %d x tp %d x pp %d", gpus,
                           l->dp_replicate, l->cp, l->tp, l->pp);
        shard = gpus / others;
    }
    l->dp_shard = (int)shard;
    if (shard < 1 || others * shard != gpus)
        return ct_fail(CT_ERR_INVALID, "the layout dp_replicate %d x dp_shard %lld x cp %d x tp %d x pp %d is %lld "
                       "GPUs, not %d", l->dp_replicate, (long long)shard, l->cp, l->tp, l->pp,
                       (long long)(others * shard), gpus);
    if (ep < 1 || (shard * l->cp) % ep)
        return ct_fail(CT_ERR_INVALID, "parallelism.expert_parallel_degree %lld: expert parallel borrows its ranks from "
                       "dp_shard x cp (%lld x %d), which it does not divide", (long long)ep, (long long)shard, l->cp);
    l->ep = (int)ep;
    const char *v = "1F1B";
    mf_get_str(mf, "parallelism.pipeline_parallel_schedule", &v);
    snprintf(l->schedule, sizeof l->schedule, "%s", v);
    l->pp_microbatch_size = (int)get_int(mf, "parallelism.pipeline_parallel_microbatch_size", 1);
    l->local_batch = get_int(mf, "training.local_batch_size", 1);
    l->global_batch = get_int(mf, "training.global_batch_size", -1);
    l->seq_len = get_int(mf, "training.seq_len", 2048);
    const char *mode = "none", *opt = "op";
    mf_get_str(mf, "activation_checkpoint.mode", &mode);
    mf_get_str(mf, "activation_checkpoint.selective_ac_option", &opt);
    l->ac = !strcmp(mode, "full") ? PLAN_AC_FULL
            : !strcmp(mode, "selective") ? (strcmp(opt, "op") ? PLAN_AC_SELECTIVE_LAYER : PLAN_AC_SELECTIVE_OP)
                                         : PLAN_AC_NONE;
    l->ac_every = l->ac == PLAN_AC_SELECTIVE_LAYER ? (int)atoi(opt) : 0;
    l->quant = c->quant_asked;
    const char *qn = "";
    mf_get_str(mf, "quantize.dense.name", &qn);
    snprintf(l->quant_name, sizeof l->quant_name, "%s", qn);
    int on = 0;
    mf_get_bool(mf, "compile.enable", &on);
    l->compile = on;
    const char *mp = "float32";
    mf_get_str(mf, "training.mixed_precision_param", &mp);
    l->bf16 = !strcmp(mp, "bfloat16");
    l->offload = (int)get_int(mf, "activation_offload.layers", 0);
    /* the knobs as the manifest sets them ("" where it leaves one unset: its plugin's own reading
     * stands); the quantizer's switch as the manifest turns it on, torchtitan's spellings included */
    l->n_knobs = c->knobs.n;
    for (int i = 0; i < c->knobs.n; i++) {
        plan_setting *k = &l->knob[i];
        *k = c->knobs.k[i];
        const char *v = "";
        if (!mf_get_bool(mf, k->key, &on)) v = on ? "true" : "false";
        else mf_get_str(mf, k->key, &v);
        if (k->enables) v = l->quant ? "true" : "false";
        snprintf(k->value, sizeof k->value, "%s", v);
    }
    return CT_OK;
}

/* Sets one key; *st keeps the first failure (every key is set whatever failed before). */
static void set_key(plan_ctx *c, ct_status *st, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_key(plan_ctx *c, ct_status *st, const char *key, const char *fmt, ...) {
    char value[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    ct_status one = manifest_override(c->mf, key, value);
    if (*st == CT_OK) *st = one;
}

/* The manifest's keys set to the layout, so the plugins the plan creates read it like a run would.
 * CT_OK, or manifest_override's status. */
static ct_status apply_layout(plan_ctx *c, const plan_layout *l) {
    ct_status st = CT_OK;
    set_key(c, &st, mesh_degree_keys[CT_AXIS_DP_REPLICATE], "%d", l->dp_replicate);
    set_key(c, &st, mesh_degree_keys[CT_AXIS_DP_SHARD], "%d", l->dp_shard);
    set_key(c, &st, mesh_degree_keys[CT_AXIS_CP], "%d", l->cp);
    set_key(c, &st, mesh_degree_keys[CT_AXIS_TP], "%d", l->tp);
    set_key(c, &st, mesh_degree_keys[CT_AXIS_PP], "%d", l->pp);
    set_key(c, &st, "parallelism.pipeline_parallel_microbatch_size", "%d", l->pp_microbatch_size);
    set_key(c, &st, "training.local_batch_size", "%lld", (long long)l->local_batch);
    set_key(c, &st, "training.mixed_precision_param", "%s", l->bf16 ? "bfloat16" : "float32");
    set_key(c, &st, "compile.enable", "%s", l->compile ? "true" : "false");
    if (l->schedule[0]) set_key(c, &st, "parallelism.pipeline_parallel_schedule", "%s", l->schedule);
    if (l->global_batch > 0) set_key(c, &st, "training.global_batch_size", "%lld", (long long)l->global_batch);
    static const char *modes[] = {"none", "selective", "selective", "full"};
    set_key(c, &st, "activation_checkpoint.mode", "%s", modes[l->ac & 3]);
    if (l->ac == PLAN_AC_SELECTIVE_OP) set_key(c, &st, "activation_checkpoint.selective_ac_option", "op");
    if (l->ac == PLAN_AC_SELECTIVE_LAYER)
        set_key(c, &st, "activation_checkpoint.selective_ac_option", "%d", l->ac_every > 0 ? l->ac_every : 2);
    set_key(c, &st, "activation_offload.layers", "%d", l->offload);
    for (int i = 0; i < l->n_knobs; i++) /* the plugins' knobs; "" leaves the manifest's */
        if (l->knob[i].value[0]) set_key(c, &st, l->knob[i].key, "%s", l->knob[i].value);
    set_key(c, &st, MESH_EP_DEGREE_KEY, "%d", l->ep > 1 ? l->ep : 1);
    engine_settings_read(c->mf, &c->s.cfg); /* the session's keys are the layout's now (and none points at a
                                             * value the overrides freed) */
    return st;
}

/* ---- one layout on rank 0's coordinates: placement and the trace of a microbatch ---- */

typedef struct plan_run {
    ct_mesh_info mesh;
    const ct_strategy_api *api[SESSION_MAX_STRATEGIES];
    ct_strategy *inst[SESSION_MAX_STRATEGIES];
    const char *names[SESSION_MAX_STRATEGIES];
    plugin *plug[SESSION_MAX_STRATEGIES];
    int op_level[SESSION_MAX_STRATEGIES]; /* an axis strategy (tp, cp): its buffers are op-level ones */
    int axis[SESSION_MAX_STRATEGIES];     /* its mesh axis (engine/strategies.h), -1: the data-parallel one */
    int n;
    runtime rt;
    int rt_ready;
    pipeline pl;
    int pl_ready;
    plan_trace_state ts;
    ct_strategy_env env;
    char note[512];
} plan_run;

static plugin *strategy_plugin(plan_ctx *c, const char *key, const char *name) {
    for (int i = 0; i < c->n_strat; i++)
        if (!strcmp(c->strat_name[i], name)) return c->strat[i];
    if (c->n_strat == MAX_PLUGINS) return NULL;
    plugin *p = NULL;
    char *copy = strdup(name);
    if (!copy || session_load_plugin(&c->s, "parallelism", key, name, CT_KIND_STRATEGY, &p) != CT_OK) {
        free(copy);
        return NULL;
    }
    c->strat_name[c->n_strat] = copy;
    return c->strat[c->n_strat++] = p;
}

static void run_free(plan_run *r) {
    if (r->rt_ready) runtime_free(&r->rt);
    for (int k = 0; k < r->n; k++)
        if (r->inst[k]) r->api[k]->destroy(r->inst[k]);
    if (r->pl_ready) pipeline_free(&r->pl);
    memset(r, 0, sizeof *r);
}

static void note_add(char *note, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note_add(char *note, size_t len, const char *fmt, ...) {
    size_t at = strlen(note);
    if (at && at + 2 < len) at += (size_t)snprintf(note + at, len - at, "; ");
    va_list ap;
    va_start(ap, fmt);
    if (at < len) vsnprintf(note + at, len - at, fmt, ap);
    va_end(ap);
}

/* The mesh, the planning strategies, the placement and (pp > 1) the pipeline's split and actions. */
static ct_status ensure_quant(plan_ctx *c, const plan_layout *l);

static ct_status run_open(plan_ctx *c, const plan_layout *l, plan_run *r) {
    memset(r, 0, sizeof *r);
    r->mesh.struct_size = sizeof r->mesh;
    int deg[CT_MESH_NAXES] = {l->pp, l->dp_replicate, l->dp_shard, l->cp, l->tp};
    r->mesh.world_size = 1;
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        r->mesh.degree[a] = deg[a];
        r->mesh.world_size *= deg[a];
    }
    r->mesh.world_rank = -1; /* nobody's: the pipeline's plan prints nothing */
    r->mesh.dp_size = l->dp_replicate * l->dp_shard;
    r->mesh.dp_shard_cp_size = l->dp_shard * l->cp;
    r->mesh.ep_size = l->ep > 1 ? l->ep : 1; /* rank 0: ep_rank and efsdp_rank 0 */
    r->mesh.efsdp_size = r->mesh.dp_shard_cp_size / r->mesh.ep_size;
    if (apply_layout(c, l) != CT_OK) return ct_fail(CT_ERR_INVALID, "the layout's keys cannot be set");
    const ct_tp_rule *tp_plan = NULL;
    if (CT_HAS_FIELD(c->s.m, ct_model_api, get_tp_plan) && c->s.m->get_tp_plan) tp_plan = c->s.m->get_tp_plan(c->s.model);
    else if (CT_HAS_FIELD(c->s.m, ct_model_api, tp_plan)) tp_plan = c->s.m->tp_plan;
    if (l->pp > 1) { /* first: the strategies learn whether its schedule splits backward */
        if (pipeline_plan(&r->pl, &c->s.cfg.pp, c->mf, &c->desc, &r->mesh, NULL, NULL) != CT_OK) {
            r->pl_ready = 1;
            return ct_fail(CT_ERR_INVALID, "the pipeline cannot be split so (see above)");
        }
        r->pl_ready = 1;
    }
    ct_strategy_env env = {sizeof env, NULL, NULL, NULL, NULL, &r->mesh, l->bf16, 0, tp_plan, &c->desc,
                           l->seq_len, l->quant, 1, l->pp > 1 && pipeline_splits_backward(&r->pl)};
    if (l->quant && ensure_quant(c, l) != CT_OK) return CT_ERR_INVALID;
    env.fp8_all_gather = l->quant && session_quant_gathers(c->s.qapi, c->s.quant);
    r->env = env;
    runtime_dist dist = {NULL, NULL, &r->mesh, {0}, {0}, 0, NULL, {0}};
    strategy_list list; /* as a run makes them (engine/strategies.h) */
    plugin *loaded[SESSION_MAX_STRATEGIES];
    if (strategy_list_read(&c->s.cfg, c->mf, r->mesh.world_size, 1, &list) != CT_OK) return CT_ERR_INVALID;
    for (int k = 0; k < list.n; k++) {
        strategy_item *it = &list.item[k];
        plugin *p = loaded[k] = strategy_plugin(c, it->key, it->name);
        if (!p) return ct_fail(CT_ERR_INVALID, "strategy %s cannot be loaded", it->name);
        if (strategy_resolve(c->mf, it, p->info.api, p->info.name) != CT_OK) return CT_ERR_INVALID;
    }
    if (strategy_list_check(c->mf, &list) != CT_OK || strategy_list_cover(c->mf, &list, &r->mesh) != CT_OK)
        return CT_ERR_INVALID;
    for (int k = 0; k < list.n; k++) {
        const strategy_item *it = &list.item[k];
        if (!strategy_on_mesh(it, &r->mesh)) continue;
        plugin *p = loaded[k];
        const char *name = it->name;
        const ct_strategy_api *a = p->info.api;
        if (!CT_HAS_FIELD(a, ct_strategy_api, report) || !a->report) { /* it never promised to plan */
            note_add(r->note, sizeof r->note,
                     "strategy %s reports no costs (its API has no report): planned without it, its parameters "
                     "whole on every rank and none of its buffers or collectives", p->info.name);
            continue;
        }
        ct_strategy *inst = NULL;
        ct_clear_error();
        if (a->create(&p->host, &env, &inst) != CT_OK) return fail(name);
        r->api[r->n] = a;
        r->inst[r->n] = inst;
        r->names[r->n] = p->info.name;
        r->op_level[r->n] = it->serves == CT_SERVES_AXIS;
        r->axis[r->n] = it->axis;
        r->plug[r->n++] = p;
        dist.axis[dist.n_st] = it->axis;
        dist.st[dist.n_st] = a;
        dist.strat[dist.n_st++] = inst;
    }
    ct_status rst = runtime_plan(&r->rt, &plan_null_device, plan_null_handle(), c->s.m, c->s.model, &dist);
    r->rt_ready = 1;
    if (rst != CT_OK || runtime_plan_start(&r->rt, &plan_observer) != CT_OK) return CT_ERR_INVALID;
    return CT_OK;
}

/* The dense quantizer with the layout's settings of its knobs, created without a device (loaded at
 * open, also where the manifest does not turn it on and the search does). */
static ct_status ensure_quant(plan_ctx *c, const plan_layout *l) {
    if (!c->s.quantp) return ct_fail(CT_ERR_INVALID, "the dense quantizer (quantize.dense.name) cannot be loaded");
    c->s.qapi = c->s.quantp->info.api;
    char sig[sizeof c->quant_sig];
    plan_knobs_quant_signature(l, sig, sizeof sig);
    if (c->s.quant && (c->borrowed || !strcmp(c->quant_sig, sig))) return CT_OK;
    if (c->borrowed) return CT_OK; /* the run has none: planned without (the trace says so) */
    if (c->s.quant) c->s.qapi->destroy(c->s.quant);
    c->s.quant = NULL;
    ct_clear_error();
    if (c->s.qapi->create(&c->s.quantp->host, NULL, NULL, &c->s.quant) != CT_OK) c->s.quant = NULL;
    snprintf(c->quant_sig, sizeof c->quant_sig, "%s", sig);
    return CT_OK;
}

/* One microbatch forward and backward through the tape, every op and collective noted. */
/* A microbatch's forward and backward, costs not noted, so that liveness.c learns each fully
 * checkpointed unit's forward as the runtime's first step does: the pass the plan measures then runs
 * as every later step. Nothing to learn without full checkpointing (or where no unit's backward
 * gives memory back). */
static ct_status learn_liveness(runtime *rt, int64_t B, int64_t T) {
    int nu = rt->desc.n_units, full = 0;
    for (int u = 0; u < nu; u++) full |= rt->ac[u] == RT_AC_FULL;
    if (!full || !rt->pack_units) return CT_OK;
    int keep = rt->trace_ops;
    rt->trace_ops = 0;
    rt_tensor *tok = runtime_upload_ids(rt, NULL, B, T), *tgt = tok ? runtime_upload_ids(rt, NULL, B, T) : NULL;
    rt_tensor *x = NULL;
    ct_status st = !tgt || !tape_new_activation(rt, CT_F32, 0, NULL) || !tape_new_activation(rt, CT_F32, 0, NULL)
                       ? CT_ERR_NOMEM
                       : CT_OK;
    for (int u = 0; u < nu && st == CT_OK; u++) st = runtime_unit_fwd(rt, u, x, tok, tgt, 1, &x);
    if (st == CT_OK && !tape_grad(rt, x)) st = CT_ERR_NOMEM;
    for (int u = nu - 1; u >= 0 && st == CT_OK; u--) st = runtime_unit_bwd(rt, u, tok, tgt, TAPE_BOTH);
    rt->trace_ops = keep;
    ct_status reset = runtime_reset_arenas(rt);
    if (st == CT_OK) st = reset;
    rt->act = &rt->saved;
    return st;
}

static ct_status run_trace(plan_ctx *c, const plan_layout *l, plan_run *r, plan_trace *t) {
    runtime *rt = &r->rt;
    memset(t, 0, sizeof *t);
    int nu = rt->desc.n_units;
    t->n_units = nu;
    t->units = calloc((size_t)nu, sizeof *t->units);
    if (!t->units) return ct_fail(CT_ERR_NOMEM, "out of memory");
    r->ts.matmul_dtype = l->bf16 ? PLAN_BF16 : PLAN_F32;
    t->state = &r->ts;
    rt->trace = t;
    rt->attn_doc_len = c->doc_len;
    if (c->doc_note[0]) note_add(r->ts.assumptions, sizeof r->ts.assumptions, "%s", c->doc_note);
    ct_status st = l->quant ? ensure_quant(c, l) : CT_OK;
    if (st != CT_OK) return st;
    if (l->quant && c->s.qapi) {
        if (!c->s.quant) note_add(r->ts.assumptions, sizeof r->ts.assumptions,
                                  "the quantizer cannot be created without a device: float8 planned as its GEMMs at "
                                  "the fp8 rate with no memory of its own");
        rt->qapi = c->s.quant ? c->s.qapi : NULL;
        rt->quant = c->s.quant;
        if (rt->qapi) quantize_decide_linears(rt); /* as the session does at start-up */
    }
    if (runtime_wrap_builder(rt) != CT_OK) return CT_ERR_INVALID;
    const char *mode = "none", *opt = "op";
    mf_get_str(c->mf, "activation_checkpoint.mode", &mode);
    mf_get_str(c->mf, "activation_checkpoint.selective_ac_option", &opt);
    if (runtime_set_ac(rt, mode, opt) != CT_OK) return CT_ERR_INVALID;
    if (l->offload && l->pp > 1)
        return ct_fail(CT_ERR_INVALID, "activation_offload.layers: not with pipeline parallel yet");
    ct_clear_error();
    if (runtime_offload_set(rt, l->offload) != CT_OK)
        return ct_fail(CT_ERR_INVALID, "activation_offload.layers: %s", ct_last_error());
    int64_t B = l->pp > 1 ? l->pp_microbatch_size : l->local_batch, T = l->seq_len;
    t->tokens = B * T;
    if (runtime_reset_arenas(rt) != CT_OK) return fail("arenas");
    rt->in_order = l->pp <= 1; /* as the runtime: a pipeline's contexts keep their boundary gradients */
    rt->bf16_compute = l->bf16;   /* as the runtime: saved activations held in bf16 ... */
    rt->pack_units = 1;           /* ... unless a pipeline schedule splits backward */
    for (int pr = 0; l->pp > 1 && pr < l->pp; pr++)
        for (int q = 0; q < r->pl.plan.ranks[pr].n; q++)
            if (r->pl.plan.ranks[pr].actions[q].op == CT_PP_I || r->pl.plan.ranks[pr].actions[q].op == CT_PP_W)
                rt->pack_units = 0;
    /* as the pipeline: only a stage's input gradient stays with its microbatch */
    rt->bgrad_keep = l->pp > 1 && rt->pack_units ? r->pl.stage_head : NULL;
    rt->act = &rt->saved;
    if (learn_liveness(rt, B, T) != CT_OK) return fail("a first pass to learn the checkpointed units' forwards");
    rt_tensor *tok = runtime_upload_ids(rt, NULL, B, T), *tgt = tok ? runtime_upload_ids(rt, NULL, B, T) : NULL;
    rt_tensor *scale = tgt ? tape_new_activation(rt, CT_F32, 0, NULL) : NULL;
    rt_tensor *loss = scale ? tape_new_activation(rt, CT_F32, 0, NULL) : NULL; /* copied out before backward */
    if (!loss) return fail("the microbatch's ids");
    t->io_bytes = (double)rt->saved.data.used;
    rt->peak_act_bytes = 0;
    rt_tensor *x = NULL;
    ct_clear_error();
    rt->trace_ops = 1;
    for (int u = 0; u < nu; u++) {
        double before = (double)(rt->saved.data.used + rt->grads.data.used + runtime_offload_slots_used(rt));
        rt->peak_act_bytes = 0;
        rt->scratch.data.peak_used = rt->scratch.data.used;
        t->units[u].in_grad_bytes = x ? (double)(((size_t)ct_tensor_numel(&(x->base ? x->base : x)->t) * sizeof(float) + 63) & ~(size_t)63) : 0;
        if (runtime_unit_fwd(rt, u, x, tok, tgt, 1, &x) != CT_OK) {
            rt->trace_ops = 0;
            return fail(t->cannot[0] ? "the trace stopped" : "a unit's forward failed in the plan");
        }
        t->units[u].saved_bytes = (double)rt->saved.data.used + (double)rt->grads.data.used +
                                  (double)runtime_offload_slots_used(rt) - before;
        t->units[u].fwd_peak = fmax(0.0, (double)rt->peak_act_bytes - before);
        t->units[u].scratch_peak = (double)(rt->scratch.data.peak_used - rt->scratch.data.used);
        t->units[u].out_bytes = (double)ct_tensor_numel(&x->t) * (double)ct_dtype_size(x->t.dtype);
    }
    t->live_peak = (double)(rt->saved.data.used + rt->scratch.data.used + rt->grads.data.used +
                            runtime_offload_slots_used(rt));
    for (int u = 0; rt->offload.unit && u < nu; u++) { /* what offload moved, before backward takes it back */
        t->units[u].offload_bytes = (double)rt->offload.unit[u].bytes;
        t->units[u].offload_copied = rt->offload.unit[u].on_host;
    }
    if (!tape_grad(rt, x)) return fail("the loss's gradient");
    rt->trace_ops = 2;
    for (int u = nu - 1; u >= 0; u--) {
        double live = (double)(rt->saved.data.used + rt->scratch.data.used + rt->grads.data.used +
                               rt->bgrads[0].used + rt->bgrads[1].used + runtime_offload_slots_used(rt));
        double g0 = (double)rt->grads.data.used, s0 = (double)rt->scratch.data.used;
        rt->peak_act_bytes = 0;
        rt->grads.data.peak_used = rt->grads.data.used;
        rt->scratch.data.peak_used = rt->scratch.data.used;
        double z0 = plan_null_zeroed;
        if (runtime_unit_bwd(rt, u, tok, tgt, TAPE_BOTH) != CT_OK) {
            rt->trace_ops = 0;
            return fail("a unit's backward failed in the plan");
        }
        t->units[u].bwd_peak = fmax(0.0, (double)rt->peak_act_bytes - live);
        t->units[u].boundary_grad_bytes = (double)rt->grads.data.used - g0;
        t->units[u].grads_peak = (double)rt->grads.data.peak_used - g0;
        t->units[u].zeroed_bytes = plan_null_zeroed - z0;
        t->units[u].scratch_peak = fmax(t->units[u].scratch_peak, (double)rt->scratch.data.peak_used - s0);
        if ((double)rt->peak_act_bytes > t->live_peak) t->live_peak = (double)rt->peak_act_bytes;
    }
    rt->trace_ops = 0;
    t->arena_bytes = (double)(pool_steady_bytes(&rt->saved.data) + pool_steady_bytes(&rt->scratch.data) +
                              pool_steady_bytes(&rt->grads.data) + pool_steady_bytes(&rt->bgrads[0]) +
                              pool_steady_bytes(&rt->bgrads[1]) + pool_steady_bytes(&rt->offload.slot[0]) +
                              pool_steady_bytes(&rt->offload.slot[1]));
    t->host_bytes = rt->offload.host_bytes;
    t->desc_bytes = (double)(rt->saved.desc.cap_total + rt->scratch.desc.cap_total + rt->grads.desc.cap_total);
    t->opscratch_bytes = (double)pool_steady_bytes(&rt->opscratch); /* its one chunk from the third step on */
    rt->trace = NULL;
    t->state = NULL;
    if (r->ts.assumptions[0]) note_add(r->note, sizeof r->note, "%s", r->ts.assumptions);
    return CT_OK;
}

ct_status plan_trace_layout(plan_ctx *c, const plan_layout *l, plan_trace *t) {
    mem_stats keep = g_mem; /* the plan's arenas are address space, not this process's memory */
    int tracing = trace_set_on(0), ledger = memledger_pause(1);
    plan_run r;
    ct_status st = run_open(c, l, &r);
    if (st == CT_OK) st = run_trace(c, l, &r, t);
    run_free(&r);
    g_mem = keep;
    trace_set_on(tracing);
    memledger_pause(ledger);
    if (st != CT_OK) plan_trace_free(t);
    return st;
}

/* ---- time ---- */

/* Seconds of a custom op's attention FLOPs (ct_op_cost.attention_flops) at the attention rate. */
static double attn_seconds(const hw_profile *hw, const plan_op *o, int bw) {
    if (o->kind != RT_OP_CUSTOM || o->attn_flops[bw] <= 0) return 0;
    double rate = hw->peak_flops[o->dtype] > 0 ? hw->peak_flops[o->dtype] : hw->peak_flops[PLAN_BF16];
    rate *= hw->matmul_eff * hw->attn_eff;
    return rate > 0 ? o->attn_flops[bw] / rate : 0;
}

/* Seconds of one op, forward (bw 0) or backward (bw 1): measured at its shape, or from the rates. */
static double op_seconds(const hw_profile *hw, const plan_op *o, int bw) {
    double m = hw_measured_op(hw, o->kind, o->shape, o->dtype, bw);
    if (m >= 0) return m;
    double t = 0;
    if (o->flops[bw] > 0) {
        double rate = hw->peak_flops[o->dtype] > 0 ? hw->peak_flops[o->dtype] : hw->peak_flops[PLAN_BF16];
        rate *= hw->matmul_eff * (o->kind == RT_OP_ATTENTION ? hw->attn_eff : 1.0);
        /* a GEMM the profile did not time at its shape (a custom op's chunks): the rate its timed GEMMs
         * of that dtype reached together, rather than a large square GEMM's */
        double f = 0, sec = 0;
        for (int i = 0; (o->kind == RT_OP_GEMM || o->kind == RT_OP_CUSTOM) && i < hw->n_ops; i++) {
            const plan_measured_op *m = &hw->ops[i];
            if (m->kind != RT_OP_GEMM || m->dtype != o->dtype) continue;
            f += 6.0 * (double)m->shape[0] * (double)m->shape[1] * (double)m->shape[2];
            sec += m->seconds[0] + m->seconds[1];
        }
        if (f > 0 && sec > 0) rate = f / sec;
        if (rate > 0) t += o->flops[bw] / rate;
    }
    if (o->bytes[bw] > 0 && hw->mem_bw > 0) t += o->bytes[bw] / (hw->mem_bw * hw->mem_eff);
    return t + attn_seconds(hw, o, bw);
}

/* Whether a group over `axis` spans nodes: torchtitan's mesh order, tp innermost. */
static int axis_inter_node(const plan_layout *l, const hw_profile *hw, int axis, int gpus_per_node) {
    int deg[CT_MESH_NAXES] = {l->pp, l->dp_replicate, l->dp_shard, l->cp, l->tp};
    int64_t stride = 1;
    (void)hw;
    /* dp_shard and cp are adjacent: one run of dp_shard x cp x tp ranks; efsdp strides through all of it */
    if (axis == CT_AXIS_DP_SHARD_CP || axis == CT_AXIS_EFSDP) return (int64_t)l->tp * l->cp * l->dp_shard > gpus_per_node;
    if (axis == CT_AXIS_EP) /* ep consecutive ranks of dp_shard x cp: a run of ep x tp ranks */
        return (int64_t)l->tp * (l->ep > 1 ? l->ep : 1) > gpus_per_node;
    for (int a = CT_MESH_NAXES - 1; a > axis; a--) stride *= deg[a];
    (void)hw;
    return stride * deg[axis] > gpus_per_node;
}

/* A collective's seconds: measured at its size and group, or the ring algorithm's time (an all-to-all's
 * pairwise exchange moves the same (n-1)/n of one rank's buffer in as many steps). */
static double comm_seconds(const hw_profile *hw, int kind, int ranks, double bytes, int inter) {
    if (ranks <= 1 || bytes <= 0) return 0;
    double m = inter ? -1 : hw_measured_comm(hw, kind, ranks, bytes);
    if (m >= 0) return m;
    double bw = inter ? hw->inter_bw : hw->intra_bw, lat = inter ? hw->inter_lat : hw->intra_lat;
    if (bw <= 0) return 0;
    double n = ranks, one = (n - 1) * lat + (n - 1) / n * bytes / bw;
    return kind == CT_COLL_ALL_REDUCE ? 2 * one : one;
}

/* The ranks of a group over `axis` that share one node (the group spans nodes): tp innermost, so
 * ep's run of ep x tp ranks has gpus_per_node / tp of its ranks on each node. */
static int axis_node_ranks(const plan_layout *l, int axis, int gpus_per_node) {
    int deg[CT_MESH_NAXES] = {l->pp, l->dp_replicate, l->dp_shard, l->cp, l->tp};
    int64_t stride = 1, n;
    if (axis == CT_AXIS_EP) {
        stride = l->tp;
        n = l->ep > 1 ? l->ep : 1;
    } else if (axis >= 0 && axis < CT_MESH_NAXES) {
        for (int a = CT_MESH_NAXES - 1; a > axis; a--) stride *= deg[a];
        n = deg[axis];
    } else {
        return 1;
    }
    int64_t g = stride > 0 ? gpus_per_node / stride : 1;
    return (int)(g < 1 ? 1 : g > n ? n : g);
}

/* An all-to-all over a group that spans nodes, `local` of its `ranks` on each node: each rank's
 * pairwise exchange sends (ranks - local)/ranks of its buffer off the node through its own NIC and
 * (local - 1)/ranks over the node's links at the same time; the slower side is the time. */
static double a2a_inter_seconds(const hw_profile *hw, int ranks, int local, double bytes) {
    if (ranks <= 1 || bytes <= 0 || hw->inter_bw <= 0) return 0;
    double n = ranks, off = (n - local) / n * bytes / hw->inter_bw;
    double on = local > 1 && hw->intra_bw > 0 ? (local - 1) / n * bytes / hw->intra_bw : 0;
    return (n - 1) * hw->inter_lat + fmax(off, on);
}

/* A collective over `axis` of the layout: an all-to-all across nodes as above, else comm_seconds. */
static double axis_comm_seconds(const hw_profile *hw, const plan_layout *l, int gpn, int axis, int kind, int ranks,
                                double bytes) {
    int inter = axis_inter_node(l, hw, axis, gpn);
    if (inter && kind == CT_COLL_ALL_TO_ALL) return a2a_inter_seconds(hw, ranks, axis_node_ranks(l, axis, gpn), bytes);
    return comm_seconds(hw, kind, ranks, bytes, inter);
}

static plan_comm_line *comm_line(plan_result *res, const char *what, int axis, int kind, int inter) {
    for (int i = 0; i < res->n_comms; i++)
        if (!strcmp(res->comms[i].what, what)) return &res->comms[i];
    if (res->n_comms == (int)(sizeof res->comms / sizeof res->comms[0])) return NULL;
    plan_comm_line *cl = &res->comms[res->n_comms++];
    memset(cl, 0, sizeof *cl);
    snprintf(cl->what, sizeof cl->what, "%s", what);
    cl->axis = axis;
    cl->kind = kind;
    cl->inter_node = inter;
    return cl;
}

static const char *kind_name(int kind) {
    return kind == CT_COLL_ALL_GATHER       ? "all_gather"
           : kind == CT_COLL_REDUCE_SCATTER ? "reduce_scatter"
           : kind == CT_COLL_ALL_REDUCE     ? "all_reduce"
           : kind == CT_COLL_ALL_TO_ALL     ? "all_to_all"
                                            : "collective";
}

/* Per unit: forward, backward (input half, weight half), recompute, and the tp collectives. */
typedef struct unit_time {
    double f, bi, bw, re;         /* compute seconds */
    double gemm, attn, membound;  /* the same split by kind, forward + backward + recompute */
    double comm_exposed, comm_hidden;
} unit_time;

/* Activation offload's copies over one microbatch, simulated as the runtime orders them
 * (core/engine/offload.c): one copy queue beside the compute. In forward unit u's copy out is
 * queued when u has packed, and the unit that takes u's slot next (two offloaded units on) waits for
 * it when it packs; in backward the copy in of unit u-2 is queued when unit u has unpacked, and unit
 * u-1 waits for it before it unpacks. Returns the seconds the compute waits; *copy_s the queue's busy
 * time. */
static double offload_wait(const plan_trace *t, const unit_time *ut, int nu, double host_bw, double *copy_s) {
    double now = 0, queue = 0, waited = 0, *done = calloc((size_t)nu, sizeof *done);
    if (!done) return 0;
    *copy_s = 0;
    int last = -1, prev = -1; /* the last two offloaded units, in forward order */
    for (int u = 0; u < nu; u++) {
        now += ut[u].f;
        double b = t->units[u].offload_bytes;
        if (b <= 0) continue;
        if (prev >= 0 && t->units[prev].offload_copied && done[prev] > now) { /* u takes prev's slot */
            waited += done[prev] - now;
            now = done[prev];
        }
        prev = last;
        last = u;
        if (!t->units[u].offload_copied) continue;
        double c = b / host_bw, start = fmax(now, queue);
        queue = done[u] = start + c;
        *copy_s += c;
    }
    memset(done, 0, sizeof *done * (size_t)nu);
    for (int u = nu - 1; u >= 0; u--) {
        for (int w = u; w >= u - 1 && w >= 0; w--) /* u's and u-1's in slots before u unpacks */
            if (t->units[w].offload_copied && done[w] > now) {
                waited += done[w] - now;
                now = done[w];
            }
        if (u >= 2 && t->units[u - 2].offload_copied) {
            double c = t->units[u - 2].offload_bytes / host_bw, start = fmax(now, queue);
            queue = done[u - 2] = start + c;
            *copy_s += c;
        }
        now += ut[u].bi + ut[u].bw + ut[u].re;
    }
    free(done);
    return waited;
}

/* Under expert parallel, an op of the experts' own work (their grouped GEMMs, the ep strategy's
 * reorders of the rows it received): the busiest rank's takes plan.ep_load_imbalance x the balanced time. */
static int ep_busiest(const plan_layout *l, const plan_op *o) {
    return l->ep > 1 && o->kind == RT_OP_CUSTOM && o->name &&
           (!strcmp(o->name, "grouped_linear") || !strcmp(o->name, "ep_reorder"));
}

static void unit_times(const plan_trace *t, const plan_layout *l, const hw_profile *hw, int gpn, unit_time *ut,
                       const int *ac, plan_result *res, int n_micro, const int *unit_rank, int ep_rank) {
    int nu = t->n_units;
    memset(ut, 0, sizeof *ut * (size_t)nu);
    for (int i = 0; i < t->n_ops; i++) {
        const plan_op *o = &t->ops[i];
        if (o->unit < 0 || o->unit >= nu) continue;
        unit_time *u = &ut[o->unit];
        if (o->kind == RT_OP_COLLECTIVE) continue;
        double f = op_seconds(hw, o, 0), b = op_seconds(hw, o, 1);
        if (ep_busiest(l, o)) f *= res->ep_imbalance, b *= res->ep_imbalance;
        u->f += f;
        /* GEMMs split their backward into dX and dW halves; everything else is input-side */
        double bw = o->kind == RT_OP_GEMM ? b / 2 : 0;
        u->bi += b - bw;
        u->bw += bw;
        double re = ac[o->unit] == RT_AC_FULL ? f : ac[o->unit] == RT_AC_OP && !o->sac_keep ? f : 0;
        if (o->bwd_refwd) re += f; /* the op's own second forward (linear_cross_entropy's logits) */
        u->re += re;
        double all = f + b + re;
        if (o->kind == RT_OP_CUSTOM) { /* its attention FLOPs apart from its GEMMs */
            double a = attn_seconds(hw, o, 0), at = a + attn_seconds(hw, o, 1) + (re > 0 ? a : 0);
            u->attn += at;
            u->gemm += all - at;
        } else if (o->kind == RT_OP_GEMM) u->gemm += all;
        else if (o->kind == RT_OP_ATTENTION) u->attn += all;
        else u->membound += all;
    }
    for (int u = 0; u < nu; u++) /* the activation gradients start zeroed: a write of each */
        if (hw->mem_bw > 0) {
            double z = t->units[u].zeroed_bytes / (hw->mem_bw * hw->mem_eff);
            ut[u].bi += z;
            ut[u].membound += z;
        }
    for (int i = 0; i < t->n_ops; i++) { /* the op-level strategies' collectives: blocking unless overlapped */
        const plan_op *o = &t->ops[i];
        if (o->kind != RT_OP_COLLECTIVE || o->unit < 0 || o->unit >= nu) continue;
        int inter = axis_inter_node(l, hw, o->axis, gpn);
        int calls = o->coll_calls > 1 ? o->coll_calls : 1;
        double s = calls * axis_comm_seconds(hw, l, gpn, o->axis, o->coll_kind, (int)o->shape[0], o->coll_bytes / calls);
        if (o->axis == CT_AXIS_EP) s *= res->ep_imbalance; /* the busiest rank's rows, which every rank waits for */
        /* a recompute repeats the forward's collectives */
        double reps = o->phase == 1 && ac[o->unit] == RT_AC_FULL ? 2 : 1;
        unit_time *u = &ut[o->unit];
        double ovl = hw->comm_overlap > 0 ? hw->comm_overlap : 1.0; /* what the machine lets hide */
        double hide = o->overlapped ? fmin(s * ovl, o->phase == 1 ? u->f : u->bi + u->bw) : 0;
        u->comm_exposed += reps * (s - hide);
        u->comm_hidden += reps * hide;
        /* the lines show rank 0's collectives, expert parallel's those of the first rank holding experts */
        if (unit_rank && unit_rank[o->unit] != (o->axis == CT_AXIS_EP ? ep_rank : 0)) continue;
        char what[48];
        snprintf(what, sizeof what, "%s %s", axis_name(o->axis), kind_name(o->coll_kind));
        plan_comm_line *cl = comm_line(res, what, o->axis, o->coll_kind, inter);
        if (!cl) continue;
        cl->bytes += reps * o->coll_bytes * n_micro;
        cl->count += reps * n_micro;
        cl->seconds += reps * s * n_micro;
        cl->exposed += reps * (s - hide) * n_micro;
        if (o->axis == CT_AXIS_EP) res->t_ep_all_to_all += reps * s * n_micro;
    }
}

/* The microbatches a pp rank holds at once, from the simulated schedule (starts from schedule_check
 * under `c`): from its first F here (from_arrival: from when its first input lands, the sending
 * stage's F end, since the runner posts every receive early) to its last backward action here (the
 * runner waits for that microbatch's sends before this rank starts another microbatch, so a finished
 * one is never held beside a new one). A context (arenas) is held from the F; a received input's
 * buffer from its arrival. */
static int held_contexts(const sched_plan *p, const schedule_costs *c, int rank, int from_arrival) {
    int nm = p->n_microbatches;
    int64_t *from = malloc(sizeof(int64_t) * (size_t)nm), *to = malloc(sizeof(int64_t) * (size_t)nm);
    int64_t *fend = malloc(sizeof(int64_t) * (size_t)(p->n_stages * nm));
    int peak = 1;
    if (!from || !to || !fend) goto out;
    for (int m = 0; m < nm; m++) from[m] = INT64_MAX, to[m] = -1;
    for (int i = 0; i < p->n_stages * nm; i++) fend[i] = -1;
    for (int r = 0; r < p->pp; r++) /* when each F ends */
        for (int i = 0; i < p->ranks[r].n; i++) {
            const ct_pp_action *a = &p->ranks[r].actions[i];
            if (a->op == CT_PP_F) fend[a->stage * nm + a->microbatch] = p->ranks[r].start[i] + c->f;
        }
    const sched_rank *sr = &p->ranks[rank];
    for (int i = 0; i < sr->n; i++) {
        const ct_pp_action *a = &sr->actions[i];
        int m = a->microbatch;
        int64_t dur = a->op == CT_PP_F ? c->f : a->op == CT_PP_B ? c->b : a->op == CT_PP_W ? c->w : c->i;
        int64_t begin = sr->start[i];
        if (from_arrival && a->op == CT_PP_F && a->stage > 0 && schedule_stage_rank(p->placement, p->pp, a->stage - 1) != rank &&
            fend[(a->stage - 1) * nm + m] >= 0)
            begin = fend[(a->stage - 1) * nm + m];
        if (begin < from[m]) from[m] = begin;
        int64_t end = sr->start[i] + dur;
        if (a->op != CT_PP_F && end > to[m]) to[m] = end;
    }
    for (int m = 0; m < nm; m++) {
        if (to[m] < 0) continue;
        int live = 0;
        for (int k = 0; k < nm; k++) live += to[k] >= 0 && from[k] <= from[m] && to[k] > from[m];
        if (live > peak) peak = live;
    }
out:
    free(from);
    free(to);
    free(fend);
    return peak;
}

/* The strategies' report for pp rank `pr`: fresh planning instances on that rank's coordinates,
 * placing only its stages' units (the others' slots CT_PLACE_NONE), with the float8 decisions the
 * trace made. pp 1 asks the trace's own instances. mem: [strategy][category]. */
static ct_status stage_report(plan_ctx *c, const plan_layout *l, plan_run *r, int pr, int n_micro, double mem[SESSION_MAX_STRATEGIES][8],
                              ct_comm_cost *comms, int *n_comms, int max_comms) {
    plan_run q;
    memset(&q, 0, sizeof q);
    plan_run *use = r;
    ct_status bad = CT_OK;
    *n_comms = 0;
    if (l->pp > 1) {
        q.mesh = r->mesh;
        q.mesh.coord[CT_AXIS_PP] = pr;
        ct_strategy_env env = r->env;
        env.mesh = &q.mesh;
        runtime_dist dist = {NULL, NULL, &q.mesh, {0}, {0}, 0, r->pl.unit_rank, {0}};
        for (int k = 0; k < r->n && !bad; k++) {
            ct_clear_error();
            if (r->api[k]->create(&r->plug[k]->host, &env, &q.inst[k]) != CT_OK) {
                bad = fail(r->names[k]);
                break;
            }
            q.api[k] = r->api[k];
            q.names[k] = r->names[k];
            q.op_level[k] = r->op_level[k];
            q.n = k + 1;
            dist.axis[dist.n_st] = r->axis[k];
            dist.st[dist.n_st] = q.api[k];
            dist.strat[dist.n_st++] = q.inst[k];
        }
        if (!bad) {
            q.rt_ready = 1;
            if (runtime_plan(&q.rt, &plan_null_device, plan_null_handle(), c->s.m, c->s.model, &dist) != CT_OK)
                bad = CT_ERR_INVALID;
        }
        for (int i = 0; !bad && i < q.rt.n_params && i < r->rt.n_params; i++)
            q.rt.params[i]->t.flags |= r->rt.params[i]->t.flags & (CT_TENSOR_QUANT_DECIDED | CT_TENSOR_QUANTIZED);
        use = &q;
    }
    for (int k = 0; k < use->n && !bad; k++) {
        ct_comm_cost *at = comms + *n_comms;
        int room = max_comms - *n_comms;
        for (int i = 0; i < room; i++) at[i] = (ct_comm_cost){.struct_size = sizeof(ct_comm_cost)};
        ct_strategy_report rep = {sizeof rep, {0}, at, room, 0};
        ct_clear_error();
        if (use->api[k]->report(use->inst[k], n_micro, &rep) != CT_OK) {
            bad = fail(use->names[k]);
            break;
        }
        for (int m = 0; m < 8; m++) mem[k][m] = (double)rep.mem_bytes[m];
        int nc = rep.n_comms < room ? rep.n_comms : room;
        for (int i = 0; i < nc; i++) at[i].struct_size = (size_t)k; /* which strategy: the caller's to read */
        *n_comms += nc;
    }
    if (use == &q) run_free(&q);
    return bad;
}

/* The first pp rank holding experts (0 without pp), -1 for a dense model: its expert-parallel
 * collectives are the ones the plan shows (DeepSeek-V3's first blocks are dense). */
static int first_expert_rank(const runtime *rt, const int *unit_rank) {
    int first = -1;
    for (int i = 0; i < rt->n_params; i++) {
        if (!(rt->params[i]->t.flags & CT_TENSOR_EXPERTS)) continue;
        int pr = unit_rank ? unit_rank[rt->slots[i].unit] : 0;
        if (first < 0 || pr < first) first = pr;
    }
    return first;
}

/* Whether pp ranks a and b hold the same parameters in the same order (shapes, flags and placement):
 * their strategies then report the same buffers. */
static int stage_params_alike(const runtime *rt, const int *unit_rank, int a, int b) {
    int i = 0, j = 0;
    for (;;) {
        while (i < rt->n_params && unit_rank[rt->slots[i].unit] != a) i++;
        while (j < rt->n_params && unit_rank[rt->slots[j].unit] != b) j++;
        if (i == rt->n_params || j == rt->n_params) return i == rt->n_params && j == rt->n_params;
        const ct_param_slot *x = &rt->slots[i], *y = &rt->slots[j];
        if (x->numel != y->numel || x->local_numel != y->local_numel || x->placement != y->placement ||
            rt->params[i]->t.flags != rt->params[j]->t.flags)
            return 0;
        i++, j++;
    }
}

/* One pp rank's strategy collectives (stage_report's): each unit's overlapped ones into unit_comm_f
 * and _b (seconds per step), the rank's blocking, per-step and overlapped per-step ones, and the lines
 * the plan shows: rank 0's, expert parallel's from ep_line_rank. */
static void stage_comms(plan_result *res, const plan_layout *l, const hw_profile *hw, int gpn, const plan_run *r,
                        const ct_comm_cost *comms, int nc, int pr, int ep_line_rank, double *unit_comm_f,
                        double *unit_comm_b, int nu_c, double *rank_block, double *rank_step, double *rank_step_ovl) {
    for (int i = 0; i < nc; i++) {
        const ct_comm_cost *cc = &comms[i];
        int k = (int)cc->struct_size;
        if (!mesh_axis_bits(cc->axis)) continue;
        int inter = axis_inter_node(l, hw, cc->axis, gpn);
        double s = axis_comm_seconds(hw, l, gpn, cc->axis, cc->kind, mesh_shard_degree(&r->mesh, cc->axis), cc->bytes);
        double total = s * cc->count;
        int per_unit = cc->unit >= 0 && cc->unit < nu_c && cc->phase != CT_PHASE_STEP;
        if (per_unit && !cc->overlapped) rank_block[pr] += total; /* blocking: the unit waits for it */
        else if (per_unit) *(cc->phase == CT_PHASE_FORWARD ? &unit_comm_f[cc->unit] : &unit_comm_b[cc->unit]) += total;
        else if (cc->overlapped) rank_step_ovl[pr] += total;
        else rank_step[pr] += total;
        if (pr != (cc->axis == CT_AXIS_EP && ep_line_rank >= 0 ? ep_line_rank : 0)) continue;
        char what[48];
        snprintf(what, sizeof what, "%s %s", r->names[k], kind_name(cc->kind));
        plan_comm_line *cl = comm_line(res, what, cc->axis, cc->kind, inter);
        if (cl) {
            cl->bytes += cc->bytes * cc->count;
            cl->count += cc->count;
            cl->seconds += total;
            if (!cc->overlapped) cl->exposed += total;
            else cl->hidden_candidate += total; /* its exposed share is set once the overlap is known */
        }
    }
}

/* ---- the evaluation ---- */

static double align64d(double b) { return ceil(b / 64.0) * 64.0; }

ct_status plan_eval(plan_ctx *c, const plan_layout *l, const hw_profile *hw, plan_result *res) {
    memset(res, 0, sizeof *res);
    res->layout = *l;
    mem_stats keep = g_mem;
    int tracing = trace_set_on(0), ledger = memledger_pause(1); /* the plan's unit names die with its model */
    plan_run r;
    plan_trace t;
    memset(&t, 0, sizeof t);
    ct_status bad = run_open(c, l, &r);
    if (bad == CT_OK) bad = run_trace(c, l, &r, &t);
    if (bad) goto done;
    runtime *rt = &r.rt;
    int nu = rt->desc.n_units, pp = l->pp;
    const int *unit_rank = pp > 1 ? r.pl.unit_rank : NULL;
    int gpn = hw->gpus_per_node > 0 ? hw->gpus_per_node : 8;
    int64_t world = (int64_t)l->dp_replicate * l->dp_shard * l->cp * l->tp * l->pp;
    int64_t dp = (int64_t)l->dp_replicate * l->dp_shard;
    /* microbatches per step: pipeline microbatches, or gradient accumulation from the global batch */
    int n_micro = pp > 1 ? r.pl.n_mb : 1, accum = 1;
    if (l->global_batch > 0 && l->local_batch > 0 && dp > 0 && l->global_batch % (l->local_batch * dp) == 0)
        accum = (int)(l->global_batch / (l->local_batch * dp));
    if (accum < 1) accum = 1;

    /* per pp rank: parameters, their gradients and states, by the placement */
    double prm[64] = {0}, master[64] = {0}, whole_grad[64] = {0};
    int npr = pp < 64 ? pp : 64;
    for (int i = 0; i < rt->n_params; i++) {
        const ct_param_slot *sl = &rt->slots[i];
        int pr = unit_rank ? unit_rank[sl->unit] : 0;
        if (pr >= npr) continue;
        double local = align64d((double)sl->local_numel * 4.0);
        if (sl->whole & CT_WHOLE_DATA) {
            master[pr] += local;
            prm[pr] += (double)sl->numel * 4.0;
        } else {
            prm[pr] += local;
        }
        if (sl->whole & CT_WHOLE_GRAD) whole_grad[pr] += (double)sl->numel * 4.0;
    }
    for (int i = 0; i < rt->n_params; i++) { /* the experts per layer, whole (before ep split them) */
        const ct_param_slot *sl = &rt->slots[i];
        const ct_tensor *w = &rt->params[i]->t;
        if (!(w->flags & CT_TENSOR_EXPERTS) || w->ndim < 1) continue;
        int64_t e = w->shape[0] * (sl->split_axis == CT_AXIS_EP && sl->split_parts > 1 ? sl->split_parts : 1);
        if (e > res->n_experts) res->n_experts = (int)e;
    }
    double local_bytes[64] = {0}; /* the storage allocation: param_bytes of that rank */
    double replicated[64] = {0};  /* bf16 compute's rounded copies: the largest unit's replicated parameters */
    for (int i = 0; i < rt->n_params; i++) {
        const ct_param_slot *sl = &rt->slots[i];
        int pr = unit_rank ? unit_rank[sl->unit] : 0;
        if (pr < npr) local_bytes[pr] += align64d((double)sl->local_numel * 4.0);
    }
    for (int u = 0; u < nu; u++) {
        int pr = unit_rank ? unit_rank[u] : 0;
        double unit_bytes = 0;
        for (int i = 0; i < rt->n_params; i++)
            if (rt->slots[i].unit == u && rt->slots[i].placement == CT_PLACE_REPLICATE)
                unit_bytes += align64d((double)rt->slots[i].numel * 4.0);
        if (pr < npr && unit_bytes > replicated[pr]) replicated[pr] = unit_bytes;
    }
    /* the strategies' own buffers and collectives: per pp rank (first, a middle one, last; below, the
     * others); the collectives are rank 0's */
    static ct_comm_cost comms[1024];
    double strat_mem[64][SESSION_MAX_STRATEGIES][8];
    memset(strat_mem, 0, sizeof strat_mem);
    /* per pp rank: its units' overlapped collectives, and its blocking and per-step ones */
    double unit_comm_f[1024] = {0}, unit_comm_b[1024] = {0}, rank_block[64] = {0}, rank_step[64] = {0},
           rank_step_ovl[64] = {0};
    int nu_c = nu < 1024 ? nu : 1024;
    int probe[3] = {0, npr > 2 ? 1 : 0, npr - 1};
    int ep_line_rank = first_expert_rank(rt, unit_rank);
    for (int j = 2; j >= 0; j--) {
        int nc = 0, pr = probe[j];
        if ((j < 2 && pr == probe[j + 1]) || (j == 0 && pr == probe[2])) continue; /* each rank once */
        if ((bad = stage_report(c, l, &r, pr, n_micro * accum, strat_mem[pr], comms, &nc, 1024))) goto done;
        stage_comms(res, l, hw, gpn, &r, comms, nc, pr, ep_line_rank, unit_comm_f, unit_comm_b, nu_c, rank_block,
                    rank_step, rank_step_ovl);
    }
    /* every other stage: like a probed one that holds the same parameters (a middle rank of a model
     * whose first blocks are dense and the rest experts is not like rank 1), else asked itself */
    for (int pr = 0; pr < npr; pr++) {
        if (pr == probe[0] || pr == probe[1] || pr == probe[2]) continue;
        int like = -1;
        for (int q = 1; q < pr && like < 0; q++) /* (the ranks below pr are known) */
            if (stage_params_alike(rt, unit_rank, q, pr)) like = q;
        if (like >= 0) {
            memcpy(strat_mem[pr], strat_mem[like], sizeof strat_mem[pr]);
            rank_block[pr] = rank_block[like], rank_step[pr] = rank_step[like], rank_step_ovl[pr] = rank_step_ovl[like];
            for (int u = 0, v = 0; u < nu_c && v < nu_c; u++, v++) { /* the k-th unit of one as of the other */
                while (u < nu_c && unit_rank[u] != pr) u++;
                while (v < nu_c && unit_rank[v] != like) v++;
                if (u < nu_c && v < nu_c) unit_comm_f[u] = unit_comm_f[v], unit_comm_b[u] = unit_comm_b[v];
            }
            continue;
        }
        int nc = 0;
        if ((bad = stage_report(c, l, &r, pr, n_micro * accum, strat_mem[pr], comms, &nc, 1024))) goto done;
        stage_comms(res, l, hw, gpn, &r, comms, nc, pr, ep_line_rank, unit_comm_f, unit_comm_b, nu_c, rank_block,
                    rank_step, rank_step_ovl);
    }

    /* time per unit and per microbatch */
    unit_time *ut = calloc((size_t)nu, sizeof *ut);
    if (!ut) {
        bad = fail("out of memory");
        goto done;
    }
    res->ep_imbalance = 1;
    mf_get_float(c->mf, "plan.ep_load_imbalance", &res->ep_imbalance);
    if (res->ep_imbalance < 1) res->ep_imbalance = 1;
    if (l->ep > 1 && res->ep_imbalance > 1)
        note_add(r.note, sizeof r.note, "expert parallel: the busiest of the ep %d ranks receives %.2f x a balanced "
                 "share of the routed tokens (plan.ep_load_imbalance): its all-to-alls and experts' GEMMs timed at "
                 "that, memory planned at balanced routing", l->ep, res->ep_imbalance);
    else if (l->ep > 1)
        note_add(r.note, sizeof r.note, "expert parallel: routing assumed perfectly balanced, each of the ep %d ranks "
                 "receiving 1/%d of the routed tokens (plan.ep_load_imbalance sets the busiest rank's share)", l->ep, l->ep);
    unit_times(&t, l, hw, gpn, ut, rt->ac, res, n_micro * accum, unit_rank, ep_line_rank);
    /* FSDP's gathers hide behind the previous unit's compute (prefetch); its reduce-scatters behind
     * the next unit's backward; what does not fit shows */
    double exp_r[64] = {0}, hid_r[64] = {0}, ovl = hw->comm_overlap > 0 ? hw->comm_overlap : 1.0;
    for (int u = 0; u < nu_c; u++) {
        int pr = unit_rank ? unit_rank[u] : 0;
        if (pr >= npr) continue;
        int prev = u > 0 && (!unit_rank || unit_rank[u - 1] == pr); /* a stage's first unit: nothing before it here */
        double cover_f = prev ? ut[u - 1].f : 0, cover_b = prev ? ut[u - 1].bi + ut[u - 1].bw + ut[u - 1].re : 0;
        double cf = unit_comm_f[u] / (n_micro * accum), cb = unit_comm_b[u] / (n_micro * accum);
        double ef = cf - fmin(cf * ovl, cover_f), eb = cb - fmin(cb * ovl, cover_b);
        exp_r[pr] += ef + eb;
        hid_r[pr] += (unit_comm_f[u] + unit_comm_b[u]) / (n_micro * accum) - ef - eb;
    }
    /* the step waits for the pp rank whose strategies' collectives show most (rank 0 without pp) */
    int cr = 0;
    for (int pr = 1; pr < npr; pr++)
        if (exp_r[pr] * n_micro * accum + rank_block[pr] + rank_step[pr] >
            exp_r[cr] * n_micro * accum + rank_block[cr] + rank_step[cr])
            cr = pr;
    double exposed = exp_r[cr], hidden = hid_r[cr], unit_block = rank_block[cr], step_comm = rank_step[cr],
           step_comm_overlap = rank_step_ovl[cr];
    /* per pp rank: compute of one microbatch */
    double F[64] = {0}, BI[64] = {0}, BW[64] = {0}, RE[64] = {0}, TPX[64] = {0}, SEND[64] = {0};
    for (int u = 0; u < nu; u++) {
        int pr = unit_rank ? unit_rank[u] : 0;
        if (pr >= npr) continue;
        F[pr] += ut[u].f;
        BI[pr] += ut[u].bi;
        BW[pr] += ut[u].bw;
        RE[pr] += ut[u].re;
        TPX[pr] += ut[u].comm_exposed;
        if (pp > 1 && u + 1 < nu && unit_rank[u + 1] != pr) /* a stage boundary: the activation goes on */
            SEND[pr] += comm_seconds(hw, CT_COLL_ALL_GATHER, 2, 2 * t.units[u].out_bytes,
                                     axis_inter_node(l, hw, CT_AXIS_PP, gpn)) ;
    }
    double step = 0;
    int slowest = 0;
    if (pp > 1) {
        double f = 0, b = 0, bi = 0, bw = 0;
        for (int pr = 0; pr < npr; pr++) {
            double fr = F[pr] + SEND[pr] + TPX[pr] / 2, br = BI[pr] + BW[pr] + RE[pr] + SEND[pr] + TPX[pr] / 2;
            if (fr + br > f + b) slowest = pr;
            f = fmax(f, fr / r.pl.spr);
            b = fmax(b, br / r.pl.spr);
            bi = fmax(bi, (BI[pr] + RE[pr] + SEND[pr]) / r.pl.spr);
            bw = fmax(bw, BW[pr] / r.pl.spr);
        }
        double unit = fmax(f, b) / 20000.0; /* the checker counts integer time units */
        if (unit <= 0) unit = 1e-9;
        schedule_costs costs = {(int)ceil(f / unit), (int)ceil(b / unit), (int)ceil(bi / unit), (int)ceil(bw / unit)};
        if (costs.f < 1) costs.f = 1;
        if (costs.b < 1) costs.b = 1;
        if (costs.i < 1) costs.i = 1;
        if (costs.w < 1) costs.w = 1;
        if (schedule_check(&r.pl.plan, &costs) != CT_OK) {
            bad = ct_fail(CT_ERR_INVALID, "the schedule cannot be simulated: %s", ct_last_error());
            free(ut);
            goto done;
        }
        step = (double)r.pl.plan.makespan * unit * accum;
        res->bubble_fraction = r.pl.plan.bubble;
        if (hw->core_share > 0 && hw->core_share < 1) {
            /* the ops were timed with every rank of a shared core busy; in the bubble a rank waits and
             * the others have its share: the busy ones run faster, down to a core each */
            step *= fmax(hw->core_share, 1.0 - r.pl.plan.bubble);
            note_add(r.note, sizeof r.note, "ranks share cores (%.2f each): pipeline stages speed up in the bubble",
                     hw->core_share);
        }
        res->inflight_microbatches = r.pl.plan.peak_activations;
        double busy = (F[slowest] + BI[slowest] + BW[slowest] + RE[slowest]) * n_micro * accum;
        res->t_bubble = fmax(0, step - busy - (TPX[slowest] + 2 * SEND[slowest]) * n_micro * accum);
    } else {
        step = (F[0] + BI[0] + BW[0] + RE[0] + TPX[0]) * accum;
        res->inflight_microbatches = 1;
    }
    step += exposed * n_micro * accum + unit_block;
    /* the step's own collectives: DDP / HSDP all-reduces overlap the backward when the strategy says so */
    double back = (BI[slowest] + BW[slowest] + RE[slowest]) * n_micro * accum;
    double ovl_exposed = step_comm_overlap - fmin(step_comm_overlap * ovl, back);
    step += step_comm + ovl_exposed;
    res->t_comm_exposed = exposed * n_micro * accum + unit_block + step_comm + ovl_exposed;
    res->t_comm_hidden += hidden * n_micro * accum + step_comm_overlap - ovl_exposed;
    {
        double ovl = 0, shown = exposed * n_micro * accum + ovl_exposed;
        for (int i = 0; i < res->n_comms; i++) ovl += res->comms[i].hidden_candidate;
        for (int i = 0; i < res->n_comms; i++) /* the overlapped ones show in proportion */
            if (ovl > 0) res->comms[i].exposed += res->comms[i].hidden_candidate * fmin(1.0, shown / ovl);
    }
    /* the op-level collectives (tp's, ep's all-to-alls) of the stage that sets the pace, inside its
     * compute above: shown here, not added again (rank 0 holds no experts in DeepSeek-V3's first stage) */
    res->t_comm_exposed += TPX[slowest] * n_micro * accum;
    for (int u = 0; u < nu; u++)
        if ((unit_rank ? unit_rank[u] : 0) == slowest) res->t_comm_hidden += ut[u].comm_hidden * n_micro * accum;
    /* the optimizer: its plan_step per slot, or the assumed traffic */
    double opt_s = 0, opt_bytes = 0;
    int assumed_opt = !c->s.opt || !CT_HAS_FIELD(c->s.o, ct_optimizer_api, plan_step) || !c->s.o->plan_step;
    for (int i = 0; i < rt->n_params; i++) {
        const ct_param_slot *sl = &rt->slots[i];
        if ((unit_rank ? unit_rank[sl->unit] : 0) != slowest || sl->local_numel <= 0) continue;
        ct_optimizer_cost oc = {sizeof oc, 0, 0, 0, 0};
        if (assumed_opt || c->s.o->plan_step(c->s.opt, sl, &oc) != CT_OK)
            oc.bytes = (2.0 + 2.0 * c->s.n_state) * 4.0 * (double)sl->local_numel;
        opt_bytes += oc.bytes;
        if (hw->mem_bw > 0) opt_s += oc.bytes / (hw->mem_bw * hw->mem_eff);
        double rate = hw->peak_flops[l->bf16 ? PLAN_BF16 : PLAN_F32] * hw->matmul_eff;
        if (oc.matmul_flops > 0 && rate > 0) opt_s += oc.matmul_flops / rate;
        if (oc.comm_bytes > 0)
            opt_s += comm_seconds(hw, CT_COLL_ALL_GATHER, sl->placement == CT_PLACE_SHARD ? mesh_shard_degree(&r.mesh, sl->shard_axis) : 1,
                                  oc.comm_bytes, 0);
    }
    if (assumed_opt)
        note_add(r.note, sizeof r.note, "the optimizer reports no plan_step: its step is planned as %d states' traffic",
                 c->s.n_state);
    /* the gradient norm and clipping read every local gradient once (twice with clipping) */
    double norm_s = hw->mem_bw > 0 ? 2.0 * local_bytes[slowest] / (hw->mem_bw * hw->mem_eff) : 0;
    res->t_optimizer = opt_s + norm_s;
    step += res->t_optimizer;
    if (l->offload && pp <= 1) { /* activation offload's copies, where they do not hide */
        double copied = 0;
        for (int u = 0; u < nu; u++) copied += t.units[u].offload_copied ? 2 * t.units[u].offload_bytes : 0;
        res->host_bytes = t.host_bytes;
        res->offload_bytes = copied * n_micro * accum;
        if (l->compile)
            note_add(r.note, sizeof r.note, "compile has no effect with activation offload: its copies to and from "
                                            "the host are not captured, so the step runs eagerly");
        if (hw->host_bw > 0) {
            double copy_s = 0;
            res->t_offload_exposed = offload_wait(&t, ut, nu, hw->host_bw, &copy_s) * n_micro * accum;
            res->t_offload = copy_s * n_micro * accum;
            step += res->t_offload_exposed;
        } else if (copied > 0 && hw->peak_flops[PLAN_BF16] > 0) /* (no profile: memory only, nothing timed) */
            note_add(r.note, sizeof r.note, "the profile gives no host_link bandwidth: activation offload's "
                                            "copies are not timed");
    }
    res->step_time = step;
    for (int u = 0; u < nu; u++) {
        if ((unit_rank ? unit_rank[u] : 0) != slowest) continue;
        res->t_gemm += ut[u].gemm * n_micro * accum;
        res->t_attention += ut[u].attn * n_micro * accum;
        res->t_memory_bound += ut[u].membound * n_micro * accum;
        res->t_recompute += ut[u].re * n_micro * accum;
    }
    free(ut);

    /* memory per pp rank; the plan reports the largest */
    double best = -1;
    for (int pr = 0; pr < npr; pr++) {
        double m[PLAN_MEM_N] = {0};
        m[PLAN_MEM_PARAMS] = prm[pr] + (l->bf16 ? replicated[pr] : 0); /* the bf16 copies for compute */
        m[PLAN_MEM_GRADS] = local_bytes[pr] + whole_grad[pr];
        m[PLAN_MEM_OPTIMIZER] = (double)c->s.n_state * local_bytes[pr];
        m[PLAN_MEM_MASTER] = master[pr];
        for (int k = 0; k < r.n; k++) {
            const double *sm = strat_mem[pr][k];
            int is_tp = r.op_level[k];
            m[is_tp ? PLAN_MEM_TP_BUFFERS : PLAN_MEM_FSDP_BUFFERS] += sm[CT_MEM_COMM] + sm[CT_MEM_OTHER] + sm[CT_MEM_ACTIVATIONS];
            m[PLAN_MEM_PARAMS] += sm[CT_MEM_PARAMS];
            m[PLAN_MEM_GRADS] += sm[CT_MEM_GRADS];
            m[PLAN_MEM_OPTIMIZER] += sm[CT_MEM_OPTIMIZER];
            m[PLAN_MEM_MASTER] += sm[CT_MEM_MASTER];
        }
        /* activations: the tape's arenas; under pp each microbatch in flight keeps its own */
        /* grads_inner: a unit's backward gradients beside its boundary one; all: over the units */
        double saved = 0, boundary = 0, logits = 0, scratch = 0, grads_all = 0, grads_inner = 0;
        double shared_bgrad[2] = {0, 0}; /* a pipeline's two shared boundary-gradient buffers */
        for (int u = 0; u < nu; u++) {
            if ((unit_rank ? unit_rank[u] : 0) != pr) continue;
            if (pp > 1 && rt->bgrad_keep && !rt->bgrad_keep[u])
                shared_bgrad[u & 1] = fmax(shared_bgrad[u & 1], t.units[u].in_grad_bytes);
            saved += t.units[u].saved_bytes;
            boundary += t.units[u].boundary_grad_bytes;
            grads_all += t.units[u].grads_peak - t.units[u].boundary_grad_bytes;
            grads_inner = fmax(grads_inner, t.units[u].grads_peak - t.units[u].boundary_grad_bytes);
            scratch = fmax(scratch, t.units[u].scratch_peak);
            if (u == nu - 1) logits = t.units[u].saved_bytes;
        }
        int inflight = 1;
        if (pp > 1) {
            inflight = held_contexts(&r.pl.plan, &r.pl.plan.costs, pr, 0);
            int arrived = held_contexts(&r.pl.plan, &r.pl.plan.costs, pr, 1);
            /* each microbatch context keeps its own arenas at their largest: ids and targets, the
             * received input, what its units keep, and its gradients (the input gradients that stay,
             * the largest unit's backward temporaries) */
            double recv = 0;
            for (int u = 1; u < nu; u++)
                if (unit_rank[u] == pr && unit_rank[u - 1] != pr) recv += t.units[u - 1].out_bytes;
            m[PLAN_MEM_ACTIVATIONS] = inflight * (t.io_bytes + saved - logits);
            m[PLAN_MEM_LOGITS] = inflight * logits;
            /* a zero-bubble schedule's input half keeps every unit's gradients for its weight half */
            int split = 0;
            for (int q = 0; q < r.pl.plan.ranks[pr].n && !split; q++) split = r.pl.plan.ranks[pr].actions[q].op == CT_PP_I;
            /* without I/W, the units' internal gradients share one arena over the contexts (each
             * unit's given back after its backward); a context keeps only its boundary ones */
            const double min_chunk = (double)POOL_MIN_CHUNK; /* each pool's first chunk */
            m[PLAN_MEM_TRANSIENT] = split ? inflight * fmax(min_chunk, boundary + grads_all) + scratch
                                          : inflight * fmax(min_chunk, boundary) + fmax(min_chunk, grads_inner) + scratch;
            for (int k = 0; k < 2; k++)
                if (shared_bgrad[k] > 0) m[PLAN_MEM_TRANSIENT] += fmax(min_chunk, shared_bgrad[k]);
            m[PLAN_MEM_PP_BUFFERS] = (recv > 0 ? arrived : 0) * recv; /* received inputs wait in their own buffers */
            /* each context's descriptor arena starts at one chunk (1 MiB); the rank's scratch one */
            m[PLAN_MEM_OVERHEAD] = inflight * fmax(1048576.0, t.desc_bytes / npr) +
                                   (scratch > 0 ? 1048576.0 : 0);
        } else {
            m[PLAN_MEM_ACTIVATIONS] = t.io_bytes + saved - logits;
            m[PLAN_MEM_LOGITS] = logits;
            /* the arenas as they stay after the first step: one region holds what is saved and each
             * unit's backward in turn, so this is the live peak plus what each pool rounds up */
            m[PLAN_MEM_TRANSIENT] = fmax(0, fmax(t.live_peak, t.arena_bytes) - t.io_bytes - saved);
            m[PLAN_MEM_OVERHEAD] = t.desc_bytes; /* the descriptor arenas, host memory */
        }
        m[PLAN_MEM_TRANSIENT] += t.opscratch_bytes; /* custom ops' temporaries */
        m[PLAN_MEM_FLOAT8] = r.ts.float8_saved * inflight + r.ts.float8_weights + r.ts.float8_scratch;
        double buffers = m[PLAN_MEM_FSDP_BUFFERS] + m[PLAN_MEM_TP_BUFFERS] + m[PLAN_MEM_ACTIVATIONS] +
                         m[PLAN_MEM_TRANSIENT] + m[PLAN_MEM_LOGITS] + m[PLAN_MEM_FLOAT8];
        m[PLAN_MEM_OVERHEAD] += hw->overhead_bytes + hw->alloc_frac * buffers;
        double total = 0;
        for (int k = 0; k < PLAN_MEM_N; k++) total += m[k];
        if (getenv("CTITAN_PLAN_DEBUG")) {
            for (int u = 0; u < nu && !strcmp(getenv("CTITAN_PLAN_DEBUG"), "units"); u++)
                fprintf(stderr, "unit %d: saved %.0f fwd_peak %.0f bwd_peak %.0f grads_peak %.0f scratch_peak %.0f\n", u,
                        t.units[u].saved_bytes, t.units[u].fwd_peak, t.units[u].bwd_peak, t.units[u].grads_peak,
                        t.units[u].scratch_peak);
            fprintf(stderr, "plan rank %d:", pr);
            for (int k = 0; k < PLAN_MEM_N; k++) fprintf(stderr, " %s %.0f", plan_mem_names[k], m[k]);
            fprintf(stderr, " (saved %.0f boundary %.0f io %.0f inflight %d live_peak %.0f arena %.0f opscratch %.0f)\n", saved, boundary, t.io_bytes, inflight, t.live_peak, t.arena_bytes, t.opscratch_bytes);
        }
        if (total > best) {
            best = total;
            memcpy(res->mem, m, sizeof m);
            res->mem_total = total;
            if (pp > 1) res->inflight_microbatches = inflight;
        }
    }
    res->mem_capacity = hw->mem_bytes;
    res->fits = hw->mem_bytes <= 0 || res->mem_total <= hw->mem_bytes * (1.0 - hw->headroom_frac);
    double tokens = (double)l->local_batch * (double)l->seq_len * (double)dp * accum;
    res->tokens_per_s_per_gpu = step > 0 ? tokens / step / (double)world : 0;
    res->flops_per_token = c->desc.flops_per_token;
    res->mfu = hw->peak_flops[PLAN_BF16] > 0 ? res->flops_per_token * res->tokens_per_s_per_gpu / hw->peak_flops[PLAN_BF16] : 0;
    snprintf(res->assumptions, sizeof res->assumptions, "%s", r.note);
    if (res->host_bytes > 0 && hw->host_mem > 0 && res->host_bytes > hw->host_mem * (1.0 - hw->headroom_frac)) {
        res->fits = 0; /* activation offload's copies must fit the host's share too */
        note_add(res->assumptions, sizeof res->assumptions, "activation offload needs %.1f GiB of host memory per "
                 "GPU, more than the %.1f GiB the profile's host_link.memory_gb leaves with the headroom",
                 res->host_bytes / 1073741824.0, hw->host_mem * (1.0 - hw->headroom_frac) / 1073741824.0);
    }
    if (!hw->calibrated && hw->peak_flops[PLAN_BF16] > 0 && !strstr(res->assumptions, "datasheet"))
        note_add(res->assumptions, sizeof res->assumptions,
                 "datasheet rates x the profile's assumed efficiencies (matmul %.2f, attention %.2f, memory %.2f)",
                 hw->matmul_eff, hw->attn_eff, hw->mem_eff);
done:
    plan_trace_free(&t);
    run_free(&r);
    g_mem = keep;
    trace_set_on(tracing);
    memledger_pause(ledger);
    return bad;
}

ct_status plan_for_run(int argc, char **argv, const char *usage, ct_status (*prepare)(manifest *mf), int world,
                       const session *run, plan_result *r, hw_profile *hw, int *have_hw) {
    run_args a = {0};
    ct_status st;
    memset(hw, 0, sizeof *hw);
    *have_hw = 0;
    manifest *mf = session_parse(argc, argv, &a, usage, &st);
    if (!mf) return ct_fail(CT_ERR_INVALID, "the manifest cannot be read again");
    if (prepare && prepare(mf) != CT_OK) {
        manifest_free(mf);
        return CT_ERR_INVALID;
    }
    plan_ctx *c = NULL;
    plan_layout l;
    const char *name = "";
    mf_get_str(mf, "plan.hardware", &name);
    st = CT_OK;
    if (name[0]) {
        char path[4096];
        session_resolve_path(mf, name, path, sizeof path);
        st = hw_profile_load(strchr(name, '/') || strstr(name, ".yaml") ? path : name, hw);
        *have_hw = st == CT_OK;
    }
    if (st == CT_OK) st = open_ctx(&c, mf, run);
    if (st == CT_OK) st = plan_layout_from_manifest(c, world, &l);
    if (st == CT_OK) st = plan_eval(c, &l, hw, r);
    plan_close(c);
    manifest_free(mf);
    return st;
}
