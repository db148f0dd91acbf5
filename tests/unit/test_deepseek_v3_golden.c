/* test_deepseek_v3_golden.c: models/deepseek_v3 on the CPU against transformers' DeepseekV3ForCausalLM in
 * float64.
 *
 * tests/golden/deepseek_v3_tiny.ctt (made by tests/golden/gen_deepseek_v3_golden.py) holds a tiny random
 * DeepSeek-V3 (3 blocks, the first dense; multi-head latent attention with a low-rank q, kv latent 16, qk
 * heads of 8 + 4 rotated columns, v heads of 6; 8 sigmoid-routed experts in 4 groups, top-2 over the best 2
 * groups, normalised and scaled by 2.5, one shared expert), one batch, and transformers' logits,
 * cross-entropy and every parameter's gradient. We load the weights and want each within 1e-6 relative,
 * with and without activation checkpointing; and a second golden with q projected directly (q_lora_rank 0) and
 * YaRN RoPE (transformers' yarn rope_parameters, ctitan's YaRN when seq_len exceeds original_seq_len). The expert biases (e_score_correction_bias, random here) are
 * the pack's buffers (ABI 2.20), loaded from the golden file like the parameters and applied to the choice.
 * Also: transformers' saved folder loads through the pack's Hugging Face table bit for bit, its biases
 * included, and the per-expert counts post_step gets add up. Last, the first model saved by transformers with
 * DeepSeek-V3's own rope_scaling (YaRN, factor 40 over 4096 positions, mscale = mscale_all_dim = 1; the folder
 * tests/golden/hf/deepseek_v3_yarn_from_transformers, its logits in deepseek_v3_hf_yarn_tiny.ctt): the folder
 * sets the pack's options to YaRN at every length (model.rope_scaling yarn, as transformers runs it), and
 * the model it loads gives transformers' logits within 1e-6 at seq_len 16, far below original_seq_len. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "checkpoint/hf_pack.h"
#include "engine/moe.h"
#include "io/hf_export.h"
#include "io/tensorfile.h"
#include "session_fixture.h"

#define GOLDEN "tests/golden/deepseek_v3_tiny.ctt"
/* the same sizes with q projected directly and YaRN on (seq_len 16 above original_seq_len 8, factor 40, mscale 1) */
#define GOLDEN_YARN "tests/golden/deepseek_v3_yarn_tiny.ctt"
#define YARN_OPTIONS "q_lora_rank: 0, original_seq_len: 8, rope_factor: 40, mscale: 1"
#define GOLDEN_HF_YARN "tests/golden/deepseek_v3_hf_yarn_tiny.ctt"
#define HF_YARN_DIR "tests/golden/hf/deepseek_v3_yarn_from_transformers"
#define HF_YARN_OPTIONS                                                                                                \
    "q_lora_rank: 24, rope_scaling: yarn, rope_factor: 40, original_seq_len: 4096, mscale: 1, "                        \
    "max_position_embeddings: 163840"
#define B 2
#define T 16
#define TOL 1e-6

static const char *yaml_fmt =
    "device: {name: cpu, threads: 2}\n"
    "model: {name: deepseek_v3, flavor: 671B, dim: 32, n_layers: 3, n_dense_layers: 1, n_heads: 4, vocab_size: 512,\n"
    "        inter_dim: 64, moe_inter_dim: 16, n_experts: 8, n_shared_experts: 1, top_k: 2, n_expert_groups: 4,\n"
    "        n_limited_groups: 2, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 4,\n"
    "        v_head_dim: 6, norm_eps: 1e-6, moe_force_load_balance: %s, %s}\n"
    "optimizer: {name: AdamW, lr: 1e-3}\n"
    "training: {seq_len: 16, local_batch_size: 2}\n"
    "activation_checkpoint: {mode: %s}\n";

typedef struct fixture {
    session s;
    tf_file *g;
    const int32_t *tokens, *targets;
    int n_params; /* parameters the golden model has */
} fixture;

