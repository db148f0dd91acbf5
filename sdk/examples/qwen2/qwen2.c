/* qwen2.c: a Qwen2 model pack, built outside the ctitan tree against the SDK alone.
 *
 * Qwen2 is a Llama block (RMSNorm, RoPE, grouped-query attention, SwiGLU) with biases on the q, k
 * and v projections, and (in the small models) the output head tied to the embedding table. Both
 * are what this pack shows beyond models/llama3:
 *   - the biases: 1-D parameters added with the builder's bias op after each projection; the
 *     tensor-parallel plan splits them with their column-wise linear's output features;
 *   - tying (option tie_word_embeddings, default true as in Qwen2-0.5B): the head computes with the
 *     embedding table declared in unit 0, through the registry's share (ABI 2.1), so every layout
 *     (FSDP, pipeline stages, tensor parallel) keeps the two uses equal and a checkpoint holds the
 *     table once;
 *   - hf_export (ABI 2.12) gives Qwen2's Hugging Face names and config.json fields, so a run's export
 *     writes a Qwen2ForCausalLM folder and a run loads one; describe() names the features
 *     (CT_MODEL_QKV_BIAS, CT_MODEL_TIED_EMBEDDINGS) and the model_type "qwen2" as well;
 *   - get_tp_plan: the plan depends on the instance (a tied head is planned under its use name).
 *
 * Units: 0 = tok_embeddings, 1..L = layers.0 .. layers.L-1, L+1 = norm + output (+ loss). Names are
 * models/llama3's (torchtitan's) plus layers.N.attention.w{q,k,v}.bias.
 */
#include <ctitan/abi.h>
#include <ctitan/host.h>
#include <ctitan/model.h>
#include <ctitan/tensor.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct flavor {
    const char *name;
    int64_t dim, n_layers, n_heads, n_kv_heads, vocab, ffn_hidden;
    double rope_theta, norm_eps;
} flavor;

