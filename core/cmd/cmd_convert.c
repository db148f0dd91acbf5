/* cmd_convert.c: `ctitan convert --to hf` (ctitan .ctt -> Hugging Face folder) and `--from hf` (back). */
#include "cmd/cmd_convert.h"

#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/hf.h"
#include "formats/tensorfile.h"
#include "checkpoint/model_desc.h"

#define ERRLEN 1024

static const char usage[] =
    "usage: ctitan convert --to hf --input MODEL.ctt --output DIR [--dtype float32|bfloat16]\n"
    "                      [--n-heads H] [--n-kv-heads K] [--rope-theta X] [--norm-eps X]\n"
    "                      [--max-position-embeddings N]\n"
    "       ctitan convert --from hf --input DIR --output MODEL.ctt\n"
    "\n"
    "Converts a llama3 or qwen2 model between ctitan's model file (a .ctt of float32 parameters under\n"
    "torchtitan's names, as `ctitan train` saves it) and a Hugging Face LlamaForCausalLM or\n"
    "Qwen2ForCausalLM folder (config.json + model.safetensors). q and k rows (and their biases) are\n"
    "permuted between ctitan's interleaved RoPE pairs and Hugging Face's halves; a float32 round trip\n"
    "is bit-exact. A model with layers.N.attention.w{q,k,v}.bias is a Qwen2; one without\n"
    "output.weight has tied embeddings (tie_word_embeddings: true, no lm_head.weight).\n"
    "\n"
    "  --to hf             write DIR/config.json and DIR/model.safetensors (DIR is created if missing).\n"
    "                      The sizes come from the tensors' shapes, the heads, RoPE base, RoPE scaling\n"
    "                      (Llama 3.1's llama3 type) and norm epsilon from the model description every\n"
    "                      saved model carries (a flag that contradicts it is refused). For a file without\n"
    "                      one (an older ctitan's, a golden file), the flags below, or its config.n_heads,\n"
    "                      config.n_kv_heads, config.rope_theta, config.norm_eps and config.rope_scaling_*\n"
    "                      scalars; other non-parameter entries are ignored.\n"
    "  --dtype T           float32 (default) or bfloat16 (rounded to nearest even)\n"
    "  --n-heads H         query heads (the shapes cannot tell; needed only for a file without a description)\n"
    "  --n-kv-heads K      key/value heads (default: from layers.0.attention.wk.weight's shape)\n"
    "  --rope-theta X      RoPE base (default 500000, as ctitan's llama3 flavors)\n"
    "  --norm-eps X        RMSNorm epsilon (default 1e-5)\n"
    "  --max-position-embeddings N   written to config.json (default 8192)\n"
    "\n"
    "  --from hf           read DIR/config.json and DIR/model.safetensors (or the shards named by\n"
    "                      model.safetensors.index.json; F32, BF16, F16 or F64 tensors) and write the\n"
    "                      parameters as float32, in the order the llama3 pack declares them, after the\n"
    "                      model description (so generate and model.flavor: from_checkpoint need no sizes).\n"
    "                      The model options to use with the file are printed. A tied Qwen2 gives no output.weight\n"
    "                      (the qwen2 pack shares the table), a tied Llama a copy of the table. RoPE\n"
    "                      scaling of rope_type llama3 (Llama 3.1+) is kept in the model description.\n"
    "                      Refused: other RoPE types, a Llama's biases, Qwen2's sliding window, other\n"
    "                      activations or model types, head_dim != hidden_size / heads.\n"
    "  --help              this text\n";

static ct_status usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "ctitan convert: %s%s%s (see ctitan convert --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return CT_ERR_INVALID;
}

static int parse_pos_int(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < 1 || v > INT32_MAX) return -1;
    *out = v;
    return 0;
}

static int parse_pos_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v) || v <= 0) return -1;
    *out = v;
    return 0;
}

/* A scalar config.* entry of a golden-style .ctt, if present: 1 and *out, else 0. A float32 value
 * becomes the double of its shortest decimal (1e-5f -> 1e-5), so it prints as it was written. */
