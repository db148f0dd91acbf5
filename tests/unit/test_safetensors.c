/* test_safetensors.c: the safetensors reader, writer and dtype conversions (core/io/safetensors.c).
 *
 * Conversions are checked against independent references (exhaustively for 16-bit inputs); the
 * reader against one hand-made header per rule it enforces; the writer by reading its output back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- conversions ----------------------------------------------------------------------------- */

static void test_bf16_round_to_nearest_even_known_values(void **state) {
    (void)state;
    assert_int_equal(st_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(st_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(st_f32_to_bf16(u2f(0x3f808000)), 0x3f80); /* tie, 0x3f80 is even: down */
    assert_int_equal(st_f32_to_bf16(u2f(0x3f818000)), 0x3f82); /* tie, 0x3f81 is odd: up */
    assert_int_equal(st_f32_to_bf16(u2f(0x3f808001)), 0x3f81); /* above the tie: up */
    assert_int_equal(st_f32_to_bf16(u2f(0x3f807fff)), 0x3f80); /* below the tie: down */
    assert_int_equal(st_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(st_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(st_f32_to_bf16(u2f(0x7f7fffff)), 0x7f80); /* FLT_MAX rounds to infinity */
    assert_int_equal(st_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(st_f32_to_bf16(u2f(0x00000001)), 0x0000); /* smallest subnormal: to zero */
    uint16_t nan = st_f32_to_bf16(u2f(0x7f800001));            /* a NaN whose payload is in the low bits */
    assert_true(isnan(st_bf16_to_f32(nan)));
    assert_true(nan & 0x40);                                   /* quiet */
    assert_true(st_bf16_to_f32(0x3f80) == 1.0f);
}

/* The nearest of the two bf16 neighbours of f, ties to the even one: an independent reference. */
static uint16_t bf16_reference(uint32_t bits) {
    uint32_t lo = bits & 0xffff0000u, hi = lo + 0x10000u;
    double x = u2f(bits), dlo = fabs(x - (double)u2f(lo));
    if ((hi & 0x7f800000u) == 0x7f800000u && (lo & 0x7fffffffu) == 0x7f7f0000u) {
        /* the upper neighbour is infinity: round as if it were 2^128 */
        double up = ldexp(lo >> 31 ? -1.0 : 1.0, 128), dhi = fabs(up - x);
        return (uint16_t)((dlo < dhi || (dlo == dhi && !((lo >> 16) & 1))) ? lo >> 16 : hi >> 16);
    }
    double dhi = fabs((double)u2f(hi) - x);
    if (dlo < dhi || (dlo == dhi && !((lo >> 16) & 1))) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

static void test_bf16_matches_reference_on_random_and_all_exact_values(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) { /* every bf16 value survives f32 and back */
        float f = st_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        assert_int_equal(st_f32_to_bf16(f), h);
    }
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 1000000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t bits = (uint32_t)s;
        if ((bits & 0x7f800000u) == 0x7f800000u) continue; /* infinities and NaNs: above */
        if (st_f32_to_bf16(u2f(bits)) != bf16_reference(bits))
            fail_msg("f32 0x%08x -> bf16 0x%04x, reference 0x%04x", bits, st_f32_to_bf16(u2f(bits)),
                     bf16_reference(bits));
    }
}

static void test_f16_to_f32_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, exp = h >> 10 & 31, man = h & 1023;
        float got = st_f16_to_f32((uint16_t)h);
        if (exp == 31) {
            if (man) assert_true(isnan(got));
            else assert_true(isinf(got) && (got < 0) == sign);
            continue;
        }
        double want = exp ? ldexp(1024 + man, exp - 25) : ldexp(man, -24);
        if (sign) want = -want;
        if (f2u(got) != f2u((float)want)) fail_msg("f16 0x%04x -> %a, want %a", h, (double)got, want);
    }
}

/* ---- reader rules ------------------------------------------------------------------------------ */

/* u64 length of json | json | data_len bytes of 0x11, in a buffer of exactly that size. */
static unsigned char *make_file(const char *json, size_t data_len, size_t *len) {
    size_t n = strlen(json);
    *len = 8 + n + data_len;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    memset(b + 8 + n, 0x11, data_len);
    return b;
}

/* Reads json + data; wants failure with one line starting "t.st: " and containing want. */
static void expect_bad(const char *json, size_t data_len, const char *want) {
    size_t len;
    unsigned char *b = make_file(json, data_len, &len);
    st_file *f = st_read_mem(b, len, "t.st");
    if (f) fail_msg("accepted: %s", json);
    if (strncmp(ct_last_error(), "t.st: ", 6) || !strstr(ct_last_error(), want) || strchr(ct_last_error(), '\n'))
        fail_msg("for %s\n  got:  %s\n  want: ...%s...", json, ct_last_error(), want);
    free(b);
}

static void test_reader_rejects_each_broken_rule(void **state) {
    (void)state;
    assert_null(st_read_mem("abc", 3, "t.st"));
    assert_non_null(strstr(ct_last_error(), "too short"));
    unsigned char huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x40, '{', '}'};
    assert_null(st_read_mem(huge, 16, "t.st"));
    assert_non_null(strstr(ct_last_error(), "over the limit"));
    unsigned char past[12] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    assert_null(st_read_mem(past, 12, "t.st"));
    assert_non_null(strstr(ct_last_error(), "runs past the end"));

    expect_bad("{\"a\": ", 0, "invalid JSON");
    expect_bad("[1, 2]", 0, "expected a JSON object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "duplicate");
    expect_bad("{\"a\": 3}", 0, "tensor 'a': is an integer, expected an object");
    expect_bad("{\"\": {\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "empty name");
    expect_bad("{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor 'a': unknown dtype 'F31'");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': dtype is missing");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "shape[0] is not a non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
               "shape[0] is not a non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4, "shape is a string");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "9 dimensions");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "end before they begin");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets must be");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, "data_offsets must be");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
               "run past the data section (4 bytes)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
               "needs 24 bytes, its data_offsets hold 20");
    expect_bad("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
               "overflows a 64-bit byte count");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,8]}}", 8,
               "overflows a 64-bit byte count"); /* 2^62 elements of 4 bytes: just over */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1073741824,1073741824],\"data_offsets\":[0,8]}}", 8,
               "needs 4611686018427387904 bytes, its data_offsets hold 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "tensor 'b': data_offsets [4, 12] overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"extra\":1}}", 4,
               "unknown field 'extra'");
    expect_bad("{\"__metadata__\": [1]}", 0, "__metadata__ is an array");
    expect_bad("{\"__metadata__\": {\"format\": 1}}", 0, "__metadata__ 'format' is an integer");
    expect_bad("{\"a\\u0001b\": 1}", 0, "tensor 'a?b'"); /* control bytes are not echoed */
}

