/* hf_pack.c: a model pack created for a Hugging Face folder or a model file (see hf_pack.h). */
#include "checkpoint/hf_pack.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"

#define SEQ_LEN 2048 /* what a pack is told at create: sizes and tables do not depend on it */

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The plugin's hf_import, when it is a model pack built against 2.16 or later that has one. */
static const ct_hf_import *import_of(const plugin *p) {
    const ct_model_api *api = p->info.api;
    if (p->info.kind != CT_KIND_MODEL || p->info.abi_minor < 16 || !CT_HAS_FIELD(api, ct_model_api, hf_import))
        return NULL;
    const ct_hf_import *im = api->hf_import;
    return im && CT_HAS_FIELD(im, ct_hf_import, options) && im->model_type && im->options ? im : NULL;
}

/* The further model_types of a pack built against 2.18 or later (ct_hf_import.more_model_types). */
static const char *const *more_types_of(const plugin *p, const ct_hf_import *im) {
    return p->info.abi_minor >= 18 && CT_HAS_FIELD(im, ct_hf_import, more_model_types) ? im->more_model_types : NULL;
}

/* Whether the pack's hf_import runs config.json's model_type `type`. */
static int runs_type(const plugin *p, const ct_hf_import *im, const char *type) {
    if (!strcmp(im->model_type, type)) return 1;
    for (const char *const *t = more_types_of(p, im); t && *t; t++)
        if (!strcmp(*t, type)) return 1;
    return 0;
}

/* Appends "type" to a list of quoted model_types for a message, once. */
static void add_known(char *known, size_t len, const char *type) {
    char quoted[80];
    snprintf(quoted, sizeof quoted, "\"%.64s\"", type);
    size_t used = strlen(known);
    if (!strstr(known, quoted) && used + strlen(quoted) + 3 < len)
        snprintf(known + used, len - used, "%s%s", used ? ", " : "", quoted);
}

/* Calls fn on every ctitan-*.so of the search path that loads, in order (folders, then names); stops
 * when fn returns non-zero and returns that. */
static int each_plugin(int (*fn)(const plugin *p, void *ctx), void *ctx) {
    char dirs[16][PATH_MAX];
    int nd = plugin_search_dirs(NULL, dirs, 16), found = 0;
    for (int d = 0; d < nd && !found; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir) continue;
        char **names = NULL;
        int nn = 0;
        for (struct dirent *e; (e = readdir(dir));) {
            size_t l = strlen(e->d_name);
            if (strncmp(e->d_name, "ctitan-", 7) || l < 11 || strcmp(e->d_name + l - 3, ".so")) continue;
            char **grown = realloc(names, sizeof *names * (size_t)(nn + 1));
            if (!grown) break;
            names = grown;
            if (!(names[nn] = strdup(e->d_name))) break;
            nn++;
        }
        closedir(dir);
        if (nn) qsort(names, (size_t)nn, sizeof *names, cmp_names);
        for (int i = 0; i < nn; i++) {
            char path[PATH_MAX + 256];
            plugin *p = !found && snprintf(path, sizeof path, "%s/%s", dirs[d], names[i]) < (int)sizeof path
                            ? plugin_open(path) : NULL;
            if (p) found = fn(p, ctx);
            plugin_unload(p);
            free(names[i]);
        }
        free(names);
    }
    ct_clear_error(); /* a file that is no plugin of this host is not this search's error */
    return found;
}

typedef struct finder {
    const char *model_type;
    char *path;
    size_t len;
    char known[512]; /* the model types seen, for the message */
} finder;

static int match_type(const plugin *p, void *ctx) {
    finder *f = ctx;
    const ct_hf_import *im = import_of(p);
    if (!im) return 0;
    if (runs_type(p, im, f->model_type)) {
        snprintf(f->path, f->len, "%s", p->path);
        return 1;
    }
    add_known(f->known, sizeof f->known, im->model_type);
    for (const char *const *t = more_types_of(p, im); t && *t; t++) add_known(f->known, sizeof f->known, *t);
    return 0;
}

