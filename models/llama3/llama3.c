/* llama3.c: the Llama 3 model pack (torchtitan's llama3: RMSNorm, RoPE, grouped-query attention,
 * SwiGLU, untied output). Forward only: the host's tape replays the backward.
 *
 * Units: 0 = tok_embeddings, 1..L = layers.0 .. layers.L-1, L+1 = norm + output (+ loss).
 * Parameter names are torchtitan's FQNs, so checkpoints and Hugging Face mappings line up; hf_export
 * (ABI 2.12) gives the pack's Hugging Face table (LlamaForCausalLM, Llama 3.1's rope_scaling).
 */
#include "ctitan/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct flavor {
    const char *name;
    int64_t dim, n_layers, n_heads, n_kv_heads, vocab;
    double ffn_dim_multiplier; /* 0: none */
    int64_t multiple_of;
    double rope_theta;
    int rope_llama3; /* Llama 3.1's RoPE scaling by default (model.rope_scaling: llama3) */
} flavor;

/* torchtitan's flavors (models/llama3/__init__.py). 8B, 70B and 405B are Llama 3.1's sizes and scale
 * RoPE as torchtitan's RoPEScalingArgs does by default; debugmodel (the tests' model), 1B and 3B keep
 * plain RoPE (Llama 3.2's 1B and 3B on the Hub use factor 32: set the options). */
static const flavor flavors[] = {
    {"debugmodel", 256, 6, 16, 16, 2048, 0.0, 256, 500000.0, 0},
    {"1B", 2048, 16, 32, 8, 128256, 1.5, 1024, 500000.0, 0},
    {"3B", 3072, 28, 24, 8, 128256, 1.0, 1024, 500000.0, 0},
    {"8B", 4096, 32, 32, 8, 128256, 1.3, 1024, 500000.0, 1},
    {"70B", 8192, 80, 64, 8, 128256, 1.3, 4096, 500000.0, 1},
    {"405B", 16384, 126, 128, 8, 128256, 1.2, 4096, 500000.0, 1},
};

/* torchtitan's RoPEScalingArgs (and Meta's Llama 3.1 config.json) */
#define ROPE_SCALING_FACTOR 8.0
#define ROPE_LOW_FREQ_FACTOR 1.0
#define ROPE_HIGH_FREQ_FACTOR 4.0
#define ROPE_ORIGINAL_MAX_POSITION 8192
#define ROPE_TWO_PI 6.283185307179586 /* Python's 2 * math.pi */
static const char *const flavor_names[] = {"debugmodel", "1B", "3B", "8B", "70B", "405B", NULL};

typedef struct layer {
    ct_tensor *attention_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w2, *w3;
    char unit_name[24]; /* "layers.3": unit_name's answer, kept until destroy as model.h promises */
} layer;

