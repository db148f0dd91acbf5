/* gpt2.c: a GPT-2 model pack, built outside the ctitan tree against the SDK alone.
 *
 * The model is GPT-2 (Radford et al. 2019) as nanoGPT writes it: learned token and position
 * embeddings, pre-LayerNorm blocks (x + attn(ln_1(x)), x + mlp(ln_2(x))) with biased linears and
 * tanh-GELU, a final LayerNorm and an output projection. Two changes from the OpenAI weights, both
 * for clarity: the attention's fused c_attn is three linears (q_proj, k_proj, v_proj), and lm_head
 * is its own matrix (untied from wte), so "small" has 163M parameters rather than 124M.
 * Weights are in nn.Linear layout (out, in); HF's Conv1D stores the transpose.
 *
 * Units: 0 = embeddings (wte + wpe), 1..L = transformer blocks, L+1 = head (ln_f, lm_head, loss).
 * The pack writes the forward only; the host records each builder op and runs the backward.
 * Head counts come from tensor shapes (width / head_dim), so a sharded q_proj just works.
 */
#include <ctitan/abi.h>
#include <ctitan/host.h>
#include <ctitan/model.h>
#include <ctitan/tensor.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define GPT2_LN_EPS 1e-5f
#define GPT2_NAME_MAX 64 /* bytes per parameter or unit name, NUL included */
#define GPT2_BLOCK_PARAMS 16

typedef struct gpt2_config {
    int64_t vocab_size;
    int64_t dim;
    int64_t n_layers;
    int64_t n_heads;
    int64_t max_seq_len; /* rows of the position table (GPT-2's n_positions) */
} gpt2_config;

static const char *const gpt2_flavor_names[] = {"tiny", "small", NULL};

static const gpt2_config gpt2_flavors[] = {
    /* tiny: for tests and the example manifest */
    {.vocab_size = 2048, .dim = 64, .n_layers = 2, .n_heads = 4, .max_seq_len = 256},
    /* small: GPT-2 124M's shapes (vocab 50257, 1024 positions) */
    {.vocab_size = 50257, .dim = 768, .n_layers = 12, .n_heads = 12, .max_seq_len = 1024},
};