ct_status hf_pack_find(const char *model_type, const char *label, char *path, size_t len) {
    finder f = {model_type, path, len, ""};
    if (each_plugin(match_type, &f)) return CT_OK;
    char got[64];
    snprintf(got, sizeof got, "%s", model_type);
    for (char *c = got; *c; c++)
        if ((unsigned char)*c < 0x20) *c = '?';
    return ct_fail(CT_ERR_INVALID, "%s: model_type '%s' is not supported (the model packs on the plugin search path "
                   "run %s; set CTITAN_PLUGIN_PATH to add one)", label, got, *f.known ? f.known : "none");
}

/* ---- a registry that keeps names and shapes only -------------------------------------------------- */

static ct_tensor *keep(hf_pack *k, const char *name, int ndim, const int64_t *shape) {
    ct_tensor **grown = realloc(k->made, sizeof *grown * (size_t)(k->n_made + 1));
    ct_tensor *t = calloc(1, sizeof *t);
    char *copy = strdup(name);
    if (!grown || !t || !copy) {
        if (grown) k->made = grown;
        free(t);
        free(copy);
        return NULL;
    }
    k->made = grown;
    t->struct_size = sizeof *t;
    t->dtype = CT_F32;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->name = copy;
    k->made[k->n_made++] = t;
    return t;
}

/* The pack's buffers (ABI 2.20) after the parameters in want: converted like them, by the same table. */
static ct_status want_buffers(hf_pack *k) {
    const ct_model_buffer *b = NULL;
    int n = CT_HAS_FIELD(k->api, ct_model_api, buffers) && k->api->buffers ? k->api->buffers(k->model, &b) : 0;
    if (n <= 0 || !b) return CT_OK;
    tf_entry *grown = realloc(k->want->entries, sizeof *grown * (size_t)(k->want->count + n));
    if (!grown) return ct_fail(CT_ERR_NOMEM, "out of memory");
    k->want->entries = grown;
    for (int i = 0; i < n; i++)
        grown[k->want->count++] = (tf_entry){.name = (char *)b[i].name, .dtype = TF_F32, .ndim = 1,
                                             .shape = {b[i].numel}, .numel = b[i].numel};
    k->n_buffers = n;
    return CT_OK;
}

static ct_tensor *reg_add(ct_param_registry *r, int unit, const char *name, int ndim, const int64_t *shape,
                          const ct_init *init, uint32_t flags) {
    (void)unit, (void)init, (void)flags;
    hf_pack *k = r->ctx;
    if (!name || ndim < 1 || ndim > CT_MAX_DIMS) {
        ct_set_error("parameter '%s': a name and 1 to %d dimensions are needed", name ? name : "", CT_MAX_DIMS);
        return NULL;
    }
    ct_tensor *t = keep(k, name, ndim, shape);
    tf_entry *grown = t ? realloc(k->want->entries, sizeof *grown * (size_t)(k->want->count + 1)) : NULL;
    if (!grown) {
        ct_set_error("out of memory");
        return NULL;
    }
    k->want->entries = grown;
    tf_entry *e = &grown[k->want->count++];
    memset(e, 0, sizeof *e);
    e->name = (char *)t->name;
    e->dtype = TF_F32;
    e->ndim = ndim;
    e->numel = 1;
    for (int d = 0; d < ndim; d++) {
        e->shape[d] = shape[d];
        e->numel *= shape[d];
    }
    return t;
}

static ct_tensor *reg_share(ct_param_registry *r, int unit, const char *use_name, ct_tensor *param) {
    (void)unit;
    hf_pack *k = r->ctx;
    if (!k->shared[0]) snprintf(k->shared, sizeof k->shared, "%s", use_name ? use_name : "");
    ct_tensor *t = param ? keep(k, use_name ? use_name : param->name, param->ndim, param->shape) : NULL;
    if (!t) ct_set_error("out of memory");
    return t;
}

/* ---- creating the pack ------------------------------------------------------------------------------ */

static const ct_option_spec *option_of(const plugin *p, const char *key) {
    for (int i = 0; p->info.options && CT_AT(const ct_option_spec, p->info.options, i)->key; i++)
        if (!strcmp(CT_AT(const ct_option_spec, p->info.options, i)->key, key))
            return CT_AT(const ct_option_spec, p->info.options, i);
    return NULL;
}

