/* qwen3.c: the Qwen3 dense model pack (torchtitan's qwen3: Llama 3's block with a per-head RMSNorm on q
 * and k before RoPE, a head_dim of its own, no biases, the small flavors' head tied to the embedding
 * table). Forward only: the host's tape replays the backward. Built against the SDK headers alone.
 *
 * Units: 0 = tok_embeddings, 1..L = layers.0 .. layers.L-1, L+1 = norm + output (+ loss). Parameter
 * names are torchtitan's FQNs (layers.N.attention.q_norm.weight, ...). The pack carries its own
 * Hugging Face mapping (ABI 2.12: hf_export), so checkpoint.last_save_in_hf writes a
 * Qwen3ForCausalLM folder and checkpoint.initial_load_in_hf reads one, with no Qwen3 knowledge in
 * the host; and its tensor-parallel plan marks the QK-norm weights CT_TP_REPLICATED_PARTIAL
 * (torchtitan's SequenceParallel(sequence_dim=2)): they meet head-split q and k, so their gradients
 * are summed over tp.
 *
 * MoE flavors (debugmodel_moe, 30B-A3B, 235B-A22B; model.n_experts > 0): every block's feed-forward is
 * the host's moe op (ABI 2.15) over torchtitan's layers.N.moe.router.gate.weight and stacked
 * layers.N.moe.experts.w1/w2/w3, softmax top-k with norm_topk_prob and no shared expert, as
 * Qwen3MoeForCausalLM; the load-balancing loss is transformers' formula per block, averaged over the
 * blocks, weighted by router_aux_loss_coef and reported as aux_loss.
 */
#include <ctitan/abi.h>
#include <ctitan/device.h>
#include <ctitan/host.h>
#include <ctitan/model.h>
#include <ctitan/tensor.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct flavor {
    const char *name;
    int64_t dim, n_layers, n_heads, n_kv_heads, head_dim, vocab, ffn_hidden;
    int tied;
    int64_t n_experts, top_k, moe_hidden; /* 0 experts: dense */
} flavor;

/* torchtitan's qwen3 flavors (models/qwen3/__init__.py), Qwen3's config.json sizes: rope_theta 1e6,
 * rms_norm_eps 1e-6 throughout */
static const flavor flavors[] = {
    {"debugmodel", 256, 8, 16, 8, 128, 2048, 3072, 1, 0, 0, 0},
    {"0.6B", 1024, 28, 16, 8, 128, 151936, 3072, 1, 0, 0, 0},
    {"1.7B", 2048, 28, 16, 8, 128, 151936, 6144, 1, 0, 0, 0},
    {"4B", 2560, 36, 32, 8, 128, 151936, 9728, 1, 0, 0, 0},
    {"8B", 4096, 36, 32, 8, 128, 151936, 12288, 0, 0, 0, 0},
    {"14B", 5120, 40, 40, 8, 128, 151936, 17408, 0, 0, 0, 0},
    {"32B", 5120, 64, 64, 8, 128, 151936, 25600, 0, 0, 0, 0},
    /* mixture of experts (torchtitan's debugmodel_moe; Qwen3-30B-A3B and 235B-A22B's config.json): every block's
     * feed-forward is e experts of moe_hidden, top-8 by softmax, the 8 weights renormalised
     * (norm_topk_prob), no shared expert */
    {"debugmodel_moe", 256, 8, 16, 8, 128, 2048, 3072, 1, 64, 8, 768},
    {"30B-A3B", 2048, 48, 32, 4, 128, 151936, 6144, 0, 128, 8, 768},
    {"235B-A22B", 4096, 94, 64, 4, 128, 151936, 12288, 0, 128, 8, 1536},
};
static const char *const flavor_names[] = {"debugmodel", "0.6B", "1.7B", "4B", "8B", "14B", "32B",
                                           "debugmodel_moe", "30B-A3B", "235B-A22B", NULL};
