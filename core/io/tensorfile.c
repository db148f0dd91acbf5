/* tensorfile.c: the "ctt" named-tensor file (format in tensorfile.h). */
#include "io/tensorfile.h"

#include "base/error.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Data arrays are copied as they are in memory, so the host must be little-endian like the file. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensorfile.c assumes a little-endian host"
#endif

#define TF_MAGIC "CTTENSOR"
#define TF_HEADER_BYTES 24
/* The smallest tensor record: name_len, a 1-byte name, dtype, ndim = 0, one 4-byte element. */
#define TF_MIN_RECORD_BYTES (4 + 1 + 4 + 4 + 4)
#define TF_FNV_BASIS 14695981039346656037ull /* 0xcbf29ce484222325 */

/* FNV-1a 64 (the checkpoint pieces' checksum too): continues h over n bytes. */
static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int dtype_known(uint32_t dtype) {
    return dtype == TF_F32 || dtype == TF_I32;
}

/* 1 if the n bytes are well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF). */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned min;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) { len = 2; min = 0x80; }
        else if (c >= 0xe0 && c <= 0xef) { len = 3; min = 0x800; }
        else if (c >= 0xf0 && c <= 0xf4) { len = 4; min = 0x10000; }
        else return 0;
        if (n - i < len) return 0;
        unsigned code = c & (0x7f >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            code = code << 6 | (s[i + k] & 0x3f);
        }
        if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