static const flavor flavors[] = {
    {"tiny", 64, 2, 4, 2, 2048, 192, 1000000.0, 1e-6},          /* for tests and the example manifest */
    {"0.5B", 896, 24, 14, 2, 151936, 4864, 1000000.0, 1e-6},    /* Qwen2-0.5B's config.json */
};
static const char *const flavor_names[] = {"tiny", "0.5B", NULL};

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "dim", CT_OPT_INT, NULL, "model width (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "n_layers", CT_OPT_INT, NULL, "blocks (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "n_heads", CT_OPT_INT, NULL, "query heads (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "n_kv_heads", CT_OPT_INT, NULL, "key/value heads (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "vocab_size", CT_OPT_INT, NULL, "vocabulary size (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "ffn_hidden", CT_OPT_INT, NULL, "SwiGLU hidden size (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "rope_theta", CT_OPT_FLOAT, NULL, "RoPE base (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "norm_eps", CT_OPT_FLOAT, NULL, "RMSNorm epsilon (default: flavor)", NULL, NULL},
    {sizeof(ct_option_spec), "tie_word_embeddings", CT_OPT_BOOL, "true",
     "the output head computes with the embedding table (shared, ABI 2.1)", NULL, NULL},
    {0},
};

typedef struct layer {
    ct_tensor *attention_norm, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *ffn_norm, *w1, *w2, *w3;
    char unit_name[24]; /* "layers.3", kept until destroy as model.h promises */
} layer;

typedef struct ct_model { /* the ABI's opaque ct_model */
    const ct_host *host;
    int64_t dim, n_layers, n_heads, n_kv_heads, vocab, ffn_hidden, head_dim, seq_len;
    double rope_theta, norm_eps;
    int tied;
    ct_tensor *tok_embeddings, *norm, *output; /* output: the shared table's head use when tied */
    ct_hf_field fields[20]; /* hf_export's answer, kept until destroy */
    layer *layers;
} qwen2;

/* Integer options: the key, where the value goes, and the largest value accepted (the caps keep
 * the parameter count far from overflow). */
static int read_int(const ct_host *h, const char *key, int64_t *v, int64_t max) {
    int64_t x;
    if (h->opt_int(h, key, &x) != CT_OK) return 0; /* unset: the flavor's */
    if (x < 1 || x > max) {
        h->set_error(h, "%s: expected 1 to %lld, got %lld", key, (long long)max, (long long)x);
        return -1;
    }
    *v = x;
    return 1;
}

static int read_float(const ct_host *h, const char *key, double *v, double max) {
    double x;
    if (h->opt_float(h, key, &x) != CT_OK) return 0;
    if (!(x > 0 && x <= max)) {
        h->set_error(h, "%s: expected a value in (0, %g], got %g", key, max, x);
        return -1;
    }
    *v = x;
    return 1;
}

static int read_options(const ct_host *h, qwen2 *m) {
    int dim = read_int(h, "dim", &m->dim, 131072), heads = read_int(h, "n_heads", &m->n_heads, 4096);
    int kv = read_int(h, "n_kv_heads", &m->n_kv_heads, 4096);
    if (dim < 0 || heads < 0 || kv < 0 || read_int(h, "n_layers", &m->n_layers, 1024) < 0 ||
        read_int(h, "vocab_size", &m->vocab, 16777216) < 0 || read_int(h, "ffn_hidden", &m->ffn_hidden, 4194304) < 0 ||
        read_float(h, "rope_theta", &m->rope_theta, 1e12) < 0 || read_float(h, "norm_eps", &m->norm_eps, 1) < 0)
        return -1;
    if (h->opt_bool(h, "tie_word_embeddings", &m->tied) != CT_OK) m->tied = 1;
    if (m->dim % m->n_heads || (m->dim / m->n_heads) % 2) {
        h->set_error(h, "%sdim %lld must split into n_heads %lld heads of even size", dim ? "dim: " : heads ? "n_heads: " : "",
                     (long long)m->dim, (long long)m->n_heads);
        return -1;
    }
    if (m->n_heads % m->n_kv_heads) {
        h->set_error(h, "%sn_heads %lld must be a multiple of n_kv_heads %lld", kv ? "n_kv_heads: " : heads ? "n_heads: " : "",
                     (long long)m->n_heads, (long long)m->n_kv_heads);
        return -1;
    }
    return 0;
}

static ct_status qwen2_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    const flavor *f = NULL;
    for (size_t i = 0; i < sizeof flavors / sizeof flavors[0]; i++)
        if (cfg->flavor && strcmp(cfg->flavor, flavors[i].name) == 0) f = &flavors[i];
    if (!f) {
        h->set_error(h, "unknown flavor '%s' (known: tiny, 0.5B)", cfg->flavor ? cfg->flavor : "");
        return CT_ERR_INVALID;
    }
    qwen2 *m = calloc(1, sizeof *m);
    if (!m) return CT_ERR_NOMEM;
    *m = (qwen2){.host = h, .dim = f->dim, .n_layers = f->n_layers, .n_heads = f->n_heads, .n_kv_heads = f->n_kv_heads,
                 .vocab = f->vocab, .ffn_hidden = f->ffn_hidden, .rope_theta = f->rope_theta, .norm_eps = f->norm_eps,
                 .seq_len = cfg->seq_len};
    if (read_options(h, m)) {
        free(m);
        return CT_ERR_INVALID;
    }
    m->head_dim = m->dim / m->n_heads;
    if (!(m->layers = calloc((size_t)m->n_layers, sizeof(layer)))) {
        free(m);
        return CT_ERR_NOMEM;
    }
    for (int64_t l = 0; l < m->n_layers; l++)
        snprintf(m->layers[l].unit_name, sizeof m->layers[l].unit_name, "layers.%d", (int)l); /* n_layers <= 1024 */
    *out = m;
    return CT_OK;
}

static void qwen2_destroy(ct_model *p) {
    qwen2 *m = p;
    if (!m) return;
    free(m->layers);
    free(m);
}

static int64_t n_params_of(const qwen2 *m) {
    int64_t kv = m->n_kv_heads * m->head_dim, q = m->n_heads * m->head_dim;
    int64_t per_layer = 2 * m->dim + (m->dim * q + q) * 2 + 2 * (m->dim * kv + kv) - q + 3 * m->dim * m->ffn_hidden;
    /* (dim q + q) counts wq and its bias, and wo with a bias it lacks: hence - q */
    return m->vocab * m->dim * (m->tied ? 1 : 2) + m->dim + m->n_layers * per_layer;
}

static ct_status qwen2_describe(ct_model *p, ct_model_desc *d) {
    qwen2 *m = p;
    d->n_units = (int)m->n_layers + 2;
    d->vocab_size = m->vocab;
    d->dim = m->dim;
    d->n_layers = (int)m->n_layers;
    d->n_params = n_params_of(m);
    d->n_embedding_params = m->vocab * m->dim;
    /* torchtitan: 6 (N - N_emb) + 12 L heads head_dim seq_len; a tied head still runs its matmul */
    d->flops_per_token = 6.0 * (double)(d->n_params - d->n_embedding_params) +
                         (m->tied ? 6.0 * (double)(m->vocab * m->dim) : 0.0) +
                         12.0 * (double)m->n_layers * (double)m->n_heads * (double)m->head_dim * (double)m->seq_len;
    if (CT_HAS_FIELD(d, ct_model_desc, norm_eps)) {
        d->n_heads = m->n_heads;
        d->n_kv_heads = m->n_kv_heads;
        d->head_dim = m->head_dim;
        d->ffn_hidden = m->ffn_hidden;
        d->rope_theta = m->rope_theta;
        d->norm_eps = m->norm_eps;
    }
    if (CT_HAS_FIELD(d, ct_model_desc, hf_model_type)) {
        d->features = CT_MODEL_QKV_BIAS | (m->tied ? CT_MODEL_TIED_EMBEDDINGS : 0u);
        d->hf_model_type = "qwen2";
    }
    return CT_OK;
}

static ct_tensor *add(ct_param_registry *r, int unit, const char *name, int64_t d0, int64_t d1, ct_init init,
                      uint32_t flags) {
    int64_t shape[2] = {d0, d1};
    return r->add(r, unit, name, d1 ? 2 : 1, shape, &init, flags);
}

static ct_init trunc_init(float std) { return (ct_init){sizeof(ct_init), CT_INIT_TRUNC_NORMAL, std, -2.0f, 2.0f, 0}; }

/* The output head: its own matrix, or (tied) a use of the embedding table. */
static ct_status declare_head(qwen2 *m, ct_param_registry *r, int head) {
    if (!m->tied) {
        float std = 1.0f / sqrtf((float)m->dim);
        ct_init init = {sizeof(ct_init), CT_INIT_TRUNC_NORMAL, std, -3 * std, 3 * std, 0};
        return (m->output = add(r, head, "output.weight", m->vocab, m->dim, init, CT_TENSOR_LINEAR)) ? CT_OK
                                                                                                    : CT_ERR_INVALID;
    }
    if (!CT_HAS_FIELD(r, ct_param_registry, share) || !r->share) {
        m->host->set_error(m->host, "tie_word_embeddings: this host cannot share a parameter between units (ABI 2.1 "
                                    "ct_param_registry.share); set model.tie_word_embeddings: false");
        return CT_ERR_UNSUPPORTED;
    }
    return (m->output = r->share(r, head, "output.weight", m->tok_embeddings)) ? CT_OK : CT_ERR_INVALID;
}

static ct_status qwen2_declare(ct_model *p, ct_param_registry *r) {
    qwen2 *m = p;
    const ct_init ones = {sizeof(ct_init), CT_INIT_CONSTANT, 0, 0, 0, 1.0f};
    const ct_init zeros = {sizeof(ct_init), CT_INIT_CONSTANT, 0, 0, 0, 0.0f};
    const ct_init normal = {sizeof(ct_init), CT_INIT_NORMAL, 0.02f, 0, 0, 0};
    int64_t q = m->n_heads * m->head_dim, kv = m->n_kv_heads * m->head_dim;
    if (!(m->tok_embeddings = add(r, 0, "tok_embeddings.weight", m->vocab, m->dim, normal, 0))) return CT_ERR_INVALID;
    for (int64_t i = 0; i < m->n_layers; i++) {
        layer *L = &m->layers[i];
        float std = 0.02f / sqrtf(2.0f * (float)(i + 1)); /* the residual projections, by depth */
        const struct {
            ct_tensor **t;
            const char *suffix;
            int64_t d0, d1;
            ct_init init;
            uint32_t flags;
        } ps[] = { /* in the order ctitan convert writes them */
            {&L->attention_norm, "attention_norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY},
            {&L->wq, "attention.wq.weight", q, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->bq, "attention.wq.bias", q, 0, zeros, CT_TENSOR_NO_DECAY},
            {&L->wk, "attention.wk.weight", kv, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->bk, "attention.wk.bias", kv, 0, zeros, CT_TENSOR_NO_DECAY},
            {&L->wv, "attention.wv.weight", kv, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->bv, "attention.wv.bias", kv, 0, zeros, CT_TENSOR_NO_DECAY},
            {&L->wo, "attention.wo.weight", m->dim, q, trunc_init(std), CT_TENSOR_LINEAR},
            {&L->ffn_norm, "ffn_norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY},
            {&L->w1, "feed_forward.w1.weight", m->ffn_hidden, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->w2, "feed_forward.w2.weight", m->dim, m->ffn_hidden, trunc_init(std), CT_TENSOR_LINEAR},
            {&L->w3, "feed_forward.w3.weight", m->ffn_hidden, m->dim, trunc_init(std), CT_TENSOR_LINEAR},
        };
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
            char n[128];
            snprintf(n, sizeof n, "layers.%lld.%s", (long long)i, ps[k].suffix);
            if (!(*ps[k].t = add(r, (int)i + 1, n, ps[k].d0, ps[k].d1, ps[k].init, ps[k].flags))) return CT_ERR_INVALID;
        }
    }
    int head = (int)m->n_layers + 1;
    if (!(m->norm = add(r, head, "norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY))) return CT_ERR_INVALID;
    return declare_head(m, r, head);
}

static const char *qwen2_unit_name(ct_model *p, int unit) {
    qwen2 *m = p;
    if (unit == 0) return "tok_embeddings";
    if (unit == m->n_layers + 1) return "output";
    if (unit < 0 || unit > m->n_layers + 1) return "?";
    return m->layers[unit - 1].unit_name;
}

/* x W^T + b: the projection and its bias. */
static ct_tensor *linear_bias(ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor *bias) {
    ct_tensor *y = b->linear(b, x, w);
    return y ? b->bias(b, y, bias) : NULL;
}

/* x (B, T, D) -> x + attention(norm(x)) -> x + feed_forward(norm(x)). Every builder call returns NULL
 * on failure (the builder has set the error). Batch and sequence come from q, not x: under sequence
 * parallel x holds a slice of the rows; heads come from the shapes, not the flavor. */
static ct_status block_forward(qwen2 *m, const layer *L, ct_builder *b, ct_tensor *x, ct_tensor **out) {
    int64_t hd = m->head_dim;
    float eps = (float)m->norm_eps, theta = (float)m->rope_theta;
    ct_tensor *h, *q, *k, *v, *o;
    if (!(h = b->rmsnorm(b, x, L->attention_norm, eps))) return CT_ERR_INVALID;
    if (!(q = linear_bias(b, h, L->wq, L->bq)) || !(k = linear_bias(b, h, L->wk, L->bk)) ||
        !(v = linear_bias(b, h, L->wv, L->bv)))
        return CT_ERR_INVALID;
    int64_t B = q->shape[0], T = q->shape[1], nh = q->shape[2] / hd, nkv = k->shape[2] / hd;
    if (!(q = b->view(b, q, 4, (int64_t[]){B, T, nh, hd})) || !(k = b->view(b, k, 4, (int64_t[]){B, T, nkv, hd})) ||
        !(v = b->view(b, v, 4, (int64_t[]){B, T, nkv, hd})))
        return CT_ERR_INVALID;
    if (!(q = b->rope(b, q, theta)) || !(k = b->rope(b, k, theta))) return CT_ERR_INVALID;
    if (!(o = b->attention(b, q, k, v)) || !(o = b->view(b, o, 3, (int64_t[]){B, T, nh * hd})) ||
        !(o = b->linear(b, o, L->wo)) || !(x = b->add(b, x, o)))
        return CT_ERR_INVALID;
    ct_tensor *a, *g;
    if (!(h = b->rmsnorm(b, x, L->ffn_norm, eps)) || !(a = b->linear(b, h, L->w1)) || !(g = b->linear(b, h, L->w3)) ||
        !(h = b->swiglu(b, a, g)) || !(h = b->linear(b, h, L->w2)) || !(*out = b->add(b, x, h)))
        return CT_ERR_INVALID;
    return CT_OK;
}

static ct_status qwen2_unit_forward(ct_model *p, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                                    const ct_tensor *targets, ct_tensor **out) {
    qwen2 *m = p;
    if (unit == 0) return (*out = b->embedding(b, tokens, m->tok_embeddings)) ? CT_OK : CT_ERR_INVALID;
    if (unit >= 1 && unit <= m->n_layers) return block_forward(m, &m->layers[unit - 1], b, x, out);
    if (unit != m->n_layers + 1) {
        m->host->set_error(m->host, "unit %d out of range (model has %lld units)", unit, (long long)m->n_layers + 2);
        return CT_ERR_INVALID;
    }
    ct_tensor *h, *logits;
    if (!(h = b->rmsnorm(b, x, m->norm, (float)m->norm_eps)) || !(logits = b->linear(b, h, m->output)))
        return CT_ERR_INVALID;
    if (!targets) {
        *out = logits;
        return CT_OK;
    }
    return (*out = b->cross_entropy(b, logits, targets)) ? CT_OK : CT_ERR_INVALID;
}

/* models/llama3's plan plus the biases, which take their linear's style. A tied head is planned by
 * its use name ("output.weight"), the table in unit 0 by its own: the same rules either way. */
static const ct_tp_rule tp_plan[] = {
    {"tok_embeddings.weight", CT_TP_EMBED_ROWWISE},
    {"layers.*.attention_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.attention.wq.*", CT_TP_COLWISE}, /* weight and bias */
    {"layers.*.attention.wk.*", CT_TP_COLWISE},
    {"layers.*.attention.wv.*", CT_TP_COLWISE},
    {"layers.*.attention.wo.weight", CT_TP_ROWWISE},
    {"layers.*.ffn_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.feed_forward.w1.weight", CT_TP_COLWISE},
    {"layers.*.feed_forward.w2.weight", CT_TP_ROWWISE},
    {"layers.*.feed_forward.w3.weight", CT_TP_COLWISE},
    {"norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"output.weight", CT_TP_OUTPUT_COLWISE},
    {NULL, CT_TP_NONE},
};

/* ABI 2.1: the plan comes from the instance (the static ct_model_api.tp_plan is left NULL, so a
 * tensor-parallel run proves the host reads this). Every instance splits the same way today; an
 * option that changed the split (a bias on wo, say) would pick another table here. */
static const ct_tp_rule *qwen2_get_tp_plan(ct_model *p) {
    (void)p;
    return tp_plan;
}

/* ABI 2.12: Hugging Face's Qwen2ForCausalLM names. ctitan's RoPE rotates interleaved pairs, Hugging
 * Face's halves: q and k rows are permuted per head, and so are their biases (one element per row). A
 * tied head is the table's use and is not written (no lm_head.weight, as transformers writes it). */
static const ct_hf_name hf_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", 0},
    {"norm.weight", "model.norm.weight", 0},
    {"output.weight", "lm_head.weight", 0},
    {"layers.*.attention_norm.weight", "model.layers.*.input_layernorm.weight", 0},
    {"layers.*.attention.wq.weight", "model.layers.*.self_attn.q_proj.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wq.bias", "model.layers.*.self_attn.q_proj.bias", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wk.weight", "model.layers.*.self_attn.k_proj.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wk.bias", "model.layers.*.self_attn.k_proj.bias", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wv.weight", "model.layers.*.self_attn.v_proj.weight", 0},
    {"layers.*.attention.wv.bias", "model.layers.*.self_attn.v_proj.bias", 0},
    {"layers.*.attention.wo.weight", "model.layers.*.self_attn.o_proj.weight", 0},
    {"layers.*.ffn_norm.weight", "model.layers.*.post_attention_layernorm.weight", 0},
    {"layers.*.feed_forward.w1.weight", "model.layers.*.mlp.gate_proj.weight", 0},
    {"layers.*.feed_forward.w2.weight", "model.layers.*.mlp.down_proj.weight", 0},
    {"layers.*.feed_forward.w3.weight", "model.layers.*.mlp.up_proj.weight", 0},
    {NULL, NULL, 0},
};

/* Qwen2Config's keys as transformers writes them (q/k/v biases are implied; no head_dim). CT_HF_CHECKED:
 * what a loaded folder must match beyond the tensors' shapes; CT_HF_OR_ABSENT: a folder may leave the
 * key out (Qwen2Config's default is the value). This pack attends to every earlier token, so a folder
 * with use_sliding_window true is refused. */
static ct_status qwen2_hf_export(ct_model *p, ct_hf_export *out) {
    qwen2 *m = p;
    ct_hf_field *f = m->fields;
    int n = 0;
    const uint32_t C = CT_HF_CHECKED, A = CT_HF_CHECKED | CT_HF_OR_ABSENT;
#define FIELD(k, t, iv, fv, sv, fl) f[n++] = (ct_hf_field){k, t, iv, fv, sv, fl}
    FIELD("attention_dropout", CT_HF_FLOAT, 0, 0.0, NULL, 0);
    FIELD("hidden_act", CT_HF_STRING, 0, 0, "silu", A);
    FIELD("hidden_size", CT_HF_INT, m->dim, 0, NULL, C);
    FIELD("initializer_range", CT_HF_FLOAT, 0, 0.02, NULL, 0);
    FIELD("intermediate_size", CT_HF_INT, m->ffn_hidden, 0, NULL, C);
    FIELD("max_position_embeddings", CT_HF_INT, 8192, 0, NULL, 0);
    FIELD("max_window_layers", CT_HF_INT, m->n_layers, 0, NULL, 0);
    FIELD("num_attention_heads", CT_HF_INT, m->n_heads, 0, NULL, C);
    FIELD("num_hidden_layers", CT_HF_INT, m->n_layers, 0, NULL, C);
    FIELD("num_key_value_heads", CT_HF_INT, m->n_kv_heads, 0, NULL, C);
    FIELD("rms_norm_eps", CT_HF_FLOAT, 0, m->norm_eps, NULL, C);
    FIELD("rope_scaling", CT_HF_NULL, 0, 0, NULL, C);
    FIELD("rope_theta", CT_HF_FLOAT, 0, m->rope_theta, NULL, C);
    FIELD("sliding_window", CT_HF_NULL, 0, 0, NULL, 0);
    FIELD("tie_word_embeddings", CT_HF_BOOL, m->tied, 0, NULL, m->tied ? C : A);
    FIELD("use_cache", CT_HF_BOOL, 1, 0, NULL, 0);
    FIELD("use_sliding_window", CT_HF_BOOL, 0, 0, NULL, A);
    FIELD("vocab_size", CT_HF_INT, m->vocab, 0, NULL, C);
    f[n] = (ct_hf_field){0};
#undef FIELD
    out->architecture = "Qwen2ForCausalLM";
    out->model_type = "qwen2";
    out->names = hf_names;
    out->fields = f;
    return CT_OK;
}

/* How a Qwen2Config's keys set this pack's options (ABI 2.16), with Qwen2Config's defaults. */
static const ct_hf_option hf_options[] = {
    {"hidden_size", "dim", NULL, NULL, 0},
    {"num_hidden_layers", "n_layers", NULL, NULL, 0},
    {"num_attention_heads", "n_heads", NULL, NULL, 0},
    {"num_key_value_heads", "n_kv_heads", "num_attention_heads", NULL, 0},
    {"vocab_size", "vocab_size", NULL, NULL, 0},
    {"intermediate_size", "ffn_hidden", NULL, NULL, 0},
    {"rope_theta", "rope_theta", NULL, "10000", 0},
    {"rms_norm_eps", "norm_eps", NULL, "1e-6", 0},
    {"tie_word_embeddings", "tie_word_embeddings", NULL, "false", 0},
    {NULL, NULL, NULL, NULL, 0},
};

static const ct_hf_import hf_import = {
    .struct_size = sizeof(ct_hf_import), .model_type = "qwen2", .options = hf_options};

static const ct_model_api api = {
    .struct_size = sizeof(ct_model_api),
    .flavors = flavor_names,
    .create = qwen2_create,
    .destroy = qwen2_destroy,
    .describe = qwen2_describe,
    .declare_params = qwen2_declare,
    .unit_name = qwen2_unit_name,
    .unit_forward = qwen2_unit_forward,
    .tp_plan = NULL,
    .get_tp_plan = qwen2_get_tp_plan,
    .hf_export = qwen2_hf_export,
    .hf_import = &hf_import,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "qwen2";
    info->description = "Qwen2 (Llama blocks with q/k/v biases, tied embeddings); flavors tiny, 0.5B";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
