/* manifest.c: YAML manifest -> flat dotted keys with lines; overrides; schema; typed getters. */
#include "config/manifest.h"
#include "config/toml_shim.h"
#include "config/torchtitan_keys.h"
#include "base/error.h"
#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <yaml.h>

/* The core's keys, one row each: key, type, default, help, and the bounds (range) and choices checked
 * for every value given (manifest_validate). Names follow torchtitan's sections so configs move over
 * without a table. The caps on sizes and counts are far above any real run and keep what is computed
 * from them in range; the degrees' caps keep them in an int (mesh_degrees checks them against the
 * job's ranks). */
static const struct {
    const char *key;
    ct_opt_type type;
    const char *def;
    const char *help;
    const char *range, *choices; /* NULL: unchecked */
} core_schema[] = {
    {"job.dump_folder", CT_OPT_STRING, "./outputs", "folder for metrics.jsonl, the model and traces", NULL, NULL},
    {"job.description", CT_OPT_STRING, "", "free text shown at start-up", NULL, NULL},
    {"job.print_config", CT_OPT_BOOL, "false", "print the effective configuration at start-up", NULL, NULL},
    {"device.name", CT_OPT_STRING, "cpu", "device plugin (name or path to a .so)", NULL, NULL},
    {"model.name", CT_OPT_STRING, "llama3", "model pack plugin (name or path to a .so)", NULL, NULL},
    {"model.flavor", CT_OPT_STRING, "debugmodel",
     "model size preset of the pack; from_checkpoint: name, flavor and sizes from checkpoint.initial_load_path",
     NULL, NULL},
    {"model.attn_mask_type", CT_OPT_STRING, "causal",
     "causal | block_causal (packed documents: a token attends only to its own document, which ends with EOS)",
     NULL, "causal|block_causal"},
    {"model.rope_positions", CT_OPT_STRING, "sequence",
     "block_causal: RoPE positions count from the sequence's start (sequence, as torchtitan) or restart per document",
     NULL, "sequence|document"},
    {"model.tokenizer_path", CT_OPT_STRING, NULL,
     "tokenizer for generation: tiktoken tokenizer.model, Hugging Face tokenizer.json, or a folder holding one",
     NULL, NULL},
    {"model.hf_assets_path", CT_OPT_STRING, NULL,
     "Hugging Face model folder; its tokenizer.json (or tokenizer.model) is read when tokenizer_path is not set",
     NULL, NULL},
    {"optimizer.name", CT_OPT_STRING,
     "AdamW", "optimizer plugin: AdamW, muon (Muon + AdamW), or a name or path to a .so", NULL, NULL},
    {"optimizer.lr", CT_OPT_FLOAT, "8e-4", "peak learning rate", "[0, 1000]", NULL},
    {"lr_scheduler.warmup_steps", CT_OPT_INT, "200", "linear warmup steps", "[0, 1e12]", NULL},
    {"lr_scheduler.total_steps", CT_OPT_INT, NULL, "schedule length (default: training.steps)", "[1, 1e12]", NULL},
    {"lr_scheduler.decay_ratio", CT_OPT_FLOAT, NULL,
     "unset: decay right after warmup; else warmup-stable-decay, decaying over this last fraction", "[0, 1]", NULL},
    {"lr_scheduler.decay_type", CT_OPT_STRING, "linear", "linear | sqrt | cosine", NULL, "linear|sqrt|cosine"},
    {"lr_scheduler.min_lr_factor", CT_OPT_FLOAT, "0.0", "floor of the decay, as a fraction of lr", "[0, 1]", NULL},
    {"training.dataset_path", CT_OPT_STRING, NULL, "token shard file (ctitan tokenize) or a folder of them", NULL, NULL},
    {"training.dataset", CT_OPT_STRING, NULL,
     "a token shard or a folder of them, or a list of sources {path, weight} mixed by weight", NULL, NULL},
    {"training.dataset[].path", CT_OPT_STRING, NULL, "one source of the mixture: a token shard or a folder of them",
     NULL, NULL},
    {"training.dataset[].weight", CT_OPT_FLOAT, "1.0", "its share of the sequences (relative to the others' weights)",
     "(0, 1e12]", NULL},
    {"validation.enable", CT_OPT_BOOL, "false", "evaluate the loss on a held-out dataset every validation.freq steps",
     NULL, NULL},
    {"validation.dataset", CT_OPT_STRING, NULL,
     "held-out tokens: a shard or a folder of them, or a list of sources {path} read in order", NULL, NULL},
    {"validation.dataset[].path", CT_OPT_STRING, NULL, "one held-out source: a token shard or a folder of them",
     NULL, NULL},
    {"validation.dataset[].weight", CT_OPT_FLOAT, NULL, "(refused: validation reads every source whole)", NULL, NULL},
    {"validation.dataset_path", CT_OPT_STRING, NULL, "held-out token shard or folder (as validation.dataset)", NULL, NULL},
    {"validation.freq", CT_OPT_INT, "10", "validate at step 1 and every N steps", "[1, 1e12]", NULL},
    {"validation.steps", CT_OPT_INT, "-1",
     "batches (of training.global_batch_size sequences) per validation; -1: the whole held-out set once",
     "[-1, 1e12]", NULL},
    {"validation.local_batch_size", CT_OPT_INT, NULL, "sequences per validation microbatch (default: training's)",
     "[1, 1048576]", NULL},
    {"validation.seq_len", CT_OPT_INT, NULL, "must equal training.seq_len (default: training's)", "[1, 1048576]", NULL},
    {"training.local_batch_size", CT_OPT_INT, "8", "sequences per microbatch per data-parallel rank",
     "[1, 1048576]", NULL},
    {"training.global_batch_size", CT_OPT_INT, "-1",
     "sequences per step over all ranks; -1 = local x dp; more = gradient accumulation", "[-1, 1e9]", NULL},
    {"training.seq_len", CT_OPT_INT, "2048", "tokens per sequence", "[1, 1048576]", NULL},
    {"training.steps", CT_OPT_INT, "10000", "optimizer steps", "[1, 1e12]", NULL},
    {"training.max_norm", CT_OPT_FLOAT, "1.0", "clip gradients to this global norm (<= 0: no clipping)", NULL, NULL},
    {"training.seed", CT_OPT_INT, "0", "seed for initialisation and data order", NULL, NULL},
    {"training.mixed_precision_param", CT_OPT_STRING, "float32",
     "float32 | bfloat16 (parameters rounded to bf16 for compute; fp32 master weights)", NULL, "float32|bfloat16"},
    {"activation_checkpoint.mode", CT_OPT_STRING, "selective", "none | full | selective", NULL, "none|full|selective"},
    {"activation_checkpoint.selective_ac_option", CT_OPT_STRING, "2",
     "selective: N = checkpoint every Nth transformer block; op = torchtitan's per-op policy", NULL, NULL},
    {"activation_offload.layers", CT_OPT_INT, "0",
     "what the first N transformer blocks keep for backward waits in host memory, copied beside compute (0: none)",
     "[0, 1048576]", NULL},
    {"metrics.log_freq", CT_OPT_INT, "10", "log every N steps (and the first and last)", "[1, 1e12]", NULL},
    {"metrics.peak_tflops", CT_OPT_FLOAT, "0",
     "the device peak MFU is against, in TFLOP/s (a datasheet figure); 0: measure the device's matmul peak at start-up",
     "[0, 1e9]", NULL},
    {"metrics.enable_tensorboard", CT_OPT_BOOL, "false",
     "also write each metrics record as TensorBoard scalars, under metrics.save_tb_folder/RUN_ID", NULL, NULL},
    {"metrics.save_tb_folder", CT_OPT_STRING, "tb", "TensorBoard's folder, under job.dump_folder unless absolute",
     NULL, NULL},
    {"metrics.enable_wandb", CT_OPT_BOOL, "false", "(refused when true: TensorBoard is the supported logger)", NULL, NULL},
    {"profiling.enable_profiling", CT_OPT_BOOL, "false",
     "write Chrome traces (host ranges, device ops, collectives, memory counters), all ranks merged", NULL, NULL},
    {"profiling.save_traces_folder", CT_OPT_STRING, "profile_traces", "under job.dump_folder; iteration_N per window",
     NULL, NULL},
    {"profiling.profile_freq", CT_OPT_INT, "10", "trace the last profiler_active steps of every N; snapshot every N",
     NULL, NULL},
    {"profiling.profiler_active", CT_OPT_INT, "1", "steps traced per profile_freq window", NULL, NULL},
    {"profiling.profiler_warmup", CT_OPT_INT, "3", "torchtitan's warmup steps before the active ones (not recorded)",
     NULL, NULL},
    {"profiling.enable_memory_snapshot", CT_OPT_BOOL, "false", "write what is live at each profile_freq step's peak",
     NULL, NULL},
    {"profiling.save_memory_snapshot_folder", CT_OPT_STRING, "memory_snapshot", "under job.dump_folder", NULL, NULL},
    {"checkpoint.enable", CT_OPT_BOOL, "false", "save checkpoints and resume from the newest one in the folder",
     NULL, NULL},
    {"checkpoint.folder", CT_OPT_STRING, "checkpoint", "under job.dump_folder; one step-N folder per save", NULL, NULL},
    {"checkpoint.interval", CT_OPT_INT, "500", "save every N steps", "[1, 1e12]", NULL},
    {"checkpoint.keep_latest_k", CT_OPT_INT, "10", "keep the newest k checkpoints (0: all)", "[0, 1e9]", NULL},
    {"checkpoint.load_step", CT_OPT_INT, "-1", "resume from this step (-1: the newest)", "[-1, 1e12]", NULL},
    {"checkpoint.initial_load_path", CT_OPT_STRING, NULL,
     "a step folder (or a checkpoint folder: its newest) to start from when the run's own folder has none", NULL, NULL},
    {"checkpoint.initial_load_model_only", CT_OPT_BOOL,
     "true", "initial load: the model only, not optimizer and state", NULL, NULL},
    {"checkpoint.initial_load_in_hf", CT_OPT_BOOL, "false",
     "initial_load_path is a Hugging Face folder (read by the model pack's table)", NULL, NULL},
    {"checkpoint.last_save_model_only", CT_OPT_BOOL, "true", "the final save holds the model only", NULL, NULL},
    {"checkpoint.last_save_in_hf", CT_OPT_BOOL,
     "false", "also write the final model as a Hugging Face folder (checkpoint/step-N-hf/)", NULL, NULL},
    {"checkpoint.export_dtype", CT_OPT_STRING, "float32", "float32 | bfloat16: the final model-only save's values",
     NULL, "float32|bfloat16"},
    {"checkpoint.async_mode", CT_OPT_STRING, "disabled", "disabled | async (files written by a background thread)",
     NULL, "disabled|async"},
    {"checkpoint.exclude_from_loading", CT_OPT_STRING, "",
     "comma-separated: optimizer, lr_scheduler, dataloader (start those fresh on resume)", NULL, NULL},
    {"checkpoint.allow_config_change", CT_OPT_BOOL,
     "false", "resume although seed, seq_len or model differ from the checkpoint's", NULL, NULL},
    {"checkpoint.create_seed_checkpoint", CT_OPT_BOOL, "false", "initialise, save step-0 (model only) and exit",
     NULL, NULL},
    {"quantize.dense.name", CT_OPT_STRING, "float8",
     "the quantizer plugin of the dense linear layers: its options are quantize.dense.NAME.*, and its own enable "
     "option turns it on", NULL, NULL},
    {"quantize.linear.float8.recipe_name", CT_OPT_STRING, NULL, "torchtitan's spelling of quantize.dense.float8.format",
     NULL, "tensorwise|rowwise|rowwise_with_gw_hp"},
    {"quantize.linear.float8.filter_fqns", CT_OPT_STRING, NULL, "torchtitan's spelling of the filter", NULL, NULL},
    {"quantize.linear.float8.emulate", CT_OPT_BOOL, NULL, "torchtitan's spelling of quantize.dense.float8.emulate",
     NULL, NULL},
    {"quantize.linear.float8.enable_fsdp_float8_all_gather", CT_OPT_BOOL, "false", "torchtitan's spelling", NULL, NULL},
    {"quantize.linear.mx.recipe_name", CT_OPT_STRING, NULL, "torchtitan's MX recipe (mxfp8, mxfp8_cublas ...)",
     NULL, "mxfp8|mxfp8_cublas|mxfp8_cublas_rceil|mxfp8_rceil"},
    {"quantize.linear.mx.filter_fqns", CT_OPT_STRING, NULL, "torchtitan's spelling of the filter", NULL, NULL},
    {"model.converters", CT_OPT_STRING, NULL,
     "torchtitan's converters list: float8 / quantize.linear.float8 / mx / quantize.linear.mx enable float8; "
     "quantize.grouped_mm.float8 / quantize.grouped_mm.mx the MoE experts' (alone: the experts only)",
     NULL, NULL},
    {"generate.max_new_tokens", CT_OPT_INT, "0", "after training, sample this many tokens (0: none)",
     "[0, 1048576]", NULL},
    {"generate.top_p", CT_OPT_FLOAT, "1.0", "nucleus sampling: the smallest set of tokens with this much probability",
     "(0, 1]", NULL},
    {"generate.seed", CT_OPT_INT, NULL, "sampling seed (default: training.seed)", NULL, NULL},
    {"generate.prompt", CT_OPT_STRING, "", "text to continue", NULL, NULL},
    {"generate.temperature", CT_OPT_FLOAT, "0.8", "sampling temperature (0: greedy)", "[0, 100]", NULL},
    {"generate.top_k", CT_OPT_INT, "40", "sample among the k most likely tokens (0: all)", "[0, 16777216]", NULL},
    {"comm.name", CT_OPT_STRING, "mpi", "communication plugin, loaded when the job has several ranks", NULL, NULL},
    {"comm.train_timeout_seconds", CT_OPT_FLOAT, "300", "bound on every collective: a dead or stuck rank ends the job",
     "(0, 1e9]", NULL},
    {"comm.init_timeout_seconds", CT_OPT_FLOAT, "300", "bound on joining the job (where the plugin can bound it)",
     "(0, 1e9]", NULL},
    {"parallelism.dp_strategy", CT_OPT_STRING, "auto",
     "auto (fsdp when data_parallel_shard_degree > 1 or context_parallel_degree > 1, ddp when only replicate > 1) | none | zero1 | zero2 (Megatron's distributed optimizer) | a plugin name or path",
     NULL, NULL},
    {"parallelism.data_parallel_replicate_degree", CT_OPT_INT, "1", "DDP/HSDP replicas", "[1, 1048576]", NULL},
    {"parallelism.data_parallel_shard_degree", CT_OPT_INT, "-1", "FSDP degree; -1 = ranks left over",
     "[-1, 1048576]", NULL},
    {"parallelism.tensor_parallel_degree", CT_OPT_INT, "1", "tensor parallel degree", "[1, 1048576]", NULL},
    {"parallelism.strategies", CT_OPT_STRING, NULL,
     "the strategies in the order they are applied (each wraps the builder the ones before it wrapped): plugin "
     "names or paths, and dp for the one dp_strategy picks, the data-parallel one last; default: tp_strategy, "
     "cp_strategy, ep_strategy, dp (torchtitan's order)",
     NULL, NULL},
    {"parallelism.tp_strategy", CT_OPT_STRING, "tp",
     "the strategy plugin serving the tp mesh axis (a name or a path); it declares its own parallelism.* keys",
     NULL, NULL},
    {"parallelism.cp_strategy", CT_OPT_STRING, "cp",
     "the strategy plugin serving the cp mesh axis (a name or a path); it declares its own parallelism.* keys",
     NULL, NULL},
    {"plan.hardware", CT_OPT_STRING, "",
     "the hardware profile (a name in configs/hardware/ or a file, e.g. from `ctitan plan --calibrate`) that "
     "`--dry-run` and the start-up prediction plan against; empty: memory only", NULL, NULL},
    {"plan.mean_document_length", CT_OPT_FLOAT, "0",
     "block_causal: the mean document length the planner prices attention at; 0: measured from "
     "training.dataset_path (tokens per EOS)", "[0, 1e9]", NULL},
    {"plan.ep_load_imbalance", CT_OPT_FLOAT, "1",
     "expert parallel: the tokens the busiest ep rank's experts receive over a balanced share (1: routing "
     "perfectly balanced); the planner times its all-to-alls and experts' GEMMs at that", "[1, 1000]", NULL},
    {"compile.enable", CT_OPT_BOOL, "false",
     "capture a microbatch's forward and backward as a device graph and launch it from then on (CUDA; one rank, no float8)",
     NULL, NULL},
    {"parallelism.pipeline_parallel_degree", CT_OPT_INT, "1", "pipeline parallel degree", "[1, 1048576]", NULL},
    {"parallelism.pipeline_parallel_schedule", CT_OPT_STRING, "1F1B",
     "GPipe | 1F1B | Interleaved1F1B | LoopedBFS | InterleavedZeroBubble | ZBVZeroBubble | DualPipeV | CSV | a schedule "
     "plugin's path",
     NULL, NULL},
    {"parallelism.pipeline_parallel_schedule_csv", CT_OPT_STRING,
     "", "the CSV schedule's file: one row of actions per pp rank", NULL, NULL},
    {"parallelism.pipeline_parallel_microbatch_size", CT_OPT_INT, "1", "sequences per pipeline microbatch",
     "[1, 1048576]", NULL},
    {"parallelism.pipeline_parallel_layers_per_stage", CT_OPT_INT, "0",
     "layers per stage (the embedding and output counted as below); 0: the schedule's stages per rank",
     "[0, 1048576]", NULL},
    {"parallelism.pipeline_parallel_first_stage_less_layers", CT_OPT_INT, "1", "the embedding counts as this many layers",
     "[0, 1048576]", NULL},
    {"parallelism.pipeline_parallel_last_stage_less_layers", CT_OPT_INT, "1", "the output counts as this many layers",
     "[0, 1048576]", NULL},
    {"parallelism.pipeline_parallel_stage_units", CT_OPT_STRING, "", "units per stage, e.g. \"3,3,2\" (overrides the above)",
     NULL, NULL},
    {"parallelism.pipeline_runner", CT_OPT_STRING, "pp", "the pipeline runner plugin (a name or a path)", NULL, NULL},
    {"parallelism.expert_parallel_degree", CT_OPT_INT, "1",
     "expert parallel degree: the MoE experts split over this many ranks borrowed from dp_shard x cp (must divide it)",
     "[1, 1048576]", NULL},
    {"parallelism.ep_strategy", CT_OPT_STRING, "ep",
     "the strategy plugin serving expert parallel (a name or a path); it declares its own parallelism.* keys",
     NULL, NULL},
    {"parallelism.context_parallel_degree", CT_OPT_INT, "1",
     "context parallel degree: each sequence split over cp ranks in 2 x cp load-balanced chunks (FSDP shards over dp_shard x cp)",
     "[1, 1048576]", NULL},
};


