/* test_tensorfile: the ctt reader and writer (core/io/tensorfile.c).
 *
 * Files for the reader are built byte by byte from the format in tensorfile.h, not with the writer,
 * so the two sides are checked against the spec rather than against each other. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/tensorfile.h"

/* ---- a byte buffer to build files with ---- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v) {
    unsigned char c[4];
    for (int i = 0; i < 4; i++) c[i] = (unsigned char)(v >> (8 * i));
    put(b, c, 4);
}

static void put_u64(buf *b, uint64_t v) {
    unsigned char c[8];
    for (int i = 0; i < 8; i++) c[i] = (unsigned char)(v >> (8 * i));
    put(b, c, 8);
}

static void put_header(buf *b, uint32_t count) {
    put(b, "CTTENSOR", 8);
    put_u32(b, 1);
    put_u32(b, count);
    put_u64(b, 0);
}

/* One record with data value k, k+1, ... (as f32 or int32). */
static void put_tensor(buf *b, const char *name, uint32_t dtype, uint32_t ndim, const uint64_t *shape) {
    put_u32(b, (uint32_t)strlen(name));
    put(b, name, strlen(name));
    put_u32(b, dtype);
    put_u32(b, ndim);
    uint64_t numel = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        put_u64(b, shape[i]);
        numel *= shape[i];
    }
    for (uint64_t i = 0; i < numel; i++) {
        if (dtype == TF_I32) {
            int32_t v = (int32_t)i - 3;
            put(b, &v, 4);
        } else {
            float v = 0.5f * (float)i;
            put(b, &v, 4);
        }
    }
}

/* A valid three-tensor file: "w" (2,3) f32, "ids" (4,) int32, "s" scalar f32. */
static buf sample_file(void) {
    buf b = {0};
    put_header(&b, 3);
    put_tensor(&b, "w", TF_F32, 2, (uint64_t[]){2, 3});
    put_tensor(&b, "ids", TF_I32, 1, (uint64_t[]){4});
    put_tensor(&b, "s", TF_F32, 0, NULL);
    return b;
}

/* FNV-1a 64, written out from its definition (offset basis, prime) to check the reader and writer. */
static uint64_t fnv1a64(const unsigned char *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The sample as format version 2: the same records, then each record's checksum. */
static buf sample_file_v2(void) {
    buf b = {0};
    size_t start[4];
    put_header(&b, 3);
    b.p[8] = 2;
    start[0] = b.n;
    put_tensor(&b, "w", TF_F32, 2, (uint64_t[]){2, 3});
    start[1] = b.n;
    put_tensor(&b, "ids", TF_I32, 1, (uint64_t[]){4});
    start[2] = b.n;
    put_tensor(&b, "s", TF_F32, 0, NULL);
    start[3] = b.n;
    for (int i = 0; i < 3; i++) put_u64(&b, fnv1a64(b.p + start[i], start[i + 1] - start[i]));
    return b;
}

/* Reads b from memory, expects failure with a message containing want (and starting "mem: "). */
static void expect_error(const buf *b, const char *want) {
    tf_file *f = tf_read_mem(b->p, b->n, "mem");
    if (f || !strstr(ct_last_error(), want) || strncmp(ct_last_error(), "mem: ", 5) != 0)
        fail_msg("expected an error containing \"%s\", got %s \"%s\"", want, f ? "success," : "", ct_last_error());
}

static char tmpdir[64];

static int setup_dir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_tensorfile.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
    static char p[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- reader on valid input ---- */

static void test_read_sample_gives_names_shapes_and_values(void **state) {
    (void)state;
    buf b = sample_file();
    tf_file *f = tf_read_mem(b.p, b.n, "mem");
    assert_non_null(f);
    assert_int_equal(f->count, 3);

    const tf_entry *w = tf_find(f, "w");
    assert_non_null(w);
    assert_int_equal(w->dtype, TF_F32);
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 2);
    assert_int_equal(w->shape[1], 3);
    assert_int_equal(w->numel, 6);
    for (int i = 0; i < 6; i++) assert_true(((float *)w->data)[i] == 0.5f * (float)i);

    const tf_entry *ids = tf_find(f, "ids");
    assert_non_null(ids);
    assert_int_equal(ids->dtype, TF_I32);
    for (int i = 0; i < 4; i++) assert_int_equal(((int32_t *)ids->data)[i], i - 3);

    const tf_entry *s = tf_find(f, "s");
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->numel, 1);
    assert_true(*(float *)s->data == 0.0f);

    assert_null(tf_find(f, "nope"));
    assert_null(tf_find(f, "i")); /* no prefix matching */
    tf_free(f);
    free(b.p);
}