static int open_golden(void **state, const char *golden, const char *force, const char *ac, const char *extra) {
    fixture *f = calloc(1, sizeof *f);
    char yaml[1280];
    snprintf(yaml, sizeof yaml, yaml_fmt, force, extra, ac);
    if (!(f->g = tf_read(golden))) fail_msg("%s", ct_last_error());
    if (fixture_open(&f->s, yaml)) fail_msg("session: %s", ct_last_error());
    /* a golden without weights (deepseek_v3_hf_yarn_tiny.ctt: its folder has them) loads none */
    if (tf_find(f->g, "tok_embeddings.weight") && session_load_model(&f->s, golden) != CT_OK)
        fail_msg("%s", ct_last_error());
    /* the head's 3, the dense block's 12 and each MoE block's 16 (q directly: 2 fewer per block) */
    f->n_params = strcmp(golden, GOLDEN) ? 3 + 10 + 2 * 14 : 3 + 12 + 2 * 16;
    f->tokens = tf_find(f->g, "input.tokens")->data;
    f->targets = tf_find(f->g, "input.targets")->data;
    *state = f;
    return 0;
}
static int open_with(void **state, const char *force, const char *ac) {
    return open_golden(state, GOLDEN, force, ac, "q_lora_rank: 24");
}
static int setup(void **state) { return open_with(state, "false", "none"); }
static int setup_ac(void **state) { return open_with(state, "false", "full"); }
static int setup_forced(void **state) { return open_with(state, "true", "none"); }
static int setup_yarn(void **state) { return open_golden(state, GOLDEN_YARN, "false", "none", YARN_OPTIONS); }

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

static void test_logits_match_transformers(void **state) {
    fixture *f = *state;
    const tf_entry *want = tf_find(f->g, "expected.logits");
    assert_non_null(want);
    float *logits = malloc(sizeof(float) * (size_t)want->numel);
    assert_int_equal(runtime_forward_logits(&f->s.rt, f->tokens, B, T, logits), CT_OK);
    double e = rel_err(logits, want->data, want->numel);
    print_message("logits: relative error %.2e\n", e);
    if (!(e <= TOL)) fail_msg("logits: relative error %.3g > %.0e", e, TOL);
    free(logits);
}

/* One microbatch's forward and backward at loss scale 1 / (B T); *aux the load-balancing loss. */
static double step_once(fixture *f, double *aux) {
    double loss_sum;
    assert_int_equal(runtime_zero_grads(&f->s.rt), CT_OK);
    assert_int_equal(runtime_forward_backward(&f->s.rt, f->tokens, f->targets, B, T, 1.0f / (B * T), 1, &loss_sum),
                     CT_OK);
    assert_int_equal(runtime_take_aux(&f->s.rt, aux), CT_OK);
    *aux /= B * T;
    return loss_sum / (B * T);
}

static void test_loss_and_every_gradient_match_transformers(void **state) {
    fixture *f = *state;
    double aux, loss = step_once(f, &aux);
    double want_loss = *(const float *)tf_find(f->g, "expected.loss")->data;
    print_message("loss %.8f vs %.8f (aux_loss %.3g)\n", loss, want_loss, aux);
    if (fabs(loss - want_loss) > TOL * fabs(want_loss)) fail_msg("loss %.8f, transformers %.8f", loss, want_loss);
    if (aux != 0) fail_msg("aux_loss %.3g: DeepSeek-V3 balances without one", aux);
    double worst = 0;
    const char *worst_name = "";
    assert_int_equal(f->s.rt.n_params, f->n_params);
    for (int i = 0; i < f->s.rt.n_params; i++) {
        ct_tensor *p = &f->s.rt.params[i]->t;
        char name[256];
        snprintf(name, sizeof name, "grad.%s", p->name);
        const tf_entry *want = tf_find(f->g, name);
        if (!want) fail_msg("golden has no %s", name);
        assert_int_equal(want->numel, ct_tensor_numel(p));
        float *g = malloc(sizeof(float) * (size_t)want->numel);
        assert_int_equal(runtime_param_get(&f->s.rt, i, g, 1), CT_OK);
        double e = rel_err(g, want->data, want->numel);
        if (e > worst) worst = e, worst_name = p->name;
        if (!(e <= TOL)) fail_msg("%s: relative error %.3g > %.0e", name, e, TOL);
        free(g);
    }
    print_message("%d gradients: worst relative error %.2e (%s)\n", f->s.rt.n_params, worst, worst_name);
}