static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }
static int is_choice(const char *choices, const char *s);

/* ---- the values, found by a hash of their key (a manifest may hold MF_MAX_KEYS of them) ---- */
static uint64_t key_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The slot that holds `key`, or the empty slot where it would go. */
static int *index_slot(const manifest *m, const char *key) {
    size_t mask = m->index_cap - 1;
    for (size_t i = key_hash(key) & mask;; i = (i + 1) & mask) {
        int *slot = &m->index[i];
        if (!*slot || strcmp(m->values[*slot - 1].key, key) == 0) return slot;
    }
}

/* Makes room for one more value: the table stays under half full, so probes stay short. CT_OK, or
 * CT_ERR_NOMEM with nothing set (add_value says where). */
static ct_status index_reserve(manifest *m) {
    if ((size_t)(m->n_values + 1) * 2 < m->index_cap) return CT_OK;
    size_t cap = m->index_cap ? m->index_cap * 2 : 64;
    int *grown = calloc(cap, sizeof *grown);
    if (!grown) return CT_ERR_NOMEM;
    free(m->index);
    m->index = grown;
    m->index_cap = cap;
    for (int i = 0; i < m->n_values; i++) *index_slot(m, m->values[i].key) = i + 1;
    return CT_OK;
}

static mf_value *find_value(const manifest *m, const char *key) {
    if (!m->index_cap) return NULL; /* no value added yet */
    int at = *index_slot(m, key);
    return at ? &m->values[at - 1] : NULL;
}