typedef struct ct_model { /* the ABI's opaque ct_model */
    const ct_host *host;
    int64_t dim, n_layers, n_heads, n_kv_heads, vocab, ffn_hidden, head_dim, seq_len;
    double rope_theta, norm_eps;
    /* RoPE scaling ("llama3"): factor 0 means plain RoPE; else inv_freq holds head_dim/2 frequencies */
    double rope_factor, rope_low, rope_high;
    int64_t rope_orig;
    float *inv_freq;
    int depth_init, tied;
    ct_hf_field fields[25]; /* hf_export's answer, kept until destroy */
    ct_tensor *tok_embeddings, *norm, *output; /* tied: output is the head's use of tok_embeddings */
    layer *layers;
} llama;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "dim", CT_OPT_INT, NULL, "override the flavor's model width", NULL, NULL},
    {sizeof(ct_option_spec), "n_layers", CT_OPT_INT, NULL, "override the number of blocks", NULL, NULL},
    {sizeof(ct_option_spec), "n_heads", CT_OPT_INT, NULL, "override the number of query heads", NULL, NULL},
    {sizeof(ct_option_spec), "n_kv_heads", CT_OPT_INT, NULL, "override the number of key/value heads", NULL, NULL},
    {sizeof(ct_option_spec), "vocab_size", CT_OPT_INT, NULL, "override the vocabulary size", NULL, NULL},
    {sizeof(ct_option_spec), "ffn_hidden", CT_OPT_INT, NULL, "set the SwiGLU hidden size directly", NULL, NULL},
    {sizeof(ct_option_spec), "multiple_of", CT_OPT_INT, NULL, "round the SwiGLU hidden size up to this", NULL, NULL},
    {sizeof(ct_option_spec), "ffn_dim_multiplier", CT_OPT_FLOAT, NULL, "scale of the SwiGLU hidden size", NULL, NULL},
    {sizeof(ct_option_spec), "rope_theta", CT_OPT_FLOAT, NULL, "RoPE base", NULL, NULL},
    {sizeof(ct_option_spec), "rope_scaling", CT_OPT_STRING, NULL,
     "RoPE frequency scaling: llama3 (Llama 3.1, 3.2, 3.3; the default of flavors 8B, 70B and 405B) or none",
     NULL, "none|llama3"},
    {sizeof(ct_option_spec), "rope_scaling_factor", CT_OPT_FLOAT, NULL,
     "llama3 scaling: low frequencies are divided by this (default 8)", "[1, 1e6]", NULL},
    {sizeof(ct_option_spec), "rope_low_freq_factor", CT_OPT_FLOAT, NULL,
     "llama3 scaling: wavelengths above original_max_position / this are scaled (default 1)", "(0, 1e6]", NULL},
    {sizeof(ct_option_spec), "rope_high_freq_factor", CT_OPT_FLOAT, NULL,
     "llama3 scaling: wavelengths below original_max_position / this are kept (default 4)", "(0, 1e6]", NULL},
    {sizeof(ct_option_spec), "rope_original_max_position", CT_OPT_INT, NULL,
     "llama3 scaling: the context length the model was pretrained on (default 8192)", "[1, 2147483647]", NULL},
    {sizeof(ct_option_spec), "norm_eps", CT_OPT_FLOAT, "1e-5", "RMSNorm epsilon", NULL, NULL},
    {sizeof(ct_option_spec), "tie_word_embeddings", CT_OPT_BOOL, "false",
     "the output head reuses tok_embeddings.weight (as Llama 3.2 1B and 3B on the Hub); the table then starts "
     "with the output's init, std 1/sqrt(dim)", NULL, NULL},
    {sizeof(ct_option_spec), "depth_init", CT_OPT_BOOL, "true",
     "output projections' std 0.02/sqrt(2(layer+1)) (else 0.02/sqrt(2 n_layers))", NULL, NULL},
    {0},
};

/* Bounds on the options, checked at create (the option list has no room for them). The caps keep
 * the parameter count far from overflow and a typo such as n_layers: 100000 from spinning through
 * start-up; torchtitan's largest flavor (405B) is well inside them. */
static const struct {
    const char *key;
    double lo, hi;
    int lo_open; /* lo itself is refused */
} bounds[] = {
    {"dim", 1, 131072, 0},        {"n_layers", 1, 1024, 0},       {"n_heads", 1, 4096, 0},
    {"n_kv_heads", 1, 4096, 0},   {"vocab_size", 1, 16777216, 0}, {"ffn_hidden", 1, 4194304, 0},
    {"multiple_of", 1, 1048576, 0}, {"ffn_dim_multiplier", 0, 100, 1}, {"rope_theta", 0, 1e12, 1},
    {"norm_eps", 0, 1, 1},
};

/* Refuses a value out of its bounds with an error that starts with the key, so the host reports it
 * where the key was set. 0 when in bounds. */
static int out_of_bounds(const ct_host *h, const char *key, double x) {
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        if (strcmp(bounds[i].key, key)) continue;
        if ((bounds[i].lo_open ? x > bounds[i].lo : x >= bounds[i].lo) && x <= bounds[i].hi) return 0;
        h->set_error(h, "%s: expected a value in %c%.10g, %.10g], got %.10g", key, bounds[i].lo_open ? '(' : '[', bounds[i].lo,
                     bounds[i].hi, x);
        return 1;
    }
    return 0;
}

/* An option that overrides the flavor's value: 1 when given, 0 when not, -1 when out of bounds. */
static int opt_override_int(const ct_host *h, const char *key, int64_t *v) {
    int64_t x;
    if (h->opt_int(h, key, &x) != CT_OK) return 0;
    if (out_of_bounds(h, key, (double)x)) return -1;
    *v = x;
    return 1;
}

static int opt_override_float(const ct_host *h, const char *key, double *v) {
    double x;
    if (h->opt_float(h, key, &x) != CT_OK) return 0;
    if (out_of_bounds(h, key, x)) return -1;
    *v = x;
    return 1;
}