/* A printable excerpt of a name for error messages: control bytes become '?', long names end "...". */
static void name_excerpt(char *out, size_t outlen, const char *name, size_t n) {
    size_t keep = n > 64 ? 64 : n;
    if (keep + 4 > outlen) keep = outlen - 4;
    size_t j = 0;
    for (size_t i = 0; i < keep; i++) {
        unsigned char c = (unsigned char)name[i];
        out[j++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (keep < n) { memcpy(out + j, "...", 3); j += 3; }
    out[j] = '\0';
}

/* "(2, 32, 256)"; "()" for a scalar. */
static void shape_str(char *out, size_t outlen, int ndim, const int64_t *shape) {
    size_t used = 0;
    int n = snprintf(out, outlen, "(");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && used < outlen; i++) {
        n = snprintf(out + used, outlen - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (n > 0) used += (size_t)n;
    }
    if (used < outlen) snprintf(out + used, outlen - used, ")");
}

/* ---------------------------------------------------------------------------------------------- */
/* Reader                                                                                          */

/* Where the bytes come from: a FILE (tf_read) or a buffer (tf_read_mem). `size` is known up front. */
typedef struct reader {
    FILE *fp;
    const unsigned char *mem;
    uint64_t size, pos;
    const char *label;
    long tensor;      /* index of the tensor being parsed, or -1 in the header */
    uint64_t start;   /* byte offset of that tensor's record */
    const char *name; /* its name once read, else NULL */
    size_t name_len;
    int hashing;      /* version 2: every byte read goes into h, the record's checksum */
    uint64_t h;
} reader;

/* Sets the error: "label: tensor 3 'name' at byte 120: what", and returns st. */
static ct_status fail(reader *r, ct_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ct_status fail(reader *r, ct_status st, const char *fmt, ...) {
    char what[256], where[160] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (r->tensor >= 0) {
        char shown[80] = "", at[40] = "";
        if (r->name) {
            name_excerpt(shown + 2, sizeof shown - 3, r->name, r->name_len);
            shown[0] = ' ';
            shown[1] = '\'';
            strcat(shown, "'");
        }
        if (r->start != UINT64_MAX) snprintf(at, sizeof at, " at byte %llu", (unsigned long long)r->start);
        snprintf(where, sizeof where, "tensor %ld%s%s: ", r->tensor, shown, at);
    }
    ct_set_error("%s: %s%s", r->label, where, what);
    return st;
}

/* CT_OK if the file still holds n bytes; else CT_ERR_INVALID and a "truncated" error naming the field. */
static ct_status need(reader *r, uint64_t n, const char *what) {
    uint64_t left = r->size - r->pos;
    if (n <= left) return CT_OK;
    return fail(r, CT_ERR_INVALID, "truncated: %s needs %llu bytes but only %llu remain", what, (unsigned long long)n,
                (unsigned long long)left);
}

/* Reads n bytes, after checking that the file holds them. `what` names the field for the error. */
static ct_status take(reader *r, void *dst, uint64_t n, const char *what) {
    ct_status st = need(r, n, what);
    if (st != CT_OK) return st;
    if (r->mem) {
        if (n) memcpy(dst, r->mem + r->pos, (size_t)n);
    } else if (n && fread(dst, 1, (size_t)n, r->fp) != (size_t)n) {
        return fail(r, CT_ERR_IO, "read error in %s at byte %llu: %s", what, (unsigned long long)r->pos,
                    ferror(r->fp) ? strerror(errno) : "file shrank while being read");
    }
    if (r->hashing) r->h = fnv1a(dst, (size_t)n, r->h);
    r->pos += n;
    return CT_OK;
}

static ct_status take_u32(reader *r, uint32_t *v, const char *what) {
    unsigned char b[4];
    ct_status st = take(r, b, 4, what);
    if (st != CT_OK) return st;
    *v = get_u32(b);
    return CT_OK;
}

/* Reads one tensor record into e (which tf_free can release however far this got). */
static ct_status read_entry(reader *r, tf_entry *e) {
    uint32_t name_len, dtype, ndim;
    ct_status st;
    if ((st = take_u32(r, &name_len, "name length")) != CT_OK) return st;
    if (name_len < 1 || name_len > TF_MAX_NAME)
        return fail(r, CT_ERR_INVALID, "name length %u is outside 1..%d", name_len, TF_MAX_NAME);
    if ((st = need(r, name_len, "name")) != CT_OK) return st;
    e->name = malloc((size_t)name_len + 1);
    if (!e->name) return fail(r, CT_ERR_NOMEM, "out of memory");
    if ((st = take(r, e->name, name_len, "name")) != CT_OK) return st;
    e->name[name_len] = '\0';
    if (memchr(e->name, '\0', name_len)) return fail(r, CT_ERR_INVALID, "name contains a NUL byte");
    r->name = e->name;
    r->name_len = name_len;
    if (!utf8_valid((const unsigned char *)e->name, name_len))
        return fail(r, CT_ERR_INVALID, "name is not valid UTF-8");

    if ((st = take_u32(r, &dtype, "dtype")) != CT_OK) return st;
    if (!dtype_known(dtype))
        return fail(r, CT_ERR_INVALID, "dtype %u is not supported (expected 1 = f32 or 5 = int32)", dtype);
    e->dtype = (int)dtype;
    if ((st = take_u32(r, &ndim, "ndim")) != CT_OK) return st;
    if (ndim > TF_MAX_DIMS) return fail(r, CT_ERR_INVALID, "ndim %u is outside 0..%d", ndim, TF_MAX_DIMS);
    e->ndim = (int)ndim;

    unsigned char sb[8 * TF_MAX_DIMS];
    if ((st = take(r, sb, 8ull * ndim, "shape")) != CT_OK) return st;
    /* numel * 4 must fit in int64_t (and in size_t, which is as wide on every supported host). */
    const int64_t max_numel = INT64_MAX / 4;
    int64_t numel = 1;
    int too_big = 0;
    for (uint32_t k = 0; k < ndim; k++) {
        uint64_t d = get_u64(sb + 8 * k);
        if (d > (uint64_t)INT64_MAX)
            return fail(r, CT_ERR_INVALID, "shape[%u] = %llu is too large", k, (unsigned long long)d);
        e->shape[k] = (int64_t)d;
        if (d != 0 && numel > max_numel / (int64_t)d) too_big = 1;
        else numel *= (int64_t)d;
    }
    if (too_big) {
        char s[160];
        shape_str(s, sizeof s, e->ndim, e->shape);
        return fail(r, CT_ERR_INVALID, "shape %s has too many elements", s);
    }
    e->numel = numel;

    uint64_t bytes = 4ull * (uint64_t)numel;
    if ((st = need(r, bytes, "data")) != CT_OK) return st; /* before allocating: the file must hold the data */
    e->data = malloc(bytes ? (size_t)bytes : 1);
    if (!e->data) return fail(r, CT_ERR_NOMEM, "out of memory for %llu bytes of data", (unsigned long long)bytes);
    return take(r, e->data, bytes, "data");
}

static int cmp_entry_ptr(const void *a, const void *b) {
    const tf_entry *x = *(const tf_entry *const *)a, *y = *(const tf_entry *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x < y ? -1 : x > y);
}

/* Names must be unique. Sorting keeps this O(n log n) however many tensors a file claims. The error
 * names the first tensor, in file order, that repeats an earlier name. */
static ct_status check_unique(reader *r, tf_file *f) {
    if (f->count < 2) return CT_OK;
    const tf_entry **by_name = malloc((size_t)f->count * sizeof *by_name);
    if (!by_name) return fail(r, CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < f->count; i++) by_name[i] = &f->entries[i];
    qsort(by_name, (size_t)f->count, sizeof *by_name, cmp_entry_ptr);
    /* Equal names now sit together in file order: a group's first member is the original. */
    const tf_entry *dup = NULL, *orig = NULL;
    for (int i = 1, group = 0; i < f->count; i++) {
        if (strcmp(by_name[i]->name, by_name[i - 1]->name) != 0) { group = i; continue; }
        if (!dup || by_name[i] < dup) { dup = by_name[i]; orig = by_name[group]; }
    }
    free(by_name);
    if (!dup) return CT_OK;
    r->tensor = (long)(dup - f->entries);
    r->start = UINT64_MAX; /* record offsets are not kept */
    r->name = dup->name;
    r->name_len = strlen(dup->name);
    return fail(r, CT_ERR_INVALID, "duplicate name (tensor %ld has it too)", (long)(orig - f->entries));
}

/* The fixed header: magic, a version we read, a zero reserved field, and a tensor count the file
 * can hold. CT_OK, or a status (the reader's error says why). */
static ct_status header_read(reader *r, uint32_t *version, uint32_t *count) {
    unsigned char h[TF_HEADER_BYTES];
    if (r->size < TF_HEADER_BYTES)
        return fail(r, CT_ERR_INVALID, "file is %llu bytes, shorter than the %d-byte header",
                    (unsigned long long)r->size, TF_HEADER_BYTES);
    ct_status st = take(r, h, TF_HEADER_BYTES, "header");
    if (st != CT_OK) return st;
    if (memcmp(h, TF_MAGIC, 8) != 0)
        return fail(r, CT_ERR_INVALID, "bad magic (expected \"CTTENSOR\"): not a ctt tensor file");
    *version = get_u32(h + 8);
    *count = get_u32(h + 12);
    uint64_t reserved = get_u64(h + 16);
    if (*version != 1 && *version != TF_VERSION)
        return fail(r, CT_ERR_INVALID, "format version %u is not supported (expected 1 or %d)", *version, TF_VERSION);
    uint64_t sum_bytes = *version >= 2 ? 8 : 0; /* per tensor, after the last record */
    if (reserved != 0)
        return fail(r, CT_ERR_INVALID, "reserved header field is %llu, expected 0", (unsigned long long)reserved);
    uint64_t most = (r->size - TF_HEADER_BYTES) / (TF_MIN_RECORD_BYTES + sum_bytes);
    if (*count > most || *count > INT_MAX)
        return fail(r, CT_ERR_INVALID, "header says %u tensors but the remaining %llu bytes hold at most %llu", *count,
                    (unsigned long long)(r->size - TF_HEADER_BYTES), (unsigned long long)most);
    return CT_OK;
}

/* Version 2: after the records, one checksum per tensor, equal to its record's (sums; starts are
 * the records' offsets, for the error). CT_OK, or a status with the error set. */
static ct_status checksums_check(reader *r, const tf_file *f, uint32_t count, const uint64_t *sums,
                                 const uint64_t *starts) {
    uint64_t sum_bytes = 8;
    if (r->size - r->pos != sum_bytes * count)
        return fail(r, CT_ERR_INVALID, "after the last tensor %llu bytes remain; the %u checksums take %llu",
                    (unsigned long long)(r->size - r->pos), count, (unsigned long long)(sum_bytes * count));
    for (uint32_t i = 0; i < count; i++) {
        unsigned char b[8];
        ct_status st = take(r, b, 8, "checksum");
        if (st != CT_OK) return st;
        if (get_u64(b) == sums[i]) continue;
        r->tensor = (long)i;
        r->start = starts[i];
        r->name = f->entries[i].name;
        r->name_len = strlen(r->name);
        return fail(r, CT_ERR_INVALID,
                    "checksum mismatch (stored %016llx, the record gives %016llx): the file is corrupt",
                    (unsigned long long)get_u64(b), (unsigned long long)sums[i]);
    }
    return CT_OK;
}

static tf_file *parse(reader *r) {
    uint32_t version = 0, count = 0;
    r->tensor = -1;
    if (header_read(r, &version, &count) != CT_OK) return NULL;
    uint64_t sum_bytes = version >= 2 ? 8 : 0;
    tf_file *f = calloc(1, sizeof *f);
    uint64_t *sums = calloc(count ? count : 1, sizeof *sums), *starts = calloc(count ? count : 1, sizeof *starts);
    if (f) f->entries = calloc(count ? count : 1, sizeof *f->entries);
    if (!f || !f->entries || !sums || !starts) {
        if (f) free(f->entries);
        free(f);
        free(sums);
        free(starts);
        fail(r, CT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    f->version = (int)version;
    for (uint32_t i = 0; i < count; i++) {
        r->tensor = (long)i;
        r->start = starts[i] = r->pos;
        r->name = NULL;
        f->count = (int)i + 1; /* so tf_free releases this entry's partial allocations too */
        r->hashing = sum_bytes > 0;
        r->h = TF_FNV_BASIS;
        if (read_entry(r, &f->entries[i]) != CT_OK) goto fail;
        r->hashing = 0;
        sums[i] = r->h;
    }
    r->tensor = -1;
    if (sum_bytes && checksums_check(r, f, count, sums, starts) != CT_OK) goto fail;
    if (r->pos != r->size) {
        fail(r, CT_ERR_INVALID, "%llu trailing bytes after the last tensor (tensor count %u)",
             (unsigned long long)(r->size - r->pos), count);
        goto fail;
    }
    if (check_unique(r, f) != CT_OK) goto fail;
    free(sums);
    free(starts);
    return f;
fail:
    free(sums);
    free(starts);
    tf_free(f);
    return NULL;
}

tf_file *tf_read(const char *path) {
    reader r = {.label = path, .tensor = -1};
    r.fp = fopen(path, "rb");
    if (!r.fp) {
        fail(&r, CT_ERR_IO, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(r.fp), &st) != 0) {
        fail(&r, CT_ERR_IO, "cannot stat: %s", strerror(errno));
        fclose(r.fp);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        fail(&r, CT_ERR_INVALID, "not a regular file");
        fclose(r.fp);
        return NULL;
    }
    r.size = (uint64_t)st.st_size;
    tf_file *f = parse(&r);
    fclose(r.fp);
    return f;
}

tf_file *tf_read_mem(const void *buf, size_t len, const char *label) {
    static const unsigned char empty[1];
    reader r = {.mem = buf ? buf : empty, .size = buf ? len : 0, .label = label ? label : "<memory>", .tensor = -1};
    return parse(&r);
}

const tf_entry *tf_find(const tf_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->count; i++)
        if (f->entries[i].name && strcmp(f->entries[i].name, name) == 0) return &f->entries[i];
    return NULL;
}

const tf_entry *tf_expect(const tf_file *f, const char *label, const char *name, int dtype, int ndim,
                          const int64_t *shape) {
    const char *pre = label ? label : "", *sep = label ? ": " : "";
    const tf_entry *e = tf_find(f, name);
    if (!e) {
        ct_set_error("%s%stensor '%s' is missing", pre, sep, name);
        return NULL;
    }
    if (e->dtype != dtype) {
        ct_set_error("%s%stensor '%s' has dtype %d, expected %d", pre, sep, name, e->dtype, dtype);
        return NULL;
    }
    int same = e->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = e->shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        shape_str(got, sizeof got, e->ndim, e->shape);
        shape_str(want, sizeof want, ndim < 0 ? 0 : ndim > TF_MAX_DIMS ? TF_MAX_DIMS : ndim, shape);
        ct_set_error("%s%stensor '%s' has shape %s, expected %s", pre, sep, name, got, want);
        return NULL;
    }
    return e;
}

void tf_free(tf_file *f) {
    if (!f) return;
    for (int i = 0; i < f->count; i++) {
        free(f->entries[i].name);
        free(f->entries[i].data);
    }
    free(f->entries);
    free(f);
}

ct_status tf_check_finite_data(const float *x, int64_t n, const char *label, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if ((u & 0x7f800000u) != 0x7f800000u) continue; /* exponent all ones: Inf or NaN */
        return ct_fail(CT_ERR_INVALID, "%s: tensor '%s' holds %s at element %lld of %lld: refusing non-finite weights",
                       label, what, u & 0x007fffffu ? "NaN" : (u >> 31) ? "-Inf" : "Inf", (long long)i, (long long)n);
    }
    return CT_OK;
}

ct_status tf_check_finite(const tf_file *f, const char *label) {
    for (int i = 0; f && i < f->count; i++) {
        const tf_entry *e = &f->entries[i];
        ct_status st = e->dtype == TF_F32 ? tf_check_finite_data(e->data, e->numel, label, e->name) : CT_OK;
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Writer                                                                                          */

struct tf_writer {
    FILE *fp;
    char *path, *tmp;
    uint32_t count;
    char **names; /* every name added so far, to refuse duplicates */
    uint64_t *sums; /* every record's checksum, written after the last record */
    size_t names_cap;
    ct_status status; /* of the first error, whose message err holds */
    char err[512];
};

/* Records the writer's first error (a later one is dropped) and returns its status, with its message
 * set (ct_last_error). */
static ct_status wfail(tf_writer *w, ct_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ct_status wfail(tf_writer *w, ct_status st, const char *fmt, ...) {
    if (!w->err[0]) { /* keep the first error */
        w->status = st;
        char what[384];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        snprintf(w->err, sizeof w->err, "%s: %s", w->path, what);
    }
    return ct_fail(w->status, "%s", w->err);
}

static void writer_free(tf_writer *w) {
    for (uint32_t i = 0; i < w->count; i++) free(w->names[i]);
    free(w->names);
    free(w->sums);
    free(w->path);
    free(w->tmp);
    free(w);
}

tf_writer *tf_writer_open(const char *path) {
    tf_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n + 5))) {
        ct_set_error("%s: out of memory", path);
        if (w) writer_free(w);
        return NULL;
    }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    w->fp = ct_fopen_nofollow(w->tmp, "wb"); /* a symlink planted at the temporary name is refused */
    if (!w->fp) {
        ct_set_error("%s: cannot create %s: %s", path, w->tmp, ct_open_strerror(errno));
        writer_free(w);
        return NULL;
    }
    unsigned char h[TF_HEADER_BYTES] = {0};
    memcpy(h, TF_MAGIC, 8);
    put_u32(h + 8, TF_VERSION); /* the count (h + 12) is patched by tf_writer_close */
    if (fwrite(h, 1, sizeof h, w->fp) != sizeof h) {
        ct_set_error("%s: cannot write %s: %s", path, w->tmp, strerror(errno));
        tf_writer_abort(w);
        return NULL;
    }
    return w;
}

/* Checks the arguments of tf_writer_add: CT_OK if they make a valid record (numel in *numel), else
 * the writer's error (CT_ERR_INVALID). */
static ct_status check_add(tf_writer *w, const char *name, int dtype, int ndim, const int64_t *shape,
                           const void *data, int64_t *numel) {
    size_t len = name ? strlen(name) : 0;
    char shown[72] = "";
    if (name) name_excerpt(shown, sizeof shown, name, len);
    if (len < 1 || len > TF_MAX_NAME)
        return wfail(w, CT_ERR_INVALID, "tensor %u '%s': name length %zu is outside 1..%d", w->count, shown, len,
                     TF_MAX_NAME);
    if (!utf8_valid((const unsigned char *)name, len))
        return wfail(w, CT_ERR_INVALID, "tensor %u '%s': name is not valid UTF-8", w->count, shown);
    if (!dtype_known((uint32_t)dtype))
        return wfail(w, CT_ERR_INVALID, "tensor %u '%s': dtype %d is not supported (1 = f32, 5 = int32)", w->count,
                     shown, dtype);
    if (ndim < 0 || ndim > TF_MAX_DIMS || (ndim > 0 && !shape))
        return wfail(w, CT_ERR_INVALID, "tensor %u '%s': ndim %d is outside 0..%d or shape is NULL", w->count, shown,
                     ndim, TF_MAX_DIMS);
    int64_t n = 1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0 || (shape[k] != 0 && n > (INT64_MAX / 4) / shape[k]))
            return wfail(w, CT_ERR_INVALID, "tensor %u '%s': shape[%d] = %lld is negative or makes the tensor too large",
                         w->count, shown, k, (long long)shape[k]);
        n *= shape[k];
    }
    if (n > 0 && !data) return wfail(w, CT_ERR_INVALID, "tensor %u '%s': data is NULL", w->count, shown);
    for (uint32_t i = 0; i < w->count; i++)
        if (strcmp(w->names[i], name) == 0)
            return wfail(w, CT_ERR_INVALID, "tensor %u '%s': duplicate name (tensor %u has it too)", w->count, shown, i);
    if (w->count == UINT32_MAX || w->count == INT_MAX) return wfail(w, CT_ERR_INVALID, "too many tensors");
    *numel = n;
    return CT_OK;
}

