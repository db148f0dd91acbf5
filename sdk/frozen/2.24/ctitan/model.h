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
    /* ABI 2.1: a shared (tied) parameter. `unit` also computes with `param`, which `add` declared
     * for an earlier unit; `use_name` names this use (the tensor-parallel plan is matched against it,
     * so each use has its own style: "output.weight" column-wise where "tok_embeddings.weight" is
     * row-wise). Returns the handle `unit` computes with, or NULL with the error set.
     * The host keeps one copy per use, each placed by the strategies like any parameter of its unit
     * (so a pipeline stage holds the uses of its own units); it initialises the copies alike and,
     * after every strategy's finish_backward, sets each copy's gradient to the sum over the uses, so
     * the copies stay equal (Megatron's tied embeddings). The norm, the parameter count,
     * checkpoints and exports take the parameter once, under its declared name. Computing with a
     * parameter in a unit that neither declared nor shared it is an error naming both. */
    ct_tensor *(*share)(struct ct_param_registry *r, int unit, const char *use_name, ct_tensor *param);
} ct_param_registry;

/* ABI 2.0: the differentiable collectives (ct_builder.collective). Each runs over one mesh axis and
 * records its conjugate, so the gradient that reaches x is what the single-device function's is. */
typedef enum ct_collective {
    CT_COLL_ALL_GATHER = 1,       /* every rank's block, concatenated along dim | backward: reduce-scatter
                                     (each rank's consumer made a partial gradient) */
    CT_COLL_ALL_GATHER_SLICE = 2, /* the same | backward: this rank's block of the gradient (every rank
                                     computed the same one, e.g. from a replicated loss) */
    CT_COLL_REDUCE_SCATTER = 3,   /* the sum over the axis, this rank keeping its block along dim
                                     | backward: all-gather */
    CT_COLL_ALL_REDUCE = 4,       /* the sum over the axis | backward: identity (Megatron's g) */
    CT_COLL_COPY = 5,             /* identity | backward: all-reduce (Megatron's f) */
    /* ABI 2.12: x split into degree blocks along dim, block r sent to rank r; the blocks received, one
     * from each rank in rank order, joined along the other dim. dim CT_DIM_COLS: (rows, c) ->
     * (degree * rows, c / degree), rank r's rows after rank r-1's (DeepSpeed-Ulysses: heads out, the
     * sequence in); CT_DIM_ROWS: (rows, c) -> (rows / degree, degree * c), the inverse | backward:
     * the all-to-all along the other dim. Not made once: every call moves data. */
    CT_COLL_ALL_TO_ALL = 6
} ct_collective;

/* The dims a collective splits along. Token rows: every dim but the last, flattened; rank r's block
 * is the r-th contiguous run of rows, and the gathered tensor's second-to-last dim is degree times
 * the block's. Columns: the last dim; rank r's block is the r-th run of columns of every row. A 1-D
 * tensor is one run whichever is named: rank r's block is its r-th contiguous run (ABI 2.12; 2.11
 * refused 1-D tensors). */
#define CT_DIM_ROWS (-2)
#define CT_DIM_COLS (-1)

/* ABI 2.11 (the limit itself is 2.0's): a custom op's most inputs, and most outputs. */
#define CT_CUSTOM_MAX_IO 8

/* ABI 2.15: one mixture-of-experts layer (ct_builder.moe), token-choice top-k routing over e experts,
 * each a SwiGLU feed-forward of hidden size h on model width d. The tensors are the pack's parameters
 * (declared like any other; a strategy that shards experts splits w1, w3 and w2 along dim 0). */
