/* deepseek_v3.c: the DeepSeek-V3 model pack (torchtitan's deepseek_v3: flavors debugmodel, 16B, 236B, 671B).
 * Forward only: the host's tape replays the backward. Built against the SDK headers alone.
 *
 * A block is multi-head latent attention (MLA) then a feed-forward: the first n_dense_layers blocks a dense
 * SwiGLU of inter_dim, the rest a mixture of experts (ct_builder.moe, ABI 2.15) beside n_shared_experts
 * shared experts (one SwiGLU of moe_inter_dim * n_shared_experts added to the routed output).
 *
 * MLA, per token: q = wq(h), or wq_b(rmsnorm(wq_a(h))) when q_lora_rank > 0, viewed as heads of
 * qk_nope_head_dim + qk_rope_head_dim, split into q_nope and q_pe; wkv_a(h) split into the kv latent
 * (kv_lora_rank) and k_pe (qk_rope_head_dim, one head shared by all); wkv_b(rmsnorm(latent)) viewed as heads
 * of qk_nope_head_dim + v_head_dim, split into k_nope and v. q = [q_nope, rope(q_pe)], k = [k_nope,
 * rope(k_pe) repeated over the heads]. The builder's attention takes one head size for q, k and v and scales
 * by 1/sqrt(q's): v is padded with zero columns to q's head size and the output's first v_head_dim columns
 * kept. RoPE rotates interleaved pairs, DeepSeek's own layout, which Hugging Face's checkpoints keep
 * (transformers' rope_interleave): the weights map without any row permutation. Under YaRN (model.rope_scaling
 * auto: when training.seq_len exceeds original_seq_len, torchtitan's rule; yarn: always, as transformers runs a
 * config.json whose rope_scaling is yarn) RoPE's frequencies are YaRN's (torchtitan's precompute_freqs_cis,
 * through the builder's rope_freqs) and the softmax scale is multiplied by mscale^2, mscale = 0.1 * mscale *
 * ln(rope_factor) + 1 (folded into q): transformers' yarn with mscale = mscale_all_dim, which a Hugging Face
 * folder's rope_scaling gives and an export writes.
 *
 * Routing: softmax or sigmoid scores, group-limited (n_expert_groups, n_limited_groups), the top_k weights
 * normalised (route_norm) and scaled (route_scale). Aux-loss-free load balancing: each MoE block keeps an
 * expert bias added to the scores for the choice only; post_step moves it by load_balance_coeff *
 * sign(mean count - count_j), centred to mean 0, from the step's per-expert counts summed over the
 * data-parallel ranks (torchtitan's rule). The bias is the pack's host state, copied to the device at each
 * forward.
 *
 * Tensor parallel (tp_plan below): MLA's per-head projections split over the heads, its low-rank ones whole
 * (CT_TP_REPLICATED_PARTIAL); the forward is the same code, its column ops seeing the local heads.
 *
 * Units: 0 = tok_embeddings, 1..L = layers.0 .. layers.L-1, L+1 = norm + output (+ loss). Parameter names are
 * torchtitan's FQNs; the Hugging Face table maps DeepseekV3ForCausalLM's.
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

#include "mla_ops.h"

typedef struct flavor {
    const char *name;
    int64_t dim, n_layers, n_dense, n_heads, vocab, inter_dim, moe_inter_dim;
    int64_t n_experts, n_shared, top_k;
    int score_func, route_norm;
    double route_scale;
    int64_t n_groups, topk_groups;
    int64_t q_lora, kv_lora, nope, rope, v;
    double mscale;
} flavor;

/* torchtitan's deepseek_v3 flavors (models/deepseek_v3/__init__.py); 671B is DeepSeek-V3's config.json */
static const flavor flavors[] = {
    {"debugmodel", 256, 6, 1, 16, 2048, 1024, 256, 8, 2, 3, CT_MOE_SOFTMAX, 0, 1.0, 0, 0, 0, 512, 128, 64, 128, 0.70},
    {"16B", 2048, 27, 1, 16, 102400, 10944, 1408, 64, 2, 6, CT_MOE_SOFTMAX, 0, 1.0, 0, 0, 0, 512, 128, 64, 128, 0.70},
    {"236B", 5120, 60, 1, 128, 102400, 12288, 1536, 160, 2, 6, CT_MOE_SOFTMAX, 0, 16.0, 8, 3, 1536, 512, 128, 64, 128,
     1.0},
    {"671B", 7168, 61, 3, 128, 129280, 18432, 2048, 256, 1, 8, CT_MOE_SIGMOID, 1, 2.5, 8, 4, 1536, 512, 128, 64, 128,
     1.0},
};
static const char *const flavor_names[] = {"debugmodel", "16B", "236B", "671B", NULL};
#define N_FLAVORS (sizeof flavors / sizeof flavors[0])