/* The option values and their consistency; `given` is which of them the manifest set. 0, or -1
 * with the error set (naming the key the manifest set, when one did). */
static int read_options(const ct_host *h, llama *m, int64_t *multiple_of, double *mult, int64_t *hidden) {
    int dim = opt_override_int(h, "dim", &m->dim), heads = opt_override_int(h, "n_heads", &m->n_heads);
    int kv = opt_override_int(h, "n_kv_heads", &m->n_kv_heads), mo = opt_override_int(h, "multiple_of", multiple_of);
    int mu = opt_override_float(h, "ffn_dim_multiplier", mult);
    if (dim < 0 || heads < 0 || kv < 0 || mo < 0 || mu < 0 || opt_override_int(h, "n_layers", &m->n_layers) < 0 ||
        opt_override_int(h, "vocab_size", &m->vocab) < 0 || opt_override_float(h, "rope_theta", &m->rope_theta) < 0 ||
        opt_override_float(h, "norm_eps", &m->norm_eps) < 0)
        return -1;
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
    /* torchtitan: h = 4 dim; h = int(2h/3); h = int(mult h); round up to multiple_of */
    *hidden = 2 * (4 * m->dim) / 3;
    if (*mult > 0) *hidden = (int64_t)(*mult * (double)*hidden);
    *hidden = *multiple_of * ((*hidden + *multiple_of - 1) / *multiple_of);
    int fh = opt_override_int(h, "ffn_hidden", hidden);
    if (fh < 0) return -1;
    if (!fh && (*hidden < 1 || *hidden > 4194304)) {
        h->set_error(h, "%sthe SwiGLU hidden size comes out as %lld; expected 1 to 4194304 (or set ffn_hidden)",
                     mu ? "ffn_dim_multiplier: " : mo ? "multiple_of: " : dim ? "dim: " : "", (long long)*hidden);
        return -1;
    }
    return 0;
}

/* Hugging Face's _compute_llama3_parameters, in float32 step by step as PyTorch evaluates it (a
 * scalar divided by a tensor is the tensor's reciprocal times the scalar), so the table equals
 * transformers' inv_freq: plain frequencies theta^(-2i/d); wavelengths 2 pi / f longer than
 * orig / low are divided by factor, shorter than orig / high kept, and those between blended. */
static void llama3_inv_freq(const llama *m, float *out) {
    int64_t half = m->head_dim / 2;
    float factor = (float)m->rope_factor, low = (float)m->rope_low;
    float orig = (float)m->rope_orig, band = (float)(m->rope_high - m->rope_low);
    float low_wavelen = (float)((double)m->rope_orig / m->rope_low);
    float high_wavelen = (float)((double)m->rope_orig / m->rope_high);
    for (int64_t i = 0; i < half; i++) {
        float f = 1.0f / powf((float)m->rope_theta, (float)(2 * i) / (float)m->head_dim);
        float wavelen = (1.0f / f) * (float)ROPE_TWO_PI;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = ((1.0f / wavelen) * orig - low) / band;
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        out[i] = scaled;
    }
}

/* model.rope_scaling and its four settings: the flavor's choice unless given; a setting given while
 * scaling is off is refused (it would silently do nothing). 0, or -1 with the error set. */
static int read_rope_scaling(const ct_host *h, const flavor *f, llama *m) {
    const char *kind;
    int on = f->rope_llama3;
    if (h->opt_string(h, "rope_scaling", &kind) == CT_OK && kind) on = !strcmp(kind, "llama3");
    double factor = ROPE_SCALING_FACTOR, low = ROPE_LOW_FREQ_FACTOR, high = ROPE_HIGH_FREQ_FACTOR;
    int64_t orig = ROPE_ORIGINAL_MAX_POSITION;
    const char *given = NULL;
    if (h->opt_float(h, "rope_scaling_factor", &factor) == CT_OK) given = "rope_scaling_factor";
    if (h->opt_float(h, "rope_low_freq_factor", &low) == CT_OK) given = "rope_low_freq_factor";
    if (h->opt_float(h, "rope_high_freq_factor", &high) == CT_OK) given = "rope_high_freq_factor";
    if (h->opt_int(h, "rope_original_max_position", &orig) == CT_OK) given = "rope_original_max_position";
    if (!on) {
        if (!given) return 0;
        h->set_error(h, "%s: set while model.rope_scaling is none; set model.rope_scaling: llama3 to scale RoPE",
                     given);
        return -1;
    }
    if (!(high > low)) {
        h->set_error(h, "rope_high_freq_factor: %g must be above rope_low_freq_factor %g", high, low);
        return -1;
    }
    m->rope_factor = factor;
    m->rope_low = low;
    m->rope_high = high;
    m->rope_orig = orig;
    return 0;
}

