/* manifest.c: YAML manifest -> flat dotted keys with lines; overrides; schema; typed getters. */
#include "manifest.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

/* The core's keys. Names follow torchtitan's sections so configs move over without a table. */
static const struct {
    const char *key;
    ct_opt_type type;
    const char *def;
    const char *help;
} core_schema[] = {
    {"job.dump_folder", CT_OPT_STRING, "./outputs", "folder for metrics.jsonl, the model and traces"},
    {"job.description", CT_OPT_STRING, "", "free text shown at start-up"},
    {"job.print_config", CT_OPT_BOOL, "false", "print the effective configuration at start-up"},
    {"device.name", CT_OPT_STRING, "cpu", "device plugin (name or path to a .so)"},
    {"model.name", CT_OPT_STRING, "llama3", "model pack plugin (name or path to a .so)"},
    {"model.flavor", CT_OPT_STRING, "debugmodel", "model size preset of the pack"},
    {"model.tokenizer_path", CT_OPT_STRING, NULL, "tiktoken-format vocabulary (for generation)"},
    {"optimizer.name", CT_OPT_STRING, "AdamW", "optimizer plugin (name or path to a .so)"},
    {"optimizer.lr", CT_OPT_FLOAT, "8e-4", "peak learning rate"},
    {"lr_scheduler.warmup_steps", CT_OPT_INT, "200", "linear warmup steps"},
    {"lr_scheduler.total_steps", CT_OPT_INT, NULL, "schedule length (default: training.steps)"},
    {"lr_scheduler.decay_ratio", CT_OPT_FLOAT, NULL,
     "unset: decay right after warmup; else warmup-stable-decay, decaying over this last fraction"},
    {"lr_scheduler.decay_type", CT_OPT_STRING, "linear", "linear | sqrt | cosine"},
    {"lr_scheduler.min_lr_factor", CT_OPT_FLOAT, "0.0", "floor of the decay, as a fraction of lr"},
    {"training.dataset_path", CT_OPT_STRING, NULL, "token shard file (ctitan tokenize) or a folder of them"},
    {"training.local_batch_size", CT_OPT_INT, "8", "sequences per microbatch per data-parallel rank"},
    {"training.global_batch_size", CT_OPT_INT, "-1",
     "sequences per step over all ranks; -1 = local x dp; more = gradient accumulation"},
    {"training.seq_len", CT_OPT_INT, "2048", "tokens per sequence"},
    {"training.steps", CT_OPT_INT, "10000", "optimizer steps"},
    {"training.max_norm", CT_OPT_FLOAT, "1.0", "clip gradients to this global norm (<= 0: no clipping)"},
    {"training.seed", CT_OPT_INT, "0", "seed for initialisation and data order"},
    {"training.mixed_precision_param", CT_OPT_STRING, "float32",
     "float32 | bfloat16 (parameters rounded to bf16 for compute; fp32 master weights)"},
    {"activation_checkpoint.mode", CT_OPT_STRING, "selective", "none | full | selective"},
    {"activation_checkpoint.selective_ac_option", CT_OPT_STRING, "2",
     "selective: N = checkpoint every Nth transformer block; op = torchtitan's per-op policy"},
    {"metrics.log_freq", CT_OPT_INT, "10", "log every N steps (and the first and last)"},
    {"profiling.enable_profiling", CT_OPT_BOOL, "false", "write a Chrome trace of the host's ranges"},
    {"profiling.save_traces_folder", CT_OPT_STRING, "profile_traces", "under job.dump_folder"},
    {"checkpoint.enable", CT_OPT_BOOL, "false", "save checkpoints and resume from the newest one in the folder"},
    {"checkpoint.folder", CT_OPT_STRING, "checkpoint", "under job.dump_folder; one step-N folder per save"},
    {"checkpoint.interval", CT_OPT_INT, "500", "save every N steps"},
    {"checkpoint.keep_latest_k", CT_OPT_INT, "10", "keep the newest k checkpoints (0: all)"},
    {"checkpoint.load_step", CT_OPT_INT, "-1", "resume from this step (-1: the newest)"},
    {"checkpoint.initial_load_path", CT_OPT_STRING, NULL,
     "a step folder (or a checkpoint folder: its newest) to start from when the run's own folder has none"},
    {"checkpoint.initial_load_model_only", CT_OPT_BOOL, "true", "initial load: the model only, not optimizer and state"},
    {"checkpoint.initial_load_in_hf", CT_OPT_BOOL, "false", "initial_load_path is a Hugging Face Llama folder"},
    {"checkpoint.last_save_model_only", CT_OPT_BOOL, "true", "the final save holds the model only"},
    {"checkpoint.last_save_in_hf", CT_OPT_BOOL, "false", "also write the final model as a Hugging Face folder (checkpoint/step-N-hf/)"},
    {"checkpoint.export_dtype", CT_OPT_STRING, "float32", "float32 | bfloat16: the final model-only save's values"},
    {"checkpoint.async_mode", CT_OPT_STRING, "disabled", "disabled | async (files written by a background thread)"},
    {"checkpoint.exclude_from_loading", CT_OPT_STRING, "",
     "comma-separated: optimizer, lr_scheduler, dataloader (start those fresh on resume)"},
    {"checkpoint.allow_config_change", CT_OPT_BOOL, "false", "resume although seed, seq_len or model differ from the checkpoint's"},
    {"checkpoint.create_seed_checkpoint", CT_OPT_BOOL, "false", "initialise, save step-0 (model only) and exit"},
    {"quantize.dense.float8.enable", CT_OPT_BOOL, "false", "float8 linear layers (plugins/float8)"},
    {"quantize.dense.float8.format", CT_OPT_STRING, "tensorwise",
     "tensorwise | rowwise | rowwise_with_gw_hp | mxfp8 | e4m3 | e5m2"},
    {"quantize.dense.float8.filter_fqns", CT_OPT_STRING, "output", "linear weights left in high precision (substrings)"},
    {"quantize.dense.float8.enable_fsdp_float8_all_gather", CT_OPT_BOOL, "false",
     "FSDP gathers tensorwise weights in float8 (half the bytes; one amax all-reduce per step)"},
    {"quantize.linear.float8.recipe_name", CT_OPT_STRING, NULL, "torchtitan's spelling of quantize.dense.float8.format"},
    {"quantize.linear.float8.filter_fqns", CT_OPT_STRING, NULL, "torchtitan's spelling of the filter"},
    {"quantize.linear.float8.emulate", CT_OPT_BOOL, NULL, "torchtitan's spelling of quantize.dense.float8.emulate"},
    {"quantize.linear.float8.enable_fsdp_float8_all_gather", CT_OPT_BOOL, "false", "torchtitan's spelling"},
    {"quantize.linear.mx.recipe_name", CT_OPT_STRING, NULL, "torchtitan's MX recipe (mxfp8, mxfp8_cublas ...)"},
    {"quantize.linear.mx.filter_fqns", CT_OPT_STRING, NULL, "torchtitan's spelling of the filter"},
    {"model.converters", CT_OPT_STRING, NULL,
     "torchtitan's converters list: float8 / quantize.linear.float8 / mx / quantize.linear.mx enable float8"},
    {"generate.max_new_tokens", CT_OPT_INT, "0", "after training, sample this many tokens (0: none)"},
    {"generate.top_p", CT_OPT_FLOAT, "1.0", "nucleus sampling: the smallest set of tokens with this much probability"},
    {"generate.seed", CT_OPT_INT, NULL, "sampling seed (default: training.seed)"},
    {"generate.prompt", CT_OPT_STRING, "", "text to continue"},
    {"generate.temperature", CT_OPT_FLOAT, "0.8", "sampling temperature (0: greedy)"},
    {"generate.top_k", CT_OPT_INT, "40", "sample among the k most likely tokens (0: all)"},
    {"comm.name", CT_OPT_STRING, "mpi", "communication plugin, loaded when the job has several ranks"},
    {"comm.train_timeout_seconds", CT_OPT_FLOAT, "300", "bound on every collective: a dead or stuck rank ends the job"},
    {"comm.init_timeout_seconds", CT_OPT_FLOAT, "300", "bound on joining the job (where the plugin can bound it)"},
    {"parallelism.dp_strategy", CT_OPT_STRING, "auto",
     "auto (fsdp when data_parallel_shard_degree > 1, ddp when only replicate > 1) | none | a plugin name or path"},
    {"parallelism.fsdp_reshard_after_forward", CT_OPT_STRING, "default", "default | always | never"},
    {"parallelism.data_parallel_replicate_degree", CT_OPT_INT, "1", "DDP/HSDP replicas"},
    {"parallelism.data_parallel_shard_degree", CT_OPT_INT, "-1", "FSDP degree; -1 = ranks left over"},
    {"parallelism.tensor_parallel_degree", CT_OPT_INT, "1", "tensor parallel degree"},
    {"parallelism.tp_strategy", CT_OPT_STRING, "tp", "the tensor-parallel plugin (a name or a path)"},
    {"parallelism.enable_sequence_parallel", CT_OPT_BOOL, "true",
     "under tensor parallel, shard the residual stream's token rows over tp (all-gather / reduce-scatter)"},
    {"parallelism.disable_loss_parallel", CT_OPT_BOOL, "false",
     "gather the vocabulary-sharded logits before the loss instead of computing it sharded"},
    {"parallelism.enable_async_tensor_parallel", CT_OPT_BOOL, "false",
     "overlap the tp all-gather with the column-wise matmul and the row-wise matmul with its reduce-scatter"},
    {"parallelism.async_tensor_parallel_chunks", CT_OPT_INT, "4", "chunks per overlapped collective under async TP"},
    {"compile.enable", CT_OPT_BOOL, "false",
     "capture a microbatch's forward and backward as a device graph and launch it from then on (CUDA; one rank, no float8)"},
    {"compile.enable_async_tensor_parallel", CT_OPT_BOOL, "false", "torchtitan's later spelling of parallelism.enable_async_tensor_parallel"},
    {"parallelism.pipeline_parallel_degree", CT_OPT_INT, "1", "pipeline parallel degree"},
    {"parallelism.pipeline_parallel_schedule", CT_OPT_STRING, "1F1B",
     "GPipe | 1F1B | Interleaved1F1B | LoopedBFS | InterleavedZeroBubble | ZBVZeroBubble | CSV | a schedule plugin's path"},
    {"parallelism.pipeline_parallel_schedule_csv", CT_OPT_STRING, "", "the CSV schedule's file: one row of actions per pp rank"},
    {"parallelism.pipeline_parallel_microbatch_size", CT_OPT_INT, "1", "sequences per pipeline microbatch"},
    {"parallelism.pipeline_parallel_layers_per_stage", CT_OPT_INT, "0",
     "layers per stage (the embedding and output counted as below); 0: the schedule's stages per rank"},
    {"parallelism.pipeline_parallel_first_stage_less_layers", CT_OPT_INT, "1", "the embedding counts as this many layers"},
    {"parallelism.pipeline_parallel_last_stage_less_layers", CT_OPT_INT, "1", "the output counts as this many layers"},
    {"parallelism.pipeline_parallel_stage_units", CT_OPT_STRING, "", "units per stage, e.g. \"3,3,2\" (overrides the above)"},
    {"parallelism.pipeline_runner", CT_OPT_STRING, "pp", "the pipeline runner plugin (a name or a path)"},
    {"parallelism.context_parallel_degree", CT_OPT_INT, "1", "context parallel degree"},
};

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