#define OPT_INT(k, help, range) {sizeof(ct_option_spec), k, CT_OPT_INT, NULL, help, range, NULL}
static const ct_option_spec options[] = {
    OPT_INT("dim", "override the flavor's model width", "[1, 131072]"),
    OPT_INT("n_layers", "override the number of blocks", "[1, 1024]"),
    OPT_INT("n_dense_layers", "override how many first blocks have a dense feed-forward", "[0, 1024]"),
    OPT_INT("n_heads", "override the number of attention heads", "[1, 4096]"),
    OPT_INT("vocab_size", "override the vocabulary size", "[1, 16777216]"),
    OPT_INT("inter_dim", "override the dense blocks' SwiGLU hidden size", "[1, 4194304]"),
    OPT_INT("moe_inter_dim", "override each expert's SwiGLU hidden size", "[1, 4194304]"),
    OPT_INT("n_experts", "override the routed experts per MoE block", "[1, 65536]"),
    OPT_INT("n_shared_experts", "override the shared experts per MoE block (0: none)", "[0, 1024]"),
    OPT_INT("top_k", "override the experts per token", "[1, 65536]"),
    OPT_INT("n_expert_groups", "override the expert groups of group-limited routing (0 or 1: none)", "[0, 65536]"),
    OPT_INT("n_limited_groups", "override the groups a token may route to", "[0, 65536]"),
    OPT_INT("q_lora_rank", "override q's low rank (0: q projected directly)", "[0, 1048576]"),
    OPT_INT("kv_lora_rank", "override the kv latent's size", "[1, 1048576]"),
    OPT_INT("qk_nope_head_dim", "override q's and k's head columns without RoPE", "[1, 4096]"),
    OPT_INT("qk_rope_head_dim", "override q's and k's rotated head columns (even)", "[2, 4096]"),
    OPT_INT("v_head_dim", "override v's head size (at most qk_nope_head_dim + qk_rope_head_dim)", "[1, 4096]"),
    {sizeof(ct_option_spec), "score_func", CT_OPT_STRING, NULL, "override the router's scores", NULL,
     "softmax|sigmoid"},
    {sizeof(ct_option_spec), "route_norm", CT_OPT_BOOL, NULL,
     "override: divide each token's top-k weights by their sum (Hugging Face's norm_topk_prob)", NULL, NULL},
    {sizeof(ct_option_spec), "route_scale", CT_OPT_FLOAT, NULL, "override the routed weights' multiplier",
     "(0, 1000]", NULL},
    {sizeof(ct_option_spec), "rope_theta", CT_OPT_FLOAT, "10000", "RoPE base", "(0, 1e12]", NULL},
    {sizeof(ct_option_spec), "rope_scaling", CT_OPT_STRING, "auto",
     "RoPE's scaling: auto (YaRN when training.seq_len exceeds original_seq_len, torchtitan's rule), yarn (always, "
     "as transformers runs a config.json whose rope_scaling is yarn) or none (plain RoPE)", NULL, "auto|yarn|none"},
    {sizeof(ct_option_spec), "rope_factor", CT_OPT_FLOAT, "40", "YaRN's factor", "[1, 1e6]", NULL},
    {sizeof(ct_option_spec), "original_seq_len", CT_OPT_INT, "4096",
     "the pretraining context: under rope_scaling auto a longer training.seq_len turns YaRN on",
     "[1, 2147483647]", NULL},
    {sizeof(ct_option_spec), "beta_fast", CT_OPT_FLOAT, "32", "YaRN's fast rotation bound", "(0, 1e6]", NULL},
    {sizeof(ct_option_spec), "beta_slow", CT_OPT_FLOAT, "1", "YaRN's slow rotation bound", "(0, 1e6]", NULL},
    {sizeof(ct_option_spec), "mscale", CT_OPT_FLOAT, NULL, "override YaRN's attention mscale", "[0, 100]", NULL},
    {sizeof(ct_option_spec), "norm_eps", CT_OPT_FLOAT, "1e-5", "RMSNorm epsilon (every norm)", "(0, 1]", NULL},
    {sizeof(ct_option_spec), "load_balance_coeff", CT_OPT_FLOAT, "0.001",
     "aux-loss-free balancing: each step the expert bias moves by this times sign(mean count - count) (0: off)",
     "[0, 1000]", NULL},
    {sizeof(ct_option_spec), "max_position_embeddings", CT_OPT_INT, "163840",
     "the context length written to an exported config.json (DeepSeek-V3's)", "[1, 2147483647]", NULL},
    {sizeof(ct_option_spec), "moe_force_load_balance", CT_OPT_BOOL, "false",
     "tests: route token t's slot s to expert (t*top_k + s) % n_experts (torchtitan's debug.moe_force_load_balance)",
     NULL, NULL},
    {sizeof(ct_option_spec), "expert_bias_skew", CT_OPT_FLOAT, "0",
     "tests: every MoE block's expert bias starts at this on its first top_k experts (0 on the others), which then "
     "take most tokens until balancing moves it",
     "[0, 1000]", NULL},
    {sizeof(ct_option_spec), "moe_log_load", CT_OPT_BOOL, "false",
     "log each MoE block's per-expert token counts and expert bias after every step", NULL, NULL},
    {0},
};

typedef struct layer {
    ct_tensor *attention_norm, *wq, *wq_a, *q_norm, *wq_b, *wkv_a, *kv_norm, *wkv_b, *wo, *ffn_norm;
    ct_tensor *w1, *w2, *w3;    /* dense: the SwiGLU; MoE: the stacked experts (e, h, d) / (e, d, h) */
    ct_tensor *router;          /* MoE: (e, dim) */
    ct_tensor *sw1, *sw2, *sw3; /* MoE with shared experts: one SwiGLU of moe_inter_dim * n_shared */
    float *bias;                /* MoE: the expert bias (e), host memory: a buffer (ABI 2.20) */
    char unit_name[24], bias_name[48];
} layer;

#define N_FIELDS 48

enum { ROPE_AUTO, ROPE_YARN, ROPE_NONE }; /* model.rope_scaling */

typedef struct ct_model {
    const ct_host *host;
    int64_t dim, n_layers, n_dense, n_heads, vocab, inter_dim, moe_inter_dim, n_experts, n_shared, top_k;
    int64_t n_groups, topk_groups, q_lora, kv_lora, nope, rope, v, seq_len, original_seq_len, max_positions;
    int score_func, route_norm, force_balance, log_load, rope_mode;
    double route_scale, rope_theta, rope_factor, beta_fast, beta_slow, mscale, norm_eps, balance_coeff, bias_skew;
    int yarn;          /* rope_scaling yarn, or auto and seq_len > original_seq_len: YaRN frequencies and the
                          softmax scale times attn_scale */
    float attn_scale;  /* mscale^2 (1 without YaRN) */
    float *inv_freq;   /* YaRN: rope / 2 frequencies */
    ct_tensor *tok_embeddings, *norm, *output;
    layer *layers;
    ct_model_buffer *buffers; /* one per MoE block: its expert bias */
    int n_buffers;
    ct_hf_field fields[N_FIELDS];
} dsv3;

static void override_int(const ct_host *h, const char *key, int64_t *v) {
    int64_t x;
    if (h->opt_int(h, key, &x) == CT_OK) *v = x;
}

static int is_moe(const dsv3 *m, int64_t layer) { return layer >= m->n_dense; }

/* torchtitan's precompute_freqs_cis for DeepSeek-V3: YaRN's corrected frequencies over the rope dims */
static double correction_dim(double rotations, double dim, double base, double max_seq) {
    return dim * log(max_seq / (rotations * 2 * 3.14159265358979323846)) / (2 * log(base));
}

static ct_status yarn_setup(dsv3 *m) {
    int64_t half = m->rope / 2;
    if (!(m->inv_freq = malloc(sizeof(float) * (size_t)half))) return CT_ERR_NOMEM;
    double low = floor(correction_dim(m->beta_fast, (double)m->rope, m->rope_theta, (double)m->original_seq_len));
    double high = ceil(correction_dim(m->beta_slow, (double)m->rope, m->rope_theta, (double)m->original_seq_len));
    low = low > 0 ? low : 0;
    high = high < (double)m->rope - 1 ? high : (double)m->rope - 1;
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; i++) {
        /* torchtitan computes the base frequencies in float32 */
        float f = 1.0f / powf((float)m->rope_theta, (float)(2 * i) / (float)m->rope);
        double ramp = ((double)i - low) / (high - low), smooth = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
        m->inv_freq[i] = (float)(f / m->rope_factor * (1 - smooth) + f * smooth);
    }
    double ms = 0.1 * m->mscale * log(m->rope_factor) + 1.0;
    m->attn_scale = (float)(ms * ms);
    return CT_OK;
}

