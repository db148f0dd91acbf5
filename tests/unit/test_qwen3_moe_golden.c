/* test_qwen3_moe_golden.c: models/qwen3's MoE flavor (ct_builder.moe, ABI 2.15) on the CPU against
 * transformers' Qwen3MoeForCausalLM in float64.
 *
 * tests/golden/qwen3_moe_tiny.ctt (made by tests/golden/gen_qwen3_moe_golden.py) holds a tiny random
 * Qwen3-MoE (2 blocks, 8 experts of hidden 16, top-2 softmax with norm_topk_prob, untied head), one
 * batch, and transformers' logits, cross-entropy, load-balancing loss (router_aux_loss_coef 0.01, the
 * mean over the blocks of load_balancing_loss_func on each) and every parameter's gradient of their sum.
 * We load the weights and want each within 1e-6 relative. Also: the per-expert counts post_step gets
 * add up to every (token, slot) pair, and moe_force_load_balance spreads them evenly.
 *
 * tests/golden/hf/qwen3_moe_from_transformers is the same model saved by transformers (model_type
 * qwen3_moe, which the pack's hf_import claims beside qwen3: ABI 2.18). `ctitan convert --from hf`
 * makes a model file of it, and model.flavor: from_checkpoint of that file and of the folder itself
 * gives a model whose logits are transformers'; the file goes to HF and back byte for byte; a folder
 * the pack cannot build (decoder_sparse_step 2, mlp_only_layers [1]) is refused in one line naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <sys/wait.h>

#include "checkpoint/checkpoint.h"
#include "engine/moe.h"
#include "io/hf_export.h"
#include "io/tensorfile.h"
#include "session_fixture.h"

#define GOLDEN "tests/golden/qwen3_moe_tiny.ctt"
#define B 2
#define T 16
#define TOL 1e-6

static const char *yaml_fmt =
    "device: {name: cpu, threads: 2}\n"
    "model: {name: qwen3, flavor: debugmodel_moe, dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 16,\n"
    "        vocab_size: 512, n_experts: 8, top_k: 2, moe_hidden: 16, rope_theta: 50000, norm_eps: 1e-6,\n"
    "        tie_word_embeddings: false, router_aux_loss_coef: 0.01, moe_force_load_balance: %s}\n"
    "optimizer: {name: AdamW, lr: 1e-3}\n"
    "training: {seq_len: 16, local_batch_size: 2}\n"
    "activation_checkpoint: {mode: %s}\n";

typedef struct fixture {
    session s;
    tf_file *g;
    const int32_t *tokens, *targets;
} fixture;

static int open_with(void **state, const char *force, const char *ac) {
    fixture *f = calloc(1, sizeof *f);
    char yaml[1024];
    snprintf(yaml, sizeof yaml, yaml_fmt, force, ac);
    if (!(f->g = tf_read(GOLDEN))) fail_msg("%s", ct_last_error());
    if (fixture_open(&f->s, yaml)) fail_msg("session: %s", ct_last_error());
    if (session_load_model(&f->s, GOLDEN) != CT_OK) fail_msg("%s", ct_last_error());
    f->tokens = tf_find(f->g, "input.tokens")->data;
    f->targets = tf_find(f->g, "input.targets")->data;
    *state = f;
    return 0;
}
static int setup(void **state) { return open_with(state, "false", "none"); }
static int setup_ac(void **state) { return open_with(state, "false", "full"); }
static int setup_forced(void **state) { return open_with(state, "true", "none"); }

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

static void test_loss_aux_and_every_gradient_match_transformers(void **state) {
    fixture *f = *state;
    double aux, loss = step_once(f, &aux);
    double want_loss = *(const float *)tf_find(f->g, "expected.loss")->data;
    double want_aux = *(const float *)tf_find(f->g, "expected.aux_loss")->data;
    print_message("loss %.8f vs %.8f, aux_loss %.8f vs %.8f\n", loss, want_loss, aux, want_aux);
    if (fabs(loss - want_loss) > TOL * fabs(want_loss)) fail_msg("loss %.8f, transformers %.8f", loss, want_loss);
    if (fabs(aux - want_aux) > TOL * fabs(want_aux)) fail_msg("aux_loss %.9f, transformers %.9f", aux, want_aux);
    double worst = 0;
    const char *worst_name = "";
    assert_int_equal(f->s.rt.n_params, 3 + 2 * 12);
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
    assert_string_equal(loads[1].router, "layers.1.moe.router.gate.weight");
    assert_int_equal(runtime_moe_zero_counts(&f->s.rt), CT_OK);
}

/* transformers' save_pretrained of the same model (one tensor per expert) through the pack's table
 * (CT_HF_EXPERTS, ABI 2.15), as checkpoint.initial_load_in_hf reads it: every parameter equals the
 * golden's, bit for bit. */
