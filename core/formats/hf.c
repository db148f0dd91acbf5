/* hf.c: Hugging Face Llama and Qwen2 checkpoints <-> ctitan's llama3 and qwen2 parameters (mapping in hf.h). */
#include "formats/hf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/safetensors.h"
#include "base/error.h"
#include "base/util.h"

#define MAX_DIM (1 << 24)    /* any one size; real ones are below 2^18 */
#define MAX_LAYERS (1 << 16)
#define CONFIG_CAP (1 << 20) /* bytes of config.json we read */

/* ---- the parameter table ----------------------------------------------------------------------- */

enum { K_EMB, K_NORM, K_Q, K_K, K_V, K_O, K_W1, K_W2, K_W3, K_OUT, K_QB, K_KB, K_VB };

/* Per block, in the order the llama3 and qwen2 packs declare them; the biases only with
 * CT_MODEL_QKV_BIAS. */
static const struct {
    const char *ct, *hf;
    int kind;
} block_params[] = {
    {"attention_norm.weight", "input_layernorm.weight", K_NORM},
    {"attention.wq.weight", "self_attn.q_proj.weight", K_Q},
    {"attention.wq.bias", "self_attn.q_proj.bias", K_QB},
    {"attention.wk.weight", "self_attn.k_proj.weight", K_K},
    {"attention.wk.bias", "self_attn.k_proj.bias", K_KB},
    {"attention.wv.weight", "self_attn.v_proj.weight", K_V},
    {"attention.wv.bias", "self_attn.v_proj.bias", K_VB},
    {"attention.wo.weight", "self_attn.o_proj.weight", K_O},
    {"ffn_norm.weight", "post_attention_layernorm.weight", K_NORM},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", K_W1},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", K_W2},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", K_W3},
};
#define N_TABLE ((int64_t)(sizeof block_params / sizeof block_params[0]))

static int is_bias(int kind) { return kind == K_QB || kind == K_KB || kind == K_VB; }
static int has_bias(const hf_config *c) { return (c->features & CT_MODEL_QKV_BIAS) != 0; }
static int shares_output(const hf_config *c) { return (c->features & CT_MODEL_TIED_EMBEDDINGS) != 0; }

const char *hf_model_type(const hf_config *c) { return has_bias(c) ? "qwen2" : "llama"; }

/* Parameters per block, and the table row of the block's k-th. */
static int64_t n_block(const hf_config *c) { return has_bias(c) ? N_TABLE : N_TABLE - 3; }
static int64_t table_row(const hf_config *c, int64_t k) {
    for (int64_t r = 0; r < N_TABLE; r++)
        if ((has_bias(c) || !is_bias(block_params[r].kind)) && k-- == 0) return r;
    return 0;
}

typedef struct param {
    char ct[128], hf[160];
    int kind;
    int ndim;
    int64_t shape[2];
    int64_t permute_heads; /* q: n_heads, k: n_kv_heads (weight and bias), else 0 */
} param;

static int64_t n_params(const hf_config *c) { return 3 + n_block(c) * c->n_layers - shares_output(c); }

