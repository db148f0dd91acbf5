/* tape.h: builder ops (recorded) and backward replay. See tape.c. */
#ifndef CT_TAPE_H
#define CT_TAPE_H

#include "runtime.h"

typedef enum op_kind {
    OP_LINEAR, OP_BIAS, OP_EMBEDDING, OP_RMSNORM, OP_LAYERNORM, OP_ROPE, OP_ATTENTION,
    OP_SWIGLU, OP_GELU, OP_ADD, OP_CROSS_ENTROPY,
    /* tensor parallel: collectives over the tp group, each with its conjugate in backward */
    OP_TP_GATHER_ROWS,        /* all-gather token rows        | backward: reduce-scatter */
    OP_TP_REDUCE_SCATTER_ROWS, /* reduce-scatter token rows   | backward: all-gather */
    OP_TP_COPY,               /* identity                     | backward: all-reduce */
    OP_TP_ALL_REDUCE,         /* all-reduce                   | backward: identity */
    OP_TP_GATHER_COLS         /* all-gather the last dim      | backward: this rank's columns */
} op_kind;

/* Which halves of the backward to run: input gradients, weight gradients, or both. */
#define TAPE_INPUT 1
#define TAPE_WEIGHT 2
#define TAPE_BOTH 3

/* Fills rt->builder with the ops. */
void tape_builder_init(runtime *rt);
/* A fresh activation tensor in the arena the builder currently writes to. */
rt_tensor *tape_new_activation(runtime *rt, ct_dtype dt, int ndim, const int64_t *shape);
/* t's gradient buffer (allocated zeroed in the grads arena on first use). */
float *tape_grad(runtime *rt, rt_tensor *t);
/* Prints whether the quantizer converts the weight `name`. */
void quant_note(runtime *rt, const char *name, int yes, const char *why);
/* Vocabulary-sharded logits (tensor parallel) -> every column, on every tp rank. */
rt_tensor *tape_tp_gather_cols(runtime *rt, rt_tensor *logits);
/* Replays entries from `tail` back to the first, accumulating gradients. */
int tape_backward(runtime *rt, tape_entry *tail, int halves);

#endif