typedef struct ct_moe_layer {
    size_t struct_size;
    ct_tensor *router;       /* (e, d): the gate; router logits (n, e) = x @ router^T */
    ct_tensor *w1, *w3;      /* (e, h, d): each expert's gate and up projections */
    ct_tensor *w2;           /* (e, d, h): each expert's down projection */
    int64_t top_k;           /* experts per token, 1..e */
    int score_func;          /* ct_moe_score (device.h): CT_MOE_SOFTMAX or CT_MOE_SIGMOID */
    int normalize;           /* 1: the k weights divided by their sum (Hugging Face's norm_topk_prob) */
    float route_scale;       /* the weights multiplied by it (1: none) */
    int64_t n_groups, topk_groups; /* group-limited routing (device.h, moe_topk_forward); 0: none */
    /* (e) floats in device memory or NULL: added to the scores for choosing only, never differentiated
     * (DeepSeek-V3's aux-loss-free balancing; the pack owns it and updates it in post_step) */
    const float *expert_bias;
    /* > 0: the Switch load-balancing loss of this layer (transformers' load_balancing_loss_func on this
     * layer's router alone): coef * e * sum_j f_j P_j, f_j the fraction of the N*k (token, slot) pairs
     * routed to expert j, P_j the mean score of expert j over the N tokens; multiplied by N (a sum over
     * tokens, like the cross-entropy's) and added to the loss through aux_loss. The N tokens are the
     * microbatch's on every rank that holds some of them (data parallel, and the context- and
     * sequence-parallel ranks that split its rows), so every layout computes one rank's statistic;
     * each rank's aux_loss value is its share (hosts before 2.18: each rank's own tokens) */
    float aux_loss_coef;
    /* 1 (tests, torchtitan's moe_force_load_balance): token t's slot s goes to expert (t*k + s) % e,
     * weighted by its score as if chosen; group-limited routing and expert_bias are ignored */
    int force_load_balance;
} ct_moe_layer;