static int ctt_scalar(const tf_file *f, const char *name, double *out) {
    const tf_entry *e = tf_find(f, name);
    if (!e || e->numel != 1) return 0;
    if (e->dtype == TF_I32) {
        *out = *(const int32_t *)e->data;
        return 1;
    }
    float v = *(const float *)e->data;
    char s[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(s, sizeof s, "%.*g", p, (double)v);
        if ((float)strtod(s, NULL) == v) break;
    }
    *out = strtod(s, NULL);
    return 1;
}

/* A positive integer config.* scalar, or 0 when absent or not one. */
static int64_t ctt_count(const tf_file *f, const char *name) {
    double v;
    return ctt_scalar(f, name, &v) && v >= 1 && v <= INT32_MAX && v == floor(v) ? (int64_t)v : 0;
}

/* The shortest %g form that reads back as x (whole numbers in full). */
static const char *short_g(char *out, size_t len, double x) {
    if (x == floor(x) && fabs(x) < 1e16) {
        snprintf(out, len, "%.0f", x);
        return out;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(out, len, "%.*g", p, x);
        if (strtod(out, NULL) == x) break;
    }
    return out;
}

/* The manifest's model section that runs the converted file (a Qwen2 on sdk/examples/qwen2's pack). */
static void print_model_line(const hf_config *c) {
    char theta[32], eps[32], scaling[256] = "", f[32], lo[32], hi[32];
    int qwen2 = (c->features & CT_MODEL_QKV_BIAS) != 0;
    if (c->rope_scaling_factor != 0)
        snprintf(scaling, sizeof scaling, ", rope_scaling: llama3, rope_scaling_factor: %s, rope_low_freq_factor: %s, "
                 "rope_high_freq_factor: %s, rope_original_max_position: %lld",
                 short_g(f, sizeof f, c->rope_scaling_factor), short_g(lo, sizeof lo, c->rope_low_freq_factor),
                 short_g(hi, sizeof hi, c->rope_high_freq_factor), (long long)c->rope_original_max_position);
    printf("model: {name: %s, dim: %lld, n_layers: %lld, n_heads: %lld, n_kv_heads: %lld, vocab_size: %lld, "
           "ffn_hidden: %lld, rope_theta: %s, norm_eps: %s%s%s}\n",
           qwen2 ? "qwen2" : "llama3", (long long)c->dim,
           (long long)c->n_layers, (long long)c->n_heads, (long long)c->n_kv_heads, (long long)c->vocab,
           (long long)c->ffn_hidden, short_g(theta, sizeof theta, c->rope_theta), short_g(eps, sizeof eps, c->norm_eps),
           scaling, !qwen2 ? "" : c->features & CT_MODEL_TIED_EMBEDDINGS ? ", tie_word_embeddings: true" : ", tie_word_embeddings: false");
}

typedef struct args {
    const char *input, *output;
    hf_dtype dtype;
    int64_t n_heads, n_kv_heads, max_pos; /* 0: not given */
    double rope_theta, norm_eps;          /* 0: not given */
} args;

/* The description model.ctt carries (model_desc.h), if any, in *out; a flag that contradicts it is
 * refused naming both values. 0, or -1 after one error line. */
static int described(const tf_file *f, const args *a, json_t **out) {
    json_t *d = NULL;
    char *text;
    *out = NULL;
    if (tf_text(f, a->input, MDESC_ENTRY, &text) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        return -1;
    }
    if (!text) return 0; /* an older file: the flags and config.* scalars say it */
    json_error_t je;
    d = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!d) {
        fprintf(stderr, "ctitan convert: %s: tensor '%s': invalid JSON (%s)\n", a->input, MDESC_ENTRY, je.text);
        return -1;
    }
    if (mdesc_check(d, a->input) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        json_decref(d);
        return -1;
    }
    const struct { const char *flag, *field; double given; } flags[] = {
        {"--n-heads", "n_heads", (double)a->n_heads}, {"--n-kv-heads", "n_kv_heads", (double)a->n_kv_heads},
        {"--rope-theta", "rope_theta", a->rope_theta}, {"--norm-eps", "norm_eps", a->norm_eps}};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        double v;
        char g[32], w[32];
        if (!flags[i].given || !mdesc_field(d, flags[i].field, &v) || v <= 0 || v == flags[i].given) continue;
        fprintf(stderr, "ctitan convert: %s %s contradicts %s's description (%s %s); leave the flag out\n",
                flags[i].flag, short_g(g, sizeof g, flags[i].given), a->input, flags[i].field, short_g(w, sizeof w, v));
        json_decref(d);
        return -1;
    }
    *out = d;
    return 0;
}

