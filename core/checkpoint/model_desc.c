/* model_desc.c: the description a saved model carries (see model_desc.h). */
#include "checkpoint/model_desc.h"

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_pack.h"
#include "io/tensorfile.h"
#include "base/error.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MDESC_VERSION 1
#define MAX_KEY 64
#define MAX_STR 4095 /* a model.name may be a path to the pack */
#define MAX_TEXT (1 << 20) /* bytes of a description */

/* ct_model_desc's fields, by name: the integers, then the reals */
static const char *const int_fields[] = {"dim", "n_layers", "vocab_size", "n_heads", "n_kv_heads", "head_dim",
                                         "ffn_hidden", "features", "rope_original_max_position", NULL};
static const char *const real_fields[] = {"rope_theta", "norm_eps", "rope_scaling_factor", "rope_low_freq_factor",
                                          "rope_high_freq_factor", NULL};

static void desc_values(const ct_model_desc *d, double ints[9], double reals[5]) {
    const int64_t iv[] = {d->dim, d->n_layers, d->vocab_size, d->n_heads, d->n_kv_heads, d->head_dim, d->ffn_hidden,
                          (int64_t)d->features, d->rope_original_max_position};
    const double rv[] = {d->rope_theta, d->norm_eps, d->rope_scaling_factor, d->rope_low_freq_factor,
                         d->rope_high_freq_factor};
    for (int i = 0; i < 9; i++) ints[i] = (double)iv[i];
    for (int i = 0; i < 5; i++) reals[i] = rv[i];
}

/* The model's own value for a pack option named like one of its description's fields: 1 and *v,
 * else 0. Zero is "the pack does not say" (rope scaling's zero: none), so the manifest's is kept. */
static int described(const json_t *model, const char *key, ct_opt_type type, json_t **v) {
    if (type == CT_OPT_BOOL && !strcmp(key, "tie_word_embeddings")) {
        *v = json_boolean(json_integer_value(json_object_get(model, "features")) & CT_MODEL_TIED_EMBEDDINGS);
        return 1;
    }
    if (type != CT_OPT_INT && type != CT_OPT_FLOAT) return 0;
    json_t *x = json_object_get(model, key);
    if (!json_is_number(x) || json_number_value(x) <= 0 || !strcmp(key, "features")) return 0;
    *v = type == CT_OPT_INT ? json_integer((json_int_t)json_number_value(x)) : json_real(json_number_value(x));
    return 1;
}

/* The manifest's value of model.KEY (set or its default) as JSON, or NULL when unset. */
static json_t *manifest_value(const manifest *mf, const char *key, ct_opt_type type) {
    char full[MAX_KEY + 8];
    snprintf(full, sizeof full, "model.%s", key);
    const char *s;
    int64_t i;
    double f;
    int b;
    switch (type) {
    case CT_OPT_INT: return mf_get_int(mf, full, &i) ? NULL : json_integer(i);
    case CT_OPT_FLOAT: return mf_get_float(mf, full, &f) ? NULL : json_real(f);
    case CT_OPT_BOOL: return mf_get_bool(mf, full, &b) ? NULL : json_boolean(b);
    case CT_OPT_STRING: return mf_get_str(mf, full, &s) || strlen(s) > MAX_STR ? NULL : json_string(s);
    }
    return NULL;
}

