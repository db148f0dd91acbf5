/* safetensors.c: the safetensors format (described in safetensors.h). */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/util.h"

/* Tensor bytes are converted as they lie in memory, so the host must be little-endian like the file. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_N_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_I16] = {"I16", 2},         [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},         [ST_F64] = {"F64", 8}, [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(int dtype) { return dtype >= 0 && dtype < ST_N_DTYPES ? dtypes[dtype].name : "?"; }

size_t st_dtype_size(int dtype) { return dtype >= 0 && dtype < ST_N_DTYPES ? dtypes[dtype].size : 0; }

int st_dtype_from_name(const char *name) {
    for (int i = 0; name && i < ST_N_DTYPES; i++)
        if (strcmp(name, dtypes[i].name) == 0) return i;
    return -1;
}

/* ---- scalar conversions ------------------------------------------------------------------------ */

float st_bf16_to_f32(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

uint16_t st_f32_to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(b >> 16 | 0x40); /* NaN stays NaN, quiet */
    b += 0x7fffu + (b >> 16 & 1);                                             /* ties to even */
    return (uint16_t)(b >> 16);
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = h >> 10 & 0x1f, man = h & 0x3ff, b;
    if (exp == 0x1f) b = sign | 0x7f800000u | man << 13; /* infinity, NaN */
    else if (exp) b = sign | (exp + 112) << 23 | man << 13;
    else if (!man) b = sign;
    else { /* subnormal: man * 2^-24; shift the leading 1 up to the implicit bit */
        uint32_t e = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            e--;
        }
        b = sign | e << 23 | (man & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* ---- messages ----------------------------------------------------------------------------------- */

/* A printable excerpt of a name from the file: control bytes become '?', long names end "...". */
static const char *excerpt(char out[80], const char *s) {
    size_t n = strlen(s), keep = n > 64 ? 64 : n, j = 0;
    for (size_t i = 0; i < keep; i++) {
        unsigned char c = (unsigned char)s[i];
        out[j++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (keep < n) {
        memcpy(out + j, "...", 3);
        j += 3;
    }
    out[j] = 0;
    return out;
}

/* Sets the error "label: tensor 'name': what" (tensor may be NULL: "label: what") and returns st. */
static ct_status fail(ct_status st, const char *label, const char *tensor, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ct_status fail(ct_status st, const char *label, const char *tensor, const char *fmt, ...) {
    char what[400], nm[80];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (tensor) return ct_fail(st, "%s: tensor '%s': %s", label, excerpt(nm, tensor), what);
    return ct_fail(st, "%s: %s", label, what);
}

static void shape_str(char *out, size_t len, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(out, len, "(");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(out + k, len - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < len) snprintf(out + k, len - k, ")");
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* ---- reader ------------------------------------------------------------------------------------- */

void st_free(st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->count; i++) free(f->tensors[i].name);
    for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->meta);
    free(f->tensors);
    free(f->label);
    if (f->map) munmap(f->map, f->map_size);
    free(f);
}

static ct_status parse_meta(st_file *f, json_t *v) {
    if (f->meta) {
        return fail(CT_ERR_INVALID, f->label, NULL, "header: __metadata__ appears twice");
    }
    if (!json_is_object(v)) {
        return fail(CT_ERR_INVALID, f->label, NULL, "header: __metadata__ is %s, expected an object of strings",
             json_type_name(v));
    }
    f->meta = calloc(2 * json_object_size(v) + 1, sizeof(char *));
    if (!f->meta) {
        return fail(CT_ERR_NOMEM, f->label, NULL, "out of memory");
    }
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        char nm[80];
        if (!json_is_string(val)) {
            return fail(CT_ERR_INVALID, f->label, NULL, "header: __metadata__ '%s' is %s, expected a string",
                 excerpt(nm, key), json_type_name(val));
        }
        char *k = strdup(key), *s = strdup(json_string_value(val));
        f->meta[2 * f->n_meta] = k;
        f->meta[2 * f->n_meta + 1] = s;
        f->n_meta++;
        if (!k || !s) {
            return fail(CT_ERR_NOMEM, f->label, NULL, "out of memory");
        }
    }
    return CT_OK;
}

/* A non-negative JSON integer into *out; -1 if it is anything else. */
static int get_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static ct_status parse_shape(const char *label, const char *name, const json_t *v, st_tensor *t) {
    if (!json_is_array(v)) {
        return fail(CT_ERR_INVALID, label, name, "shape is %s, expected an array of integers",
             v ? json_type_name(v) : "missing");
    }
    size_t nd = json_array_size(v);
    if (nd > ST_MAX_DIMS) {
        return fail(CT_ERR_INVALID, label, name, "shape has %zu dimensions, at most %d are supported", nd,
                    ST_MAX_DIMS);
    }
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (get_uint(json_array_get(v, i), &d)) {
            return fail(CT_ERR_INVALID, label, name, "shape[%zu] is not a non-negative integer", i);
        }
        t->shape[i] = (int64_t)d; /* a JSON integer fits int64 */
    }
    return CT_OK;
}

static ct_status parse_offsets(const char *label, const char *name, const json_t *v, uint64_t data_size,
                               uint64_t *begin, uint64_t *end) {
    if (!json_is_array(v) || json_array_size(v) != 2 || get_uint(json_array_get(v, 0), begin) ||
        get_uint(json_array_get(v, 1), end)) {
        return fail(CT_ERR_INVALID, label, name, "data_offsets must be [BEGIN, END], two non-negative integers");
    }
    if (*begin > *end) {
        return fail(CT_ERR_INVALID, label, name, "data_offsets [%llu, %llu] end before they begin",
             (unsigned long long)*begin, (unsigned long long)*end);
    }
    if (*end > data_size) {
        return fail(CT_ERR_INVALID, label, name, "data_offsets [%llu, %llu] run past the data section (%llu bytes)",
                    (unsigned long long)*begin, (unsigned long long)*end, (unsigned long long)data_size);
    }
    return CT_OK;
}

/* Checks that shape * dtype size is exactly the span's bytes, without overflowing on the way. */
static ct_status check_size(const char *label, const char *name, st_tensor *t, uint64_t span) {
    uint64_t esize = dtypes[t->dtype].size, limit = UINT64_MAX / esize, numel = 1;
    int overflow = 0, zero = 0;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d = (uint64_t)t->shape[i];
        if (d == 0) zero = 1;
        else if (numel > limit / d) overflow = 1;
        else numel *= d;
    }
    if (zero) numel = 0, overflow = 0;
    char s[200];
    shape_str(s, sizeof s, t->ndim, t->shape);
    if (overflow) {
        return fail(CT_ERR_INVALID, label, name, "shape %s of %s overflows a 64-bit byte count", s,
                    dtypes[t->dtype].name);
    }
    if (numel * esize != span) {
        return fail(CT_ERR_INVALID, label, name, "shape %s of %s needs %llu bytes, its data_offsets hold %llu", s,
             dtypes[t->dtype].name, (unsigned long long)(numel * esize), (unsigned long long)span);
    }
    t->numel = (int64_t)numel;
    t->nbytes = span;
    return CT_OK;
}

static ct_status parse_tensor(const char *label, const char *name, json_t *v, uint64_t data_size, st_tensor *t) {
    if (!name[0]) {
        return fail(CT_ERR_INVALID, label, NULL, "header: a tensor has an empty name");
    }
    if (!(t->name = strdup(name))) {
        return fail(CT_ERR_NOMEM, label, NULL, "out of memory");
    }
    if (!json_is_object(v)) {
        return fail(CT_ERR_INVALID, label, name, "is %s, expected an object {dtype, shape, data_offsets}",
                    json_type_name(v));
    }
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets")) {
            char k[80];
            return fail(CT_ERR_INVALID, label, name, "unknown field '%s' (expected dtype, shape, data_offsets)",
                        excerpt(k, key));
        }
    }
    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt)) {
        return fail(CT_ERR_INVALID, label, name, "dtype is %s, expected a string such as \"F32\"",
             dt ? json_type_name(dt) : "missing");
    }
    if ((t->dtype = st_dtype_from_name(json_string_value(dt))) < 0) {
        char d[80];
        return fail(CT_ERR_INVALID, label, name,
             "unknown dtype '%s' (known: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64)",
             excerpt(d, json_string_value(dt)));
    }
    uint64_t begin = 0, end = 0;
    ct_status st = parse_shape(label, name, json_object_get(v, "shape"), t);
    if (st == CT_OK) st = parse_offsets(label, name, json_object_get(v, "data_offsets"), data_size, &begin, &end);
    if (st == CT_OK) st = check_size(label, name, t, end - begin);
    if (st == CT_OK) t->offset = begin;
    return st;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* No two tensors with bytes may share any: sorted by start, each starts at or after the last end. */
