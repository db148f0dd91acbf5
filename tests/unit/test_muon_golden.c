/* test_muon_golden.c: the Muon optimizer plugin, through the host's step_param path, against PyTorch.
 *
 * tests/golden/muon_tiny.ctt (made by tests/golden/gen_muon_golden.py) holds a tiny Llama 3's
 * parameters, three steps of gradients and learning rates, and the parameters after those steps
 * (Muon for the linear weights, AdamW for the rest) in float64 under two option sets. We set the
 * same values in a real session's local storage, run session_step_params three times, and require
 * each parameter's change to match within 1e-5 relative (f32 against f64). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "session_fixture.h"
#include "io/tensorfile.h"

#define GOLDEN "tests/golden/muon_tiny.ctt"

#define MODEL                                                                                                 \
    "device: {name: cpu, threads: 1}\n"                                                                      \
    "model: {name: llama3, flavor: debugmodel, dim: 16, n_layers: 1, n_heads: 2, n_kv_heads: 1,\n"          \
    "        vocab_size: 24, ffn_hidden: 40}\n"                                                              \
    "training: {seq_len: 8, local_batch_size: 1}\n"

/* the generator's RUNS, spelled as manifest options */
static const char *moonlight_yaml = MODEL "optimizer: {name: muon, lr: 0.01}\n";
static const char *original_yaml =
    MODEL "optimizer: {name: muon, lr: 0.01, momentum: 0.9, nesterov: false, ns_steps: 5, weight_decay: 0.05,\n"
          "            adjust_lr: original, adamw_beta1: 0.8, adamw_beta2: 0.99, adamw_eps: 1e-6,\n"
          "            adamw_weight_decay: 0.02}\n";
/* every linear weight Muon's, the output head included: must NOT match the golden there */
static const char *no_exclude_yaml = MODEL "optimizer: {name: muon, lr: 0.01, muon_exclude: \"\"}\n";

/* Relative L2 error of got - base against want - base (the update, not the parameter). */
static double rel_change_err(const float *got, const float *want, const float *base, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i], w = (double)want[i] - base[i];
        num += d * d;
        den += w * w;
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

static const float *golden(const tf_file *g, const char *prefix, const char *name, int64_t numel) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", prefix, name);
    const tf_entry *e = tf_find(g, key);
    if (!e) fail_msg("%s: not in %s", key, GOLDEN);
    if (e->numel != numel) fail_msg("%s: %lld values in the golden, %lld in the model", key, (long long)e->numel,
                                    (long long)numel);
    return e->data;
}

/* Runs the golden's three steps in a session opened with `yaml`; returns the largest relative error
 * of a parameter's change against `<label>.<name>`, and in *output_err that of output.weight. */
static double run_steps(const char *yaml, const char *label, double *output_err) {
    tf_file *g = tf_read(GOLDEN);
    if (!g) fail_msg("%s", ct_last_error());
    session s;
    if (fixture_open(&s, yaml)) fail_msg("session: %s", ct_last_error());
    const tf_entry *lrs = tf_find(g, "lrs");
    assert_non_null(lrs);
    for (int i = 0; i < s.rt.n_params; i++) {
        const ct_param_slot *sl = &s.rt.slots[i];
        /* on one rank every slot describes the whole parameter */
        assert_int_equal(sl->placement, CT_PLACE_REPLICATE);
        assert_int_equal(sl->split_dim, -1);
        assert_int_equal(sl->local_numel, sl->numel);
        for (int d = 0; d < sl->param->ndim; d++) assert_int_equal(sl->global_shape[d], sl->param->shape[d]);
        const float *p = golden(g, "param", sl->param->name, sl->numel);
        assert_int_equal(s.d->copy(s.dev, sl->local_data, p, sizeof(float) * (size_t)sl->numel, CT_COPY_H2D), CT_OK);
    }
    for (int64_t t = 1; t <= lrs->numel; t++) {
        for (int i = 0; i < s.rt.n_params; i++) {
            const ct_param_slot *sl = &s.rt.slots[i];
            char prefix[32];
            snprintf(prefix, sizeof prefix, "grad%lld", (long long)t);
            const float *gr = golden(g, prefix, sl->param->name, sl->numel);
            assert_int_equal(s.d->copy(s.dev, sl->local_grad, gr, sizeof(float) * (size_t)sl->numel, CT_COPY_H2D),
                             CT_OK);
        }
        if (session_step_params(&s, ((const float *)lrs->data)[t - 1], t) != CT_OK)
            fail_msg("step: %s", ct_last_error());
    }
    double worst = 0;
    for (int i = 0; i < s.rt.n_params; i++) {
        const ct_param_slot *sl = &s.rt.slots[i];
        float *got = malloc(sizeof(float) * (size_t)sl->numel);
        assert_non_null(got);
        assert_int_equal(s.d->copy(s.dev, got, sl->local_data, sizeof(float) * (size_t)sl->numel, CT_COPY_D2H), CT_OK);
        double e = rel_change_err(got, golden(g, label, sl->param->name, sl->numel),
                                  golden(g, "param", sl->param->name, sl->numel), sl->numel);
        if (!strcmp(sl->param->name, "output.weight")) *output_err = e;
        else if (e > worst) worst = e;
        free(got);
    }
    session_close(&s);
    tf_free(g);
    return worst;
}

static void test_moonlight_defaults_match_pytorch(void **state) {
    (void)state;
    double out_err, e = run_steps(moonlight_yaml, "moonlight", &out_err);
    print_message("moonlight: worst relative error of an update %.2e (output.weight %.2e)\n", e, out_err);
    assert_true(e <= 1e-5);
    assert_true(out_err <= 1e-5);
}

static void test_original_scale_without_nesterov_matches_pytorch(void **state) {
    (void)state;
    double out_err, e = run_steps(original_yaml, "original", &out_err);
    print_message("original: worst relative error of an update %.2e (output.weight %.2e)\n", e, out_err);
    assert_true(e <= 1e-5);
    assert_true(out_err <= 1e-5);
}

/* The comparison can fail: with the output head given to Muon its update is no longer AdamW's. */
static void test_empty_exclude_changes_the_output_head(void **state) {
    (void)state;
    double out_err, e = run_steps(no_exclude_yaml, "moonlight", &out_err);
    print_message("muon_exclude \"\": others %.2e, output.weight %.2e\n", e, out_err);
    assert_true(e <= 1e-5);
    assert_true(out_err > 1e-2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moonlight_defaults_match_pytorch),
        cmocka_unit_test(test_original_scale_without_nesterov_matches_pytorch),
        cmocka_unit_test(test_empty_exclude_changes_the_output_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
