/* ops.c: the builder tensor parallel wraps. Each op looks at its weight's style and puts the
 * collectives that style implies around the next builder's op, so the pack's forward stays the
 * single-device one:
 *
 *   column-wise   every token row in (all-gather under sequence parallel, Megatron's f without it),
 *                 this rank's output features out
 *   row-wise      this rank's input features in; the partial sums reduced (reduce-scatter of the
 *                 token rows under sequence parallel, Megatron's g without it)
 *   embedding     this rank's vocabulary rows (a ranged lookup), the rest summed in as row-wise
 *   output        column-wise into vocabulary-sharded logits: the loss computed sharded (loss
 *                 parallel) or the columns gathered first
 *
 * The bias op is not wrapped: a column-wise linear's bias is split with its output features, so the
 * host's op adds the local block to the local columns; a row-wise linear's is whole and is added
 * to the reduced output (tp.c sums its gradient under sequence parallel).
 *
 * On the planner's builder (next->planning) the same ops run on shapes only: they call only the
 * next builder's ops, collectives, memo and custom (whose plan then runs instead of forward), never
 * the device or the comm, and read no data.
 */
#include "tp.h"

#include <string.h>

#define TP(b) ((tp *)(b)->ctx)

/* notes on activations (ct_builder.memo): x's rows gathered by async TP's fused op (the other
 * column-wise linears reading x reuse them), and logits left sharded for the loss */
static char gathered_key, sharded_logits_key;

static int quantized(const ct_tensor *w) { return (w->flags & CT_TENSOR_QUANTIZED) != 0; }

/* x with every token row (sequence parallel) or its f copy: the host makes each once per x. */
static ct_tensor *rows_in(tp *t, ct_tensor *x) {
    ct_builder *n = t->next;
    return n->collective(n, t->sequence_parallel ? CT_COLL_ALL_GATHER : CT_COLL_COPY, x, CT_AXIS_TP, CT_DIM_ROWS);
}

static ct_tensor *linear_colwise(tp *t, ct_tensor *x, ct_tensor *w, ct_tp_style style) {
    ct_builder *n = t->next;
    ct_tensor *y, *X = n->memo(n, x, &gathered_key, NULL);
    if (!X && t->sequence_parallel && t->async_chunks > 0 && !quantized(w)) {
        y = tp_gather_linear(t, n, x, w, &X);
        if (!y || !n->memo(n, x, &gathered_key, X)) return NULL;
    } else {
        if (!X && !(X = rows_in(t, x))) return NULL;
        y = n->linear(n, X, w);
    }
    if (!y || style == CT_TP_COLWISE) return y;
    if (!t->loss_parallel) /* every column, for a loss computed whole on every rank */
        return n->collective(n, CT_COLL_ALL_GATHER_SLICE, y, CT_AXIS_TP, CT_DIM_COLS);
    return n->memo(n, y, &sharded_logits_key, y);
}

static ct_tensor *linear_rowwise(tp *t, ct_tensor *x, ct_tensor *w) {
    ct_builder *n = t->next;
    if (t->sequence_parallel && t->async_chunks > 0 && !quantized(w)) return tp_linear_reduce_scatter(t, n, x, w);
    ct_tensor *y = n->linear(n, x, w);
    if (!y) return NULL;
    return n->collective(n, t->sequence_parallel ? CT_COLL_REDUCE_SCATTER : CT_COLL_ALL_REDUCE, y, CT_AXIS_TP,
                         CT_DIM_ROWS);
}

static ct_tensor *tp_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) {
    tp *t = TP(b);
    ct_tp_style style = tp_style_of(t, w);
    switch (style) {
    case CT_TP_COLWISE:
    case CT_TP_OUTPUT_COLWISE: return linear_colwise(t, x, w, style);
    case CT_TP_ROWWISE: return linear_rowwise(t, x, w);
    default: return t->next->linear(t->next, x, w);
    }
}

static ct_tensor *tp_embedding(ct_builder *b, const ct_tensor *ids, ct_tensor *table) {
    tp *t = TP(b);
    ct_builder *n = t->next;
    if (tp_style_of(t, table) != CT_TP_EMBED_ROWWISE) return n->embedding(n, ids, table);
    ct_tensor *y = tp_embedding_ranged(t, n, ids, table); /* this rank's vocabulary rows; the rest are summed in */
    if (!y) return NULL;
    return n->collective(n, t->sequence_parallel ? CT_COLL_REDUCE_SCATTER : CT_COLL_ALL_REDUCE, y, CT_AXIS_TP,
                         CT_DIM_ROWS);
}

static ct_tensor *tp_cross_entropy(ct_builder *b, ct_tensor *logits, const ct_tensor *targets) {
    tp *t = TP(b);
    ct_builder *n = t->next;
    if (n->memo(n, logits, &sharded_logits_key, NULL)) return tp_cross_entropy_sharded(t, n, logits, targets);
    return n->cross_entropy(n, logits, targets);
}

/* ABI 2.5: the output head and its loss. Under bf16 compute with loss parallel, one op over
 * vocabulary-sharded logits in blocks of rows; otherwise (f32, which stays bit for bit what it was;
 * a weight the quantizer converts, or has not yet been asked about) the two ops above. */
static ct_tensor *tp_linear_cross_entropy(ct_builder *b, ct_tensor *x, ct_tensor *w, const ct_tensor *targets) {
    tp *t = TP(b);
    ct_builder *n = t->next;
    int plain = (!t->env.has_quantizer || ((w->flags & CT_TENSOR_QUANT_DECIDED) && !quantized(w)));
    if (!t->env.bf16_compute || !t->loss_parallel || tp_style_of(t, w) != CT_TP_OUTPUT_COLWISE || !plain) {
        ct_tensor *y = tp_linear(b, x, w);
        return y ? tp_cross_entropy(b, y, targets) : NULL;
    }
    ct_tensor *X = n->memo(n, x, &gathered_key, NULL);
    if (!X && !(X = rows_in(t, x))) return NULL;
    return tp_linear_cross_entropy_sharded(t, n, X, w, targets);
}

/* The model's output without targets: under loss parallel the vocabulary-sharded logits. */
static ct_tensor *tp_finish_output(ct_builder *b, ct_tensor *x) {
    tp *t = TP(b);
    ct_builder *n = t->next;
    if (t->loss_parallel && t->output_rows > 0 && x && x->ndim >= 2 && x->shape[x->ndim - 1] == t->output_rows &&
        !(x = n->collective(n, CT_COLL_ALL_GATHER_SLICE, x, CT_AXIS_TP, CT_DIM_COLS)))
        return NULL;
    return n->finish_output(n, x);
}

void tp_builder_init(tp *t, ct_builder *next, ct_builder *out) {
    t->next = next;
    out->ctx = t; /* every other op already forwards to next */
    out->linear = tp_linear;
    out->embedding = tp_embedding;
    out->cross_entropy = tp_cross_entropy;
    out->finish_output = tp_finish_output;
    if (CT_HAS_FIELD(out, ct_builder, linear_cross_entropy)) out->linear_cross_entropy = tp_linear_cross_entropy;
}