static ct_status check_overlaps(st_file *f) {
    const st_tensor **by = malloc(sizeof *by * (size_t)(f->count ? f->count : 1));
    if (!by) {
        return fail(CT_ERR_NOMEM, f->label, NULL, "out of memory");
    }
    int n = 0;
    for (int i = 0; i < f->count; i++)
        if (f->tensors[i].nbytes) by[n++] = &f->tensors[i];
    qsort(by, (size_t)n, sizeof *by, cmp_tensor_offset);
    for (int i = 1; i < n; i++) {
        const st_tensor *p = by[i - 1], *t = by[i];
        if (t->offset < p->offset + p->nbytes) {
            char other[80];
            fail(CT_ERR_INVALID, f->label, t->name, "data_offsets [%llu, %llu] overlap those of tensor '%s' [%llu, %llu]",
                 (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes), excerpt(other, p->name),
                 (unsigned long long)p->offset, (unsigned long long)(p->offset + p->nbytes));
            free(by);
            return CT_ERR_INVALID;
        }
    }
    free(by);
    return CT_OK;
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static st_file *parse(const unsigned char *buf, size_t size, const char *label) {
    if (size < 8) {
        fail(CT_ERR_INVALID, label, NULL, "file is %zu bytes, too short for the 8-byte header length", size);
        return NULL;
    }
    uint64_t n = get_u64(buf);
    if (n > ST_MAX_HEADER) {
        fail(CT_ERR_INVALID, label, NULL,
             "header length %llu is over the limit of %u bytes (not a safetensors file?)", (unsigned long long)n,
             ST_MAX_HEADER);
        return NULL;
    }
    if (n > size - 8) {
        fail(CT_ERR_INVALID, label, NULL,
             "header length %llu runs past the end of the file (%zu bytes; truncated?)", (unsigned long long)n, size);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fail(CT_ERR_INVALID, label, NULL, "header: invalid JSON at byte %d of the header: %s", je.position, je.text);
        return NULL;
    }
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->label = strdup(label)) ||
        !(f->tensors = calloc(json_object_size(root) + 1, sizeof(st_tensor)))) {
        fail(CT_ERR_NOMEM, label, NULL, "out of memory");
        goto fail;
    }
    if (!json_is_object(root)) {
        fail(CT_ERR_INVALID, label, NULL, "header is %s, expected a JSON object", json_type_name(root));
        goto fail;
    }
    uint64_t data_size = size - 8 - n;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (parse_meta(f, val) != CT_OK) goto fail;
            continue;
        }
        st_tensor *t = &f->tensors[f->count++];
        if (parse_tensor(label, key, val, data_size, t) != CT_OK) goto fail;
        t->data = buf + 8 + n + t->offset;
    }
    json_decref(root);
    root = NULL;
    qsort(f->tensors, (size_t)f->count, sizeof(st_tensor), cmp_tensor_name);
    if (check_overlaps(f) != CT_OK) goto fail;
    return f;