/* Parameter i (0 .. n_params-1) of the model c describes. */
static void param_at(const hf_config *c, int64_t i, param *p) {
    int64_t D = c->dim, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim, F = c->ffn_hidden;
    int64_t n_norm = 1 + n_block(c) * c->n_layers; /* norm.weight's index */
    memset(p, 0, sizeof *p);
    if (i == 0) {
        snprintf(p->ct, sizeof p->ct, "tok_embeddings.weight");
        snprintf(p->hf, sizeof p->hf, "model.embed_tokens.weight");
        p->kind = K_EMB;
    } else if (i == n_norm) {
        snprintf(p->ct, sizeof p->ct, "norm.weight");
        snprintf(p->hf, sizeof p->hf, "model.norm.weight");
        p->kind = K_NORM;
    } else if (i == n_norm + 1) {
        snprintf(p->ct, sizeof p->ct, "output.weight");
        snprintf(p->hf, sizeof p->hf, "lm_head.weight");
        p->kind = K_OUT;
    } else {
        int64_t layer = (i - 1) / n_block(c), r = table_row(c, (i - 1) % n_block(c));
        snprintf(p->ct, sizeof p->ct, "layers.%lld.%s", (long long)layer, block_params[r].ct);
        snprintf(p->hf, sizeof p->hf, "model.layers.%lld.%s", (long long)layer, block_params[r].hf);
        p->kind = block_params[r].kind;
    }
    int64_t rows = 0, cols = D;
    switch (p->kind) {
    case K_EMB: case K_OUT: rows = c->vocab; break;
    case K_NORM: rows = D; cols = 0; break;
    case K_Q: rows = q; p->permute_heads = c->n_heads; break;
    case K_K: rows = kv; p->permute_heads = c->n_kv_heads; break;
    case K_V: rows = kv; break;
    case K_QB: rows = q; cols = 0; p->permute_heads = c->n_heads; break;
    case K_KB: rows = kv; cols = 0; p->permute_heads = c->n_kv_heads; break;
    case K_VB: rows = kv; cols = 0; break;
    case K_O: rows = D; cols = q; break;
    case K_W1: case K_W3: rows = F; break;
    case K_W2: rows = D; cols = F; break;
    }
    p->ndim = cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
}

/* Columns of a parameter's rows (1 for a vector): what the q/k permutation moves. */
static int64_t row_len(const param *p) { return p->ndim == 2 ? p->shape[1] : 1; }

/* A name on the ctitan side that belongs to the model's parameters (the rest of a file is ignored). */
static int is_param_name(const char *name) {
    return !strcmp(name, "tok_embeddings.weight") || !strcmp(name, "norm.weight") ||
           !strcmp(name, "output.weight") || !strncmp(name, "layers.", 7);
}

/* 1 if name is "PREFIX<layer>.<suffix>" with layer < n_layers and suffix one of the block's (ct or hf). */
static int is_block_name(const hf_config *c, const char *name, const char *prefix, int hf_side) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl)) return 0;
    const char *s = name + pl;
    if (*s < '0' || *s > '9' || (*s == '0' && s[1] != '.')) return 0;
    int64_t layer = 0;
    while (*s >= '0' && *s <= '9' && layer <= MAX_LAYERS) layer = layer * 10 + (*s++ - '0');
    if (*s++ != '.' || layer >= c->n_layers) return 0;
    for (int64_t k = 0; k < n_block(c); k++) {
        int64_t r = table_row(c, k);
        if (!strcmp(s, hf_side ? block_params[r].hf : block_params[r].ct)) return 1;
    }
    return 0;
}

static int is_expected_ct(const hf_config *c, const char *name) {
    return !strcmp(name, "tok_embeddings.weight") || !strcmp(name, "norm.weight") ||
           (!shares_output(c) && !strcmp(name, "output.weight")) || is_block_name(c, name, "layers.", 0);
}

static int is_expected_hf(const hf_config *c, const char *name) {
    return !strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "model.norm.weight") ||
           !strcmp(name, "lm_head.weight") || is_block_name(c, name, "model.layers.", 1);
}

static void shape_str(char *out, size_t len, int ndim, const int64_t *shape) {
    if (ndim == 1) snprintf(out, len, "(%lld)", (long long)shape[0]);
    else if (ndim == 2) snprintf(out, len, "(%lld, %lld)", (long long)shape[0], (long long)shape[1]);
    else snprintf(out, len, "(%d dimensions)", ndim);
}

/* ---- the config -------------------------------------------------------------------------------- */