static void test_reader_accepts_a_valid_header(void **state) {
    (void)state;
    /* zero-size tensors with huge other dims, a scalar, metadata, padding spaces, data not in name order */
    const char *json = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
                       "\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"empty\":{\"dtype\":\"I64\",\"shape\":[0,9223372036854775807],\"data_offsets\":[8,8]},"
                       "\"a\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[8,10]}}    ";
    size_t len;
    unsigned char *b = make_file(json, 10, &len);
    float one = 1.5f;
    memcpy(b + len - 10, &one, 4);
    b[len - 2] = 0x80, b[len - 1] = 0x3f; /* bf16 1.0 */
    st_file *f = st_read_mem(b, len, "t.st");
    if (!f) fail_msg("%s", ct_last_error());
    assert_int_equal(f->count, 3);
    assert_string_equal(f->tensors[0].name, "a"); /* sorted by name */
    assert_string_equal(f->tensors[2].name, "z");
    assert_string_equal(st_meta(f, "format"), "pt");
    assert_string_equal(st_meta(f, "note"), "x");
    assert_null(st_meta(f, "other"));
    const st_tensor *e = st_find(f, "empty");
    assert_non_null(e);
    assert_int_equal(e->numel, 0);
    assert_null(st_find(f, "nope"));
    float out[2];
    assert_int_equal(st_to_f32(st_find(f, "z"), out, NULL), CT_OK);
    assert_true(out[0] == 1.5f);
    assert_int_equal(st_to_f32(st_find(f, "a"), out, NULL), CT_OK);
    assert_true(out[0] == 1.0f);
    assert_int_equal(st_find(f, "a")->ndim, 0);
    assert_int_equal(st_find(f, "a")->numel, 1);
    assert_int_equal(st_to_f32(e, out, "lbl"), CT_ERR_UNSUPPORTED); /* I64: no float conversion */
    assert_non_null(strstr(ct_last_error(), "lbl: tensor 'empty': dtype I64 cannot be converted"));
    st_free(f);
    free(b);
}

/* ---- writer ------------------------------------------------------------------------------------ */

static char tmpdir[64];