/* A JSON scalar as a manifest writes it: integers in full, reals in the shortest form that reads back. */
static void scalar_text(const json_t *v, char *out, size_t len) {
    if (json_is_integer(v)) snprintf(out, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        for (int p = 1; p <= 17; p++) {
            snprintf(out, len, "%.*g", p, json_real_value(v));
            if (strtod(out, NULL) == json_real_value(v)) break;
        }
    else if (json_is_boolean(v)) snprintf(out, len, "%s", json_is_true(v) ? "true" : "false");
    else snprintf(out, len, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* Sets model.KEY to v in k's manifest and records it (typed as the option is). */
static ct_status set_option(hf_pack *k, const ct_option_spec *o, json_t *v, const char *label) {
    char key[MF_MAX_KEY_LEN + 1], text[4200];
    snprintf(key, sizeof key, "model.%s", o->key);
    scalar_text(v, text, sizeof text);
    json_t *typed = o->type == CT_OPT_FLOAT && json_is_integer(v) ? json_real((double)json_integer_value(v))
                                                                  : json_incref(v);
    if (json_object_set_new(k->set, o->key, typed)) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", label);
    if (manifest_override(k->mf, key, text) != CT_OK)
        return ct_fail(CT_ERR_INVALID, "%s: %s", label, ct_last_error());
    return CT_OK;
}

/* Whether s is one of choices ("a|b|c"). */
static int is_choice(const char *choices, const char *s) {
    size_t n = strlen(s);
    for (const char *c = choices; c && *c;) {
        const char *end = strchr(c, '|');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == n && !strncmp(c, s, n)) return 1;
        c = end ? end + 1 : c + len;
    }
    return 0;
}

/* config.json's value for one link, checked against the option's type; *v NULL when absent and
 * optional. */
static ct_status link_value(json_t *view, const ct_hf_option *l, const ct_option_spec *o, const char *label,
                            json_t **v) {
    json_t *x = hf_config_get(view, l->key);
    if ((!x || json_is_null(x)) && l->fallback) x = hf_config_get(view, l->fallback);
    if (x && json_is_null(x)) x = NULL;
    *v = NULL;
    if (!x && l->dflt) {
        int64_t i;
        double f;
        int b;
        x = o->type == CT_OPT_INT && !mf_parse_int(l->dflt, &i)     ? json_integer(i)
            : o->type == CT_OPT_FLOAT && !mf_parse_float(l->dflt, &f) ? json_real(f)
            : o->type == CT_OPT_BOOL && !mf_parse_bool(l->dflt, &b)   ? json_boolean(b)
            : o->type == CT_OPT_STRING                                 ? json_string(l->dflt)
                                                                       : NULL;
        if (!x) return ct_fail(CT_ERR_INVALID, "%s: the pack's default '%s' of key '%s' is not a value of option %s",
                               label, l->dflt, l->key, o->key);
        *v = x;
        return CT_OK;
    }
    if (!x) {
        if (l->flags & CT_HF_OPTIONAL) return CT_OK;
        return ct_fail(CT_ERR_INVALID, "%s: key '%s' is missing", label, l->key);
    }
    int ok = 1;
    switch (o->type) {
    case CT_OPT_INT: ok = json_is_integer(x) && json_integer_value(x) >= 1 && json_integer_value(x) <= INT32_MAX; break;
    case CT_OPT_FLOAT: ok = json_is_number(x) && isfinite(json_number_value(x)); break;
    case CT_OPT_BOOL: ok = json_is_boolean(x); break;
    case CT_OPT_STRING: ok = json_is_string(x) && strlen(json_string_value(x)) < 4096; break;
    }
    if (!ok)
        return ct_fail(CT_ERR_INVALID, o->type == CT_OPT_BOOL ? "%s: %s must be true or false" : "%s: key '%s' must be %s",
                       label, l->key,
                       o->type == CT_OPT_INT ? "a positive integer" : o->type == CT_OPT_FLOAT ? "a number" : "a string");
    if (o->type == CT_OPT_STRING && o->choices && !is_choice(o->choices, json_string_value(x))) {
        char got[64];
        snprintf(got, sizeof got, "%s", json_string_value(x));
        for (char *c = got; *c; c++)
            if ((unsigned char)*c < 0x20) *c = '?';
        return ct_fail(CT_ERR_INVALID, "%s: %s '%s' is not supported (the pack's model.%s takes %s)", label, l->key,
                       got, o->key, o->choices);
    }
    *v = json_incref(x);
    return CT_OK;
}

/* Opens the pack at path with an empty model section of its options. */
static ct_status open_pack(const char *path, hf_pack *k) {
    memset(k, 0, sizeof *k);
    if (!(k->p = plugin_open(path))) return CT_ERR_INVALID;
    if (k->p->info.kind != CT_KIND_MODEL) {
        return ct_fail(CT_ERR_INVALID, "%s: plugin '%s' is a %s plugin, expected a model plugin", path,
                       k->p->info.name, plugin_kind_name(k->p->info.kind));
    }
    k->api = k->p->info.api;
    k->im = import_of(k->p);
    k->set = json_object();
    k->want = calloc(1, sizeof *k->want);
    if (!(k->mf = manifest_new()) || !k->set || !k->want) return ct_fail(CT_ERR_NOMEM, "out of memory");
    k->want->version = TF_VERSION;
    manifest_add_core_schema(k->mf);
    manifest_add_plugin_schema(k->mf, "model", k->p->info.options);
    k->p->section = "model";
    k->p->mf = k->mf;
    return manifest_override(k->mf, "model.name", k->p->info.name);
}

/* Creates the instance with the options set, then its description, parameters and table. */
static ct_status create(hf_pack *k, const char *flavor, const char *label) {
    const char *name = k->p->info.name;
    if (manifest_validate(k->mf) != CT_OK) return ct_fail(CT_ERR_INVALID, "%s: %s", label, ct_last_error());
    if (!flavor) flavor = k->api->flavors && k->api->flavors[0] ? k->api->flavors[0] : "";
    ct_model_config cfg = {sizeof cfg, flavor, SEQ_LEN};
    ct_clear_error();
    if (k->api->create(&k->p->host, &cfg, &k->model) != CT_OK) {
        k->model = NULL;
        return ct_fail(CT_ERR_INVALID, "%s: model %s: %s", label, name, ct_last_error());
    }
    k->desc.struct_size = sizeof k->desc;
    ct_param_registry reg = {sizeof reg, k, reg_add, reg_share};
    if (k->api->describe(k->model, &k->desc) != CT_OK || k->api->declare_params(k->model, &reg) != CT_OK)
        return ct_fail(CT_ERR_INVALID, "%s: model %s: %s", label, name, ct_last_error());
    if (want_buffers(k) != CT_OK) return CT_ERR_NOMEM;
    if (!CT_HAS_FIELD(k->api, ct_model_api, hf_export) || !k->api->hf_export)
        return ct_fail(CT_ERR_INVALID, "%s: model %s has no Hugging Face form (its pack gives no hf_export)", label,
                       name);
    k->x.struct_size = sizeof k->x;
    if (k->api->hf_export(k->model, &k->x) != CT_OK)
        return ct_fail(CT_ERR_INVALID, "%s: model %s: its Hugging Face table: %s", label, name, ct_last_error());
    return CT_OK;
}

ct_status hf_pack_from_folder(const char *dir, const char *pack_name, hf_pack *k) {
    char path[PATH_MAX], label[PATH_MAX + 16];
    snprintf(label, sizeof label, "%s/config.json", dir);
    memset(k, 0, sizeof *k);
    json_t *root = hf_config_read(label), *view = NULL;
    if (!root) return CT_ERR_INVALID;
    ct_status st = hf_config_view(root, label, &view);
    json_t *type = json_object_get(root, "model_type");
    if (st == CT_OK && !json_is_string(type))
        st = ct_fail(CT_ERR_INVALID, "%s: key 'model_type' is %s (it names the model pack)", label,
                     type ? "not a string" : "missing");
    json_t *tie = json_object_get(root, "tie_word_embeddings"); /* every config's key: how a folder holds its head */
    if (st == CT_OK && tie && !json_is_null(tie) && !json_is_boolean(tie))
        st = ct_fail(CT_ERR_INVALID, "%s: tie_word_embeddings must be true or false", label);
    if (st == CT_OK && !pack_name) st = hf_pack_find(json_string_value(type), label, path, sizeof path);
    else if (st == CT_OK) snprintf(path, sizeof path, "%s", pack_name);
    if (st == CT_OK) st = open_pack(path, k);
    const ct_hf_import *im = st == CT_OK ? import_of(k->p) : NULL;
    if (st == CT_OK && !im)
        st = ct_fail(CT_ERR_INVALID, "%s: model %s cannot be created from a Hugging Face folder (its pack gives no "
                     "hf_import)", label, k->p->info.name);
    else if (st == CT_OK && !runs_type(k->p, im, json_string_value(type))) {
        char known[512] = "";
        add_known(known, sizeof known, im->model_type);
        for (const char *const *t = more_types_of(k->p, im); t && *t; t++) add_known(known, sizeof known, *t);
        st = ct_fail(CT_ERR_INVALID, "%s: model_type '%.60s' is not model %s's %s", label, json_string_value(type),
                     k->p->info.name, known);
    }
    for (const ct_hf_option *l = im ? im->options : NULL; st == CT_OK && l && l->key; l++) {
        const ct_option_spec *o = l->option ? option_of(k->p, l->option) : NULL;
        json_t *v = NULL;
        if (!o) st = ct_fail(CT_ERR_INVALID, "%s: model %s links key '%s' to option '%s', which it does not declare",
                             label, k->p->info.name, l->key, l->option ? l->option : "");
        else if ((st = link_value(view, l, o, label, &v)) == CT_OK && v) st = set_option(k, o, v, label);
        json_decref(v);
    }
    if (st == CT_OK) st = create(k, NULL, label);
    if (st == CT_OK) st = hf_import_check_folder(dir, &k->x, im->options, k->p->info.name); /* what the pack cannot run */
    json_decref(view);
    json_decref(root);
    return st;
}

ct_status hf_pack_from_options(const char *name, const char *model_type, const json_t *opts, const char *flavor,
                               const char *label, hf_pack *k) {
    char path[PATH_MAX];
    memset(k, 0, sizeof *k);
    ct_status st = CT_OK;
    plugin *by_name = plugin_load(name, CT_KIND_MODEL, "model", NULL);
    if (by_name) snprintf(path, sizeof path, "%s", by_name->path);
    plugin_unload(by_name);
    if (!by_name && !model_type) return ct_fail(CT_ERR_INVALID, "%s: %s", label, ct_last_error());
    if (!by_name) st = hf_pack_find(model_type, label, path, sizeof path);
    if (st == CT_OK) st = open_pack(path, k);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)opts, key, v) {
        const ct_option_spec *o = st == CT_OK ? option_of(k->p, key) : NULL;
        if (st != CT_OK) break;
        if (!o) st = ct_fail(CT_ERR_INVALID, "%s: model %s has no option '%s'", label, k->p->info.name, key);
        else st = set_option(k, o, v, label);
    }
    if (st == CT_OK) st = create(k, flavor, label);
    return st;
}