static ct_status llama_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    const flavor *f = NULL;
    for (size_t i = 0; i < sizeof flavors / sizeof flavors[0]; i++)
        if (cfg->flavor && strcmp(cfg->flavor, flavors[i].name) == 0) f = &flavors[i];
    if (!f) {
        h->set_error(h, "unknown flavor '%s' (known: debugmodel, 1B, 3B, 8B, 70B, 405B)",
                     cfg->flavor ? cfg->flavor : "");
        return CT_ERR_INVALID;
    }
    llama *m = calloc(1, sizeof *m);
    if (!m) return CT_ERR_NOMEM;
    m->host = h;
    m->dim = f->dim;
    m->n_layers = f->n_layers;
    m->n_heads = f->n_heads;
    m->n_kv_heads = f->n_kv_heads;
    m->vocab = f->vocab;
    m->rope_theta = f->rope_theta;
    m->norm_eps = 1e-5;
    m->seq_len = cfg->seq_len;
    int64_t multiple_of = f->multiple_of, hidden;
    double mult = f->ffn_dim_multiplier;
    if (h->opt_bool(h, "depth_init", &m->depth_init) != CT_OK) m->depth_init = 1;
    if (h->opt_bool(h, "tie_word_embeddings", &m->tied) != CT_OK) m->tied = 0;
    if (read_options(h, m, &multiple_of, &mult, &hidden) || read_rope_scaling(h, f, m)) {
        free(m);
        return CT_ERR_INVALID;
    }
    m->head_dim = m->dim / m->n_heads;
    m->ffn_hidden = hidden;
    m->layers = calloc((size_t)m->n_layers, sizeof(layer));
    if (m->rope_factor != 0 && m->layers) {
        m->inv_freq = malloc(sizeof(float) * (size_t)(m->head_dim / 2));
        if (m->inv_freq) llama3_inv_freq(m, m->inv_freq);
    }
    if (!m->layers || (m->rope_factor != 0 && !m->inv_freq)) {
        free(m->layers);
        free(m);
        return CT_ERR_NOMEM;
    }
    for (int64_t l = 0; l < m->n_layers; l++)
        snprintf(m->layers[l].unit_name, sizeof m->layers[l].unit_name, "layers.%d", (int)l); /* n_layers <= 1024 */
    *out = m;
    return CT_OK;
}

static void llama_destroy(ct_model *p) {
    llama *m = p;
    if (!m) return;
    free(m->layers);
    free(m->inv_freq);
    free(m);
}

static int64_t n_params_of(const llama *m) {
    int64_t kv = m->n_kv_heads * m->head_dim, q = m->n_heads * m->head_dim;
    int64_t per_layer = 2 * m->dim + m->dim * q * 2 + 2 * m->dim * kv + 3 * m->dim * m->ffn_hidden;
    return m->vocab * m->dim * (m->tied ? 1 : 2) + m->dim + m->n_layers * per_layer;
}

static ct_status llama_describe(ct_model *p, ct_model_desc *d) {
    llama *m = p;
    d->n_units = (int)m->n_layers + 2;
    d->vocab_size = m->vocab;
    d->dim = m->dim;
    d->n_layers = (int)m->n_layers;
    d->n_params = n_params_of(m);
    d->n_embedding_params = m->vocab * m->dim;
    /* torchtitan: 6 * (params - embedding) + 12 * layers * heads * head_dim * seq_len */
    /* a tied table still costs the output projection's FLOPs */
    d->flops_per_token = 6.0 * (double)(d->n_params - d->n_embedding_params + (m->tied ? m->vocab * m->dim : 0)) +
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
        d->hf_model_type = "llama";
    }
    if (CT_HAS_FIELD(d, ct_model_desc, rope_original_max_position)) {
        d->rope_scaling_factor = m->rope_factor;
        d->rope_low_freq_factor = m->rope_factor != 0 ? m->rope_low : 0;
        d->rope_high_freq_factor = m->rope_factor != 0 ? m->rope_high : 0;
        d->rope_original_max_position = m->rope_factor != 0 ? m->rope_orig : 0;
    }
    return CT_OK;
}