ct_status tf_writer_add(tf_writer *w, const char *name, int dtype, int ndim, const int64_t *shape,
                        const void *data) {
    if (!w) return ct_fail(CT_ERR_INVALID, "tf_writer_add: no writer");
    if (w->err[0]) return ct_fail(w->status, "%s", w->err);
    int64_t numel = 0;
    ct_status st = check_add(w, name, dtype, ndim, shape, data, &numel);
    if (st != CT_OK) return st;
    if (w->count == w->names_cap) {
        size_t cap = w->names_cap ? 2 * w->names_cap : 16;
        char **grown = realloc(w->names, cap * sizeof *grown);
        if (grown) w->names = grown;
        uint64_t *sums = grown ? realloc(w->sums, cap * sizeof *sums) : NULL;
        if (!sums) return wfail(w, CT_ERR_NOMEM, "out of memory");
        w->sums = sums;
        w->names_cap = cap;
    }
    size_t len = strlen(name);
    char *copy = strdup(name);
    if (!copy) return wfail(w, CT_ERR_NOMEM, "out of memory");

    unsigned char head[4 + 4 + 4 + 8 * TF_MAX_DIMS];
    size_t hn = 0;
    put_u32(head, (uint32_t)len);
    int ok = fwrite(head, 1, 4, w->fp) == 4 && fwrite(name, 1, len, w->fp) == len;
    uint64_t h = fnv1a(name, len, fnv1a(head, 4, TF_FNV_BASIS));
    put_u32(head + hn, (uint32_t)dtype); hn += 4;
    put_u32(head + hn, (uint32_t)ndim); hn += 4;
    for (int k = 0; k < ndim; k++, hn += 8) put_u64(head + hn, (uint64_t)shape[k]);
    size_t bytes = 4 * (size_t)numel;
    ok = ok && fwrite(head, 1, hn, w->fp) == hn && (bytes == 0 || fwrite(data, 1, bytes, w->fp) == bytes);
    w->sums[w->count] = fnv1a(data, bytes, fnv1a(head, hn, h));
    if (!ok) {
        free(copy);
        return wfail(w, CT_ERR_IO, "cannot write %s: %s", w->tmp, strerror(errno));
    }
    w->names[w->count++] = copy;
    return CT_OK;
}