static mf_value *find_value(const manifest *m, const char *key) {
    for (int i = 0; i < m->n_values; i++)
        if (strcmp(m->values[i].key, key) == 0) return &m->values[i];
    return NULL;
}

static const mf_schema_entry *find_schema(const manifest *m, const char *key) {
    for (int i = 0; i < m->n_schema; i++)
        if (strcmp(m->schema[i].key, key) == 0) return &m->schema[i];
    return NULL;
}

static int add_value(manifest *m, const char *key, const char *value, int is_seq, int line) {
    mf_value *v = realloc(m->values, sizeof(*v) * (size_t)(m->n_values + 1));
    if (!v) return -1;
    m->values = v;
    v = &m->values[m->n_values++];
    v->key = xstrdup(key);
    v->value = xstrdup(value);
    v->is_seq = is_seq;
    v->line = line;
    return 0;
}

/* Flattens a YAML mapping node into dotted keys. */
static int flatten(manifest *m, yaml_document_t *doc, yaml_node_t *node, const char *prefix, char *err,
                   size_t errlen) {
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        int line = (int)k->start_mark.line + 1;
        if (k->type != YAML_SCALAR_NODE) {
            ct_errf(err, errlen, "%s:%d: keys must be plain names", m->path, line);
            return -1;
        }
        const char *kname = (const char *)k->data.scalar.value;
        if (!*kname || strchr(kname, '.')) {
            ct_errf(err, errlen, "%s:%d: '%s': keys are plain names; nest sections as maps", m->path, line,
                   kname);
            return -1;
        }
        char key[512];
        if (snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", kname) >= (int)sizeof key) {
            ct_errf(err, errlen, "%s:%d: key too long", m->path, line);
            return -1;
        }
        if (v->type == YAML_MAPPING_NODE) {
            if (flatten(m, doc, v, key, err, errlen)) return -1;
            continue;
        }
        if (!*prefix) {
            ct_errf(err, errlen, "%s:%d: %s: a top-level key must be a section (a map of keys)", m->path,
                   line, key);
            return -1;
        }
        if (find_value(m, key)) {
            ct_errf(err, errlen, "%s:%d: %s: duplicate key", m->path, line, key);
            return -1;
        }
        if (v->type == YAML_SCALAR_NODE) {
            const char *sv = (const char *)v->data.scalar.value;
            if (v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                (!*sv || !strcmp(sv, "null") || !strcmp(sv, "~") || !strcmp(sv, "Null") || !strcmp(sv, "NULL")))
                sv = NULL; /* null: the default applies */
            if (add_value(m, key, sv, 0, line)) goto nomem;
        } else { /* sequence: join items with ',' (a list value) */
            char buf[4096] = "";
            size_t used = 0;
            for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
                yaml_node_t *item = yaml_document_get_node(doc, *it);
                if (item->type != YAML_SCALAR_NODE) {
                    ct_errf(err, errlen, "%s:%d: %s: list items must be plain values", m->path,
                           (int)item->start_mark.line + 1, key);
                    return -1;
                }
                int n = snprintf(buf + used, sizeof buf - used, "%s%s", used ? "," : "",
                                 (const char *)item->data.scalar.value);
                if (n < 0 || (size_t)n >= sizeof buf - used) {
                    ct_errf(err, errlen, "%s:%d: %s: list too long", m->path, line, key);
                    return -1;
                }
                used += (size_t)n;
            }
            if (add_value(m, key, buf, 1, line)) goto nomem;
        }
    }
    return 0;