static ct_tensor *add2(ct_param_registry *r, int unit, const char *name, int64_t d0, int64_t d1, ct_init init,
                       uint32_t flags) {
    int64_t shape[2] = {d0, d1};
    return r->add(r, unit, name, d1 ? 2 : 1, shape, &init, flags);
}

static ct_init trunc_init(float std) { return (ct_init){sizeof(ct_init), CT_INIT_TRUNC_NORMAL, std, -2.0f, 2.0f, 0}; }

static ct_status llama_declare(ct_model *p, ct_param_registry *r) {
    llama *m = p;
    const ct_init ones = {sizeof(ct_init), CT_INIT_CONSTANT, 0, 0, 0, 1.0f};
    const ct_init normal1 = {sizeof(ct_init), CT_INIT_NORMAL, 1.0f, 0, 0, 0};
    int64_t q = m->n_heads * m->head_dim, kv = m->n_kv_heads * m->head_dim;
    int head = (int)m->n_layers + 1;
    float out_std = 1.0f / sqrtf((float)m->dim);
    ct_init out_init = {sizeof(ct_init), CT_INIT_TRUNC_NORMAL, out_std, -3 * out_std, 3 * out_std, 0};
    if (!(m->tok_embeddings = add2(r, 0, "tok_embeddings.weight", m->vocab, m->dim, m->tied ? out_init : normal1, 0)))
        return CT_ERR_INVALID;
    for (int64_t i = 0; i < m->n_layers; i++) {
        layer *L = &m->layers[i];
        int u = (int)i + 1;
        float std = m->depth_init ? 0.02f / sqrtf(2.0f * (float)(i + 1)) : 0.02f / sqrtf(2.0f * (float)m->n_layers);
        /* this layer's parameters, in registration order */
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
            {&L->wo, "attention.wo.weight", m->dim, q, trunc_init(std), CT_TENSOR_LINEAR},
            {&L->ffn_norm, "ffn_norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY},
            {&L->w1, "feed_forward.w1.weight", m->ffn_hidden, m->dim, trunc_init(0.02f), CT_TENSOR_LINEAR},
            {&L->w2, "feed_forward.w2.weight", m->dim, m->ffn_hidden, trunc_init(std), CT_TENSOR_LINEAR},
            {&L->w3, "feed_forward.w3.weight", m->ffn_hidden, m->dim, trunc_init(std), CT_TENSOR_LINEAR},
        };
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
            char n[128];
            snprintf(n, sizeof n, "layers.%lld.%s", (long long)i, ps[k].suffix);
            if (!(*ps[k].t = add2(r, u, n, ps[k].d0, ps[k].d1, ps[k].init, ps[k].flags))) return CT_ERR_INVALID;
        }
    }
    if (!(m->norm = add2(r, head, "norm.weight", m->dim, 0, ones, CT_TENSOR_NO_DECAY))) return CT_ERR_INVALID;
    m->output = m->tied ? r->share(r, head, "output.weight", m->tok_embeddings)
                        : add2(r, head, "output.weight", m->vocab, m->dim, out_init, CT_TENSOR_LINEAR);
    if (!m->output) return CT_ERR_INVALID;
    return CT_OK;
}

static const char *llama_unit_name(ct_model *p, int unit) {
    llama *m = p;
    if (unit == 0) return "tok_embeddings";
    if (unit == m->n_layers + 1) return "output";
    if (unit < 0 || unit > m->n_layers + 1) return "?";
    return m->layers[unit - 1].unit_name;
}

/* Every builder call returns NULL on failure (the builder has set the error): each is checked. */
/* x (B, T, D) -> x + attention(norm(x)) -> x + feed_forward(norm(x)).
 * Batch and sequence come from q, not x: under sequence parallel x holds a slice of the rows. */