json_t *mdesc_build(const session *s) {
    json_t *d = json_object(), *model = json_object(), *opts = json_object();
    if (!d || !model || !opts) goto oom;
    double ints[9], reals[5];
    desc_values(&s->rt.desc, ints, reals);
    for (int i = 0; int_fields[i]; i++) json_object_set_new(model, int_fields[i], json_integer((json_int_t)ints[i]));
    for (int i = 0; real_fields[i]; i++) json_object_set_new(model, real_fields[i], json_real(reals[i]));
    const char *hf = s->rt.desc.hf_model_type;
    json_object_set_new(model, "hf_model_type", json_string(hf && strlen(hf) <= MAX_STR ? hf : "llama"));
    const char *str;
    json_object_set_new(d, "format", json_string("ctitan-model"));
    json_object_set_new(d, "version", json_integer(MDESC_VERSION));
    if (s->mf && (str = s->cfg.model_name) && strlen(str) <= MAX_STR) /* read when the session opened */
        json_object_set_new(d, "name", json_string(str));
    if (s->mf && (str = s->cfg.flavor) && strlen(str) <= MAX_STR && strcmp(str, "from_checkpoint"))
        json_object_set_new(d, "flavor", json_string(str));
    const ct_option_spec *list = s->modelp ? s->modelp->info.options : NULL;
    for (int i = 0; list && CT_AT(const ct_option_spec, list, i)->key; i++) {
        const ct_option_spec *o = CT_AT(const ct_option_spec, list, i);
        if (strchr(o->key, '.') || strlen(o->key) > MAX_KEY) continue; /* another section's key */
        json_t *v = NULL;
        if (!described(model, o->key, o->type, &v) && s->mf) v = manifest_value(s->mf, o->key, o->type);
        if (v) json_object_set_new(opts, o->key, v);
    }
    json_object_set_new(d, "options", opts);
    json_object_set_new(d, "model", model);
    return d;
oom:
    json_decref(d);
    json_decref(model);
    json_decref(opts);
    return NULL;
}

static int key_ok(const char *k) {
    size_t n = strlen(k);
    if (n < 1 || n > MAX_KEY) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((k[i] >= 'a' && k[i] <= 'z') || (k[i] >= '0' && k[i] <= '9') || k[i] == '_')) return 0;
    return 1;
}

/* A string of min_len to MAX_STR printable characters (no NUL, no control character). */
static int str_ok(const json_t *v, size_t min_len) {
    if (!json_is_string(v)) return 0;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n < min_len || n > MAX_STR || strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20) return 0;
    return 1;
}

ct_status mdesc_check(const json_t *d, const char *label) {
    const json_t *fmt = json_object_get(d, "format"), *opts = json_object_get(d, "options");
    const json_t *model = json_object_get(d, "model"), *v;
    const char *key;
    if (!json_is_object(d) || !json_is_string(fmt) || strcmp(json_string_value(fmt), "ctitan-model"))
        return ct_fail(CT_ERR_INVALID, "%s: the model description is not an object with format \"ctitan-model\"",
                       label);
    if (json_integer_value(json_object_get(d, "version")) != MDESC_VERSION)
        return ct_fail(CT_ERR_INVALID, "%s: model description version is not %d (a newer ctitan wrote it?)", label,
                       MDESC_VERSION);
    const json_t *flavor = json_object_get(d, "flavor");
    if (!str_ok(json_object_get(d, "name"), 1) || (flavor && !str_ok(flavor, 1)))
        return ct_fail(CT_ERR_INVALID, "%s: model description: name and flavor must be strings of 1 to %d printable "
                       "characters", label, MAX_STR);
    if (!json_is_object(opts) || !json_is_object(model))
        return ct_fail(CT_ERR_INVALID, "%s: model description: options and model must be objects", label);
    json_object_foreach((json_t *)opts, key, v) {
        if (key_ok(key) && (json_is_number(v) || json_is_boolean(v) || str_ok(v, 0))) continue;
        return ct_fail(CT_ERR_INVALID, "%s: model description: option '%.64s' must be a lowercase key with a number, "
                       "a boolean or a short string", label, key);
    }
    for (int i = 0; int_fields[i]; i++) {
        v = json_object_get(model, int_fields[i]);
        if (v && (!json_is_integer(v) || json_integer_value(v) < 0))
            return ct_fail(CT_ERR_INVALID, "%s: model description: %s must be a non-negative integer", label,
                           int_fields[i]);
    }
    for (int i = 0; real_fields[i]; i++) {
        v = json_object_get(model, real_fields[i]);
        if (v && (!json_is_number(v) || json_number_value(v) < 0))
            return ct_fail(CT_ERR_INVALID, "%s: model description: %s must be a non-negative number", label,
                           real_fields[i]);
    }
    v = json_object_get(model, "hf_model_type");
    if (v && !str_ok(v, 1))
        return ct_fail(CT_ERR_INVALID, "%s: model description: hf_model_type must be a short string", label);
    return CT_OK;
}

