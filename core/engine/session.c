/* session.c: from a manifest to a ready run: argument parsing, plugin loading, validation,
 * device/model/optimizer creation, model save/load and sampling. */
#include "engine/session.h"
#include "base/util.h"

#include "host/commstats.h"
#include "host/devcheck.h"
#include "host/rank.h"
#include "engine/mesh.h"
#include "engine/moe.h"
#include "engine/quantize.h"
#include "schedule/schedule.h"
#include "config/torchtitan_keys.h"
#include "io/tensorfile.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The command line's --section.key=value overrides, in order (keys copied: they are normalized). flag:
 * MF_FLAG_BARE for a bare `--key`, MF_FLAG_NEGATED for `--no-key` (val NULL), else MF_FLAG_NONE. */
typedef struct overrides {
    const char *key[512], *val[512];
    char *owned[512];
    int flag[512];
    int n, n_owned;
} overrides;

/* A flag with a value (--checkpoint PATH, --prompt TEXT, --chat-template T): CT_OK, or CT_ERR_INVALID
 * when it has none. */
static ct_status flag_value(int argc, char **argv, int *i, run_args *a) {
    const char *arg = argv[*i];
    const char *v = strchr(arg, '=') ? strchr(arg, '=') + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (!v) {
        fprintf(stderr, "ctitan: %s needs a value (see --help)\n", arg);
        return CT_ERR_INVALID;
    }
    if (!strncmp(arg, "--checkpoint", 12)) a->checkpoint = v;
    else if (!strncmp(arg, "--chat-template", 15)) a->chat_template = v;
    else if (!strncmp(arg, "--logits-out", 12)) a->logits_out = v;
    else a->prompt = v;
    return CT_OK;
}

/* Whether arg is --NAME or --NAME=... */
static int is_flag(const char *arg, const char *name) {
    size_t n = strlen(name);
    return !strncmp(arg, name, n) && (arg[n] == 0 || arg[n] == '=');
}

/* One override, as torchtitan's command line takes them: --key=value, --key value, a bare boolean
 * --key (true) and --no-key (false). A bare key followed by a value is read as `--key value`, except
 * that a core boolean followed by something that is no boolean stays bare (`--checkpoint.enable
 * run.yaml`); a bare key that is not a boolean is refused by validation, which knows every plugin's. */
static ct_status override_add(overrides *ov, int argc, char **argv, int *i) {
    char key[MF_MAX_KEY_LEN + 1];
    const char *value, *next = *i + 1 < argc ? argv[*i + 1] : NULL;
    int negated, b;
    if (ov->n == 512) {
        fprintf(stderr, "ctitan: too many overrides\n");
        return CT_ERR_INVALID;
    }
    if (manifest_cli_key(argv[*i], key, sizeof key, &value, &negated) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    if (!(ov->owned[ov->n_owned] = strdup(key))) {
        fprintf(stderr, "ctitan: out of memory\n");
        return CT_ERR_NOMEM;
    }
    ov->key[ov->n] = ov->owned[ov->n_owned++];
    ov->flag[ov->n] = MF_FLAG_NONE;
    if (negated) ov->flag[ov->n] = MF_FLAG_NEGATED;
    else if (!value && next && strncmp(next, "--", 2) &&
             !(manifest_core_type(key) == CT_OPT_BOOL && mf_parse_bool(next, &b)))
        value = argv[++*i];
    else if (!value) ov->flag[ov->n] = MF_FLAG_BARE;
    ov->val[ov->n++] = value;
    if (!strcmp(key, "job.config_file") && !value) {
        fprintf(stderr, "ctitan: command line: %s: needs the manifest's path\n", argv[*i]);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* The arguments: flags, overrides, the manifest's path (or job.config_file among the overrides). */
static ct_status args_parse(int argc, char **argv, run_args *a, overrides *ov, const char *usage) {
    ct_status st = CT_OK;
    for (int i = 0; i < argc && st == CT_OK; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) a->help = 1;
        else if (!strcmp(arg, "--print-config") || !strcmp(arg, "--print_config")) a->print_config = 1;
        else if (!strcmp(arg, "--dry-run") || !strcmp(arg, "--dry_run")) a->dry_run = 1;
        else if (is_flag(arg, "--checkpoint") || is_flag(arg, "--prompt") || is_flag(arg, "--chat-template") ||
                 is_flag(arg, "--logits-out"))
            st = flag_value(argc, argv, &i, a);
        else if (!strcmp(arg, "--chat")) a->chat = 1;
        else if (!strcmp(arg, "--print-prompt-ids")) a->print_prompt_ids = 1;
        else if (!strncmp(arg, "--", 2)) st = override_add(ov, argc, argv, &i);
        else if (!a->config) a->config = arg;
        else {
            fprintf(stderr, "ctitan: unexpected argument '%s' (%.*s)\n", arg, (int)strcspn(usage, "\n"), usage);
            st = CT_ERR_INVALID;
        }
    }
    for (int i = 0; i < ov->n && !a->config; i++)
        if (!strcmp(ov->key[i], "job.config_file")) a->config = ov->val[i];
    return st;
}

/* The manifest with the overrides applied and the core's schema added; NULL after its message. */
static manifest *manifest_open(const run_args *a, const overrides *ov) {
    manifest *mf = manifest_load(a->config);
    if (!mf) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return NULL;
    }
    for (int i = 0; i < ov->n; i++) {
        if (!strcmp(ov->key[i], "job.config_file")) continue;
        if (ov->flag[i] ? manifest_override_flag(mf, ov->key[i], ov->flag[i])
                        : manifest_override(mf, ov->key[i], ov->val[i])) {
            fprintf(stderr, "ctitan: %s\n", ct_last_error());
            manifest_free(mf);
            return NULL;
        }
    }
    if (manifest_torchtitan(mf, !a->reads_no_data) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        manifest_free(mf);
        return NULL;
    }
    manifest_add_core_schema(mf);
    return mf;
}

manifest *session_parse(int argc, char **argv, run_args *a, const char *usage, ct_status *status) {
    overrides *ov = calloc(1, sizeof *ov);
    manifest *mf = NULL;
    int reads_no_data = a->reads_no_data; /* the command's, set before the call */
    memset(a, 0, sizeof *a);
    a->reads_no_data = reads_no_data;
    *status = CT_OK;
    if (!ov) {
        fprintf(stderr, "ctitan: out of memory\n");
        *status = CT_ERR_NOMEM;
        return NULL;
    }
    *status = args_parse(argc, argv, a, ov, usage);
    if (*status == CT_OK && !a->help && !a->config) {
        fprintf(stderr, "ctitan: no manifest given (%.*s)\n", (int)strcspn(usage, "\n"), usage);
        *status = CT_ERR_INVALID;
    }
    if (*status == CT_OK && !a->help && !(mf = manifest_open(a, ov))) *status = CT_ERR_INVALID;
    for (int i = 0; i < ov->n_owned; i++) free(ov->owned[i]);
    free(ov);
    return mf;
}

void session_resolve_path(const manifest *mf, const char *p, char *out, size_t len) {
    if (p[0] == '/' || access(p, F_OK) == 0 || snprintf(out, len, "%s/%s", mf->dir, p) >= (int)len ||
        access(out, F_OK) != 0)
        snprintf(out, len, "%s", p);
}

static ct_status load_named(session *s, const char *section, const char *key, const char *name, ct_plugin_kind kind,
                      plugin **out) {
    char where[600];
    *out = plugin_load(name, kind, section, s->mf);
    if (!*out) {
        mf_where(s->mf, key, where, sizeof where);
        fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
        return CT_ERR_INVALID;
    }
    const ct_plugin_info *in = &(*out)->info;
    /* the API table must hold every field this host calls unconditionally (its 2.0 part for
     * strategies, 1.0 for the rest); later fields are read behind CT_HAS_FIELD */
    size_t need = kind == CT_KIND_DEVICE      ? offsetof(ct_device_api, amax)
                  : kind == CT_KIND_MODEL     ? offsetof(ct_model_api, tp_plan)
                  : kind == CT_KIND_OPTIMIZER ? offsetof(ct_optimizer_api, elementwise)
                  : kind == CT_KIND_COMM      ? offsetof(ct_comm_api, test)
                  : kind == CT_KIND_STRATEGY  ? offsetof(ct_strategy_api, post_step)
                  : kind == CT_KIND_PIPELINE  ? sizeof(ct_pipeline_api)
                                              : sizeof(ct_quantizer_api);
    if (*(const size_t *)in->api < need) {
        fprintf(stderr, "ctitan: %s: plugin '%s' has an API table of %zu bytes; this host needs %zu: rebuild it\n",
                (*out)->path, in->name, *(const size_t *)in->api, need);
        return CT_ERR_INVALID;
    }
    manifest_add_plugin_schema(s->mf, section, in->options);
    return CT_OK;
}

/* The quantizer of the dense linear layers: the plugin quantize.dense.name names, its options the
 * section quantize.dense.NAME (*section), its switch that section's enable key (*enable_key). */
typedef struct quantizer_keys {
    const char *name;
    char section[160], enable_key[200], format_key[200];
} quantizer_keys;

static void dense_quantizer(const engine_settings *es, quantizer_keys *q) {
    q->name = es->quantizer_name;
    snprintf(q->section, sizeof q->section, "quantize.dense.%.100s", q->name);
    snprintf(q->enable_key, sizeof q->enable_key, "%s.enable", q->section);
    snprintf(q->format_key, sizeof q->format_key, "%s.format", q->section);
}

const char *session_quant_format_key(const session *s, char *out, size_t len) {
    quantizer_keys q;
    dense_quantizer(&s->cfg, &q);
    snprintf(out, len, "%s", q.format_key);
    return out;
}

const char *session_quant_recipe(const session *s, char *out, size_t len) {
    const ct_search_knob *list = s->quantp ? plugin_knobs(&s->quantp->info) : NULL;
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; list && CT_AT(const ct_search_knob, list, i)->key && at < len; i++) {
        const ct_search_knob *k = CT_AT(const ct_search_knob, list, i);
        const char *v = NULL;
        if (strchr(k->key, '.') || !k->values || !strcmp(k->values, "false|true") ||
            s->quantp->host.opt_string(&s->quantp->host, k->key, &v) != CT_OK || !v || !v[0])
            continue; /* another section's, a switch, or not a string */
        at += (size_t)snprintf(out + at, len - at, "%s%s", at ? " " : "", v);
    }
    return out;
}