/* The host's ops. Every op returns a new tensor (or NULL on error) and records its backward. */
typedef struct ct_builder ct_builder;
struct ct_custom_op;
struct ct_device_api;
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

    /* ---- ABI 2.0: what operation-level strategies build with (ctitan/strategy.h, wrap_builder).
     * A model pack may call these too, but a single-device pack has no reason to. ---- */

    /* A differentiable collective over mesh axis `axis` (ct_mesh_axis) on x, recorded with its
     * conjugate for backward (see ct_collective). `dim` is CT_DIM_ROWS or CT_DIM_COLS. An all-gather
     * or copy of the same tensor over the same axis and dim is made once: a second call returns the
     * first result. On one rank of the axis every kind is the identity. */
    ct_tensor *(*collective)(ct_builder *b, ct_collective kind, ct_tensor *x, int axis, int dim);
    /* The host calls this on a model output it is about to read (the logits, when no targets were
     * given); a strategy that left that output split returns it whole. The host's own returns x. */
    ct_tensor *(*finish_output)(ct_builder *b, ct_tensor *x);
    /* A fresh f32 or int32 activation in the arena the builder writes to now (lives as long as the
     * builder's other outputs: until the step's backward has used it). Its gradient starts NULL. */
    ct_tensor *(*new_tensor)(ct_builder *b, ct_dtype dtype, int ndim, const int64_t *shape);
    /* Device memory for a custom op's temporaries: valid until its forward or backward callback
     * returns. NULL (with the error set) when out of memory. */
    void *(*scratch)(ct_builder *b, size_t bytes);
    /* Runs op->forward now and records the op for backward. `state` (state_bytes, may be 0) is copied
     * into host memory that lives as long as the op's outputs; forward and backward get that copy.
     * in[] and out[] are copied too: at most CT_CUSTOM_MAX_IO of each (n_out >= 1; more is refused).
     * Returns CT_OK, or the callback's status with the error set. */
    ct_status (*custom)(ct_builder *b, const struct ct_custom_op *op, const void *state, size_t state_bytes,
                        ct_tensor *const *in, int n_in, ct_tensor **out, int n_out);
    /* In a backward callback: t's gradient buffer (numel f32, zeroed on first use; a parameter's is
     * its own), to accumulate into with `+=`. NULL with the error set when out of memory. */
    float *(*grad)(ct_builder *b, ct_tensor *t);
    /* A note a strategy keeps on an activation: memo(b, x, key, NULL) returns the tensor stored
     * under `key` (any address the strategy owns) on x, or NULL; memo(b, x, key, v) stores v. Notes
     * live as long as x; a view of x starts without any. */
    ct_tensor *(*memo)(ct_builder *b, ct_tensor *x, const void *key, ct_tensor *value);
    /* Time a custom op spent blocked in communication over `axis`, for the per-axis summary. */
    void (*account_comm)(ct_builder *b, int axis, double seconds);
    /* ---- ABI 2.2 ---- */
    /* 1 on the planner's builder (`ctitan plan`, `--dry-run`): ops compute shapes and costs only;
     * every tensor's data and grad is NULL, nothing is computed, custom ops run their plan. An
     * operation-level strategy's wrapped ops must then not read data or call the device. */
    int planning;
    /* ---- ABI 2.4 ---- */
    /* x (B, T, H, D): rotary embedding with the pack's own per-pair inverse frequencies inv_freq
     * (D/2 floats in host memory, copied by the host before the call returns): pair i at position t
     * rotates by t * inv_freq[i] (device.h, rope_freqs_forward). What a pack with scaled RoPE (Llama
     * 3.1's "llama3" type) calls instead of rope. NULL on a 2.3 host: check with CT_HAS_FIELD. */
    ct_tensor *(*rope_freqs)(ct_builder *b, ct_tensor *x, const float *inv_freq);
    /* ---- ABI 2.5 ---- */
    /* cross_entropy(linear(x, w), targets) -- x (..., in), w (V, in), targets (...) int32 with
     * CT_IGNORE_INDEX -> scalar, the same SUM -- without holding the (..., V) logits whole: the host
     * may compute them a block of rows at a time in forward and again in backward (it does under
     * bf16 compute; in f32 it is one block, what the two ops give bit for bit). What a pack's output
     * head calls when it needs only the loss. An operation-level strategy that wraps linear or
     * cross_entropy and not this op gets it as those two ops, its own. NULL on a 2.4 host: check
     * with CT_HAS_FIELD. */
    ct_tensor *(*linear_cross_entropy)(ct_builder *b, ct_tensor *x, ct_tensor *w, const ct_tensor *targets);
    /* ---- ABI 2.7 ---- */
    /* In a custom op's backward callback: like scratch, but taken from the region the unit's
     * backward temporaries share (where its activation gradients live, given back at their last
     * use), so it holds no memory of its own beside them; valid until the callback returns. Where
     * the host keeps no such region (a schedule that splits backward) it is scratch. An op that
     * calls it says in its plan how much (ct_op_cost.backward_scratch), which the planner places
     * as one allocation: an op that takes it in one call is planned exactly. NULL on a 2.6 host:
     * check with CT_HAS_FIELD. */
    void *(*backward_scratch)(ct_builder *b, size_t bytes);
    /* ---- ABI 2.12 ---- */
    /* The device the builder's tensors live on, for a custom op's callbacks (a model pack's custom
     * ops have no strategy environment to take it from): *api and *dev, valid while the run lasts.
     * On the planner's builder (planning) they are the planner's device, which computes nothing. NULL
     * on a 2.11 host: check with CT_HAS_FIELD. */
    ct_status (*device)(ct_builder *b, const struct ct_device_api **api, ct_device **dev);
    /* ---- ABI 2.13 ---- */
    /* The document ids of the microbatch being built, for an operation-level strategy that wraps
     * attention (context parallel cuts them with the rows): int32 (B, T) in device memory, the same B
     * and T as the token ids unit_forward got, ids counting up from 0 in each sequence; a document
     * ends with the tokenizer's EOS token (the EOS is its last token). NULL when attention is causal
     * across the whole sequence (model.attn_mask_type causal). Attention under block_causal is
     * device.h's attention_doc_forward with these ids and positions 0..T-1 in each row: key j is
     * visible to query i when they share a document and j <= i. The tensor is the host's and lives
     * as long as the microbatch's token ids. The planner's builder returns NULL (it prices attention
     * from the data's mean document length instead). NULL (the function) on a 2.12 host: check with
     * CT_HAS_FIELD. */
    const ct_tensor *(*doc_ids)(ct_builder *b);
    /* ---- ABI 2.15: mixture of experts, and losses beside the head's ---- */
    /* One MoE layer on x (..., d) -> (..., d): router logits, scores, top-k, the (token, slot) pairs
     * sorted by expert, the tokens gathered in that order, moe_experts on them, and the weighted sum
     * back per token; backward on the tape. Nothing of the routing is read back to the host. The
     * per-expert counts of each call are summed for post_step (ct_model_step); with aux_loss_coef > 0
     * the layer's load-balancing loss goes through aux_loss. Needs the device's 2.14 MoE ops (an error
     * naming the device otherwise). The host's moe calls moe_experts and aux_loss through the outermost
     * builder, so an operation-level strategy that wraps them sees every layer's. NULL on a 2.14 host:
     * check with CT_HAS_FIELD. */
    ct_tensor *(*moe)(ct_builder *b, ct_tensor *x, const ct_moe_layer *layer);
    /* The experts' SwiGLU over rows sorted by expert: x (m, d), offsets (e+1) int32 in device memory
     * (expert g's rows are offsets[g] .. offsets[g+1]) -> (m, d), row r = w2_g (silu(w1_g x_r) * w3_g x_r)
     * for the expert g whose segment holds r (rows in no segment are 0). w1, w3 (e, h, d); w2 (e, d, h).
     * The point where an expert-parallel strategy sends rows to the ranks holding their experts. */
    ct_tensor *(*moe_experts)(ct_builder *b, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                              ct_tensor *w2);
    /* An auxiliary loss of a unit that is not the head: loss, an f32 scalar, is added to the step's loss,
     * normalised by the same global count of valid tokens (so it is a sum over tokens, like the
     * cross-entropy's), and reported beside it (metrics `aux_loss`). Returns x unchanged in value (a
     * new tensor the unit passes on in x's place); its backward gives loss the gradient the head's loss
     * gets. The value is counted once per microbatch, whatever activation checkpointing recomputes. */
    ct_tensor *(*aux_loss)(ct_builder *b, ct_tensor *x, ct_tensor *loss);
    /* ---- ABI 2.17 ---- */
    /* The differentiable all-to-all with variable splits over `axis` (a mesh axis or CT_AXIS_EP): x (rows,
     * c), its first send_rows[0] rows go to rank 0 of the axis, the next send_rows[1] to rank 1, ...; the
     * result (sum of recv_rows, c) holds recv_rows[r] rows from rank r, in rank order. send_rows and
     * recv_rows hold one count per rank of the axis, in host memory, copied before the call returns; rank
     * i's send_rows[j] must be rank j's recv_rows[i] (exchange the counts first). Backward: the all-to-all
     * of the gradient with the counts swapped. Needs the comm's all_to_allv (an error naming it
     * otherwise). NULL on a 2.16 host: check with CT_HAS_FIELD. */
    ct_tensor *(*all_to_all_v)(ct_builder *b, ct_tensor *x, int axis, const int64_t *send_rows,
                               const int64_t *recv_rows);
};