static void test_expect_checks_dtype_and_shape(void **state) {
    (void)state;
    buf b = sample_file();
    tf_file *f = tf_read_mem(b.p, b.n, "mem");
    assert_non_null(f);
    assert_non_null(tf_expect(f, "g.ctt", "w", TF_F32, 2, (int64_t[]){2, 3}));
    assert_non_null(tf_expect(f, "g.ctt", "s", TF_F32, 0, NULL));

    assert_null(tf_expect(f, "g.ctt", "w", TF_F32, 2, (int64_t[]){3, 2}));
    assert_string_equal(ct_last_error(), "g.ctt: tensor 'w' has shape (2, 3), expected (3, 2)");
    assert_null(tf_expect(f, "g.ctt", "w", TF_F32, 1, (int64_t[]){6}));
    assert_string_equal(ct_last_error(), "g.ctt: tensor 'w' has shape (2, 3), expected (6)");
    assert_null(tf_expect(f, "g.ctt", "ids", TF_F32, 1, (int64_t[]){4}));
    assert_string_equal(ct_last_error(), "g.ctt: tensor 'ids' has dtype 5, expected 1");
    assert_null(tf_expect(f, NULL, "gone", TF_F32, 0, NULL));
    assert_string_equal(ct_last_error(), "tensor 'gone' is missing");
    tf_free(f);
    free(b.p);
}

static void test_read_accepts_empty_file_and_zero_sized_tensor(void **state) {
    (void)state;
    buf b = {0};
    put_header(&b, 0);
    tf_file *f = tf_read_mem(b.p, b.n, "mem");
    assert_non_null(f);
    assert_int_equal(f->count, 0);
    tf_free(f);

    b.n = 0;
    put_header(&b, 1);
    put_tensor(&b, "empty", TF_F32, 3, (uint64_t[]){4, 0, 5});
    f = tf_read_mem(b.p, b.n, "mem");
    assert_non_null(f);
    assert_int_equal(f->entries[0].numel, 0);
    assert_non_null(f->entries[0].data);
    tf_free(f);
    free(b.p);
}

/* ---- reader on corrupt input: each case gives one clean line ---- */

static void test_read_rejects_bad_magic_version_and_reserved(void **state) {
    (void)state;
    buf b = sample_file();
    b.p[0] = 'X';
    expect_error(&b, "bad magic");
    b.p[0] = 'C';
    b.p[8] = 3;
    expect_error(&b, "format version 3 is not supported (expected 1 or 2)");
    b.p[8] = 1;
    b.p[20] = 1;
    expect_error(&b, "reserved header field is");
    b.p[20] = 0;
    free(b.p);
}

static void test_read_rejects_truncation_at_every_length(void **state) {
    (void)state;
    buf b = sample_file();
    for (size_t n = 0; n < b.n; n++) {
        tf_file *f = tf_read_mem(b.p, n, "mem");
        if (f) fail_msg("a file cut to %zu of %zu bytes was accepted", n, b.n);
        /* cut inside the header, or a count the bytes cannot hold, or a truncated field */
        if (!strstr(ct_last_error(), "truncated") && !strstr(ct_last_error(), "shorter than the 24-byte header") &&
            !strstr(ct_last_error(), "hold at most"))
            fail_msg("cut to %zu bytes: unexpected message \"%s\"", n, ct_last_error());
    }
    /* a cut inside the second tensor's data names that tensor and the field */
    assert_null(tf_read_mem(b.p, b.n - 17 - 5, "mem"));
    assert_string_equal(ct_last_error(),
                        "mem: tensor 1 'ids' at byte 77: truncated: data needs 16 bytes but only 11 remain");
    free(b.p);
}

static void test_read_rejects_truncated_files_on_disk(void **state) {
    (void)state;
    buf b = sample_file();
    const size_t cuts[] = {0, 7, 23, 24, 27, 29, b.n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const char *path = tmp_path("cut.ctt");
        write_bytes(path, b.p, cuts[i]);
        assert_null(tf_read(path));
        assert_int_equal(strncmp(ct_last_error(), path, strlen(path)), 0);
    }
    assert_null(tf_read(tmp_path("does-not-exist.ctt")));
    assert_non_null(strstr(ct_last_error(), "cannot open"));
    assert_null(tf_read(tmpdir));
    assert_non_null(strstr(ct_last_error(), "not a regular file"));
    free(b.p);
}

static void test_read_rejects_bad_name_lengths(void **state) {
    (void)state;
    buf b = {0};
    put_header(&b, 1);
    put_u32(&b, 0xffffffffu);
    put(&b, "xxxxxxxxxxxxxxxx", 16);
    expect_error(&b, "tensor 0 at byte 24: name length 4294967295 is outside 1..1024");

    b.n = 0;
    put_header(&b, 1);
    put_u32(&b, 0);
    put(&b, "xxxxxxxxxxxxxxxx", 16);
    expect_error(&b, "name length 0 is outside 1..1024");

    /* within limits but longer than the file */
    b.n = 0;
    put_header(&b, 1);
    put_u32(&b, 1000);
    put(&b, "xxxxxxxxxxxxxxxx", 16);
    expect_error(&b, "truncated: name needs 1000 bytes but only 16 remain");
    free(b.p);
}

