/* cmd_convert.c: `ctitan convert --to hf` (ctitan .ctt -> Hugging Face folder) and `--from hf` (back). */
#include "cmd/cmd_convert.h"

#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/hf_pack.h"
#include "checkpoint/model_desc.h"
#include "io/hf_export.h"
#include "io/tensorfile.h"

#define ERRLEN 1024

static const char usage[] =
    "usage: ctitan convert --to hf --input MODEL.ctt --output DIR [--dtype float32|bfloat16]\n"
    "                      [--n-heads H] [--n-kv-heads K] [--rope-theta X] [--norm-eps X]\n"
    "                      [--max-position-embeddings N] [--model PACK]\n"
    "       ctitan convert --from hf --input DIR --output MODEL.ctt [--model PACK]\n"
    "\n"
    "Converts a model between ctitan's model file (a .ctt of float32 parameters under torchtitan's\n"
    "names, as `ctitan train` saves it) and a Hugging Face folder (config.json + model.safetensors),\n"
    "through the model pack's own tables: its Hugging Face names, the q and k rows it permutes between\n"
    "ctitan's interleaved RoPE pairs and Hugging Face's halves, its config.json fields, and how\n"
    "config.json sets its options. A float32 round trip is bit-exact. The pack is the one the model\n"
    "file's description names (else the one that runs its model_type), or for a folder the model pack\n"
    "on the plugin search path that runs its model_type (`ctitan plugins` lists the packs); --model names\n"
    "another (a name or the path of a .so).\n"
    "\n"
    "  --to hf             write DIR/config.json and DIR/model.safetensors (DIR is created if missing).\n"
    "                      The model comes from the description every saved model carries (a flag that\n"
    "                      contradicts it is refused). A file without one (an older ctitan's, a golden\n"
    "                      file) is a model of the default pack (model.name's default): its sizes from the\n"
    "                      tensors' shapes, the heads, RoPE base, RoPE scaling and norm epsilon\n"
    "                      from the flags below, or its config.n_heads, config.n_kv_heads,\n"
    "                      config.rope_theta, config.norm_eps and config.rope_scaling_* scalars; other\n"
    "                      non-parameter entries are ignored.\n"
    "  --dtype T           float32 (default) or bfloat16 (rounded to nearest even)\n"
    "  --n-heads H         query heads (the shapes cannot tell; needed only for a file without a description)\n"
    "  --n-kv-heads K      key/value heads (default: from layers.0.attention.wk.weight's shape)\n"
    "  --rope-theta X      RoPE base (default 500000)\n"
    "  --norm-eps X        RMSNorm epsilon (default 1e-5)\n"
    "  --max-position-embeddings N   written to config.json (default: the pack's)\n"
    "\n"
    "  --from hf           read DIR/config.json and DIR/model.safetensors (or the shards named by\n"
    "                      model.safetensors.index.json; F32, BF16, F16 or F64 tensors) and write the\n"
    "                      parameters as float32, in the order the pack declares them, after the model\n"
    "                      description (so generate and model.flavor: from_checkpoint need no sizes).\n"
    "                      The model options to use with the file are printed. A tied folder gives a pack\n"
    "                      that shares the table no head of its own, an untied pack a copy of the table.\n"
    "                      Refused: a model_type no pack runs, RoPE types other than default and the\n"
    "                      frequency-band one, and any key the pack's table checks with another value.\n"
    "  --model PACK        the model pack to convert through (default: as above)\n"
    "  --help              this text\n";

static ct_status usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "ctitan convert: %s%s%s (see ctitan convert --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return CT_ERR_INVALID;
}

static int parse_pos_int(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < 1 || v > INT32_MAX) return -1;
    *out = v;
    return 0;
}

static int parse_pos_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v) || v <= 0) return -1;
    *out = v;
    return 0;
}

/* A scalar config.* entry of a golden-style .ctt, if present: 1 and *out, else 0. A float32 value
 * becomes the double of its shortest decimal (1e-5f -> 1e-5), so it prints as it was written. */
static int ctt_scalar(const tf_file *f, const char *name, double *out) {
    const tf_entry *e = tf_find(f, name);
    if (!e || e->numel != 1) return 0;
    if (e->dtype == TF_I32) {
        *out = *(const int32_t *)e->data;
        return 1;
    }
    float v = *(const float *)e->data;
    char s[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(s, sizeof s, "%.*g", p, (double)v);
        if ((float)strtod(s, NULL) == v) break;
    }
    *out = strtod(s, NULL);
    return 1;
}