const char *tf_writer_error(const tf_writer *w) {
    return w ? w->err : "no writer";
}

void tf_writer_abort(tf_writer *w) {
    if (!w) return;
    if (w->fp) fclose(w->fp);
    remove(w->tmp);
    writer_free(w);
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

ct_status tf_writer_close(tf_writer *w) {
    if (!w) return ct_fail(CT_ERR_INVALID, "tf_writer_close: no writer");
    for (uint32_t i = 0; i < w->count && !w->err[0]; i++) { /* the checksums follow the last record */
        unsigned char c[8];
        put_u64(c, w->sums[i]);
        if (fwrite(c, 1, 8, w->fp) != 8) wfail(w, CT_ERR_IO, "cannot write %s: %s", w->tmp, strerror(errno));
    }
    if (!w->err[0]) {
        unsigned char c[4];
        put_u32(c, w->count);
        if (fseek(w->fp, 12, SEEK_SET) != 0 || fwrite(c, 1, 4, w->fp) != 4 || fflush(w->fp) != 0 ||
            fsync(fileno(w->fp)) != 0)
            wfail(w, CT_ERR_IO, "cannot write %s: %s", w->tmp, strerror(errno));
    }
    if (!w->err[0]) {
        int rc = fclose(w->fp);
        w->fp = NULL;
        if (rc != 0) wfail(w, CT_ERR_IO, "cannot close %s: %s", w->tmp, strerror(errno));
        else if (rename(w->tmp, w->path) != 0)
            wfail(w, CT_ERR_IO, "cannot rename %s to %s: %s", w->tmp, w->path, strerror(errno));
    }
    if (w->err[0]) {
        ct_status st = ct_fail(w->status, "%s", w->err);
        tf_writer_abort(w);
        return st;
    }
    sync_parent_dir(w->path);
    writer_free(w);
    return CT_OK;
}

ct_status tf_writer_add_text(tf_writer *w, const char *name, const char *text) {
    size_t n = strlen(text), words = (n + 3) / 4;
    int32_t *packed = calloc(words ? words : 1, sizeof *packed);
    if (!packed) return w ? wfail(w, CT_ERR_NOMEM, "tensor %u: out of memory", w->count)
                          : ct_fail(CT_ERR_NOMEM, "tf_writer_add_text: out of memory");
    for (size_t k = 0; k < n; k++) /* through uint32_t: byte 3 may set the sign bit */
        packed[k / 4] = (int32_t)((uint32_t)packed[k / 4] | (uint32_t)(unsigned char)text[k] << (8 * (k % 4)));
    int64_t shape[1] = {(int64_t)words};
    ct_status st = tf_writer_add(w, name, TF_I32, 1, shape, packed);
    free(packed);
    return st;
}

ct_status tf_text(const tf_file *f, const char *label, const char *name, char **text) {
    *text = NULL;
    const tf_entry *e = tf_find(f, name);
    if (!e) return CT_OK;
    if (e->dtype != TF_I32 || e->ndim != 1)
        return ct_fail(CT_ERR_INVALID, "%s: tensor '%s': expected text (int32, one dimension)", label, name);
    size_t cap = (size_t)e->numel * 4, n = 0;
    char *out = malloc(cap + 1);
    if (!out) return ct_fail(CT_ERR_NOMEM, "%s: tensor '%s': out of memory", label, name);
    const int32_t *v = e->data;
    for (size_t k = 0; k < cap; k++) out[k] = (char)(((uint32_t)v[k / 4] >> (8 * (k % 4))) & 0xff);
    out[cap] = 0;
    n = strlen(out);
    int bad = cap - n >= 4; /* more than the last element's padding */
    for (size_t k = n; k < cap && !bad; k++) bad = out[k] != 0;
    if (bad || !utf8_valid((const unsigned char *)out, n)) {
        free(out);
        return ct_fail(CT_ERR_INVALID, "%s: tensor '%s': %s", label, name,
                       bad ? "a NUL inside the text" : "not valid UTF-8");
    }
    *text = out;
    return CT_OK;
}

tf_file *tf_read_first(const char *path, size_t cap) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        ct_set_error("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    /* header, then the first record's fixed part: name_len | name | dtype | ndim | shape */
    unsigned char *buf = malloc(cap + 24 + 8 + 1);
    size_t n = buf ? fread(buf, 1, 24, fp) : 0, len = 24;
    tf_file *f = NULL;
    if (!buf) {
        ct_set_error("%s: out of memory", path);
        goto done;
    }
    uint32_t version = n == 24 ? get_u32(buf + 8) : 0, count = n == 24 ? get_u32(buf + 12) : 0;
    uint64_t rec = 0; /* the first record's length, when it fits */
    unsigned char h[4 + TF_MAX_NAME + 8 + 8 * TF_MAX_DIMS];
    size_t hn = n == 24 && count > 0 ? fread(h, 1, sizeof h, fp) : 0;
    if (hn >= 4 && get_u32(h) >= 1 && get_u32(h) <= TF_MAX_NAME && hn >= 4 + get_u32(h) + 8) {
        uint32_t nl = get_u32(h), ndim = get_u32(h + 4 + nl + 4);
        uint64_t numel = 1;
        rec = 4 + (uint64_t)nl + 8 + 8 * (uint64_t)ndim;
        for (uint32_t d = 0; ndim <= TF_MAX_DIMS && d < ndim && rec <= hn; d++) {
            uint64_t dim = get_u32(h + 4 + nl + 8 + 8 * d) | (uint64_t)get_u32(h + 4 + nl + 12 + 8 * d) << 32;
            numel = dim && numel > cap / dim ? cap + 1 : numel * dim;
        }
        rec = ndim > TF_MAX_DIMS || rec > hn || numel > cap / 4 ? 0 : rec + 4 * numel;
    }
    if (rec && rec <= cap && fseek(fp, 24, SEEK_SET) == 0 && fread(buf + 24, 1, rec, fp) == rec) {
        len = 24 + rec;
        if (version >= 2 && !(fseek(fp, -(long)(8 * (uint64_t)count), SEEK_END) == 0 && fread(buf + len, 1, 8, fp) == 8))
            len = 24; /* no checksum to read: the whole-file reader reports the truncation */
        else if (version >= 2) len += 8;
    }
    if (len > 24) buf[12] = 1, buf[13] = buf[14] = buf[15] = 0; /* a file of that one record */
    else if (n == 24) buf[12] = buf[13] = buf[14] = buf[15] = 0; /* of none */
    f = tf_read_mem(buf, n == 24 ? len : n, path);
done:
    free(buf);
    fclose(fp);
    return f;
}
