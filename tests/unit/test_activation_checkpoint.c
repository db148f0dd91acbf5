/* test_activation_checkpoint.c: `full`, `selective` every Nth block and `selective` per op recompute
 * blocks in backward and must give the same loss and gradients as `none`, bit for bit, with a lower
 * peak of live activations (per op: between `full` and `none`, since it keeps some op outputs). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "session_fixture.h"

static const char *yaml_fmt =
    "device: {name: cpu, threads: 2}\n"
    "model: {name: llama3, flavor: debugmodel, dim: 64, n_layers: 4, n_heads: 4, n_kv_heads: 2,\n"
    "        vocab_size: 256, ffn_hidden: 192}\n"
    "optimizer: {name: AdamW}\n"
    "training: {seq_len: 64, local_batch_size: 2, seed: 7}\n"
    "activation_checkpoint: {mode: %s, selective_ac_option: '%s'}\n";

typedef struct result {
    double loss;
    float *grads; /* every parameter's gradient, concatenated */
    int64_t n;
    int64_t peak_act;
} result;

static void run(const char *mode, const char *option, result *r) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml, yaml_fmt, mode, option);
    session s;
    if (fixture_open(&s, yaml)) fail_msg("session (%s): %s", mode, ct_last_error());
    int32_t tok[2 * 64], tgt[2 * 64];
    for (int i = 0; i < 128; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % 256);
        tgt[i] = i % 17 == 0 ? -100 : (int32_t)((i * 53 + 5) % 256);
    }
    assert_int_equal(runtime_zero_grads(&s.rt), CT_OK);
    assert_int_equal(runtime_forward_backward(&s.rt, tok, tgt, 2, 64, 1.0f / 120.0f, 1, &r->loss), CT_OK);
    r->n = s.rt.n_param_elems;
    r->grads = malloc(sizeof(float) * (size_t)r->n);
    int64_t off = 0;
    for (int i = 0; i < s.rt.n_params; i++) {
        assert_int_equal(runtime_param_get(&s.rt, i, r->grads + off, 1), CT_OK);
        off += ct_tensor_numel(&s.rt.params[i]->t);
    }
    r->peak_act = s.rt.peak_act_bytes;
    session_close(&s);
}

static int64_t compare(const char *mode, const char *option) {
    result none, other;
    run("none", "1", &none);
    run(mode, option, &other);
    assert_int_equal(none.n, other.n);
    if (memcmp(&none.loss, &other.loss, sizeof(double)))
        fail_msg("%s: loss %.9g differs from none %.9g", mode, other.loss, none.loss);
    if (memcmp(none.grads, other.grads, sizeof(float) * (size_t)none.n)) {
        for (int64_t i = 0; i < none.n; i++)
            if (memcmp(&none.grads[i], &other.grads[i], sizeof(float)))
                fail_msg("%s: gradient element %lld differs: %.9g vs %.9g", mode, (long long)i, other.grads[i],
                         none.grads[i]);
    }
    print_message("ac %s(%s): peak live activations %lld bytes vs none %lld\n", mode, option,
                  (long long)other.peak_act, (long long)none.peak_act);
    assert_true(other.peak_act < none.peak_act);
    free(none.grads);
    free(other.grads);
    return other.peak_act;
}

static void test_full_matches_none_bitwise_with_less_memory(void **state) {
    (void)state;
    compare("full", "1");
}

static void test_selective_every_second_block_matches_none_bitwise(void **state) {
    (void)state;
    compare("selective", "2");
}

/* torchtitan's per-op policy: attention and every other linear saved, the rest recomputed */
static void test_selective_op_matches_none_bitwise_between_full_and_none(void **state) {
    (void)state;
    int64_t op = compare("selective", "op"), full = compare("full", "1");
    print_message("ac op peak %lld bytes, full %lld\n", (long long)op, (long long)full);
    assert_true(op > full);
}

static void test_selective_bad_option_is_rejected_clearly(void **state) {
    (void)state;
    session s;
    char yaml[1024];
    snprintf(yaml, sizeof yaml, yaml_fmt, "selective", "ops");
    assert_int_equal(fixture_open(&s, yaml), CT_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_matches_none_bitwise_with_less_memory),
        cmocka_unit_test(test_selective_every_second_block_matches_none_bitwise),
        cmocka_unit_test(test_selective_op_matches_none_bitwise_between_full_and_none),
        cmocka_unit_test(test_selective_bad_option_is_rejected_clearly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