static void test_read_rejects_bad_names(void **state) {
    (void)state;
    buf b = {0};
    put_header(&b, 1);
    put_u32(&b, 3);
    put(&b, "a\0b", 3);
    put_u32(&b, TF_F32);
    put_u32(&b, 0);
    put(&b, "\0\0\0\0", 4);
    expect_error(&b, "name contains a NUL byte");

    b.n = 0;
    put_header(&b, 1);
    put_tensor(&b, "bad\xc3(", TF_F32, 0, NULL);
    expect_error(&b, "name is not valid UTF-8");

    /* valid multi-byte UTF-8 is fine */
    b.n = 0;
    put_header(&b, 1);
    put_tensor(&b, "gewicht.\xc3\xa4\xe2\x82\xac", TF_F32, 0, NULL);
    tf_file *f = tf_read_mem(b.p, b.n, "mem");
    assert_non_null(f);
    assert_non_null(tf_find(f, "gewicht.\xc3\xa4\xe2\x82\xac"));
    tf_free(f);
    free(b.p);
}

static void test_read_rejects_bad_dtype_and_ndim(void **state) {
    (void)state;
    buf b = {0};
    put_header(&b, 1);
    put_tensor(&b, "x", 2, 1, (uint64_t[]){1});
    expect_error(&b, "tensor 0 'x' at byte 24: dtype 2 is not supported");

    b.n = 0;
    put_header(&b, 1);
    put_u32(&b, 1);
    put(&b, "x", 1);
    put_u32(&b, TF_F32);
    put_u32(&b, 7);
    for (int i = 0; i < 7; i++) put_u64(&b, 1);
    put(&b, "\0\0\0\0", 4);
    expect_error(&b, "ndim 7 is outside 0..6");
    free(b.p);
}

static void test_read_rejects_huge_shapes(void **state) {
    (void)state;
    buf b = {0};
    put_header(&b, 1);
    put_u32(&b, 1);
    put(&b, "x", 1);
    put_u32(&b, TF_F32);
    put_u32(&b, 1);
    put_u64(&b, UINT64_MAX);
    put(&b, "\0\0\0\0", 4);
    expect_error(&b, "shape[0] = 18446744073709551615 is too large");

    /* each dimension fits, the product does not */
    b.n = 0;
    put_header(&b, 1);
    put_u32(&b, 1);
    put(&b, "x", 1);
    put_u32(&b, TF_F32);
    put_u32(&b, 3);
    put_u64(&b, 1ull << 32);
    put_u64(&b, 1ull << 32);
    put_u64(&b, 4);
    put(&b, "\0\0\0\0", 4);
    expect_error(&b, "shape (4294967296, 4294967296, 4) has too many elements");

    /* a product that fits but needs far more data than the file has: no allocation, clean error */
    b.n = 0;
    put_header(&b, 1);
    put_u32(&b, 1);
    put(&b, "x", 1);
    put_u32(&b, TF_F32);
    put_u32(&b, 2);
    put_u64(&b, 1ull << 30);
    put_u64(&b, 1ull << 30);
    put(&b, "\0\0\0\0", 4);
    expect_error(&b, "truncated: data needs 4611686018427387904 bytes but only 4 remain");
    free(b.p);
}

static void test_read_rejects_bad_counts(void **state) {
    (void)state;
    buf b = sample_file();
    b.p[12] = 0xff, b.p[13] = 0xff, b.p[14] = 0xff, b.p[15] = 0x7f;
    expect_error(&b, "header says 2147483647 tensors");
    b.p[12] = 4, b.p[13] = 0, b.p[14] = 0, b.p[15] = 0;
    expect_error(&b, "tensor 3 at byte"); /* reads past the last real record */
    b.p[12] = 2;
    expect_error(&b, "mem: 17 trailing bytes after the last tensor (tensor count 2)");
    free(b.p);
}

static void test_read_rejects_duplicate_names(void **state) {
    (void)state;
    buf b = {0};
    put_header(&b, 5);
    put_tensor(&b, "b", TF_F32, 0, NULL);
    put_tensor(&b, "a", TF_F32, 0, NULL);
    put_tensor(&b, "c", TF_F32, 0, NULL);
    put_tensor(&b, "a", TF_F32, 1, (uint64_t[]){2});
    put_tensor(&b, "b", TF_F32, 0, NULL);
    expect_error(&b, "mem: tensor 3 'a': duplicate name (tensor 1 has it too)");
    free(b.p);
}

/* Every single-byte change of a valid file either parses or fails cleanly (ASan watches). */
static void test_read_survives_every_byte_flip(void **state) {
    (void)state;
    buf b = sample_file();
    const unsigned char vals[] = {0x00, 0x01, 0x07, 0x80, 0xff};
    int failed = 0;
    for (size_t i = 0; i < b.n; i++) {
        unsigned char keep = b.p[i];
        for (size_t v = 0; v < sizeof vals; v++) {
            b.p[i] = vals[v];
            tf_file *f = tf_read_mem(b.p, b.n, "mem");
            if (f) tf_free(f);
            else {
                failed++;
                assert_true(strncmp(ct_last_error(), "mem: ", 5) == 0 && strchr(ct_last_error(), '\n') == NULL);
            }
        }
        b.p[i] = keep;
    }
    assert_true(failed > 0);
    free(b.p);
}