int session_quant_gathers(const ct_quantizer_api *qapi, ct_quantizer *q) {
    return qapi && q && CT_HAS_FIELD(qapi, ct_quantizer_api, gather_quantized) && qapi->gather_quantized &&
           qapi->gather_quantized(q);
}

/* The quantizer runs when its enable key is true or torchtitan's spellings ask for it (they become
 * its keys first: config/torchtitan_keys.c). */
static int quantizer_requested(manifest *mf, const quantizer_keys *q) {
    int on = 0;
    mf_get_bool(mf, q->enable_key, &on);
    return tt_dense_quantizer_requested(mf) || on;
}

/* The option lists of plugins this run names but may not create, so that one manifest validates
 * the same on 1 rank, on N and under --dry-run: the data-parallel strategy (under "auto" both that
 * it can pick), the pipeline schedule and runner, the dense quantizer, and the comm plugin when a
 * comm key is not known yet (the comm plugin links MPI, which a 1-rank run does not load).
 * Each is loaded (a name that does not load is an error at its key), its options join the schema,
 * and it is unloaded; the plugins the run creates are loaded again, later, as before. */
static ct_status add_option_lists(session *s, manifest *mf) {
    static const struct {
        const char *section, *key, *dflt;
        ct_plugin_kind kind;
    } named[] = {
        {"parallelism", "parallelism.dp_strategy", "auto", CT_KIND_STRATEGY},
        {"parallelism", "parallelism.pipeline_runner", "pp", CT_KIND_PIPELINE},
        {"comm", "comm.name", "mpi", CT_KIND_COMM},
    };
    char where[600];
    plugin *p;
    ct_status st;
    const char *given[] = {s->cfg.strategies.role[STRATEGY_KEY_DP], s->cfg.pp.runner, s->cfg.comm_name};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        const char *name = given[i] ? given[i] : named[i].dflt;
        if (named[i].kind == CT_KIND_COMM && (s->commp || !manifest_has_unknown(mf, "comm."))) continue;
        const char *names[2] = {name, NULL};
        if (named[i].kind == CT_KIND_STRATEGY && !strcmp(name, "auto"))
            names[0] = strategy_dp_auto[0], names[1] = strategy_dp_auto[1];
        if (named[i].kind == CT_KIND_STRATEGY && !strcmp(name, "none")) names[0] = NULL;
        for (int k = 0; k < 2 && names[k]; k++) {
            if (named[i].kind == CT_KIND_STRATEGY && session_dp_strategy(s) &&
                !strcmp(names[k], session_dp_strategy(s)->info.name))
                continue; /* loaded for this run: its options are in */
            if ((st = load_named(s, named[i].section, named[i].key, names[k], named[i].kind, &p))) return st;
            plugin_unload(p);
        }
    }
    quantizer_keys q; /* the dense quantizer's options, when this run does not create it */
    dense_quantizer(&s->cfg, &q);
    if (!s->quantp) {
        if ((st = load_named(s, q.section, q.enable_key, q.name, CT_KIND_QUANTIZER, &p))) return st;
        plugin_unload(p);
    }
    const char *sched = s->cfg.pp.schedule; /* by its own loader: schedule names are normalized */
    if (!(p = schedule_load(sched, mf))) {
        mf_where(mf, "parallelism.pipeline_parallel_schedule", where, sizeof where);
        fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
        return CT_ERR_INVALID;
    }
    manifest_add_plugin_schema(mf, "parallelism", p->info.options);
    plugin_unload(p);
    return CT_OK;
}

static ct_status load_slot(session *s, const char *section, const char *name, ct_plugin_kind kind, plugin **out) {
    char key[64];
    snprintf(key, sizeof key, "%s.name", section);
    return load_named(s, section, key, name, kind, out);
}

static ct_status fail_line(ct_status status, const char *what) {
    fprintf(stderr, "ctitan: %s: %s\n", what, ct_last_error()[0] ? ct_last_error() : "failed");
    return status;
}

/* A plugin's create failed. An error that starts with one of its own option keys ("n_layers: ...")
 * is reported where that key was set; any other where `key` was. */
static ct_status fail_plugin(const session *s, ct_status status, const plugin *p, const char *section,
                             const char *key) {
    char where[600], full[512];
    const char *msg = ct_last_error(), *name = p->info.name ? p->info.name : "plugin";
    size_t nl = strlen(name);
    const char *body = strncmp(msg, name, nl) == 0 && msg[nl] == ':' && msg[nl + 1] == ' ' ? msg + nl + 2 : "";
    for (int i = 0; p->info.options && CT_AT(const ct_option_spec, p->info.options, i)->key; i++) {
        const ct_option_spec *o = CT_AT(const ct_option_spec, p->info.options, i); /* by struct_size */
        size_t kl = strlen(o->key);
        if (strncmp(body, o->key, kl) || body[kl] != ':' || body[kl + 1] != ' ') continue;
        snprintf(full, sizeof full, "%s.%s", section, o->key);
        mf_where(s->mf, full, where, sizeof where);
        fprintf(stderr, "ctitan: %s: %s: %s\n", where, name, body + kl + 2);
        return status;
    }
    /* "tensor_parallel_degree: ..." from a strategy: another key of its section, where it was set */
    const char *colon = strstr(body, ": ");
    const char *v;
    if (colon && colon > body && (size_t)(colon - body) < 128 && !memchr(body, ' ', (size_t)(colon - body)) &&
        snprintf(full, sizeof full, "%s.%.*s", section, (int)(colon - body), body) < (int)sizeof full &&
        mf_get_str(s->mf, full, &v) == 0) {
        mf_where(s->mf, full, where, sizeof where);
        fprintf(stderr, "ctitan: %s: %s: %s\n", where, name, colon + 2);
        return status;
    }
    mf_where(s->mf, key, where, sizeof where);
    return fail_line(status, where);
}

const plugin *session_dp_strategy(const session *s) {
    for (int i = 0; i < s->strategies.n; i++)
        if (s->strategies.item[i].serves == CT_SERVES_DATA_PARALLEL) return s->strategyp[i];
    return NULL;
}

/* Item i's strategy is created in this job (loaded, and on the mesh: an axis's where its degree is > 1). */
static int strategy_on(const session *s, int i) {
    return s->strategyp[i] && strategy_on_mesh(&s->strategies.item[i], &s->mesh);
}

/* Joins the job, builds the mesh and creates the strategies. */
/* Plans the pipeline (pp > 1) once the mesh exists; idempotent. */
static ct_status plan_pipeline(session *s, const ct_model_desc *d) {
    if (s->pl || s->mesh.degree[CT_AXIS_PP] <= 1) return CT_OK;
    if (!(s->pl = calloc(1, sizeof *s->pl))) return CT_ERR_NOMEM;
    return pipeline_plan(s->pl, &s->cfg.pp, s->mf, d, &s->mesh, s->m->unit_name, s->model);
}

