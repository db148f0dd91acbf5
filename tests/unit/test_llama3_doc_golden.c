/* test_llama3_doc_golden.c: block-causal attention over packed documents against PyTorch.
 *
 * tests/golden/llama3_doc_tiny.ctt (made by tests/golden/gen_llama3_doc_golden.py) holds a tiny
 * Llama 3's weights and two sequences that pack 4 and 3 documents ended by EOS, with PyTorch's
 * logits under an explicit document mask, the loss with the targets masked at document boundaries,
 * and every parameter's gradient, all in float64. The C model runs in f32 on the CPU device with the
 * runtime told the EOS id (what model.attn_mask_type: block_causal does with the tokenizer's EOS). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "session_fixture.h"
#include "io/tensorfile.h"

#define GOLDEN "tests/golden/llama3_doc_tiny.ctt"
#define B 2
#define T 32
#define TOL 1e-6 /* relative L2 error, f32 against float64 */

static const char *manifest_yaml =
    "device: {name: cpu, threads: 2}\n"
    "model: {name: llama3, flavor: debugmodel, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2,\n"
    "        vocab_size: 256, ffn_hidden: 192, rope_theta: 500000, norm_eps: 1e-5}\n"
    "optimizer: {name: AdamW, lr: 0, weight_decay: 0}\n"
    "training: {seq_len: 32, local_batch_size: 2, max_norm: 0}\n"
    "activation_checkpoint: {mode: none}\n";

typedef struct fixture {
    session s;
    tf_file *g;
    const int32_t *tokens, *targets, *raw;
    int32_t eos;
} fixture;

static const tf_entry *find(const fixture *f, const char *name) {
    const tf_entry *e = tf_find(f->g, name);
    if (!e) fail_msg("%s has no %s", GOLDEN, name);
    return e;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->g = tf_read(GOLDEN);
    if (!f->g) fail_msg("%s", ct_last_error());
    if (fixture_open(&f->s, manifest_yaml)) fail_msg("session: %s", ct_last_error());
    if (session_load_model(&f->s, GOLDEN) != CT_OK) fail_msg("%s", ct_last_error());
    f->tokens = find(f, "input.tokens")->data;
    f->targets = find(f, "input.targets")->data;
    f->raw = find(f, "input.targets_raw")->data;
    f->eos = *(const int32_t *)find(f, "config.eos_id")->data;
    f->s.rt.doc_eos = f->eos; /* block_causal */
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    session_close(&f->s);
    tf_free(f->g);
    free(f);
    return 0;
}