/* ---- writer ---- */

static void test_writer_round_trip(void **state) {
    (void)state;
    const char *path = tmp_path("rt.ctt");
    float w[2 * 3 * 4];
    for (int i = 0; i < 24; i++) w[i] = (float)i * 0.25f - 1.0f;
    int32_t ids[5] = {0, -100, 7, 255, INT32_MIN};
    float scalar = 3.5f;
    float six[2 * 1 * 1 * 1 * 1 * 3] = {1, 2, 3, 4, 5, 6};

    tf_writer *wr = tf_writer_open(path);
    assert_non_null(wr);
    assert_int_equal(tf_writer_add(wr, "layers.0.w", TF_F32, 3, (int64_t[]){2, 3, 4}, w), CT_OK);
    assert_int_equal(tf_writer_add(wr, "input.tokens", TF_I32, 1, (int64_t[]){5}, ids), CT_OK);
    assert_int_equal(tf_writer_add(wr, "expected.loss", TF_F32, 0, NULL, &scalar), CT_OK);
    assert_int_equal(tf_writer_add(wr, "six", TF_F32, 6, (int64_t[]){2, 1, 1, 1, 1, 3}, six), CT_OK);
    assert_int_equal(tf_writer_add(wr, "none", TF_F32, 2, (int64_t[]){0, 9}, NULL), CT_OK);
    assert_string_equal(tf_writer_error(wr), "");
    assert_int_equal(tf_writer_close(wr), CT_OK);
    assert_false(file_exists(tmp_path("rt.ctt.tmp")));

    tf_file *f = tf_read(path);
    if (!f) fail_msg("%s", ct_last_error());
    assert_int_equal(f->count, 5);
    assert_string_equal(f->entries[0].name, "layers.0.w");
    assert_string_equal(f->entries[4].name, "none");
    const tf_entry *e = tf_expect(f, path, "layers.0.w", TF_F32, 3, (int64_t[]){2, 3, 4});
    assert_non_null(e);
    assert_memory_equal(e->data, w, sizeof w);
    e = tf_expect(f, path, "input.tokens", TF_I32, 1, (int64_t[]){5});
    assert_non_null(e);
    assert_memory_equal(e->data, ids, sizeof ids);
    e = tf_expect(f, path, "expected.loss", TF_F32, 0, NULL);
    assert_non_null(e);
    assert_true(*(float *)e->data == 3.5f);
    e = tf_expect(f, path, "six", TF_F32, 6, (int64_t[]){2, 1, 1, 1, 1, 3});
    assert_non_null(e);
    assert_memory_equal(e->data, six, sizeof six);
    assert_int_equal(tf_find(f, "none")->numel, 0);
    tf_free(f);
}

static void test_writer_output_matches_the_spec_bytes(void **state) {
    (void)state;
    const char *path = tmp_path("spec.ctt");
    float wv[6];
    int32_t iv[4];
    for (int i = 0; i < 6; i++) wv[i] = 0.5f * (float)i;
    for (int i = 0; i < 4; i++) iv[i] = i - 3;
    float s = 0.0f;
    tf_writer *w = tf_writer_open(path);
    assert_non_null(w);
    assert_int_equal(tf_writer_add(w, "w", TF_F32, 2, (int64_t[]){2, 3}, wv), CT_OK);
    assert_int_equal(tf_writer_add(w, "ids", TF_I32, 1, (int64_t[]){4}, iv), CT_OK);
    assert_int_equal(tf_writer_add(w, "s", TF_F32, 0, NULL, &s), CT_OK);
    assert_int_equal(tf_writer_close(w), CT_OK);

    buf want = sample_file_v2();
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    unsigned char got[512];
    size_t n = fread(got, 1, sizeof got, fp);
    fclose(fp);
    assert_int_equal(n, want.n);
    assert_memory_equal(got, want.p, want.n);
    free(want.p);
}

/* Version 2 files carry a checksum per record: the sample reads with the same contents as version 1,
 * and a change to any byte of any record is refused with a line naming that record's tensor. */