/* A positive integer config.* scalar, or 0 when absent or not one. */
static int64_t ctt_count(const tf_file *f, const char *name) {
    double v;
    return ctt_scalar(f, name, &v) && v >= 1 && v <= INT32_MAX && v == floor(v) ? (int64_t)v : 0;
}

/* The shortest %g form that reads back as x (whole numbers in full). */
static const char *short_g(char *out, size_t len, double x) {
    if (x == floor(x) && fabs(x) < 1e16) {
        snprintf(out, len, "%.0f", x);
        return out;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(out, len, "%.*g", p, x);
        if (strtod(out, NULL) == x) break;
    }
    return out;
}

typedef struct args {
    const char *input, *output, *model;
    hf_dtype dtype;
    int64_t n_heads, n_kv_heads, max_pos; /* 0: not given */
    double rope_theta, norm_eps;          /* 0: not given */
} args;

/* The description model.ctt carries (model_desc.h), if any, in *out; a flag that contradicts it is
 * refused naming both values. 0, or -1 after one error line. */
static int described(const tf_file *f, const args *a, json_t **out) {
    json_t *d = NULL;
    char *text;
    *out = NULL;
    if (tf_text(f, a->input, MDESC_ENTRY, &text) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        return -1;
    }
    if (!text) return 0; /* an older file: the flags and config.* scalars say it */
    json_error_t je;
    d = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!d) {
        fprintf(stderr, "ctitan convert: %s: tensor '%s': invalid JSON (%s)\n", a->input, MDESC_ENTRY, je.text);
        return -1;
    }
    if (mdesc_check(d, a->input) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        json_decref(d);
        return -1;
    }
    const struct { const char *flag, *field; double given; } flags[] = {
        {"--n-heads", "n_heads", (double)a->n_heads}, {"--n-kv-heads", "n_kv_heads", (double)a->n_kv_heads},
        {"--rope-theta", "rope_theta", a->rope_theta}, {"--norm-eps", "norm_eps", a->norm_eps}};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        double v;
        char g[32], w[32];
        if (!flags[i].given || !mdesc_field(d, flags[i].field, &v) || v <= 0 || v == flags[i].given) continue;
        fprintf(stderr, "ctitan convert: %s %s contradicts %s's description (%s %s); leave the flag out\n",
                flags[i].flag, short_g(g, sizeof g, flags[i].given), a->input, flags[i].field, short_g(w, sizeof w, v));
        json_decref(d);
        return -1;
    }
    *out = d;
    return 0;
}

/* A file without a description (an older ctitan's, a golden file): a model of the default pack, its
 * sizes from the shapes of the torchtitan-named tensors ctitan wrote then, the rest from the flags or
 * the file's config.* scalars. The options in *opts; -1 after one error line. */
