/* hf_export.c: a model's parameters -> a Hugging Face folder by the pack's table (see hf_export.h). */
#include "io/hf_export.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "io/safetensors.h"

#define MAX_STARS 4     /* '*'s in one pattern */
#define MAX_NAME 256    /* a mapped name's bytes */
#define MAX_DEPTH 4     /* nesting of a config key ("a.b.c.d") */

/* ---- names ------------------------------------------------------------------------------------- */

/* 1 when s matches pat ('*' = a non-empty run); the runs the stars took in cap[] (start, length). */
static int match(const char *pat, const char *s, const char **cap, size_t *caplen, int k) {
    for (; *pat; pat++, s++) {
        if (*pat == '*') {
            if (k >= MAX_STARS) return 0;
            for (size_t n = 1; s[n - 1]; n++) {
                cap[k] = s;
                caplen[k] = n;
                if (match(pat + 1, s + n, cap, caplen, k + 1)) return 1;
            }
            return 0;
        }
        if (*pat != *s) return 0;
    }
    return *s == 0;
}

static int count_stars(const char *p) {
    int n = 0;
    for (; *p; p++) n += *p == '*';
    return n;
}

/* The first row of x's table whose ctitan pattern matches name, among the CT_HF_TIED rows (tied) or the
 * others; the stars' runs in cap[]. NULL when none does. */
static const ct_hf_name *row_for(const ct_hf_export *x, const char *name, int tied, const char **cap,
                                 size_t *caplen) {
    for (const ct_hf_name *r = x->names; r && r->ctitan; r++)
        if (!(r->flags & CT_HF_TIED) == !tied && match(r->ctitan, name, cap, caplen, 0)) return r;
    return NULL;
}

/* name's Hugging Face name by row r (its stars' runs in cap[]) into hf; under CT_HF_EXPERTS the pattern's
 * last '*' takes `expert`. */
static ct_status fill_name_at(const ct_hf_name *r, const char *name, const char **cap, const size_t *caplen,
                              int64_t expert, char *hf, size_t len) {
    int extra = (r->flags & CT_HF_EXPERTS) != 0;
    if (!r->hf || count_stars(r->hf) != count_stars(r->ctitan) + extra)
        return ct_fail(CT_ERR_INVALID, "Hugging Face name pattern of '%s' must have %d '*'%s", r->ctitan,
                       count_stars(r->ctitan) + extra, extra ? " (one more than it: CT_HF_EXPERTS)" : "");
    char index[24];
    snprintf(index, sizeof index, "%lld", (long long)expert);
    int n_cap = count_stars(r->ctitan);
    size_t o = 0;
    int k = 0;
    for (const char *p = r->hf; *p; p++) {
        int at_index = *p == '*' && k == n_cap;
        const char *src = at_index ? index : *p == '*' ? cap[k] : p;
        size_t n = at_index ? strlen(index) : *p == '*' ? caplen[k++] : 1;
        if (o + n >= len) return ct_fail(CT_ERR_INVALID, "Hugging Face name of '%s' is too long", name);
        memcpy(hf + o, src, n);
        o += n;
    }
    hf[o] = 0;
    if (!o) return ct_fail(CT_ERR_INVALID, "Hugging Face name of '%s' is empty", name);
    return CT_OK;
}

static ct_status fill_name(const ct_hf_name *r, const char *name, const char **cap, const size_t *caplen, char *hf,
                           size_t len) {
    return fill_name_at(r, name, cap, caplen, 0, hf, len);
}

/* The Hugging Face name of expert j of a CT_HF_EXPERTS parameter (of any other: its one name). */
static ct_status expert_name(const ct_hf_export *x, const char *name, int64_t j, char *hf, size_t len) {
    const char *cap[MAX_STARS];
    size_t caplen[MAX_STARS];
    const ct_hf_name *r = row_for(x, name, 0, cap, caplen);
    if (!r) return ct_fail(CT_ERR_INVALID, "parameter '%s' has no Hugging Face name in the pack's table", name);
    return fill_name_at(r, name, cap, caplen, j, hf, len);
}

/* The tensors a parameter is in a Hugging Face folder: its experts under CT_HF_EXPERTS, else 1. */
static int64_t hf_parts(const tf_entry *e, uint32_t flags) { return flags & CT_HF_EXPERTS ? e->shape[0] : 1; }

ct_status hf_export_name(const ct_hf_export *x, const char *name, char *hf, size_t len, uint32_t *flags) {
    const char *cap[MAX_STARS];
    size_t caplen[MAX_STARS];
    const ct_hf_name *r = row_for(x, name, 0, cap, caplen);
    if (!r) return ct_fail(CT_ERR_INVALID, "parameter '%s' has no Hugging Face name in the pack's table", name);
    ct_status st = fill_name(r, name, cap, caplen, hf, len);
    if (st == CT_OK) *flags = r->flags;
    return st;
}

void hf_permute_rows(float *dst, const float *src, int64_t n_heads, int64_t head_dim, int64_t cols, int to_hf) {
    int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < half; i++) {
                int64_t hf_row = h * head_dim + j * half + i, ct_row = h * head_dim + 2 * i + j;
                int64_t to = to_hf ? hf_row : ct_row, from = to_hf ? ct_row : hf_row;
                memcpy(dst + to * cols, src + from * cols, sizeof(float) * (size_t)cols);
            }
}

/* ---- config.json ------------------------------------------------------------------------------- */

void hf_format_double(char *out, size_t len, double x) {
    if (x == floor(x) && fabs(x) < 1e16) {
        snprintf(out, len, "%.1f", x);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(out, len, "%.*g", p, x);
        if (strtod(out, NULL) == x) break;
    }
    if (!strpbrk(out, ".en")) strncat(out, ".0", len - strlen(out) - 1);
}