static void read_options(dsv3 *m, const ct_host *h) {
    const char *s;
    override_int(h, "dim", &m->dim);
    override_int(h, "n_layers", &m->n_layers);
    override_int(h, "n_dense_layers", &m->n_dense);
    override_int(h, "n_heads", &m->n_heads);
    override_int(h, "vocab_size", &m->vocab);
    override_int(h, "inter_dim", &m->inter_dim);
    override_int(h, "moe_inter_dim", &m->moe_inter_dim);
    override_int(h, "n_experts", &m->n_experts);
    override_int(h, "n_shared_experts", &m->n_shared);
    override_int(h, "top_k", &m->top_k);
    override_int(h, "n_expert_groups", &m->n_groups);
    override_int(h, "n_limited_groups", &m->topk_groups);
    override_int(h, "q_lora_rank", &m->q_lora);
    override_int(h, "kv_lora_rank", &m->kv_lora);
    override_int(h, "qk_nope_head_dim", &m->nope);
    override_int(h, "qk_rope_head_dim", &m->rope);
    override_int(h, "v_head_dim", &m->v);
    override_int(h, "original_seq_len", &m->original_seq_len);
    override_int(h, "max_position_embeddings", &m->max_positions);
    if (h->opt_string(h, "score_func", &s) == CT_OK && s) m->score_func = strcmp(s, "sigmoid") ? CT_MOE_SOFTMAX : CT_MOE_SIGMOID;
    if (h->opt_string(h, "rope_scaling", &s) == CT_OK && s)
        m->rope_mode = !strcmp(s, "yarn") ? ROPE_YARN : !strcmp(s, "none") ? ROPE_NONE : ROPE_AUTO;
    h->opt_bool(h, "route_norm", &m->route_norm);
    h->opt_float(h, "route_scale", &m->route_scale);
    h->opt_float(h, "rope_theta", &m->rope_theta);
    h->opt_float(h, "rope_factor", &m->rope_factor);
    h->opt_float(h, "beta_fast", &m->beta_fast);
    h->opt_float(h, "beta_slow", &m->beta_slow);
    h->opt_float(h, "mscale", &m->mscale);
    h->opt_float(h, "norm_eps", &m->norm_eps);
    h->opt_float(h, "load_balance_coeff", &m->balance_coeff);
    h->opt_float(h, "expert_bias_skew", &m->bias_skew);
    h->opt_bool(h, "moe_force_load_balance", &m->force_balance);
    h->opt_bool(h, "moe_log_load", &m->log_load);
}

/* The first reason the sizes cannot make a model, or NULL. */
static const char *check_sizes(const dsv3 *m) {
    if (m->rope % 2) return "qk_rope_head_dim: must be even (RoPE rotates pairs)";
    if (m->v > m->nope + m->rope) return "v_head_dim: must be at most qk_nope_head_dim + qk_rope_head_dim";
    if (m->top_k > m->n_experts) return "top_k: must be at most n_experts";
    if (m->n_groups > 1 && m->n_experts % m->n_groups) return "n_expert_groups: must divide n_experts";
    if (m->n_groups > 1 && (m->topk_groups < 1 || m->topk_groups > m->n_groups))
        return "n_limited_groups: must be in [1, n_expert_groups]";
    if (m->n_groups > 1 && m->top_k > m->topk_groups * (m->n_experts / m->n_groups))
        return "top_k: must be at most n_limited_groups * n_experts / n_expert_groups";
    return NULL;
}

static void dsv3_destroy(ct_model *p) {
    if (!p) return;
    for (int64_t l = 0; p->layers && l < p->n_layers; l++) free(p->layers[l].bias);
    free(p->buffers);
    free(p->layers);
    free(p->inv_freq);
    free(p);
}

static ct_status dsv3_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    const flavor *f = NULL;
    for (size_t i = 0; i < N_FLAVORS; i++)
        if (cfg->flavor && !strcmp(cfg->flavor, flavors[i].name)) f = &flavors[i];
    if (!f) {
        h->set_error(h, "unknown flavor '%s' (known: debugmodel, 16B, 236B, 671B)", cfg->flavor ? cfg->flavor : "");
        return CT_ERR_INVALID;
    }
    dsv3 *m = calloc(1, sizeof *m);
    if (!m) return CT_ERR_NOMEM;
    *m = (dsv3){.host = h, .dim = f->dim, .n_layers = f->n_layers, .n_dense = f->n_dense, .n_heads = f->n_heads,
                .vocab = f->vocab, .inter_dim = f->inter_dim, .moe_inter_dim = f->moe_inter_dim,
                .n_experts = f->n_experts, .n_shared = f->n_shared, .top_k = f->top_k, .n_groups = f->n_groups,
                .topk_groups = f->topk_groups, .q_lora = f->q_lora, .kv_lora = f->kv_lora, .nope = f->nope,
                .rope = f->rope, .v = f->v, .seq_len = cfg->seq_len, .original_seq_len = 4096,
                .max_positions = 163840, .score_func = f->score_func, .route_norm = f->route_norm,
                .route_scale = f->route_scale, .rope_theta = 10000, .rope_factor = 40, .beta_fast = 32,
                .beta_slow = 1, .mscale = f->mscale, .norm_eps = 1e-5, .balance_coeff = 1e-3, .attn_scale = 1.0f};
    read_options(m, h);
    const char *bad = check_sizes(m);
    if (bad) {
        h->set_error(h, "%s (n_experts %lld, top_k %lld, n_expert_groups %lld, n_limited_groups %lld, "
                        "qk_nope_head_dim %lld, qk_rope_head_dim %lld, v_head_dim %lld)",
                     bad, (long long)m->n_experts, (long long)m->top_k, (long long)m->n_groups,
                     (long long)m->topk_groups, (long long)m->nope, (long long)m->rope, (long long)m->v);
        free(m);
        return CT_ERR_INVALID;
    }
    m->yarn = m->rope_mode == ROPE_YARN || (m->rope_mode == ROPE_AUTO && m->seq_len > m->original_seq_len && m->rope_factor > 1);
    if (!(m->layers = calloc((size_t)m->n_layers, sizeof(layer))) || (m->yarn && yarn_setup(m) != CT_OK)) {
        free(m->layers);
        free(m);
        return CT_ERR_NOMEM;
    }
    if (!(m->buffers = calloc((size_t)m->n_layers, sizeof(ct_model_buffer)))) {
        dsv3_destroy(m);
        return CT_ERR_NOMEM;
    }
    for (int64_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        snprintf(L->unit_name, sizeof L->unit_name, "layers.%d", (int)l);
        if (!is_moe(m, l)) continue;
        if (!(L->bias = calloc((size_t)m->n_experts, sizeof(float)))) {
            dsv3_destroy(m);
            return CT_ERR_NOMEM;
        }
        for (int64_t j = 0; j < m->top_k; j++) L->bias[j] = (float)m->bias_skew;
        snprintf(L->bias_name, sizeof L->bias_name, "layers.%d.moe.expert_bias", (int)l); /* torchtitan's buffer */
        m->buffers[m->n_buffers++] = (ct_model_buffer){L->bias_name, (int)l + 1, m->n_experts, L->bias};
    }
    *out = m;
    return CT_OK;
}