/* ABI 2.0: a custom op a strategy records (async tensor parallel's overlapped pieces, loss parallel,
 * a vocabulary-ranged embedding ...). The host calls forward at once and backward when the tape is
 * replayed. Both may use the device and comm the strategy was given and the builder's new_tensor,
 * scratch and grad; neither may record other ops. */
/* ABI 2.2: what one op costs per microbatch, for the planner (`ctitan plan`, ct_custom_op.plan). */
typedef struct ct_op_comm {
    int axis;          /* ct_mesh_axis */
    int kind;          /* ct_collective: CT_COLL_ALL_GATHER, CT_COLL_REDUCE_SCATTER or CT_COLL_ALL_REDUCE */
    int phase;         /* 1 forward, 2 backward (ct_step_phase's values) */
    int overlapped;    /* 1: runs beside the op's own compute (async TP's chunks), so it may hide */
    double bytes;      /* the whole (gathered, or reduced) buffer, in bytes */
    int calls;         /* the collectives it is issued as, each of bytes / calls (async TP's chunks); 0: one */
} ct_op_comm;

typedef struct ct_op_cost {
    size_t struct_size;
    double matmul_flops[2]; /* GEMM FLOPs: [0] forward, [1] backward (both halves) */
    int matmul_dtype;       /* ct_dtype the GEMMs run in (CT_F32 unless a quantizer's) */
    double bytes[2];        /* memory traffic of the memory-bound work: [0] forward, [1] backward */
    int n_comm;             /* entries used in comm */
    ct_op_comm comm[4];
    /* ABI 2.3: attention FLOPs (scores and the weighted sum of values, the visible pairs only), [0]
     * forward, [1] backward, timed at the device's attention rate rather than its GEMM rate; not
     * counted again in matmul_flops */
    double attention_flops[2];
    /* ABI 2.7: the bytes the op's backward takes with b->backward_scratch (0: none; what it takes
     * with b->scratch the scratch plan() takes stands for, in forward and backward alike). */
    double backward_scratch;
} ct_op_cost;

