/* ctitan/model.h: the model-pack interface (plugin kind CT_KIND_MODEL).
 *
 * A model pack writes the forward pass once, single-device, with the host's ops (ct_builder), on
 * the shapes it is given: it reads head counts from the tensors' shapes, never from a parallel
 * degree. The host records every op on its tape and replays the backward; the pack writes no
 * backward code.
 *
 * A model is a sequence of units: unit 0 is the embedding, then the blocks, then the head
 * (final norm + output + loss). Units are what activation checkpointing, FSDP and pipeline stages
 * work on. The pack declares every parameter with its unit, name, shape, initialisation and flags;
 * the host allocates and initialises them, so it can count, shard and checkpoint them.
 *
 * Memory: tensors the builder returns live in host arenas until the step ends; the pack keeps
 * only the ct_tensor pointers of its parameters (the host may change their `data` between calls).
 * Errors: a builder op returns NULL after the host has recorded the message; the pack then returns
 * any error status (CT_ERR_INVALID is customary) and the host reports its own message.
 * Names: the host copies parameter names at declare time; the pack may free its buffers.
 * Handles: the ct_model from create is the host's to pass back until destroy. What the pack hands
 * out (flavors, tp_plan, unit_name's strings) stays valid until destroy or, for the static tables
 * in ct_model_api, until the plugin is unloaded.
 */
#ifndef CTITAN_MODEL_H
#define CTITAN_MODEL_H

#include "ctitan/abi.h"
#include "ctitan/host.h"
#include "ctitan/tensor.h"

#define CT_IGNORE_INDEX (-100)

typedef enum ct_init_kind {
    CT_INIT_NORMAL = 1,       /* normal(0, std) */
    CT_INIT_TRUNC_NORMAL = 2, /* normal(0, std) redrawn outside [lo, hi] (absolute bounds) */
    CT_INIT_CONSTANT = 3,     /* every element = value */
    CT_INIT_UNIFORM = 4       /* uniform(lo, hi) */
} ct_init_kind;

typedef struct ct_init {
    size_t struct_size;
    ct_init_kind kind;
    float std, lo, hi, value;
} ct_init;

/* Handed to declare_params. */
typedef struct ct_param_registry {
    size_t struct_size;
    void *ctx;
    /* Declares a parameter of `unit` with its fully qualified name and global shape. Returns the
     * tensor handle the pack keeps (its data/grad are filled by the host before any forward), or
     * NULL with the error set. flags: CT_TENSOR_NO_DECAY for norm weights and biases. The tensor is
     * the host's and stays at the same address for every later call but destroy (the host may free
     * it first, so destroy must not read it). */
    ct_tensor *(*add)(struct ct_param_registry *r, int unit, const char *name, int ndim,
                      const int64_t *shape, const ct_init *init, uint32_t flags);
} ct_param_registry;

/* The host's ops. Every op returns a new tensor (or NULL on error) and records its backward. */
typedef struct ct_builder ct_builder;
struct ct_builder {
    size_t struct_size;
    void *ctx;
    /* x (..., in) @ w (out, in)^T -> (..., out) */
    ct_tensor *(*linear)(ct_builder *b, ct_tensor *x, ct_tensor *w);
    /* x (..., c) + bias (c) */
    ct_tensor *(*bias)(ct_builder *b, ct_tensor *x, ct_tensor *bias);
    /* ids (...) int32 -> table[ids] (..., c); table (vocab, c) */
    ct_tensor *(*embedding)(ct_builder *b, const ct_tensor *ids, ct_tensor *table);
    ct_tensor *(*rmsnorm)(ct_builder *b, ct_tensor *x, ct_tensor *w, float eps);
    /* bias may be NULL */
    ct_tensor *(*layernorm)(ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor *bias, float eps);
    /* x (B, T, H, D): rotary embedding by position t (see device.h for the convention) */
    ct_tensor *(*rope)(ct_builder *b, ct_tensor *x, float theta);
    /* causal attention: q (B,T,H,D), k, v (B,T,KVH,D) -> (B,T,H,D) */
    ct_tensor *(*attention)(ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v);
    /* silu(a) * g, same shapes */
    ct_tensor *(*swiglu)(ct_builder *b, ct_tensor *a, ct_tensor *g);
    ct_tensor *(*gelu)(ct_builder *b, ct_tensor *x);
    ct_tensor *(*add)(ct_builder *b, ct_tensor *x, ct_tensor *y);
    /* Same data, new shape with the same number of elements. */
    ct_tensor *(*view)(ct_builder *b, ct_tensor *x, int ndim, const int64_t *shape);
    /* logits (..., V), targets (...) int32 with CT_IGNORE_INDEX -> scalar: the SUM of the per-token
     * losses over targets that are not ignored (the host normalises by the global token count). */
    ct_tensor *(*cross_entropy)(ct_builder *b, ct_tensor *logits, const ct_tensor *targets);
    /* int32 (batch, seq) holding t at [.., t]: positions for learned position embeddings */
    ct_tensor *(*positions)(ct_builder *b, int64_t batch, int64_t seq);
};