static ct_status check_config(const hf_config *c, const char *label) {
    const struct {
        const char *key;
        int64_t v, max;
    } sizes[] = {
        {"hidden_size", c->dim, MAX_DIM}, {"num_hidden_layers", c->n_layers, MAX_LAYERS},
        {"num_attention_heads", c->n_heads, MAX_DIM}, {"num_key_value_heads", c->n_kv_heads, MAX_DIM},
        {"vocab_size", c->vocab, MAX_DIM}, {"intermediate_size", c->ffn_hidden, MAX_DIM},
        {"max_position_embeddings", c->max_position_embeddings, INT32_MAX},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v < 1 || sizes[i].v > sizes[i].max)
            return ct_fail(CT_ERR_INVALID, "%s: %s %lld is out of range (1..%lld)", label, sizes[i].key,
                           (long long)sizes[i].v, (long long)sizes[i].max);
    if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads || (c->dim / c->n_heads) % 2)
        return ct_fail(CT_ERR_INVALID,
                       "%s: hidden_size %lld must split into num_attention_heads %lld heads of even size, and "
                       "num_attention_heads be a multiple of num_key_value_heads %lld",
                       label, (long long)c->dim, (long long)c->n_heads, (long long)c->n_kv_heads);
    if (c->head_dim != c->dim / c->n_heads)
        return ct_fail(CT_ERR_INVALID, "%s: head_dim %lld is not hidden_size / num_attention_heads = %lld (ctitan's "
                                       "llama3 derives it)", label, (long long)c->head_dim,
                       (long long)(c->dim / c->n_heads));
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0 || !isfinite(c->norm_eps) || c->norm_eps < 0)
        return ct_fail(CT_ERR_INVALID, "%s: rope_theta %g must be > 0 and rms_norm_eps %g >= 0, both finite", label,
                       c->rope_theta, c->norm_eps);
    if (c->rope_scaling_factor == 0) return CT_OK;
    if (!(c->rope_scaling_factor >= 1 && c->rope_scaling_factor <= 1e6) ||
        !(c->rope_low_freq_factor > 0 && c->rope_high_freq_factor > c->rope_low_freq_factor &&
          c->rope_high_freq_factor <= 1e6) ||
        c->rope_original_max_position < 1 || c->rope_original_max_position > INT32_MAX)
        return ct_fail(CT_ERR_INVALID, "%s: rope_scaling llama3 needs factor in [1, 1e6], 0 < low_freq_factor < "
                                       "high_freq_factor <= 1e6 and original_max_position_embeddings >= 1; got factor "
                                       "%g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings "
                                       "%lld",
                       label, c->rope_scaling_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                       (long long)c->rope_original_max_position);
    if (has_bias(c))
        return ct_fail(CT_ERR_INVALID, "%s: rope_scaling llama3 with model_type qwen2: ctitan's qwen2 has plain RoPE",
                       label);
    return CT_OK;
}

/* The readers of config.json's keys below fail with CT_ERR_INVALID (a key ctitan cannot run the same way
 * is bad input to it), so a chain of them joined by || fails with that too. */

/* key: a positive JSON integer (or absent: *out = dflt, when dflt > 0; absent and no default: an error). */
static ct_status get_int(json_t *root, const char *label, const char *key, int64_t dflt, int64_t *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (dflt > 0) {
            *out = dflt;
            return CT_OK;
        }
        return ct_fail(CT_ERR_INVALID, "%s: key '%s' is missing", label, key);
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
        return ct_fail(CT_ERR_INVALID, "%s: key '%s' must be a positive integer", label, key);
    *out = (int64_t)json_integer_value(v);
    return CT_OK;
}

static ct_status get_num(json_t *obj, const char *label, const char *key, double dflt, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return CT_OK;
    }
    if (!json_is_number(v)) return ct_fail(CT_ERR_INVALID, "%s: key '%s' must be a number", label, key);
    *out = json_number_value(v);
    return CT_OK;
}

/* key, when present, must be the string want / the boolean want. */
static ct_status want_str(json_t *obj, const char *label, const char *key, const char *want, const char *why) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), want))) return CT_OK;
    char got[64];
    snprintf(got, sizeof got, "%s", json_is_string(v) ? json_string_value(v) : "(not a string)");
    for (char *p = got; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
    return ct_fail(CT_ERR_INVALID, "%s: %s '%s' is not supported (%s)", label, key, got, why);
}

static ct_status want_false_why(json_t *obj, const char *label, const char *key, const char *why) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v)) return CT_OK;
    return ct_fail(CT_ERR_INVALID, "%s: %s must be false (%s)", label, key, why);
}

