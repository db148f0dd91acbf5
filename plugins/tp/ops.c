/* ops.c: the builder tensor parallel wraps. Each op looks at its weight's style and puts the
 * collectives that style implies around the next builder's op, so the pack's forward stays the
 * single-device one:
 *
 *   column-wise   every token row in (all-gather under sequence parallel, Megatron's f without it),
 *                 this rank's output features out
 *   replicated    (CT_TP_REPLICATED_PARTIAL on the stream: MLA's wq_a, wkv_a) every token row in, as
 *   partial       column-wise, the whole weight, an output whose gradient is partial (AT_PARTIAL)
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
 * Every other op is wrapped only to follow which activations are split over tp (by features after a
 * column-wise linear, by token rows under sequence parallel), so that a weight the plan leaves whole
 * is refused, by name, where it would get a partial gradient that nothing sums (check_weight).
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

/* ---- where each activation stands over tp, so that no replicated weight gets a partial gradient ----
 * An activation is split by features (a column-wise linear's output, and what is computed from it
 * until a row-wise linear reduces it: memo split_key), whole on every rank (gathered or reduced:
 * memo whole_key), or unmarked: the residual stream's state, its token rows split under sequence
 * parallel and whole without. A view of a parameter carries its parameter (memo param_key). */
static char split_key, whole_key, param_key, partial_key;
/* AT_PARTIAL: every token row, the same values on every rank, computed by a replicated linear from the
 * gathered rows (MLA's low-rank wq_a and wkv_a) for the head-split weights after it: its gradient is
 * partial on each rank (each has its heads' share), summed by the gather's backward (memo partial_key). */
enum { AT_STREAM, AT_WHOLE, AT_SPLIT, AT_PARTIAL };

static int state_of(tp *t, ct_tensor *x) {
    ct_builder *n = t->next;
    if (!x) return AT_WHOLE;
    if (n->memo(n, x, &split_key, NULL)) return AT_SPLIT;
    if (n->memo(n, x, &partial_key, NULL)) return AT_PARTIAL;
    return n->memo(n, x, &whole_key, NULL) ? AT_WHOLE : AT_STREAM;
}

/* The parameter w is (itself, or the one a view of it was made from), or NULL for an activation. */
static ct_tensor *param_of(tp *t, ct_tensor *w) {
    if (!w) return NULL;
    if (w->flags & CT_TENSOR_PARAM) return w;
    return t->next->memo(t->next, w, &param_key, NULL);
}

/* y computed from the activations in[]: split if one of them is, else partial if one of them is, whole if
 * all are. NULL when the note cannot be kept (out of memory, error set). */
static ct_tensor *follow(tp *t, ct_tensor *y, ct_tensor *const *in, int n_in) {
    ct_builder *n = t->next;
    int split = 0, partial = 0, whole = 1, acts = 0;
    for (int i = 0; y && i < n_in; i++) {
        if (!in[i] || param_of(t, in[i])) continue;
        int st = state_of(t, in[i]);
        acts++;
        split |= st == AT_SPLIT;
        partial |= st == AT_PARTIAL;
        whole &= st == AT_WHOLE;
    }
    if (!y || (!split && !partial && !(whole && acts))) return y;
    return n->memo(n, y, split ? &split_key : partial ? &partial_key : &whole_key, y);
}

static const char *style_name(ct_tp_style st) {
    switch (st) {
    case CT_TP_SEQUENCE_PARALLEL: return "CT_TP_SEQUENCE_PARALLEL";
    case CT_TP_REPLICATED_PARTIAL: return "CT_TP_REPLICATED_PARTIAL";
    case CT_TP_ROWWISE: return "CT_TP_ROWWISE";
    default: return "none";
    }
}

/* A weight the plan does not split must get a whole gradient on every rank after tp.c's sums: it
 * meets activations split over tp exactly when its style has its gradient summed over tp. op applies
 * weight w to the activations in[]. CT_OK, or CT_ERR_INVALID naming the parameter. */