static void test_v2_checksums_name_the_corrupt_tensor(void **state) {
    (void)state;
    buf b = sample_file_v2(), v1 = sample_file();
    tf_file *f = tf_read_mem(b.p, b.n, "mem"), *g = tf_read_mem(v1.p, v1.n, "mem");
    assert_non_null(f);
    assert_non_null(g);
    assert_int_equal(f->version, 2);
    assert_int_equal(g->version, 1);
    assert_int_equal(f->count, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(f->entries[i].name, g->entries[i].name);
        assert_memory_equal(f->entries[i].data, g->entries[i].data, 4 * (size_t)g->entries[i].numel);
    }
    tf_free(f);
    tf_free(g);
    /* the data bytes of each record: "w" (2,3) f32 at 24 + 29, "ids" (4,) at 77 + 23, "s" at 116 + 13 */
    const struct { size_t at; const char *name; } flips[] = {{24 + 29, "'w'"}, {24 + 29 + 23, "'w'"},
                                                              {77 + 23, "'ids'"}, {116 + 13, "'s'"}};
    for (size_t k = 0; k < sizeof flips / sizeof *flips; k++) {
        b.p[flips[k].at] ^= 0x01;
        expect_error(&b, "checksum mismatch");
        tf_read_mem(b.p, b.n, "mem");
        if (!strstr(ct_last_error(), flips[k].name))
            fail_msg("flip at %zu: \"%s\" does not name %s", flips[k].at, ct_last_error(), flips[k].name);
        b.p[flips[k].at] ^= 0x01;
    }
    b.p[b.n - 1] ^= 0x80; /* the stored checksum itself */
    expect_error(&b, "tensor 2 's' at byte 116: checksum mismatch");
    b.p[b.n - 1] ^= 0x80;
    put(&b, "x", 1); /* one byte too many after the checksums */
    expect_error(&b, "after the last tensor 25 bytes remain; the 3 checksums take 24");
    free(b.p);
    free(v1.p);
}

/* NaN and Inf weights are found and named (the first one in file order). */
static void test_check_finite_names_the_tensor(void **state) {
    (void)state;
    buf b = sample_file_v2();
    tf_file *f = tf_read_mem(b.p, b.n, "mem");
    assert_non_null(f);
    assert_int_equal(tf_check_finite(f, "model.ctt"), CT_OK);
    ((float *)f->entries[2].data)[0] = INFINITY;
    assert_int_equal(tf_check_finite(f, "model.ctt"), CT_ERR_INVALID);
    assert_string_equal(ct_last_error(),
                        "model.ctt: tensor 's' holds Inf at element 0 of 1: refusing non-finite weights");
    ((float *)f->entries[0].data)[4] = NAN;
    assert_int_equal(tf_check_finite(f, "model.ctt"), CT_ERR_INVALID);
    assert_string_equal(ct_last_error(),
                        "model.ctt: tensor 'w' holds NaN at element 4 of 6: refusing non-finite weights");
    ((int32_t *)f->entries[1].data)[0] = -1; /* int32 data is never a float: 0xffffffff is a fine id */
    ((float *)f->entries[0].data)[4] = 1.0f;
    ((float *)f->entries[2].data)[0] = 0.0f;
    assert_int_equal(tf_check_finite(f, "model.ctt"), CT_OK);
    tf_free(f);
    free(b.p);
}

static void test_writer_is_atomic(void **state) {
    (void)state;
    const char *path = tmp_path("atomic.ctt"), *tmp = tmp_path("atomic.ctt.tmp");
    write_bytes(path, "old contents", 12);
    float x = 1.0f;

    /* while the writer is open, path still holds the old file */
    tf_writer *w = tf_writer_open(path);
    assert_non_null(w);
    assert_int_equal(tf_writer_add(w, "x", TF_F32, 0, NULL, &x), CT_OK);
    assert_true(file_exists(tmp));
    assert_null(tf_read(path));
    assert_non_null(strstr(ct_last_error(), "shorter than the 24-byte header"));

    /* aborting leaves the old file and no temporary */
    tf_writer_abort(w);
    assert_false(file_exists(tmp));
    assert_null(tf_read(path));

    /* closing replaces it */
    w = tf_writer_open(path);
    assert_int_equal(tf_writer_add(w, "x", TF_F32, 0, NULL, &x), CT_OK);
    assert_int_equal(tf_writer_close(w), CT_OK);
    tf_file *f = tf_read(path);
    assert_non_null(f);
    assert_int_equal(f->count, 1);
    tf_free(f);
    tf_writer_abort(NULL);
}

/* A bad add is refused, the error sticks, and close removes the temporary and keeps the old file. */
static void check_bad_add(const char *name, int dtype, int ndim, const int64_t *shape, const void *data,
                          const char *want) {
    const char *path = tmp_path("bad.ctt"), *tmp = tmp_path("bad.ctt.tmp");
    remove(path);
    float x[4] = {0};
    tf_writer *w = tf_writer_open(path);
    assert_non_null(w);
    assert_int_equal(tf_writer_add(w, "ok", TF_F32, 1, (int64_t[]){4}, x), CT_OK);
    assert_int_equal(tf_writer_add(w, name, dtype, ndim, shape, data), CT_ERR_INVALID);
    if (!strstr(tf_writer_error(w), want))
        fail_msg("expected \"%s\" in \"%s\"", want, tf_writer_error(w));
    assert_string_equal(ct_last_error(), tf_writer_error(w)); /* the failed add leaves its line too */
    assert_int_equal(tf_writer_add(w, "later", TF_F32, 1, (int64_t[]){4}, x), CT_ERR_INVALID); /* sticky */
    assert_int_equal(tf_writer_close(w), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), want));
    assert_int_equal(strncmp(ct_last_error(), path, strlen(path)), 0);
    assert_false(file_exists(tmp));
    assert_false(file_exists(path));
}