static int reserved(const char *key) {
    return !strcmp(key, "architectures") || !strcmp(key, "model_type") || !strcmp(key, "torch_dtype");
}

/* Sets obj[path] = v along the '.'-separated path (v's reference is taken). */
static ct_status put(json_t *obj, const char *path, json_t *v, const char *who) {
    char seg[MAX_NAME];
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    if (!v) return ct_fail(CT_ERR_NOMEM, "%s: out of memory for config.json", who);
    if (n == 0 || n >= sizeof seg) {
        json_decref(v);
        return ct_fail(CT_ERR_INVALID, "%s: config.json key '%s' has an empty or too long part", who, path);
    }
    memcpy(seg, path, n);
    seg[n] = 0;
    json_t *cur = json_object_get(obj, seg);
    if (!dot) {
        if (cur) {
            json_decref(v);
            return ct_fail(CT_ERR_INVALID, "%s: config.json key '%s' is given twice (or also holds keys)", who, seg);
        }
        json_object_set_new(obj, seg, v);
        return CT_OK;
    }
    if (cur && !json_is_object(cur)) {
        json_decref(v);
        return ct_fail(CT_ERR_INVALID, "%s: config.json key '%s' is a value and an object", who, seg);
    }
    if (!cur) json_object_set_new(obj, seg, cur = json_object());
    return put(cur, dot + 1, v, who);
}