nomem:
    ct_errf(err, errlen, "%s: out of memory", m->path);
    return -1;
}

manifest *manifest_load(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ct_errf(err, errlen, "%s: cannot open manifest: %s", path, strerror(errno));
        return NULL;
    }
    manifest *m = calloc(1, sizeof *m);
    yaml_parser_t parser;
    yaml_document_t doc;
    int have_doc = 0;
    if (!m || !yaml_parser_initialize(&parser)) {
        fclose(f);
        free(m);
        ct_errf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    m->path = strdup(path);
    const char *slash = strrchr(path, '/');
    m->dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        ct_errf(err, errlen, "%s:%d:%d: YAML syntax error: %s%s%s", path, (int)parser.problem_mark.line + 1,
               (int)parser.problem_mark.column + 1, parser.problem ? parser.problem : "unknown",
               parser.context ? " " : "", parser.context ? parser.context : "");
        goto fail;
    }
    have_doc = 1;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        if (root->type != YAML_MAPPING_NODE) {
            ct_errf(err, errlen, "%s:%d: the manifest must be a map of sections (job:, model:, training: ...)",
                   path, (int)root->start_mark.line + 1);
            goto fail;
        }
        if (flatten(m, &doc, root, "", err, errlen)) goto fail;
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    return m;
fail:
    if (have_doc) yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    manifest_free(m);
    return NULL;
}