/* An item key of a list of maps ("training.dataset[3].path") is declared once for every item, with
 * the index left out ("training.dataset[].path"). */
static const char *schema_name(const char *key, char *buf, size_t len) {
    const char *open = strchr(key, '[');
    if (!open) return key;
    size_t digits = strspn(open + 1, "0123456789");
    if (!digits || open[1 + digits] != ']') return key;
    snprintf(buf, len, "%.*s[]%s", (int)(open - key), key, open + 2 + digits);
    return buf;
}

static const mf_schema_entry *find_schema(const manifest *m, const char *key) {
    char buf[MF_MAX_KEY_LEN + 1];
    key = schema_name(key, buf, sizeof buf);
    for (int i = 0; i < m->n_schema; i++)
        if (strcmp(m->schema[i].key, key) == 0) return &m->schema[i];
    return NULL;
}

/* Whether the schema declares item keys for `key` (a list of maps may be given there). */
static int takes_items(const manifest *m, const char *key) {
    size_t n = strlen(key);
    for (int i = 0; i < m->n_schema; i++)
        if (!strncmp(m->schema[i].key, key, n) && !strncmp(m->schema[i].key + n, "[].", 3)) return 1;
    return 0;
}

/* Adds a key that is not there yet (callers check with find_value). CT_OK, or CT_ERR_NOMEM with
 * "path: out of memory" set. */
static ct_status add_value(manifest *m, const char *key, const char *value, int is_seq, int line) {
    if (index_reserve(m) != CT_OK) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", m->path);
    if (m->n_values == m->values_cap) { /* doubling: a copy per key would be quadratic */
        int cap = m->values_cap ? 2 * m->values_cap : 32;
        mf_value *grown = realloc(m->values, sizeof(*grown) * (size_t)cap);
        if (!grown) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", m->path);
        m->values = grown;
        m->values_cap = cap;
    }
    mf_value *v = &m->values[m->n_values];
    v->key = xstrdup(key);
    v->value = xstrdup(value);
    v->is_seq = is_seq;
    v->line = line;
    v->flag = MF_FLAG_NONE;
    if (!v->key || (value && !v->value)) {
        free(v->key);
        free(v->value);
        return ct_fail(CT_ERR_NOMEM, "%s: out of memory", m->path);
    }
    *index_slot(m, key) = ++m->n_values;
    return CT_OK;
}

/* ---- reading the YAML ---- */
typedef struct flattener {
    manifest *m;
    yaml_document_t *doc;
    long nodes; /* visited so far, aliases expanded */
    const mf_data_format *data; /* manifest_load_data's file; NULL: a manifest */
} flattener;

/* The format of the file being read: a manifest's, or a data file's own (manifest_load_data). */
static const mf_data_format manifest_format = {
    "manifest", "the manifest must be a map of sections (job:, model:, training: ...)", MF_MAX_DEPTH, MF_MAX_KEYS};
static const mf_data_format *format_of(const flattener *f) { return f->data ? f->data : &manifest_format; }

/* Nodes visited while flattening: a data file has no aliases, so two (a key and its value) per entry. */
static long max_nodes(const flattener *f) { return f->data ? 2L * f->data->max_keys + 1 : MF_MAX_NODES; }

static int is_null(const yaml_node_t *v) {
    const char *s = (const char *)v->data.scalar.value;
    return v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL"));
}

/* Counts one visited node against MF_MAX_NODES. */
static ct_status visit(flattener *f, const yaml_node_t *n) {
    if (++f->nodes <= max_nodes(f)) return CT_OK;
    return ct_fail(CT_ERR_INVALID, "%s:%d: the %s expands to more than %ld nodes (aliases counted each time "
                   "they are used)", f->m->path, (int)n->start_mark.line + 1, format_of(f)->what, max_nodes(f));
}