typedef struct ct_custom_op {
    size_t struct_size;
    const char *name; /* for traces and errors; static */
    /* Fills out[0..n_out) with tensors made by b->new_tensor (the host counts and frees them). */
    ct_status (*forward)(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out);
    /* dy[i]: out[i]'s gradient, or NULL where none flowed. halves: CT_GRAD_INPUT (accumulate into
     * the inputs' gradients that are not parameters'), CT_GRAD_WEIGHT (into the parameters'), or
     * both; a zero-bubble schedule calls the weight half later, after the input half. */
    ct_status (*backward)(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                          const float *const *dy, int n_out, int halves);
    /* ABI 2.2, optional: on a planning builder (b->planning) the host calls this instead of forward.
     * It fills out[0..n_out) with b->new_tensor (shapes only: every data pointer is NULL, in[]'s
     * too) and *cost (zeroed by the host) with what forward and backward cost. NULL: the planner
     * cannot plan a run that uses the op, and says which op stops it. */
    ct_status (*plan)(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                      ct_op_cost *cost);
} ct_custom_op;

#define CT_GRAD_INPUT 1
#define CT_GRAD_WEIGHT 2

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
    /* 0 when a pack does not say: what exporting to other formats (Hugging Face) needs */
    int64_t n_heads, n_kv_heads, head_dim, ffn_hidden;
    double rope_theta, norm_eps;
    /* ABI 2.1: what export needs beyond the sizes */
    uint32_t features;         /* CT_MODEL_* bits */
    const char *hf_model_type; /* Hugging Face's model_type ("llama", "qwen2"); NULL: "llama". The
                                  pack's string, valid until destroy */
    /* ABI 2.4: RoPE frequency scaling, for export (Hugging Face's rope_scaling). rope_scaling_factor
     * 0: none. Otherwise Llama 3.1's "llama3" type: wavelengths above original_max_position /
     * low_freq_factor are divided by factor, those below original_max_position / high_freq_factor
     * kept, and the band between interpolated smoothly. */
    double rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_position;
} ct_model_desc;

#define CT_MODEL_TIED_EMBEDDINGS 0x1u /* the output head shares the embedding table (tie_word_embeddings) */
#define CT_MODEL_QKV_BIAS 0x2u        /* the q, k and v projections have biases (attention.w{q,k,v}.bias) */

/* The tensor-parallel plan, as data (torchtitan's parallelize plan): the pack names a style per
 * parameter; the strategy that serves the tp mesh axis (plugins/tp) splits the parameters and wraps
 * the builder's linear, embedding and cross-entropy ops with the collectives each style implies, so
 * the pack's forward stays single-device. With sequence parallel the residual stream between blocks
 * holds 1/tp of the token rows on each rank; the pack must then take the sequence length from a
 * column-wise linear's OUTPUT (which holds every row), not from x. */
typedef enum ct_tp_style {
    CT_TP_NONE = 0,
    CT_TP_COLWISE = 1,        /* w (out, in) split on dim 0; input gathered (every token row), output sharded on features */
    CT_TP_ROWWISE = 2,        /* w (out, in) split on dim 1; input sharded on features, output reduced (scattered on rows under SP) */
    CT_TP_EMBED_ROWWISE = 3,  /* embedding table (vocab, dim) split on dim 0; output reduced (scattered on rows under SP) */
    CT_TP_OUTPUT_COLWISE = 4, /* the output layer (vocab, dim) split on dim 0; vocabulary-sharded logits (loss parallel) */
    CT_TP_SEQUENCE_PARALLEL = 5, /* a norm weight: replicated; under SP it sees 1/tp of the rows, so its gradient is summed over tp */
    /* ABI 2.11: a replicated weight applied to activations split over tp whatever the SP switch (a
     * per-head QK-norm on head-split q and k, a per-head bias): each rank's gradient is partial and is
     * summed over tp, with or without sequence parallel (torchtitan's SequenceParallel(sequence_dim=2)).
     * A matrix with this style in a linear on the residual stream (DeepSeek-V3's low-rank wq_a, wkv_a)
     * is applied whole to the gathered token rows; its output, and what follows until a column-wise
     * linear, is the same on every rank with a gradient partial over the heads split after it */
    CT_TP_REPLICATED_PARTIAL = 6
} ct_tp_style;
/* A 1-D tensor (a bias) takes the style of the linear it belongs to: CT_TP_COLWISE splits it along
 * its one dim with the output features; CT_TP_ROWWISE leaves it whole (added once, after the
 * reduction). */

/* Frozen: this element never grows (a later minor that needs more adds a new array), so readers
 * index the plan as a plain C array. */
typedef struct ct_tp_rule {
    const char *pattern; /* a parameter name; '*' matches any run of characters ("layers.*.attention.wq.weight") */
    ct_tp_style style;
} ct_tp_rule;