static void test_writer_refuses_bad_tensors(void **state) {
    (void)state;
    float x[4] = {0};
    char long_name[TF_MAX_NAME + 2];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    check_bad_add("ok", TF_F32, 1, (int64_t[]){4}, x, "tensor 1 'ok': duplicate name (tensor 0 has it too)");
    check_bad_add("", TF_F32, 1, (int64_t[]){4}, x, "name length 0 is outside 1..1024");
    check_bad_add(long_name, TF_F32, 1, (int64_t[]){4}, x, "name length 1025 is outside 1..1024");
    check_bad_add(NULL, TF_F32, 1, (int64_t[]){4}, x, "name length 0");
    check_bad_add("bad\xff", TF_F32, 1, (int64_t[]){4}, x, "not valid UTF-8");
    check_bad_add("t", 2, 1, (int64_t[]){4}, x, "dtype 2 is not supported");
    check_bad_add("t", TF_F32, 7, (int64_t[]){1, 1, 1, 1, 1, 1, 1}, x, "ndim 7 is outside 0..6");
    check_bad_add("t", TF_F32, -1, NULL, x, "ndim -1");
    check_bad_add("t", TF_F32, 1, NULL, x, "shape is NULL");
    check_bad_add("t", TF_F32, 2, (int64_t[]){4, -1}, x, "shape[1] = -1");
    check_bad_add("t", TF_F32, 2, (int64_t[]){INT64_MAX, 2}, x, "too large");
    check_bad_add("t", TF_F32, 1, (int64_t[]){4}, NULL, "data is NULL");
}

static void test_writer_open_fails_cleanly(void **state) {
    (void)state;
    assert_null(tf_writer_open(tmp_path("no/such/dir/x.ctt")));
    assert_non_null(strstr(ct_last_error(), "cannot create"));
    assert_int_equal(tf_writer_close(NULL), CT_ERR_INVALID);
}

/* ---- the committed PyTorch golden file (tests/golden/llama3_tiny.ctt) ---- */

#define GOLDEN "tests/golden/llama3_tiny.ctt"

static int32_t golden_int(const tf_file *f, const char *name) {
    const tf_entry *e = tf_expect(f, GOLDEN, name, TF_I32, 0, NULL);
    if (!e) fail_msg("%s", ct_last_error());
    return *(const int32_t *)e->data;
}

static void expect_shape(const tf_file *f, const char *name, int ndim, int64_t d0, int64_t d1) {
    if (!tf_expect(f, GOLDEN, name, TF_F32, ndim, (int64_t[]){d0, d1})) fail_msg("%s", ct_last_error());
}

/* The file parses with this reader and holds every name of the contract with the C model pack. */
static void test_golden_file_has_the_contract_names(void **state) {
    (void)state;
    tf_file *f = tf_read(GOLDEN);
    if (!f) fail_msg("%s (run the tests from the repository root)", ct_last_error());
    const int64_t D = golden_int(f, "config.dim"), V = golden_int(f, "config.vocab");
    const int64_t H = golden_int(f, "config.n_heads"), KVH = golden_int(f, "config.n_kv_heads");
    const int64_t HD = golden_int(f, "config.head_dim"), FF = golden_int(f, "config.ffn_hidden");
    const int64_t B = golden_int(f, "config.batch"), T = golden_int(f, "config.seq_len");
    const int L = golden_int(f, "config.n_layers");
    assert_true(D == 64 && V == 256 && H == 4 && KVH == 2 && HD == 16 && FF == 192 && B == 2 && T == 32 && L == 2);

    static const char *prefixes[] = {"", "grad.", "adamw.final."};
    for (size_t p = 0; p < 3; p++) {
        char n[160];
#define SHAPE(nd, a, b, ...) (snprintf(n, sizeof n, __VA_ARGS__), expect_shape(f, n, nd, a, b))
        SHAPE(2, V, D, "%stok_embeddings.weight", prefixes[p]);
        for (int i = 0; i < L; i++) {
            SHAPE(1, D, 0, "%slayers.%d.attention_norm.weight", prefixes[p], i);
            SHAPE(2, H * HD, D, "%slayers.%d.attention.wq.weight", prefixes[p], i);
            SHAPE(2, KVH * HD, D, "%slayers.%d.attention.wk.weight", prefixes[p], i);
            SHAPE(2, KVH * HD, D, "%slayers.%d.attention.wv.weight", prefixes[p], i);
            SHAPE(2, D, H * HD, "%slayers.%d.attention.wo.weight", prefixes[p], i);
            SHAPE(1, D, 0, "%slayers.%d.ffn_norm.weight", prefixes[p], i);
            SHAPE(2, FF, D, "%slayers.%d.feed_forward.w1.weight", prefixes[p], i);
            SHAPE(2, D, FF, "%slayers.%d.feed_forward.w2.weight", prefixes[p], i);
            SHAPE(2, FF, D, "%slayers.%d.feed_forward.w3.weight", prefixes[p], i);
        }
        SHAPE(1, D, 0, "%snorm.weight", prefixes[p]);
        SHAPE(2, V, D, "%soutput.weight", prefixes[p]);
#undef SHAPE
    }
    int steps = golden_int(f, "adamw.steps");
    expect_shape(f, "adamw.losses", 1, steps, 0);
    expect_shape(f, "adamw.grad_norms", 1, steps, 0);
    expect_shape(f, "expected.loss", 0, 0, 0);
    assert_non_null(tf_expect(f, GOLDEN, "expected.logits", TF_F32, 3, (int64_t[]){B, T, V}));
    assert_non_null(tf_expect(f, GOLDEN, "input.tokens", TF_I32, 2, (int64_t[]){B, T}));
    assert_non_null(tf_expect(f, GOLDEN, "input.targets", TF_I32, 2, (int64_t[]){B, T}));
    tf_free(f);
}