static double rel_err(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

/* The document ids and in-document positions the runtime derives from the tokens are PyTorch's
 * (torchtitan's counting: the EOS is its document's last token). */
static void test_document_ids_match(void **state) {
    fixture *f = *state;
    int32_t docs[B * T], pos[B * T];
    runtime_doc_ids(docs, pos, f->tokens, NULL, B, T, f->eos);
    const int32_t *want = find(f, "input.doc_ids")->data, *want_pos = find(f, "input.doc_positions")->data;
    for (int i = 0; i < B * T; i++) {
        if (docs[i] != want[i]) fail_msg("document id of token %d: %d, PyTorch %d", i, docs[i], want[i]);
        if (pos[i] != want_pos[i]) fail_msg("position in its document of token %d: %d, PyTorch %d", i, pos[i], want_pos[i]);
    }
    assert_true(docs[T - 1] >= 2 && docs[2 * T - 1] >= 2); /* several documents per sequence */
}

/* Logits under the document mask; with the mask off the same run gives the causal logits, which
 * are far from these: the test sees the mask. */
static void test_logits_match_pytorch(void **state) {
    fixture *f = *state;
    const tf_entry *want = find(f, "expected.logits"), *causal = find(f, "expected.causal_logits");
    float *logits = malloc(sizeof(float) * (size_t)want->numel);
    assert_int_equal(runtime_forward_logits(&f->s.rt, f->tokens, B, T, logits), CT_OK);
    double e = rel_err(logits, want->data, want->numel), apart = rel_err(causal->data, want->data, want->numel);
    print_message("block-causal logits: relative error %.2e (causal logits are %.2e away)\n", e, apart);
    if (!(e <= TOL)) fail_msg("logits: relative error %.3g > %.1g", e, TOL);
    assert_true(apart > 1000 * TOL);
    f->s.rt.doc_eos = -1;
    assert_int_equal(runtime_forward_logits(&f->s.rt, f->tokens, B, T, logits), CT_OK);
    e = rel_err(logits, causal->data, causal->numel);
    if (!(e <= TOL)) fail_msg("causal logits: relative error %.3g > %.1g", e, TOL);
    free(logits);
}

/* The loss and every gradient against PyTorch's, within TOL; *worst gets the largest gradient error. */
static void expect_loss_and_gradients(fixture *f, double *loss_out, double *worst_out);

static void test_loss_and_every_gradient_match_pytorch(void **state) {
    fixture *f = *state;
    double loss, worst;
    expect_loss_and_gradients(f, &loss, &worst);
    print_message("loss %.9f vs PyTorch %.9f; %d gradients, worst relative error %.2e\n", loss,
                  *(const float *)find(f, "expected.loss")->data, f->s.rt.n_params, worst);
}

/* model.rope_positions: document: RoPE at each token's position within its document. RoPE's scores
 * depend only on the distance between two positions, and the mask keeps both in one document, so the
 * function is the one above (PyTorch checks it by running each document alone from position 0): the
 * same logits, loss and gradients, reached through rotations at other angles. */
static void test_document_positions_match_pytorch(void **state) {
    fixture *f = *state;
    const tf_entry *want = find(f, "expected.logits");
    float *seq = malloc(sizeof(float) * (size_t)want->numel), *logits = malloc(sizeof(float) * (size_t)want->numel);
    assert_int_equal(runtime_forward_logits(&f->s.rt, f->tokens, B, T, seq), CT_OK);
    f->s.rt.rope_doc = 1;
    assert_int_equal(runtime_forward_logits(&f->s.rt, f->tokens, B, T, logits), CT_OK);
    double e = rel_err(logits, want->data, want->numel), loss, worst;
    if (!(e <= TOL)) fail_msg("logits with document positions: relative error %.3g > %.1g", e, TOL);
    /* the rotations did change: not the sequence positions' bits (only rounding tells them apart) */
    assert_true(memcmp(seq, logits, sizeof(float) * (size_t)want->numel) != 0);
    free(seq);
    free(logits);
    expect_loss_and_gradients(f, &loss, &worst);
    print_message("RoPE restarted per document: logits %.2e, gradients %.2e from PyTorch\n", e, worst);
}

static void expect_loss_and_gradients(fixture *f, double *loss_out, double *worst_out) {
    int64_t valid = 0;
    for (int i = 0; i < B * T; i++) valid += f->targets[i] != CT_IGNORE_INDEX;
    double loss_sum, worst = 0;
    assert_int_equal(runtime_zero_grads(&f->s.rt), CT_OK);
    assert_int_equal(runtime_forward_backward(&f->s.rt, f->tokens, f->targets, B, T, 1.0f / (float)valid, 1, &loss_sum),
                     CT_OK);
    float want_loss = *(const float *)find(f, "expected.loss")->data;
    double loss = loss_sum / (double)valid;
    if (fabs(loss - want_loss) > TOL * fabs(want_loss)) fail_msg("loss %.9f, PyTorch %.9f", loss, want_loss);
    for (int i = 0; i < f->s.rt.n_params; i++) {
        ct_tensor *p = &f->s.rt.params[i]->t;
        char name[256];
        snprintf(name, sizeof name, "grad.%s", p->name);
        const tf_entry *want = find(f, name);
        assert_int_equal(want->numel, ct_tensor_numel(p));
        float *g = malloc(sizeof(float) * (size_t)want->numel);
        assert_int_equal(runtime_param_get(&f->s.rt, i, g, 1), CT_OK);
        double e = rel_err(g, want->data, want->numel);
        if (e > worst) worst = e;
        if (!(e <= TOL)) fail_msg("%s: relative error %.3g > %.1g", name, e, TOL);
        free(g);
    }
    *loss_out = loss;
    *worst_out = worst;
}

/* A training step given the raw targets masks each document's first target itself: its loss and
 * valid-token count are PyTorch's with the masked targets. */
static void test_step_masks_document_boundaries(void **state) {
    fixture *f = *state;
    int64_t want_valid = 0, raw_valid = 0, valid;
    for (int i = 0; i < B * T; i++) {
        want_valid += f->targets[i] != CT_IGNORE_INDEX;
        raw_valid += f->raw[i] != CT_IGNORE_INDEX;
    }
    assert_true(raw_valid > want_valid);
    double loss, norm;
    assert_int_equal(session_train_step(&f->s, f->tokens, f->raw, NULL, B, B, T, 0.0, 0.0, 1, &loss, &norm, &valid), CT_OK);
    float want_loss = *(const float *)find(f, "expected.loss")->data;
    assert_int_equal(valid, want_valid);
    if (fabs(loss - want_loss) > TOL * fabs(want_loss)) fail_msg("step loss %.9f, PyTorch %.9f", loss, want_loss);
    print_message("a step on the raw targets: %lld of %lld targets count, loss %.9f\n", (long long)valid,
                  (long long)raw_valid, loss);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_document_ids_match, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logits_match_pytorch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_and_every_gradient_match_pytorch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_step_masks_document_boundaries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_document_positions_match_pytorch, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