/* A sequence value becomes one string, its items joined with ','. */
static ct_status join_list(flattener *f, const yaml_node_t *v, const char *key, int line) {
    char buf[4096] = "";
    size_t used = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        yaml_node_t *item = yaml_document_get_node(f->doc, *it);
        if (visit(f, item)) return CT_ERR_INVALID;
        if (item->type != YAML_SCALAR_NODE)
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s: list items must be plain values", f->m->path,
                           (int)item->start_mark.line + 1, key);
        int n = snprintf(buf + used, sizeof buf - used, "%s%s", used ? "," : "", (const char *)item->data.scalar.value);
        if (n < 0 || (size_t)n >= sizeof buf - used)
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s: list too long", f->m->path, line, key);
        used += (size_t)n;
    }
    return add_value(f->m, key, buf, 1, line);
}

/* A list of maps (training.dataset: [{path: a, weight: 2}, ...]): item i's keys flatten under
 * "key[i]", and the key itself holds the item count (is_seq 2). */
static ct_status flatten(flattener *f, yaml_node_t *node, const char *prefix, int depth);
static ct_status flatten_items(flattener *f, const yaml_node_t *v, const char *key, int line, int depth) {
    int n = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++, n++) {
        yaml_node_t *item = yaml_document_get_node(f->doc, *it);
        if (visit(f, item)) return CT_ERR_INVALID;
        if (item->type != YAML_MAPPING_NODE)
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s[%d]: a list of maps takes maps only (- {path: ..., weight: ...})",
                           f->m->path, (int)item->start_mark.line + 1, key, n);
        char sub[MF_MAX_KEY_LEN + 1];
        if (snprintf(sub, sizeof sub, "%s[%d]", key, n) >= (int)sizeof sub)
            return ct_fail(CT_ERR_INVALID, "%s:%d: key '%.40s...' is longer than %d characters", f->m->path, line, key,
                           MF_MAX_KEY_LEN);
        ct_status st = flatten(f, item, sub, depth + 1);
        if (st != CT_OK) return st;
    }
    char count[32];
    snprintf(count, sizeof count, "%d", n);
    return add_value(f->m, key, count, 2, line);
}

/* One value of a data file (manifest_load_data): a scalar as written (NULL for an empty value), a map as an
 * entry of its own (MF_MAP) before its keys, a list as its item count (MF_ITEMS) before its items, each
 * "key[i]" and any value. */
static ct_status data_value(flattener *f, yaml_node_t *v, const char *key, int line, int depth) {
    manifest *m = f->m;
    if (m->n_values >= f->data->max_keys)
        return ct_fail(CT_ERR_INVALID, "%s:%d: %s: more than %d keys, maps, lists and items", m->path, line, key,
                       f->data->max_keys);
    if (v->type == YAML_SCALAR_NODE)
        return add_value(m, key, is_null(v) ? NULL : (const char *)v->data.scalar.value, 0, line);
    if (v->type == YAML_MAPPING_NODE) {
        ct_status st = add_value(m, key, NULL, MF_MAP, line);
        return st != CT_OK ? st : flatten(f, v, key, depth + 1);
    }
    char count[32];
    snprintf(count, sizeof count, "%d", (int)(v->data.sequence.items.top - v->data.sequence.items.start));
    ct_status st = add_value(m, key, count, MF_ITEMS, line);
    int i = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; st == CT_OK && it < v->data.sequence.items.top; it++) {
        yaml_node_t *item = yaml_document_get_node(f->doc, *it);
        char sub[MF_MAX_KEY_LEN + 1];
        if ((st = visit(f, item)) != CT_OK) break;
        if (snprintf(sub, sizeof sub, "%s[%d]", key, i++) >= (int)sizeof sub)
            return ct_fail(CT_ERR_INVALID, "%s:%d: key '%.40s...' is longer than %d characters", m->path, line, key,
                           MF_MAX_KEY_LEN);
        st = data_value(f, item, sub, (int)item->start_mark.line + 1, depth + 1);
    }
    return st;
}

/* Flattens a YAML mapping node into dotted keys. `depth` counts the maps around it, aliases
 * expanded, so a map that holds an alias of itself ends at MF_MAX_DEPTH. */
static ct_status flatten(flattener *f, yaml_node_t *node, const char *prefix, int depth) {
    manifest *m = f->m;
    if (depth > format_of(f)->max_depth)
        return ct_fail(CT_ERR_INVALID, "%s:%d: maps nested deeper than %d levels (aliases expanded)", m->path,
                       (int)node->start_mark.line + 1, format_of(f)->max_depth);
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(f->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(f->doc, p->value);
        int line = (int)k->start_mark.line + 1;
        if (visit(f, k) || visit(f, v)) return CT_ERR_INVALID;
        const char *in = *prefix ? ": " : ""; /* the map holding the key, when it is not the root */
        if (k->type != YAML_SCALAR_NODE)
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s%skeys must be plain names", m->path, line, prefix, in);
        const char *kname = (const char *)k->data.scalar.value;
        if (!*kname || strchr(kname, '.') || (f->data && strpbrk(kname, "[]")))
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s%s'%.80s': keys are plain names; nest sections as maps", m->path,
                           line, prefix, in, kname);
        char key[MF_MAX_KEY_LEN + 1];
        if (snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", kname) >= (int)sizeof key)
            return ct_fail(CT_ERR_INVALID, "%s:%d: key '%.40s...' is longer than %d characters", m->path, line, kname,
                           MF_MAX_KEY_LEN);
        ct_status st = CT_OK;
        const mf_value *first = find_value(m, key);
        if (f->data && first) /* a map given twice is refused too: its keys would merge unseen */
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s: duplicate %s (first given at line %d)", m->path, line, key,
                           !*prefix && first->is_seq == MF_MAP ? "section" : "key", first->line);
        if (f->data) {
            if ((st = data_value(f, v, key, line, depth)) != CT_OK) return st;
            continue;
        }
        if (v->type == YAML_MAPPING_NODE) {
            if ((st = flatten(f, v, key, depth + 1)) != CT_OK) return st;
            continue;
        }
        if (!*prefix)
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s: a top-level key must be a section (a map of keys)", m->path,
                           line, key);
        if (first)
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s: duplicate key (first given at line %d)", m->path, line, key,
                           first->line);
        if (m->n_values >= MF_MAX_KEYS)
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s: more than %d keys", m->path, line, key, MF_MAX_KEYS);
        if (v->type == YAML_SCALAR_NODE && is_null(v))
            return ct_fail(CT_ERR_INVALID, "%s:%d: %s: no value (an empty value, ~ or null); give one, or leave the "
                           "key out for its default", m->path, line, key);
        int maps = v->type == YAML_SEQUENCE_NODE && v->data.sequence.items.start < v->data.sequence.items.top &&
                   yaml_document_get_node(f->doc, *v->data.sequence.items.start)->type == YAML_MAPPING_NODE;
        if (maps) st = flatten_items(f, v, key, line, depth);
        else if (v->type != YAML_SCALAR_NODE) st = join_list(f, v, key, line);
        else st = add_value(m, key, (const char *)v->data.scalar.value, 0, line);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* torchtitan's configs are TOML: "[section]" tables and "key = value" lines. Returns the line of the
 * first table header when the text has both, else 0. */
static int toml_header_line(const char *buf, size_t n) {
    int line = 1, header = 0, assign = 0;
    for (size_t i = 0; i < n; line++) {
        size_t j = i;
        while (j < n && buf[j] != '\n') j++;
        const char *s = buf + i, *e = memchr(s, '#', j - i);
        if (!e) e = buf + j;
        while (s < e && (*s == ' ' || *s == '\t')) s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) e--;
        size_t w = 0;
        while (s + w < e && (isalnum((unsigned char)s[w]) || s[w] == '_' || s[w] == '-' || s[w] == '.')) w++;
        if (e - s > 2 && *s == '[' && e[-1] == ']' && !header) {
            const char *c = s;
            while (c < e && (isalnum((unsigned char)*c) || strchr("[]_-.\" ", *c))) c++;
            if (c == e) header = line;
        } else if (w) {
            const char *c = s + w;
            while (c < e && (*c == ' ' || *c == '\t')) c++;
            assign |= c < e && *c == '=';
        }
        i = j + 1;
    }
    return header && assign ? header : 0;
}