/* ABI 2.12: how a pack's parameters map to a Hugging Face folder (config.json and model.safetensors), as
 * data, so a pack the core knows nothing of (a Qwen3, a Mistral) exports and loads without the core
 * learning its names. Export: the host gathers every parameter, maps each name through the pack's
 * table, permutes the rows the table marks, writes the tensors (float32 or bfloat16, as
 * checkpoint.export_dtype says) and a config.json of the pack's fields (keys sorted, indented by 2 as
 * transformers writes it) plus "architectures", "model_type" and "torch_dtype". Load: the same table
 * read backwards; config.json's model_type and CT_HF_CHECKED fields must equal the model's. */

/* The rows of a (rows, cols) matrix, or the elements of a vector, are head_dim-long blocks (one per
 * head; ct_model_desc.head_dim) whose RoPE pairs ctitan interleaves (x[2i], x[2i+1]) and Hugging Face
 * keeps in halves (x[i], x[i + head_dim/2]): HF row h*hd + j*hd/2 + i is ctitan row h*hd + 2i + j.
 * Mark q and k projections (and their biases), and a per-head norm applied before RoPE (QK-norm). */
#define CT_HF_ROPE_ROWS 0x1u
/* Load only, never written: the tensor a tied folder (config.json's tie_word_embeddings true) holds
 * in place of the parameter's own when the folder lacks it, as transformers reads a tied model (a pack
 * with an untied head takes the embedding table as its head: {"output.weight",
 * "model.embed_tokens.weight", CT_HF_TIED} beside output.weight's own row). */
#define CT_HF_TIED 0x2u
/* ABI 2.15: a stack of experts' matrices (e, rows, cols), one Hugging Face tensor (rows, cols) per expert:
 * the Hugging Face pattern has one '*' more than the ctitan pattern, its last taking the expert's index
 * ({"layers.*.moe.experts.w1", "model.layers.*.mlp.experts.*.gate_proj.weight", CT_HF_EXPERTS}). */
#define CT_HF_EXPERTS 0x4u

/* Frozen: this element never grows (a later minor that needs more adds a new array). */
typedef struct ct_hf_name {
    /* a parameter name; each '*' matches a non-empty run of characters ("layers.*.attention.wq.weight") */
    const char *ctitan;
    /* the Hugging Face tensor name; its '*'s take what the ctitan pattern's matched, in order
     * ("model.layers.*.self_attn.q_proj.weight"); the same number of '*'s as ctitan's */
    const char *hf;
    uint32_t flags; /* CT_HF_ROPE_ROWS, CT_HF_TIED, CT_HF_EXPERTS */
} ct_hf_name;

typedef enum ct_hf_type {
    CT_HF_INT = 1,    /* i */
    CT_HF_FLOAT = 2,  /* f: written as Python writes a float (500000.0, 1e-05) */
    CT_HF_BOOL = 3,   /* i: 0 false, else true */
    CT_HF_STRING = 4, /* s */
    CT_HF_NULL = 5,
    /* ABI 2.18: written as []; a loaded config.json's value must be an empty list (Qwen3MoeConfig's
     * mlp_only_layers when every block is sparse) */
    CT_HF_EMPTY_LIST = 6
} ct_hf_type;

/* A field the model's arithmetic depends on that the tensors' shapes do not tell (heads against
 * head_dim, RoPE's base, the norm's epsilon, tied embeddings): loading a Hugging Face folder
 * (checkpoint.initial_load_in_hf) requires its config.json to hold this exact value, and names the
 * key when it does not. */
#define CT_HF_CHECKED 0x1u
/* With CT_HF_CHECKED: a loaded config.json may also leave the key out (or hold null), because
 * transformers' default for it is this value (attention_bias false in a LlamaConfig, say). */
#define CT_HF_OR_ABSENT 0x2u

/* Frozen, like ct_hf_name. One config.json key: a '.' in it nests ("rope_scaling.factor" is the key
 * factor of the object rope_scaling). */
typedef struct ct_hf_field {
    const char *key;
    ct_hf_type type;
    int64_t i;
    double f;
    const char *s;
    uint32_t flags; /* CT_HF_CHECKED, CT_HF_OR_ABSENT */
} ct_hf_field;