static ct_status want_false(json_t *obj, const char *label, const char *key) {
    return want_false_why(obj, label, key, "ctitan's llama3 has no biases; model_type qwen2 has q/k/v biases");
}

/* One RoPE object: rope_scaling (transformers 4: "rope_type", or "type" in older files) or
 * rope_parameters (transformers 5, which may omit rope_type for plain RoPE). "default" leaves *c as
 * it is; "llama3" fills the scaling, original_max_position_embeddings falling back to
 * max_position_embeddings. Any other type is refused. */
static ct_status read_rope_object(json_t *obj, const char *label, const char *what, int need_type, hf_config *c) {
    if (!json_is_object(obj)) return ct_fail(CT_ERR_INVALID, "%s: %s must be null or an object", label, what);
    json_t *type = json_object_get(obj, "rope_type");
    if (!type || json_is_null(type)) type = json_object_get(obj, "type");
    if ((!type || json_is_null(type)) && need_type)
        return ct_fail(CT_ERR_INVALID, "%s: %s has no rope_type (ctitan reads rope_type default and llama3)", label,
                       what);
    if (!type || json_is_null(type)) return CT_OK;
    const char *t = json_is_string(type) ? json_string_value(type) : NULL;
    if (t && !strcmp(t, "default")) return CT_OK;
    if (!t || strcmp(t, "llama3")) {
        char got[64];
        snprintf(got, sizeof got, "%s", t ? t : "(not a string)");
        for (char *p = got; *p; p++)
            if ((unsigned char)*p < 0x20) *p = '?';
        return ct_fail(CT_ERR_INVALID,
                       "%s: %s rope_type '%s' is not supported (ctitan reads rope_type default and llama3)", label,
                       what, got);
    }
    if (!json_object_get(obj, "factor"))
        return ct_fail(CT_ERR_INVALID, "%s: %s of rope_type llama3 has no factor", label, what);
    int64_t orig = 0;
    if (get_num(obj, label, "factor", 0, &c->rope_scaling_factor) ||
        get_num(obj, label, "low_freq_factor", 1.0, &c->rope_low_freq_factor) ||
        get_num(obj, label, "high_freq_factor", 4.0, &c->rope_high_freq_factor) ||
        get_int(obj, label, "original_max_position_embeddings", c->max_position_embeddings, &orig))
        return CT_ERR_INVALID;
    c->rope_original_max_position = orig;
    return CT_OK;
}

/* rope_scaling (transformers 4) and rope_parameters (transformers 5): plain RoPE or Llama 3.1's
 * "llama3" scaling; when a file has both, they must say the same. rope_theta: the top-level key,
 * else rope_parameters', else LlamaConfig's default. */
static ct_status check_rope(json_t *root, const char *label, hf_config *cfg) {
    json_t *scaling = json_object_get(root, "rope_scaling"), *params = json_object_get(root, "rope_parameters");
    hf_config a = *cfg, b = *cfg;
    if (scaling && !json_is_null(scaling) && read_rope_object(scaling, label, "rope_scaling", 1, &a))
        return CT_ERR_INVALID;
    if (params && !json_is_null(params) && read_rope_object(params, label, "rope_parameters", 0, &b))
        return CT_ERR_INVALID;
    int sa = a.rope_scaling_factor != 0, sb = b.rope_scaling_factor != 0;
    if (sa && sb &&
        (a.rope_scaling_factor != b.rope_scaling_factor || a.rope_low_freq_factor != b.rope_low_freq_factor ||
         a.rope_high_freq_factor != b.rope_high_freq_factor ||
         a.rope_original_max_position != b.rope_original_max_position))
        return ct_fail(CT_ERR_INVALID, "%s: rope_scaling and rope_parameters give different llama3 scaling", label);
    const hf_config *src = sa ? &a : &b;
    cfg->rope_scaling_factor = src->rope_scaling_factor;
    cfg->rope_low_freq_factor = src->rope_low_freq_factor;
    cfg->rope_high_freq_factor = src->rope_high_freq_factor;
    cfg->rope_original_max_position = src->rope_original_max_position;
    json_t *top = json_object_get(root, "rope_theta");
    if (top && !json_is_null(top)) return get_num(root, label, "rope_theta", 10000.0, &cfg->rope_theta);
    if (json_is_object(params)) return get_num(params, label, "rope_theta", 10000.0, &cfg->rope_theta);
    cfg->rope_theta = 10000.0; /* LlamaConfig's default */
    return CT_OK;
}

