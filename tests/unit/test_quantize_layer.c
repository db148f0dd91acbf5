/* test_quantize_layer.c: the quantizer enters the run as the innermost layer of the builder chain
 * (core/engine/quantize.c), not inside the tape's ops:
 *   - the layer sits right above the host's builder, the first of the runtime's layers;
 *   - through it a training step runs the quantizer's GEMMs exactly for the weights it converts: one
 *     forward, one input-gradient and one weight-gradient call per converted linear (the float8
 *     plugin's, counted by a table that forwards to it), none for the head it leaves alone; the MoE
 *     experts' three grouped GEMMs per layer where it converts the experts, and no 2-D GEMM then;
 *   - where it converts nothing, the step (loss and every gradient) is bit for bit the step without a
 *     quantizer, under bf16 compute too, where the head's loss is the host's fused op.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/tape.h"
#include "session_fixture.h"

static const char *llama_fmt =
    "device: {name: cpu, threads: 2}\n"
    "model: {name: llama3, flavor: debugmodel, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2,\n"
    "        vocab_size: 256, ffn_hidden: 192}\n"
    "optimizer: {name: AdamW}\n"
    "training: {seq_len: 64, local_batch_size: 2, seed: 7, mixed_precision_param: %s}\n"
    "activation_checkpoint: {mode: none}\n" /* no recompute: each GEMM runs once */
    "%s";

static const char *moe_yaml =
    "device: {name: cpu, threads: 2}\n"
    "model: {name: qwen3, flavor: debugmodel_moe, dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 16,\n"
    "        vocab_size: 256, n_experts: 8, top_k: 2, moe_hidden: 16, tie_word_embeddings: false,\n"
    "        moe_force_load_balance: true}\n"
    "optimizer: {name: AdamW}\n"
    "training: {seq_len: 64, local_batch_size: 2, seed: 7}\n"
    "activation_checkpoint: {mode: none}\n"
    "quantize: {dense: {float8: {enable: true, linears: false, grouped_mm_fqns: experts}}}\n";

/* ---- a quantizer table that counts the calls and forwards them to the plugin's ---- */

static const ct_quantizer_api *real;
static int n_fwd, n_bwd_in, n_bwd_w, n_gfwd, n_gbwd_in, n_gbwd_w;

static ct_status c_forward(ct_quantizer *q, float *y, const float *x, const float *w, int64_t n, int64_t o, int64_t i) {
    n_fwd++;
    return real->forward(q, y, x, w, n, o, i);
}
static ct_status c_bwd_in(ct_quantizer *q, float *dx, const float *dy, const float *w, int64_t n, int64_t o, int64_t i) {
    n_bwd_in++;
    return real->backward_input(q, dx, dy, w, n, o, i);
}
static ct_status c_bwd_w(ct_quantizer *q, float *dw, const float *dy, const float *x, int64_t n, int64_t o, int64_t i) {
    n_bwd_w++;
    return real->backward_weight(q, dw, dy, x, n, o, i);
}
static ct_status c_gfwd(ct_quantizer *q, float *y, const float *x, const float *w, const int32_t *off, int64_t m,
                        int64_t e, int64_t o, int64_t i) {
    n_gfwd++;
    return real->grouped_forward(q, y, x, w, off, m, e, o, i);
}
static ct_status c_gbwd_in(ct_quantizer *q, float *dx, const float *dy, const float *w, const int32_t *off, int64_t m,
                           int64_t e, int64_t o, int64_t i) {
    n_gbwd_in++;
    return real->grouped_backward_input(q, dx, dy, w, off, m, e, o, i);
}
static ct_status c_gbwd_w(ct_quantizer *q, float *dw, const float *dy, const float *x, const int32_t *off, int64_t m,
                          int64_t e, int64_t o, int64_t i) {
    n_gbwd_w++;
    return real->grouped_backward_weight(q, dw, dy, x, off, m, e, o, i);
}

static ct_quantizer_api counting;

static void count_calls(session *s) {
    real = s->rt.qapi;
    assert_non_null(real);
    counting = *real;
    counting.forward = c_forward;
    counting.backward_input = c_bwd_in;
    counting.backward_weight = c_bwd_w;
    counting.grouped_forward = c_gfwd;
    counting.grouped_backward_input = c_gbwd_in;
    counting.grouped_backward_weight = c_gbwd_w;
    s->rt.qapi = &counting; /* the layer reads the runtime's table at each call */
    n_fwd = n_bwd_in = n_bwd_w = n_gfwd = n_gbwd_in = n_gbwd_w = 0;
}

static void step(session *s, double *loss) {
    int32_t tok[2 * 64], tgt[2 * 64];
    for (int i = 0; i < 128; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % 256);
        tgt[i] = i % 17 == 0 ? -100 : (int32_t)((i * 53 + 5) % 256);
    }
    assert_int_equal(runtime_zero_grads(&s->rt), CT_OK);
    assert_int_equal(runtime_forward_backward(&s->rt, tok, tgt, 2, 64, 1.0f / 120.0f, 1, loss), CT_OK);
}