static ct_status open_dist(session *s, const ct_model_desc *d) {
    ct_clear_error();
    if (s->commp) {
        s->capi = s->commp->info.api;
        ct_comm_group *world;
        ct_status cst = s->capi->create(&s->commp->host, &s->comm);
        if (cst != CT_OK) /* CT_ERR_INVALID: one of its options */
            return fail_line(cst, "comm");
        if (s->capi->world(s->comm, &world) != CT_OK || s->capi->group_rank(s->comm, world, &s->rank, &s->world) != CT_OK)
            return fail_line(CT_ERR_INTERNAL, "comm");
        log_set_rank(s->rank, s->world);
        /* ABI 1.4: a device with its own stream and a comm that orders itself against it by events
         * (CUDA + NCCL) overlap compute and communication; otherwise both keep implicit ordering */
        if (CT_HAS_FIELD(s->capi, ct_comm_api, bind_stream) && s->capi->bind_stream &&
            CT_HAS_FIELD(s->d, ct_device_api, share_stream) && s->d->share_stream) {
            ct_stream *stream = NULL;
            if (s->d->share_stream(s->dev, &stream) != CT_OK) return fail_line(CT_ERR_INTERNAL, "device");
            if (s->capi->bind_stream(s->comm, stream) != CT_OK) return fail_line(CT_ERR_INTERNAL, "comm");
        }
    } else {
        s->rank = 0;
        s->world = 1;
    }
    int degree[CT_MESH_NAXES];
    if (mesh_degrees(&s->cfg.mesh, s->mf, s->world, degree) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    int ep = 1;
    if (mesh_ep_degree(&s->cfg.mesh, s->mf, degree, &ep) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    if (mesh_build(&s->mesh, s->commp ? s->capi : NULL, s->comm, s->rank, s->world, degree, ep) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INTERNAL;
    }
    if (strategy_list_cover(s->mf, &s->strategies, &s->mesh) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    const plugin *first = session_dp_strategy(s); /* the one the refusal below names: data parallel's first */
    for (int i = 0; i < s->strategies.n && !first; i++)
        if (strategy_on(s, i)) first = s->strategyp[i];
    if (!first) return CT_OK;
    if (!s->commp) {
        fprintf(stderr, "ctitan: parallelism: strategy '%s' needs several ranks (launch with ctitan launch -n N)\n",
                first->info.name);
        return CT_ERR_INVALID;
    }
    const char *mp = s->cfg.mixed_precision_param;
    int64_t seq_len = s->cfg.seq_len;
    /* strategies talk through the counting table, so the metrics report their bytes */
    /* the plan is an optional field of the model's table: read only where the table holds it */
    const ct_tp_rule *plan = CT_HAS_FIELD(s->m, ct_model_api, tp_plan) ? s->m->tp_plan : NULL;
    if (CT_HAS_FIELD(s->m, ct_model_api, get_tp_plan) && s->m->get_tp_plan) /* ABI 2.1: the instance's */
        plan = s->m->get_tp_plan(s->model);
    ct_status pst = plan_pipeline(s, d); /* the strategies learn whether its schedule splits backward */
    if (pst) return pst;
    ct_strategy_env env = {sizeof env, s->d, s->dev, commstats_wrap(s->capi), s->comm, &s->mesh,
                           strcmp(mp, "bfloat16") == 0, session_quant_gathers(s->qapi, s->quant), plan, d, seq_len,
                           s->qapi != NULL, 0,
                           s->pl && pipeline_splits_backward(s->pl)};
    for (int i = 0; i < s->strategies.n; i++) {
        if (!strategy_on(s, i)) continue;
        const strategy_item *it = &s->strategies.item[i];
        s->strategy_api[i] = s->strategyp[i]->info.api;
        ct_clear_error();
        if (s->strategy_api[i]->create(&s->strategyp[i]->host, &env, &s->strategy[i]) == CT_OK) continue;
        /* an axis's strategy is refused where its degree was set; the data-parallel one as a whole */
        return it->serves == CT_SERVES_AXIS
                   ? fail_plugin(s, CT_ERR_INVALID, s->strategyp[i], "parallelism", strategy_degree_key(it->axis))
                   : fail_line(CT_ERR_INVALID, "parallelism");
    }
    return CT_OK;
}

/* The strategies of the list (engine/strategies.h), each loaded and told what it serves; the data-parallel
 * pick first (its errors come first) and only for a run (it needs the job's size), the others always, so
 * their keys are validated even where their degree is 1. */
static ct_status load_strategies(session *s, manifest *mf, int env_world, int with_params) {
    strategy_list *l = &s->strategies;
    ct_status st = strategy_list_read(&s->cfg, mf, env_world, with_params, l);
    for (int pass = 0; pass < 2 && st == CT_OK; pass++)
        for (int i = 0; i < l->n && st == CT_OK; i++) {
            strategy_item *it = &l->item[i];
            if ((it->serves == CT_SERVES_DATA_PARALLEL && !strcmp(it->key, "parallelism.dp_strategy")) != (pass == 0))
                continue;
            if ((st = load_named(s, "parallelism", it->key, it->name, CT_KIND_STRATEGY, &s->strategyp[i]))) return st;
            st = strategy_resolve(mf, it, s->strategyp[i]->info.api, s->strategyp[i]->info.name);
        }
    if (st == CT_OK) st = strategy_list_check(mf, l);
    if (st != CT_OK) fprintf(stderr, "ctitan: %s\n", ct_last_error());
    return st;
}

/* Loads every plugin the manifest names (the axes' strategies in every run, see load_strategies; the
 * option lists of the others it may not create, see add_option_lists) and validates the manifest
 * against the core's and their keys. */
static ct_status load_plugins(session *s, manifest *mf, int with_params) {
    ct_status st;
    if ((st = launch_check_world())) return st; /* torchrun or srun without an MPI job: before MPI sets its variables */
    if ((st = load_slot(s, "device", s->cfg.device_name, CT_KIND_DEVICE, &s->devp))) return st;
    if ((st = load_slot(s, "model", s->cfg.model_name, CT_KIND_MODEL, &s->modelp))) return st;
    if ((st = load_slot(s, "optimizer", s->cfg.optimizer_name, CT_KIND_OPTIMIZER, &s->optp))) return st;
    int env_world = mesh_env_world_size();
    if (with_params && env_world > 1 && (st = load_slot(s, "comm", s->cfg.comm_name, CT_KIND_COMM, &s->commp)))
        return st;
    if ((st = load_strategies(s, mf, env_world, with_params))) return st;
    quantizer_keys q;
    dense_quantizer(&s->cfg, &q);
    snprintf(s->quant_section, sizeof s->quant_section, "%s", q.section); /* the plugin keeps the pointer */
    if (quantizer_requested(mf, &q) &&
        (st = load_named(s, s->quant_section, q.enable_key, q.name, CT_KIND_QUANTIZER, &s->quantp)))
        return st;
    if ((st = add_option_lists(s, mf))) return st;
    if (manifest_validate(mf) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    s->d = devcheck_wrap(s->devp->info.api, &s->devp->host); /* every op's arguments checked here */
    s->m = s->modelp->info.api;
    s->o = s->optp->info.api;
    return CT_OK;
}

/* torchtitan's flavors for its attention backends (debugmodel_flex_attn, debugmodel_varlen_attn,
 * 8B_flex, 8B_varlen): the base flavor with block-causal attention, unless the pack has a flavor of
 * that very name. Returns the name to give the pack (s->flavor or `flavor`). */
static const char *base_flavor(session *s, const char *flavor) {
    static const char *const suffix[] = {"_flex_attn", "_varlen_attn", "_flex", "_varlen"};
    for (const char *const *f = s->m->flavors; f && *f; f++)
        if (!strcmp(*f, flavor)) return flavor;
    size_t n = strlen(flavor);
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        size_t k = strlen(suffix[i]);
        if (n > k && n - k < sizeof s->flavor && !strcmp(flavor + n - k, suffix[i])) {
            memcpy(s->flavor, flavor, n - k);
            s->flavor[n - k] = 0;
            s->flavor_doc = 1;
            return s->flavor;
        }
    }
    return flavor;
}

/* The model pack on the training sequence length. */
static ct_status create_model(session *s, manifest *mf) {
    char where[600];
    int64_t seq_len = s->cfg.seq_len;
    const char *flavor = s->cfg.flavor;
    if (seq_len < 1) {
        mf_where(mf, "training.seq_len", where, sizeof where);
        fprintf(stderr, "ctitan: %s: must be positive\n", where);
        return CT_ERR_INVALID;
    }
    /* from_checkpoint with a description that names no flavor (a Hugging Face folder's): its options
     * set every size, so the pack's first flavor only fills what they leave */
    if (!strcmp(flavor, "from_checkpoint") && s->m->flavors && s->m->flavors[0]) flavor = s->m->flavors[0];
    flavor = base_flavor(s, flavor);
    ct_model_config cfg = {sizeof cfg, flavor, seq_len};
    ct_clear_error();
    if (s->m->create(&s->modelp->host, &cfg, &s->model) != CT_OK)
        return fail_plugin(s, CT_ERR_INVALID, s->modelp, "model", "model.flavor");
    return CT_OK;
}

/* The device, then the model. */
static ct_status create_device_and_model(session *s, manifest *mf) {
    ct_clear_error();
    if (s->d->create(&s->devp->host, &s->dev) != CT_OK)
        return fail_plugin(s, CT_ERR_INVALID, s->devp, "device", "device.name");
    return create_model(s, mf);
}

static ct_status create_quantizer(session *s, manifest *mf) {
    char where[600];
    if (!s->quantp) return CT_OK;
    s->qapi = s->quantp->info.api;
    ct_clear_error();
    if (s->qapi->create(&s->quantp->host, s->d, s->dev, &s->quant) != CT_OK) {
        quantizer_keys q; /* refused at its format */
        dense_quantizer(&s->cfg, &q);
        mf_where(mf, q.format_key, where, sizeof where);
        return fail_line(CT_ERR_INVALID, where);
    }
    return CT_OK;
}

/* The mesh and strategies, the pipeline plan, then the runtime: parameters placed, allocated and
 * initialised, the builder wrapped by the op-level strategies. */
static ct_status build_runtime(session *s, manifest *mf) {
    ct_status st;
    ct_model_desc d; /* what the strategies and the pipeline plan read */
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    ct_clear_error();
    if (s->m->describe(s->model, &d) != CT_OK) return fail_line(CT_ERR_INVALID, "model");
    if ((st = open_dist(s, &d))) return st;
    if ((st = plan_pipeline(s, &d))) return st; /* (open_dist planned it when strategies were made) */
    runtime_dist dist = {s->capi, s->comm, &s->mesh, {0}, {0}, 0, s->pl ? s->pl->unit_rank : NULL, {0}};
    for (int i = 0; i < s->strategies.n; i++) /* in the order they wrap the builder */
        if (s->strategy[i]) {
            dist.st[dist.n_st] = s->strategy_api[i];
            dist.axis[dist.n_st] = s->strategies.item[i].axis;
            dist.strat[dist.n_st++] = s->strategy[i];
        }
    int64_t seed = s->cfg.seed;
    st = runtime_init(&s->rt, s->d, s->dev, s->m, s->model, (uint64_t)seed, s->commp ? &dist : NULL);
    if (st != CT_OK) { /* CT_ERR_INVALID: refused declarations, or too large */
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return st;
    }
    s->rt_ready = 1;
    s->rt.coll_capi = s->capi ? commstats_wrap(s->capi) : NULL;
    s->rt.qapi = s->qapi; /* (its layer goes in first, under the strategies') */
    s->rt.quant = s->quant;
    s->rt.quant_name = s->quantp ? s->quantp->info.name : NULL;
    if (runtime_wrap_builder(&s->rt) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    if (s->pl && (st = pipeline_start(s->pl, &s->cfg.pp, mf, &s->rt, commstats_wrap(s->capi), s->comm, &s->mesh))) return st;
    if (s->qapi) quantize_decide_linears(&s->rt);
    return CT_OK;
}

/* Activation checkpointing and the parameters' precision (bf16 GEMM operands where the device
 * offers them; unsupported leaves matmul exact on the bf16-rounded parameters, as the CPU computes). */
static ct_status set_compute_modes(session *s, manifest *mf) {
    char where[600];
    const char *mode = s->cfg.ac_mode, *option = s->cfg.ac_option, *mp = s->cfg.mixed_precision_param;
    if (runtime_set_ac(&s->rt, mode, option) != CT_OK) { /* under selective, the option was bad */
        const char *key = strcmp(mode, "selective") ? "activation_checkpoint.mode"
                                                    : "activation_checkpoint.selective_ac_option";
        mf_where(mf, key, where, sizeof where);
        fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
        return CT_ERR_INVALID;
    }
    int64_t offload = s->cfg.offload_layers;
    if (offload && s->pl) {
        mf_where(mf, "activation_offload.layers", where, sizeof where);
        fprintf(stderr, "ctitan: %s: not with pipeline parallel yet (its microbatches interleave; use 0)\n", where);
        return CT_ERR_INVALID;
    }
    ct_clear_error();
    if (runtime_offload_set(&s->rt, (int)offload) != CT_OK) {
        mf_where(mf, "activation_offload.layers", where, sizeof where);
        fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
        return CT_ERR_INVALID;
    }
    if (strcmp(mp, "bfloat16") && strcmp(mp, "float32")) {
        mf_where(mf, "training.mixed_precision_param", where, sizeof where);
        fprintf(stderr, "ctitan: %s: expected float32 or bfloat16, got '%s'\n", where, mp);
        return CT_ERR_INVALID;
    }
    if (strcmp(mp, "bfloat16")) return CT_OK;
    if (runtime_enable_bf16_params(&s->rt) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INTERNAL;
    }
    ct_clear_error();
    if (CT_HAS_FIELD(s->d, ct_device_api, set_matmul_dtype) && s->d->set_matmul_dtype) {
        ct_status mst = s->d->set_matmul_dtype(s->dev, CT_BF16);
        if (mst != CT_OK && mst != CT_ERR_UNSUPPORTED) return fail_line(CT_ERR_INTERNAL, "device");
        if (mst == CT_OK) s->matmul_precision = "bf16";
        ct_clear_error();
    }
    return CT_OK;
}

/* model.attn_mask_type (or a *_flex_attn / *_varlen_attn flavor): block_causal takes the document
 * boundaries from the tokenizer's EOS, which the tokenizer named by model.tokenizer_path (or
 * model.hf_assets_path) must have. */
static ct_status set_attention_mask(session *s, manifest *mf) {
    char where[600];
    const char *mask = s->cfg.attn_mask_type, *rope = s->cfg.rope_positions;
    int explicit_mask = s->cfg.attn_mask_set;
    if (s->flavor_doc && explicit_mask && strcmp(mask, "block_causal")) {
        mf_where(mf, "model.attn_mask_type", where, sizeof where);
        fprintf(stderr, "ctitan: %s: '%s', but model.flavor '%s_...' is one of torchtitan's block-causal flavors: "
                        "expected block_causal, or the flavor '%s'\n", where, mask, s->flavor, s->flavor);
        return CT_ERR_INVALID;
    }
    int block = s->flavor_doc || !strcmp(mask, "block_causal");
    if (!block) {
        if (strcmp(rope, "sequence")) {
            mf_where(mf, "model.rope_positions", where, sizeof where);
            fprintf(stderr, "ctitan: %s: '%s' needs model.attn_mask_type block_causal (documents to restart at)\n",
                    where, rope);
            return CT_ERR_INVALID;
        }
        return CT_OK;
    }
    const char *key = s->cfg.attn_mask_set ? "model.attn_mask_type" : "model.flavor";
    mf_where(mf, key, where, sizeof where);
    if (!CT_HAS_FIELD(s->d, ct_device_api, attention_doc_backward) || !s->d->attention_doc_forward ||
        !s->d->attention_doc_backward) {
        fprintf(stderr, "ctitan: %s: block_causal needs the device's attention_doc_forward/backward (ABI 2.13), "
                        "which device '%s' lacks\n", where, s->devp->info.name);
        return CT_ERR_INVALID;
    }
    if (!strcmp(rope, "document")) {
        mf_where(mf, "model.rope_positions", where, sizeof where);
        if (s->mesh.degree[CT_AXIS_CP] > 1) {
            fprintf(stderr, "ctitan: %s: document positions are not available with context parallel "
                            "(parallelism.context_parallel_degree > 1), whose RoPE takes the sequence's: use sequence\n",
                    where);
            return CT_ERR_INVALID;
        }
        if (!s->d->rope_forward_pos || !s->d->rope_backward_pos || !s->d->rope_freqs_forward ||
            !s->d->rope_backward_general) {
            /* the checking layer offers a narrow op where the device can run that case of the general op */
            fprintf(stderr, "ctitan: %s: document positions need the device's RoPE at explicit positions (ABI 2.3, "
                            "2.4), which device '%s' lacks\n", where, s->devp->info.name);
            return CT_ERR_INVALID;
        }
        s->rt.rope_doc = 1;
    }
    const char *tok_path = s->cfg.tokenizer_path, *hf = s->cfg.hf_assets_path;
    if ((!tok_path || !*tok_path) && (!hf || !*hf)) {
        fprintf(stderr, "ctitan: %s: block_causal takes document boundaries from the tokenizer's EOS token: set "
                        "model.tokenizer_path (or model.hf_assets_path) to the tokenizer the data was made with\n",
                where);
        return CT_ERR_INVALID;
    }
    ct_tokenizer *tok = NULL;
    ct_status st = session_open_tokenizer(s, &tok);
    if (st != CT_OK) return st;
    int32_t eos = tokenizer_eos_id(tok);
    tokenizer_free(tok);
    if (eos < 0) {
        mf_where(mf, s->cfg.tokenizer_path_set ? "model.tokenizer_path" : "model.hf_assets_path", where,
                 sizeof where);
        fprintf(stderr, "ctitan: %s: the tokenizer has no EOS token, which block_causal (model.attn_mask_type) needs to "
                        "tell where a document ends\n", where);
        return CT_ERR_INVALID;
    }
    s->rt.doc_eos = eos;
    return CT_OK;
}

/* ABI 2.1: on many ranks the optimizer gets the comm and mesh the strategies get (Muon gathers
 * whole matrices over the groups a slot is sharded or split over). */
static ct_status attach_optimizer(session *s) {
    if (!s->commp || s->world <= 1 || !CT_HAS_FIELD(s->o, ct_optimizer_api, attach) || !s->o->attach) return CT_OK;
    ct_optimizer_env env = {sizeof env, commstats_wrap(s->capi), s->comm, &s->mesh};
    ct_clear_error();
    if (s->o->attach(s->opt, &env) != CT_OK)
        return fail_plugin(s, CT_ERR_INVALID, s->optp, "optimizer", "optimizer.name");
    return CT_OK;
}

/* The optimizer and its states: one zeroed allocation of n_state values per local element. */
static ct_status create_optimizer(session *s) {
    ct_clear_error();
    if (s->o->create(&s->optp->host, s->d, s->dev, &s->opt) != CT_OK)
        return fail_plugin(s, CT_ERR_INVALID, s->optp, "optimizer", "optimizer.name");
    s->n_state = s->o->state_count(s->opt);
    if (s->n_state < 0 || s->n_state > 8) {
        fprintf(stderr, "ctitan: optimizer '%s' asks for %d state values per element\n", s->optp->info.name,
                s->n_state);
        return CT_ERR_INTERNAL;
    }
    s->opt_bytes = s->rt.param_bytes * (size_t)s->n_state;
    if (!s->opt_bytes) return CT_OK;
    if (s->d->alloc(s->dev, s->opt_bytes, (void **)&s->opt_mem) != CT_OK ||
        s->d->zero(s->dev, s->opt_mem, s->opt_bytes) != CT_OK) {
        fprintf(stderr, "ctitan: cannot allocate %zu bytes of optimizer state\n", s->opt_bytes);
        return CT_ERR_NOMEM;
    }
    mem_account(CT_MEM_OPTIMIZER, (int64_t)s->opt_bytes);
    return attach_optimizer(s);
}

ct_status session_open(session *s, manifest *mf, int with_params, int with_optimizer) {
    ct_status st;
    memset(s, 0, sizeof *s);
    s->mf = mf;
    engine_settings_read(mf, &s->cfg);
    if ((st = load_plugins(s, mf, with_params)) || (st = create_device_and_model(s, mf)))
        return st;
    if (!with_params) return CT_OK;
    if ((st = create_quantizer(s, mf)) || (st = build_runtime(s, mf)) || (st = set_compute_modes(s, mf)) ||
        (st = set_attention_mask(s, mf)))
        return st;
    return with_optimizer ? create_optimizer(s) : CT_OK;
}

void session_close(session *s) {
    if (s->opt_mem) {
        s->d->free(s->dev, s->opt_mem);
        mem_account(CT_MEM_OPTIMIZER, -(int64_t)s->opt_bytes);
    }
    if (s->opt) s->o->destroy(s->opt);
    if (s->pl) {
        pipeline_free(s->pl);
        free(s->pl);
    }
    if (s->rt_ready) runtime_free(&s->rt);
    for (int i = s->strategies.n - 1; i >= 0; i--) /* the last made first */
        if (s->strategy[i]) s->strategy_api[i]->destroy(s->strategy[i]);
    if (s->quant) s->qapi->destroy(s->quant);
    mesh_free(&s->mesh, s->comm ? s->capi : NULL, s->comm);
    if (s->comm) s->capi->destroy(s->comm);
    if (s->model) s->m->destroy(s->model);
    if (s->dev) s->d->destroy(s->dev);
    for (int i = 0; i < s->strategies.n; i++) plugin_unload(s->strategyp[i]);
    plugin_unload(s->quantp);
    plugin_unload(s->commp);
    plugin_unload(s->optp);
    plugin_unload(s->modelp);
    plugin_unload(s->devp);
    manifest_free(s->mf);
    memset(s, 0, sizeof *s);
}

int session_buffers(const session *s, const ct_model_buffer **out) {
    *out = NULL;
    if (!s->m || !s->model || !CT_HAS_FIELD(s->m, ct_model_api, buffers) || !s->m->buffers) return 0;
    int n = s->m->buffers(s->model, out);
    if (n <= 0 || !*out) *out = NULL;
    return *out ? n : 0;
}

int session_buffer_saved_here(const session *s, const ct_model_buffer *b) {
    if (!s->capi) return 1;
    for (int a = 0; a < CT_MESH_NAXES; a++)
        if (a != CT_AXIS_PP && s->mesh.coord[a] != 0) return 0;
    return !s->rt.dist.unit_rank || s->rt.dist.unit_rank[b->unit] == s->mesh.coord[CT_AXIS_PP];
}

ct_status session_buffer_get(session *s, const ct_model_buffer *b, float *host) {
    memcpy(host, b->data, sizeof(float) * (size_t)b->numel);
    return s->capi ? runtime_stage_broadcast(&s->rt, b->unit, host, b->numel) : CT_OK;
}

/* The file's copy of each buffer, where it holds one (a file written before the pack had buffers leaves
 * them as the pack made them). */
static ct_status load_buffers(session *s, const tf_file *f, const char *path) {
    const ct_model_buffer *b;
    int n = session_buffers(s, &b);
    for (int i = 0; i < n; i++) {
        if (!tf_find(f, b[i].name)) continue;
        const tf_entry *e = tf_expect(f, path, b[i].name, 1, 1, &b[i].numel);
        if (!e || tf_check_finite_data(e->data, e->numel, path, b[i].name) != CT_OK) return CT_ERR_INVALID;
        memcpy(b[i].data, e->data, sizeof(float) * (size_t)b[i].numel);
    }
    return CT_OK;
}

ct_status session_load_model(session *s, const char *path) {
    tf_file *f = tf_read(path);
    if (!f) return CT_ERR_INVALID;
    if (tf_check_finite(f, path) != CT_OK) {
        tf_free(f);
        return CT_ERR_INVALID;
    }
    if (f->version < 2 && s->rank == 0) /* read, as before checksums: say so once */
        printf("model: note: %s: format version %d has no checksums: its data cannot be verified\n", path, f->version);
    for (int i = 0; i < s->rt.n_params; i++) {
        ct_tensor *t = &s->rt.params[i]->t;
        const tf_entry *e =
            tf_expect(f, path, runtime_param_key(&s->rt, i), 1, t->ndim, runtime_global_shape(&s->rt, i));
        if (!e) {
            tf_free(f);
            return CT_ERR_INVALID;
        }
        if (runtime_param_set(&s->rt, i, e->data) != CT_OK) {
            tf_free(f);
            return CT_ERR_INTERNAL;
        }
    }
    ct_status st = load_buffers(s, f, path);
    tf_free(f);
    return st;
}

/* Picks the next token from logits (V): greedy at temperature 0, else top-k sampling. */
static int desc_by_value(const void *a, const void *b, void *ctx) {
    const float *l = ctx;
    float x = l[*(const int32_t *)a], y = l[*(const int32_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Picks the next token from logits (V): greedy at temperature 0, else sampling among the top_k most
 * likely tokens (0: all) and within them the smallest set holding top_p of the probability. */
static int32_t sample(float *logits, int64_t V, double temperature, int64_t top_k, double top_p, uint64_t key,
                      uint64_t i) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return (int32_t)best;
    int32_t *order = malloc(sizeof(int32_t) * (size_t)V);
    double *p = malloc(sizeof(double) * (size_t)V);
    if (!order || !p) {
        free(order);
        free(p);
        return (int32_t)best;
    }
    for (int64_t v = 0; v < V; v++) order[v] = (int32_t)v;
    qsort_r(order, (size_t)V, sizeof(int32_t), desc_by_value, logits);
    int64_t k = top_k > 0 && top_k < V ? top_k : V;
    double total = 0;
    for (int64_t j = 0; j < k; j++) total += p[j] = exp((logits[order[j]] - logits[order[0]]) / temperature);
    if (top_p > 0 && top_p < 1) { /* nucleus: keep the head of the distribution up to top_p */
        double acc = 0;
        int64_t keep = 0;
        while (keep < k && acc < top_p * total) acc += p[keep++];
        k = keep > 0 ? keep : 1;
        total = acc;
    }
    double r = rng_uniform(key, i) * total, acc = 0;
    int32_t pick = order[k - 1];
    for (int64_t j = 0; j < k; j++) {
        acc += p[j];
        if (acc >= r) {
            pick = order[j];
            break;
        }
    }
    free(order);
    free(p);
    return pick;
}

ct_status session_open_tokenizer(session *s, ct_tokenizer **out) {
    const char *tok_path, *key = "model.tokenizer_path";
    char path[4096], where[600];
    *out = NULL;
    /* torchtitan's model.hf_assets_path (a Hub folder) is read when no tokenizer_path names a file */
    if (!(tok_path = s->cfg.tokenizer_path) || !*tok_path) {
        key = "model.hf_assets_path";
        if (!(tok_path = s->cfg.hf_assets_path) || !*tok_path) {
            mf_where(s->mf, "model.tokenizer_path", where, sizeof where);
            fprintf(stderr, "ctitan: %s: not set, nor model.hf_assets_path; sampling (generate.max_new_tokens > 0) "
                            "needs a tokenizer (tokenizer.json, tokenizer.model or a folder holding one)\n", where);
            return CT_ERR_INVALID;
        }
    }
    session_resolve_path(s->mf, tok_path, path, sizeof path);
    ct_tokenizer *tok = tokenizer_load(path);
    mf_where(s->mf, key, where, sizeof where);
    if (!tok) {
        fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
        return CT_ERR_INVALID;
    }
    /* every id it can produce (the specials last) must be a row of the model's embedding */
    int64_t V = s->rt.desc.vocab_size;
    if (V > 0 && tokenizer_vocab_size(tok) > V) {
        fprintf(stderr, "ctitan: %s: %s has %d tokens (its highest id + 1, specials included) but the model's vocabulary is %lld; "
                        "expected a tokenizer of at most model.vocab_size tokens\n",
                where, path, tokenizer_vocab_size(tok), (long long)V);
        tokenizer_free(tok);
        return CT_ERR_INVALID;
    }
    if (tokenizer_notice(tok) && s->rank == 0) printf("tokenizer: note: %s\n", tokenizer_notice(tok));
    *out = tok;
    return CT_OK;
}

/* The prompt of a sample: text (encoded after BOS, and printed before the sample), or a chat
 * template's ids (as they are) with the end-of-turn token that ends the reply, which alone is printed. */
typedef struct gen_prompt {
    const char *text;
    const int32_t *ids;
    size_t n;
    int32_t stop; /* -1: none (the EOS ends a sample either way) */
} gen_prompt;

static ct_status generate(session *s, const ct_tokenizer *tok, const gen_prompt *gp, int64_t max_new,
                          double temperature, int64_t top_k, double top_p, uint64_t seed, int64_t max_context);

ct_status session_generate(session *s, const ct_tokenizer *tok, const char *prompt, int64_t max_new, double temperature,
                     int64_t top_k, double top_p, uint64_t seed, int64_t max_context) {
    gen_prompt gp = {.text = prompt, .stop = -1};
    return generate(s, tok, &gp, max_new, temperature, top_k, top_p, seed, max_context);
}

ct_status session_generate_chat(session *s, const ct_tokenizer *tok, const int32_t *prompt, size_t n, int32_t stop,
                                int64_t max_new, double temperature, int64_t top_k, double top_p, uint64_t seed,
                                int64_t max_context) {
    gen_prompt gp = {.ids = prompt, .n = n, .stop = stop};
    return generate(s, tok, &gp, max_new, temperature, top_k, top_p, seed, max_context);
}

static ct_status generate(session *s, const ct_tokenizer *tok, const gen_prompt *gp, int64_t max_new,
                          double temperature, int64_t top_k, double top_p, uint64_t seed, int64_t max_context) {
    int32_t *ids = NULL, *ctx = NULL;
    float *logits = NULL;
    size_t n = 0, cap = 0, logit_bytes;
    int64_t V = s->rt.desc.vocab_size;
    ct_status rc = CT_ERR_INTERNAL; /* until the text is out */
    /* every size from the manifest is checked: max_new may be anything up to INT64_MAX */
    if (max_new < 0 || max_context < 1 || V < 1 ||
        __builtin_mul_overflow((size_t)V, (size_t)max_context, &logit_bytes) ||
        __builtin_mul_overflow(logit_bytes, sizeof(float), &logit_bytes)) {
        fprintf(stderr, "ctitan: generate: bad sizes (max_new_tokens %lld, context %lld, vocabulary %lld)\n",
                (long long)max_new, (long long)max_context, (long long)V);
        return CT_ERR_INVALID;
    }
    logits = malloc(logit_bytes);
    if (!logits || (!gp->ids && tokenizer_encode(tok, gp->text, strlen(gp->text), 0, &ids, &n) != CT_OK)) {
        fprintf(stderr, "ctitan: generate: %s\n", logits ? ct_last_error() : "out of memory for the logits");
        goto done;
    }
    /* the context grows with what is sampled, so memory follows the tokens made, not max_new */
    cap = (size_t)(max_context < 64 ? 64 : max_context) + 1;
    if (!(ctx = malloc(sizeof(int32_t) * cap))) {
        fprintf(stderr, "ctitan: generate: out of memory\n");
        goto done;
    }
    int64_t len = 0;
    /* GPT-2 style tokenizers have no BOS: the sample is conditioned on the EOS that ends a document; a
     * chat template's ids hold what the template puts first */
    int32_t start = tokenizer_bos_id(tok) >= 0 ? tokenizer_bos_id(tok) : tokenizer_eos_id(tok);
    if (start >= 0 && !gp->ids) ctx[len++] = start;
    const int32_t *given = gp->ids ? gp->ids : ids;
    if (gp->ids) n = gp->n;
    if (gp->ids && (int64_t)n > max_context) { /* cut, it would lose the generation prompt at its end */
        fprintf(stderr, "ctitan: generate: the chat prompt is %zu tokens, more than the model's context of %lld "
                        "(training.seq_len); give a shorter prompt\n", n, (long long)max_context);
        rc = CT_ERR_INVALID;
        goto done;
    }
    for (size_t i = 0; i < n && len < max_context; i++) ctx[len++] = given[i];
    if (len == 0) {
        fprintf(stderr, "ctitan: generate: the prompt is empty and the tokenizer has no BOS or EOS token to start from; "
                        "give a prompt\n");
        rc = CT_ERR_INVALID;
        goto done;
    }
    int64_t first_new = len;
    int32_t ended = -1; /* the token that ended the sample, -1: max_new */
    uint64_t key = ct_util_splitmix64(seed ^ 0x5A3Bu);
    for (int64_t step = 0; step < max_new; step++) {
        int64_t T = len < max_context ? len : max_context;
        if (runtime_forward_logits(&s->rt, ctx + len - T, 1, T, logits) != CT_OK) {
            fprintf(stderr, "ctitan: generate: %s\n", ct_last_error());
            goto done;
        }
        /* no special token but the EOS (which ends the sample): the reserved ones an untrained model's
         * tail would give are not text, nor are rows past the tokenizer's vocabulary or ids that name
         * no token (a tokenizer.json may leave gaps) */
        float *last = logits + (T - 1) * V;
        for (int64_t v = 0; v < V; v++)
            if (v != tokenizer_eos_id(tok) && v != gp->stop &&
                (v >= tokenizer_vocab_size(tok) || tokenizer_is_special(tok, (int32_t)v) ||
                 !tokenizer_token_bytes(tok, (int32_t)v, NULL)))
                last[v] = -INFINITY;
        int32_t next = sample(last, V, temperature, top_k, top_p, key, (uint64_t)step);
        if (next == tokenizer_eos_id(tok) || next == gp->stop) {
            ended = next;
            break;
        }
        if ((size_t)len == cap) {
            size_t grown_cap;
            int32_t *grown = NULL;
            if (!__builtin_mul_overflow(cap, (size_t)2, &grown_cap) && grown_cap <= SIZE_MAX / sizeof(int32_t))
                grown = realloc(ctx, sizeof(int32_t) * grown_cap);
            if (!grown) {
                fprintf(stderr, "ctitan: generate: out of memory after %lld tokens\n", (long long)(len - first_new));
                goto done;
            }
            ctx = grown;
            cap = grown_cap;
        }
        ctx[len++] = next;
    }
    size_t out_len = 0;
    char *text = tokenizer_decode(tok, ctx + first_new, (size_t)(len - first_new), &out_len);
    if (!text) {
        fprintf(stderr, "ctitan: generate: %s\n", ct_last_error());
        goto done;
    }
    if (gp->ids) { /* a reply: how it ended, where a script reading stdout does not see it */
        size_t l = 0;
        const char *end = ended >= 0 ? tokenizer_token_bytes(tok, ended, &l) : NULL;
        fprintf(stderr, "generate: the reply: %lld tokens, ended by %.*s\n", (long long)(len - first_new),
                end ? (int)l : 29, end ? end : "generate.max_new_tokens");
    }
    if (!gp->ids) printf("%s", gp->text);
    fwrite(text, 1, out_len, stdout);
    printf("\n");
    free(text);
    rc = CT_OK;
done:
    free(ids);
    free(ctx);
    free(logits);
    return rc;
}

/* The planner's session (core/plan): the plugins loaded and the manifest validated as for a run,
 * the model created, the optimizer and (when asked for) the quantizer created without a device
 * (ABI 2.2: their plan calls must not touch it); no device, no comm, no parameters. An optimizer or
 * quantizer that cannot be created so is left NULL (the plan then says what it assumed). */
ct_status session_open_plan(session *s, manifest *mf, int with_instances) {
    ct_status st;
    memset(s, 0, sizeof *s);
    s->mf = mf;
    engine_settings_read(mf, &s->cfg);
    if ((st = load_plugins(s, mf, 0)) || (st = create_model(s, mf))) return st;
    if (!with_instances) return CT_OK;
    ct_clear_error();
    if (s->o->create(&s->optp->host, NULL, NULL, &s->opt) != CT_OK) s->opt = NULL;
    s->n_state = s->opt ? s->o->state_count(s->opt) : 2;
    if (s->quantp) {
        s->qapi = s->quantp->info.api;
        ct_clear_error();
        if (s->qapi->create(&s->quantp->host, NULL, NULL, &s->quant) != CT_OK) s->quant = NULL;
    }
    ct_clear_error();
    return CT_OK;
}


ct_status session_load_plugin(session *s, const char *section, const char *key, const char *name, ct_plugin_kind kind,
                              plugin **out) {
    return load_named(s, section, key, name, kind, out);
}

ct_status session_load_quantizer(session *s, char *enable_key, size_t len) {
    quantizer_keys q;
    dense_quantizer(&s->cfg, &q);
    snprintf(enable_key, len, "%s", q.enable_key);
    if (s->quantp) return CT_OK;
    snprintf(s->quant_section, sizeof s->quant_section, "%s", q.section); /* the plugin keeps the pointer */
    return load_named(s, s->quant_section, q.enable_key, q.name, CT_KIND_QUANTIZER, &s->quantp);
}

/* ABI 2.1: every strategy's post_step, in order, after local storage changed (the optimizer's step,
 * a checkpoint load): ZeRO all-gathers the updated shards into the whole compute copies. A 2.0
 * strategy's table ends before the field. Counts as communication time. */
ct_status session_post_step(session *s) {
    for (int k = 0; k < s->rt.dist.n_st; k++) {
        const ct_strategy_api *a = s->rt.dist.st[k];
        if (!CT_HAS_FIELD(a, ct_strategy_api, post_step) || !a->post_step) continue;
        ct_clear_error();
        double t0 = ct_now();
        ct_status st = a->post_step(s->rt.dist.strat[k]);
        s->rt.comm_seconds += ct_now() - t0;
        if (st != CT_OK) {
            if (!ct_last_error()[0]) ct_set_error("strategy post_step failed (status %d)", st);
            return st;
        }
    }
    return CT_OK;
}

/* Sums x over the data-parallel ranks (a no-op on one): CT_OK, or the comm's status. */
static ct_status dp_sum(session *s, double *x) {
    if (!s->capi || s->mesh.dp_size <= 1) return CT_OK;
    ct_clear_error();
    double t0 = ct_now();
    ct_status st = s->capi->all_reduce(s->comm, s->mesh.dp_group, x, x, 1, CT_F64, CT_REDUCE_SUM, NULL);
    s->rt.comm_seconds += ct_now() - t0;
    return st;
}

/* The optimizer's state k of the storage at byte offset `at` of the parameters' allocation: states
 * lie as the data does, one param_bytes block per state value. */
static void state_at(const session *s, size_t at, float **state) {
    for (int k = 0; k < s->n_state; k++) state[k] = (float *)(s->opt_mem + k * s->rt.param_bytes + at);
}

ct_status session_step_params(session *s, double lr, int64_t step) {
    if (!CT_HAS_FIELD(s->o, ct_optimizer_api, step_param) || !s->o->step_param)
        return ct_fail(CT_ERR_UNSUPPORTED, "optimizer '%s' has no step_param", s->optp->info.name);
    int calls = 0;
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_param_slot *sl = &s->rt.slots[i];
        float *state[8] = {0}; /* slots of another pipeline stage (local_numel 0) get NULLs */
        if (sl->local_numel > 0) {
            size_t at = (size_t)((char *)sl->local_data - s->rt.param_mem); /* states lie as the data does */
            state_at(s, at, state);
            calls++;
        }
        /* a shared parameter's other use goes by the declared name, so the optimizer treats every
         * copy alike (a name-based choice, like Muon's exclusions, must not split them) */
        ct_tensor named;
        ct_param_slot copy;
        if (runtime_param_copy_of(&s->rt, i) >= 0) {
            named = *sl->param;
            named.name = runtime_param_key(&s->rt, i);
            copy = *sl;
            copy.param = &named;
            sl = &copy;
        }
        ct_clear_error();
        ct_status st = s->o->step_param(s->opt, sl, state, (float)lr, step);
        if (st != CT_OK) return st;
    }
    s->opt_calls = calls;
    return CT_OK;
}

/* Block-causal attention: a document's first token is not a target (as torchtitan main masks the loss
 * at document boundaries): the query before it, the previous document's EOS, sees nothing of its
 * document. Returns targets, or *buf (the caller frees it) holding them with those ignored; NULL when
 * out of memory. */
static const int32_t *mask_boundaries(const session *s, const int32_t *inputs, const int32_t *targets, int64_t n,
                                      int32_t **buf) {
    *buf = NULL;
    if (s->rt.doc_eos < 0) return targets;
    if (!(*buf = malloc(sizeof(int32_t) * (size_t)n + 1))) {
        ct_set_error("out of memory for the loss mask");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) (*buf)[i] = inputs[i] == s->rt.doc_eos ? CT_IGNORE_INDEX : targets[i];
    return *buf;
}

static ct_status train_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                            int64_t G, int64_t L, int64_t T, double lr, double max_norm, int64_t step, double *loss,
                            double *norm, int64_t *valid_out);

ct_status session_train_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                             int64_t G, int64_t L, int64_t T, double lr, double max_norm, int64_t step, double *loss,
                             double *norm, int64_t *valid_out) {
    int32_t *buf = NULL;
    if (s->rt.doc_eos < 0) starts = NULL; /* causal: no documents */
    const int32_t *tg = starts ? targets : mask_boundaries(s, inputs, targets, G * T, &buf);
    if (!tg) return CT_ERR_NOMEM;
    ct_status st = train_step(s, inputs, tg, starts, G, L, T, lr, max_norm, step, loss, norm, valid_out);
    s->rt.doc_starts = NULL;
    free(buf);
    return st;
}

/* buf (n values of type dt) summed over the axes whose strategy splits a sequence's rows (context
 * parallel, sequence parallel: runtime_token_axes), each rank holding part of a microbatch's tokens. */
static ct_status row_axes_sum(session *s, void *buf, int64_t n, ct_dtype dt) {
    int axes[CT_MESH_NAXES], na = runtime_token_axes(&s->rt, axes, 1);
    ct_status st = CT_OK;
    for (int i = 0; i < na && st == CT_OK; i++) {
        ct_clear_error();
        st = s->capi->all_reduce(s->comm, s->mesh.group[axes[i]], buf, buf, n, dt, CT_REDUCE_SUM, NULL);
    }
    return st;
}

/* The step's auxiliary losses (ct_builder.aux_loss: each rank's value is its part), summed over the
 * microbatches, the pipeline's stages, the data-parallel ranks and the ranks that split a sequence's
 * rows, normalised as the loss is and added to *loss. */
static ct_status step_aux(session *s, double valid, double *loss) {
    double aux;
    ct_status st = runtime_take_aux(&s->rt, &aux);
    if (st == CT_OK && s->pl) {
        ct_clear_error();
        st = s->capi->all_reduce(s->comm, s->mesh.group[CT_AXIS_PP], &aux, &aux, 1, CT_F64, CT_REDUCE_SUM, NULL);
    }
    if (st == CT_OK) st = dp_sum(s, &aux);
    if (st == CT_OK && s->capi) st = row_axes_sum(s, &aux, 1, CT_F64);
    if (st != CT_OK) return st;
    s->has_aux |= s->rt.moe != NULL || aux != 0;
    s->aux_loss = valid > 0 ? aux / valid : 0.0;
    *loss += s->aux_loss;
    return CT_OK;
}

/* ABI 2.15: the model's post_step with the step's per-expert counts, summed over the data-parallel
 * ranks; the counts start again from zero. */
static ct_status model_post_step(session *s, int64_t step) {
    const ct_moe_load *loads;
    int n = 0;
    ct_status st = runtime_moe_loads(&s->rt, &loads, &n);
    if (st != CT_OK) return st;
    int hook = CT_HAS_FIELD(s->m, ct_model_api, post_step) && s->m->post_step;
    for (int i = 0; hook && i < n && st == CT_OK && s->capi && s->mesh.dp_size > 1; i++) {
        ct_clear_error();
        st = s->capi->all_reduce(s->comm, s->mesh.dp_group, (void *)loads[i].counts, (void *)loads[i].counts,
                                 loads[i].n_experts, CT_F32, CT_REDUCE_SUM, NULL);
    }
    /* an axis strategy whose sequences must hold a multiple of its tokens (context parallel, sequence
     * parallel) gives each rank of its axis part of the rows: their counts add up too */
    for (int i = 0; hook && i < n && st == CT_OK && s->capi; i++)
        st = row_axes_sum(s, (void *)loads[i].counts, loads[i].n_experts, CT_F32);
    if (st == CT_OK && hook) {
        ct_model_step info = {sizeof info, step, s->rt.d, s->rt.dev, n, loads};
        ct_clear_error();
        if ((st = s->m->post_step(s->rt.model, &info)) != CT_OK && !ct_last_error()[0])
            ct_set_error("model post_step failed (status %d)", st);
    }
    return st == CT_OK ? runtime_moe_zero_counts(&s->rt) : st;
}

static ct_status train_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                            int64_t G, int64_t L, int64_t T, double lr, double max_norm, int64_t step, double *loss,
                            double *norm, int64_t *valid_out) {
    double valid = 0;
    for (int64_t i = 0; i < G * T; i++) valid += targets[i] != CT_IGNORE_INDEX;
    ct_status st = dp_sum(s, &valid); /* the loss is normalised by the global batch's valid tokens */
    if (st != CT_OK) return st;
    float scale = valid > 0 ? (float)(1.0 / valid) : 0.0f;
    double loss_sum = 0;
    *valid_out = (int64_t)valid;
    if ((st = runtime_zero_grads(&s->rt)) != CT_OK) return st;
    runtime_begin_step(&s->rt);
    int64_t accum = G / L;
    for (int64_t m = 0; m < accum; m++) {
        double ls;
        s->rt.doc_starts = starts ? starts + m * L * T : NULL;
        st = s->pl ? pipeline_step(s->pl, inputs + m * L * T, targets + m * L * T, L, T, scale, m == accum - 1, &ls)
                   : runtime_forward_backward(&s->rt, inputs + m * L * T, targets + m * L * T, L, T, scale,
                                              m == accum - 1, &ls);
        if (st != CT_OK) return st;
        loss_sum += ls;
    }
    if ((st = dp_sum(s, &loss_sum)) != CT_OK) return st;
    *loss = valid > 0 ? loss_sum / valid : 0.0;
    if ((st = step_aux(s, valid, loss)) != CT_OK) return st;
    if ((st = runtime_sum_shared_grads(&s->rt)) != CT_OK || (st = runtime_grad_norm(&s->rt, norm)) != CT_OK) return st;
    if (!isfinite(*norm)) return CT_OK; /* nothing updated: the caller sees the norm */
    /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1 */
    double coef = max_norm > 0 ? max_norm / (*norm + 1e-6) : 1.0;
    if (coef < 1.0 && (st = runtime_scale_grads(&s->rt, (float)coef)) != CT_OK) return st;
    trace_begin("optimizer");
    if (CT_HAS_FIELD(s->o, ct_optimizer_api, step_param) && s->o->step_param) {
        st = session_step_params(s, lr, step);
        trace_end("optimizer");
        return st == CT_OK ? model_post_step(s, step) : st;
    }
    /* one call per run of back-to-back tensors with the same decay flag when the optimizer is
     * elementwise (ABI 1.4), else one per tensor; states lie at the same offsets as the data */
    int merge = CT_HAS_FIELD(s->o, ct_optimizer_api, elementwise) && s->o->elementwise && s->o->elementwise(s->opt);
    int np = s->rt.n_params, calls = 0;
    const int *order = s->rt.storage_order; /* runtime.c stores the decayed tensors first */
    for (int i = 0; i < np;) {
        ct_tensor run = s->rt.local[order[i]]; /* this rank's storage: the parameter or its shard */
        size_t begin = (size_t)((char *)run.data - s->rt.param_mem), end = begin + align64((size_t)run.shape[0] * sizeof(float));
        int j = i + 1;
        for (; merge && j < np; j++) {
            const ct_tensor *next = &s->rt.local[order[j]];
            size_t at = (size_t)((char *)next->data - s->rt.param_mem);
            if (next->shape[0] > 0 && ((next->flags ^ run.flags) & CT_TENSOR_NO_DECAY || at != end ||
                                       (char *)next->grad != (char *)run.grad + (at - begin)))
                break;
            end = at + align64((size_t)next->shape[0] * sizeof(float));
        }
        int64_t n = j > i + 1 ? (int64_t)((end - begin) / sizeof(float)) : run.shape[0];
        i = j;
        if (n == 0) continue; /* another pipeline stage's parameter */
        run.shape[0] = n;
        float *state[8];
        state_at(s, begin, state);
        ct_clear_error();
        if ((st = s->o->step(s->opt, &run, state, n, (float)lr, step)) != CT_OK) return st;
        calls++;
    }
    s->opt_calls = calls;
    trace_end("optimizer");
    st = session_post_step(s);
    return st == CT_OK ? model_post_step(s, step) : st;
}

static ct_status eval_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                           int64_t G, int64_t L, int64_t T, double *loss_sum, int64_t *valid_out);

ct_status session_eval_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                            int64_t G, int64_t L, int64_t T, double *loss_sum, int64_t *valid_out) {
    int32_t *buf = NULL;
    if (s->rt.doc_eos < 0) starts = NULL;
    const int32_t *tg = starts ? targets : mask_boundaries(s, inputs, targets, G * T, &buf);
    if (!tg) return CT_ERR_NOMEM;
    ct_status st = eval_step(s, inputs, tg, starts, G, L, T, loss_sum, valid_out);
    s->rt.doc_starts = NULL;
    free(buf);
    return st;
}

static ct_status eval_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                           int64_t G, int64_t L, int64_t T, double *loss_sum, int64_t *valid_out) {
    double valid = 0, sum = 0;
    for (int64_t i = 0; i < G * T; i++) valid += targets[i] != CT_IGNORE_INDEX;
    /* the bf16 copies follow the weights the last optimizer step left (a training step refreshes them
     * again before its forward) */
    runtime_begin_step(&s->rt);
    ct_status st;
    for (int64_t m = 0; m < G / L; m++) {
        double ls;
        s->rt.doc_starts = starts ? starts + m * L * T : NULL;
        if ((st = runtime_forward_loss(&s->rt, inputs + m * L * T, targets + m * L * T, L, T, &ls)) != CT_OK) return st;
        sum += ls;
    }
    if ((st = dp_sum(s, &valid)) != CT_OK || (st = dp_sum(s, &sum)) != CT_OK) return st;
    *loss_sum = sum;
    *valid_out = (int64_t)valid;
    return CT_OK;
}