int mdesc_field(const json_t *d, const char *field, double *out) {
    const json_t *v = json_object_get(json_object_get(d, "model"), field);
    if (!json_is_number(v)) return 0;
    *out = json_number_value(v);
    return 1;
}

/* The "model" object of a step folder's metadata.json (checked by mdesc_read's caller). */
static ct_status read_metadata(const char *dir, json_t **out) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/metadata.json", dir) >= (int)sizeof path)
        return ct_fail(CT_ERR_INVALID, "%s: path too long", dir);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ct_fail(CT_ERR_INVALID, "%s:%d: not a checkpoint (%s)", path, je.line, je.text);
    *out = json_incref(json_object_get(root, "model"));
    json_decref(root);
    return CT_OK;
}

/* A Hugging Face folder's description: the model pack its model_type names, created from its config.json. */
static ct_status read_hf(const char *dir, json_t **out) {
    hf_pack k;
    ct_status rc = hf_pack_from_folder(dir, NULL, &k);
    if (rc == CT_OK && !(*out = hf_pack_describe(&k))) rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", dir);
    hf_pack_close(&k);
    return rc;
}

ct_status mdesc_read(const char *path, int in_hf, json_t **out) {
    *out = NULL;
    if (in_hf) return read_hf(path, out);
    struct stat sb;
    if (stat(path, &sb)) return ct_fail(CT_ERR_INVALID, "%s: no such file or folder", path);
    if (!S_ISDIR(sb.st_mode)) { /* a model file */
        tf_file *f = tf_read_first(path, MAX_TEXT); /* written first: the weights are not read */
        if (!f) return CT_ERR_INVALID;
        char *text = NULL;
        ct_status st = tf_text(f, path, MDESC_ENTRY, &text); /* CT_OK and NULL when it has none */
        tf_free(f);
        if (st != CT_OK) return CT_ERR_INVALID;
        if (!text) return CT_OK;
        json_error_t je;
        *out = json_loads(text, JSON_REJECT_DUPLICATES, &je);
        free(text);
        if (!*out) return ct_fail(CT_ERR_INVALID, "%s: tensor '%s': invalid JSON (%s)", path, MDESC_ENTRY, je.text);
    } else {
        char meta[PATH_MAX], dir[PATH_MAX];
        snprintf(meta, sizeof meta, "%s/metadata.json", path);
        snprintf(dir, sizeof dir, "%s", path);
        if (stat(meta, &sb)) { /* a checkpoint folder: its newest step */
            int64_t *steps;
            int n;
            ct_status st = ckpt_steps(path, 0, &steps, &n);
            if (st != CT_OK) return st;
            int64_t newest = n > 0 ? steps[0] : -1;
            free(steps);
            if (newest < 0)
                return ct_fail(CT_ERR_INVALID, "%s: no complete checkpoint here (a step-N folder with metadata.json)",
                               path);
            snprintf(dir, sizeof dir, "%s/step-%" PRId64, path, newest);
        }
        ct_status st = read_metadata(dir, out);
        if (st != CT_OK || !*out) return st;
    }
    ct_status st = mdesc_check(*out, path);
    if (st != CT_OK) {
        json_decref(*out);
        *out = NULL;
    }
    return st;
}