ct_status hf_config_parse(const char *json, size_t len, const char *label, hf_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ct_fail(CT_ERR_INVALID, "%s: invalid JSON at line %d column %d: %s", label, je.line, je.column,
                       je.text);
    ct_status rc = CT_ERR_INVALID;
    if (!json_is_object(root)) {
        ct_set_error("%s: expected a JSON object (a LlamaConfig)", label);
        goto done;
    }
    json_t *type = json_object_get(root, "model_type");
    int qwen2 = json_is_string(type) && !strcmp(json_string_value(type), "qwen2");
    if (qwen2) /* Qwen2's q, k and v always have biases; its sliding window is off unless asked for */
        cfg->features |= CT_MODEL_QKV_BIAS;
    if ((!qwen2 && want_str(root, label, "model_type", "llama", "ctitan converts model_type \"llama\" and \"qwen2\"")) ||
        want_str(root, label, "hidden_act", "silu", "ctitan's llama3 and qwen2 use SwiGLU with silu") ||
        (!qwen2 && (want_false(root, label, "attention_bias") || want_false(root, label, "mlp_bias"))) ||
        (qwen2 && want_false_why(root, label, "use_sliding_window", "ctitan's qwen2 attends to every earlier token")) ||
        get_int(root, label, "hidden_size", 0, &cfg->dim) ||
        get_int(root, label, "intermediate_size", 0, &cfg->ffn_hidden) ||
        get_int(root, label, "num_hidden_layers", 0, &cfg->n_layers) ||
        get_int(root, label, "num_attention_heads", 0, &cfg->n_heads) ||
        get_int(root, label, "vocab_size", 0, &cfg->vocab) ||
        get_int(root, label, "num_key_value_heads", cfg->n_heads, &cfg->n_kv_heads) ||
        get_int(root, label, "head_dim", cfg->dim >= cfg->n_heads ? cfg->dim / cfg->n_heads : 1, &cfg->head_dim) ||
        get_int(root, label, "max_position_embeddings", 2048, &cfg->max_position_embeddings) ||
        get_num(root, label, "rms_norm_eps", 1e-6, &cfg->norm_eps) || check_rope(root, label, cfg))
        goto done;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie)) {
        ct_set_error("%s: tie_word_embeddings must be true or false", label);
        goto done;
    }
    cfg->tied = json_is_true(tie);
    if (cfg->tied && qwen2) cfg->features |= CT_MODEL_TIED_EMBEDDINGS; /* the qwen2 pack shares the table */
    rc = check_config(cfg, label);
done:
    json_decref(root);
    return rc;
}

/* config.json's keys beside architectures, model_type and torch_dtype, as transformers' LlamaConfig
 * and Qwen2Config write them; fields[] must hold 24 elements. */