static ct_status to_hf(const args *a) {
    tf_file *f = tf_read(a->input);
    if (!f || tf_check_finite(f, a->input) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        tf_free(f);
        return CT_ERR_INVALID;
    }
    if (f->version < 2)
        printf("convert: note: %s: format version %d has no checksums: its data cannot be verified\n", a->input,
               f->version);
    hf_config cfg = {0};
    double v;
    ct_status rc = CT_ERR_INVALID; /* until the input is known good */
    json_t *desc = NULL;
    if (described(f, a, &desc)) goto done;
    cfg.n_heads = a->n_heads ? a->n_heads : ctt_count(f, "config.n_heads");
    cfg.n_kv_heads = a->n_kv_heads ? a->n_kv_heads : ctt_count(f, "config.n_kv_heads");
    cfg.rope_theta = a->rope_theta ? a->rope_theta : ctt_scalar(f, "config.rope_theta", &v) ? v : HF_DEFAULT_ROPE_THETA;
    cfg.norm_eps = a->norm_eps ? a->norm_eps : ctt_scalar(f, "config.norm_eps", &v) ? v : HF_DEFAULT_NORM_EPS;
    if (desc) { /* the file's own description (flags that contradict it were refused) */
        if (mdesc_field(desc, "n_heads", &v) && v > 0) cfg.n_heads = (int64_t)v;
        if (mdesc_field(desc, "n_kv_heads", &v) && v > 0) cfg.n_kv_heads = (int64_t)v;
        if (mdesc_field(desc, "rope_theta", &v) && v > 0) cfg.rope_theta = v;
        if (mdesc_field(desc, "norm_eps", &v) && v > 0) cfg.norm_eps = v;
    }
    cfg.max_position_embeddings = a->max_pos ? a->max_pos : HF_DEFAULT_MAX_POSITIONS;
    if (desc) { /* Llama 3.1's RoPE scaling from the description (0: none) */
        if (mdesc_field(desc, "rope_scaling_factor", &v) && v != 0) {
            cfg.rope_scaling_factor = v;
            cfg.rope_low_freq_factor = mdesc_field(desc, "rope_low_freq_factor", &v) ? v : 0;
            cfg.rope_high_freq_factor = mdesc_field(desc, "rope_high_freq_factor", &v) ? v : 0;
            cfg.rope_original_max_position = mdesc_field(desc, "rope_original_max_position", &v) ? (int64_t)v : 0;
        }
    } else if (ctt_scalar(f, "config.rope_scaling_factor", &v) && v != 0) { /* a file without a description (a golden file) */
        cfg.rope_scaling_factor = v;
        cfg.rope_low_freq_factor = ctt_scalar(f, "config.rope_low_freq_factor", &v) ? v : 0;
        cfg.rope_high_freq_factor = ctt_scalar(f, "config.rope_high_freq_factor", &v) ? v : 0;
        cfg.rope_original_max_position = ctt_count(f, "config.rope_original_max_position");
    }
    if (!cfg.n_heads) {
        fprintf(stderr, "ctitan convert: %s has no model description nor config.n_heads; give --n-heads (the shapes "
                        "cannot tell it)\n", a->input);
        goto done;
    }
    if (hf_config_from_weights(&cfg, f) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s: %s\n", a->input, ct_last_error());
        goto done;
    }
    rc = CT_ERR_IO;
    if (hf_save(a->output, &cfg, f, a->dtype) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        goto done;
    }
    int64_t per_block = cfg.features & CT_MODEL_QKV_BIAS ? 12 : 9;
    printf("convert: %s -> %s/config.json, %s/model.safetensors (%s, %lld tensors, %s%s)\n", a->input, a->output,
           a->output, hf_model_type(&cfg), (long long)(3 + per_block * cfg.n_layers - cfg.tied),
           a->dtype == HF_BFLOAT16 ? "bfloat16" : "float32", cfg.tied ? ", tied embeddings: no lm_head" : "");
    print_model_line(&cfg);
    rc = CT_OK;
done:
    json_decref(desc);
    tf_free(f);
    return rc;
}