static ct_status check_weight(tp *t, const char *op, ct_tensor *w, ct_tensor *const *in, int n_in) {
    ct_tensor *p = param_of(t, w);
    if (!p || t->size == 1) return CT_OK;
    ct_tp_style st = tp_style_of(t, p);
    if (st == CT_TP_COLWISE || st == CT_TP_OUTPUT_COLWISE || st == CT_TP_EMBED_ROWWISE ||
        (st == CT_TP_ROWWISE && p->ndim > 1))
        return CT_OK; /* split with the activations it meets */
    int split = 0, partial = 0, rows = 0;
    for (int i = 0; i < n_in; i++) {
        if (!in[i] || param_of(t, in[i])) continue;
        int at = state_of(t, in[i]);
        split |= at == AT_SPLIT;
        partial |= at == AT_PARTIAL;
        rows |= at == AT_STREAM && t->sequence_parallel;
    }
    int summed = tp_grad_summed(t, p);
    if (summed == (split || partial || rows)) return CT_OK;
    if (!summed)
        t->host->set_error(t->host,
                           "tensor parallel: %s applies parameter '%s' (tp style %s) to activations split over tp "
                           "(%s): its gradient would be partial on each rank; give it CT_TP_REPLICATED_PARTIAL in the "
                           "model's tp_plan (torchtitan's SequenceParallel(sequence_dim=2)), which sums it over tp",
                           op, p->name ? p->name : "?", style_name(st),
                           split     ? "by features, after a column-wise linear"
                           : partial ? "a gradient partial over the head-split weights they feed"
                                     : "by token rows, sequence parallel");
    else
        t->host->set_error(t->host,
                           "tensor parallel: %s applies parameter '%s' (tp style %s, whose gradient is summed over tp) "
                           "to activations whole on every rank: the sum would count its gradient %d times; it needs "
                           "no rule there",
                           op, p->name ? p->name : "?", style_name(st), t->size);
    return CT_ERR_INVALID;
}

static int quantized(const ct_tensor *w) { return (w->flags & CT_TENSOR_QUANTIZED) != 0; }

/* x with every token row (sequence parallel) or its f copy: the host makes each once per x. */
static ct_tensor *rows_in(tp *t, ct_tensor *x) {
    ct_builder *n = t->next;
    ct_tensor *X = n->collective(n, t->sequence_parallel ? CT_COLL_ALL_GATHER : CT_COLL_COPY, x, CT_AXIS_TP, CT_DIM_ROWS);
    return X ? n->memo(n, X, &whole_key, X) : NULL;
}

static ct_tensor *linear_colwise(tp *t, ct_tensor *x, ct_tensor *w, ct_tp_style style) {
    ct_builder *n = t->next;
    ct_tensor *y, *X = n->memo(n, x, &gathered_key, NULL);
    if (state_of(t, x) == AT_PARTIAL) X = x; /* every row already, its gradient summed behind it */
    if (!X && t->sequence_parallel && t->async_chunks > 0 && !quantized(w)) {
        y = tp_gather_linear(t, n, x, w, &X);
        if (!y || !n->memo(n, x, &gathered_key, X)) return NULL;
    } else {
        if (!X && !(X = rows_in(t, x))) return NULL;
        y = n->linear(n, X, w);
    }
    if (!y) return NULL;
    if (style == CT_TP_COLWISE) return n->memo(n, y, &split_key, y);
    if (!t->loss_parallel) { /* every column, for a loss computed whole on every rank */
        ct_tensor *Y = n->collective(n, CT_COLL_ALL_GATHER_SLICE, y, CT_AXIS_TP, CT_DIM_COLS);
        return Y ? n->memo(n, Y, &whole_key, Y) : NULL;
    }
    return n->memo(n, y, &sharded_logits_key, y) ? n->memo(n, y, &split_key, y) : NULL;
}

static ct_tensor *linear_rowwise(tp *t, ct_tensor *x, ct_tensor *w) {
    ct_builder *n = t->next;
    if (t->sequence_parallel && t->async_chunks > 0 && !quantized(w)) return tp_linear_reduce_scatter(t, n, x, w);
    ct_tensor *y = n->linear(n, x, w);
    if (!y) return NULL;
    return n->collective(n, t->sequence_parallel ? CT_COLL_REDUCE_SCATTER : CT_COLL_ALL_REDUCE, y, CT_AXIS_TP,
                         CT_DIM_ROWS);
}