static int legacy_options(const tf_file *f, const args *a, json_t *opts) {
    double v;
    int64_t heads = a->n_heads ? a->n_heads : ctt_count(f, "config.n_heads");
    int64_t kv = a->n_kv_heads ? a->n_kv_heads : ctt_count(f, "config.n_kv_heads");
    if (!heads) {
        fprintf(stderr, "ctitan convert: %s has no model description nor config.n_heads; give --n-heads (the shapes "
                        "cannot tell it)\n", a->input);
        return -1;
    }
    const tf_entry *emb = tf_find(f, "tok_embeddings.weight"), *w1 = tf_find(f, "layers.0.feed_forward.w1.weight");
    const tf_entry *wk = tf_find(f, "layers.0.attention.wk.weight");
    const char *bad = !emb || emb->ndim != 2 ? "tok_embeddings.weight" : !w1 || w1->ndim != 2 ? "layers.0.feed_forward.w1.weight"
                      : !kv && (!wk || wk->ndim != 2) ? "layers.0.attention.wk.weight" : NULL;
    if (bad) {
        fprintf(stderr, "ctitan convert: %s: tensor '%s' is missing or not a 2-D tensor (it gives the model's sizes)\n",
                a->input, bad);
        return -1;
    }
    if (emb->shape[1] % heads) {
        fprintf(stderr, "ctitan convert: %s: n_heads %lld does not divide the model width %lld (from "
                        "tok_embeddings.weight)\n", a->input, (long long)heads, (long long)emb->shape[1]);
        return -1;
    }
    int64_t head_dim = emb->shape[1] / heads, layers = 0;
    if (!kv && wk->shape[0] % head_dim) {
        fprintf(stderr, "ctitan convert: %s: tensor 'layers.0.attention.wk.weight' has %lld rows, not a multiple of "
                        "head_dim %lld\n", a->input, (long long)wk->shape[0], (long long)head_dim);
        return -1;
    }
    for (char name[64];; layers++) {
        snprintf(name, sizeof name, "layers.%lld.attention_norm.weight", (long long)layers);
        if (!tf_find(f, name) || layers >= 1024) break;
    }
    json_object_set_new(opts, "dim", json_integer(emb->shape[1]));
    json_object_set_new(opts, "vocab_size", json_integer(emb->shape[0]));
    json_object_set_new(opts, "n_layers", json_integer(layers ? layers : 1));
    json_object_set_new(opts, "ffn_hidden", json_integer(w1->shape[0]));
    json_object_set_new(opts, "n_heads", json_integer(heads));
    json_object_set_new(opts, "n_kv_heads", json_integer(kv ? kv : wk->shape[0] / head_dim));
    json_object_set_new(opts, "rope_theta", json_real(a->rope_theta            ? a->rope_theta
                                                      : ctt_scalar(f, "config.rope_theta", &v) ? v
                                                                                                : 500000.0));
    json_object_set_new(opts, "norm_eps", json_real(a->norm_eps ? a->norm_eps : ctt_scalar(f, "config.norm_eps", &v) ? v : 1e-5));
    if (ctt_scalar(f, "config.rope_scaling_factor", &v) && v != 0) {
        json_object_set_new(opts, "rope_scaling", json_string(HF_ROPE_BANDS));
        json_object_set_new(opts, "rope_scaling_factor", json_real(v));
        if (ctt_scalar(f, "config.rope_low_freq_factor", &v)) json_object_set_new(opts, "rope_low_freq_factor", json_real(v));
        if (ctt_scalar(f, "config.rope_high_freq_factor", &v))
            json_object_set_new(opts, "rope_high_freq_factor", json_real(v));
        int64_t orig = ctt_count(f, "config.rope_original_max_position");
        if (orig) json_object_set_new(opts, "rope_original_max_position", json_integer(orig));
    }
    return 0;
}

/* The file's parameters in the pack's order (pointing into f), after checking every one is there with
 * its shape and that no tensor the pack's table would name is left over. NULL after one error line. */
static tf_file *pack_params(const hf_pack *k, const tf_file *f, const char *input) {
    tf_file *w = calloc(1, sizeof *w);
    tf_entry *e = w ? calloc((size_t)(k->want->count ? k->want->count : 1), sizeof *e) : NULL;
    if (!e) {
        fprintf(stderr, "ctitan convert: out of memory\n");
        free(w);
        return NULL;
    }
    w->entries = e;
    w->version = TF_VERSION;
    for (int i = 0; i < k->want->count; i++) {
        const tf_entry *p = &k->want->entries[i];
        if (i >= k->want->count - k->n_buffers && !tf_find(f, p->name)) continue; /* a file from before the buffers */
        const tf_entry *got = tf_expect(f, NULL, p->name, TF_F32, p->ndim, p->shape);
        if (!got) {
            fprintf(stderr, "ctitan convert: %s: %s\n", input, ct_last_error());
            goto fail;
        }
        e[w->count++] = *got;
    }
    for (int i = 0; i < f->count; i++) {
        char hf[256];
        uint32_t flags;
        const char *name = f->entries[i].name;
        if (!tf_find(w, name) && hf_export_name(&k->x, name, hf, sizeof hf, &flags) == CT_OK) {
            fprintf(stderr, "ctitan convert: %s: tensor '%s' is not a parameter of model %s\n", input, name,
                    k->p->info.name);
            goto fail;
        }
    }
    ct_clear_error();
    return w;
fail:
    free(e);
    free(w);
    return NULL;
}