static int64_t attention_params(const dsv3 *m) {
    int64_t qk = m->nope + m->rope, h = m->n_heads;
    int64_t q = m->q_lora ? m->dim * m->q_lora + m->q_lora + m->q_lora * h * qk : m->dim * h * qk;
    int64_t kv = m->dim * (m->kv_lora + m->rope) + m->kv_lora + m->kv_lora * h * (m->nope + m->v);
    return q + kv + h * m->v * m->dim;
}

/* every parameter, or those one token computes with (its top_k routed experts) */
static int64_t n_params_of(const dsv3 *m, int active) {
    int64_t per = 2 * m->dim + attention_params(m), total = m->vocab * m->dim * 2 + m->dim;
    int64_t moe = m->n_experts * m->dim + (active ? m->top_k : m->n_experts) * 3 * m->dim * m->moe_inter_dim +
                  3 * m->dim * m->moe_inter_dim * m->n_shared;
    for (int64_t l = 0; l < m->n_layers; l++) total += per + (is_moe(m, l) ? moe : 3 * m->dim * m->inter_dim);
    return total;
}

static ct_status dsv3_describe(ct_model *p, ct_model_desc *d) {
    dsv3 *m = p;
    d->n_units = (int)m->n_layers + 2;
    d->vocab_size = m->vocab;
    d->dim = m->dim;
    d->n_layers = (int)m->n_layers;
    d->n_params = n_params_of(m, 0);
    d->n_embedding_params = m->vocab * m->dim;
    /* torchtitan: 6 * (active params - embedding) + the attention's scores (q k^T over qk_nope + qk_rope) and
     * weighted sum (over v_head_dim), forward and backward */
    d->flops_per_token = 6.0 * (double)(n_params_of(m, 1) - d->n_embedding_params) +
                         6.0 * (double)m->n_layers * (double)m->n_heads * (double)(m->nope + m->rope + m->v) *
                             (double)m->seq_len;
    if (CT_HAS_FIELD(d, ct_model_desc, norm_eps)) {
        d->n_heads = m->n_heads;
        d->n_kv_heads = m->n_heads;
        d->head_dim = m->nope + m->rope;
        d->ffn_hidden = m->inter_dim;
        d->rope_theta = m->rope_theta;
        d->norm_eps = m->norm_eps;
    }
    if (CT_HAS_FIELD(d, ct_model_desc, hf_model_type)) {
        d->features = 0;
        d->hf_model_type = "deepseek_v3";
    }
    return CT_OK;
}

static ct_init trunc_init(float std) { return (ct_init){sizeof(ct_init), CT_INIT_TRUNC_NORMAL, std, -2.0f, 2.0f, 0}; }

typedef struct param_row {
    ct_tensor **t;
    const char *suffix;
    int ndim;
    int64_t shape[3];
    ct_init init;
    uint32_t flags;
} param_row;