static void test_transformers_folder_loads_through_the_table(void **state) {
    fixture *f = *state;
    session *s = &f->s;
    ct_hf_export x = {.struct_size = sizeof x};
    assert_int_equal(s->m->hf_export(s->model, &x), CT_OK);
    assert_string_equal(x.architecture, "Qwen3MoeForCausalLM");
    tf_file want = {0};
    want.entries = calloc((size_t)s->rt.n_params, sizeof(tf_entry));
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_tensor *p = &s->rt.params[i]->t;
        tf_entry *e = &want.entries[want.count++];
        *e = (tf_entry){.name = (char *)p->name, .dtype = TF_F32, .ndim = p->ndim, .numel = ct_tensor_numel(p)};
        memcpy(e->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim);
    }
    tf_file *w = NULL;
    if (hf_import_load("tests/golden/hf/qwen3_moe_from_transformers", &x, &want, 16, "qwen3", &w) != CT_OK)
        fail_msg("%s", ct_last_error());
    assert_int_equal(w->count, s->rt.n_params);
    for (int i = 0; i < w->count; i++) {
        const tf_entry *got = &w->entries[i], *g = tf_find(f->g, got->name);
        if (!g || g->numel != got->numel || memcmp(g->data, got->data, sizeof(float) * (size_t)g->numel))
            fail_msg("%s: differs from transformers' tensor(s)", got->name);
    }
    tf_free(w);
    free(want.entries);
}

#define MOE_FOLDER "tests/golden/hf/qwen3_moe_from_transformers"