static int quantized(const session *s, const char *name) {
    for (int i = 0; i < s->rt.n_params; i++)
        if (!strcmp(s->rt.params[i]->t.name, name)) return (s->rt.params[i]->t.flags & CT_TENSOR_QUANTIZED) != 0;
    fail_msg("no parameter %s", name);
    return 0;
}

static void open_llama(session *s, const char *precision, const char *quant) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml, llama_fmt, precision, quant);
    if (fixture_open(s, yaml)) fail_msg("session: %s", ct_last_error());
}

static void test_layer_is_innermost_and_runs_each_converted_linear(void **state) {
    (void)state;
    session s;
    open_llama(&s, "float32", "quantize: {dense: {float8: {enable: true}}}\n");
    assert_int_equal(s.rt.n_layers, 1);
    assert_ptr_equal(s.rt.layers[0], s.rt.top);
    assert_ptr_equal(tape_layer_next(s.rt.top), &s.rt.builder);
    int converted = 0;
    for (int i = 0; i < s.rt.n_params; i++) converted += (s.rt.params[i]->t.flags & CT_TENSOR_QUANTIZED) != 0;
    assert_int_equal(converted, 2 * 7); /* wq wk wv wo w1 w2 w3 of each block */
    assert_true(quantized(&s, "layers.1.feed_forward.w2.weight"));
    assert_false(quantized(&s, "output.weight")); /* the default filter_fqns */
    count_calls(&s);
    double loss;
    step(&s, &loss);
    print_message("float8 step: loss %.9g, %d forward, %d input-gradient, %d weight-gradient GEMMs\n", loss, n_fwd,
                  n_bwd_in, n_bwd_w);
    assert_int_equal(n_fwd, converted);
    assert_int_equal(n_bwd_in, converted);
    assert_int_equal(n_bwd_w, converted);
    assert_int_equal(n_gfwd, 0);
    session_close(&s);
}

static void test_layer_runs_the_experts_grouped_gemms_only(void **state) {
    (void)state;
    session s;
    if (fixture_open(&s, moe_yaml)) fail_msg("session: %s", ct_last_error());
    assert_ptr_equal(tape_layer_next(s.rt.top), &s.rt.builder);
    count_calls(&s);
    double loss;
    step(&s, &loss);
    print_message("experts in float8: loss %.9g, %d grouped forward, %d and %d backward, %d 2-D\n", loss, n_gfwd,
                  n_gbwd_in, n_gbwd_w, n_fwd);
    assert_true(quantized(&s, "layers.1.moe.experts.w2"));
    assert_int_equal(n_gfwd, 2 * 3); /* w1, w3, w2 of each of the 2 MoE layers */
    assert_int_equal(n_gbwd_in, 2 * 3);
    assert_int_equal(n_gbwd_w, 2 * 3);
    assert_int_equal(n_fwd + n_bwd_in + n_bwd_w, 0); /* linears: false */
    session_close(&s);
}

/* One step's loss and gradients, with the quantizer `quant` (a manifest line) or none. */
static double run(const char *precision, const char *quant, float **grads, int64_t *n) {
    session s;
    open_llama(&s, precision, quant);
    double loss;
    step(&s, &loss);
    *n = s.rt.n_param_elems;
    float *g = *grads = malloc(sizeof(float) * (size_t)*n); /* every parameter's gradient, in turn */
    for (int i = 0; i < s.rt.n_params; g += ct_tensor_numel(&s.rt.params[i++]->t))
        assert_int_equal(runtime_param_get(&s.rt, i, g, 1), CT_OK);
    session_close(&s);
    return loss;
}

static void same_step(const char *precision) {
    float *a, *b;
    int64_t na, nb;
    double la = run(precision, "", &a, &na);
    double lb = run(precision, "quantize: {dense: {float8: {enable: true, linears: false}}}\n", &b, &nb);
    assert_int_equal(na, nb);
    if (memcmp(&la, &lb, sizeof la)) fail_msg("%s: loss %.9g with the layer, %.9g without", precision, lb, la);
    for (int64_t i = 0; i < na; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s: gradient element %lld %.9g with the layer, %.9g without", precision, (long long)i, b[i], a[i]);
    print_message("%s: converting nothing, loss %.9g and %lld gradients as without a quantizer\n", precision, la,
                  (long long)na);
    free(a);
    free(b);
}

static void test_converting_nothing_is_the_step_without_a_quantizer(void **state) {
    (void)state;
    same_step("float32");
    same_step("bfloat16"); /* the head's fused loss passes through the layer */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_is_innermost_and_runs_each_converted_linear),
        cmocka_unit_test(test_layer_runs_the_experts_grouped_gemms_only),
        cmocka_unit_test(test_converting_nothing_is_the_step_without_a_quantizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