/* The golden loss is the mean cross entropy of its logits over the targets that are not -100,
 * recomputed here in double without PyTorch. */
static void test_golden_loss_matches_its_logits(void **state) {
    (void)state;
    tf_file *f = tf_read(GOLDEN);
    if (!f) fail_msg("%s", ct_last_error());
    const tf_entry *lg = tf_find(f, "expected.logits"), *tg = tf_find(f, "input.targets");
    const tf_entry *tk = tf_find(f, "input.tokens"), *ls = tf_find(f, "expected.loss");
    const tf_entry *al = tf_find(f, "adamw.losses");
    assert_true(lg && tg && tk && ls && al);
    const int64_t V = lg->shape[2], rows = lg->shape[0] * lg->shape[1];
    const float *logits = lg->data;
    const int32_t *targets = tg->data, *tokens = tk->data;
    double sum = 0;
    int valid = 0, ignored = 0;
    for (int64_t r = 0; r < rows; r++) {
        assert_true(tokens[r] >= 0 && tokens[r] < V);
        if (targets[r] == -100) { ignored++; continue; }
        assert_true(targets[r] >= 0 && targets[r] < V);
        const float *x = logits + r * V; /* x is (V,) */
        double m = x[0], z = 0;
        for (int64_t v = 1; v < V; v++) m = x[v] > m ? x[v] : m;
        for (int64_t v = 0; v < V; v++) z += exp((double)x[v] - m);
        sum += m + log(z) - x[targets[r]];
        valid++;
    }
    assert_int_equal(ignored, 5);
    const double loss = sum / valid, want = *(const float *)ls->data;
    if (fabs(loss - want) > 1e-5 * fabs(want)) fail_msg("loss from logits %.9f, golden %.9f", loss, want);
    /* the first AdamW step starts from the same weights */
    assert_true(((const float *)al->data)[0] == *(const float *)ls->data);
    const float *losses = al->data;
    assert_true(losses[al->numel - 1] < losses[0]);
    tf_free(f);
}

/* Text entries (a model's description): bytes in order in the file, NUL padding, read back exactly;
 * an entry that is not text is refused naming it, an absent one is NULL with no error. */
static void test_text_entries_round_trip_and_are_checked(void **state) {
    (void)state;
    const char *path = tmp_path("text.ctt");
    const char *texts[] = {"{\"name\": \"llama3\", \"flavor\": \"d\u00e9bug\"}", "12345678", ""};
    const char *names[] = {"ctitan.description", "eight", "empty"};
    tf_writer *wr = tf_writer_open(path);
    assert_non_null(wr);
    for (int i = 0; i < 3; i++) assert_int_equal(tf_writer_add_text(wr, names[i], texts[i]), CT_OK);
    assert_int_equal(tf_writer_close(wr), CT_OK);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    char raw[512];
    size_t n = fread(raw, 1, sizeof raw, fp);
    fclose(fp);
    assert_non_null(memmem(raw, n, texts[0], strlen(texts[0]))); /* the bytes in order, readable */
    tf_file *f = tf_read(path);
    if (!f) fail_msg("%s", ct_last_error());
    int64_t words[] = {((int64_t)strlen(texts[0]) + 3) / 4, 2, 0};
    for (int i = 0; i < 3; i++) {
        const tf_entry *e = tf_find(f, names[i]);
        assert_non_null(e);
        assert_int_equal(e->dtype, TF_I32);
        assert_int_equal(e->shape[0], words[i]);
        char *t;
        if (tf_text(f, path, names[i], &t) != CT_OK) fail_msg("%s", ct_last_error());
        assert_non_null(t);
        assert_string_equal(t, texts[i]);
        free(t);
    }
    char *absent = (char *)"x";
    assert_int_equal(tf_text(f, path, "absent", &absent), CT_OK);
    assert_null(absent);
    tf_free(f);

    /* entries that are not text */
    float x = 1;
    int32_t nul_inside[2] = {0x00636261, 0x64}; /* "abc", NUL, "d" */
    int32_t bad_utf8[1] = {0x28c3};           /* "\xc3(" */
    int32_t too_much_padding[2] = {0x61, 0};    /* "a" and a whole element of NULs */
    tf_entry es[] = {{"f", TF_F32, 0, {0}, 1, &x},
                     {"nul", TF_I32, 1, {2}, 2, nul_inside},
                     {"utf8", TF_I32, 1, {1}, 1, bad_utf8},
                     {"pad", TF_I32, 1, {2}, 2, too_much_padding}};
    tf_file mem = {es, 4, 2};
    const char *want[] = {"mem: tensor 'f': expected text (int32, one dimension)", "mem: tensor 'nul': a NUL inside the text",
                          "mem: tensor 'utf8': not valid UTF-8", "mem: tensor 'pad': a NUL inside the text"};
    for (int i = 0; i < 4; i++) {
        char *t = (char *)"x";
        assert_int_equal(tf_text(&mem, "mem", es[i].name, &t), CT_ERR_INVALID);
        assert_null(t);
        assert_string_equal(ct_last_error(), want[i]);
    }
}