static void config_fields(const hf_config *c, ct_hf_field *f) {
    int n = 0;
#define F_INT(k, v) f[n++] = (ct_hf_field){k, CT_HF_INT, (int64_t)(v), 0, NULL, 0}
#define F_FLT(k, v) f[n++] = (ct_hf_field){k, CT_HF_FLOAT, 0, (v), NULL, 0}
#define F_BOOL(k, v) f[n++] = (ct_hf_field){k, CT_HF_BOOL, (v) != 0, 0, NULL, 0}
#define F_STR(k, v) f[n++] = (ct_hf_field){k, CT_HF_STRING, 0, 0, (v), 0}
#define F_NULL(k) f[n++] = (ct_hf_field){k, CT_HF_NULL, 0, 0, NULL, 0}
    F_FLT("attention_dropout", 0.0);
    F_STR("hidden_act", "silu");
    F_INT("hidden_size", c->dim);
    F_FLT("initializer_range", 0.02);
    F_INT("intermediate_size", c->ffn_hidden);
    F_INT("max_position_embeddings", c->max_position_embeddings);
    F_INT("num_attention_heads", c->n_heads);
    F_INT("num_hidden_layers", c->n_layers);
    F_INT("num_key_value_heads", c->n_kv_heads);
    F_FLT("rms_norm_eps", c->norm_eps);
    F_FLT("rope_theta", c->rope_theta);
    F_BOOL("tie_word_embeddings", c->tied);
    F_BOOL("use_cache", 1);
    F_INT("vocab_size", c->vocab);
    if (has_bias(c)) { /* Qwen2Config: q/k/v biases are implied; no head_dim, no sliding window */
        F_INT("max_window_layers", c->n_layers);
        F_NULL("rope_scaling");
        F_NULL("sliding_window");
        F_BOOL("use_sliding_window", 0);
    } else {
        F_BOOL("attention_bias", 0);
        F_INT("head_dim", c->head_dim);
        F_BOOL("mlp_bias", 0);
        F_INT("pretraining_tp", 1);
        if (c->rope_scaling_factor != 0) { /* as Meta's Llama 3.1 config.json writes it */
            F_FLT("rope_scaling.factor", c->rope_scaling_factor);
            F_FLT("rope_scaling.high_freq_factor", c->rope_high_freq_factor);
            F_FLT("rope_scaling.low_freq_factor", c->rope_low_freq_factor);
            F_INT("rope_scaling.original_max_position_embeddings", c->rope_original_max_position);
            F_STR("rope_scaling.rope_type", "llama3");
        } else {
            F_NULL("rope_scaling");
        }
    }
    f[n] = (ct_hf_field){0};
#undef F_INT
#undef F_FLT
#undef F_BOOL
#undef F_STR
#undef F_NULL
}

/* ---- checks on the ctitan side ----------------------------------------------------------------- */

ct_status hf_check_weights(const hf_config *cfg, const tf_file *w) {
    ct_status st = check_config(cfg, "config");
    if (st != CT_OK) return st;
    for (int64_t i = 0; i < n_params(cfg); i++) {
        param p;
        param_at(cfg, i, &p);
        if (!tf_expect(w, NULL, p.ct, TF_F32, p.ndim, p.shape)) return CT_ERR_INVALID;
    }
    for (int i = 0; i < w->count; i++)
        if (is_param_name(w->entries[i].name) && !is_expected_ct(cfg, w->entries[i].name))
            return ct_fail(CT_ERR_INVALID, "tensor '%s' is not a parameter of a %lld-layer %s%s", w->entries[i].name,
                           (long long)cfg->n_layers, has_bias(cfg) ? "qwen2" : "llama3",
                           shares_output(cfg) ? " with tied embeddings" : "");
    return CT_OK;
}

/* A 2-D float32 entry's shape, or NULL and an error naming what it was needed for. */
static const tf_entry *need_2d(const tf_file *w, const char *name, const char *why) {
    const tf_entry *e = tf_find(w, name);
    if (!e || e->dtype != TF_F32 || e->ndim != 2) {
        ct_set_error("tensor '%s' is %s (it gives the %s)", name, e ? "not a 2-D float32 tensor" : "missing", why);
        return NULL;
    }
    return e;
}