/* The per-expert counts post_step gets: each block's add up to its B*T*top_k pairs. Under forced balance
 * each expert gets the same number. */
static void counts_after_step(fixture *f, int forced) {
    double aux;
    (void)step_once(f, &aux);
    const ct_moe_load *loads;
    int n = 0;
    assert_int_equal(runtime_moe_loads(&f->s.rt, &loads, &n), CT_OK);
    assert_int_equal(n, 2);
    for (int l = 0; l < n; l++) {
        float c[8];
        assert_int_equal(loads[l].n_experts, 8);
        assert_int_equal(f->s.rt.d->copy(f->s.rt.dev, c, loads[l].counts, sizeof c, CT_COPY_D2H), CT_OK);
        double sum = 0;
        for (int j = 0; j < 8; j++) {
            sum += c[j];
            if (forced && c[j] != B * T * 2 / 8) fail_msg("%s: expert %d got %g pairs under forced balance",
                                                          loads[l].router, j, c[j]);
        }
        if (sum != B * T * 2) fail_msg("%s: counts add up to %g, not %d", loads[l].router, sum, B * T * 2);
    }
    assert_string_equal(loads[1].router, "layers.2.moe.router.gate.weight");
    assert_int_equal(runtime_moe_zero_counts(&f->s.rt), CT_OK);
}

/* The session's parameters then its buffers, as shapes: what a Hugging Face load reads (free want->entries). */
static void want_shapes(session *s, tf_file *want) {
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    want->entries = calloc((size_t)(s->rt.n_params + nb), sizeof(tf_entry));
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_tensor *p = &s->rt.params[i]->t;
        tf_entry *e = &want->entries[want->count++];
        *e = (tf_entry){.name = (char *)p->name, .dtype = TF_F32, .ndim = p->ndim, .numel = ct_tensor_numel(p)};
        memcpy(e->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim);
    }
    for (int i = 0; i < nb; i++)
        want->entries[want->count++] = (tf_entry){.name = (char *)buf[i].name, .dtype = TF_F32, .ndim = 1,
                                                  .shape = {buf[i].numel}, .numel = buf[i].numel};
}

/* transformers' save_pretrained of the same model (one tensor per expert) through the pack's table
 * (CT_HF_EXPERTS, ABI 2.15), as checkpoint.initial_load_in_hf reads it: every parameter equals the
 * golden's, bit for bit. */
static void test_transformers_folder_loads_through_the_table(void **state) {
    fixture *f = *state;
    session *s = &f->s;
    ct_hf_export x = {.struct_size = sizeof x};
    assert_int_equal(s->m->hf_export(s->model, &x), CT_OK);
    assert_string_equal(x.architecture, "DeepseekV3ForCausalLM");
    tf_file want = {0};
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    assert_int_equal(nb, 2); /* the MoE blocks' expert biases (ABI 2.20 buffers) */
    want_shapes(s, &want);
    tf_file *w = NULL;
    if (hf_import_load("tests/golden/hf/deepseek_v3_from_transformers", &x, &want, 16, "deepseek_v3", &w) != CT_OK)
        fail_msg("%s", ct_last_error());
    assert_int_equal(w->count, s->rt.n_params + nb);
    for (int i = 0; i < w->count; i++) {
        const tf_entry *got = &w->entries[i], *g = tf_find(f->g, got->name);
        if (!g || g->numel != got->numel || memcmp(g->data, got->data, sizeof(float) * (size_t)g->numel))
            fail_msg("%s: differs from transformers' tensor(s)", got->name);
    }
    tf_free(w);
    free(want.entries);
}

/* The option the folder set (a number, or a string when want_s). */
static void expect_option(const hf_pack *k, const char *key, double want, const char *want_s) {
    json_t *v = json_object_get(k->set, key);
    if (want_s ? !json_is_string(v) || strcmp(json_string_value(v), want_s) : json_number_value(v) != want)
        fail_msg("the folder set model.%s to %s", key, v ? json_dumps(v, JSON_ENCODE_ANY) : "nothing");
}