static ct_status to_hf(const args *a) {
    tf_file *f = tf_read(a->input);
    if (!f || tf_check_finite(f, a->input) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        tf_free(f);
        return CT_ERR_INVALID;
    }
    if (f->version < 2)
        printf("convert: note: %s: format version %d has no checksums: its data cannot be verified\n", a->input,
               f->version);
    ct_status rc = CT_ERR_INVALID; /* until the input is known good */
    json_t *desc = NULL, *opts = json_object(), *shown = NULL;
    hf_pack k = {0};
    tf_file *w = NULL;
    ct_hf_field *fields = NULL;
    const char *name = NULL, *flavor = NULL, *model_type = NULL;
    if (!opts || described(f, a, &desc)) goto done;
    if (desc) { /* the file's own description (flags that contradict it were refused) */
        json_object_update(opts, json_object_get(desc, "options"));
        name = json_string_value(json_object_get(desc, "name"));
        flavor = json_string_value(json_object_get(desc, "flavor"));
        model_type = json_string_value(json_object_get(json_object_get(desc, "model"), "hf_model_type"));
    } else {
        manifest *dm = manifest_new();
        const char *dflt;
        if (dm) manifest_add_core_schema(dm);
        if (!dm || mf_get_str(dm, "model.name", &dflt) || legacy_options(f, a, opts)) {
            manifest_free(dm);
            goto done;
        }
        static char default_name[128];
        snprintf(default_name, sizeof default_name, "%s", dflt);
        name = default_name;
        manifest_free(dm);
    }
    if (a->model) name = a->model;
    if (hf_pack_from_options(name, a->model ? NULL : model_type, opts, flavor, a->input, &k) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        goto done;
    }
    if (!(w = pack_params(&k, f, a->input))) goto done;
    ct_hf_export x = k.x;
    if (a->max_pos) { /* the one key a flag sets: the context length the folder announces */
        int n = 0, found = 0;
        while (x.fields && x.fields[n].key) n++;
        if (!(fields = calloc((size_t)n + 1, sizeof *fields))) goto done;
        for (int i = 0; i < n; i++) {
            fields[i] = x.fields[i];
            if (!strcmp(fields[i].key, "max_position_embeddings") && fields[i].type == CT_HF_INT) {
                fields[i].i = a->max_pos;
                found = 1;
            }
        }
        if (!found) {
            fprintf(stderr, "ctitan convert: model %s writes no max_position_embeddings; leave out "
                            "--max-position-embeddings\n", k.p->info.name);
            goto done;
        }
        x.fields = fields;
    }
    rc = CT_ERR_IO;
    if (hf_export_save(a->output, &x, w, k.desc.head_dim, a->dtype, k.p->info.name) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        goto done;
    }
    char head[256] = "";
    uint32_t flags;
    if (k.shared[0] && hf_export_name(&k.x, k.shared, head, sizeof head, &flags) == CT_OK) {
        size_t n = strlen(head); /* "lm_head.weight": the folder has no head of its own */
        if (n > 7 && !strcmp(head + n - 7, ".weight")) head[n - 7] = 0;
    }
    printf("convert: %s -> %s/config.json, %s/model.safetensors (%s, %d tensors, %s%s%s)\n", a->input, a->output,
           a->output, k.x.model_type, w->count, a->dtype == HF_BFLOAT16 ? "bfloat16" : "float32",
           *head ? ", tied embeddings: no " : "", head);
    if ((shown = hf_pack_describe(&k))) hf_pack_print_model(&k, shown, stdout);
    rc = CT_OK;
done:
    json_decref(shown);
    json_decref(opts);
    json_decref(desc);
    free(fields);
    if (w) free(w->entries);
    free(w);
    hf_pack_close(&k);
    tf_free(f);
    return rc;
}