ct_status hf_config_from_weights(hf_config *cfg, const tf_file *w) {
    const tf_entry *emb = need_2d(w, "tok_embeddings.weight", "width and vocabulary");
    const tf_entry *w1 = emb ? need_2d(w, "layers.0.feed_forward.w1.weight", "SwiGLU hidden size") : NULL;
    if (!w1) return CT_ERR_INVALID;
    cfg->vocab = emb->shape[0];
    cfg->dim = emb->shape[1];
    cfg->ffn_hidden = w1->shape[0];
    cfg->n_layers = 0;
    for (;;) {
        char name[64];
        snprintf(name, sizeof name, "layers.%lld.attention_norm.weight", (long long)cfg->n_layers);
        if (!tf_find(w, name) || cfg->n_layers >= MAX_LAYERS) break;
        cfg->n_layers++;
    }
    if (cfg->n_heads < 1 || cfg->dim % cfg->n_heads)
        return ct_fail(CT_ERR_INVALID, "n_heads %lld does not divide the model width %lld (from tok_embeddings.weight)",
                       (long long)cfg->n_heads, (long long)cfg->dim);
    cfg->head_dim = cfg->dim / cfg->n_heads;
    if (cfg->n_kv_heads == 0) {
        const tf_entry *wk = need_2d(w, "layers.0.attention.wk.weight", "number of key/value heads");
        if (!wk) return CT_ERR_INVALID;
        if (wk->shape[0] % cfg->head_dim)
            return ct_fail(CT_ERR_INVALID,
                           "tensor 'layers.0.attention.wk.weight' has %lld rows, not a multiple of head_dim %lld",
                           (long long)wk->shape[0], (long long)cfg->head_dim);
        cfg->n_kv_heads = wk->shape[0] / cfg->head_dim;
    }
    /* the features are which tensors are there: biases (Qwen2), and no output.weight (a shared table) */
    cfg->features = tf_find(w, "layers.0.attention.wq.bias") ? CT_MODEL_QKV_BIAS : 0;
    if (!tf_find(w, "output.weight")) cfg->features |= CT_MODEL_TIED_EMBEDDINGS;
    cfg->tied = shares_output(cfg);
    return hf_check_weights(cfg, w);
}

/* ---- load -------------------------------------------------------------------------------------- */

static ct_status read_text(const char *path, size_t cap, char **text, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return ct_fail(CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(cap + 1);
    size_t n = buf ? fread(buf, 1, cap + 1, fp) : 0;
    int bad = !buf || ferror(fp);
    fclose(fp);
    if (bad || n > cap) {
        free(buf);
        return ct_fail(bad ? CT_ERR_IO : CT_ERR_INVALID, "%s: %s", path,
                       bad ? "cannot read it" : "larger than 1 MB; not a config.json?");
    }
    *text = buf;
    *len = n;
    return CT_OK;
}

/* Fills entry e (parameter p) from the checkpoint: converted to float32, q/k rows un-permuted. */
static ct_status load_param(const char *dir, const hf_config *cfg, const st_model *m, const param *p, tf_entry *e) {
    const char *hf_name = p->hf;
    const st_tensor *t = st_model_find(m, hf_name);
    if (!t && p->kind == K_OUT && cfg->tied) t = st_model_find(m, hf_name = "model.embed_tokens.weight");
    if (!t)
        return ct_fail(CT_ERR_INVALID, "%s: tensor '%s' (ctitan's '%s') is missing%s", dir, p->hf, p->ct,
                       p->kind == K_OUT ? " and tie_word_embeddings is false" : "");
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
        char got[64], want[64];
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(want, sizeof want, p->ndim, p->shape);
        return ct_fail(CT_ERR_INVALID, "%s: tensor '%s' has shape %s, config.json says %s", st_model_where(m, hf_name),
                       hf_name, got, want);
    }
    size_t n = (size_t)t->numel;
    float *buf = malloc(sizeof(float) * (n ? n : 1));
    float *tmp = p->permute_heads ? malloc(sizeof(float) * (n ? n : 1)) : buf; /* un-permuted from tmp */
    ct_status st = CT_OK;
    if (!(e->name = strdup(p->ct)) || !buf || !tmp)
        st = ct_fail(CT_ERR_NOMEM, "%s: out of memory for '%s'", dir, hf_name);
    else
        st = st_to_f32(t, tmp, st_model_where(m, hf_name));
    if (st != CT_OK) {
        free(buf);
        if (tmp != buf) free(tmp);
        return st;
    }
    if (p->permute_heads) {
        hf_permute_rows(buf, tmp, p->permute_heads, cfg->head_dim, row_len(p), 0);
        free(tmp);
    }
    e->data = buf;
    e->dtype = TF_F32;
    e->ndim = p->ndim;
    e->shape[0] = p->shape[0];
    e->shape[1] = p->ndim == 2 ? p->shape[1] : 0;
    e->numel = t->numel;
    return CT_OK;
}