typedef struct ct_hf_export {
    size_t struct_size;
    const char *architecture; /* "Qwen3ForCausalLM": config.json's "architectures": [architecture] */
    const char *model_type;   /* "qwen3" */
    /* ended by an element whose ctitan is NULL; the first pattern matching a parameter's name maps it.
     * Every parameter the pack declares must match one (a parameter that shares another's storage, a
     * tied head, is not written: ct_param_registry's shared parameters). */
    const ct_hf_name *names;
    /* ended by an element whose key is NULL; "architectures", "model_type" and "torch_dtype" are the
     * host's. No key twice, and none both a value and a nesting object. */
    const ct_hf_field *fields;
} ct_hf_export;

/* ABI 2.15: one ct_builder.moe call site's load over a step. Frozen: this element never grows. */
typedef struct ct_moe_load {
    const char *router;   /* the call's router weight name ("layers.3.moe.router.gate.weight") */
    int64_t n_experts;
    /* (n_experts) floats in device memory: the (token, slot) pairs routed to each expert over the
     * step's microbatches, summed over the data-parallel ranks and over
     * the axes that split a sequence's rows (tp under sequence parallel, cp); zeroed by the host after post_step */
    const float *counts;
} ct_moe_load;

struct ct_device_api;
typedef struct ct_model_step {
    size_t struct_size;
    int64_t step;                    /* the step just taken, from 1 */
    const struct ct_device_api *api; /* the device the counts (and the pack's tensors) live on */
    ct_device *dev;
    int n_moe;                       /* this rank's ct_builder.moe call sites, in forward order */
    const ct_moe_load *moe;          /* n_moe elements; valid during the call */
} ct_model_step;

/* ABI 2.16: how a Hugging Face config.json becomes this pack's options, as data, so the host creates the
 * model from a folder without knowing it (`ctitan convert --from hf`, model.flavor: from_checkpoint of
 * a folder with checkpoint.initial_load_in_hf). The host picks the pack whose model_type is the
 * folder's, sets each linked option from config.json, creates the instance (the pack's own checks
 * apply), then reads the tensors by its hf_export table, whose CT_HF_CHECKED fields the folder must
 * hold. RoPE is read as transformers writes it in either version: a folder's rope_parameters (5) is
 * seen as rope_scaling (4) with rope_type (or "type"), and rope_theta as the top-level key; the host
 * refuses a rope_type other than "default" and the frequency-band type (model.h's ct_model_desc
 * rope_* fields), filling that type's keys transformers defaults (low_freq_factor 1, high_freq_factor
 * 4, original_max_position_embeddings from max_position_embeddings). */

/* The key may be absent (after fallback and dflt): the option is then left unset. */
#define CT_HF_OPTIONAL 0x1u

/* Frozen: this element never grows (a later minor that needs more adds a new array). */
typedef struct ct_hf_option {
    const char *key;      /* config.json's key; a '.' nests ("rope_scaling.factor"); NULL ends the array */
    const char *option;   /* the pack's option it sets ("dim"), one of those it declared */
    const char *fallback; /* NULL, or the key read when `key` is absent (LlamaConfig's num_key_value_heads
                             defaults to num_attention_heads) */
    const char *dflt;     /* NULL, or the value when both are absent, as a manifest writes it ("1e-6") */
    uint32_t flags;       /* CT_HF_OPTIONAL */
} ct_hf_option;

typedef struct ct_hf_import {
    size_t struct_size;
    const char *model_type; /* the config.json model_type this pack runs ("llama") */
    /* the options the folder sets, ended by an element whose key is NULL; the host checks each value's
     * JSON type against the option's (a positive integer for CT_OPT_INT). A JSON null is an absent key. */
    const ct_hf_option *options;
    /* ABI 2.18, optional: NULL, or a NULL-terminated list of the further model_types this pack runs
     * from the same options (qwen3's "qwen3_moe" beside "qwen3"); a link whose key one model_type's
     * folders lack is CT_HF_OPTIONAL. The instance's hf_export names the model_type a folder must have. */
    const char *const *more_model_types;
} ct_hf_import;

/* ABI 2.20: a pack's state beside its parameters, never trained (DeepSeek-V3's expert bias, which the pack
 * moves in post_step): f32 vectors in host memory that the pack owns. The host saves each in checkpoints
 * (the pipeline stage holding `unit` writes it; every other rank's copy is the same or unused), restores it
 * when a checkpoint or model file is loaded, and maps it through hf_export's names like a parameter
 * (checkpoint.initial_load_in_hf and last_save_in_hf, `ctitan convert`). A buffer is never sharded,
 * differentiated or seen by the optimizer; the pack keeps the copies on the data-parallel ranks equal (an
 * update from the step's global counts does). Frozen: this element never grows. */