static json_t *field_value(const ct_hf_field *f, const char *who) {
    switch (f->type) {
    case CT_HF_INT: return json_integer(f->i);
    case CT_HF_FLOAT:
        if (isfinite(f->f)) return json_real(f->f);
        ct_set_error("%s: config.json key '%s' is not a finite number", who, f->key);
        return NULL;
    case CT_HF_BOOL: return json_boolean(f->i != 0);
    case CT_HF_STRING:
        if (f->s) return json_string(f->s);
        ct_set_error("%s: config.json key '%s' is a NULL string", who, f->key);
        return NULL;
    case CT_HF_NULL: return json_null();
    case CT_HF_EMPTY_LIST: return json_array();
    }
    ct_set_error("%s: config.json key '%s' has unknown type %d", who, f->key, (int)f->type);
    return NULL;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Appends v as Python's json.dumps(indent=2, sort_keys=True) writes it at `depth`. */
static ct_status emit(json_t *v, int depth, char **buf, size_t *len, size_t *cap);

static ct_status append(char **buf, size_t *len, size_t *cap, const char *s) {
    size_t n = strlen(s);
    if (*len + n + 1 > *cap) {
        size_t c = (*cap ? *cap * 2 : 1024) + n;
        char *b = realloc(*buf, c);
        if (!b) return ct_fail(CT_ERR_NOMEM, "out of memory for config.json");
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n + 1);
    *len += n;
    return CT_OK;
}

static ct_status indent(int depth, char **buf, size_t *len, size_t *cap) {
    ct_status st = append(buf, len, cap, "\n");
    for (int i = 0; i < depth && st == CT_OK; i++) st = append(buf, len, cap, "  ");
    return st;
}

static ct_status emit_string(const char *s, char **buf, size_t *len, size_t *cap) {
    json_t *j = json_string(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
    json_decref(j);
    ct_status st = t ? append(buf, len, cap, t) : ct_fail(CT_ERR_NOMEM, "out of memory for config.json");
    free(t);
    return st;
}

static ct_status emit(json_t *v, int depth, char **buf, size_t *len, size_t *cap) {
    char num[64];
    if (json_is_object(v)) {
        size_t n = json_object_size(v), k = 0;
        if (!n) return append(buf, len, cap, "{}");
        const char **keys = malloc(sizeof *keys * n);
        if (!keys) return ct_fail(CT_ERR_NOMEM, "out of memory for config.json");
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) keys[k++] = key;
        qsort(keys, n, sizeof *keys, cmp_str);
        ct_status st = append(buf, len, cap, "{");
        for (k = 0; k < n && st == CT_OK; k++) {
            if (k) st = append(buf, len, cap, ",");
            if (st == CT_OK) st = indent(depth + 1, buf, len, cap);
            if (st == CT_OK) st = emit_string(keys[k], buf, len, cap);
            if (st == CT_OK) st = append(buf, len, cap, ": ");
            if (st == CT_OK) st = emit(json_object_get(v, keys[k]), depth + 1, buf, len, cap);
        }
        free(keys);
        if (st == CT_OK) st = indent(depth, buf, len, cap);
        return st == CT_OK ? append(buf, len, cap, "}") : st;
    }
    if (json_is_array(v)) {
        if (!json_array_size(v)) return append(buf, len, cap, "[]");
        ct_status st = append(buf, len, cap, "[");
        for (size_t i = 0; i < json_array_size(v) && st == CT_OK; i++) {
            if (i) st = append(buf, len, cap, ",");
            if (st == CT_OK) st = indent(depth + 1, buf, len, cap);
            if (st == CT_OK) st = emit(json_array_get(v, i), depth + 1, buf, len, cap);
        }
        if (st == CT_OK) st = indent(depth, buf, len, cap);
        return st == CT_OK ? append(buf, len, cap, "]") : st;
    }
    if (json_is_string(v)) return emit_string(json_string_value(v), buf, len, cap);
    if (json_is_integer(v)) {
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
        return append(buf, len, cap, num);
    }
    if (json_is_real(v)) {
        hf_format_double(num, sizeof num, json_real_value(v));
        return append(buf, len, cap, num);
    }
    return append(buf, len, cap, json_is_true(v) ? "true" : json_is_false(v) ? "false" : "null");
}

char *hf_export_config(const ct_hf_export *x, hf_dtype dtype, const char *who) {
    if (!x->architecture || !x->model_type || !*x->architecture || !*x->model_type) {
        ct_set_error("%s: its Hugging Face export names no architecture or model_type", who);
        return NULL;
    }
    json_t *root = json_object(), *arch = json_array();
    ct_status st = root && arch ? CT_OK : ct_fail(CT_ERR_NOMEM, "out of memory for config.json");
    if (st == CT_OK) st = json_array_append_new(arch, json_string(x->architecture)) ? CT_ERR_NOMEM : CT_OK;
    if (st == CT_OK) st = put(root, "architectures", json_incref(arch), who);
    if (st == CT_OK) st = put(root, "model_type", json_string(x->model_type), who);
    if (st == CT_OK) st = put(root, "torch_dtype", json_string(dtype == HF_BFLOAT16 ? "bfloat16" : "float32"), who);
    int depth_ok = 1;
    for (const ct_hf_field *f = x->fields; f && f->key && st == CT_OK; f++) {
        int dots = 0;
        for (const char *p = f->key; *p; p++) dots += *p == '.';
        char top[MAX_NAME];
        snprintf(top, sizeof top, "%.*s", (int)strcspn(f->key, "."), f->key);
        if (dots >= MAX_DEPTH) depth_ok = 0;
        if (!depth_ok || reserved(top)) {
            st = ct_fail(CT_ERR_INVALID, "%s: config.json key '%s' is %s", who, f->key,
                         depth_ok ? "the host's to write" : "nested too deep");
            break;
        }
        json_t *v = field_value(f, who);
        st = v ? put(root, f->key, v, who) : CT_ERR_INVALID;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (st == CT_OK) st = emit(root, 0, &buf, &len, &cap);
    if (st == CT_OK) st = append(&buf, &len, &cap, "\n");
    json_decref(arch);
    json_decref(root);
    if (st != CT_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- tensors ----------------------------------------------------------------------------------- */

ct_status hf_export_check(const ct_hf_export *x, const tf_file *w, int64_t head_dim, const char *who) {
    char *cfg = hf_export_config(x, HF_FLOAT32, who);
    if (!cfg) return CT_ERR_INVALID;
    free(cfg);
    char **names = calloc((size_t)(w->count ? w->count : 1), sizeof *names);
    if (!names) return ct_fail(CT_ERR_NOMEM, "out of memory");
    ct_status st = CT_OK;
    for (int i = 0; i < w->count && st == CT_OK; i++) {
        const tf_entry *e = &w->entries[i];
        char hf[MAX_NAME];
        uint32_t flags = 0;
        if ((st = hf_export_name(x, e->name, hf, sizeof hf, &flags)) != CT_OK) break;
        int experts = (flags & CT_HF_EXPERTS) != 0;
        if (e->dtype != TF_F32 || (experts ? e->ndim != 3 : (e->ndim < 1 || e->ndim > 2))) {
            st = ct_fail(CT_ERR_INVALID, "%s: parameter '%s' is not a %s float32 tensor", who, e->name,
                         experts ? "3-D (CT_HF_EXPERTS)" : "1-D or 2-D");
            break;
        }
        if (experts && (flags & CT_HF_ROPE_ROWS)) {
            st = ct_fail(CT_ERR_INVALID, "%s: parameter '%s' is marked both CT_HF_EXPERTS and CT_HF_ROPE_ROWS", who,
                         e->name);
            break;
        }
        if ((flags & CT_HF_ROPE_ROWS) && (head_dim < 2 || head_dim % 2 || e->shape[0] % head_dim)) {
            st = ct_fail(CT_ERR_INVALID, "%s: parameter '%s' (%lld rows) is marked CT_HF_ROPE_ROWS but is not whole "
                         "heads of an even head_dim %lld (ct_model_desc.head_dim)", who, e->name,
                         (long long)e->shape[0], (long long)head_dim);
            break;
        }
        for (int j = 0; j < i && st == CT_OK; j++)
            if (!strcmp(names[j], hf))
                st = ct_fail(CT_ERR_INVALID, "%s: parameters '%s' and '%s' both map to Hugging Face's '%s'", who,
                             w->entries[j].name, e->name, hf);
        if (st == CT_OK && !(names[i] = strdup(hf))) st = ct_fail(CT_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < w->count; i++) free(names[i]);
    free(names);
    return st;
}

static ct_status write_text_atomic(const char *path, const char *text) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ct_fail(CT_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    if (ct_write_all(fd, text, strlen(text)) || fsync(fd)) {
        ct_set_error("%s: cannot write %s: %s", path, tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return CT_ERR_IO;
    }
    if (close(fd) || rename(tmp, path)) {
        ct_set_error("%s: cannot write %s: %s", path, tmp, strerror(errno));
        unlink(tmp);
        return CT_ERR_IO;
    }
    return CT_OK;
}

ct_status hf_export_save(const char *dir, const ct_hf_export *x, const tf_file *w, int64_t head_dim,
                         hf_dtype dtype, const char *who) {
    ct_status rc = hf_export_check(x, w, head_dim, who);
    if (rc != CT_OK) return rc;
    struct stat sb;
    if (mkdir(dir, 0777) != 0 && (errno != EEXIST || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        return ct_fail(CT_ERR_IO, "%s: cannot create the folder: %s", dir,
                       errno == EEXIST ? "not a folder" : strerror(errno));
    int n = w->count, total = 0;
    for (int i = 0; i < n; i++) {
        char hf[MAX_NAME];
        uint32_t flags = 0;
        if ((rc = hf_export_name(x, w->entries[i].name, hf, sizeof hf, &flags)) != CT_OK) return rc;
        total += (int)hf_parts(&w->entries[i], flags);
    }
    st_entry *entries = calloc((size_t)(total ? total : 1), sizeof *entries);
    char (*names)[MAX_NAME] = calloc((size_t)(total ? total : 1), sizeof *names);
    float **owned = calloc((size_t)(n ? n : 1), sizeof *owned); /* permuted copies */
    int64_t(*shapes)[2] = calloc((size_t)(total ? total : 1), sizeof *shapes); /* an expert's (rows, cols) */
    char *config = NULL;
    if (!entries || !names || !owned || !shapes) {
        rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (int i = 0, at = 0; i < n; i++) {
        const tf_entry *e = &w->entries[i];
        uint32_t flags = 0;
        if ((rc = hf_export_name(x, e->name, names[at], sizeof names[at], &flags)) != CT_OK) goto done;
        if (flags & CT_HF_EXPERTS) { /* one (rows, cols) tensor per expert */
            int64_t per = e->shape[1] * e->shape[2];
            for (int64_t j = 0; j < e->shape[0]; j++, at++) {
                if ((rc = expert_name(x, e->name, j, names[at], sizeof names[at])) != CT_OK) goto done;
                shapes[at][0] = e->shape[1];
                shapes[at][1] = e->shape[2];
                entries[at] = (st_entry){names[at], dtype == HF_BFLOAT16 ? ST_BF16 : ST_F32, 2, shapes[at],
                                         (const float *)e->data + j * per, NULL};
            }
            continue;
        }
        const float *data = e->data;
        if (flags & CT_HF_ROPE_ROWS) {
            if (!(owned[i] = malloc(sizeof(float) * (size_t)(e->numel ? e->numel : 1)))) {
                rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", dir);
                goto done;
            }
            hf_permute_rows(owned[i], data, e->shape[0] / head_dim, head_dim, e->ndim == 2 ? e->shape[1] : 1, 1);
            data = owned[i];
        }
        entries[at] = (st_entry){names[at], dtype == HF_BFLOAT16 ? ST_BF16 : ST_F32, e->ndim, e->shape, data, NULL};
        at++;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt"};
    if ((rc = st_write(path, entries, total, meta, 1)) != CT_OK) goto done;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!(config = hf_export_config(x, dtype, who))) {
        rc = CT_ERR_INVALID;
        goto done;
    }
    rc = write_text_atomic(path, config);
done:
    for (int i = 0; owned && i < n; i++) free(owned[i]);
    free(owned);
    free(names);
    free(entries);
    free(shapes);
    free(config);
    return rc;
}

/* ---- load -------------------------------------------------------------------------------------- */

#define CONFIG_CAP (1 << 20) /* bytes of config.json read */

json_t *hf_config_get(json_t *root, const char *path) {
    char seg[MAX_NAME];
    while (root && json_is_object(root)) {
        size_t n = strcspn(path, ".");
        if (n >= sizeof seg) return NULL;
        memcpy(seg, path, n);
        seg[n] = 0;
        root = json_object_get(root, seg);
        if (!path[n]) return root;
        path += n + 1;
    }
    return NULL;
}

static void value_str(const ct_hf_field *f, char *out, size_t len) {
    switch (f->type) {
    case CT_HF_INT: snprintf(out, len, "%lld", (long long)f->i); break;
    case CT_HF_FLOAT: hf_format_double(out, len, f->f); break;
    case CT_HF_BOOL: snprintf(out, len, "%s", f->i ? "true" : "false"); break;
    case CT_HF_STRING: snprintf(out, len, "\"%s\"", f->s ? f->s : ""); break;
    case CT_HF_EMPTY_LIST: snprintf(out, len, "[]"); break;
    default: snprintf(out, len, "null"); break;
    }
}

static int same_value(const ct_hf_field *f, json_t *v) {
    switch (f->type) {
    case CT_HF_INT: return json_is_integer(v) && json_integer_value(v) == f->i;
    case CT_HF_FLOAT: return json_is_number(v) && json_number_value(v) == f->f;
    case CT_HF_BOOL: return json_is_boolean(v) && json_is_true(v) == (f->i != 0);
    case CT_HF_STRING: return json_is_string(v) && f->s && !strcmp(json_string_value(v), f->s);
    case CT_HF_NULL: return !v || json_is_null(v);
    case CT_HF_EMPTY_LIST: return json_is_array(v) && !json_array_size(v);
    }
    return 0;
}

json_t *hf_config_read(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        ct_set_error("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *text = malloc(CONFIG_CAP + 1);
    size_t n = text ? fread(text, 1, CONFIG_CAP + 1, fp) : 0;
    int bad = !text || ferror(fp);
    fclose(fp);
    if (bad || n > CONFIG_CAP) {
        free(text);
        ct_set_error("%s: %s", path, bad ? "cannot read it" : "larger than 1 MB; not a config.json?");
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) ct_set_error("%s: invalid JSON at line %d column %d: %s", path, je.line, je.column, je.text);
    return root;
}

/* config.json against x: model_type, then every CT_HF_CHECKED field; *tied: its tie_word_embeddings. */
/* links: the keys a folder set the model's options from (ABI 2.16), NULL when the options are the
 * manifest's; a linked key the folder leaves out was read as transformers' default for it. */
static int linked(const ct_hf_option *links, const char *key) {
    for (const ct_hf_option *l = links; l && l->key; l++)
        if (!strcmp(l->key, key)) return 1;
    return 0;
}

static ct_status check_config_json(const char *path, const ct_hf_export *x, const char *who,
                                   const ct_hf_option *links, int folder_made, int *tied) {
    json_t *raw = hf_config_read(path), *root = NULL;
    if (!raw) return CT_ERR_INVALID;
    ct_status st = hf_config_view(raw, path, &root); /* rope_parameters as rope_scaling, as transformers 4 writes it */
    json_decref(raw);
    if (st != CT_OK) return st;
    *tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
    json_t *type = json_object_get(root, "model_type");
    if (!json_is_object(root))
        st = ct_fail(CT_ERR_INVALID, "%s: expected a JSON object", path);
    else if (!json_is_string(type) || strcmp(json_string_value(type), x->model_type)) {
        char got[64];
        snprintf(got, sizeof got, "%s", json_is_string(type) ? json_string_value(type) : "(none)");
        for (char *p = got; *p; p++)
            if ((unsigned char)*p < 0x20) *p = '?';
        st = ct_fail(CT_ERR_INVALID, "%s: model_type '%s' is not model %s's '%s'", path, got, who, x->model_type);
    }
    for (const ct_hf_field *f = x->fields; st == CT_OK && f && f->key; f++) {
        if (!(f->flags & CT_HF_CHECKED)) continue;
        json_t *v = hf_config_get(root, f->key);
        if ((!v || json_is_null(v)) && ((f->flags & CT_HF_OR_ABSENT) || linked(links, f->key)))
            continue; /* transformers' default */
        char want[96];
        value_str(f, want, sizeof want);
        if (!v && f->type != CT_HF_NULL)
            st = ct_fail(CT_ERR_INVALID, "%s: key '%s' is missing; model %s has %s (set the model's options to match "
                         "the folder)", path, f->key, who, want);
        else if (!same_value(f, v) && folder_made) /* the options came from this folder: it is what differs */
            st = ct_fail(CT_ERR_INVALID, "%s: %s must be %s (model %s runs no other)", path, f->key, want, who);
        else if (!same_value(f, v)) {
            json_t *rt = json_is_object(v) ? json_object_get(v, "rope_type") : NULL; /* a RoPE scaling: its type */
            char *got = json_is_string(rt) ? NULL : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            char typed[96];
            if (json_is_string(rt)) snprintf(typed, sizeof typed, "rope_type %.60s", json_string_value(rt));
            st = ct_fail(CT_ERR_INVALID, "%s: %s is %.60s, model %s has %s (set the model's options to match the "
                         "folder)", path, f->key, got ? got : json_is_string(rt) ? typed : "?", who, want);
            free(got);
        }
    }
    json_decref(root);
    return st;
}

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape) {
    int o = snprintf(out, len, "(");
    for (int d = 0; d < ndim && o < (int)len; d++)
        o += snprintf(out + o, len - (size_t)o, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (o < (int)len) snprintf(out + o, len - (size_t)o, ")");
}

/* Entry e <- the folder's tensor for want entry w (its Hugging Face name hf). */
static ct_status load_one(const st_model *m, const tf_entry *w, const char *hf, uint32_t flags, int64_t head_dim,
                          const char *dir, int tied_row, tf_entry *e) {
    const st_tensor *t = st_model_find(m, hf);
    if (!t)
        return ct_fail(CT_ERR_INVALID, "%s: tensor '%s' (ctitan's '%s') is missing%s", dir, hf, w->name,
                       tied_row ? " and tie_word_embeddings is false" : "");
    int same = t->ndim == w->ndim;
    for (int d = 0; same && d < w->ndim; d++) same = t->shape[d] == w->shape[d];
    if (!same) {
        char got[96], want[96];
        shape_text(got, sizeof got, t->ndim, t->shape);
        shape_text(want, sizeof want, w->ndim, w->shape);
        return ct_fail(CT_ERR_INVALID, "%s: tensor '%s' has shape %s, the model's '%s' is %s", st_model_where(m, hf),
                       hf, got, w->name, want);
    }
    size_t n = (size_t)t->numel;
    float *buf = malloc(sizeof(float) * (n ? n : 1));
    float *tmp = (flags & CT_HF_ROPE_ROWS) ? malloc(sizeof(float) * (n ? n : 1)) : buf;
    ct_status st = CT_OK;
    if (!(e->name = strdup(w->name)) || !buf || !tmp)
        st = ct_fail(CT_ERR_NOMEM, "%s: out of memory for '%s'", dir, hf);
    else
        st = st_to_f32(t, tmp, st_model_where(m, hf));
    if (st != CT_OK) {
        free(buf);
        if (tmp != buf) free(tmp);
        return st;
    }
    if (tmp != buf) {
        hf_permute_rows(buf, tmp, w->shape[0] / head_dim, head_dim, w->ndim == 2 ? w->shape[1] : 1, 0);
        free(tmp);
    }
    e->data = buf;
    e->dtype = TF_F32;
    e->ndim = w->ndim;
    memcpy(e->shape, w->shape, sizeof e->shape);
    e->numel = t->numel;
    return CT_OK;
}

/* Entry e <- the folder's tensors of CT_HF_EXPERTS want entry w: expert j's (rows, cols) at row block j. */
static ct_status load_experts(const st_model *m, const ct_hf_export *x, const tf_entry *w, const char *dir,
                              tf_entry *e) {
    int64_t per = w->shape[1] * w->shape[2];
    float *buf = malloc(sizeof(float) * (size_t)(w->numel ? w->numel : 1));
    if (!buf || !(e->name = strdup(w->name))) {
        free(buf);
        return ct_fail(CT_ERR_NOMEM, "%s: out of memory for '%s'", dir, w->name);
    }
    ct_status st = CT_OK;
    for (int64_t j = 0; j < w->shape[0] && st == CT_OK; j++) {
        char hf[MAX_NAME];
        if ((st = expert_name(x, w->name, j, hf, sizeof hf)) != CT_OK) break;
        const st_tensor *t = st_model_find(m, hf);
        if (!t) {
            st = ct_fail(CT_ERR_INVALID, "%s: tensor '%s' (expert %lld of ctitan's '%s') is missing", dir, hf,
                         (long long)j, w->name);
        } else if (t->ndim != 2 || t->shape[0] != w->shape[1] || t->shape[1] != w->shape[2]) {
            char got[96];
            shape_text(got, sizeof got, t->ndim, t->shape);
            st = ct_fail(CT_ERR_INVALID, "%s: tensor '%s' has shape %s, an expert of the model's '%s' is (%lld, %lld)",
                         st_model_where(m, hf), hf, got, w->name, (long long)w->shape[1], (long long)w->shape[2]);
        } else {
            st = st_to_f32(t, buf + j * per, st_model_where(m, hf));
        }
    }
    if (st != CT_OK) {
        free(buf);
        free(e->name);
        e->name = NULL;
        return st;
    }
    e->data = buf;
    e->dtype = TF_F32;
    e->ndim = w->ndim;
    memcpy(e->shape, w->shape, sizeof e->shape);
    e->numel = w->numel;
    return CT_OK;
}

static int cmp_name(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

/* Every Hugging Face name the model's parameters read (each expert's under CT_HF_EXPERTS), sorted: *out
 * (MAX_NAME each) the caller frees. */
static ct_status all_names(const ct_hf_export *x, const tf_file *want, char (*names)[MAX_NAME],
                           const uint32_t *flags, char (**out)[MAX_NAME], int64_t *count) {
    int64_t n = 0;
    for (int i = 0; i < want->count; i++) n += hf_parts(&want->entries[i], flags[i]);
    char(*all)[MAX_NAME] = calloc((size_t)(n ? n : 1), sizeof *all);
    if (!all) return ct_fail(CT_ERR_NOMEM, "out of memory");
    int64_t at = 0;
    for (int i = 0; i < want->count; i++) {
        if (!(flags[i] & CT_HF_EXPERTS)) {
            memcpy(all[at++], names[i], MAX_NAME);
            continue;
        }
        for (int64_t j = 0; j < want->entries[i].shape[0]; j++) {
            ct_status st = expert_name(x, want->entries[i].name, j, all[at++], MAX_NAME);
            if (st != CT_OK) {
                free(all);
                return st;
            }
        }
    }
    qsort(all, (size_t)n, sizeof *all, cmp_name);
    *out = all;
    *count = n;
    return CT_OK;
}

static ct_status import_load(const char *dir, const ct_hf_export *x, const ct_hf_option *links, const tf_file *want,
                             int64_t head_dim, const char *who, int folder_made, tf_file **out) {
    *out = NULL;
    ct_status st = hf_export_check(x, want, head_dim, who);
    if (st != CT_OK) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int tied = 0;
    if ((st = check_config_json(path, x, who, links, folder_made, &tied)) != CT_OK) return st;
    st_model *m = st_model_open(dir);
    if (!m) return CT_ERR_INVALID; /* its message names the file */
    int n = want->count;
    char (*names)[MAX_NAME] = calloc((size_t)(n ? n : 1), sizeof *names);
    uint32_t *flags = calloc((size_t)(n ? n : 1), sizeof *flags);
    tf_file *f = calloc(1, sizeof *f);
    if (!names || !flags || !f || !(f->entries = calloc((size_t)(n ? n : 1), sizeof(tf_entry)))) {
        st = ct_fail(CT_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    f->version = TF_VERSION;
    for (int i = 0; i < n && st == CT_OK; i++) {
        st = hf_export_name(x, want->entries[i].name, names[i], sizeof names[i], &flags[i]);
        const char *cap[MAX_STARS];
        size_t caplen[MAX_STARS];
        const ct_hf_name *r = tied && st == CT_OK && !st_model_find(m, names[i])
                                  ? row_for(x, want->entries[i].name, 1, cap, caplen) : NULL;
        if (r) { /* a tied folder: the parameter reads the tensor the head shares */
            st = fill_name(r, want->entries[i].name, cap, caplen, names[i], sizeof names[i]);
            flags[i] = r->flags & ~CT_HF_TIED;
        }
    }
    char(*all)[MAX_NAME] = NULL;
    int64_t n_all = 0;
    if (st == CT_OK) st = all_names(x, want, names, flags, &all, &n_all);
    for (int i = 0; i < m->count && st == CT_OK; i++) { /* nothing in the folder is left unread */
        const char *name = m->tensors[i]->name;
        size_t nl = strlen(name);
        char key[MAX_NAME] = {0};
        snprintf(key, sizeof key, "%s", name);
        int known = nl > 20 && !strcmp(name + nl - 20, ".rotary_emb.inv_freq"); /* a buffer old files kept */
        if (!known) known = nl < MAX_NAME && bsearch(key, all, (size_t)n_all, sizeof *all, cmp_name) != NULL;
        if (!known)
            st = ct_fail(CT_ERR_INVALID, "%s: tensor '%s' is not a parameter of model %s (nothing to map it to)",
                         m->where[i], name, who);
    }
    free(all);
    for (int i = 0; i < n && st == CT_OK; i++) {
        const char *cap[MAX_STARS];
        size_t caplen[MAX_STARS];
        int tied_row = !tied && row_for(x, want->entries[i].name, 1, cap, caplen) != NULL;
        st = flags[i] & CT_HF_EXPERTS
                 ? load_experts(m, x, &want->entries[i], dir, &f->entries[i])
                 : load_one(m, &want->entries[i], names[i], flags[i], head_dim, dir, tied_row, &f->entries[i]);
        if (st != CT_OK) free(f->entries[i].name); /* half made */
        else f->count++;
    }
done:
    st_model_free(m);
    free(names);
    free(flags);
    if (st != CT_OK) tf_free(f);
    else *out = f;
    return st;
}

ct_status hf_import_load(const char *dir, const ct_hf_export *x, const tf_file *want, int64_t head_dim,
                         const char *who, tf_file **out) {
    return import_load(dir, x, NULL, want, head_dim, who, 0, out);
}

ct_status hf_import_load_folder(const char *dir, const ct_hf_export *x, const ct_hf_option *links, const tf_file *want,
                                int64_t head_dim, const char *who, tf_file **out) {
    return import_load(dir, x, links, want, head_dim, who, 1, out);
}

ct_status hf_import_check_folder(const char *dir, const ct_hf_export *x, const ct_hf_option *links, const char *who) {
    char path[4096];
    int tied;
    snprintf(path, sizeof path, "%s/config.json", dir);
    return check_config_json(path, x, who, links, 1, &tied);
}

int hf_tied_row(const ct_hf_export *x, const char *name) {
    const char *cap[MAX_STARS];
    size_t caplen[MAX_STARS];
    return row_for(x, name, 1, cap, caplen) != NULL;
}

/* ---- RoPE scaling ------------------------------------------------------------------------------ */

/* A number of obj (absent or null: dflt). */
static ct_status rope_num(json_t *obj, const char *path, const char *what, const char *key, double dflt,
                          double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return CT_OK;
    }
    if (!json_is_number(v)) return ct_fail(CT_ERR_INVALID, "%s: %s.%s must be a number", path, what, key);
    *out = json_number_value(v);
    return CT_OK;
}

/* A message-safe copy of a JSON string (control characters replaced). */
static void safe_text(char *out, size_t len, const char *t) {
    snprintf(out, len, "%s", t ? t : "(not a string)");
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
}

/* YaRN (rope_type "yarn") as transformers runs it, into r: the correction range floored and ceiled
 * (truncate), cos and sin scaled by attention_factor (by default mscale's YaRN factor over
 * mscale_all_dim's, or factor's own when either is absent), DeepSeek's softmax scale times mscale_all_dim's
 * factor squared. ctitan's YaRN (DeepSeek-V3's, torchtitan's) leaves cos and sin alone, so what it runs is
 * the case attention_factor 1; any other is refused, naming the key to change. */
static double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0; }

static ct_status read_yarn(json_t *root, json_t *obj, const char *path, const char *what, hf_rope *r) {
    double orig = 0, ms = 0, af = 0;
    json_t *mp = json_object_get(root, "max_position_embeddings"), *o = json_object_get(obj, "original_max_position_embeddings");
    json_t *f = json_object_get(obj, "factor"), *a = json_object_get(obj, "attention_factor");
    json_t *tr = json_object_get(obj, "truncate");
    if (!json_is_number(f) || json_number_value(f) < 1)
        return ct_fail(CT_ERR_INVALID, "%s: %s.factor must be a number of at least 1 (rope_type yarn)", path, what);
    r->factor = json_number_value(f);
    if (rope_num(obj, path, what, "original_max_position_embeddings",
                 json_is_integer(mp) ? (double)json_integer_value(mp) : 0, &orig) ||
        rope_num(obj, path, what, "beta_fast", 32, &r->beta_fast) || rope_num(obj, path, what, "beta_slow", 1, &r->beta_slow) ||
        rope_num(obj, path, what, "mscale", 0, &ms) || rope_num(obj, path, what, "mscale_all_dim", 0, &r->mscale_all_dim) ||
        rope_num(obj, path, what, "attention_factor", 0, &af))
        return CT_ERR_INVALID;
    if ((o && !json_is_null(o) && !json_is_integer(o)) || orig < 1 || orig > INT32_MAX)
        return ct_fail(CT_ERR_INVALID, "%s: %s.original_max_position_embeddings (or max_position_embeddings) must be a "
                       "positive integer", path, what);
    r->orig = (int64_t)orig;
    if (r->beta_fast == 0) r->beta_fast = 32; /* transformers reads 0 as the default */
    if (r->beta_slow == 0) r->beta_slow = 1;
    if (!(r->beta_fast > 0 && r->beta_slow > 0))
        return ct_fail(CT_ERR_INVALID, "%s: %s.beta_fast and beta_slow must be positive", path, what);
    if (tr && !json_is_null(tr) && !json_is_true(tr))
        return ct_fail(CT_ERR_INVALID, "%s: %s.truncate must be true (ctitan's YaRN floors and ceils the correction "
                       "range)", path, what);
    if (!a || json_is_null(a)) af = ms != 0 && r->mscale_all_dim != 0
                                       ? yarn_mscale(r->factor, ms) / yarn_mscale(r->factor, r->mscale_all_dim)
                                       : yarn_mscale(r->factor, 1.0);
    if (af != 1.0)
        return ct_fail(CT_ERR_INVALID, "%s: %s scales cos and sin by %.6g (attention_factor, or YaRN's mscale over "
                       "mscale_all_dim): ctitan's YaRN runs attention_factor 1 only: set %s.mscale equal to "
                       "%s.mscale_all_dim", path, what, af, what, what);
    r->yarn = 1;
    return CT_OK;
}

/* One RoPE object: rope_scaling (transformers 4: "rope_type", or "type" in older files) or
 * rope_parameters (transformers 5, which may omit rope_type for plain RoPE). "default" leaves *r as
 * it is; the frequency-band type fills it, original_max_position_embeddings falling back to
 * max_position_embeddings; so does yarn (read_yarn). Any other type is refused. */
static ct_status read_rope_object(json_t *root, const char *path, const char *what, int need_type, hf_rope *r) {
    json_t *obj = json_object_get(root, what);
    if (!obj || json_is_null(obj)) return CT_OK;
    if (!json_is_object(obj)) return ct_fail(CT_ERR_INVALID, "%s: %s must be null or an object", path, what);
    json_t *type = json_object_get(obj, "rope_type");
    if (!type || json_is_null(type)) type = json_object_get(obj, "type");
    if ((!type || json_is_null(type)) && need_type)
        return ct_fail(CT_ERR_INVALID, "%s: %s has no rope_type (ctitan reads rope_type default, %s and yarn)", path,
                       what, HF_ROPE_BANDS);
    if (!type || json_is_null(type)) return CT_OK;
    const char *t = json_is_string(type) ? json_string_value(type) : NULL;
    if (t && !strcmp(t, "default")) return CT_OK;
    if (t && !strcmp(t, "yarn")) return read_yarn(root, obj, path, what, r);
    if (!t || strcmp(t, HF_ROPE_BANDS)) {
        char got[64];
        safe_text(got, sizeof got, t);
        return ct_fail(CT_ERR_INVALID, "%s: %s rope_type '%s' is not supported (ctitan reads rope_type default, %s "
                       "and yarn)", path, what, got, HF_ROPE_BANDS);
    }
    if (!json_object_get(obj, "factor"))
        return ct_fail(CT_ERR_INVALID, "%s: %s of rope_type %s has no factor", path, what, HF_ROPE_BANDS);
    json_t *mp = json_object_get(root, "max_position_embeddings");
    json_t *o = json_object_get(obj, "original_max_position_embeddings");
    double orig = 0;
    if (rope_num(obj, path, what, "factor", 0, &r->factor) ||
        rope_num(obj, path, what, "low_freq_factor", 1.0, &r->low) ||
        rope_num(obj, path, what, "high_freq_factor", 4.0, &r->high) ||
        rope_num(obj, path, what, "original_max_position_embeddings",
                 json_is_integer(mp) ? (double)json_integer_value(mp) : 2048, &orig))
        return CT_ERR_INVALID;
    if ((o && !json_is_null(o) && !json_is_integer(o)) || orig < 1 || orig > INT32_MAX)
        return ct_fail(CT_ERR_INVALID, "%s: %s.original_max_position_embeddings must be a positive integer", path,
                       what);
    r->orig = (int64_t)orig;
    return CT_OK;
}

static int same_rope(const hf_rope *a, const hf_rope *b) {
    return a->yarn == b->yarn && a->factor == b->factor && a->low == b->low && a->high == b->high &&
           a->orig == b->orig && a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
           a->mscale_all_dim == b->mscale_all_dim;
}

/* root's RoPE scaling (root a JSON object; path names it in messages). */
static ct_status rope_of(json_t *root, const char *path, hf_rope *out) {
    hf_rope a = {0}, b = {0};
    memset(out, 0, sizeof *out);
    ct_status st = read_rope_object(root, path, "rope_scaling", 1, &a);
    if (st == CT_OK) st = read_rope_object(root, path, "rope_parameters", 0, &b);
    if (st == CT_OK && a.factor != 0 && b.factor != 0 && !same_rope(&a, &b))
        st = ct_fail(CT_ERR_INVALID, "%s: rope_scaling and rope_parameters give different RoPE scaling", path);
    if (st == CT_OK) *out = a.factor != 0 ? a : b;
    return st;
}

ct_status hf_read_rope(const char *dir, hf_rope *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(out, 0, sizeof *out);
    json_t *root = hf_config_read(path);
    if (!root) return CT_ERR_INVALID;
    ct_status st = json_is_object(root) ? rope_of(root, path, out)
                                        : ct_fail(CT_ERR_INVALID, "%s: expected a JSON object", path);
    if (st == CT_OK && out->yarn) /* a model described by ct_model_desc has no YaRN fields */
        st = ct_fail(CT_ERR_INVALID, "%s: RoPE scaling of rope_type yarn is not supported for this model (it reads "
                     "rope_type default and %s)", path, HF_ROPE_BANDS);
    json_decref(root);
    return st;
}

/* The view's rope_scaling for r: null, the frequency bands, or YaRN with every key transformers reads (cos
 * and sin unscaled: mscale equal to mscale_all_dim, or attention_factor 1 when mscale_all_dim is 0). */
static json_t *rope_json(const hf_rope *r) {
    if (r->factor == 0) return json_null();
    if (!r->yarn)
        return json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", HF_ROPE_BANDS, "factor", r->factor, "low_freq_factor",
                         r->low, "high_freq_factor", r->high, "original_max_position_embeddings", (json_int_t)r->orig);
    return json_pack("{s:s, s:f, s:I, s:f, s:f, s:f, s:f}", "rope_type", "yarn", "factor", r->factor,
                     "original_max_position_embeddings", (json_int_t)r->orig, "beta_fast", r->beta_fast, "beta_slow",
                     r->beta_slow, "mscale_all_dim", r->mscale_all_dim,
                     r->mscale_all_dim != 0 ? "mscale" : "attention_factor",
                     r->mscale_all_dim != 0 ? r->mscale_all_dim : 1.0);
}

ct_status hf_config_view(json_t *root, const char *path, json_t **view) {
    *view = NULL;
    if (!json_is_object(root)) return ct_fail(CT_ERR_INVALID, "%s: expected a JSON object", path);
    hf_rope r;
    ct_status st = rope_of(root, path, &r);
    if (st != CT_OK) return st;
    json_t *v = json_deep_copy(root), *rp = json_object_get(root, "rope_parameters");
    json_t *theta = json_object_get(root, "rope_theta");
    if (!v) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    if ((!theta || json_is_null(theta)) && json_is_object(rp) && json_object_get(rp, "rope_theta"))
        json_object_set(v, "rope_theta", json_object_get(rp, "rope_theta"));
    json_object_del(v, "rope_parameters");
    json_t *scaling = rope_json(&r);
    if (!scaling || json_object_set_new(v, "rope_scaling", scaling)) {
        json_decref(v);
        return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    }
    *view = v;
    return CT_OK;
}