/* A CT_TP_REPLICATED_PARTIAL matrix on the residual stream (MLA's wq_a, wkv_a, torchtitan's NoParallel
 * after the attention's Replicate input): the whole weight on every token row, gathered as a column-wise
 * linear gathers them (the same collective: the host makes one per x), for the head-split weights after
 * it. The output is partial (AT_PARTIAL); the weight's gradient is summed over tp (tp.c). */
static ct_tensor *linear_replicated(tp *t, ct_tensor *x, ct_tensor *w) {
    ct_builder *n = t->next;
    ct_tensor *y, *X = n->memo(n, x, &gathered_key, NULL);
    if (!X && !(X = rows_in(t, x))) return NULL;
    if (!(y = n->linear(n, X, w))) return NULL;
    return n->memo(n, y, &partial_key, y);
}

static ct_tensor *tp_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) {
    tp *t = TP(b);
    ct_tp_style style = tp_style_of(t, w);
    switch (style) {
    case CT_TP_COLWISE:
    case CT_TP_OUTPUT_COLWISE: return linear_colwise(t, x, w, style);
    case CT_TP_ROWWISE: return linear_rowwise(t, x, w);
    case CT_TP_REPLICATED_PARTIAL:
        /* on activations already split or partial: an ordinary replicated linear */
        if (w->ndim == 2 && t->size > 1 && state_of(t, x) == AT_STREAM) return linear_replicated(t, x, w);
        /* fall through */
    default:
        if (check_weight(t, "linear", w, &x, 1) != CT_OK) return NULL;
        return follow(t, t->next->linear(t->next, x, w), &x, 1);
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
    if (check_weight(t, "linear_cross_entropy", w, &x, 1) != CT_OK) return NULL;
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

/* The ops that only carry a split through (and check the replicated weights they apply). */
static ct_tensor *tp_bias(ct_builder *b, ct_tensor *x, ct_tensor *bias) {
    tp *t = TP(b);
    if (check_weight(t, "bias", bias, &x, 1) != CT_OK) return NULL;
    return follow(t, t->next->bias(t->next, x, bias), &x, 1);
}
static ct_tensor *tp_rmsnorm(ct_builder *b, ct_tensor *x, ct_tensor *w, float eps) {
    tp *t = TP(b);
    if (check_weight(t, "rmsnorm", w, &x, 1) != CT_OK) return NULL;
    return follow(t, t->next->rmsnorm(t->next, x, w, eps), &x, 1);
}
static ct_tensor *tp_layernorm(ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor *bias, float eps) {
    tp *t = TP(b);
    if (check_weight(t, "layernorm", w, &x, 1) != CT_OK || check_weight(t, "layernorm", bias, &x, 1) != CT_OK)
        return NULL;
    return follow(t, t->next->layernorm(t->next, x, w, bias, eps), &x, 1);
}
static ct_tensor *tp_rope(ct_builder *b, ct_tensor *x, float theta) {
    tp *t = TP(b);
    return follow(t, t->next->rope(t->next, x, theta), &x, 1);
}
static ct_tensor *tp_rope_freqs(ct_builder *b, ct_tensor *x, const float *inv_freq) {
    tp *t = TP(b);
    return follow(t, t->next->rope_freqs(t->next, x, inv_freq), &x, 1);
}
static ct_tensor *tp_attention(ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v) {
    tp *t = TP(b);
    ct_tensor *in[3] = {q, k, v};
    return follow(t, t->next->attention(t->next, q, k, v), in, 3);
}
static ct_tensor *tp_swiglu(ct_builder *b, ct_tensor *a, ct_tensor *g) {
    tp *t = TP(b);
    ct_tensor *in[2] = {a, g};
    return follow(t, t->next->swiglu(t->next, a, g), in, 2);
}
static ct_tensor *tp_gelu(ct_builder *b, ct_tensor *x) {
    tp *t = TP(b);
    return follow(t, t->next->gelu(t->next, x), &x, 1);
}
static ct_tensor *tp_add(ct_builder *b, ct_tensor *x, ct_tensor *y) {
    tp *t = TP(b);
    ct_tensor *in[2] = {x, y};
    return follow(t, t->next->add(t->next, x, y), in, 2);
}
/* ABI 2.15: a MoE layer keeps its input's rows (its router and experts are whole: CT_TP_SEQUENCE_PARALLEL in the
 * plan, so their gradients are summed over tp under sequence parallel). */
static ct_tensor *tp_moe(ct_builder *b, ct_tensor *x, const ct_moe_layer *layer) {
    tp *t = TP(b);
    return follow(t, t->next->moe(t->next, x, layer), &x, 1);
}
/* A unit's own loss (ABI 2.15) keeps its input's layout; under sequence parallel the host's MoE
 * balance loss is already this rank's share of the statistic over every rank's rows. */
static ct_tensor *tp_aux_loss(ct_builder *b, ct_tensor *x, ct_tensor *loss) {
    tp *t = TP(b);
    ct_builder *n = t->next;
    return follow(t, n->aux_loss(n, x, loss), &x, 1);
}
/* A view of a parameter is that parameter to check_weight; a view of an activation stands where it does. */
static ct_tensor *tp_view(ct_builder *b, ct_tensor *x, int ndim, const int64_t *shape) {
    tp *t = TP(b);
    ct_builder *n = t->next;
    ct_tensor *v = n->view(n, x, ndim, shape), *p = param_of(t, x);
    if (!v) return NULL;
    return p ? n->memo(n, v, &param_key, p) : follow(t, v, &x, 1);
}
/* The pack's own collectives: over tp, a gather or a sum leaves every rank whole. */
static ct_tensor *tp_collective(ct_builder *b, ct_collective kind, ct_tensor *x, int axis, int dim) {
    tp *t = TP(b);
    ct_builder *n = t->next;
    ct_tensor *y = n->collective(n, kind, x, axis, dim);
    if (!y || axis != CT_AXIS_TP) return follow(t, y, &x, 1);
    int whole = kind == CT_COLL_ALL_GATHER || kind == CT_COLL_ALL_GATHER_SLICE || kind == CT_COLL_ALL_REDUCE;
    return whole ? n->memo(n, y, &whole_key, y) : y;
}
/* A pack's custom op: its parameters are checked against its activations, and its outputs follow them. */
static ct_status tp_custom(ct_builder *b, const struct ct_custom_op *op, const void *state, size_t state_bytes,
                           ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    tp *t = TP(b);
    for (int i = 0; i < n_in; i++)
        if (param_of(t, in[i]) && check_weight(t, "a custom op", in[i], in, n_in) != CT_OK) return CT_ERR_INVALID;
    ct_status st = t->next->custom(t->next, op, state, state_bytes, in, n_in, out, n_out);
    for (int i = 0; st == CT_OK && i < n_out; i++)
        if (out[i] && !follow(t, out[i], in, n_in)) st = CT_ERR_NOMEM;
    return st;
}

void tp_builder_init(tp *t, ct_builder *next, ct_builder *out) {
    t->next = next;
    out->ctx = t; /* every other op already forwards to next */
    out->bias = tp_bias;
    out->rmsnorm = tp_rmsnorm;
    out->layernorm = tp_layernorm;
    out->rope = tp_rope;
    out->attention = tp_attention;
    out->swiglu = tp_swiglu;
    out->gelu = tp_gelu;
    out->add = tp_add;
    out->view = tp_view;
    out->collective = tp_collective;
    out->custom = tp_custom;
    if (CT_HAS_FIELD(out, ct_builder, rope_freqs)) out->rope_freqs = tp_rope_freqs;
    out->linear = tp_linear;
    out->embedding = tp_embedding;
    out->cross_entropy = tp_cross_entropy;
    out->finish_output = tp_finish_output;
    if (CT_HAS_FIELD(out, ct_builder, linear_cross_entropy)) out->linear_cross_entropy = tp_linear_cross_entropy;
    if (CT_HAS_FIELD(next, ct_builder, aux_loss) && next->moe && next->aux_loss) {
        out->moe = tp_moe;
        out->aux_loss = tp_aux_loss;
    }
}