/* Runs `ctitan ARGS` with its stdout and stderr in DIR/out and DIR/err; its exit status. */
static int ctitan(const char *dir, const char *fmt, ...) {
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const char *bin = getenv("CTITAN");
    snprintf(cmd, sizeof cmd, "%s %s >%s/out 2>%s/err", bin ? bin : "build/ctitan", args, dir, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* DIR/NAME's line count; *first its first line. */
static long file_lines(const char *dir, const char *name, char *first, size_t len) {
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    long n = 0;
    first[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!n && !first[0]) { /* as much of it as fits */
            size_t l = strlen(line) < len ? strlen(line) : len - 1;
            memcpy(first, line, l);
            first[l] = 0;
        }
        n += strchr(line, '\n') != NULL;
    }
    if (f) fclose(f);
    return n;
}

/* A session of model.flavor: from_checkpoint on `path` (a folder: checkpoint.initial_load_in_hf). */
static void open_from_checkpoint(session *s, const char *path, int in_hf) {
    char yaml[1024], mfpath[] = "/tmp/ctitan-test-XXXXXX.yaml";
    snprintf(yaml, sizeof yaml,
             "device: {name: cpu, threads: 2}\n"
             "model: {flavor: from_checkpoint}\n"
             "checkpoint: {initial_load_path: %s, initial_load_in_hf: %s}\n"
             "training: {seq_len: 16, local_batch_size: 2}\n"
             "activation_checkpoint: {mode: none}\n", path, in_hf ? "true" : "false");
    fixture_plugin_path();
    int fd = mkstemps(mfpath, 5);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(yaml, f);
    fclose(f);
    manifest *mf = manifest_load(mfpath);
    unlink(mfpath);
    if (!mf) fail_msg("%s", ct_last_error());
    manifest_add_core_schema(mf);
    if (mdesc_from_checkpoint(mf) != CT_OK) fail_msg("from_checkpoint of %s", path);
    if (session_open(s, mf, 1, 1) != CT_OK) fail_msg("session: %s", ct_last_error());
}

static double logits_error(session *s, const tf_file *g) {
    const tf_entry *want = tf_find(g, "expected.logits");
    float *logits = malloc(sizeof(float) * (size_t)want->numel);
    assert_int_equal(runtime_forward_logits(&s->rt, tf_find(g, "input.tokens")->data, B, T, logits), CT_OK);
    double e = rel_err(logits, want->data, want->numel);
    free(logits);
    return e;
}

/* A folder the pack cannot build: convert exits 2 with one line naming the key, and writes nothing. */
static void refused(const char *tmp, const char *name, const char *sed, const char *want) {
    char cmd[1024], first[512];
    snprintf(cmd, sizeof cmd, "cp -r %s %s/%s && sed -i '%s' %s/%s/config.json", MOE_FOLDER, tmp, name, sed, tmp, name);
    assert_int_equal(system(cmd), 0);
    int st = ctitan(tmp, "convert --from hf --input %s/%s --output %s/%s.ctt", tmp, name, tmp, name);
    long n = file_lines(tmp, "err", first, sizeof first);
    print_message("%s: exit %d: %s", name, st, first);
    if (st != 2 || n != 1 || !strstr(first, want)) fail_msg("%s: exit %d, %ld lines: %s", name, st, n, first);
    snprintf(cmd, sizeof cmd, "%s/%s.ctt", tmp, name);
    assert_int_not_equal(access(cmd, F_OK), 0);
}

static void test_qwen3_moe_folder_converts_and_runs_from_checkpoint(void **state) {
    fixture *f = *state;
    char tmp[] = "/tmp/ct-q3moe-XXXXXX", path[256], first[512];
    assert_non_null(mkdtemp(tmp));
    /* the folder -> a model file, through the pack that claims qwen3_moe */
    if (ctitan(tmp, "convert --from hf --input %s --output %s/a.ctt", MOE_FOLDER, tmp))
        fail_msg("convert --from hf: %s", (file_lines(tmp, "err", first, sizeof first), first));
    file_lines(tmp, "out", first, sizeof first);
    if (!strstr(first, "(qwen3_moe, 27 tensors, float32)")) fail_msg("convert: %s", first);
    /* from_checkpoint of the file and of the folder: transformers' logits */
    for (int in_hf = 0; in_hf < 2; in_hf++) {
        session s;
        snprintf(path, sizeof path, "%s/a.ctt", tmp);
        open_from_checkpoint(&s, in_hf ? MOE_FOLDER : path, in_hf);
        assert_int_equal(s.rt.n_params, 3 + 2 * 12);
        if (!in_hf && session_load_model(&s, path) != CT_OK) fail_msg("%s", ct_last_error());
        if (in_hf) { /* as checkpoint.initial_load_in_hf reads it */
            ct_hf_export x = {.struct_size = sizeof x};
            assert_int_equal(s.m->hf_export(s.model, &x), CT_OK);
            assert_string_equal(x.model_type, "qwen3_moe");
            tf_file want = {0}, *w = NULL;
            want.entries = calloc((size_t)s.rt.n_params, sizeof(tf_entry));
            for (int i = 0; i < s.rt.n_params; i++) {
                const ct_tensor *p = &s.rt.params[i]->t;
                tf_entry *e = &want.entries[want.count++];
                *e = (tf_entry){.name = (char *)p->name, .dtype = TF_F32, .ndim = p->ndim, .numel = ct_tensor_numel(p)};
                memcpy(e->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim);
            }
            if (hf_import_load(MOE_FOLDER, &x, &want, 16, "qwen3", &w) != CT_OK) fail_msg("%s", ct_last_error());
            for (int i = 0; i < s.rt.n_params; i++)
                assert_int_equal(runtime_param_set(&s.rt, i, tf_find(w, runtime_param_key(&s.rt, i))->data), 0);
            tf_free(w);
            free(want.entries);
        }
        double e = logits_error(&s, f->g);
        print_message("from_checkpoint of the %s: logits within %.2e of transformers' (float64)\n",
                      in_hf ? "folder" : "converted file", e);
        if (!(e <= TOL)) fail_msg("logits: relative error %.3g > %.0e", e, TOL);
        session_close(&s);
    }
    /* ctitan -> HF -> ctitan: the same file, byte for byte */
    if (ctitan(tmp, "convert --to hf --input %s/a.ctt --output %s/hf", tmp, tmp) ||
        ctitan(tmp, "convert --from hf --input %s/hf --output %s/b.ctt", tmp, tmp))
        fail_msg("round trip: %s", (file_lines(tmp, "err", first, sizeof first), first));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cmp -s %s/a.ctt %s/b.ctt && grep -q '\"mlp_only_layers\": \\[\\]' %s/hf/config.json", tmp,
             tmp, tmp);
    if (system(cmd)) fail_msg("ctitan -> HF -> ctitan is not byte-identical (or the export lacks mlp_only_layers)");
    refused(tmp, "step2", "s/\"decoder_sparse_step\": 1/\"decoder_sparse_step\": 2/",
            "config.json: decoder_sparse_step must be 1 (model qwen3 runs no other)");
    refused(tmp, "dense0", "s/\"mlp_only_layers\": \\[\\]/\"mlp_only_layers\": [0]/",
            "config.json: mlp_only_layers must be [] (model qwen3 runs no other)");
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

static void test_counts_add_up(void **state) { counts_after_step(*state, 0); }
static void test_forced_balance_spreads_evenly(void **state) { counts_after_step(*state, 1); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_logits_match_transformers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_aux_and_every_gradient_match_transformers, setup, teardown),
        /* full activation checkpointing recomputes the blocks: the aux loss still counts once */
        cmocka_unit_test_setup_teardown(test_loss_aux_and_every_gradient_match_transformers, setup_ac, teardown),
        cmocka_unit_test_setup_teardown(test_transformers_folder_loads_through_the_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen3_moe_folder_converts_and_runs_from_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counts_add_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forced_balance_spreads_evenly, setup_forced, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