static ct_status block_forward(llama *m, const layer *L, ct_builder *b, ct_tensor *x, ct_tensor **out) {
    int64_t B, T, hd = m->head_dim;
    float eps = (float)m->norm_eps, theta = (float)m->rope_theta;
    int64_t nh = L->wq->shape[0] / hd, nkv = L->wk->shape[0] / hd; /* heads from shapes, not from flavor */
    ct_tensor *h, *q, *k, *v, *o;
    if (!(h = b->rmsnorm(b, x, L->attention_norm, eps))) return CT_ERR_INVALID;
    if (!(q = b->linear(b, h, L->wq))) return CT_ERR_INVALID;
    if (!(k = b->linear(b, h, L->wk))) return CT_ERR_INVALID;
    if (!(v = b->linear(b, h, L->wv))) return CT_ERR_INVALID;
    B = q->shape[0];
    T = q->shape[1];
    if (!(q = b->view(b, q, 4, (int64_t[]){B, T, nh, hd}))) return CT_ERR_INVALID; /* q is (B, T, NH, HD) */
    if (!(k = b->view(b, k, 4, (int64_t[]){B, T, nkv, hd}))) return CT_ERR_INVALID; /* k, v are (B, T, NKV, HD) */
    if (!(v = b->view(b, v, 4, (int64_t[]){B, T, nkv, hd}))) return CT_ERR_INVALID;
    if (m->inv_freq) { /* scaled RoPE: the builder's table op (plain rope stays rope, bit for bit) */
        if (!CT_HAS_FIELD(b, ct_builder, rope_freqs) || !b->rope_freqs) {
            m->host->set_error(m->host, "model.rope_scaling llama3 needs the builder's rope_freqs (ABI 2.4); this "
                                        "host is older");
            return CT_ERR_UNSUPPORTED;
        }
        if (!(q = b->rope_freqs(b, q, m->inv_freq))) return CT_ERR_INVALID;
        if (!(k = b->rope_freqs(b, k, m->inv_freq))) return CT_ERR_INVALID;
    } else {
        if (!(q = b->rope(b, q, theta))) return CT_ERR_INVALID;
        if (!(k = b->rope(b, k, theta))) return CT_ERR_INVALID;
    }
    if (!(o = b->attention(b, q, k, v))) return CT_ERR_INVALID;
    if (!(o = b->view(b, o, 3, (int64_t[]){B, T, nh * hd}))) return CT_ERR_INVALID;
    if (!(o = b->linear(b, o, L->wo))) return CT_ERR_INVALID;
    if (!(x = b->add(b, x, o))) return CT_ERR_INVALID;
    ct_tensor *a, *g;
    if (!(h = b->rmsnorm(b, x, L->ffn_norm, eps))) return CT_ERR_INVALID;
    if (!(a = b->linear(b, h, L->w1))) return CT_ERR_INVALID;
    if (!(g = b->linear(b, h, L->w3))) return CT_ERR_INVALID;
    if (!(h = b->swiglu(b, a, g))) return CT_ERR_INVALID;
    if (!(h = b->linear(b, h, L->w2))) return CT_ERR_INVALID;
    if (!(*out = b->add(b, x, h))) return CT_ERR_INVALID;
    return CT_OK;
}

static ct_status llama_unit_forward(ct_model *p, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                                    const ct_tensor *targets, ct_tensor **out) {
    llama *m = p;
    if (unit == 0) {
        if (!(*out = b->embedding(b, tokens, m->tok_embeddings))) return CT_ERR_INVALID;
        return CT_OK;
    }
    if (unit <= m->n_layers) return block_forward(m, &m->layers[unit - 1], b, x, out);
    if (unit == m->n_layers + 1) {
        ct_tensor *h, *logits;
        if (!(h = b->rmsnorm(b, x, m->norm, (float)m->norm_eps))) return CT_ERR_INVALID;
        /* only the loss wanted: the host's fused op (2.5) need not hold the logits whole */
        if (targets && CT_HAS_FIELD(b, ct_builder, linear_cross_entropy) && b->linear_cross_entropy)
            return (*out = b->linear_cross_entropy(b, h, m->output, targets)) ? CT_OK : CT_ERR_INVALID;
        if (!(logits = b->linear(b, h, m->output))) return CT_ERR_INVALID;
        if (!targets) {
            *out = logits;
            return CT_OK;
        }
        if (!(*out = b->cross_entropy(b, logits, targets))) return CT_ERR_INVALID;
        return CT_OK;
    }
    m->host->set_error(m->host, "unit %d out of range (model has %lld units)", unit, (long long)m->n_layers + 2);
    return CT_ERR_INVALID;
}