int manifest_override(manifest *m, const char *key, const char *value, char *err, size_t errlen) {
    if (!*key || key[0] == '.' || key[strlen(key) - 1] == '.' || !strchr(key, '.')) {
        ct_errf(err, errlen, "command line: --%s: expected --section.key=value", key);
        return -1;
    }
    mf_value *v = find_value(m, key);
    if (v) {
        free(v->value);
        v->value = xstrdup(value);
        v->is_seq = 0;
        v->line = 0;
        return 0;
    }
    return add_value(m, key, value, 0, 0);
}

int manifest_alias(manifest *m, const char *from, const char *to) {
    const mf_value *src = find_value(m, from);
    if (!src || !src->value || (find_value(m, to) && find_value(m, to)->value)) return 0;
    char *value = strdup(src->value);
    int line = src->line, is_seq = src->is_seq, rc = 0;
    mf_value *dst = find_value(m, to);
    if (dst) {
        free(dst->value);
        dst->value = value;
        dst->line = line;
        dst->is_seq = is_seq;
    } else {
        rc = add_value(m, to, value, is_seq, line);
        free(value);
    }
    return rc;
}

void manifest_free(manifest *m) {
    if (!m) return;
    for (int i = 0; i < m->n_values; i++) {
        free(m->values[i].key);
        free(m->values[i].value);
    }
    for (int i = 0; i < m->n_schema; i++) {
        free(m->schema[i].key);
        free(m->schema[i].default_value);
        free(m->schema[i].help);
    }
    free(m->values);
    free(m->schema);
    free(m->path);
    free(m->dir);
    free(m);
}