/* One leaf of a TOML file (toml_shim.h) into the manifest, with the checks flatten makes on YAML's. */
static ct_status toml_leaf(void *ctx, const char *key, const char *value, int kind, int line) {
    manifest *m = ctx;
    if (strlen(key) > MF_MAX_KEY_LEN)
        return ct_fail(CT_ERR_INVALID, "%s:%d: key '%.40s...' is longer than %d characters", m->path, line, key,
                       MF_MAX_KEY_LEN);
    if (!strchr(key, '.'))
        return ct_fail(CT_ERR_INVALID, "%s:%d: %s: a top-level key must be a section ([section], then key = value)",
                       m->path, line, key);
    if (kind == MF_TOML_NESTED) { /* torchtitan's module_fqns_per_model_part: refused with its reason */
        const tt_key *t = tt_key_find(key);
        if (t && !t->accept) ct_set_error("%s:%d: %s: torchtitan's key is not supported: %s", m->path, line, key,
                                          t->reason);
        else ct_set_error("%s:%d: %s: list items must be plain values", m->path, line, key);
        return CT_ERR_INVALID;
    }
    if (find_value(m, key)) return ct_fail(CT_ERR_INVALID, "%s:%d: %s: duplicate key", m->path, line, key);
    if (m->n_values >= MF_MAX_KEYS)
        return ct_fail(CT_ERR_INVALID, "%s:%d: %s: more than %d keys", m->path, line, key, MF_MAX_KEYS);
    return add_value(m, key, value, kind == MF_TOML_LIST ? 1 : kind == MF_TOML_ITEMS ? 2 : 0, line);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Streams the parser's events once before loading: refuses a second document, nesting deeper than
 * the format's depth, and more anchors or aliases than allowed (a data file: any), stopping as soon as
 * one is seen (libyaml itself has no depth limit, and its scanner slows down with the depth of flow
 * collections). CT_OK (*toml 1 for text that is no YAML but reads as TOML; a data file passes no toml),
 * or CT_ERR_INVALID with the error set. */
static ct_status check_events(const char *path, const unsigned char *buf, size_t n, const mf_data_format *fmt,
                              int *toml) {
    yaml_parser_t p;
    yaml_event_t e;
    int depth = 0, docs = 0, anchors = 0, aliases = 0, data = !toml;
    ct_status rc = CT_ERR_INVALID;
    if (!yaml_parser_initialize(&p)) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    yaml_parser_set_input_string(&p, buf, n);
    for (;;) {
        if (!yaml_parser_parse(&p, &e)) {
            if (!data && toml_header_line((const char *)buf, n)) { /* TOML with a .yaml (or no) suffix */
                *toml = 1;
                rc = CT_OK;
            } else
                ct_set_error("%s:%d:%d: YAML syntax error: %s%s%s", path, (int)p.problem_mark.line + 1,
                             (int)p.problem_mark.column + 1, p.problem ? p.problem : "unknown", p.context ? " " : "",
                             p.context ? p.context : "");
            break;
        }
        int line = (int)e.start_mark.line + 1, done = e.type == YAML_STREAM_END_EVENT;
        const char *anchor = e.type == YAML_SCALAR_EVENT           ? (const char *)e.data.scalar.anchor
                             : e.type == YAML_MAPPING_START_EVENT  ? (const char *)e.data.mapping_start.anchor
                             : e.type == YAML_SEQUENCE_START_EVENT ? (const char *)e.data.sequence_start.anchor
                                                                   : NULL;
        if (e.type == YAML_MAPPING_START_EVENT || e.type == YAML_SEQUENCE_START_EVENT) depth++;
        if (e.type == YAML_MAPPING_END_EVENT || e.type == YAML_SEQUENCE_END_EVENT) depth--;
        anchors += anchor != NULL;
        aliases += e.type == YAML_ALIAS_EVENT;
        docs += e.type == YAML_DOCUMENT_START_EVENT;
        yaml_event_delete(&e);
        if (docs > 1)
            ct_set_error("%s:%d: a second YAML document starts here; a %s is one document", path, line, fmt->what);
        else if (depth > fmt->max_depth)
            ct_set_error("%s:%d: maps and lists nested deeper than %d levels", path, line, fmt->max_depth);
        else if (data && (anchors || aliases))
            ct_set_error("%s:%d: an anchor or alias (&name, *name); a %s has none", path, line, fmt->what);
        else if (anchors > MF_MAX_ANCHORS)
            ct_set_error("%s:%d: more than %d anchors (&name)", path, line, MF_MAX_ANCHORS);
        else if (aliases > MF_MAX_ALIASES)
            ct_set_error("%s:%d: more than %d aliases (*name)", path, line, MF_MAX_ALIASES);
        else if (done) rc = CT_OK;
        else continue;
        break;
    }
    yaml_parser_delete(&p);
    return rc;
}

/* The whole file, refused past MF_MAX_BYTES. NULL with the error set. */
static unsigned char *read_capped(const char *path, const char *what, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ct_set_error("%s: cannot open %s: %s", path, what, strerror(errno));
        return NULL;
    }
    unsigned char *buf = malloc(MF_MAX_BYTES + 1);
    size_t got = buf ? fread(buf, 1, MF_MAX_BYTES + 1, f) : 0;
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) ct_set_error("%s: cannot read %s: %s", path, what, buf ? strerror(errno) : "out of memory");
    else if (got > MF_MAX_BYTES)
        ct_set_error("%s:1: the %s is larger than %d MiB", path, what, MF_MAX_BYTES >> 20);
    if (bad || got > MF_MAX_BYTES) {
        free(buf);
        return NULL;
    }
    *n = got;
    return buf;
}

/* A manifest (data NULL) or a data file in its format. */
static manifest *load(const char *path, const mf_data_format *data) {
    const mf_data_format *fmt = data ? data : &manifest_format;
    size_t n = 0;
    unsigned char *buf = read_capped(path, fmt->what, &n);
    if (!buf) return NULL;
    manifest *m = calloc(1, sizeof *m);
    yaml_parser_t parser;
    yaml_document_t doc;
    int have_doc = 0;
    if (!m || !yaml_parser_initialize(&parser)) {
        free(buf);
        free(m);
        ct_set_error("%s: out of memory", path);
        return NULL;
    }
    m->path = strdup(path);
    const char *slash = strrchr(path, '/');
    m->dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    if (!m->path || !m->dir) {
        ct_set_error("%s: out of memory", path);
        goto fail;
    }
    int toml = !data && has_suffix(path, ".toml");
    if (!toml && check_events(path, buf, n, fmt, data ? NULL : &toml) != CT_OK) goto fail;
    if (!toml) {
        yaml_parser_set_input_string(&parser, buf, n);
        if (!yaml_parser_load(&parser, &doc)) {
            ct_set_error("%s:%d:%d: YAML syntax error: %s%s%s", path, (int)parser.problem_mark.line + 1,
                         (int)parser.problem_mark.column + 1, parser.problem ? parser.problem : "unknown",
                         parser.context ? " " : "", parser.context ? parser.context : "");
            goto fail;
        }
        have_doc = 1;
    }
    yaml_node_t *root = have_doc ? yaml_document_get_root_node(&doc) : NULL;
    if (!data && root && root->type != YAML_MAPPING_NODE && toml_header_line((const char *)buf, n)) toml = 1;
    if (toml) { /* torchtitan's configs: [section] tables, key = value */
        if (mf_toml_parse(path, (const char *)buf, n, MF_MAX_DEPTH, toml_leaf, m) != CT_OK) goto fail;
    } else if (root) {
        if (root->type != YAML_MAPPING_NODE) {
            ct_set_error("%s:%d: %s", path, (int)root->start_mark.line + 1, fmt->root);
            goto fail;
        }
        flattener f = {m, &doc, 0, data};
        if (flatten(&f, root, "", 1) != CT_OK) goto fail;
    }
    if (have_doc) yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(buf);
    return m;
fail:
    if (have_doc) yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(buf);
    manifest_free(m);
    return NULL;
}

manifest *manifest_load(const char *path) { return load(path, NULL); }
manifest *manifest_load_data(const char *path, const mf_data_format *format) { return load(path, format); }

const mf_value *mf_find(const manifest *m, const char *key) { return find_value(m, key); }