/* torchtitan's apply_tp plan for Llama, as data */
static const ct_tp_rule tp_plan[] = {
    {"tok_embeddings.weight", CT_TP_EMBED_ROWWISE},
    {"layers.*.attention_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.attention.wq.weight", CT_TP_COLWISE},
    {"layers.*.attention.wk.weight", CT_TP_COLWISE},
    {"layers.*.attention.wv.weight", CT_TP_COLWISE},
    {"layers.*.attention.wo.weight", CT_TP_ROWWISE},
    {"layers.*.ffn_norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"layers.*.feed_forward.w1.weight", CT_TP_COLWISE},
    {"layers.*.feed_forward.w2.weight", CT_TP_ROWWISE},
    {"layers.*.feed_forward.w3.weight", CT_TP_COLWISE},
    {"norm.weight", CT_TP_SEQUENCE_PARALLEL},
    {"output.weight", CT_TP_OUTPUT_COLWISE},
    {NULL, CT_TP_NONE},
};

/* Hugging Face's LlamaForCausalLM names. ctitan's RoPE rotates interleaved pairs, Hugging Face's halves:
 * q and k rows are permuted per head. A tied head (tie_word_embeddings) is the table's use and is not
 * written: the folder has no lm_head.weight, as transformers writes a tied Llama. An untied head reads
 * a tied folder's table (Llama 3.2 1B and 3B are tied) as its own copy. */
static const ct_hf_name hf_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", 0},
    {"norm.weight", "model.norm.weight", 0},
    {"output.weight", "lm_head.weight", 0},
    {"output.weight", "model.embed_tokens.weight", CT_HF_TIED},
    {"layers.*.attention_norm.weight", "model.layers.*.input_layernorm.weight", 0},
    {"layers.*.attention.wq.weight", "model.layers.*.self_attn.q_proj.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wk.weight", "model.layers.*.self_attn.k_proj.weight", CT_HF_ROPE_ROWS},
    {"layers.*.attention.wv.weight", "model.layers.*.self_attn.v_proj.weight", 0},
    {"layers.*.attention.wo.weight", "model.layers.*.self_attn.o_proj.weight", 0},
    {"layers.*.ffn_norm.weight", "model.layers.*.post_attention_layernorm.weight", 0},
    {"layers.*.feed_forward.w1.weight", "model.layers.*.mlp.gate_proj.weight", 0},
    {"layers.*.feed_forward.w2.weight", "model.layers.*.mlp.down_proj.weight", 0},
    {"layers.*.feed_forward.w3.weight", "model.layers.*.mlp.up_proj.weight", 0},
    {NULL, NULL, 0},
};

/* LlamaConfig's keys as transformers writes them, with Llama 3.1's rope_scaling block as Meta's
 * config.json has it (rope_type "llama3") when the model scales RoPE. CT_HF_CHECKED: what a loaded
 * folder must match beyond the tensors' shapes; CT_HF_OR_ABSENT: a folder may leave the key out
 * (LlamaConfig's default is the value). The scaling is checked by the host against ct_model_desc. */