/* ---- the description and the model line ------------------------------------------------------------ */

json_t *hf_pack_describe(const hf_pack *k) {
    const ct_model_desc *d = &k->desc;
    json_t *out = json_object(), *model = json_object(), *opts = json_deep_copy(k->set);
    if (!out || !model || !opts) goto oom;
    const struct { const char *key; int64_t v; } ints[] = {
        {"dim", d->dim}, {"n_layers", d->n_layers}, {"vocab_size", d->vocab_size}, {"n_heads", d->n_heads},
        {"n_kv_heads", d->n_kv_heads}, {"ffn_hidden", d->ffn_hidden}, {"head_dim", d->head_dim},
        {"features", (int64_t)d->features}};
    const struct { const char *key; double v; } reals[] = {{"rope_theta", d->rope_theta}, {"norm_eps", d->norm_eps}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) json_object_set_new(model, ints[i].key, json_integer(ints[i].v));
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++) json_object_set_new(model, reals[i].key, json_real(reals[i].v));
    if (d->rope_scaling_factor != 0) { /* RoPE's scaling, only when it scales */
        json_object_set_new(model, "rope_scaling_factor", json_real(d->rope_scaling_factor));
        json_object_set_new(model, "rope_low_freq_factor", json_real(d->rope_low_freq_factor));
        json_object_set_new(model, "rope_high_freq_factor", json_real(d->rope_high_freq_factor));
        json_object_set_new(model, "rope_original_max_position", json_integer(d->rope_original_max_position));
    }
    json_object_set_new(model, "hf_model_type", json_string(k->x.model_type ? k->x.model_type : ""));
    /* the options named like a field of the description take the model's value (as a saved model's do) */
    for (int i = 0; k->p->info.options && CT_AT(const ct_option_spec, k->p->info.options, i)->key; i++) {
        const ct_option_spec *o = CT_AT(const ct_option_spec, k->p->info.options, i);
        if (o->type == CT_OPT_BOOL && !strcmp(o->key, "tie_word_embeddings")) {
            json_object_set_new(opts, o->key, json_boolean(d->features & CT_MODEL_TIED_EMBEDDINGS));
            continue;
        }
        json_t *x = json_object_get(model, o->key);
        if ((o->type != CT_OPT_INT && o->type != CT_OPT_FLOAT) || !json_is_number(x) || json_number_value(x) <= 0 ||
            !strcmp(o->key, "features"))
            continue;
        json_object_set_new(opts, o->key, o->type == CT_OPT_INT ? json_integer((json_int_t)json_number_value(x))
                                                                : json_real(json_number_value(x)));
    }
    json_object_set_new(out, "format", json_string("ctitan-model"));
    json_object_set_new(out, "version", json_integer(1));
    json_object_set_new(out, "name", json_string(k->p->info.name));
    json_object_set_new(out, "options", opts);
    json_object_set_new(out, "model", model);
    return out;