typedef struct ct_model_buffer {
    const char *name; /* a name no parameter has ("layers.3.moe.expert_bias"); valid until destroy */
    int unit;         /* the unit that computes with it */
    int64_t numel;    /* a 1-D tensor of numel f32 */
    float *data;      /* host memory, the pack's until destroy; the host reads it to save, writes it to load */
} ct_model_buffer;

typedef struct ct_model_api {
    size_t struct_size;
    const char *const *flavors; /* NULL-terminated list of flavor names; static, valid until unload */
    /* Reads the pack's own options (model.* keys it declared) through `host`. An unknown flavor is
     * CT_ERR_INVALID with a message listing the known ones. */
    ct_status (*create)(const ct_host *host, const ct_model_config *cfg, ct_model **model);
    void (*destroy)(ct_model *model);
    ct_status (*describe)(ct_model *model, ct_model_desc *out);
    ct_status (*declare_params)(ct_model *model, ct_param_registry *reg);
    /* A short name for a unit, for logs, plans and traces ("tok_embeddings", "layers.3", "output"). The
     * string is the model's and stays valid and unchanged until destroy: the host keeps the pointer
     * (the trace does) and may hold several at once. */
    const char *(*unit_name)(ct_model *model, int unit);
    /* Forward of one unit.
     *   x:       the previous unit's output (NULL for unit 0)
     *   tokens:  (B, T) int32 input ids (every unit sees them)
     *   targets: (B, T) int32 or NULL. The last unit returns the summed loss (scalar) when targets
     *            are given and the logits (B, T, V) when they are NULL.
     * *out receives the unit's output tensor. */
    ct_status (*unit_forward)(ct_model *model, int unit, ct_builder *b, ct_tensor *x,
                              const ct_tensor *tokens, const ct_tensor *targets, ct_tensor **out);
    /* Optional: the tensor-parallel plan, ended by a rule whose pattern is NULL; the first rule
     * matching a parameter's name gives its style; a parameter no rule matches is replicated. NULL: the
     * pack cannot be split over tp. Static: valid while the plugin is loaded. A replicated parameter
     * must meet replicated activations only (its gradient is then whole on every rank): plugins/tp
     * refuses, naming it, one that meets activations split over tp without a style that sums its
     * gradient (CT_TP_SEQUENCE_PARALLEL under SP, CT_TP_REPLICATED_PARTIAL), or one whose style sums
     * a gradient that is already whole. */
    const ct_tp_rule *tp_plan;
    /* ABI 2.1, optional: this instance's plan (it may depend on the pack's options), in the same form;
     * when set it is used instead of tp_plan. NULL return: the instance cannot be split over tp. The
     * array is the model's and stays valid until destroy. */
    const ct_tp_rule *(*get_tp_plan)(ct_model *model);
    /* ABI 2.12, optional: this instance's Hugging Face export (ct_hf_export above); the host sets
     * out->struct_size. Every pointer it fills is the model's, valid until destroy. NULL: the pack
     * has no Hugging Face form (checkpoint.last_save_in_hf and initial_load_in_hf refuse it, naming
     * the pack). */
    ct_status (*hf_export)(ct_model *model, ct_hf_export *out);
    /* ABI 2.15, optional: called on every rank after each optimizer step (after the strategies'
     * post_step), with what the step routed (ct_model_step). A pack updates its own state here
     * (DeepSeek-V3's expert bias from the token counts). */
    ct_status (*post_step)(ct_model *model, const struct ct_model_step *step);
    /* ABI 2.16, optional: how a Hugging Face folder's config.json becomes this pack's options
     * (ct_hf_import above); static, valid while the plugin is loaded. NULL: the host cannot create
     * the pack from a folder (a manifest that sets its options can still load one with
     * checkpoint.initial_load_in_hf). Needs hf_export. */
    const ct_hf_import *hf_import;
    /* ABI 2.20, optional: the instance's buffers (ct_model_buffer above): *out their array, the model's,
     * valid until destroy, in a fixed order; returns how many (0: none). NULL: the pack has none. */
    int (*buffers)(ct_model *model, const ct_model_buffer **out);
} ct_model_api;

#endif