/* A JSON scalar as a manifest value. */
static void value_text(const json_t *v, char *out, size_t len) {
    if (json_is_integer(v)) snprintf(out, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 1e15)
        snprintf(out, len, "%.0f", json_real_value(v)); /* 500000, not 5e+05 */
    else if (json_is_real(v)) /* the shortest form that reads back the same (1e-05, not 1.0000000000000001e-05) */
        for (int p = 1; p <= 17; p++) {
            snprintf(out, len, "%.*g", p, json_real_value(v));
            if (strtod(out, NULL) == json_real_value(v)) break;
        }
    else if (json_is_boolean(v)) snprintf(out, len, "%s", json_is_true(v) ? "true" : "false");
    else snprintf(out, len, "%s", json_string_value(v));
}

/* Whether the manifest's text `text` means the description's value v. */
static int same_value(const char *text, const json_t *v) {
    int64_t i;
    double f;
    int b;
    if (json_is_number(v)) {
        if (!mf_parse_int(text, &i)) return (double)i == json_number_value(v);
        return !mf_parse_float(text, &f) && f == json_number_value(v);
    }
    if (json_is_boolean(v)) return !mf_parse_bool(text, &b) && b == json_is_true(v);
    return !strcmp(text, json_string_value(v));
}

/* One key: set when the manifest does not, else compared. */
static ct_status apply_key(manifest *mf, const char *key, const json_t *v, const char *label) {
    char want[MAX_STR + 64], where[600];
    const char *have;
    value_text(v, want, sizeof want);
    if (!mf_is_set(mf, key) || (!strcmp(key, "model.flavor") && !mf_get_str(mf, key, &have) &&
                                !strcmp(have, "from_checkpoint")))
        return manifest_override(mf, key, want) != CT_OK ? CT_ERR_INVALID : CT_OK;
    if (mf_get_str(mf, key, &have) || same_value(have, v)) return CT_OK;
    mf_where(mf, key, where, sizeof where);
    return ct_fail(CT_ERR_INVALID, "%s: %.100s contradicts the checkpoint's %s (%s); drop the key or make it agree",
                   where, have, want, label);
}

ct_status mdesc_apply(manifest *mf, const json_t *d, const char *label, int compare_flavor) {
    const char *key;
    json_t *v;
    char full[MAX_KEY + 8];
    if (apply_key(mf, "model.name", json_object_get(d, "name"), label)) return CT_ERR_INVALID;
    v = json_object_get(d, "flavor");
    const char *flavor;
    if (v && (compare_flavor || !mf_is_set(mf, "model.flavor") ||
              (!mf_get_str(mf, "model.flavor", &flavor) && !strcmp(flavor, "from_checkpoint"))) &&
        apply_key(mf, "model.flavor", v, label))
        return CT_ERR_INVALID;
    json_object_foreach(json_object_get(d, "options"), key, v) {
        snprintf(full, sizeof full, "model.%s", key);
        if (apply_key(mf, full, v, label)) return CT_ERR_INVALID;
    }
    return CT_OK;
}