static ct_status llama_hf_export(ct_model *p, ct_hf_export *out) {
    llama *m = p;
    ct_hf_field *f = m->fields;
    int n = 0;
    const uint32_t C = CT_HF_CHECKED, A = CT_HF_CHECKED | CT_HF_OR_ABSENT;
#define FIELD(k, t, iv, fv, sv, fl) f[n++] = (ct_hf_field){k, t, iv, fv, sv, fl}
    FIELD("attention_bias", CT_HF_BOOL, 0, 0, NULL, A);
    FIELD("attention_dropout", CT_HF_FLOAT, 0, 0.0, NULL, 0);
    FIELD("head_dim", CT_HF_INT, m->head_dim, 0, NULL, A); /* LlamaConfig: hidden_size / heads */
    FIELD("hidden_act", CT_HF_STRING, 0, 0, "silu", A);
    FIELD("hidden_size", CT_HF_INT, m->dim, 0, NULL, C);
    FIELD("initializer_range", CT_HF_FLOAT, 0, 0.02, NULL, 0);
    FIELD("intermediate_size", CT_HF_INT, m->ffn_hidden, 0, NULL, C);
    FIELD("max_position_embeddings", CT_HF_INT, 8192, 0, NULL, 0);
    FIELD("mlp_bias", CT_HF_BOOL, 0, 0, NULL, A);
    FIELD("num_attention_heads", CT_HF_INT, m->n_heads, 0, NULL, C);
    FIELD("num_hidden_layers", CT_HF_INT, m->n_layers, 0, NULL, C);
    FIELD("num_key_value_heads", CT_HF_INT, m->n_kv_heads, 0, NULL, C);
    FIELD("pretraining_tp", CT_HF_INT, 1, 0, NULL, 0);
    FIELD("rms_norm_eps", CT_HF_FLOAT, 0, m->norm_eps, NULL, C);
    if (m->rope_factor != 0) {
        FIELD("rope_scaling.factor", CT_HF_FLOAT, 0, m->rope_factor, NULL, 0);
        FIELD("rope_scaling.high_freq_factor", CT_HF_FLOAT, 0, m->rope_high, NULL, 0);
        FIELD("rope_scaling.low_freq_factor", CT_HF_FLOAT, 0, m->rope_low, NULL, 0);
        FIELD("rope_scaling.original_max_position_embeddings", CT_HF_INT, m->rope_orig, 0, NULL, 0);
        FIELD("rope_scaling.rope_type", CT_HF_STRING, 0, 0, "llama3", 0);
    } else {
        FIELD("rope_scaling", CT_HF_NULL, 0, 0, NULL, 0);
    }
    FIELD("rope_theta", CT_HF_FLOAT, 0, m->rope_theta, NULL, C);
    /* a tied head must find no lm_head.weight of its own; an untied one reads either folder */
    FIELD("tie_word_embeddings", CT_HF_BOOL, m->tied, 0, NULL, m->tied ? C : 0);
    FIELD("use_cache", CT_HF_BOOL, 1, 0, NULL, 0);
    FIELD("vocab_size", CT_HF_INT, m->vocab, 0, NULL, C);
    f[n] = (ct_hf_field){0};
#undef FIELD
    out->architecture = "LlamaForCausalLM";
    out->model_type = "llama";
    out->names = hf_names;
    out->fields = f;
    return CT_OK;
}

/* How a LlamaConfig's keys set this pack's options (ABI 2.16), with LlamaConfig's defaults; Llama 3.1's
 * rope_scaling (the host reads transformers 5's rope_parameters as it). A tied Llama folder runs on the
 * untied pack, its head a copy of the table (CT_HF_TIED above), so tie_word_embeddings is not read. */
static const ct_hf_option hf_options[] = {
    {"hidden_size", "dim", NULL, NULL, 0},
    {"num_hidden_layers", "n_layers", NULL, NULL, 0},
    {"num_attention_heads", "n_heads", NULL, NULL, 0},
    {"num_key_value_heads", "n_kv_heads", "num_attention_heads", NULL, 0},
    {"vocab_size", "vocab_size", NULL, NULL, 0},
    {"intermediate_size", "ffn_hidden", NULL, NULL, 0},
    {"rope_theta", "rope_theta", NULL, "10000", 0},
    {"rms_norm_eps", "norm_eps", NULL, "1e-6", 0},
    {"rope_scaling.rope_type", "rope_scaling", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.factor", "rope_scaling_factor", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.low_freq_factor", "rope_low_freq_factor", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.high_freq_factor", "rope_high_freq_factor", NULL, NULL, CT_HF_OPTIONAL},
    {"rope_scaling.original_max_position_embeddings", "rope_original_max_position", NULL, NULL, CT_HF_OPTIONAL},
    {NULL, NULL, NULL, NULL, 0},
};

static const ct_hf_import hf_import = {
    .struct_size = sizeof(ct_hf_import), .model_type = "llama", .options = hf_options};

static const ct_model_api api = {
    .struct_size = sizeof(ct_model_api),
    .flavors = flavor_names,
    .create = llama_create,
    .destroy = llama_destroy,
    .describe = llama_describe,
    .declare_params = llama_declare,
    .unit_name = llama_unit_name,
    .unit_forward = llama_unit_forward,
    .tp_plan = tp_plan,
    .hf_export = llama_hf_export,
    .hf_import = &hf_import,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "llama3";
    info->description = "Llama 3 (RMSNorm, RoPE, GQA, SwiGLU); flavors debugmodel, 1B, 3B, 8B, 70B, 405B";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