#define N_FLAVORS (sizeof flavors / sizeof flavors[0])

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "dim", CT_OPT_INT, NULL, "override the flavor's model width", "[1, 131072]", NULL},
    {sizeof(ct_option_spec), "n_layers", CT_OPT_INT, NULL, "override the number of blocks", "[1, 1024]", NULL},
    {sizeof(ct_option_spec), "n_heads", CT_OPT_INT, NULL, "override the number of query heads", "[1, 4096]", NULL},
    {sizeof(ct_option_spec), "n_kv_heads", CT_OPT_INT, NULL, "override the number of key/value heads", "[1, 4096]",
     NULL},
    {sizeof(ct_option_spec), "head_dim", CT_OPT_INT, NULL, "override the size of a head (even)", "[2, 4096]", NULL},
    {sizeof(ct_option_spec), "vocab_size", CT_OPT_INT, NULL, "override the vocabulary size", "[1, 16777216]", NULL},
    {sizeof(ct_option_spec), "ffn_hidden", CT_OPT_INT, NULL, "override the SwiGLU hidden size", "[1, 4194304]",
     NULL},
    {sizeof(ct_option_spec), "rope_theta", CT_OPT_FLOAT, "1000000", "RoPE base", "(0, 1e12]", NULL},
    {sizeof(ct_option_spec), "norm_eps", CT_OPT_FLOAT, "1e-6", "RMSNorm epsilon (every norm, QK-norm too)", "(0, 1]",
     NULL},
    {sizeof(ct_option_spec), "tie_word_embeddings", CT_OPT_BOOL, NULL,
     "the output head reuses tok_embeddings.weight (the flavor's choice by default: 0.6B to 4B tie)", NULL, NULL},
    {sizeof(ct_option_spec), "max_position_embeddings", CT_OPT_INT, "40960",
     "the context length written to an exported config.json (Qwen3's)", "[1, 2147483647]", NULL},
    {sizeof(ct_option_spec), "n_experts", CT_OPT_INT, NULL,
     "override the number of experts per block (0: a dense feed-forward; the MoE flavors have 64 or 128)",
     "[0, 65536]", NULL},
    {sizeof(ct_option_spec), "top_k", CT_OPT_INT, NULL, "override the experts per token (num_experts_per_tok)",
     "[1, 65536]", NULL},
    {sizeof(ct_option_spec), "moe_hidden", CT_OPT_INT, NULL,
     "override each expert's SwiGLU hidden size (moe_intermediate_size)", "[1, 4194304]", NULL},
    {sizeof(ct_option_spec), "norm_topk_prob", CT_OPT_BOOL, "true",
     "divide each token's top-k router weights by their sum", NULL, NULL},
    {sizeof(ct_option_spec), "router_aux_loss_coef", CT_OPT_FLOAT, "0.001",
     "weight of the load-balancing loss (transformers' formula per MoE block, averaged over the blocks; 0: none)",
     "[0, 1000]", NULL},
    {sizeof(ct_option_spec), "moe_force_load_balance", CT_OPT_BOOL, "false",
     "tests: route token t's slot s to expert (t*top_k + s) % n_experts (torchtitan's debug.moe_force_load_balance)",
     NULL, NULL},
    {sizeof(ct_option_spec), "moe_log_load", CT_OPT_BOOL, "false",
     "log each MoE block's per-expert token counts after every step (rank 0: its pipeline stage's blocks)", NULL, NULL},
    {0},
};

typedef struct layer {
    ct_tensor *attention_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *ffn_norm, *w1, *w2, *w3;
    ct_tensor *router; /* MoE blocks: the gate (e, dim); w1, w3 (e, moe_hidden, dim), w2 (e, dim, moe_hidden) */
    char unit_name[24];
} layer;

#define N_FIELDS 32

typedef struct ct_model {
    const ct_host *host;
    int64_t dim, n_layers, n_heads, n_kv_heads, head_dim, vocab, ffn_hidden, seq_len, max_positions;
    double rope_theta, norm_eps;
    int tied;
    int64_t n_experts, top_k, moe_hidden;
    int norm_topk, force_balance, log_load;
    double aux_coef;
    ct_tensor *tok_embeddings, *norm, *output;
    layer *layers;
    ct_hf_field fields[N_FIELDS]; /* hf_export's answer, kept until destroy */
} qwen3;

/* An option that overrides the flavor's value (the host checked its range). */
static void override_int(const ct_host *h, const char *key, int64_t *v) {
    int64_t x;
    if (h->opt_int(h, key, &x) == CT_OK) *v = x;
}