ct_status hf_load(const char *dir, hf_config *cfg, tf_file **weights) {
    *weights = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len = 0;
    char *text = NULL;
    ct_status st = read_text(path, CONFIG_CAP, &text, &len);
    if (st != CT_OK) return st;
    st = hf_config_parse(text, len, path, cfg);
    free(text);
    if (st != CT_OK) return st;
    st_model *m = st_model_open(dir);
    if (!m) return CT_ERR_INVALID; /* its message names the file */
    tf_file *f = calloc(1, sizeof *f);
    int64_t n = n_params(cfg);
    if (!f || !(f->entries = calloc((size_t)n, sizeof(tf_entry)))) {
        st = ct_fail(CT_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    for (int i = 0; i < m->count; i++) {
        const char *name = m->tensors[i]->name;
        size_t nl = strlen(name);
        int rotary = nl > 20 && !strcmp(name + nl - 20, ".rotary_emb.inv_freq"); /* a buffer old checkpoints kept */
        if (!rotary && !is_expected_hf(cfg, name)) {
            st = ct_fail(CT_ERR_INVALID,
                         "%s: tensor '%s' is not a parameter of a %lld-layer %s (nothing in ctitan to map it to)",
                         m->where[i], name, (long long)cfg->n_layers, has_bias(cfg) ? "Qwen2" : "Llama");
            goto fail;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        param p;
        param_at(cfg, i, &p);
        if ((st = load_param(dir, cfg, m, &p, &f->entries[f->count])) != CT_OK) {
            free(f->entries[f->count].name); /* the entry may be half made */
            goto fail;
        }
        f->count++;
    }
    st_model_free(m);
    *weights = f;
    return CT_OK;
fail:
    st_model_free(m);
    tf_free(f);
    return st;
}

/* ---- save -------------------------------------------------------------------------------------- */

ct_status hf_save(const char *dir, const hf_config *cfg, const tf_file *w, hf_dtype dtype) {
    ct_status rc = hf_check_weights(cfg, w);
    if (rc != CT_OK) return rc;
    /* the parameters alone (w may hold other entries), mapped by the table above */
    int64_t n = n_params(cfg);
    tf_entry *e = calloc((size_t)n, sizeof *e);
    ct_hf_name *names = calloc((size_t)(N_TABLE + 4), sizeof *names);
    char (*pat)[2][96] = calloc((size_t)N_TABLE, sizeof *pat);
    if (!e || !names || !pat) {
        rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        param p;
        param_at(cfg, i, &p);
        e[i] = *tf_find(w, p.ct);
    }
    int k = 0;
    names[k++] = (ct_hf_name){"tok_embeddings.weight", "model.embed_tokens.weight", 0};
    names[k++] = (ct_hf_name){"norm.weight", "model.norm.weight", 0};
    names[k++] = (ct_hf_name){"output.weight", "lm_head.weight", 0};
    for (int64_t r = 0; r < N_TABLE; r++) {
        int kind = block_params[r].kind;
        snprintf(pat[r][0], sizeof pat[r][0], "layers.*.%s", block_params[r].ct);
        snprintf(pat[r][1], sizeof pat[r][1], "model.layers.*.%s", block_params[r].hf);
        names[k++] = (ct_hf_name){pat[r][0], pat[r][1],
                                  kind == K_Q || kind == K_K || kind == K_QB || kind == K_KB ? CT_HF_ROPE_ROWS : 0};
    }
    ct_hf_field fields[24];
    config_fields(cfg, fields);
    ct_hf_export x = {sizeof x, has_bias(cfg) ? "Qwen2ForCausalLM" : "LlamaForCausalLM", hf_model_type(cfg), names,
                      fields};
    tf_file params = {e, (int)n, TF_VERSION};
    rc = hf_export_save(dir, &x, &params, cfg->head_dim, dtype, dir);
done:
    free(pat);
    free(names);
    free(e);
    return rc;
}