/* Removes the item keys of the list of maps at `key` ("key[N]..."), then rebuilds the index. */
static void drop_items(manifest *m, const char *key) {
    size_t n = strlen(key);
    int kept = 0;
    for (int i = 0; i < m->n_values; i++) {
        mf_value *v = &m->values[i];
        if (!strncmp(v->key, key, n) && v->key[n] == '[') {
            free(v->key);
            free(v->value);
            continue;
        }
        m->values[kept++] = *v;
    }
    m->n_values = kept;
    memset(m->index, 0, sizeof(int) * m->index_cap);
    for (int i = 0; i < m->n_values; i++) *index_slot(m, m->values[i].key) = i + 1;
}

int mf_list_len(const manifest *m, const char *key) {
    const mf_value *v = find_value(m, key);
    int64_t n;
    return v && v->is_seq == 2 && !mf_parse_int(v->value, &n) ? (int)n : -1;
}

ct_status manifest_override(manifest *m, const char *key, const char *value) {
    if (!*key || key[0] == '.' || key[strlen(key) - 1] == '.' || !strchr(key, '.'))
        return ct_fail(CT_ERR_INVALID, "command line: --%s: expected --section.key=value", key);
    mf_value *v = find_value(m, key);
    if (v && v->is_seq == 2) { /* a value replaces the whole list: its items go */
        drop_items(m, key);
        v = find_value(m, key);
    }
    if (v) {
        free(v->value);
        v->value = xstrdup(value);
        v->is_seq = 0;
        v->line = 0;
        v->flag = MF_FLAG_NONE;
        return CT_OK;
    }
    if (add_value(m, key, value, 0, 0) != CT_OK)
        return ct_fail(CT_ERR_NOMEM, "command line: --%s: out of memory", key);
    return CT_OK;
}

ct_status manifest_override_flag(manifest *m, const char *key, int flag) {
    ct_status st = manifest_override(m, key, flag == MF_FLAG_NEGATED ? "false" : "true");
    if (st != CT_OK) return st;
    find_value(m, key)->flag = flag;
    return CT_OK;
}

ct_status manifest_cli_key(const char *arg, char *key, size_t keylen, const char **value, int *negated) {
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    *value = eq ? eq + 1 : NULL;
    *negated = 0;
    if (n >= keylen)
        return ct_fail(CT_ERR_INVALID, "command line: %.60s...: the key is longer than %zu characters", arg,
                       keylen - 1);
    if (!strncmp(name, "no-", 3) && memchr(name, '.', n)) { /* --no-section.key */
        *negated = 1;
        name += 3;
        n -= 3;
    }
    memcpy(key, name, n);
    key[n] = 0;
    for (char *c = key; *c; c++)
        if (*c == '-') *c = '_'; /* tyro spells keys with '-' as well as '_' */
    char *last = strrchr(key, '.');
    if (!*negated && last && !strncmp(last + 1, "no_", 3) && last[4] && manifest_core_type(key) < 0) {
        memmove(last + 1, last + 4, strlen(last + 4) + 1); /* --section.no-key, tyro's spelling */
        *negated = 1;
    }
    if (*negated && *value)
        return ct_fail(CT_ERR_INVALID, "command line: %s: a negated flag takes no value (--%s=false, or --no-%s "
                       "alone)", arg, key, key);
    return CT_OK;
}

int manifest_core_type(const char *key) {
    for (size_t i = 0; i < sizeof core_schema / sizeof core_schema[0]; i++)
        if (!strcmp(core_schema[i].key, key)) return (int)core_schema[i].type;
    return -1;
}

manifest *manifest_new(void) {
    manifest *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->path = strdup("command line");
    m->dir = strdup(".");
    if (m->path && m->dir) return m;
    manifest_free(m);
    return NULL;
}

/* Removes one value and rebuilds the index. */
static void drop_value(manifest *m, const char *key) {
    mf_value *v = find_value(m, key);
    if (!v) return;
    free(v->key);
    free(v->value);
    memmove(v, v + 1, sizeof *v * (size_t)(m->n_values - (v - m->values) - 1));
    m->n_values--;
    memset(m->index, 0, sizeof(int) * m->index_cap);
    for (int i = 0; i < m->n_values; i++) *index_slot(m, m->values[i].key) = i + 1;
}

ct_status manifest_torchtitan(manifest *m, int reads_data) {
    char where[600], there[600], path[4096];
    for (const tt_key *t = tt_keys; t->key; t++) {
        const mf_value *from = find_value(m, t->key), *to = t->maps_to ? find_value(m, t->maps_to) : NULL;
        if (!t->maps_to || !from) continue;
        if (to && to->value && from->value && strcmp(to->value, from->value)) {
            mf_where(m, t->key, where, sizeof where);
            mf_where(m, t->maps_to, there, sizeof there);
            return ct_fail(CT_ERR_INVALID, "%s: '%.100s' disagrees with %s ('%.100s'); set one of them", where,
                           from->value, there, to->value);
        }
        ct_status st = manifest_alias(m, t->key, t->maps_to);
        if (st != CT_OK) return st;
    }
    /* debug.moe_force_load_balance true is the MoE packs' model.moe_force_load_balance (qwen3, deepseek_v3; a
     * pack without experts then refuses the key by name); false, routing as learned, is every model's */
    const mf_value *force = find_value(m, "debug.moe_force_load_balance");
    int force_on = 0;
    if (force && force->value && !mf_parse_bool(force->value, &force_on) && force_on) {
        const mf_value *to = find_value(m, "model.moe_force_load_balance");
        int to_on = 1;
        if (to && to->value && !mf_parse_bool(to->value, &to_on) && !to_on) {
            mf_where(m, "debug.moe_force_load_balance", where, sizeof where);
            mf_where(m, "model.moe_force_load_balance", there, sizeof there);
            return ct_fail(CT_ERR_INVALID, "%s: 'true' disagrees with %s ('%.100s'); set one of them", where, there,
                           to->value);
        }
        ct_status st = manifest_alias(m, "debug.moe_force_load_balance", "model.moe_force_load_balance");
        if (st != CT_OK) return st;
    }
    /* torchtitan names its datasets (c4, c4_test: Hugging Face downloads); ctitan reads token shards. The
     * name with a dataset_path beside it is torchtitan's way to give the local copy: the path is read. A
     * name is a valid value; it is refused only where a dataset must be read (training, validation when
     * enabled; never by a command that reads no data, reads_data 0: generate). */
    static const char *const sections[] = {"training", "validation"};
    for (int i = 0; i < 2; i++) {
        char key[64], key_path[64];
        snprintf(key, sizeof key, "%s.dataset", sections[i]);
        snprintf(key_path, sizeof key_path, "%s.dataset_path", sections[i]);
        const mf_value *v = find_value(m, key);
        if (!v || !v->value || v->is_seq || !is_choice("c4|c4_test|c4_validation", v->value) ||
            access(v->value, F_OK) == 0 || (snprintf(path, sizeof path, "%s/%s", m->dir, v->value) < (int)sizeof path &&
                                            access(path, F_OK) == 0))
            continue; /* not a name, or a file of that name */
        const mf_value *on = i ? find_value(m, "validation.enable") : NULL;
        int read = !i || (on && on->value && !mf_parse_bool(on->value, &read) && read);
        read = read && reads_data;
        if (find_value(m, key_path) || !read) { /* the path is read, or nothing is (validation off) */
            drop_value(m, key);
            continue;
        }
        mf_where(m, key, where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: '%s' is a torchtitan dataset name (a Hugging Face download); ctitan "
                       "reads token shards: set %s to a shard or folder from `ctitan tokenize` (or %s to a path)",
                       where, v->value, key_path, key);
    }
    return CT_OK;
}

ct_status manifest_alias(manifest *m, const char *from, const char *to) {
    const mf_value *src = find_value(m, from);
    if (!src || !src->value || (find_value(m, to) && find_value(m, to)->value)) return CT_OK;
    char *value = strdup(src->value);
    if (!value) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", m->path);
    int line = src->line, is_seq = src->is_seq;
    ct_status st = CT_OK;
    mf_value *dst = find_value(m, to);
    if (dst) {
        free(dst->value);
        dst->value = value;
        dst->line = line;
        dst->is_seq = is_seq;
    } else {
        st = add_value(m, to, value, is_seq, line);
        free(value);
    }
    return st;
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
        free(m->schema[i].range);
        free(m->schema[i].choices);
    }
    free(m->values);
    free(m->index);
    free(m->schema);
    free(m->path);
    free(m->dir);
    free(m);
}