static int make_tmpdir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct-st-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_writer_round_trip_in_name_order_with_aligned_data(void **state) {
    (void)state;
    float w[6] = {1, -2, 3.25f, 1e-3f, 65504, -0.0f};
    float b[3] = {1.0f, u2f(0x3f818000), 3e38f};
    int64_t ids[2] = {7, -9};
    uint16_t half[2] = {0x3c00, 0xc000}; /* 1, -2 in float16 */
    float scalar = 42;
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s2[1] = {2}, s0[2] = {0, 5};
    st_entry e[] = {
        {"w", ST_F32, 2, s23, w, NULL},      {"b", ST_BF16, 1, s3, b, NULL},
        {"ids", ST_I64, 1, s2, NULL, ids},   {"half", ST_F16, 1, s2, NULL, half},
        {"s", ST_F32, 0, NULL, &scalar, NULL}, {"none", ST_F32, 2, s0, w, NULL},
    };
    const char *meta[] = {"format", "pt"};
    char path[128];
    snprintf(path, sizeof path, "%s/m.safetensors", tmpdir);
    assert_int_equal(st_write(path, e, 6, meta, 1), CT_OK);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
    st_file *f = st_read(path);
    if (!f) fail_msg("%s", ct_last_error());
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)((unsigned char *)f->map)[i] << (8 * i);
    assert_int_equal((8 + n) % 8, 0);
    assert_int_equal(f->count, 6);
    for (int i = 1; i < f->count; i++) { /* names sorted, and the data laid out in that order */
        assert_true(strcmp(f->tensors[i - 1].name, f->tensors[i].name) < 0);
        assert_true(f->tensors[i - 1].offset + f->tensors[i - 1].nbytes == f->tensors[i].offset);
    }
    assert_int_equal(f->tensors[0].offset, 0);
    float out[6];
    assert_int_equal(st_to_f32(st_find(f, "w"), out, NULL), CT_OK);
    assert_memory_equal(out, w, sizeof w);
    assert_int_equal(st_find(f, "w")->shape[1], 3);
    assert_int_equal(st_to_f32(st_find(f, "b"), out, NULL), CT_OK);
    assert_true(out[0] == 1.0f && f2u(out[1]) == 0x3f820000u); /* rounded to nearest even */
    assert_int_equal(f2u(out[2]), (uint32_t)st_f32_to_bf16(3e38f) << 16);
    assert_memory_equal(st_find(f, "ids")->data, ids, sizeof ids);
    assert_int_equal(st_to_f32(st_find(f, "half"), out, NULL), CT_OK);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    assert_int_equal(st_find(f, "s")->ndim, 0);
    assert_int_equal(st_find(f, "none")->numel, 0);
    assert_string_equal(st_meta(f, "format"), "pt");
    st_free(f);
}

static void test_writer_refuses_bad_entries_and_leaves_no_file(void **state) {
    (void)state;
    float x[1] = {0};
    int64_t s1[1] = {1}, neg[1] = {-1};
    char path[128];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    st_entry dup[] = {{"a", ST_F32, 1, s1, x, NULL}, {"a", ST_F32, 1, s1, x, NULL}};
    assert_int_equal(st_write(path, dup, 2, NULL, 0), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "tensor 'a': appears twice"));
    st_entry f16[] = {{"a", ST_F16, 1, s1, x, NULL}};
    assert_int_equal(st_write(path, f16, 1, NULL, 0), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "F32 or BF16"));
    st_entry negs[] = {{"a", ST_F32, 1, neg, x, NULL}};
    assert_int_equal(st_write(path, negs, 1, NULL, 0), CT_ERR_INVALID);
    st_entry meta_name[] = {{"__metadata__", ST_F32, 1, s1, x, NULL}};
    assert_int_equal(st_write(path, meta_name, 1, NULL, 0), CT_ERR_INVALID);
    st_entry bad_utf8[] = {{"a\xff", ST_F32, 1, s1, x, NULL}};
    assert_int_equal(st_write(path, bad_utf8, 1, NULL, 0), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "UTF-8"));
    assert_int_not_equal(access(path, F_OK), 0);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", tmpdir);
    assert_int_equal(st_write(path, dup, 1, NULL, 0), CT_ERR_IO);
    assert_non_null(strstr(ct_last_error(), "cannot create"));
}