typedef struct ct_model_config {
    size_t struct_size;
    const char *flavor;
    int64_t seq_len; /* the training sequence length (for FLOPs and position tables) */
} ct_model_config;

typedef struct ct_model_desc {
    size_t struct_size;
    int n_units;              /* embedding + blocks + head */
    int64_t vocab_size;
    int64_t dim;
    int n_layers;
    int64_t n_params;           /* all parameters */
    int64_t n_embedding_params; /* excluded from the 6N FLOPs term */
    double flops_per_token;     /* training FLOPs (forward + backward) per token at cfg.seq_len */
    /* ABI 1.2 (0 when a pack does not say): what exporting to other formats (Hugging Face) needs */
    int64_t n_heads, n_kv_heads, head_dim, ffn_hidden;
    double rope_theta, norm_eps;
} ct_model_desc;

/* ABI 1.3: the tensor-parallel plan, as data (torchtitan's parallelize plan). A strategy that splits
 * parameters over the tp axis reads it; the host runs the collectives each style implies around the
 * linear, embedding and loss ops, so the pack's forward stays single-device. With sequence parallel the
 * residual stream between blocks holds 1/tp of the token rows on each rank; the pack must then take
 * the sequence length from a column-wise linear's OUTPUT (which holds every row), not from x. */
typedef enum ct_tp_style {
    CT_TP_NONE = 0,
    CT_TP_COLWISE = 1,        /* w (out, in) split on dim 0; input gathered (every token row), output sharded on features */
    CT_TP_ROWWISE = 2,        /* w (out, in) split on dim 1; input sharded on features, output reduced (scattered on rows under SP) */
    CT_TP_EMBED_ROWWISE = 3,  /* embedding table (vocab, dim) split on dim 0; output reduced (scattered on rows under SP) */
    CT_TP_OUTPUT_COLWISE = 4, /* the output layer (vocab, dim) split on dim 0; vocabulary-sharded logits (loss parallel) */
    CT_TP_SEQUENCE_PARALLEL = 5 /* a norm weight: replicated; under SP it sees 1/tp of the rows, so its gradient is summed over tp */
} ct_tp_style;

typedef struct ct_tp_rule {
    const char *pattern; /* a parameter name; '*' matches any run of characters ("layers.*.attention.wq.weight") */
    ct_tp_style style;
} ct_tp_rule;

typedef struct ct_model_api {
    size_t struct_size;
    const char *const *flavors; /* NULL-terminated list of flavor names; static, valid until unload */
    /* Reads the pack's own options (model.* keys it declared) through `host`. An unknown flavor is
     * CT_ERR_INVALID with a message listing the known ones. */
    ct_status (*create)(const ct_host *host, const ct_model_config *cfg, ct_model **model);
    void (*destroy)(ct_model *model);
    ct_status (*describe)(ct_model *model, ct_model_desc *out);
    ct_status (*declare_params)(ct_model *model, ct_param_registry *reg);
    /* A short name for a unit, for logs and plans ("tok_embeddings", "layers.3", "output"). The
     * string is the model's and stays valid until destroy (a caller may hold several at once). */
    const char *(*unit_name)(ct_model *model, int unit);
    /* Forward of one unit.
     *   x:       the previous unit's output (NULL for unit 0)
     *   tokens:  (B, T) int32 input ids (every unit sees them)
     *   targets: (B, T) int32 or NULL. The last unit returns the summed loss (scalar) when targets
     *            are given and the logits (B, T, V) when they are NULL.
     * *out receives the unit's output tensor. */
    ct_status (*unit_forward)(ct_model *model, int unit, ct_builder *b, ct_tensor *x,
                              const ct_tensor *tokens, const ct_tensor *targets, ct_tensor **out);
    /* ABI 1.3, optional: the tensor-parallel plan, ended by a rule whose pattern is NULL; the first rule
     * matching a parameter's name gives its style; a parameter no rule matches is replicated. NULL: the
     * pack cannot be split over tp. */
    const ct_tp_rule *tp_plan;
} ct_model_api;

#endif