static ct_status from_hf(const args *a) {
    hf_config cfg;
    tf_file *f;
    if (hf_load(a->input, &cfg, &f) != CT_OK || tf_check_finite(f, a->input) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        tf_free(f);
        return CT_ERR_INVALID;
    }
    tf_writer *w = tf_writer_open(a->output);
    json_t *desc = w ? mdesc_from_hf(&cfg) : NULL; /* so that generate and from_checkpoint need no sizes */
    char *text = desc ? json_dumps(desc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(desc);
    if (w && (!text || tf_writer_add_text(w, MDESC_ENTRY, text) != CT_OK)) {
        tf_writer_abort(w);
        w = NULL;
        ct_set_error("%s: cannot write the model description", a->output);
    }
    free(text);
    for (int i = 0; w && i < f->count; i++) {
        const tf_entry *e = &f->entries[i];
        if (tf_writer_add(w, e->name, e->dtype, e->ndim, e->shape, e->data) != CT_OK) break;
    }
    if (!w || tf_writer_close(w) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        tf_free(f);
        return CT_ERR_IO;
    }
    printf("convert: %s -> %s (%s, %d tensors, float32%s)\n", a->input, a->output, hf_model_type(&cfg), f->count,
           !cfg.tied ? "" : cfg.features & CT_MODEL_TIED_EMBEDDINGS ? "; tied embeddings: no output.weight"
                                                                    : "; output.weight copied from the tied embeddings");
    print_model_line(&cfg);
    tf_free(f);
    return CT_OK;
}

ct_status cmd_convert(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return CT_OK;
        }
    args a = {0};
    const char *to = NULL, *from = NULL, *dtype = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (ct_cli_opt(argc, argv, &i, "--to", &v)) bad = !(to = v);
        else if (ct_cli_opt(argc, argv, &i, "--from", &v)) bad = !(from = v);
        else if (ct_cli_opt(argc, argv, &i, "--input", &v)) bad = !(a.input = v);
        else if (ct_cli_opt(argc, argv, &i, "--output", &v)) bad = !(a.output = v);
        else if (ct_cli_opt(argc, argv, &i, "--dtype", &v)) bad = !(dtype = v);
        else if (ct_cli_opt(argc, argv, &i, "--n-heads", &v)) bad = parse_pos_int(v, &a.n_heads);
        else if (ct_cli_opt(argc, argv, &i, "--n-kv-heads", &v)) bad = parse_pos_int(v, &a.n_kv_heads);
        else if (ct_cli_opt(argc, argv, &i, "--max-position-embeddings", &v)) bad = parse_pos_int(v, &a.max_pos);
        else if (ct_cli_opt(argc, argv, &i, "--rope-theta", &v)) bad = parse_pos_double(v, &a.rope_theta);
        else if (ct_cli_opt(argc, argv, &i, "--norm-eps", &v)) bad = parse_pos_double(v, &a.norm_eps);
        else return usage_error("unknown argument", argv[i]);
        if (bad) return usage_error("missing or bad value for", argv[i][0] == '-' ? argv[i] : argv[i - 1]);
    }
    if (!to == !from) return usage_error("give exactly one of --to hf and --from hf", NULL);
    if (strcmp(to ? to : from, "hf") != 0) return usage_error("the only other format is hf, not", to ? to : from);
    if (!a.input || !a.output) return usage_error("--input and --output are required", NULL);
    if (from && (dtype || a.n_heads || a.n_kv_heads || a.max_pos || a.rope_theta || a.norm_eps))
        return usage_error("--dtype, --n-heads, --n-kv-heads, --rope-theta, --norm-eps and "
                           "--max-position-embeddings apply to --to hf only", NULL);
    if (dtype) {
        if (!strcmp(dtype, "float32") || !strcmp(dtype, "f32")) a.dtype = HF_FLOAT32;
        else if (!strcmp(dtype, "bfloat16") || !strcmp(dtype, "bf16")) a.dtype = HF_BFLOAT16;
        else return usage_error("--dtype must be float32 or bfloat16, not", dtype);
    }
    return to ? to_hf(&a) : from_hf(&a);
}