static ct_status declare_rows(ct_param_registry *r, int64_t i, const param_row *ps, size_t n) {
    for (size_t k = 0; k < n; k++) {
        char name[128];
        if (!ps[k].suffix) continue;
        snprintf(name, sizeof name, "layers.%lld.%s", (long long)i, ps[k].suffix);
        if (!(*ps[k].t = r->add(r, (int)i + 1, name, ps[k].ndim, ps[k].shape, &ps[k].init, ps[k].flags)))
            return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* one block's parameters, torchtitan's names and initialisation (depth-scaled: the output projections, w2 and w3,
 * and the router, as torchtitan's deepseek_v3 inits them) */
static ct_status declare_block(dsv3 *m, ct_param_registry *r, int64_t i) {
    layer *L = &m->layers[i];
    const ct_init ones = {sizeof(ct_init), CT_INIT_CONSTANT, 0, 0, 0, 1.0f};
    float std = 0.02f / sqrtf(2.0f * (float)(i + 1));
    int64_t d = m->dim, h = m->n_heads, qk = m->nope + m->rope, e = m->n_experts, mh = m->moe_inter_dim;
    int64_t sh = m->moe_inter_dim * m->n_shared;
    int moe = is_moe(m, i), lq = m->q_lora > 0;
    const uint32_t LIN = CT_TENSOR_LINEAR, ND = CT_TENSOR_NO_DECAY, EX = CT_TENSOR_EXPERTS;
    const param_row ps[] = {
        {&L->attention_norm, "attention_norm.weight", 1, {d}, ones, ND},
        {&L->wq, lq ? NULL : "attention.wq.weight", 2, {h * qk, d}, trunc_init(0.02f), LIN},
        {&L->wq_a, lq ? "attention.wq_a.weight" : NULL, 2, {m->q_lora, d}, trunc_init(0.02f), LIN},
        {&L->q_norm, lq ? "attention.q_norm.weight" : NULL, 1, {m->q_lora}, ones, ND},
        {&L->wq_b, lq ? "attention.wq_b.weight" : NULL, 2, {h * qk, m->q_lora}, trunc_init(0.02f), LIN},
        {&L->wkv_a, "attention.wkv_a.weight", 2, {m->kv_lora + m->rope, d}, trunc_init(0.02f), LIN},
        {&L->kv_norm, "attention.kv_norm.weight", 1, {m->kv_lora}, ones, ND},
        {&L->wkv_b, "attention.wkv_b.weight", 2, {h * (m->nope + m->v), m->kv_lora}, trunc_init(0.02f), LIN},
        {&L->wo, "attention.wo.weight", 2, {d, h * m->v}, trunc_init(std), LIN},
        {&L->ffn_norm, "ffn_norm.weight", 1, {d}, ones, ND},
        {&L->w1, moe ? NULL : "feed_forward.w1.weight", 2, {m->inter_dim, d}, trunc_init(0.02f), LIN},
        {&L->w2, moe ? NULL : "feed_forward.w2.weight", 2, {d, m->inter_dim}, trunc_init(std), LIN},
        {&L->w3, moe ? NULL : "feed_forward.w3.weight", 2, {m->inter_dim, d}, trunc_init(std), LIN},
        {&L->router, moe ? "moe.router.gate.weight" : NULL, 2, {e, d}, trunc_init(std), 0},
        {&L->w1, moe ? "moe.experts.w1" : NULL, 3, {e, mh, d}, trunc_init(0.02f), EX},
        {&L->w2, moe ? "moe.experts.w2" : NULL, 3, {e, d, mh}, trunc_init(std), EX},
        {&L->w3, moe ? "moe.experts.w3" : NULL, 3, {e, mh, d}, trunc_init(std), EX},
        {&L->sw1, moe && sh ? "moe.shared_experts.w1.weight" : NULL, 2, {sh, d}, trunc_init(0.02f), LIN},
        {&L->sw2, moe && sh ? "moe.shared_experts.w2.weight" : NULL, 2, {d, sh}, trunc_init(std), LIN},
        {&L->sw3, moe && sh ? "moe.shared_experts.w3.weight" : NULL, 2, {sh, d}, trunc_init(std), LIN},
    };
    return declare_rows(r, i, ps, sizeof ps / sizeof ps[0]);
}

static ct_status dsv3_declare(ct_model *p, ct_param_registry *r) {
    dsv3 *m = p;
    const ct_init ones = {sizeof(ct_init), CT_INIT_CONSTANT, 0, 0, 0, 1.0f};
    const ct_init normal1 = {sizeof(ct_init), CT_INIT_NORMAL, 1.0f, 0, 0, 0};
    float out_std = 1.0f / sqrtf((float)m->dim);
    ct_init out_init = {sizeof(ct_init), CT_INIT_TRUNC_NORMAL, out_std, -3 * out_std, 3 * out_std, 0};
    int64_t emb[2] = {m->vocab, m->dim}, dim1[1] = {m->dim};
    int head = (int)m->n_layers + 1;
    if (!(m->tok_embeddings = r->add(r, 0, "tok_embeddings.weight", 2, emb, &normal1, 0))) return CT_ERR_INVALID;
    for (int64_t i = 0; i < m->n_layers; i++)
        if (declare_block(m, r, i) != CT_OK) return CT_ERR_INVALID;
    if (!(m->norm = r->add(r, head, "norm.weight", 1, dim1, &ones, CT_TENSOR_NO_DECAY))) return CT_ERR_INVALID;
    m->output = r->add(r, head, "output.weight", 2, emb, &out_init, CT_TENSOR_LINEAR);
    return m->output ? CT_OK : CT_ERR_INVALID;
}

static const char *dsv3_unit_name(ct_model *p, int unit) {
    dsv3 *m = p;
    if (unit == 0) return "tok_embeddings";
    if (unit == m->n_layers + 1) return "output";
    if (unit < 0 || unit > m->n_layers + 1) return "?";
    return m->layers[unit - 1].unit_name;
}

static ct_tensor *view4(ct_builder *b, ct_tensor *t, int64_t heads, int64_t hd) {
    return b->view(b, t, 4, (int64_t[]){t->shape[0], t->shape[1], heads, hd});
}

static ct_tensor *rotate(dsv3 *m, ct_builder *b, ct_tensor *x) {
    if (!m->yarn) return b->rope(b, x, (float)m->rope_theta);
    if (!CT_HAS_FIELD(b, ct_builder, rope_freqs) || !b->rope_freqs) {
        m->host->set_error(m->host, "deepseek_v3: YaRN (training.seq_len above model.original_seq_len) needs the "
                                    "builder's rope_freqs (ABI 2.4)");
        return NULL;
    }
    return b->rope_freqs(b, x, m->inv_freq);
}

/* h (B, T, D) -> q (B, T, H, qk_nope + qk_rope): [q_nope, rope(q_pe)], times mscale^2 under YaRN */
static ct_tensor *mla_query(dsv3 *m, const layer *L, ct_builder *b, ct_tensor *h) {
    ct_tensor *q, *q_nope, *q_pe;
    int64_t qk = m->nope + m->rope;
    if (m->q_lora) {
        if (!(q = b->linear(b, h, L->wq_a)) || !(q = b->rmsnorm(b, q, L->q_norm, (float)m->norm_eps)) ||
            !(q = b->linear(b, q, L->wq_b)))
            return NULL;
    } else if (!(q = b->linear(b, h, L->wq))) {
        return NULL;
    }
    if (!(q = view4(b, q, q->shape[2] / qk, qk)) || mla_split(b, q, m->nope, &q_nope, &q_pe) != CT_OK ||
        !(q_pe = rotate(m, b, q_pe)) || !(q = mla_join(b, q_nope, q_pe, 0)))
        return NULL;
    return m->attn_scale != 1.0f ? mla_scale(b, q, m->attn_scale) : q;
}

/* h (B, T, D) -> k (B, T, H, qk_nope + qk_rope) and v (B, T, H, qk_nope + qk_rope), v's last columns zero */
static ct_status mla_key_value(dsv3 *m, const layer *L, ct_builder *b, ct_tensor *h, ct_tensor **k, ct_tensor **v) {
    ct_tensor *kv, *latent, *k_pe, *k_nope;
    int64_t qk = m->nope + m->rope;
    if (!(kv = b->linear(b, h, L->wkv_a)) || mla_split(b, kv, m->kv_lora, &latent, &k_pe) != CT_OK)
        return CT_ERR_INVALID;
    if (!(k_pe = view4(b, k_pe, 1, m->rope)) || !(k_pe = rotate(m, b, k_pe))) return CT_ERR_INVALID;
    if (!(latent = b->rmsnorm(b, latent, L->kv_norm, (float)m->norm_eps)) || !(kv = b->linear(b, latent, L->wkv_b)))
        return CT_ERR_INVALID;
    if (!(kv = view4(b, kv, kv->shape[2] / (m->nope + m->v), m->nope + m->v)) ||
        mla_split(b, kv, m->nope, &k_nope, v) != CT_OK || !(*k = mla_join(b, k_nope, k_pe, 0)))
        return CT_ERR_INVALID;
    if (m->v < qk && !(*v = mla_join(b, *v, NULL, qk - m->v))) return CT_ERR_INVALID;
    return CT_OK;
}

/* h (B, T, D) -> the attention's output projected back (B, T, D) */
static ct_tensor *mla_forward(dsv3 *m, const layer *L, ct_builder *b, ct_tensor *h) {
    ct_tensor *q, *k, *v, *o;
    if (!CT_HAS_FIELD(b, ct_builder, device) || !b->device) {
        m->host->set_error(m->host, "deepseek_v3: multi-head latent attention needs the builder's device (ABI 2.12)");
        return NULL;
    }
    if (!(q = mla_query(m, L, b, h)) || mla_key_value(m, L, b, h, &k, &v) != CT_OK) return NULL;
    if (!(o = b->attention(b, q, k, v))) return NULL;
    if (m->v < m->nope + m->rope && mla_split(b, o, m->v, &o, NULL) != CT_OK) return NULL;
    if (!(o = b->view(b, o, 3, (int64_t[]){o->shape[0], o->shape[1], o->shape[2] * m->v}))) return NULL;
    return b->linear(b, o, L->wo);
}

static ct_tensor *swiglu_ffn(ct_builder *b, ct_tensor *h, ct_tensor *w1, ct_tensor *w2, ct_tensor *w3) {
    ct_tensor *a, *g;
    if (!(a = b->linear(b, h, w1)) || !(g = b->linear(b, h, w3)) || !(a = b->swiglu(b, a, g))) return NULL;
    return b->linear(b, a, w2);
}

/* The expert bias on the device for this forward: a copy of the pack's, in the builder's arena (applied
 * whether or not balancing moves it: a loaded DeepSeek-V3 routes with its e_score_correction_bias). NULL
 * (not an error) when the builder only plans. */
static const float *bias_on_device(dsv3 *m, const layer *L, ct_builder *b, int *failed) {
    const ct_device_api *d;
    ct_device *dev;
    *failed = 0;
    if (b->planning) return NULL;
    ct_tensor *t = b->new_tensor(b, CT_F32, 1, (int64_t[]){m->n_experts});
    if (!t || b->device(b, &d, &dev) != CT_OK ||
        d->copy(dev, t->data, L->bias, sizeof(float) * (size_t)m->n_experts, CT_COPY_H2D) != CT_OK) {
        *failed = 1;
        return NULL;
    }
    return t->data;
}

/* h (B, T, D) -> the routed experts' weighted sum plus the shared experts' output */
static ct_tensor *moe_forward(dsv3 *m, const layer *L, ct_builder *b, ct_tensor *h) {
    int failed;
    if (!CT_HAS_FIELD(b, ct_builder, moe) || !b->moe) {
        m->host->set_error(m->host, "deepseek_v3: the MoE blocks need a host with ct_builder.moe (ABI 2.15)");
        return NULL;
    }
    const float *bias = bias_on_device(m, L, b, &failed);
    if (failed) return NULL;
    ct_moe_layer ml = {.struct_size = sizeof ml, .router = L->router, .w1 = L->w1, .w3 = L->w3, .w2 = L->w2,
                       .top_k = m->top_k, .score_func = m->score_func, .normalize = m->route_norm,
                       .route_scale = (float)m->route_scale, .n_groups = m->n_groups, .topk_groups = m->topk_groups,
                       .expert_bias = bias, .force_load_balance = m->force_balance};
    ct_tensor *r = b->moe(b, h, &ml), *s;
    if (!r || !L->sw1) return r;
    if (!(s = swiglu_ffn(b, h, L->sw1, L->sw2, L->sw3))) return NULL;
    return b->add(b, r, s);
}

/* x (B, T, D) -> x + attention(norm(x)) -> x + feed_forward(norm(x)) */
static ct_status block_forward(dsv3 *m, int64_t i, ct_builder *b, ct_tensor *x, ct_tensor **out) {
    const layer *L = &m->layers[i];
    float eps = (float)m->norm_eps;
    ct_tensor *h, *o;
    if (!(h = b->rmsnorm(b, x, L->attention_norm, eps)) || !(o = mla_forward(m, L, b, h)) || !(x = b->add(b, x, o)))
        return CT_ERR_INVALID;
    if (!(h = b->rmsnorm(b, x, L->ffn_norm, eps))) return CT_ERR_INVALID;
    o = is_moe(m, i) ? moe_forward(m, L, b, h) : swiglu_ffn(b, h, L->w1, L->w2, L->w3);
    return o && (*out = b->add(b, x, o)) ? CT_OK : CT_ERR_INVALID;
}

static ct_status dsv3_unit_forward(ct_model *p, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                                   const ct_tensor *targets, ct_tensor **out) {
    dsv3 *m = p;
    if (unit == 0) return (*out = b->embedding(b, tokens, m->tok_embeddings)) ? CT_OK : CT_ERR_INVALID;
    if (unit <= m->n_layers) return block_forward(m, unit - 1, b, x, out);
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

/* Tensor parallel, torchtitan's plan for MLA: the per-head projections (wq or wq_b, wkv_b) column-wise over
 * the heads, wo row-wise; the low-rank projections and their norms whole on every rank, over every token row
 * (plugins/tp gathers the rows for wq_a and wkv_a as for a column-wise linear), the head-split weights after
 * them making their gradients partial: CT_TP_REPLICATED_PARTIAL sums them over tp. The column ops then see
 * the local heads (k_pe, one head, joins each). The dense blocks as Llama's; the MoE blocks as Qwen3's (the
 * router and the routed experts whole, on the stream's rows); the shared experts a SwiGLU split like the
 * dense one. */
static const ct_tp_rule tp_plan[] = {
    {"tok_embeddings.weight", CT_TP_EMBED_ROWWISE},
    {"layers.*.attention_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.attention.wq.weight", CT_TP_COLWISE},
    {"layers.*.attention.wq_a.weight", CT_TP_REPLICATED_PARTIAL},
    {"layers.*.attention.q_norm.weight", CT_TP_REPLICATED_PARTIAL},
    {"layers.*.attention.wq_b.weight", CT_TP_COLWISE},
    {"layers.*.attention.wkv_a.weight", CT_TP_REPLICATED_PARTIAL},
    {"layers.*.attention.kv_norm.weight", CT_TP_REPLICATED_PARTIAL},
    {"layers.*.attention.wkv_b.weight", CT_TP_COLWISE},
    {"layers.*.attention.wo.weight", CT_TP_ROWWISE},
    {"layers.*.ffn_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.feed_forward.w1.weight", CT_TP_COLWISE},
    {"layers.*.feed_forward.w2.weight", CT_TP_ROWWISE},
    {"layers.*.feed_forward.w3.weight", CT_TP_COLWISE},
    {"layers.*.moe.router.gate.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.moe.experts.w1", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.moe.experts.w2", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.moe.experts.w3", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.moe.shared_experts.w1.weight", CT_TP_COLWISE},
    {"layers.*.moe.shared_experts.w2.weight", CT_TP_ROWWISE},
    {"layers.*.moe.shared_experts.w3.weight", CT_TP_COLWISE},
    {"norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"output.weight", CT_TP_OUTPUT_COLWISE},
    {NULL, CT_TP_NONE},
};

/* DeepseekV3ForCausalLM's names. DeepSeek's checkpoints keep the RoPE columns in interleaved pairs, as
 * ctitan's RoPE takes them (transformers' rope_interleave): no row is permuted. */
static const ct_hf_name hf_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", 0},
    {"norm.weight", "model.norm.weight", 0},
    {"output.weight", "lm_head.weight", 0},
    {"layers.*.attention_norm.weight", "model.layers.*.input_layernorm.weight", 0},
    {"layers.*.attention.wq.weight", "model.layers.*.self_attn.q_proj.weight", 0},
    {"layers.*.attention.wq_a.weight", "model.layers.*.self_attn.q_a_proj.weight", 0},
    {"layers.*.attention.q_norm.weight", "model.layers.*.self_attn.q_a_layernorm.weight", 0},
    {"layers.*.attention.wq_b.weight", "model.layers.*.self_attn.q_b_proj.weight", 0},
    {"layers.*.attention.wkv_a.weight", "model.layers.*.self_attn.kv_a_proj_with_mqa.weight", 0},
    {"layers.*.attention.kv_norm.weight", "model.layers.*.self_attn.kv_a_layernorm.weight", 0},
    {"layers.*.attention.wkv_b.weight", "model.layers.*.self_attn.kv_b_proj.weight", 0},
    {"layers.*.attention.wo.weight", "model.layers.*.self_attn.o_proj.weight", 0},
    {"layers.*.ffn_norm.weight", "model.layers.*.post_attention_layernorm.weight", 0},
    {"layers.*.feed_forward.w1.weight", "model.layers.*.mlp.gate_proj.weight", 0},
    {"layers.*.feed_forward.w2.weight", "model.layers.*.mlp.down_proj.weight", 0},
    {"layers.*.feed_forward.w3.weight", "model.layers.*.mlp.up_proj.weight", 0},
    {"layers.*.moe.router.gate.weight", "model.layers.*.mlp.gate.weight", 0},
    {"layers.*.moe.experts.w1", "model.layers.*.mlp.experts.*.gate_proj.weight", CT_HF_EXPERTS},
    {"layers.*.moe.experts.w2", "model.layers.*.mlp.experts.*.down_proj.weight", CT_HF_EXPERTS},
    {"layers.*.moe.experts.w3", "model.layers.*.mlp.experts.*.up_proj.weight", CT_HF_EXPERTS},
    {"layers.*.moe.shared_experts.w1.weight", "model.layers.*.mlp.shared_experts.gate_proj.weight", 0},
    {"layers.*.moe.shared_experts.w2.weight", "model.layers.*.mlp.shared_experts.down_proj.weight", 0},
    {"layers.*.moe.shared_experts.w3.weight", "model.layers.*.mlp.shared_experts.up_proj.weight", 0},
    {"layers.*.moe.expert_bias", "model.layers.*.mlp.gate.e_score_correction_bias", 0}, /* a buffer */
    {NULL, NULL, 0},
};

/* DeepseekV3Config's keys as transformers writes them; CT_HF_CHECKED: what a loaded folder must match beyond
 * the tensors' shapes. scoring_func is DeepSeek's own key (transformers always routes by sigmoid). */
static ct_status dsv3_hf_export(ct_model *p, ct_hf_export *out) {
    dsv3 *m = p;
    ct_hf_field *f = m->fields;
    int n = 0, sig = m->score_func == CT_MOE_SIGMOID;
    const uint32_t C = CT_HF_CHECKED;
#define FIELD(k, t, iv, fv, sv, fl) f[n++] = (ct_hf_field){k, t, iv, fv, sv, fl}
    FIELD("attention_bias", CT_HF_BOOL, 0, 0, NULL, C | CT_HF_OR_ABSENT);
    FIELD("attention_dropout", CT_HF_FLOAT, 0, 0.0, NULL, 0);
    FIELD("first_k_dense_replace", CT_HF_INT, m->n_dense, 0, NULL, C);
    FIELD("hidden_act", CT_HF_STRING, 0, 0, "silu", C);
    FIELD("hidden_size", CT_HF_INT, m->dim, 0, NULL, C);
    FIELD("initializer_range", CT_HF_FLOAT, 0, 0.02, NULL, 0);
    FIELD("intermediate_size", CT_HF_INT, m->inter_dim, 0, NULL, C);
    FIELD("kv_lora_rank", CT_HF_INT, m->kv_lora, 0, NULL, C);
    FIELD("max_position_embeddings", CT_HF_INT, m->max_positions, 0, NULL, 0);
    FIELD("moe_intermediate_size", CT_HF_INT, m->moe_inter_dim, 0, NULL, C);
    FIELD("n_group", CT_HF_INT, m->n_groups > 1 ? m->n_groups : 1, 0, NULL, C);
    FIELD("n_routed_experts", CT_HF_INT, m->n_experts, 0, NULL, C);
    FIELD("n_shared_experts", CT_HF_INT, m->n_shared, 0, NULL, C);
    FIELD("norm_topk_prob", CT_HF_BOOL, m->route_norm, 0, NULL, C);
    FIELD("num_attention_heads", CT_HF_INT, m->n_heads, 0, NULL, C);
    FIELD("num_experts_per_tok", CT_HF_INT, m->top_k, 0, NULL, C);
    FIELD("num_hidden_layers", CT_HF_INT, m->n_layers, 0, NULL, C);
    FIELD("num_key_value_heads", CT_HF_INT, m->n_heads, 0, NULL, 0);
    if (m->q_lora) FIELD("q_lora_rank", CT_HF_INT, m->q_lora, 0, NULL, C);
    else FIELD("q_lora_rank", CT_HF_NULL, 0, 0, NULL, C);
    FIELD("qk_nope_head_dim", CT_HF_INT, m->nope, 0, NULL, C);
    FIELD("qk_rope_head_dim", CT_HF_INT, m->rope, 0, NULL, C);
    FIELD("rms_norm_eps", CT_HF_FLOAT, 0, m->norm_eps, NULL, C);
    FIELD("rope_interleave", CT_HF_BOOL, 1, 0, NULL, C | CT_HF_OR_ABSENT);
    if (m->yarn) { /* what transformers runs as this pack's YaRN: cos and sin unscaled (hf_config_view's form) */
        if (m->mscale == 0) FIELD("rope_scaling.attention_factor", CT_HF_FLOAT, 0, 1.0, NULL, C);
        FIELD("rope_scaling.beta_fast", CT_HF_FLOAT, 0, m->beta_fast, NULL, C);
        FIELD("rope_scaling.beta_slow", CT_HF_FLOAT, 0, m->beta_slow, NULL, C);
        FIELD("rope_scaling.factor", CT_HF_FLOAT, 0, m->rope_factor, NULL, C);
        if (m->mscale != 0) FIELD("rope_scaling.mscale", CT_HF_FLOAT, 0, m->mscale, NULL, C);
        FIELD("rope_scaling.mscale_all_dim", CT_HF_FLOAT, 0, m->mscale, NULL, C);
        FIELD("rope_scaling.original_max_position_embeddings", CT_HF_INT, m->original_seq_len, 0, NULL, C);
        FIELD("rope_scaling.rope_type", CT_HF_STRING, 0, 0, "yarn", C);
    } else {
        FIELD("rope_scaling", CT_HF_NULL, 0, 0, NULL, C);
    }
    FIELD("rope_theta", CT_HF_FLOAT, 0, m->rope_theta, NULL, C);
    FIELD("routed_scaling_factor", CT_HF_FLOAT, 0, m->route_scale, NULL, C);
    FIELD("scoring_func", CT_HF_STRING, 0, 0, sig ? "sigmoid" : "softmax", sig ? C | CT_HF_OR_ABSENT : C);
    FIELD("tie_word_embeddings", CT_HF_BOOL, 0, 0, NULL, C | CT_HF_OR_ABSENT);
    FIELD("topk_group", CT_HF_INT, m->n_groups > 1 ? m->topk_groups : 1, 0, NULL, C);
    FIELD("use_cache", CT_HF_BOOL, 1, 0, NULL, 0);
    FIELD("v_head_dim", CT_HF_INT, m->v, 0, NULL, C);
    FIELD("vocab_size", CT_HF_INT, m->vocab, 0, NULL, C);
    f[n] = (ct_hf_field){0};
#undef FIELD
    out->architecture = "DeepseekV3ForCausalLM";
    out->model_type = "deepseek_v3";
    out->names = hf_names;
    out->fields = f;
    return CT_OK;
}

/* How a DeepseekV3Config's keys set this pack's options (ABI 2.16), with its defaults where a key may be absent. */
static const ct_hf_option hf_options[] = {
    {"hidden_size", "dim", NULL, NULL, 0},
    {"num_hidden_layers", "n_layers", NULL, NULL, 0},
    {"first_k_dense_replace", "n_dense_layers", NULL, "3", 0},
    {"num_attention_heads", "n_heads", NULL, NULL, 0},
    {"vocab_size", "vocab_size", NULL, NULL, 0},
    {"intermediate_size", "inter_dim", NULL, NULL, 0},
    {"moe_intermediate_size", "moe_inter_dim", NULL, NULL, 0},
    {"n_routed_experts", "n_experts", NULL, NULL, 0},
    {"n_shared_experts", "n_shared_experts", NULL, "1", 0},
    {"num_experts_per_tok", "top_k", NULL, NULL, 0},
    {"n_group", "n_expert_groups", NULL, "8", 0},
    {"topk_group", "n_limited_groups", NULL, "4", 0},
    {"routed_scaling_factor", "route_scale", NULL, "2.5", 0},
    {"norm_topk_prob", "route_norm", NULL, "true", 0},
    {"scoring_func", "score_func", NULL, "sigmoid", 0},
    {"q_lora_rank", "q_lora_rank", NULL, "0", 0},
    {"kv_lora_rank", "kv_lora_rank", NULL, NULL, 0},
    {"qk_nope_head_dim", "qk_nope_head_dim", NULL, NULL, 0},
    {"qk_rope_head_dim", "qk_rope_head_dim", NULL, NULL, 0},
    {"v_head_dim", "v_head_dim", NULL, NULL, 0},
    {"rope_theta", "rope_theta", NULL, "10000", 0},
    {"rms_norm_eps", "norm_eps", NULL, "1e-6", 0},
    {"max_position_embeddings", "max_position_embeddings", NULL, NULL, CT_HF_OPTIONAL},
    /* RoPE: a folder says plain (null) or YaRN, which transformers runs whatever the length (hf_config_view
     * turns rope_parameters into this rope_scaling, its defaults filled in, and refuses what the pack cannot run:
     * cos and sin scaled) */
    {"rope_scaling.rope_type", "rope_scaling", NULL, "none", 0}, /* absent: plain, whatever training.seq_len */
    /* YaRN's settings: present whenever rope_type is yarn (the view fills transformers' defaults in) */
    {"rope_scaling.factor", "rope_factor", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.original_max_position_embeddings", "original_seq_len", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.beta_fast", "beta_fast", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.beta_slow", "beta_slow", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.mscale_all_dim", "mscale", NULL, NULL, CT_HF_OPTIONAL},
    {NULL, NULL, NULL, NULL, 0},
};

static const ct_hf_import hf_import = {
    .struct_size = sizeof(ct_hf_import), .model_type = "deepseek_v3", .options = hf_options, .more_model_types = NULL};

/* The MoE block a load belongs to, from its router's name ("layers.N.moe.router.gate.weight"), or NULL. */
static layer *layer_of(dsv3 *m, const ct_moe_load *l) {
    int i;
    if (!l->router || sscanf(l->router, "layers.%d.", &i) != 1 || i < 0 || i >= m->n_layers) return NULL;
    return m->layers[i].bias && l->n_experts == m->n_experts ? &m->layers[i] : NULL;
}

/* torchtitan's aux-loss-free update: delta_j = coeff * sign(mean(c) - c_j), centred to mean 0, added to
 * the bias; c the step's counts summed over the data-parallel ranks (the same on every rank). */
static void update_bias(dsv3 *m, float *bias, const float *c) {
    int64_t e = m->n_experts;
    double mean = 0, dmean = 0;
    for (int64_t j = 0; j < e; j++) mean += c[j];
    mean /= (double)e;
    for (int64_t j = 0; j < e; j++) dmean += (float)(m->balance_coeff * (mean > c[j] ? 1 : mean < c[j] ? -1 : 0));
    dmean /= (double)e;
    for (int64_t j = 0; j < e; j++)
        bias[j] += (float)((float)(m->balance_coeff * (mean > c[j] ? 1 : mean < c[j] ? -1 : 0)) - dmean);
}

static void log_load(dsv3 *m, const ct_model_step *step, const ct_moe_load *l, const float *c, const float *bias) {
    char line[256 * 24 + 160];
    int64_t e = l->n_experts < 256 ? l->n_experts : 256;
    int n = snprintf(line, sizeof line, "moe load step %lld %s:", (long long)step->step, l->router);
    for (int64_t j = 0; j < e && n > 0 && n < (int)sizeof line; j++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %.0f", (double)c[j]);
    m->host->log(m->host, CT_LOG_INFO, "%s", line);
    if (!bias) return;
    n = snprintf(line, sizeof line, "moe bias step %lld %s:", (long long)step->step, l->router);
    for (int64_t j = 0; j < e && n > 0 && n < (int)sizeof line; j++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %.6g", (double)bias[j]);
    m->host->log(m->host, CT_LOG_INFO, "%s", line);
}

static ct_status dsv3_post_step(ct_model *p, const ct_model_step *step) {
    dsv3 *m = p;
    int update = m->balance_coeff > 0 && !m->force_balance;
    if ((!update && !m->log_load) || !step->n_moe) return CT_OK;
    float *c = malloc(sizeof(float) * (size_t)m->n_experts);
    if (!c) return CT_ERR_NOMEM;
    ct_status st = CT_OK;
    for (int i = 0; i < step->n_moe && st == CT_OK; i++) {
        const ct_moe_load *l = &step->moe[i];
        layer *L = layer_of(m, l);
        if (!L) continue;
        if ((st = step->api->copy(step->dev, c, l->counts, sizeof(float) * (size_t)m->n_experts, CT_COPY_D2H)) != CT_OK)
            break;
        if (update) update_bias(m, L->bias, c);
        if (m->log_load) log_load(m, step, l, c, update ? L->bias : NULL);
    }
    free(c);
    return st;
}

/* ABI 2.20: the expert biases, which checkpoints save and Hugging Face folders carry */
static int dsv3_buffers(ct_model *p, const ct_model_buffer **out) {
    *out = p->buffers;
    return p->n_buffers;
}

static const ct_model_api api = {
    .struct_size = sizeof(ct_model_api),
    .flavors = flavor_names,
    .create = dsv3_create,
    .destroy = dsv3_destroy,
    .describe = dsv3_describe,
    .declare_params = dsv3_declare,
    .unit_name = dsv3_unit_name,
    .unit_forward = dsv3_unit_forward,
    .tp_plan = tp_plan,
    .hf_export = dsv3_hf_export,
    .hf_import = &hf_import,
    .post_step = dsv3_post_step,
    .buffers = dsv3_buffers,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "deepseek_v3";
    info->description = "DeepSeek-V3 (multi-head latent attention, dense first blocks, then routed plus shared "
                        "experts with aux-loss-free balancing); flavors debugmodel, 16B, 236B, 671B";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