static void schema_add(manifest *m, const char *key, ct_opt_type type, const char *def, const char *help,
                       int plugin, const char *range, const char *choices) {
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
    s->range = xstrdup(range);
    s->choices = xstrdup(choices);
}

void manifest_add_core_schema(manifest *m) {
    for (size_t i = 0; i < sizeof core_schema / sizeof core_schema[0]; i++) {
        schema_add(m, core_schema[i].key, core_schema[i].type, core_schema[i].def, core_schema[i].help, 0,
                   core_schema[i].range, core_schema[i].choices);
    }
}

/* opts steps by its entries' struct_size (ctitan/abi.h); the loader checked it covers help. */
void manifest_add_plugin_schema(manifest *m, const char *section, const ct_option_spec *opts) {
    for (int i = 0; opts && CT_AT(const ct_option_spec, opts, i)->key; i++) {
        const ct_option_spec *o = CT_AT(const ct_option_spec, opts, i);
        char key[512];
        if (strchr(o->key, '.')) snprintf(key, sizeof key, "%s", o->key); /* another section's key, spelled whole */
        else snprintf(key, sizeof key, "%s.%s", section, o->key);
        int checks = CT_HAS_FIELD(o, ct_option_spec, choices);
        schema_add(m, key, o->type, o->default_value, o->help, 1, checks ? o->range : NULL, checks ? o->choices : NULL);
    }
}

int manifest_has_unknown(const manifest *m, const char *prefix) {
    size_t n = strlen(prefix);
    for (int i = 0; i < m->n_values; i++)
        if (!strncmp(m->values[i].key, prefix, n) && !find_schema(m, m->values[i].key)) return 1;
    return 0;
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

int mf_is_set(const manifest *m, const char *key) { return find_value(m, key) != NULL; }

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

/* x lies in `range`, "[lo, hi]" with '(' / ')' for open ends. */
static int in_range(const char *range, double x) {
    char *end;
    double lo = strtod(range + 1, &end), hi = strtod(end + 1, NULL);
    char close = range[strlen(range) - 1];
    return (range[0] == '(' ? x > lo : x >= lo) && (close == ')' ? x < hi : x <= hi);
}

/* s is one of "a|b|c". */
static int is_choice(const char *choices, const char *s) {
    size_t n = strlen(s);
    for (const char *c = choices; *c; c += strcspn(c, "|"), c += *c == '|') {
        size_t w = strcspn(c, "|");
        if (w == n && strncmp(c, s, n) == 0) return 1;
    }
    return 0;
}

/* "a|b|c" as "a, b or c". */
static void choices_text(const char *choices, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (const char *c = choices; *c && used < len; c += strcspn(c, "|"), c += *c == '|') {
        int w = (int)strcspn(c, "|"), last = c[w] == 0;
        int n = snprintf(buf + used, len - used, "%s%.*s", used == 0 ? "" : last ? " or " : ", ", w, c);
        if (n < 0) break;
        used += (size_t)n;
    }
}

/* Levenshtein distance of two short strings (longer ones count as far apart). */
static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    size_t row[65];
    if (na > 64 || nb > 64) return SIZE_MAX;
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[nb];
}

/* " (did you mean 'x'?)" for the choice within two edits of s, else "". */
static void suggestion(const char *choices, const char *s, char *buf, size_t len) {
    size_t best = 3;
    buf[0] = 0;
    for (const char *c = choices; *c; c += strcspn(c, "|"), c += *c == '|') {
        size_t w = strcspn(c, "|"), d = edit_distance(s, strlen(s), c, w);
        if (d < best) {
            best = d;
            snprintf(buf, len, " (did you mean '%.*s'?)", (int)w, c);
        }
    }
}