fail:
    json_decref(root);
    st_free(f);
    return NULL;
}

st_file *st_read(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fail(CT_ERR_IO, path, NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat sb;
    int bad = fstat(fd, &sb);
    if (bad || !S_ISREG(sb.st_mode)) {
        fail(bad ? CT_ERR_IO : CT_ERR_INVALID, path, NULL, "%s", bad ? strerror(errno) : "not a regular file");
        close(fd);
        return NULL;
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return parse((const unsigned char *)"", size, path); /* reports the size */
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        fail(CT_ERR_IO, path, NULL, "cannot map %zu bytes: %s", size, strerror(map_errno));
        return NULL;
    }
    st_file *f = parse(map, size, path);
    if (!f) {
        munmap(map, size);
        return NULL;
    }
    f->map = map;
    f->map_size = size;
    return f;
}

st_file *st_read_mem(const void *buf, size_t len, const char *label) {
    return parse(buf ? buf : (const void *)"", buf ? len : 0, label ? label : "<memory>");
}

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f || !name || !f->count) return NULL;
    st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, (size_t)f->count, sizeof(st_tensor), cmp_tensor_name);
}

const char *st_meta(const st_file *f, const char *key) {
    for (int i = 0; f && key && i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

ct_status st_to_f32(const st_tensor *t, float *out, const char *label) {
    const unsigned char *p = t->data;
    int64_t n = t->numel;
    switch (t->dtype) {
    case ST_F32:
        if (n) memcpy(out, p, (size_t)n * 4);
        return CT_OK;
    case ST_BF16:
    case ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = t->dtype == ST_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
        }
        return CT_OK;
    case ST_F64:
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        return CT_OK;
    default:
        return fail(CT_ERR_UNSUPPORTED, label ? label : "safetensors", t->name,
                    "dtype %s cannot be converted to float32 (supported: F32, BF16, F16, F64)",
                    st_dtype_name(t->dtype));
    }
}

/* ---- writer ------------------------------------------------------------------------------------- */

static int cmp_entry_ptr(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* Checks one entry and gives its byte count. */
static ct_status entry_bytes(const char *path, const st_entry *e, uint64_t *nbytes) {
    if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0) {
        return fail(CT_ERR_INVALID, path, NULL, "a tensor name is empty or \"__metadata__\"");
    }
    if (e->dtype < 0 || e->dtype >= ST_N_DTYPES || e->ndim < 0 || e->ndim > ST_MAX_DIMS ||
        (e->ndim && !e->shape) || (!e->f32 && !e->raw)) {
        return fail(CT_ERR_INVALID, path, e->name, "bad dtype, ndim, shape or data");
    }
    if (e->f32 && e->dtype != ST_F32 && e->dtype != ST_BF16) {
        return fail(CT_ERR_INVALID, path, e->name, "float32 values can be stored as F32 or BF16, not %s",
                    st_dtype_name(e->dtype));
    }
    uint64_t numel = 1, esize = dtypes[e->dtype].size;
    for (int i = 0; i < e->ndim; i++) {
        if (e->shape[i] < 0 || (e->shape[i] && numel > (uint64_t)INT64_MAX / esize / (uint64_t)e->shape[i])) {
            return fail(CT_ERR_INVALID, path, e->name, "shape[%d] = %lld is negative or too large", i,
                        (long long)e->shape[i]);
        }
        numel *= (uint64_t)e->shape[i];
    }
    *nbytes = numel * esize;
    return CT_OK;
}

/* The header JSON into *out: __metadata__ first, then the tensors in the order given, offsets back to
 * back. */
static ct_status header_json(const char *path, const st_entry *const *order, int n, const char *const *meta,
                             int n_meta, char **out) {
    json_t *root = json_object(), *m = n_meta > 0 ? json_object() : NULL;
    ct_status st = CT_OK;
    *out = NULL;
    if (!root || (n_meta > 0 && (!m || json_object_set_new(root, "__metadata__", m)))) goto oom;
    for (int i = 0; i < n_meta; i++) {
        json_t *s = json_string(meta[2 * i + 1]);
        if (!s || json_object_set_new(m, meta[2 * i], s)) {
            st = fail(CT_ERR_INVALID, path, NULL, "metadata '%s' is not valid UTF-8", meta[2 * i]);
            goto done;
        }
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_entry *e = order[i];
        uint64_t nbytes;
        if ((st = entry_bytes(path, e, &nbytes)) != CT_OK) goto done;
        json_t *shape = json_array();
        for (int k = 0; shape && k < e->ndim; k++)
            if (json_array_append_new(shape, json_integer(e->shape[k]))) {
                json_decref(shape);
                goto oom;
            }
        json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtypes[e->dtype].name, "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + nbytes));
        if (!t) goto oom;
        if (json_object_set_new(root, e->name, t)) {
            st = fail(CT_ERR_INVALID, path, e->name, "the name is not valid UTF-8");
            goto done;
        }
        off += nbytes;
    }
    *out = json_dumps(root, JSON_COMPACT); /* keys in insertion order (jansson >= 2.8) */
    if (!*out) goto oom;
    goto done;
oom:
    st = fail(CT_ERR_NOMEM, path, NULL, "out of memory building the header");
done:
    json_decref(root);
    return st;
}

/* Writes e's bytes to fd (bf16 converted in chunks): 0, or -1 with errno set, as ct_write_all. */
static int write_data(int fd, const st_entry *e) {
    uint64_t nbytes;
    if (entry_bytes("", e, &nbytes) != CT_OK) return -1; /* checked by header_json already */
    if (e->raw || e->dtype == ST_F32) return ct_write_all(fd, e->raw ? e->raw : (const void *)e->f32, (size_t)nbytes);
    enum { CHUNK = 16384 };
    uint16_t buf[CHUNK];
    size_t numel = (size_t)(nbytes / 2);
    for (size_t i = 0; i < numel; i += CHUNK) {
        size_t k = numel - i < CHUNK ? numel - i : CHUNK;
        for (size_t j = 0; j < k; j++) buf[j] = st_f32_to_bf16(e->f32[i + j]);
        if (ct_write_all(fd, buf, k * 2)) return -1;
    }
    return 0;
}

/* fsync the folder holding path, so the rename itself survives a crash. Best effort. */
static void sync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

ct_status st_write(const char *path, const st_entry *entries, int n, const char *const *meta, int n_meta) {
    if (!path || n < 0 || (n && !entries) || n_meta < 0 || (n_meta && !meta)) {
        return fail(CT_ERR_INVALID, path ? path : "st_write", NULL, "bad arguments");
    }
    const st_entry **order = malloc(sizeof *order * (size_t)(n ? n : 1));
    char *hdr = NULL, *tmp = NULL;
    int fd = -1;
    ct_status rc = CT_ERR_INTERNAL;
    if (!order || !(tmp = malloc(strlen(path) + 5))) {
        rc = fail(CT_ERR_NOMEM, path, NULL, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) order[i] = &entries[i];
    for (int i = 0; i < n; i++)
        if (!entries[i].name) {
            rc = fail(CT_ERR_INVALID, path, NULL, "tensor %d has no name", i);
            goto done;
        }
    qsort(order, (size_t)n, sizeof *order, cmp_entry_ptr);
    for (int i = 1; i < n; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            rc = fail(CT_ERR_INVALID, path, order[i]->name, "appears twice");
            goto done;
        }
    if ((rc = header_json(path, order, n, meta, n_meta, &hdr)) != CT_OK) goto done;
    size_t len = strlen(hdr), pad = (8 - (8 + len) % 8) % 8;
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)(len + pad) >> (8 * i));
    sprintf(tmp, "%s.tmp", path);
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        rc = fail(CT_ERR_IO, path, NULL, "cannot create %s: %s", tmp, strerror(errno));
        goto done;
    }
    int bad = ct_write_all(fd, n8, 8) || ct_write_all(fd, hdr, len) || ct_write_all(fd, "        ", pad);
    for (int i = 0; !bad && i < n; i++) bad = write_data(fd, order[i]);
    if (bad || fsync(fd) != 0) {
        rc = fail(CT_ERR_IO, path, NULL, "cannot write %s: %s", tmp, strerror(errno));
        goto done;
    }
    int c = close(fd);
    fd = -1;
    if (c != 0 || rename(tmp, path) != 0) {
        rc = fail(CT_ERR_IO, path, NULL, "cannot %s %s: %s", c ? "close" : "rename", tmp, strerror(errno));
        goto done;
    }
    sync_parent_dir(path);
    rc = CT_OK;