static void test_read_errors_on_files(void **state) {
    (void)state;
    char path[128];
    assert_null(st_read(tmpdir)); /* a folder */
    assert_non_null(strstr(ct_last_error(), "not a regular file"));
    snprintf(path, sizeof path, "%s/missing.safetensors", tmpdir);
    assert_null(st_read(path));
    assert_non_null(strstr(ct_last_error(), "cannot open"));
    /* a valid file cut short: the header's claims no longer fit */
    float x[256] = {0};
    int64_t s[1] = {256};
    st_entry e[] = {{"x", ST_F32, 1, s, x, NULL}};
    snprintf(path, sizeof path, "%s/cut.safetensors", tmpdir);
    assert_int_equal(st_write(path, e, 1, NULL, 0), CT_OK);
    assert_int_equal(truncate(path, 1000), 0);
    assert_null(st_read(path));
    assert_non_null(strstr(ct_last_error(), "tensor 'x': data_offsets [0, 1024] run past the data section"));
    assert_int_equal(truncate(path, 20), 0);
    assert_null(st_read(path));
    assert_non_null(strstr(ct_last_error(), "runs past the end of the file"));
    assert_int_equal(truncate(path, 5), 0);
    assert_null(st_read(path));
    assert_non_null(strstr(ct_last_error(), "too short"));
}

/* ---- models in one or several files ------------------------------------------------------------ */

static void write_text(const char *dir, const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void write_shard(const char *dir, const char *name, const char *t1, const char *t2, float v) {
    float x[2] = {v, v + 1};
    int64_t s[1] = {2};
    st_entry e[] = {{t1, ST_F32, 1, s, x, NULL}, {t2, ST_F32, 1, s, x, NULL}};
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(st_write(path, e, t2 ? 2 : 1, NULL, 0), CT_OK);
}

static void test_sharded_model_through_the_index(void **state) {
    (void)state;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    mkdir(dir, 0755);
    st_model *m = st_model_open(dir);
    assert_null(m);
    assert_non_null(strstr(ct_last_error(), "no model.safetensors or model.safetensors.index.json"));
    write_shard(dir, "p1.safetensors", "a", "b", 1);
    write_shard(dir, "p2.safetensors", "c", NULL, 10);
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {\"a\": \"p1.safetensors\", "
               "\"b\": \"p1.safetensors\", \"c\": \"p2.safetensors\"}}");
    m = st_model_open(dir);
    if (!m) fail_msg("%s", ct_last_error());
    assert_int_equal(m->n_files, 2);
    assert_int_equal(m->count, 3);
    float out[2];
    assert_int_equal(st_to_f32(st_model_find(m, "c"), out, NULL), CT_OK);
    assert_true(out[0] == 10 && out[1] == 11);
    assert_non_null(strstr(m->where[2], "p2.safetensors"));
    assert_null(st_model_find(m, "d"));
    st_model_free(m);

    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"p2.safetensors\"}}");
    assert_null(st_model_open(dir));
    assert_non_null(strstr(ct_last_error(), "tensor 'a': is mapped to p2.safetensors, which does not hold it"));
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../p1.safetensors\"}}");
    assert_null(st_model_open(dir));
    assert_non_null(strstr(ct_last_error(), "expected a file name in the same folder"));
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {}}");
    assert_null(st_model_open(dir));
    assert_non_null(strstr(ct_last_error(), "non-empty \"weight_map\""));
    write_shard(dir, "p3.safetensors", "a", NULL, 5); /* 'a' in two shards */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"p1.safetensors\", \"c\": \"p3.safetensors\"}}");
    assert_null(st_model_open(dir));
    assert_non_null(strstr(ct_last_error(), "tensor 'a': also in"));
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"missing.safetensors\"}}");
    assert_null(st_model_open(dir));
    assert_non_null(strstr(ct_last_error(), "missing.safetensors: cannot open"));

    /* a single model.safetensors wins over the index, as in transformers */
    write_shard(dir, "model.safetensors", "only", NULL, 3);
    m = st_model_open(dir);
    if (!m) fail_msg("%s", ct_last_error());
    assert_int_equal(m->count, 1);
    assert_non_null(st_model_find(m, "only"));
    st_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_round_to_nearest_even_known_values),
        cmocka_unit_test(test_bf16_matches_reference_on_random_and_all_exact_values),
        cmocka_unit_test(test_f16_to_f32_exhaustive),
        cmocka_unit_test(test_reader_rejects_each_broken_rule),
        cmocka_unit_test(test_reader_accepts_a_valid_header),
        cmocka_unit_test(test_writer_round_trip_in_name_order_with_aligned_data),
        cmocka_unit_test(test_writer_refuses_bad_entries_and_leaves_no_file),
        cmocka_unit_test(test_read_errors_on_files),
        cmocka_unit_test(test_sharded_model_through_the_index),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