/* One value against its schema entry: CT_OK, or CT_ERR_INVALID with the error set. */
static ct_status check_value(const manifest *m, const mf_value *v, const mf_schema_entry *s) {
    char where[600], text[600];
    int64_t iv = 0;
    double fv = 0;
    int bv, ok = 1;
    mf_where(m, v->key, where, sizeof where);
    if (!v->value) {
        ct_set_error("%s: no value; give one, or leave the key out for its default", where);
        return CT_ERR_INVALID;
    }
    if (v->flag == MF_FLAG_BARE && s->type != CT_OPT_BOOL) {
        ct_set_error("%s: needs a value (--%s=VALUE, %s); only a true/false key may be given bare", where,
                     v->key, type_name(s->type));
        return CT_ERR_INVALID;
    }
    if (v->flag == MF_FLAG_NEGATED && s->type != CT_OPT_BOOL) {
        ct_set_error("command line: --no-%s: not a true/false key (%s); give --%s=VALUE", v->key,
                     type_name(s->type), v->key);
        return CT_ERR_INVALID;
    }
    const char *open = strchr(v->key, '[');
    if (open && s->key[open - v->key] == '[') { /* an item of a list of maps: its list must hold it */
        char parent[MF_MAX_KEY_LEN + 1];
        snprintf(parent, sizeof parent, "%.*s", (int)(open - v->key), v->key);
        int n = mf_list_len(m, parent);
        char *end;
        errno = 0;
        long long at = strtoll(open + 1, &end, 10);
        if (open[1] == '0' && end != open + 2) { /* "[01]" would name no item the reader asks for */
            ct_set_error("%s: item index with a leading zero; expected %s[N] (N from 0)", where, parent);
            return CT_ERR_INVALID;
        }
        if (errno == ERANGE || at >= n) {
            if (n < 0) ct_set_error("%s: %s is not a list of maps here (the manifest or an override gave it one "
                                    "value)", where, parent);
            else ct_set_error("%s: %s has %d item%s (0 to %d)", where, parent, n, n == 1 ? "" : "s", n - 1);
            return CT_ERR_INVALID;
        }
    }
    if (v->is_seq == 2) {
        if (!takes_items(m, v->key)) {
            ct_set_error("%s: expected %s, got a list of maps", where, type_name(s->type));
            return CT_ERR_INVALID;
        }
        return CT_OK;
    }
    if (v->is_seq) ok = s->type == CT_OPT_STRING; /* a list of strings, joined with ',' */
    else if (s->type == CT_OPT_INT) ok = mf_parse_int(v->value, &iv) == 0;
    else if (s->type == CT_OPT_FLOAT) ok = mf_parse_float(v->value, &fv) == 0;
    else if (s->type == CT_OPT_BOOL) ok = mf_parse_bool(v->value, &bv) == 0;
    if (!ok) {
        ct_set_error("%s: expected %s, got '%.200s'", where, type_name(s->type), v->value);
        return CT_ERR_INVALID;
    }
    if (s->range && (s->type == CT_OPT_INT || s->type == CT_OPT_FLOAT) &&
        !in_range(s->range, s->type == CT_OPT_INT ? (double)iv : fv)) {
        ct_set_error("%s: expected %s in %s, got '%.200s'", where, type_name(s->type), s->range, v->value);
        return CT_ERR_INVALID;
    }
    if (s->choices && !is_choice(s->choices, v->value)) {
        char hint[128];
        choices_text(s->choices, text, sizeof text);
        suggestion(s->choices, v->value, hint, sizeof hint);
        ct_set_error("%s: expected %s, got '%.200s'%s", where, text, v->value, hint);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* Sizes computed from several keys: the batch is allocated from them before any memory check. */
static ct_status check_sizes(const manifest *m) {
    int64_t L, T, G;
    char where[600];
    if (mf_get_int(m, "training.local_batch_size", &L) || mf_get_int(m, "training.seq_len", &T)) return CT_OK;
    if (L * T > MF_MAX_MICROBATCH_TOKENS) {
        mf_where(m, "training.local_batch_size", where, sizeof where);
        ct_set_error("%s: %lld sequences of seq_len %lld are %lld tokens per microbatch; the limit is %d", where,
                     (long long)L, (long long)T, (long long)(L * T), MF_MAX_MICROBATCH_TOKENS);
        return CT_ERR_INVALID;
    }
    if (!mf_get_int(m, "training.global_batch_size", &G) && G * T > MF_MAX_STEP_TOKENS) {
        mf_where(m, "training.global_batch_size", where, sizeof where);
        ct_set_error("%s: %lld sequences of seq_len %lld are %lld tokens per step; the limit is %d", where,
                     (long long)G, (long long)T, (long long)(G * T), MF_MAX_STEP_TOKENS);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* Each item of the comma-separated list `s` is one of "a|b|c": NULL, or the first that is not. */
static const char *list_outsider(const char *s, const char *choices, char *item, size_t len) {
    for (const char *p = s; *p;) {
        p += strspn(p, " ,");
        size_t n = strcspn(p, ",");
        while (n && p[n - 1] == ' ') n--;
        snprintf(item, len, "%.*s", (int)n, p);
        if (n && !is_choice(choices, item)) return item;
        p += strcspn(p, ",");
    }
    return NULL;
}

/* Keys whose text has a form of its own (a list, "op" or a count), and keys tied to another key's value,
 * checked here for every value given, whether or not their feature is on this run: a misspelt value
 * is an error on the run that carries it, not the later one that turns its feature on. */
static ct_status check_forms(const manifest *m) {
    char where[600], item[128];
    const char *v, *bad;
    int64_t n, t;
    if (!mf_get_str(m, "activation_checkpoint.selective_ac_option", &v) && strcmp(v, "op") &&
        (mf_parse_int(v, &n) || n < 1)) {
        mf_where(m, "activation_checkpoint.selective_ac_option", where, sizeof where);
        ct_set_error("%s: expected 'op' (per-op policy) or a positive integer N (every Nth block), got '%.200s'",
                     where, v);
        return CT_ERR_INVALID;
    }
    if (!mf_get_str(m, "parallelism.pipeline_parallel_stage_units", &v))
        for (const char *p = v + strspn(v, " "); *p;) {
            char *end;
            long u = strtol(p, &end, 10);
            if (end == p || u < 1) {
                mf_where(m, "parallelism.pipeline_parallel_stage_units", where, sizeof where);
                ct_set_error("%s: expected positive unit counts separated by commas, got '%.200s'", where, v);
                return CT_ERR_INVALID;
            }
            p = end + strspn(end, ", ");
        }
    if (!mf_get_str(m, "model.converters", &v) &&
        (bad = list_outsider(v, "float8|mx|quantize.linear.float8|quantize.linear.mx|quantize.grouped_mm.float8|"
                             "quantize.grouped_mm.mx", item, sizeof item))) {
        mf_where(m, "model.converters", where, sizeof where);
        ct_set_error("%s: unknown converter '%s'; expected float8, mx, quantize.linear.float8, quantize.linear.mx, "
                     "quantize.grouped_mm.float8 or quantize.grouped_mm.mx", where, bad);
        return CT_ERR_INVALID;
    }
    if (!mf_get_str(m, "checkpoint.exclude_from_loading", &v) &&
        list_outsider(v, "optimizer|lr_scheduler|dataloader", item, sizeof item)) {
        mf_where(m, "checkpoint.exclude_from_loading", where, sizeof where);
        ct_set_error("%s: expected a list of optimizer, lr_scheduler, dataloader; got '%.200s'", where, v);
        return CT_ERR_INVALID;
    }
    if (!mf_get_int(m, "validation.seq_len", &n) && !mf_get_int(m, "training.seq_len", &t) && n != t) {
        mf_where(m, "validation.seq_len", where, sizeof where);
        ct_set_error("%s: %lld; validation windows have training.seq_len's length (%lld): expected that or "
                     "leave it out", where, (long long)n, (long long)t);
        return CT_ERR_INVALID;
    }
    if (!mf_get_int(m, "validation.steps", &n) && n == 0) {
        mf_where(m, "validation.steps", where, sizeof where);
        ct_set_error("%s: 0 batches; expected -1 (the whole held-out set) or a count >= 1", where);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* Whether torchtitan's key t takes value v (torchtitan_keys.h). */
static int tt_accepts(const tt_key *t, const mf_value *v) {
    int a, b;
    double x, y;
    char item[128];
    if (!t->accept) return 0;
    if (!strcmp(t->accept, "*")) return 1;
    if (!v->value || v->is_seq == 2) return 0;
    if (!*t->accept) return !*v->value;
    if (!mf_parse_bool(t->accept, &a) && !mf_parse_bool(v->value, &b)) return a == b;
    if (!mf_parse_float(t->accept, &x) && !mf_parse_float(v->value, &y)) return x == y;
    return !list_outsider(v->value, t->accept, item, sizeof item);
}

ct_status manifest_torchtitan_check(const manifest *m, const mf_value *v) {
    char where[600], accepted[256];
    const tt_key *t = tt_key_find(v->key);
    if (!t || tt_accepts(t, v)) return CT_OK;
    mf_where(m, v->key, where, sizeof where);
    if (!t->accept) ct_set_error("%s: torchtitan's key is not supported: %s", where, t->reason);
    else {
        if (*t->accept) choices_text(t->accept, accepted, sizeof accepted);
        ct_set_error("%s: only %s is accepted (%s), got '%.200s'", where, *t->accept ? accepted : "an empty value",
                     t->reason, v->value ? v->value : "a list of tables");
    }
    return CT_ERR_INVALID;
}

ct_status manifest_validate(const manifest *m) {
    for (int i = 0; i < m->n_values; i++) {
        const mf_value *v = &m->values[i];
        const mf_schema_entry *s = find_schema(m, v->key);
        if (!s && tt_key_find(v->key)) { /* torchtitan's key, not ctitan's: accepted or refused */
            if (manifest_torchtitan_check(m, v) != CT_OK) return CT_ERR_INVALID;
            continue;
        }
        if (!s) {
            char where[600], keys[2048];
            mf_where(m, v->key, where, sizeof where);
            known_keys(m, v->key, keys, sizeof keys);
            return ct_fail(CT_ERR_INVALID, "%s: unknown key (known: %s)", where, keys); /* one line (ct_set_error) */
        }
        if (check_value(m, v, s) != CT_OK) return CT_ERR_INVALID;
    }
    if (check_sizes(m) != CT_OK || check_forms(m) != CT_OK) return CT_ERR_INVALID;
    return CT_OK;
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

/* A list of maps as a YAML block list: each item's keys in the order given. */
static void print_items(const manifest *m, const char *key, int section_len, FILE *f) {
    int n = mf_list_len(m, key);
    fprintf(f, "  %s:\n", key + section_len + 1);
    for (int i = 0; i < n; i++) {
        char item[MF_MAX_KEY_LEN + 1];
        int il = snprintf(item, sizeof item, "%s[%d].", key, i), first = 1;
        for (int j = 0; j < m->n_values; j++) {
            const mf_value *v = &m->values[j];
            if (strncmp(v->key, item, (size_t)il) || !v->value) continue;
            const mf_schema_entry *se = find_schema(m, v->key);
            const char *q = se && se->type == CT_OPT_STRING ? "\"" : "";
            fprintf(f, "    %s %s: %s%s%s\n", first ? "-" : " ", v->key + il, q, v->value, q);
            first = 0;
        }
    }
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
        if (strstr(k, "[]")) continue; /* item keys: printed under their list */
        const char *v = raw(m, k);
        if (mf_list_len(m, k) >= 0) {
            print_items(m, k, (int)s, f);
            continue;
        }
        if (!v) fprintf(f, "  %s: null\n", k + s + 1);
        else if (sorted[i].type == CT_OPT_STRING) fprintf(f, "  %s: \"%s\"\n", k + s + 1, v);
        else fprintf(f, "  %s: %s\n", k + s + 1, v);
    }
    free(sorted);
}

void manifest_print_schema(const manifest *m, FILE *f) {
    for (int i = 0; i < m->n_schema; i++) {
        const mf_schema_entry *s = &m->schema[i];
        fprintf(f, "  --%-44s %s%s [%s%s%s%s%s]\n", s->key, s->plugin ? "(plugin) " : "", s->help,
                s->type == CT_OPT_INT ? "int" : s->type == CT_OPT_FLOAT ? "float" : s->type == CT_OPT_BOOL ? "bool" : "string",
                s->range ? " in " : "", s->range ? s->range : "", s->default_value ? ", default " : "",
                s->default_value ? s->default_value : "");
    }
}