/* tf_read_first: the first record alone, checked like the whole file; none when it is larger than
 * the cap or the file is empty; a corrupt first record is an error naming it. */
static void test_read_first_reads_one_record(void **state) {
    (void)state;
    const char *path = tmp_path("first.ctt");
    static float big[4096];
    tf_writer *wr = tf_writer_open(path);
    assert_non_null(wr);
    assert_int_equal(tf_writer_add_text(wr, "ctitan.description", "{\"a\": 1}"), CT_OK);
    assert_int_equal(tf_writer_add(wr, "w", TF_F32, 1, (int64_t[]){4096}, big), CT_OK);
    assert_int_equal(tf_writer_close(wr), CT_OK);
    tf_file *f = tf_read_first(path, 1024);
    if (!f) fail_msg("%s", ct_last_error());
    assert_int_equal(f->count, 1);
    assert_int_equal(f->version, 2);
    char *t;
    assert_int_equal(tf_text(f, path, "ctitan.description", &t), CT_OK);
    assert_non_null(t);
    assert_string_equal(t, "{\"a\": 1}");
    free(t);
    tf_free(f);
    f = tf_read_first(path, 16); /* the record is 4 + 18 + 8 + 8 + 8 bytes */
    assert_non_null(f);
    assert_int_equal(f->count, 0);
    tf_free(f);
    /* a flipped byte in the first record: its checksum names it */
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 24 + 4 + 18 + 8 + 8, SEEK_SET), 0);
    fputc('b', fp);
    fclose(fp);
    assert_null(tf_read_first(path, 1024));
    if (!strstr(ct_last_error(), "tensor 0 'ctitan.description' at byte 24: checksum mismatch"))
        fail_msg("%s", ct_last_error());
    /* an empty file (no tensors), and not a ctt file */
    wr = tf_writer_open(path);
    assert_int_equal(tf_writer_close(wr), CT_OK);
    f = tf_read_first(path, 1024);
    assert_non_null(f);
    assert_int_equal(f->count, 0);
    tf_free(f);
    fp = fopen(path, "wb");
    fputs("not a tensor file at all", fp);
    fclose(fp);
    assert_null(tf_read_first(path, 1024));
    assert_non_null(strstr(ct_last_error(), "first.ctt"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_first_reads_one_record),
        cmocka_unit_test(test_text_entries_round_trip_and_are_checked),
        cmocka_unit_test(test_read_sample_gives_names_shapes_and_values),
        cmocka_unit_test(test_expect_checks_dtype_and_shape),
        cmocka_unit_test(test_read_accepts_empty_file_and_zero_sized_tensor),
        cmocka_unit_test(test_read_rejects_bad_magic_version_and_reserved),
        cmocka_unit_test(test_v2_checksums_name_the_corrupt_tensor),
        cmocka_unit_test(test_check_finite_names_the_tensor),
        cmocka_unit_test(test_read_rejects_truncation_at_every_length),
        cmocka_unit_test(test_read_rejects_truncated_files_on_disk),
        cmocka_unit_test(test_read_rejects_bad_name_lengths),
        cmocka_unit_test(test_read_rejects_bad_names),
        cmocka_unit_test(test_read_rejects_bad_dtype_and_ndim),
        cmocka_unit_test(test_read_rejects_huge_shapes),
        cmocka_unit_test(test_read_rejects_bad_counts),
        cmocka_unit_test(test_read_rejects_duplicate_names),
        cmocka_unit_test(test_read_survives_every_byte_flip),
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_writer_output_matches_the_spec_bytes),
        cmocka_unit_test(test_writer_is_atomic),
        cmocka_unit_test(test_writer_refuses_bad_tensors),
        cmocka_unit_test(test_writer_open_fails_cleanly),
        cmocka_unit_test(test_golden_file_has_the_contract_names),
        cmocka_unit_test(test_golden_loss_matches_its_logits),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