ct_status mdesc_from_checkpoint(manifest *mf) {
    char where[600];
    const char *flavor, *path;
    if (mf_get_str(mf, "model.flavor", &flavor) || strcmp(flavor, "from_checkpoint")) return CT_OK;
    mf_where(mf, "model.flavor", where, sizeof where);
    if (mf_get_str(mf, "checkpoint.initial_load_path", &path) || !*path) {
        fprintf(stderr, "ctitan: %s: from_checkpoint takes the model from checkpoint.initial_load_path, which is not "
                        "set\n", where);
        return CT_ERR_INVALID;
    }
    int in_hf = 0;
    mf_get_bool(mf, "checkpoint.initial_load_in_hf", &in_hf);
    json_t *d;
    char beside[PATH_MAX];
    if (in_hf) path = ckpt_hf_folder(path, beside, sizeof beside);
    if (mdesc_read(path, in_hf, &d) != CT_OK) {
        fprintf(stderr, "ctitan: %s: %s\n", where, ct_last_error());
        return CT_ERR_INVALID;
    }
    if (!d) {
        fprintf(stderr, "ctitan: %s: %s carries no model description (an older ctitan wrote it): set model.name, "
                        "model.flavor and the model's sizes instead\n", where, path);
        return CT_ERR_INVALID;
    }
    ct_status rc = mdesc_apply(mf, d, path, 1);
    json_decref(d);
    if (rc != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

ct_status mdesc_for_load(manifest *mf, const char *path) {
    struct stat sb;
    json_t *d;
    if (stat(path, &sb)) return CT_OK;
    if (mdesc_read(path, 0, &d) != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    ct_status rc = d ? mdesc_apply(mf, d, path, 0) : CT_OK;
    json_decref(d);
    if (rc != CT_OK) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* The pack's buffers after the weights (w NULL on the ranks that do not write), each as the stage that runs
 * its block holds it; session_load_model restores them. */
static ct_status save_buffers(session *s, tf_writer *w, const char *path) {
    const ct_model_buffer *b;
    int nb = session_buffers(s, &b);
    for (int i = 0; i < nb; i++) {
        float *data = malloc(sizeof(float) * (size_t)(b[i].numel > 0 ? b[i].numel : 1));
        ct_status st = data ? session_buffer_get(s, &b[i], data) : CT_ERR_NOMEM;
        if (st == CT_OK && w && tf_writer_add(w, b[i].name, 1, 1, &b[i].numel, data) != CT_OK)
            st = ct_fail(CT_ERR_IO, "%s (writing %s)", tf_writer_error(w), b[i].name);
        else if (st != CT_OK)
            st = ct_fail(st, "%s: cannot gather %s: %s", path, b[i].name, data ? ct_last_error() : "out of memory");
        free(data);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

ct_status ckpt_save_model(session *s, const char *path) {
    /* every rank gathers (a collective for sharded parameters); rank 0 writes */
    char err[2048] = "";
    tf_writer *w = s->rank == 0 ? tf_writer_open(path) : NULL;
    if (s->rank == 0 && !w) return CT_ERR_IO;
    /* the description's failure: rank 0 still joins every gather below (which may set errors of their
     * own), then reports it from err */
    int failed = 0;
    if (w) { /* first, so that a reader finds it before the weights */
        json_t *d = mdesc_build(s);
        char *text = d ? json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(d);
        if ((failed = !text || tf_writer_add_text(w, MDESC_ENTRY, text) != CT_OK)) {
            snprintf(err, sizeof err, "%s: %s (writing the model description)", path,
                     text ? tf_writer_error(w) : "out of memory");
            tf_writer_abort(w);
            w = NULL;
        }
        free(text);
    }
    float *buf = NULL;
    for (int i = 0; i < s->rt.n_params; i++) {
        ct_tensor *t = &s->rt.params[i]->t;
        const int64_t *shape = runtime_global_shape(&s->rt, i);
        if (runtime_param_copy_of(&s->rt, i) >= 0) continue; /* a shared parameter is written once */
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= shape[d];
        float *grown = realloc(buf, sizeof(float) * (size_t)n);
        if (!grown || runtime_param_get(&s->rt, i, grown, 0) != CT_OK ||
            (w && tf_writer_add(w, t->name, 1, t->ndim, shape, grown) != CT_OK)) {
            ct_status st;
            if (grown) buf = grown;
            if (w && tf_writer_error(w)[0]) st = ct_fail(CT_ERR_IO, "%s (writing %s)", tf_writer_error(w), t->name);
            else st = ct_fail(grown ? CT_ERR_INTERNAL : CT_ERR_NOMEM, "%s: cannot gather %s: %s", path, t->name,
                              grown ? ct_last_error() : "out of memory");
            free(buf);
            if (w) tf_writer_abort(w);
            return st;
        }
        buf = grown;
    }
    free(buf);
    ct_status bst = save_buffers(s, w, path);
    if (bst != CT_OK) {
        if (w) tf_writer_abort(w);
        return bst;
    }
    if (failed) return ct_fail(CT_ERR_IO, "%s", err);
    if (w && tf_writer_close(w) != CT_OK) return CT_ERR_IO;
    return CT_OK;
}