oom:
    json_decref(out);
    json_decref(model);
    json_decref(opts);
    return NULL;
}

/* The shortest %g form that reads back as x (whole numbers in full). */
static void short_g(char *out, size_t len, double x) {
    if (x == floor(x) && fabs(x) < 1e16) {
        snprintf(out, len, "%.0f", x);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(out, len, "%.*g", p, x);
        if (strtod(out, NULL) == x) break;
    }
}

static void print_option(FILE *out, const char *key, const json_t *v) {
    char text[4200];
    if (json_is_real(v)) short_g(text, sizeof text, json_real_value(v));
    else scalar_text(v, text, sizeof text);
    fprintf(out, ", %s: %s", key, text);
}

void hf_pack_print_model(const hf_pack *k, const json_t *desc, FILE *out) {
    const json_t *opts = json_object_get(desc, "options");
    const ct_hf_import *im = import_of(k->p);
    fprintf(out, "model: {name: %s", k->p->info.name);
    for (const ct_hf_option *l = im ? im->options : NULL; l && l->key; l++) {
        const json_t *v = l->option ? json_object_get(opts, l->option) : NULL;
        int again = 0; /* an option two keys link is printed once */
        for (const ct_hf_option *e = im->options; e < l && !again; e++) again = e->option && !strcmp(e->option, l->option);
        if (v && !again) print_option(out, l->option, v);
    }
    fprintf(out, "}\n");
}

void hf_pack_close(hf_pack *k) {
    if (k->model) k->api->destroy(k->model);
    for (int i = 0; i < k->n_made; i++) {
        free((char *)k->made[i]->name);
        free(k->made[i]);
    }
    free(k->made);
    if (k->want) free(k->want->entries);
    free(k->want);
    json_decref(k->set);
    if (k->p) plugin_unload(k->p);
    manifest_free(k->mf);
    memset(k, 0, sizeof *k);
}