static ct_status qwen3_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    const flavor *f = NULL;
    for (size_t i = 0; i < N_FLAVORS; i++)
        if (cfg->flavor && !strcmp(cfg->flavor, flavors[i].name)) f = &flavors[i];
    if (!f) {
        h->set_error(h, "unknown flavor '%s' (known: debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B, debugmodel_moe, 30B-A3B, "
                        "235B-A22B)",
                     cfg->flavor ? cfg->flavor : "");
        return CT_ERR_INVALID;
    }
    qwen3 *m = calloc(1, sizeof *m);
    if (!m) return CT_ERR_NOMEM;
    *m = (qwen3){.host = h, .dim = f->dim, .n_layers = f->n_layers, .n_heads = f->n_heads,
                 .n_kv_heads = f->n_kv_heads, .head_dim = f->head_dim, .vocab = f->vocab,
                 .ffn_hidden = f->ffn_hidden, .seq_len = cfg->seq_len, .tied = f->tied,
                 .rope_theta = 1e6, .norm_eps = 1e-6, .max_positions = 40960, .n_experts = f->n_experts,
                 .top_k = f->top_k ? f->top_k : 8, .moe_hidden = f->moe_hidden ? f->moe_hidden : f->ffn_hidden / 4,
                 .norm_topk = 1, .aux_coef = 0.001};
    override_int(h, "dim", &m->dim);
    override_int(h, "n_layers", &m->n_layers);
    override_int(h, "n_heads", &m->n_heads);
    override_int(h, "n_kv_heads", &m->n_kv_heads);
    override_int(h, "head_dim", &m->head_dim);
    override_int(h, "vocab_size", &m->vocab);
    override_int(h, "ffn_hidden", &m->ffn_hidden);
    override_int(h, "max_position_embeddings", &m->max_positions);
    h->opt_float(h, "rope_theta", &m->rope_theta);
    h->opt_float(h, "norm_eps", &m->norm_eps);
    h->opt_bool(h, "tie_word_embeddings", &m->tied);
    override_int(h, "n_experts", &m->n_experts);
    override_int(h, "top_k", &m->top_k);
    override_int(h, "moe_hidden", &m->moe_hidden);
    h->opt_bool(h, "norm_topk_prob", &m->norm_topk);
    h->opt_float(h, "router_aux_loss_coef", &m->aux_coef);
    h->opt_bool(h, "moe_force_load_balance", &m->force_balance);
    h->opt_bool(h, "moe_log_load", &m->log_load);
    const char *bad = m->head_dim % 2 ? "head_dim: must be even (RoPE rotates pairs)"
                      : m->n_heads % m->n_kv_heads ? "n_kv_heads: must divide n_heads"
                      : m->n_experts && m->top_k > m->n_experts ? "top_k: must be at most n_experts"
                                                                : NULL;
    if (bad || !(m->layers = calloc((size_t)m->n_layers, sizeof(layer)))) {
        if (bad) h->set_error(h, "%s (head_dim %lld, n_heads %lld, n_kv_heads %lld, top_k %lld, n_experts %lld)", bad,
                              (long long)m->head_dim, (long long)m->n_heads, (long long)m->n_kv_heads,
                              (long long)m->top_k, (long long)m->n_experts);
        free(m);
        return bad ? CT_ERR_INVALID : CT_ERR_NOMEM;
    }
    for (int64_t l = 0; l < m->n_layers; l++)
        snprintf(m->layers[l].unit_name, sizeof m->layers[l].unit_name, "layers.%d", (int)l);
    *out = m;
    return CT_OK;
}

static void qwen3_destroy(ct_model *p) {
    if (!p) return;
    free(p->layers);
    free(p);
}

/* The parameters of every block's feed-forward, and those one token computes with (top_k experts). */
static int64_t ffn_params(const qwen3 *m, int active) {
    if (!m->n_experts) return 3 * m->dim * m->ffn_hidden;
    return m->n_experts * m->dim + (active ? m->top_k : m->n_experts) * 3 * m->dim * m->moe_hidden;
}

static int64_t n_params_of(const qwen3 *m, int active) {
    int64_t q = m->n_heads * m->head_dim, kv = m->n_kv_heads * m->head_dim;
    int64_t per_layer = 2 * m->dim + 2 * m->head_dim + 2 * m->dim * q + 2 * m->dim * kv + ffn_params(m, active);
    return m->vocab * m->dim * (m->tied ? 1 : 2) + m->dim + m->n_layers * per_layer;
}

static ct_status qwen3_describe(ct_model *p, ct_model_desc *d) {
    qwen3 *m = p;
    d->n_units = (int)m->n_layers + 2;
    d->vocab_size = m->vocab;
    d->dim = m->dim;
    d->n_layers = (int)m->n_layers;
    d->n_params = n_params_of(m, 0);
    d->n_embedding_params = m->vocab * m->dim;
    /* torchtitan: 6 * (params - embedding) + 12 * layers * heads * head_dim * seq_len; a tied table still
     * costs the output projection; under MoE only the top_k experts a token visits count */
    d->flops_per_token = 6.0 * (double)(n_params_of(m, 1) - d->n_embedding_params + (m->tied ? m->vocab * m->dim : 0)) +
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
        d->features = m->tied ? CT_MODEL_TIED_EMBEDDINGS : 0;
        d->hf_model_type = m->n_experts ? "qwen3_moe" : "qwen3";
    }
    return CT_OK;
}