static void schema_add(manifest *m, const char *key, ct_opt_type type, const char *def, const char *help,
                       int plugin) {
    for (int i = 0; i < m->n_schema; i++)
        if (strcmp(m->schema[i].key, key) == 0) return; /* the first declaration wins */
    mf_schema_entry *s = realloc(m->schema, sizeof(*s) * (size_t)(m->n_schema + 1));
    if (!s) return;
    m->schema = s;
    s = &m->schema[m->n_schema++];
    s->key = xstrdup(key);
    s->type = type;
    s->default_value = xstrdup(def);
    s->help = xstrdup(help ? help : "");
    s->plugin = plugin;
}

void manifest_add_core_schema(manifest *m) {
    for (size_t i = 0; i < sizeof core_schema / sizeof core_schema[0]; i++)
        schema_add(m, core_schema[i].key, core_schema[i].type, core_schema[i].def, core_schema[i].help, 0);
}

void manifest_add_plugin_schema(manifest *m, const char *section, const ct_option_spec *opts) {
    for (; opts && opts->key; opts++) {
        char key[512];
        snprintf(key, sizeof key, "%s.%s", section, opts->key);
        schema_add(m, key, opts->type, opts->default_value, opts->help, 1);
    }
}

int mf_parse_int(const char *s, int64_t *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int mf_parse_float(const char *s, double *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int mf_parse_bool(const char *s, int *out) {
    if (!s) return -1;
    if (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on")) *out = 1;
    else if (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off")) *out = 0;
    else return -1;
    return 0;
}

void mf_where(const manifest *m, const char *key, char *buf, size_t len) {
    const mf_value *v = find_value(m, key);
    if (!v) snprintf(buf, len, "%s: %s (default)", m->path, key);
    else if (v->line) snprintf(buf, len, "%s:%d: %s", m->path, v->line, key);
    else snprintf(buf, len, "command line: --%s", key);
}

static const char *type_name(ct_opt_type t) {
    switch (t) {
    case CT_OPT_INT: return "an integer";
    case CT_OPT_FLOAT: return "a number";
    case CT_OPT_BOOL: return "true or false";
    case CT_OPT_STRING: return "a string";
    }
    return "?";
}

/* Lists the schema keys of `section` into buf (for "unknown key" errors). */
static void known_keys(const manifest *m, const char *key, char *buf, size_t len) {
    size_t sec = strcspn(key, ".");
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < m->n_schema; i++) {
        const char *k = m->schema[i].key;
        if (strncmp(k, key, sec) != 0 || k[sec] != '.') continue;
        int n = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", k + sec + 1);
        if (n < 0 || (size_t)n >= len - used) break;
        used += (size_t)n;
    }
    if (!used) {
        /* unknown section: list the sections */
        for (int i = 0; i < m->n_schema; i++) {
            const char *k = m->schema[i].key;
            size_t s = strcspn(k, ".");
            int seen = 0;
            for (int j = 0; j < i && !seen; j++)
                seen = strncmp(m->schema[j].key, k, s) == 0 && m->schema[j].key[s] == '.';
            if (seen) continue;
            int n = snprintf(buf + used, len - used, "%s%.*s", used ? ", " : "sections: ", (int)s, k);
            if (n < 0 || (size_t)n >= len - used) break;
            used += (size_t)n;
        }
    }
}

int manifest_validate(const manifest *m, char *err, size_t errlen) {
    for (int i = 0; i < m->n_values; i++) {
        const mf_value *v = &m->values[i];
        char where[600];
        mf_where(m, v->key, where, sizeof where);
        const mf_schema_entry *s = find_schema(m, v->key);
        if (!s) {
            char keys[2048];
            known_keys(m, v->key, keys, sizeof keys);
            ct_errf(err, errlen, "%s: unknown key (known: %s)", where, keys);
            return -1;
        }
        int ok = 1;
        int64_t iv;
        double fv;
        int bv;
        if (!v->value && !v->is_seq) continue; /* null: the default applies */
        if (v->is_seq) ok = s->type == CT_OPT_STRING; /* a list of strings, joined with ',' */
        else if (s->type == CT_OPT_INT) ok = mf_parse_int(v->value, &iv) == 0;
        else if (s->type == CT_OPT_FLOAT) ok = mf_parse_float(v->value, &fv) == 0;
        else if (s->type == CT_OPT_BOOL) ok = mf_parse_bool(v->value, &bv) == 0;
        if (!ok) {
            ct_errf(err, errlen, "%s: expected %s, got '%s'", where, type_name(s->type),
                   v->value ? v->value : "(nothing)");
            return -1;
        }
    }
    return 0;
}

static const char *raw(const manifest *m, const char *key) {
    const mf_value *v = find_value(m, key);
    if (v && v->value) return v->value;
    const mf_schema_entry *s = find_schema(m, key);
    return s ? s->default_value : NULL;
}

int mf_get_str(const manifest *m, const char *key, const char **out) {
    const char *s = raw(m, key);
    if (!s) return -1;
    *out = s;
    return 0;
}

int mf_get_int(const manifest *m, const char *key, int64_t *out) { return mf_parse_int(raw(m, key), out); }
int mf_get_float(const manifest *m, const char *key, double *out) {
    return mf_parse_float(raw(m, key), out);
}
int mf_get_bool(const manifest *m, const char *key, int *out) { return mf_parse_bool(raw(m, key), out); }

static int section_cmp(const void *a, const void *b) {
    const mf_schema_entry *x = a, *y = b;
    return strcmp(x->key, y->key);
}

void manifest_print(const manifest *m, FILE *f) {
    mf_schema_entry *sorted = malloc(sizeof(*sorted) * (size_t)(m->n_schema ? m->n_schema : 1));
    if (!sorted) return;
    memcpy(sorted, m->schema, sizeof(*sorted) * (size_t)m->n_schema);
    qsort(sorted, (size_t)m->n_schema, sizeof *sorted, section_cmp);
    char section[128] = "";
    for (int i = 0; i < m->n_schema; i++) {
        const char *k = sorted[i].key;
        size_t s = strcspn(k, ".");
        if (strlen(section) != s || strncmp(section, k, s) != 0) {
            snprintf(section, sizeof section, "%.*s", (int)s, k);
            fprintf(f, "%s:\n", section);
        }
        const char *v = raw(m, k);
        if (!v) fprintf(f, "  %s: null\n", k + s + 1);
        else if (sorted[i].type == CT_OPT_STRING) fprintf(f, "  %s: \"%s\"\n", k + s + 1, v);
        else fprintf(f, "  %s: %s\n", k + s + 1, v);
    }
    free(sorted);
}

void manifest_print_schema(const manifest *m, FILE *f) {
    for (int i = 0; i < m->n_schema; i++) {
        const mf_schema_entry *s = &m->schema[i];
        fprintf(f, "  --%-44s %s%s [%s%s%s]\n", s->key, s->plugin ? "(plugin) " : "", s->help,
                s->type == CT_OPT_INT ? "int" : s->type == CT_OPT_FLOAT ? "float" : s->type == CT_OPT_BOOL ? "bool" : "string",
                s->default_value ? ", default " : "", s->default_value ? s->default_value : "");
    }
}