done:
    if (fd >= 0) close(fd);
    if (rc != CT_OK && tmp) unlink(tmp);
    free(tmp);
    free(hdr);
    free(order);
    return rc;
}

/* ---- a model in one or several files -------------------------------------------------------------- */

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

void st_model_free(st_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_files; i++) st_free(m->files[i]);
    free(m->files);
    free(m->tensors);
    free(m->where);
    free(m);
}

static void free_pairs(char **pairs, int n) {
    for (int i = 0; pairs && i < 2 * n; i++) free(pairs[i]);
    free(pairs);
}

/* A shard's name must stay inside the folder: a plain file name. */
static int shard_name_ok(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 256 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

ct_status st_index_parse(const void *json, size_t len, const char *label, char ***pairs, int *n) {
    *pairs = NULL;
    *n = 0;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        return fail(CT_ERR_INVALID, label, NULL, "invalid JSON at line %d column %d: %s", je.line, je.column,
                    je.text);
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(root);
        return fail(CT_ERR_INVALID, label, NULL, "expected an object with a non-empty \"weight_map\" object");
    }
    char **p = calloc(2 * json_object_size(wm), sizeof(char *));
    int k = 0;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!p) break;
        char a[80], b[80];
        if (!key[0] || !json_is_string(v) || !shard_name_ok(json_string_value(v))) {
            fail(CT_ERR_INVALID, label, NULL, "weight_map['%s'] is %s%s%s, expected a file name in the same folder",
                 excerpt(a, key), json_is_string(v) ? "'" : json_type_name(v),
                 json_is_string(v) ? excerpt(b, json_string_value(v)) : "", json_is_string(v) ? "'" : "");
            free_pairs(p, k);
            json_decref(root);
            return CT_ERR_INVALID;
        }
        p[2 * k] = strdup(key);
        p[2 * k + 1] = strdup(json_string_value(v));
        k++;
        if (!p[2 * k - 2] || !p[2 * k - 1]) break;
    }
    if (!p || k < (int)json_object_size(wm)) {
        free_pairs(p, k);
        json_decref(root);
        return fail(CT_ERR_NOMEM, label, NULL, "out of memory");
    }
    json_decref(root);
    *pairs = p;
    *n = k;
    return CT_OK;
}