static ct_tensor *add(ct_param_registry *r, int unit, const char *name, int64_t d0, int64_t d1, ct_init init,
                      uint32_t flags) {
    int64_t shape[2] = {d0, d1};
    return r->add(r, unit, name, d1 ? 2 : 1, shape, &init, flags);
}

static ct_init trunc_init(float std) { return (ct_init){sizeof(ct_init), CT_INIT_TRUNC_NORMAL, std, -2.0f, 2.0f, 0}; }

/* A block's experts, as torchtitan names them: layers.N.moe.router.gate.weight (e, dim) and
 * layers.N.moe.experts.w1, w3 (e, moe_hidden, dim), w2 (e, dim, moe_hidden), initialised as the dense
 * block's w1, w3 and w2 are. */
static ct_status declare_moe(qwen3 *m, ct_param_registry *r, layer *L, int i, float std) {
    int64_t e = m->n_experts, h = m->moe_hidden, d = m->dim;
    const struct {
        ct_tensor **t;
        const char *suffix;
        int64_t shape[3];
        int ndim;
        float std;
    } ps[] = {
        {&L->router, "moe.router.gate.weight", {e, d, 0}, 2, 0.02f},
        {&L->w1, "moe.experts.w1", {e, h, d}, 3, 0.02f},
        {&L->w2, "moe.experts.w2", {e, d, h}, 3, std},
        {&L->w3, "moe.experts.w3", {e, h, d}, 3, std},
    };
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        char n[128];
        ct_init init = trunc_init(ps[k].std);
        snprintf(n, sizeof n, "layers.%d.%s", i, ps[k].suffix);
        /* the stacked experts (not the router) are what expert parallel splits along dim 0 */
        if (!(*ps[k].t = r->add(r, i + 1, n, ps[k].ndim, ps[k].shape, &init, k ? CT_TENSOR_EXPERTS : 0)))
            return CT_ERR_INVALID;
    }
    return CT_OK;
}