/* DeepSeek-V3's YaRN folder: the options it sets, then a session with them loads it and gives transformers'
 * logits. Plain RoPE on the same weights (the first golden's logits) is far off, so the check can fail. */
static void test_yarn_folder_matches_transformers(void **state) {
    (void)state;
    fixture_plugin_path();
    hf_pack k;
    if (hf_pack_from_folder(HF_YARN_DIR, NULL, &k) != CT_OK) fail_msg("%s", ct_last_error());
    expect_option(&k, "rope_scaling", 0, "yarn");
    expect_option(&k, "rope_factor", 40, NULL);
    expect_option(&k, "original_seq_len", 4096, NULL);
    expect_option(&k, "beta_fast", 32, NULL);
    expect_option(&k, "beta_slow", 1, NULL);
    expect_option(&k, "mscale", 1, NULL);
    hf_pack_close(&k);

    fixture *f;
    open_golden((void **)&f, GOLDEN_HF_YARN, "false", "none", HF_YARN_OPTIONS);
    session *s = &f->s;
    ct_hf_export x = {.struct_size = sizeof x};
    assert_int_equal(s->m->hf_export(s->model, &x), CT_OK);
    tf_file want = {0}, *w = NULL;
    want_shapes(s, &want);
    if (hf_import_load(HF_YARN_DIR, &x, &want, 16, "deepseek_v3", &w) != CT_OK) fail_msg("%s", ct_last_error());
    for (int i = 0; i < s->rt.n_params; i++)
        assert_int_equal(runtime_param_set(&s->rt, i, tf_find(w, s->rt.params[i]->t.name)->data), CT_OK);
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    for (int i = 0; i < nb; i++) memcpy(buf[i].data, tf_find(w, buf[i].name)->data, sizeof(float) * (size_t)buf[i].numel);
    tf_free(w);
    free(want.entries);

    const tf_entry *yarn = tf_find(f->g, "expected.logits");
    tf_file *plain_g = tf_read(GOLDEN);
    assert_non_null(plain_g);
    const tf_entry *plain = tf_find(plain_g, "expected.logits");
    assert_int_equal(yarn->numel, plain->numel);
    float *logits = malloc(sizeof(float) * (size_t)yarn->numel);
    assert_int_equal(runtime_forward_logits(&s->rt, f->tokens, B, T, logits), CT_OK);
    double e = rel_err(logits, yarn->data, yarn->numel), gap = rel_err(plain->data, yarn->data, yarn->numel);
    print_message("YaRN folder: logits relative error %.2e (plain RoPE's logits are %.2e away)\n", e, gap);
    if (!(e <= TOL)) fail_msg("YaRN folder: logits relative error %.3g > %.0e", e, TOL);
    if (!(gap > 100 * TOL)) fail_msg("YaRN changes the logits by only %.3g: the check would not tell", gap);
    free(logits);
    tf_free(plain_g);
    teardown((void **)&f);
}

static void test_counts_add_up(void **state) { counts_after_step(*state, 0); }
static void test_forced_balance_spreads_evenly(void **state) { counts_after_step(*state, 1); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_logits_match_transformers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_and_every_gradient_match_transformers, setup, teardown),
        /* full activation checkpointing recomputes the blocks: the aux loss still counts once */
        cmocka_unit_test_setup_teardown(test_loss_and_every_gradient_match_transformers, setup_ac, teardown),
        /* q projected directly, and YaRN's frequencies and softmax scale */
        cmocka_unit_test_setup_teardown(test_logits_match_transformers, setup_yarn, teardown),
        cmocka_unit_test_setup_teardown(test_loss_and_every_gradient_match_transformers, setup_yarn, teardown),
        cmocka_unit_test_setup_teardown(test_transformers_folder_loads_through_the_table, setup, teardown),
        cmocka_unit_test(test_yarn_folder_matches_transformers),
        cmocka_unit_test_setup_teardown(test_counts_add_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forced_balance_spreads_evenly, setup_forced, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
