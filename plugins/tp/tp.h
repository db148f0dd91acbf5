/* tp.h: the tensor-parallel strategy's state, shared by its files.
 *
 *   tp.c     the plugin: options, start-up checks, placement from the model's plan, hooks
 *   ops.c    the builder it wraps: linear, embedding and cross entropy by each weight's style; the
 *            replicated weights' check (no partial gradient left unsummed)
 *   custom.c its custom ops: the vocabulary-ranged embedding, loss parallel, async TP's overlapped
 *            all-gather + matmul and matmul + reduce-scatter
 */
#ifndef CT_TP_PLUGIN_H
#define CT_TP_PLUGIN_H

#include "ctitan/strategy.h"

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    ct_mesh_info mesh;
    int size, rank;        /* the tp axis: degree, this rank's coordinate */
    ct_comm_group *group;
    int sequence_parallel; /* the residual stream holds 1/size of the token rows */
    int loss_parallel;     /* cross entropy on vocabulary-sharded logits */
    int async_chunks;      /* > 0: all-gather/matmul and matmul/reduce-scatter overlapped in chunks */
    ct_param_slot *slots;
    int n_slots;
    /* each parameter's style, found by its tensor's address (open addressing, power-of-two size) */
    const ct_tensor **style_key;
    unsigned char *style_val;
    size_t style_cap;
    int64_t output_rows;   /* this rank's rows of the output-colwise weight (its logits' columns); 0: none */
    int last;              /* the microbatch whose backward just ran is the step's last */
    ct_builder *next;      /* the builder this one wraps (the host's) */
} tp;

/* 1 on the planner's builder (ABI 2.2): ops run on shapes only, no device, no comm, no data. */
static inline int tp_planning(const ct_builder *b) { return CT_HAS_FIELD(b, ct_builder, planning) && b->planning; }

/* The style the plan gave parameter tensor w (CT_TP_NONE for activations and unplanned weights). */
ct_tp_style tp_style_of(const tp *t, const ct_tensor *w);

/* 1 if w's gradient is summed over tp after the step's backward (tp.c's finish_backward): a norm
 * or a row-wise bias under sequence parallel, a CT_TP_REPLICATED_PARTIAL weight always. */
int tp_grad_summed(const tp *t, const ct_tensor *w);

/* Replaces out's linear, embedding, cross entropy and finish_output, and wraps the other ops to
 * follow which activations are split over tp (ops.c). */
void tp_builder_init(tp *t, ct_builder *next, ct_builder *out);

/* A blocking or started collective over the tp group, timed, traced and reported to the host as
 * time blocked on the tp axis (custom.c). kind: 'g' all-gather, 's' reduce-scatter, 'r' all-reduce;
 * req NULL: blocking. */
int tp_comm(tp *t, ct_builder *b, int backward, char kind, const float *send, float *recv, int64_t count,
            ct_comm_request **req);
int tp_wait(tp *t, ct_builder *b, int backward, ct_comm_request *req);

/* Custom ops (custom.c); each returns its first output or NULL with the error set. */
ct_tensor *tp_embedding_ranged(tp *t, ct_builder *b, const ct_tensor *ids, ct_tensor *table);
ct_tensor *tp_cross_entropy_sharded(tp *t, ct_builder *b, ct_tensor *logits, const ct_tensor *targets);
/* The output head and its loss in one custom op under loss parallel, in blocks of rows (bf16 compute). */
ct_tensor *tp_linear_cross_entropy_sharded(tp *t, ct_builder *b, ct_tensor *X, ct_tensor *w, const ct_tensor *targets);
/* Async TP, column-wise: every rank's rows of x gathered in chunks, each chunk's matmul overlapping the
 * next chunk's gather. *gathered receives x with every row (shared by the next column-wise linears). */
ct_tensor *tp_gather_linear(tp *t, ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor **gathered);
/* Async TP, row-wise: the matmul in chunks of every rank's rows, each chunk's reduce-scatter
 * overlapping the next chunk's matmul. */
ct_tensor *tp_linear_reduce_scatter(tp *t, ct_builder *b, ct_tensor *x, ct_tensor *w);

#endif