static ct_status qwen3_declare(ct_model *p, ct_param_registry *r) {
    qwen3 *m = p;
    const ct_init ones = {sizeof(ct_init), CT_INIT_CONSTANT, 0, 0, 0, 1.0f};
    const ct_init normal1 = {sizeof(ct_init), CT_INIT_NORMAL, 1.0f, 0, 0, 0};
    int64_t q = m->n_heads * m->head_dim, kv = m->n_kv_heads * m->head_dim, hd = m->head_dim;
    int head = (int)m->n_layers + 1;
    float out_std = 1.0f / sqrtf((float)m->dim);
    ct_init out_init = {sizeof(ct_init), CT_INIT_TRUNC_NORMAL, out_std, -3 * out_std, 3 * out_std, 0};
    if (!(m->tok_embeddings = add(r, 0, "tok_embeddings.weight", m->vocab, m->dim, m->tied ? out_init : normal1, 0)))
        return CT_ERR_INVALID;
    for (int64_t i = 0; i < m->n_layers; i++) {
        layer *L = &m->layers[i];
        float std = 0.02f / sqrtf(2.0f * (float)(i + 1)); /* torchtitan's depth init */
        const struct {
            ct_tensor **t;
            const char *suffix;
            int64_t d0, d1;
            ct_init init;
            uint32_t flags;
        } ps[] = {
            {&L->attention_norm, "attention_norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY},
            {&L->wq, "attention.wq.weight", q, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->wk, "attention.wk.weight", kv, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->wv, "attention.wv.weight", kv, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->q_norm, "attention.q_norm.weight", hd, 0, ones, CT_TENSOR_NO_DECAY},
            {&L->k_norm, "attention.k_norm.weight", hd, 0, ones, CT_TENSOR_NO_DECAY},
            {&L->wo, "attention.wo.weight", m->dim, q, trunc_init(std), CT_TENSOR_LINEAR},
            {&L->ffn_norm, "ffn_norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY},
            {&L->w1, "feed_forward.w1.weight", m->ffn_hidden, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->w2, "feed_forward.w2.weight", m->dim, m->ffn_hidden, trunc_init(std), CT_TENSOR_LINEAR},
            {&L->w3, "feed_forward.w3.weight", m->ffn_hidden, m->dim, trunc_init(std), CT_TENSOR_LINEAR},
        };
        size_t np = sizeof ps / sizeof ps[0] - (m->n_experts ? 3 : 0); /* MoE: the experts replace w1..w3 */
        if (m->n_experts && declare_moe(m, r, L, (int)i, std) != CT_OK) return CT_ERR_INVALID;
        for (size_t k = 0; k < np; k++) {
            char n[128];
            snprintf(n, sizeof n, "layers.%lld.%s", (long long)i, ps[k].suffix);
            if (!(*ps[k].t = add(r, (int)i + 1, n, ps[k].d0, ps[k].d1, ps[k].init, ps[k].flags)))
                return CT_ERR_INVALID;
        }
    }
    if (!(m->norm = add(r, head, "norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY))) return CT_ERR_INVALID;
    m->output = m->tied ? r->share(r, head, "output.weight", m->tok_embeddings)
                        : add(r, head, "output.weight", m->vocab, m->dim, out_init, CT_TENSOR_LINEAR);
    return m->output ? CT_OK : CT_ERR_INVALID;
}

static const char *qwen3_unit_name(ct_model *p, int unit) {
    qwen3 *m = p;
    if (unit == 0) return "tok_embeddings";
    if (unit == m->n_layers + 1) return "output";
    if (unit < 0 || unit > m->n_layers + 1) return "?";
    return m->layers[unit - 1].unit_name;
}

/* A projection to heads: (B, T, D) -> (B, T, n, hd), RMS-normed per head when norm is given, then
 * rotated. Batch and sequence come from the projection's output (under sequence parallel x holds a
 * slice of the rows). */
static ct_tensor *heads(qwen3 *m, ct_builder *b, ct_tensor *h, ct_tensor *w, ct_tensor *norm, int rotate) {
    ct_tensor *t = b->linear(b, h, w);
    if (!t) return NULL;
    int64_t shape[4] = {t->shape[0], t->shape[1], w->shape[0] / m->head_dim, m->head_dim};
    if (!(t = b->view(b, t, 4, shape))) return NULL;
    if (norm && !(t = b->rmsnorm(b, t, norm, (float)m->norm_eps))) return NULL;
    return rotate ? b->rope(b, t, (float)m->rope_theta) : t;
}

/* h (B, T, D) -> the block's experts on h: softmax top-k routing, weights renormalised (norm_topk_prob), and
 * the load-balancing loss of transformers' Qwen3-MoE on this block, averaged over the blocks (each block's
 * coefficient divided by their number). NULL with the error set. */
static ct_tensor *moe_forward(qwen3 *m, const layer *L, ct_builder *b, ct_tensor *h) {
    if (!CT_HAS_FIELD(b, ct_builder, moe) || !b->moe) {
        m->host->set_error(m->host, "qwen3: the MoE flavors need a host with ct_builder.moe (ABI 2.15)");
        return NULL;
    }
    ct_moe_layer ml = {.struct_size = sizeof ml, .router = L->router, .w1 = L->w1, .w3 = L->w3, .w2 = L->w2,
                       .top_k = m->top_k, .score_func = CT_MOE_SOFTMAX, .normalize = m->norm_topk, .route_scale = 1.0f,
                       .aux_loss_coef = (float)(m->aux_coef / (double)m->n_layers),
                       .force_load_balance = m->force_balance};
    return b->moe(b, h, &ml);
}

/* x (B, T, D) -> x + attention(norm(x)) -> x + feed_forward(norm(x)); every builder call returns NULL on
 * failure with the error set. */
static ct_status block_forward(qwen3 *m, const layer *L, ct_builder *b, ct_tensor *x, ct_tensor **out) {
    float eps = (float)m->norm_eps;
    ct_tensor *h, *q, *k, *v, *o, *a, *g;
    if (!(h = b->rmsnorm(b, x, L->attention_norm, eps))) return CT_ERR_INVALID;
    if (!(q = heads(m, b, h, L->wq, L->q_norm, 1)) || !(k = heads(m, b, h, L->wk, L->k_norm, 1)) ||
        !(v = heads(m, b, h, L->wv, NULL, 0)))
        return CT_ERR_INVALID;
    if (!(o = b->attention(b, q, k, v))) return CT_ERR_INVALID;
    if (!(o = b->view(b, o, 3, (int64_t[]){q->shape[0], q->shape[1], q->shape[2] * m->head_dim})))
        return CT_ERR_INVALID;
    if (!(o = b->linear(b, o, L->wo)) || !(x = b->add(b, x, o))) return CT_ERR_INVALID;
    if (!(h = b->rmsnorm(b, x, L->ffn_norm, eps))) return CT_ERR_INVALID;
    if (m->n_experts) { /* the experts in place of the dense feed-forward */
        if (!(h = moe_forward(m, L, b, h))) return CT_ERR_INVALID;
        return (*out = b->add(b, x, h)) ? CT_OK : CT_ERR_INVALID;
    }
    if (!(a = b->linear(b, h, L->w1)) || !(g = b->linear(b, h, L->w3))) return CT_ERR_INVALID;
    if (!(h = b->swiglu(b, a, g)) || !(h = b->linear(b, h, L->w2))) return CT_ERR_INVALID;
    return (*out = b->add(b, x, h)) ? CT_OK : CT_ERR_INVALID;
}

static ct_status qwen3_unit_forward(ct_model *p, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                                    const ct_tensor *targets, ct_tensor **out) {
    qwen3 *m = p;
    if (unit == 0) return (*out = b->embedding(b, tokens, m->tok_embeddings)) ? CT_OK : CT_ERR_INVALID;
    if (unit <= m->n_layers) return block_forward(m, &m->layers[unit - 1], b, x, out);
    if (unit == m->n_layers + 1) {
        ct_tensor *h, *logits;
        if (!(h = b->rmsnorm(b, x, m->norm, (float)m->norm_eps))) return CT_ERR_INVALID;
        if (targets && CT_HAS_FIELD(b, ct_builder, linear_cross_entropy) && b->linear_cross_entropy)
            return (*out = b->linear_cross_entropy(b, h, m->output, targets)) ? CT_OK : CT_ERR_INVALID;
        if (!(logits = b->linear(b, h, m->output))) return CT_ERR_INVALID;
        if (!targets) return (*out = logits), CT_OK;
        return (*out = b->cross_entropy(b, logits, targets)) ? CT_OK : CT_ERR_INVALID;
    }
    m->host->set_error(m->host, "unit %d out of range (model has %lld units)", unit, (long long)m->n_layers + 2);
    return CT_ERR_INVALID;
}

/* torchtitan's Qwen3 plan: Llama's, plus the QK-norm weights, which meet head-split q and k */
static const ct_tp_rule tp_plan[] = {
    {"tok_embeddings.weight", CT_TP_EMBED_ROWWISE},
    {"layers.*.attention_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.attention.wq.weight", CT_TP_COLWISE},
    {"layers.*.attention.wk.weight", CT_TP_COLWISE},
    {"layers.*.attention.wv.weight", CT_TP_COLWISE},
    {"layers.*.attention.q_norm.weight", CT_TP_REPLICATED_PARTIAL},
    {"layers.*.attention.k_norm.weight", CT_TP_REPLICATED_PARTIAL},
    {"layers.*.attention.wo.weight", CT_TP_ROWWISE},
    {"layers.*.ffn_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.feed_forward.w1.weight", CT_TP_COLWISE},
    {"layers.*.feed_forward.w2.weight", CT_TP_ROWWISE},
    {"layers.*.feed_forward.w3.weight", CT_TP_COLWISE},
    /* MoE blocks: the router and the experts stay whole on every tp rank (torchtitan without expert tensor
     * parallel); under sequence parallel the layer sees 1/tp of the token rows, so their gradients are summed */
    {"layers.*.moe.router.gate.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.moe.experts.w1", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.moe.experts.w2", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.moe.experts.w3", CT_TP_SEQUENCE_PARALLEL},
    {"norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"output.weight", CT_TP_OUTPUT_COLWISE},
    {NULL, CT_TP_NONE},
};

/* Hugging Face's Qwen3ForCausalLM names. ctitan's RoPE rotates interleaved pairs, Hugging Face's halves:
 * q and k rows are permuted per head, and so are the QK-norm weights (one head's worth of elements),
 * which scale q and k element by element before the rotation. */
static const ct_hf_name hf_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", 0},
    {"norm.weight", "model.norm.weight", 0},
    {"output.weight", "lm_head.weight", 0},
    {"layers.*.attention_norm.weight", "model.layers.*.input_layernorm.weight", 0},
    {"layers.*.attention.wq.weight", "model.layers.*.self_attn.q_proj.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wk.weight", "model.layers.*.self_attn.k_proj.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wv.weight", "model.layers.*.self_attn.v_proj.weight", 0},
    {"layers.*.attention.q_norm.weight", "model.layers.*.self_attn.q_norm.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.k_norm.weight", "model.layers.*.self_attn.k_norm.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wo.weight", "model.layers.*.self_attn.o_proj.weight", 0},
    {"layers.*.ffn_norm.weight", "model.layers.*.post_attention_layernorm.weight", 0},
    {"layers.*.feed_forward.w1.weight", "model.layers.*.mlp.gate_proj.weight", 0},
    {"layers.*.feed_forward.w2.weight", "model.layers.*.mlp.down_proj.weight", 0},
    {"layers.*.feed_forward.w3.weight", "model.layers.*.mlp.up_proj.weight", 0},
    /* MoE blocks (Qwen3MoeForCausalLM): one tensor per expert, as transformers saves them */
    {"layers.*.moe.router.gate.weight", "model.layers.*.mlp.gate.weight", 0},
    {"layers.*.moe.experts.w1", "model.layers.*.mlp.experts.*.gate_proj.weight", CT_HF_EXPERTS},
    {"layers.*.moe.experts.w2", "model.layers.*.mlp.experts.*.down_proj.weight", CT_HF_EXPERTS},
    {"layers.*.moe.experts.w3", "model.layers.*.mlp.experts.*.up_proj.weight", CT_HF_EXPERTS},
    {NULL, NULL, 0},
};

/* Qwen3Config's keys as transformers writes them; CT_HF_CHECKED: what a loaded folder must match
 * beyond the tensors' shapes. */
static ct_status qwen3_hf_export(ct_model *p, ct_hf_export *out) {
    qwen3 *m = p;
    ct_hf_field *f = m->fields;
    int n = 0;
#define FIELD(k, t, iv, fv, sv, fl) f[n++] = (ct_hf_field){k, t, iv, fv, sv, fl}
    FIELD("attention_bias", CT_HF_BOOL, 0, 0, NULL, CT_HF_CHECKED);
    FIELD("attention_dropout", CT_HF_FLOAT, 0, 0.0, NULL, 0);
    if (m->n_experts) { /* Qwen3MoeConfig's: every block sparse (step 1, no mlp_only_layers) */
        FIELD("decoder_sparse_step", CT_HF_INT, 1, 0, NULL, CT_HF_CHECKED | CT_HF_OR_ABSENT);
        FIELD("mlp_only_layers", CT_HF_EMPTY_LIST, 0, 0, NULL, CT_HF_CHECKED | CT_HF_OR_ABSENT);
        FIELD("moe_intermediate_size", CT_HF_INT, m->moe_hidden, 0, NULL, CT_HF_CHECKED);
        FIELD("norm_topk_prob", CT_HF_BOOL, m->norm_topk, 0, NULL, CT_HF_CHECKED);
        FIELD("num_experts", CT_HF_INT, m->n_experts, 0, NULL, 0);
        FIELD("num_experts_per_tok", CT_HF_INT, m->top_k, 0, NULL, CT_HF_CHECKED);
        FIELD("output_router_logits", CT_HF_BOOL, 0, 0, NULL, 0);
        FIELD("router_aux_loss_coef", CT_HF_FLOAT, 0, m->aux_coef, NULL, 0);
    }
    FIELD("head_dim", CT_HF_INT, m->head_dim, 0, NULL, CT_HF_CHECKED);
    FIELD("hidden_act", CT_HF_STRING, 0, 0, "silu", CT_HF_CHECKED);
    FIELD("hidden_size", CT_HF_INT, m->dim, 0, NULL, CT_HF_CHECKED);
    FIELD("initializer_range", CT_HF_FLOAT, 0, 0.02, NULL, 0);
    FIELD("intermediate_size", CT_HF_INT, m->ffn_hidden, 0, NULL, m->n_experts ? 0 : CT_HF_CHECKED);
    FIELD("max_position_embeddings", CT_HF_INT, m->max_positions, 0, NULL, 0);
    FIELD("max_window_layers", CT_HF_INT, m->n_layers, 0, NULL, 0);
    FIELD("num_attention_heads", CT_HF_INT, m->n_heads, 0, NULL, CT_HF_CHECKED);
    FIELD("num_hidden_layers", CT_HF_INT, m->n_layers, 0, NULL, CT_HF_CHECKED);
    FIELD("num_key_value_heads", CT_HF_INT, m->n_kv_heads, 0, NULL, CT_HF_CHECKED);
    FIELD("rms_norm_eps", CT_HF_FLOAT, 0, m->norm_eps, NULL, CT_HF_CHECKED);
    FIELD("rope_scaling", CT_HF_NULL, 0, 0, NULL, CT_HF_CHECKED);
    FIELD("rope_theta", CT_HF_FLOAT, 0, m->rope_theta, NULL, CT_HF_CHECKED);
    FIELD("sliding_window", CT_HF_NULL, 0, 0, NULL, 0);
    FIELD("tie_word_embeddings", CT_HF_BOOL, m->tied, 0, NULL, CT_HF_CHECKED);
    FIELD("use_cache", CT_HF_BOOL, 1, 0, NULL, 0);
    FIELD("use_sliding_window", CT_HF_BOOL, 0, 0, NULL, CT_HF_CHECKED);
    FIELD("vocab_size", CT_HF_INT, m->vocab, 0, NULL, CT_HF_CHECKED);
    f[n] = (ct_hf_field){0};
#undef FIELD
    out->architecture = m->n_experts ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM";
    out->model_type = m->n_experts ? "qwen3_moe" : "qwen3";
    out->names = hf_names;
    out->fields = f;
    return CT_OK;
}

/* How a Qwen3Config's keys set this pack's options (ABI 2.16), with Qwen3Config's defaults. A
 * Qwen3MoeConfig's (model_type qwen3_moe, ABI 2.18) also set the experts; a dense folder has none of
 * them, and its model no experts. transformers 5 writes num_experts as num_local_experts. Left out of a
 * MoE folder, num_experts_per_tok and router_aux_loss_coef take the pack's defaults, which are
 * Qwen3MoeConfig's (8, 0.001); norm_topk_prob's is given (false; the pack's own is true, and a dense
 * model ignores it). decoder_sparse_step and mlp_only_layers are the export's checked fields (every
 * block sparse); output_router_logits only asks transformers to return the router logits. */
static const ct_hf_option hf_options[] = {
    {"hidden_size", "dim", NULL, NULL, 0},
    {"num_hidden_layers", "n_layers", NULL, NULL, 0},
    {"num_attention_heads", "n_heads", NULL, NULL, 0},
    {"num_key_value_heads", "n_kv_heads", "num_attention_heads", NULL, 0},
    {"head_dim", "head_dim", NULL, NULL, 0},
    {"vocab_size", "vocab_size", NULL, NULL, 0},
    {"intermediate_size", "ffn_hidden", NULL, NULL, 0},
    {"rope_theta", "rope_theta", NULL, "10000", 0},
    {"rms_norm_eps", "norm_eps", NULL, "1e-6", 0},
    {"tie_word_embeddings", "tie_word_embeddings", NULL, "false", 0},
    {"max_position_embeddings", "max_position_embeddings", NULL, NULL, CT_HF_OPTIONAL},
    {"num_experts", "n_experts", "num_local_experts", NULL, CT_HF_OPTIONAL},
    {"num_experts_per_tok", "top_k", NULL, NULL, CT_HF_OPTIONAL},
    {"moe_intermediate_size", "moe_hidden", NULL, NULL, CT_HF_OPTIONAL},
    {"norm_topk_prob", "norm_topk_prob", NULL, "false", 0},
    {"router_aux_loss_coef", "router_aux_loss_coef", NULL, NULL, CT_HF_OPTIONAL},
    {NULL, NULL, NULL, NULL, 0},
};

static const char *const hf_more_types[] = {"qwen3_moe", NULL};
static const ct_hf_import hf_import = {sizeof(ct_hf_import), "qwen3", hf_options, hf_more_types};

/* model.moe_log_load: one line per MoE block and step, "moe load step S NAME: c0 c1 ...", the (token, slot)
 * pairs each expert took, summed over the step and the data-parallel ranks (what the host hands post_step). */
static ct_status qwen3_post_step(ct_model *p, const ct_model_step *step) {
    qwen3 *m = p;
    if (!m->log_load || !step->n_moe) return CT_OK;
    for (int i = 0; i < step->n_moe; i++) {
        const ct_moe_load *l = &step->moe[i];
        float c[256];
        char line[256 * 12 + 160];
        int64_t e = l->n_experts < 256 ? l->n_experts : 256;
        ct_status st = step->api->copy(step->dev, c, l->counts, sizeof(float) * (size_t)e, CT_COPY_D2H);
        if (st != CT_OK) return st;
        int n = snprintf(line, sizeof line, "moe load step %lld %s:", (long long)step->step, l->router);
        for (int64_t j = 0; j < e && n > 0 && n < (int)sizeof line; j++)
            n += snprintf(line + n, sizeof line - (size_t)n, " %.0f", (double)c[j]);
        m->host->log(m->host, CT_LOG_INFO, "%s", line);
    }
    return CT_OK;
}

static const ct_model_api api = {
    .struct_size = sizeof(ct_model_api),
    .flavors = flavor_names,
    .create = qwen3_create,
    .destroy = qwen3_destroy,
    .describe = qwen3_describe,
    .declare_params = qwen3_declare,
    .unit_name = qwen3_unit_name,
    .unit_forward = qwen3_unit_forward,
    .tp_plan = tp_plan,
    .hf_export = qwen3_hf_export,
    .hf_import = &hf_import,
    .post_step = qwen3_post_step,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "qwen3";
    info->description = "Qwen3 dense and MoE (Llama 3 block with per-head QK-norm, head_dim 128, tied small flavors; "
                        "softmax top-8 experts); flavors debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B, debugmodel_moe, "
                        "30B-A3B, 235B-A22B";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