/* Reads a small text file whole (at most cap bytes). */
static char *read_small(const char *path, size_t cap, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fail(CT_ERR_IO, path, NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    char *buf = malloc(cap + 1);
    size_t n = buf ? fread(buf, 1, cap + 1, fp) : 0;
    int bad = !buf || ferror(fp);
    fclose(fp);
    if (bad || n > cap) {
        fail(bad ? CT_ERR_IO : CT_ERR_INVALID, path, NULL, bad ? "cannot read" : "larger than %zu bytes", cap);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int cmp_tensor_ptr_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The position of name in m->tensors, or -1. */
static int model_index_of(const st_model *m, const char *name) {
    if (!m || !name || !m->count) return -1;
    st_tensor key = {.name = (char *)name};
    const st_tensor *kp = &key;
    const st_tensor **hit = bsearch(&kp, m->tensors, (size_t)m->count, sizeof *m->tensors, cmp_tensor_ptr_name);
    return hit ? (int)(hit - m->tensors) : -1;
}

/* Opens files[0..n) (names inside dir) into m and builds the sorted tensor table. */
static ct_status model_add_files(st_model *m, const char *dir, const char *const *names, int n) {
    if (!(m->files = calloc((size_t)n, sizeof *m->files))) goto oom;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!(m->files[i] = st_read(path))) return CT_ERR_INVALID; /* its message names the file */
        m->n_files++;
        total += (size_t)m->files[i]->count;
    }
    m->tensors = malloc(sizeof *m->tensors * (total + 1));
    m->where = malloc(sizeof *m->where * (total + 1));
    if (!m->tensors || !m->where) goto oom;
    for (int i = 0; i < m->n_files; i++)
        for (int k = 0; k < m->files[i]->count; k++) m->tensors[m->count++] = &m->files[i]->tensors[k];
    qsort(m->tensors, (size_t)m->count, sizeof *m->tensors, cmp_tensor_ptr_name);
    for (int i = 0; i < m->count; i++) {
        for (int f = 0; f < m->n_files; f++)
            if (m->tensors[i] >= m->files[f]->tensors && m->tensors[i] < m->files[f]->tensors + m->files[f]->count)
                m->where[i] = m->files[f]->label;
        if (i && strcmp(m->tensors[i - 1]->name, m->tensors[i]->name) == 0) {
            return fail(CT_ERR_INVALID, m->where[i], m->tensors[i]->name, "also in %s", m->where[i - 1]);
        }
    }
    return CT_OK;
oom:
    return fail(CT_ERR_NOMEM, dir, NULL, "out of memory");
}

static ct_status model_from_index(st_model *m, const char *dir, const char *index) {
    size_t len;
    char *text = read_small(index, ST_MAX_HEADER, &len), **pairs = NULL;
    const char **files = NULL;
    int n = 0, n_files = 0;
    ct_status rc = CT_ERR_INVALID;
    if (!text || (rc = st_index_parse(text, len, index, &pairs, &n)) != CT_OK) goto done;
    if (!(files = malloc(sizeof *files * (size_t)n))) {
        rc = fail(CT_ERR_NOMEM, index, NULL, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) files[i] = pairs[2 * i + 1];
    qsort(files, (size_t)n, sizeof *files, cmp_str_ptr);
    for (int i = 0; i < n; i++)
        if (!n_files || strcmp(files[n_files - 1], files[i])) files[n_files++] = files[i];
    if ((rc = model_add_files(m, dir, files, n_files)) != CT_OK) goto done;
    for (int i = 0; i < n; i++) {
        int k = model_index_of(m, pairs[2 * i]);
        const char *want = pairs[2 * i + 1], *have = k >= 0 ? m->where[k] : NULL;
        size_t hl = have ? strlen(have) : 0, wl = strlen(want);
        if (!have || hl < wl + 1 || strcmp(have + hl - wl, want) || have[hl - wl - 1] != '/') {
            rc = fail(CT_ERR_INVALID, index, pairs[2 * i], "is mapped to %s, which does not hold it", want);
            goto done;
        }
    }
    rc = CT_OK;
done:
    free(files);
    free_pairs(pairs, n);
    free(text);
    return rc;
}

st_model *st_model_open(const char *dir) {
    st_model *m = calloc(1, sizeof *m);
    if (!m) {
        fail(CT_ERR_NOMEM, dir, NULL, "out of memory");
        return NULL;
    }
    char single[4096], index[4096];
    snprintf(single, sizeof single, "%s/" SINGLE_NAME, dir);
    snprintf(index, sizeof index, "%s/" INDEX_NAME, dir);
    struct stat sb;
    ct_status rc;
    if (stat(single, &sb) == 0) {
        const char *names[] = {SINGLE_NAME};
        rc = model_add_files(m, dir, names, 1);
    } else if (stat(index, &sb) == 0) {
        rc = model_from_index(m, dir, index);
    } else {
        rc = fail(CT_ERR_INVALID, dir, NULL, "no " SINGLE_NAME " or " INDEX_NAME " in this folder");
    }
    if (rc != CT_OK) {
        st_model_free(m);
        return NULL;
    }
    return m;
}

const st_tensor *st_model_find(const st_model *m, const char *name) {
    int k = model_index_of(m, name);
    return k >= 0 ? m->tensors[k] : NULL;
}

const char *st_model_where(const st_model *m, const char *name) {
    int k = model_index_of(m, name);
    return k >= 0 ? m->where[k] : NULL;
}