/* model.* keys beyond name and flavor; unset means "the flavor's value". */
static const ct_option_spec gpt2_options[] = {
    {sizeof(ct_option_spec), "vocab_size", CT_OPT_INT, NULL, "rows of wte and lm_head (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "dim", CT_OPT_INT, NULL, "model width (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "n_layers", CT_OPT_INT, NULL, "transformer blocks (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "n_heads", CT_OPT_INT, NULL, "attention heads; must divide dim (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "max_seq_len", CT_OPT_INT, NULL, "rows of wpe, the longest sequence (default: flavor)", NULL, NULL},
    {0},
};

/* One transformer block's parameters, HF's names after "transformer.h.{i}.". */
typedef struct gpt2_block {
    ct_tensor *ln_1_w, *ln_1_b;           /* (C) */
    ct_tensor *q_w, *k_w, *v_w;           /* (C, C) */
    ct_tensor *q_b, *k_b, *v_b;           /* (C) */
    ct_tensor *attn_proj_w, *attn_proj_b; /* (C, C), (C) */
    ct_tensor *ln_2_w, *ln_2_b;           /* (C) */
    ct_tensor *fc_w, *fc_b;               /* (4C, C), (4C) */
    ct_tensor *mlp_proj_w, *mlp_proj_b;   /* (C, 4C), (C) */
} gpt2_block;

typedef struct ct_model { /* the ABI's opaque ct_model handle is this state */
    const ct_host *host;
    gpt2_config cfg;
    int64_t seq_len; /* training sequence length, for FLOPs */
    int n_units;     /* n_layers + 2 */

    ct_tensor *wte, *wpe;         /* (V, C), (P, C) */
    gpt2_block *blocks;           /* n_layers */
    ct_tensor *ln_f_w, *ln_f_b;   /* (C) */
    ct_tensor *lm_head;           /* (V, C) */

    /* One allocation holds the blocks and every name (the host may keep our name pointers). */
    void *arena;
    char (*unit_names)[GPT2_NAME_MAX];  /* n_units */
    char (*param_names)[GPT2_NAME_MAX]; /* n_param_names */
    int n_param_names, used_param_names;
} gpt2;

static int gpt2_param_tensor_count(int64_t n_layers) { return (int)(5 + GPT2_BLOCK_PARAMS * n_layers); }

/* ---- create ---------------------------------------------------------------------------------- */

static ct_status gpt2_find_flavor(const ct_host *host, const char *flavor, gpt2_config *out) {
    for (int i = 0; gpt2_flavor_names[i]; i++) {
        if (flavor && strcmp(flavor, gpt2_flavor_names[i]) == 0) {
            *out = gpt2_flavors[i];
            return CT_OK;
        }
    }
    host->set_error(host, "unknown model.flavor '%s'; known flavors: tiny, small", flavor ? flavor : "(none)");
    return CT_ERR_INVALID;
}

/* Overrides *value with model.<key> when the manifest sets it; checks lo <= value <= hi either way. */
static ct_status gpt2_read_option(const ct_host *host, const char *key, int64_t lo, int64_t hi, int64_t *value) {
    int64_t v;
    ct_status st = host->opt_int(host, key, &v);
    if (st == CT_OK) {
        *value = v;
    } else if (st != CT_ERR_INVALID) { /* INVALID = unset: keep the flavor's value */
        host->set_error(host, "could not read option model.%s", key);
        return st;
    }
    if (*value < lo || *value > hi) {
        host->set_error(host, "model.%s = %lld, expected %lld..%lld", key, (long long)*value, (long long)lo,
                        (long long)hi);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

static ct_status gpt2_read_config(const ct_host *host, const ct_model_config *mc, gpt2_config *cfg) {
    ct_status st = gpt2_find_flavor(host, mc->flavor, cfg);
    if (st == CT_OK) st = gpt2_read_option(host, "vocab_size", 1, INT32_MAX, &cfg->vocab_size);
    if (st == CT_OK) st = gpt2_read_option(host, "dim", 1, 1 << 16, &cfg->dim);
    if (st == CT_OK) st = gpt2_read_option(host, "n_layers", 1, 1024, &cfg->n_layers);
    if (st == CT_OK) st = gpt2_read_option(host, "n_heads", 1, cfg->dim, &cfg->n_heads);
    if (st == CT_OK) st = gpt2_read_option(host, "max_seq_len", 1, 1 << 20, &cfg->max_seq_len);
    if (st != CT_OK) return st;
    if (cfg->dim % cfg->n_heads != 0) {
        host->set_error(host, "model.n_heads = %lld does not divide model.dim = %lld", (long long)cfg->n_heads,
                        (long long)cfg->dim);
        return CT_ERR_INVALID;
    }
    if (mc->seq_len < 1 || mc->seq_len > cfg->max_seq_len) {
        host->set_error(host, "training.seq_len = %lld, expected 1..%lld (the model's max_seq_len, the rows of wpe)",
                        (long long)mc->seq_len, (long long)cfg->max_seq_len);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* Carves the blocks and the name slots out of one host allocation. */
static ct_status gpt2_alloc(gpt2 *m) {
    size_t blocks = (size_t)m->cfg.n_layers * sizeof(gpt2_block);
    size_t names = (size_t)(m->n_units + m->n_param_names) * GPT2_NAME_MAX;
    m->arena = m->host->mem_alloc(m->host, blocks + names, CT_MEM_OTHER);
    if (!m->arena) {
        m->host->set_error(m->host, "out of memory for %zu bytes of model tables", blocks + names);
        return CT_ERR_NOMEM;
    }
    memset(m->arena, 0, blocks + names);
    m->blocks = m->arena; /* gpt2_block holds pointers only: the arena's 64-byte alignment suits it */
    m->unit_names = (char(*)[GPT2_NAME_MAX])((char *)m->arena + blocks);
    m->param_names = m->unit_names + m->n_units;
    snprintf(m->unit_names[0], GPT2_NAME_MAX, "embeddings");
    for (int i = 0; i < m->cfg.n_layers; i++) snprintf(m->unit_names[1 + i], GPT2_NAME_MAX, "h.%d", i);
    snprintf(m->unit_names[m->n_units - 1], GPT2_NAME_MAX, "head");
    return CT_OK;
}

static ct_status gpt2_create(const ct_host *host, const ct_model_config *mc, ct_model **out) {
    if (!mc || !CT_HAS_FIELD(mc, ct_model_config, seq_len)) {
        host->set_error(host, "model config missing or too small");
        return CT_ERR_INVALID;
    }
    gpt2_config cfg;
    ct_status st = gpt2_read_config(host, mc, &cfg);
    if (st != CT_OK) return st;

    gpt2 *m = host->mem_alloc(host, sizeof(*m), CT_MEM_OTHER);
    if (!m) {
        host->set_error(host, "out of memory for the model");
        return CT_ERR_NOMEM;
    }
    memset(m, 0, sizeof(*m));
    m->host = host;
    m->cfg = cfg;
    m->seq_len = mc->seq_len;
    m->n_units = (int)cfg.n_layers + 2;
    m->n_param_names = gpt2_param_tensor_count(cfg.n_layers);
    if ((st = gpt2_alloc(m)) != CT_OK) {
        host->mem_free(host, m);
        return st;
    }
    *out = m;
    return CT_OK;
}

static void gpt2_destroy(ct_model *model) {
    gpt2 *m = model;
    if (!m) return;
    if (m->arena) m->host->mem_free(m->host, m->arena);
    m->host->mem_free(m->host, m);
}

/* ---- describe -------------------------------------------------------------------------------- */

static int64_t gpt2_embedding_params(const gpt2_config *c) { return (c->vocab_size + c->max_seq_len) * c->dim; }

static int64_t gpt2_param_count(const gpt2_config *c) {
    int64_t C = c->dim;
    /* ln_1, ln_2: 4C;  q, k, v, attn c_proj: 4 (C^2 + C);  c_fc: 4C^2 + 4C;  mlp c_proj: 4C^2 + C */
    int64_t block = 12 * C * C + 13 * C;
    return gpt2_embedding_params(c) + c->n_layers * block + 2 * C /* ln_f */ + c->vocab_size * C /* lm_head */;
}

static ct_status gpt2_describe(ct_model *model, ct_model_desc *out) {
    gpt2 *m = model;
    if (!CT_HAS_FIELD(out, ct_model_desc, flops_per_token)) {
        m->host->set_error(m->host, "model description struct too small (%zu bytes)", out->struct_size);
        return CT_ERR_INVALID;
    }
    const gpt2_config *c = &m->cfg;
    out->n_units = m->n_units;
    out->vocab_size = c->vocab_size;
    out->dim = c->dim;
    out->n_layers = (int)c->n_layers;
    out->n_params = gpt2_param_count(c);
    out->n_embedding_params = gpt2_embedding_params(c);
    /* 6N for the matmuls (forward + backward) plus attention's scores and values:
     * 2 matmuls of T x T x C per layer forward, times 3 with backward, averaged over causal halves
     * as PaLM/nanoGPT count it: 12 * L * C * T. */
    out->flops_per_token = 6.0 * (double)(out->n_params - out->n_embedding_params) +
                           12.0 * (double)c->n_layers * (double)c->dim * (double)m->seq_len;
    return CT_OK;
}

static const char *gpt2_unit_name(ct_model *model, int unit) {
    gpt2 *m = model;
    if (unit < 0 || unit >= m->n_units) return "?";
    return m->unit_names[unit];
}

/* ---- declare_params -------------------------------------------------------------------------- */

/* Declaration state: the first failure sticks and later declarations do nothing. */
typedef struct gpt2_decl {
    gpt2 *m;
    ct_param_registry *reg;
    int unit;
    const char *prefix; /* "transformer.h.3." */
    ct_status st;
} gpt2_decl;

static ct_tensor *gpt2_declare(gpt2_decl *d, const char *name, int ndim, const int64_t *shape, ct_init init,
                               uint32_t flags) {
    gpt2 *m = d->m;
    if (d->st != CT_OK) return NULL;
    if (m->used_param_names >= m->n_param_names) {
        m->host->set_error(m->host, "internal: more parameters than the %d named slots", m->n_param_names);
        d->st = CT_ERR_INTERNAL;
        return NULL;
    }
    char *slot = m->param_names[m->used_param_names++];
    snprintf(slot, GPT2_NAME_MAX, "%s%s", d->prefix, name);
    ct_tensor *t = d->reg->add(d->reg, d->unit, slot, ndim, shape, &init, flags);
    if (!t) d->st = CT_ERR_INVALID; /* the registry has set the message */
    return t;
}

/* A weight matrix (rows, cols) ~ normal(0, std), decayed. */
static ct_tensor *gpt2_matrix(gpt2_decl *d, const char *name, int64_t rows, int64_t cols, float std) {
    const int64_t shape[2] = {rows, cols};
    ct_init init = {.struct_size = sizeof(ct_init), .kind = CT_INIT_NORMAL, .std = std};
    return gpt2_declare(d, name, 2, shape, init, 0);
}

/* A LayerNorm weight (value 1) or a bias (value 0), never decayed. */
static ct_tensor *gpt2_vector(gpt2_decl *d, const char *name, int64_t n, float value) {
    const int64_t shape[1] = {n};
    ct_init init = {.struct_size = sizeof(ct_init), .kind = CT_INIT_CONSTANT, .value = value};
    return gpt2_declare(d, name, 1, shape, init, CT_TENSOR_NO_DECAY);
}

static void gpt2_declare_block(gpt2_decl *d, gpt2_block *blk) {
    const int64_t C = d->m->cfg.dim;
    const float std = 0.02f;
    /* GPT-2 scales the projections that write into the residual stream by 1/sqrt(2L). */
    const float proj_std = 0.02f / sqrtf(2.0f * (float)d->m->cfg.n_layers);

    blk->ln_1_w = gpt2_vector(d, "ln_1.weight", C, 1.0f);
    blk->ln_1_b = gpt2_vector(d, "ln_1.bias", C, 0.0f);
    blk->q_w = gpt2_matrix(d, "attn.q_proj.weight", C, C, std);
    blk->q_b = gpt2_vector(d, "attn.q_proj.bias", C, 0.0f);
    blk->k_w = gpt2_matrix(d, "attn.k_proj.weight", C, C, std);
    blk->k_b = gpt2_vector(d, "attn.k_proj.bias", C, 0.0f);
    blk->v_w = gpt2_matrix(d, "attn.v_proj.weight", C, C, std);
    blk->v_b = gpt2_vector(d, "attn.v_proj.bias", C, 0.0f);
    blk->attn_proj_w = gpt2_matrix(d, "attn.c_proj.weight", C, C, proj_std);
    blk->attn_proj_b = gpt2_vector(d, "attn.c_proj.bias", C, 0.0f);
    blk->ln_2_w = gpt2_vector(d, "ln_2.weight", C, 1.0f);
    blk->ln_2_b = gpt2_vector(d, "ln_2.bias", C, 0.0f);
    blk->fc_w = gpt2_matrix(d, "mlp.c_fc.weight", 4 * C, C, std);
    blk->fc_b = gpt2_vector(d, "mlp.c_fc.bias", 4 * C, 0.0f);
    blk->mlp_proj_w = gpt2_matrix(d, "mlp.c_proj.weight", C, 4 * C, proj_std);
    blk->mlp_proj_b = gpt2_vector(d, "mlp.c_proj.bias", C, 0.0f);
}

static ct_status gpt2_declare_params(ct_model *model, ct_param_registry *reg) {
    gpt2 *m = model;
    const gpt2_config *c = &m->cfg;
    gpt2_decl d = {.m = m, .reg = reg, .unit = 0, .prefix = "transformer.", .st = CT_OK};
    char prefix[GPT2_NAME_MAX];

    m->used_param_names = 0; /* a second call re-declares into the same slots */
    m->wte = gpt2_matrix(&d, "wte.weight", c->vocab_size, c->dim, 0.02f);
    m->wpe = gpt2_matrix(&d, "wpe.weight", c->max_seq_len, c->dim, 0.02f);
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(prefix, sizeof(prefix), "transformer.h.%d.", i);
        d.unit = 1 + i;
        d.prefix = prefix;
        gpt2_declare_block(&d, &m->blocks[i]);
    }
    d.unit = m->n_units - 1;
    d.prefix = "transformer.";
    m->ln_f_w = gpt2_vector(&d, "ln_f.weight", c->dim, 1.0f);
    m->ln_f_b = gpt2_vector(&d, "ln_f.bias", c->dim, 0.0f);
    d.prefix = "";
    m->lm_head = gpt2_matrix(&d, "lm_head.weight", c->vocab_size, c->dim, 0.02f);
    return d.st;
}

/* ---- forward --------------------------------------------------------------------------------- */
/* Each helper returns NULL when its input is NULL or an op fails (the builder has set the message),
 * so a chain of them needs one check at its end. */

/* x (B, T, in) -> x @ w^T + bias (B, T, out) */
static ct_tensor *linear_bias(ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor *bias) {
    ct_tensor *y = x ? b->linear(b, x, w) : NULL;
    return y ? b->bias(b, y, bias) : NULL;
}

static ct_tensor *layernorm(ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor *bias) {
    return x ? b->layernorm(b, x, w, bias, GPT2_LN_EPS) : NULL;
}

static ct_tensor *add(ct_builder *b, ct_tensor *x, ct_tensor *y) { return x && y ? b->add(b, x, y) : NULL; }

/* x (B, T, H * D) -> (B, T, H, D); H is whatever this rank holds (width / head_dim). */
static ct_tensor *split_heads(const gpt2 *m, ct_builder *b, ct_tensor *x, int64_t head_dim) {
    if (!x) return NULL;
    if (x->ndim != 3 || x->shape[2] % head_dim != 0) {
        m->host->set_error(m->host, "attention input has %d dims (last %lld), expected (B, T, H * %lld)", x->ndim,
                           (long long)(x->ndim > 0 ? x->shape[x->ndim - 1] : 0), (long long)head_dim);
        return NULL;
    }
    const int64_t shape[4] = {x->shape[0], x->shape[1], x->shape[2] / head_dim, head_dim};
    return b->view(b, x, 4, shape);
}

/* h (B, T, C) -> causal self-attention output (B, T, C) */
static ct_tensor *attention(const gpt2 *m, const gpt2_block *blk, ct_builder *b, ct_tensor *h) {
    const int64_t D = m->cfg.dim / m->cfg.n_heads;
    ct_tensor *q = split_heads(m, b, linear_bias(b, h, blk->q_w, blk->q_b), D); /* (B, T, H, D) */
    ct_tensor *k = split_heads(m, b, linear_bias(b, h, blk->k_w, blk->k_b), D); /* (B, T, H, D) */
    ct_tensor *v = split_heads(m, b, linear_bias(b, h, blk->v_w, blk->v_b), D); /* (B, T, H, D) */
    if (!q || !k || !v) return NULL;
    ct_tensor *y = b->attention(b, q, k, v); /* (B, T, H, D), kvh = h */
    if (!y) return NULL;
    const int64_t shape[3] = {y->shape[0], y->shape[1], y->shape[2] * y->shape[3]};
    ct_tensor *merged = b->view(b, y, 3, shape); /* (B, T, H * D) */
    return linear_bias(b, merged, blk->attn_proj_w, blk->attn_proj_b);
}

/* h (B, T, C) -> c_proj(gelu(c_fc(h))) (B, T, C), through (B, T, 4C) */
static ct_tensor *mlp(const gpt2_block *blk, ct_builder *b, ct_tensor *h) {
    ct_tensor *f = linear_bias(b, h, blk->fc_w, blk->fc_b);
    ct_tensor *g = f ? b->gelu(b, f) : NULL;
    return linear_bias(b, g, blk->mlp_proj_w, blk->mlp_proj_b);
}

/* x (B, T, C) -> x + attn(ln_1(x)), then + mlp(ln_2(x)) */
static ct_tensor *block_forward(const gpt2 *m, const gpt2_block *blk, ct_builder *b, ct_tensor *x) {
    x = add(b, x, attention(m, blk, b, layernorm(b, x, blk->ln_1_w, blk->ln_1_b)));
    return add(b, x, mlp(blk, b, layernorm(b, x, blk->ln_2_w, blk->ln_2_b)));
}

/* tokens (B, T) -> wte[tokens] + wpe[t] (B, T, C) */
static ct_tensor *embeddings_forward(const gpt2 *m, ct_builder *b, const ct_tensor *tokens) {
    ct_tensor *tok = b->embedding(b, tokens, m->wte);
    ct_tensor *pos = tok ? b->positions(b, tokens->shape[0], tokens->shape[1]) : NULL; /* (B, T) int32 */
    ct_tensor *pe = pos ? b->embedding(b, pos, m->wpe) : NULL;
    return add(b, tok, pe);
}

/* x (B, T, C) -> logits (B, T, V), or the summed cross-entropy (scalar) when targets are given */
static ct_tensor *head_forward(const gpt2 *m, ct_builder *b, ct_tensor *x, const ct_tensor *targets) {
    ct_tensor *h = layernorm(b, x, m->ln_f_w, m->ln_f_b);
    ct_tensor *logits = h ? b->linear(b, h, m->lm_head) : NULL;
    if (!logits || !targets) return logits;
    return b->cross_entropy(b, logits, targets);
}

static ct_status gpt2_check_inputs(const gpt2 *m, int unit, const ct_tensor *x, const ct_tensor *tokens) {
    const ct_host *host = m->host;
    if (unit < 0 || unit >= m->n_units) {
        host->set_error(host, "unit %d out of range 0..%d", unit, m->n_units - 1);
        return CT_ERR_INVALID;
    }
    if (!tokens || tokens->ndim != 2 || tokens->dtype != CT_I32) {
        host->set_error(host, "unit %d: tokens must be a (B, T) int32 tensor", unit);
        return CT_ERR_INVALID;
    }
    if (tokens->shape[1] > m->cfg.max_seq_len) {
        host->set_error(host, "sequence length %lld exceeds max_seq_len %lld (the rows of wpe)",
                        (long long)tokens->shape[1], (long long)m->cfg.max_seq_len);
        return CT_ERR_INVALID;
    }
    if (unit > 0 && !x) {
        host->set_error(host, "unit %d (%s) needs the previous unit's output", unit, m->unit_names[unit]);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

static ct_status gpt2_unit_forward(ct_model *model, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                                   const ct_tensor *targets, ct_tensor **out) {
    gpt2 *m = model;
    ct_status st = gpt2_check_inputs(m, unit, x, tokens);
    if (st != CT_OK) return st;

    ct_tensor *y;
    if (unit == 0)
        y = embeddings_forward(m, b, tokens);
    else if (unit <= m->cfg.n_layers)
        y = block_forward(m, &m->blocks[unit - 1], b, x);
    else
        y = head_forward(m, b, x, targets);
    if (!y) return CT_ERR_INVALID; /* the builder or a helper has set the message */
    *out = y;
    return CT_OK;
}

/* ---- entry ----------------------------------------------------------------------------------- */

static const ct_model_api gpt2_api = {
    .struct_size = sizeof(ct_model_api),
    .flavors = gpt2_flavor_names,
    .create = gpt2_create,
    .destroy = gpt2_destroy,
    .describe = gpt2_describe,
    .declare_params = gpt2_declare_params,
    .unit_name = gpt2_unit_name,
    .unit_forward = gpt2_unit_forward,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info);

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    if (!CT_HAS_FIELD(info, ct_plugin_info, api)) {
        host->set_error(host, "plugin info struct too small (%zu bytes)", info->struct_size);
        return CT_ERR_INVALID;
    }
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "gpt2";
    info->description = "GPT-2 (learned positions, pre-LayerNorm, GELU MLP), an out-of-tree example pack";
    info->options = gpt2_options;
    info->api = &gpt2_api;
    return CT_OK;
}