static ct_status from_hf(const args *a) {
    hf_pack k;
    tf_file *f = NULL;
    json_t *desc = NULL;
    if (hf_pack_from_folder(a->input, a->model, &k) != CT_OK ||
        hf_import_load_folder(a->input, &k.x, k.im ? k.im->options : NULL, k.want, k.desc.head_dim, k.p->info.name, &f) != CT_OK ||
        tf_check_finite(f, a->input) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        tf_free(f);
        hf_pack_close(&k);
        return CT_ERR_INVALID;
    }
    /* which tied reading this was: a pack that shares the table, or an untied head copied from it */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", a->input);
    json_t *root = hf_config_read(path);
    int folder_tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
    json_decref(root);
    const char *copied = NULL;
    for (int i = 0; i < k.want->count && !copied && folder_tied && !k.shared[0]; i++)
        if (hf_tied_row(&k.x, k.want->entries[i].name)) copied = k.want->entries[i].name;
    tf_writer *w = tf_writer_open(a->output);
    desc = w ? hf_pack_describe(&k) : NULL; /* so that generate and from_checkpoint need no sizes */
    char *text = desc ? json_dumps(desc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (w && (!text || tf_writer_add_text(w, MDESC_ENTRY, text) != CT_OK)) {
        tf_writer_abort(w);
        w = NULL;
        ct_set_error("%s: cannot write the model description", a->output);
    }
    free(text);
    for (int i = 0; w && i < f->count; i++) {
        const tf_entry *e = &f->entries[i];
        if (tf_writer_add(w, e->name, e->dtype, e->ndim, e->shape, e->data) != CT_OK) break;
    }
    if (!w || tf_writer_close(w) != CT_OK) {
        fprintf(stderr, "ctitan convert: %s\n", ct_last_error());
        json_decref(desc);
        tf_free(f);
        hf_pack_close(&k);
        return CT_ERR_IO;
    }
    char note[300] = "";
    if (folder_tied && k.shared[0]) snprintf(note, sizeof note, "; tied embeddings: no %s", k.shared);
    else if (copied) snprintf(note, sizeof note, "; %s copied from the tied embeddings", copied);
    printf("convert: %s -> %s (%s, %d tensors, float32%s)\n", a->input, a->output, k.x.model_type, f->count, note);
    hf_pack_print_model(&k, desc, stdout);
    json_decref(desc);
    tf_free(f);
    hf_pack_close(&k);
    return CT_OK;
}

ct_status cmd_convert(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return CT_OK;
        }
    args a = {0};
    const char *to = NULL, *from = NULL, *dtype = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (ct_cli_opt(argc, argv, &i, "--to", &v)) bad = !(to = v);
        else if (ct_cli_opt(argc, argv, &i, "--from", &v)) bad = !(from = v);
        else if (ct_cli_opt(argc, argv, &i, "--input", &v)) bad = !(a.input = v);
        else if (ct_cli_opt(argc, argv, &i, "--output", &v)) bad = !(a.output = v);
        else if (ct_cli_opt(argc, argv, &i, "--dtype", &v)) bad = !(dtype = v);
        else if (ct_cli_opt(argc, argv, &i, "--model", &v)) bad = !(a.model = v);
        else if (ct_cli_opt(argc, argv, &i, "--n-heads", &v)) bad = parse_pos_int(v, &a.n_heads);
        else if (ct_cli_opt(argc, argv, &i, "--n-kv-heads", &v)) bad = parse_pos_int(v, &a.n_kv_heads);
        else if (ct_cli_opt(argc, argv, &i, "--max-position-embeddings", &v)) bad = parse_pos_int(v, &a.max_pos);
        else if (ct_cli_opt(argc, argv, &i, "--rope-theta", &v)) bad = parse_pos_double(v, &a.rope_theta);
        else if (ct_cli_opt(argc, argv, &i, "--norm-eps", &v)) bad = parse_pos_double(v, &a.norm_eps);
        else return usage_error("unknown argument", argv[i]);
        if (bad) return usage_error("missing or bad value for", argv[i][0] == '-' ? argv[i] : argv[i - 1]);
    }
    if (!to == !from) return usage_error("give exactly one of --to hf and --from hf", NULL);
    if (strcmp(to ? to : from, "hf") != 0) return usage_error("the only other format is hf, not", to ? to : from);
    if (!a.input || !a.output) return usage_error("--input and --output are required", NULL);
    if (from && (dtype || a.n_heads || a.n_kv_heads || a.max_pos || a.rope_theta || a.norm_eps))
        return usage_error("--dtype, --n-heads, --n-kv-heads, --rope-theta, --norm-eps and "
                           "--max-position-embeddings apply to --to hf only", NULL);
    if (dtype) {
        if (!strcmp(dtype, "float32") || !strcmp(dtype, "f32")) a.dtype = HF_FLOAT32;
        else if (!strcmp(dtype, "bfloat16") || !strcmp(dtype, "bf16")) a.dtype = HF_BFLOAT16;
        else return usage_error("--dtype must be float32 or bfloat16, not", dtype);
    }
    return to ? to_hf(&a) : from_hf(&a);
}
