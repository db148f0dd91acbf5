/* test_shard.c: token shards round-trip, have the documented header (version 2: the tokens' CRC-32),
 * version 1 files are still read, and every malformed or corrupt file is refused with a message that
 * names the file and the fault. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/shard.h"


static int setup(void **state) {
    (void)state;
    return tmpdir_make("shard");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove();
    return 0;
}

static void path_of(char *out, const char *name) { snprintf(out, 256, "%s/%s", dir, name); }

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static size_t read_bytes(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static uint32_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void roundtrip(uint64_t n) {
    char p[256];
    path_of(p, "rt.bin");
    uint32_t *t = malloc((n + 1) * sizeof *t);
    for (uint64_t i = 0; i < n; i++) t[i] = i % 7 == 0 ? UINT32_MAX - (uint32_t)i : rnd();
    assert_int_equal(shard_write(p, t, n), CT_OK);
    uint32_t *back = NULL;
    uint64_t m = 99;
    assert_int_equal(shard_read(p, &back, &m), CT_OK);
    assert_int_equal(m, n);
    if (n) assert_memory_equal(back, t, n * sizeof *t);
    else assert_null(back);
    uint64_t c = 0;
    assert_int_equal(shard_count(p, &c), CT_OK);
    assert_int_equal(c, n);
    shard_info info;
    assert_int_equal(shard_verify(p, &info), CT_OK);
    assert_int_equal(info.version, 2);
    assert_int_equal(info.count, n);
    shard_free(back);
    free(t);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    assert_false(exists(tmp));
}

static void test_roundtrip_sizes(void **state) {
    (void)state;
    roundtrip(0);
    roundtrip(1);
    roundtrip(65535);
    roundtrip(65536);   /* exactly the writer's buffer */
    roundtrip(200003);
}

static void test_header_is_the_documented_layout(void **state) {
    (void)state;
    char p[256];
    path_of(p, "hdr.bin");
    uint32_t t[3] = {1, 0x01020304, 0xfffffffe};
    assert_int_equal(shard_write(p, t, 3), CT_OK);
    unsigned char b[64];
    size_t n = read_bytes(p, b, sizeof b);
    assert_int_equal(n, 32 + 12);
    /* version 2; the checksum is zlib.crc32(b"\x01\0\0\0\x04\x03\x02\x01\xfe\xff\xff\xff") = 0x437d515a */
    static const unsigned char want[44] = {
        'C', 'T', 'T', 'O', 'K', 'E', 'N', 'S', 2, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
        0x5a, 0x51, 0x7d, 0x43, 0, 0, 0, 0, 1, 0, 0, 0, 4, 3, 2, 1, 0xfe, 0xff, 0xff, 0xff};
    assert_memory_equal(b, want, sizeof want);
    shard_info info;
    assert_int_equal(shard_verify(p, &info), CT_OK);
    assert_int_equal(info.checksum, 0x437d515au);

    /* An empty shard's checksum is the CRC-32 of no bytes: 0. */
    assert_int_equal(shard_write(p, t, 0), CT_OK);
    assert_int_equal(read_bytes(p, b, sizeof b), 32);
    assert_int_equal(b[8], 2);
    for (int i = 24; i < 32; i++) assert_int_equal(b[i], 0);
}

/* A valid 2-token version-1 shard image (no checksum) to corrupt. */
static void good_image(unsigned char *b) {
    memset(b, 0, 40);
    memcpy(b, "CTTOKENS", 8);
    b[8] = 1;
    b[12] = 4;
    b[16] = 2;
    b[32] = 7;
    b[36] = 9;
}

/* The same tokens as version 2: the CRC-32 of 07 00 00 00 09 00 00 00 is 0x12ef99fa. */
static void good_image_v2(unsigned char *b) {
    good_image(b);
    b[8] = 2;
    b[24] = 0xfa;
    b[25] = 0x99;
    b[26] = 0xef;
    b[27] = 0x12;
}

static void expect_error(const unsigned char *img, size_t n, const char *what) {
    char p[256];
    path_of(p, "bad.bin");
    write_bytes(p, img, n);
    uint32_t *t = (uint32_t *)1;
    uint64_t m = 77;
    assert_int_equal(shard_read(p, &t, &m), CT_ERR_INVALID);
    assert_null(t);
    assert_int_equal(m, 0);
    if (!strstr(ct_last_error(), p) || !strstr(ct_last_error(), what))
        fail_msg("message '%s' should name %s and say '%s'", ct_last_error(), p, what);
    assert_int_equal(shard_verify(p, NULL), CT_ERR_INVALID);
    if (!strstr(ct_last_error(), p) || !strstr(ct_last_error(), what))
        fail_msg("shard_verify: '%s' should say '%s'", ct_last_error(), what);
}

/* A fault only the checksum sees: the header is consistent, so shard_count still succeeds. */
static void expect_checksum_error(const unsigned char *img, size_t n, const char *what) {
    expect_error(img, n, what);
    char p[256];
    path_of(p, "bad.bin");
    uint64_t c;
    assert_int_equal(shard_count(p, &c), CT_OK);
}

/* A fault in the header or size: shard_count refuses it too. */
static void expect_header_error(const unsigned char *img, size_t n, const char *what) {
    expect_error(img, n, what);
    char p[256];
    path_of(p, "bad.bin");
    uint64_t c;
    assert_int_equal(shard_count(p, &c), CT_ERR_INVALID);
    if (!strstr(ct_last_error(), what)) fail_msg("shard_count: '%s' should say '%s'", ct_last_error(), what);
}

static void test_malformed_files_are_refused(void **state) {
    (void)state;
    unsigned char b[64];
    good_image(b);
    char p[256];
    path_of(p, "ok.bin");
    write_bytes(p, b, 40);
    uint32_t *t;
    uint64_t m;
    assert_int_equal(shard_read(p, &t, &m), CT_OK);   /* the image itself is valid */
    assert_int_equal(m, 2);
    assert_int_equal(t[0], 7);
    assert_int_equal(t[1], 9);
    shard_free(t);

    expect_header_error(b, 0, "too short");
    expect_header_error(b, 31, "too short");
    good_image(b); b[0] = 'X';  expect_header_error(b, 40, "bad magic");
    good_image(b); b[8] = 5;    expect_header_error(b, 40, "version 5, this build reads versions 1, 2, 3 and 4");
    good_image(b); b[8] = 0;    expect_header_error(b, 40, "version 0, this build reads versions 1, 2, 3 and 4");
    good_image(b); b[12] = 2;   expect_header_error(b, 40, "2 bytes per token");
    good_image(b); b[30] = 1;   expect_header_error(b, 40, "version 1's reserved header field");
    good_image(b); b[24] = 1;   expect_header_error(b, 40, "version 1's reserved header field");
    good_image(b);              expect_header_error(b, 39, "truncated");
    good_image(b);              expect_header_error(b, 36, "truncated");
    good_image(b); b[16] = 1;   expect_header_error(b, 40, "trailing bytes");
    good_image(b); memset(b + 16, 0xff, 8); expect_header_error(b, 40, "header says 18446744073709551615 tokens");
    good_image(b); b[23] = 0x40; expect_header_error(b, 40, "tokens");   /* 4 * count overflows 64 bits */

    /* Version 2: a flipped bit anywhere in the tokens, or a wrong checksum, is a checksum mismatch. */
    good_image_v2(b);
    write_bytes(p, b, 40);
    assert_int_equal(shard_read(p, &t, &m), CT_OK);
    assert_int_equal(m, 2);
    assert_int_equal(t[1], 9);
    shard_free(t);
    for (int i = 32; i < 40; i++) {
        good_image_v2(b);
        b[i] ^= (unsigned char)(1u << (i % 8));
        expect_checksum_error(b, 40, "checksum mismatch: the header says 0x12ef99fa, the tokens give 0x");
    }
    good_image_v2(b); b[24] ^= 1; expect_checksum_error(b, 40, "checksum mismatch: the header says 0x12ef99fb");
    good_image_v2(b); b[24] ^= 1; expect_checksum_error(b, 40, "the tokens give 0x12ef99fa; the file is corrupt");
    good_image_v2(b); b[28] = 1;  expect_header_error(b, 40, "its high 32 bits should be 0");
    good_image_v2(b); b[16] = 0;  expect_checksum_error(b, 32, "the header says 0x12ef99fa, the tokens give 0x00000000");

    char missing[256];
    path_of(missing, "nope.bin");
    assert_int_equal(shard_read(missing, &t, &m), CT_ERR_IO);
    assert_non_null(strstr(ct_last_error(), missing));
    assert_int_equal(shard_read(dir, &t, &m), CT_ERR_INVALID);   /* a directory */
    assert_int_equal(shard_read(p, &t, &m), CT_OK);
    shard_free(t);
}

/* Version 1 files (before the checksum) read as before; shard_verify reports their CRC-32. */
static void test_version_1_is_still_read(void **state) {
    (void)state;
    unsigned char b[64];
    good_image(b);
    char p[256];
    path_of(p, "v1.bin");
    write_bytes(p, b, 40);
    uint32_t *t;
    uint64_t m;
    assert_int_equal(shard_read(p, &t, &m), CT_OK);
    assert_int_equal(m, 2);
    assert_int_equal(t[0], 7);
    assert_int_equal(t[1], 9);
    shard_info info;
    assert_int_equal(shard_verify(p, &info), CT_OK);
    assert_int_equal(info.version, 1);
    assert_int_equal(info.count, 2);
    assert_int_equal(info.checksum, 0x12ef99fau);
    /* Written again, the same tokens make the version-2 image. */
    assert_int_equal(shard_write(p, t, m), CT_OK);
    shard_free(t);
    unsigned char back[64], v2[64];
    good_image_v2(v2);
    assert_int_equal(read_bytes(p, back, sizeof back), 40);
    assert_memory_equal(back, v2, 40);
}

static void test_streaming_writer_is_atomic(void **state) {
    (void)state;
    char p[256], tmp[300];
    path_of(p, "stream.bin");
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    uint32_t old[2] = {5, 6};
    assert_int_equal(shard_write(p, old, 2), CT_OK);

    shard_writer *w = shard_writer_open(p);
    assert_non_null(w);
    uint32_t all[1000];
    for (uint32_t i = 0; i < 1000; i++) all[i] = i * 2654435761u;
    for (size_t i = 0; i < 1000; i += 333) {
        size_t k = 1000 - i < 333 ? 1000 - i : 333;
        assert_int_equal(shard_writer_append(w, all + i, k), CT_OK);
    }
    assert_int_equal(shard_writer_count(w), 1000);
    /* Until close, readers still see the old shard. */
    uint32_t *t;
    uint64_t m;
    assert_int_equal(shard_read(p, &t, &m), CT_OK);
    assert_int_equal(m, 2);
    shard_free(t);
    assert_true(exists(tmp));
    assert_int_equal(shard_writer_close(w), CT_OK);
    assert_false(exists(tmp));
    assert_int_equal(shard_read(p, &t, &m), CT_OK);
    assert_int_equal(m, 1000);
    assert_memory_equal(t, all, sizeof all);
    shard_free(t);

    /* An aborted writer leaves the old file and no temporary. */
    w = shard_writer_open(p);
    assert_non_null(w);
    assert_int_equal(shard_writer_append(w, old, 2), CT_OK);
    shard_writer_abort(w);
    assert_false(exists(tmp));
    assert_int_equal(shard_count(p, &m), CT_OK);
    assert_int_equal(m, 1000);

    /* A folder that does not exist is made; one that cannot be (a file is in the way): an error
     * naming the temporary file. */
    char made[300], bad[600];
    snprintf(made, sizeof made, "%s/new/sub/dir.bin", dir);
    assert_int_equal(shard_write(made, old, 2), CT_OK);
    assert_int_equal(shard_count(made, &m), CT_OK);
    assert_int_equal(m, 2);
    snprintf(bad, sizeof bad, "%s/x/dir.bin", p);
    assert_null(shard_writer_open(bad));
    assert_non_null(strstr(ct_last_error(), "stream.bin/x/dir.bin.tmp: cannot create its folder"));
    assert_int_equal(shard_write(bad, old, 2), CT_ERR_IO);
    unlink(made);
    snprintf(made, sizeof made, "%s/new/sub", dir);
    rmdir(made);
    snprintf(made, sizeof made, "%s/new", dir);
    rmdir(made);
}

/* Version 3 keeps the SHARD_MASKED flags it was written with; a reader learns the version from
 * shard_read_info, and one whose every target is masked is refused by shard_read and shard_verify. */
static void test_masked_version_3(void **state) {
    (void)state;
    char p[256];
    path_of(p, "masked.bin");
    uint32_t words[5] = {7 | SHARD_MASKED, 9 | SHARD_MASKED, 11, 2 | SHARD_MASKED, 5};
    shard_writer *w = shard_writer_open_masked(p);
    assert_non_null(w);
    assert_int_equal(shard_writer_append(w, words, 5), CT_OK);
    assert_int_equal(shard_writer_close(w), CT_OK);
    unsigned char b[64];
    assert_int_equal(read_bytes(p, b, sizeof b), 32 + 20);
    assert_int_equal(b[8], 3);
    assert_int_equal(b[32 + 3], 0x80);   /* the flag is bit 31 of the little-endian word */
    uint32_t *t;
    uint64_t m;
    shard_info info;
    assert_int_equal(shard_read_info(p, &t, &m, &info), CT_OK);
    assert_int_equal(info.version, SHARD_VERSION_MASKED);
    assert_int_equal(m, 5);
    assert_memory_equal(t, words, sizeof words);
    shard_free(t);
    assert_int_equal(shard_verify(p, &info), CT_OK);
    assert_int_equal(info.version, 3);
    /* only the first word unmasked: no target counts */
    uint32_t none[3] = {1, 2 | SHARD_MASKED, 3 | SHARD_MASKED};
    path_of(p, "all_masked.bin");
    w = shard_writer_open_masked(p);
    assert_int_equal(shard_writer_append(w, none, 3), CT_OK);
    assert_int_equal(shard_writer_close(w), CT_OK);
    assert_int_equal(shard_read(p, &t, &m), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "all_masked.bin: a masked (version 3) shard of 3 tokens whose every "
                           "target is masked"));
    assert_int_equal(shard_verify(p, NULL), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "every target is masked"));
    /* the same words in a version 2 shard are plain words (ids out of any vocabulary) */
    assert_int_equal(shard_write(p, none, 3), CT_OK);
    assert_int_equal(shard_read_info(p, &t, &m, &info), CT_OK);
    assert_int_equal(info.version, 2);
    assert_int_equal(t[1], 2 | SHARD_MASKED);
    shard_free(t);
}

/* Version 4 keeps SHARD_DOC_START beside SHARD_MASKED; shard_verify counts the documents started. */
static void test_doc_starts_version_4(void **state) {
    (void)state;
    char p[256];
    path_of(p, "docs.bin");
    uint32_t words[6] = {7 | SHARD_MASKED | SHARD_DOC_START, 9, 2 | SHARD_MASKED, 8 | SHARD_MASKED | SHARD_DOC_START,
                         5, 2 | SHARD_MASKED};
    shard_writer *w = shard_writer_open_docs(p);
    assert_non_null(w);
    assert_int_equal(shard_writer_append(w, words, 6), CT_OK);
    assert_int_equal(shard_writer_close(w), CT_OK);
    unsigned char b[64];
    assert_int_equal(read_bytes(p, b, sizeof b), 32 + 24);
    assert_int_equal(b[8], 4);
    assert_int_equal(b[32 + 3], 0xc0); /* bits 31 and 30 of the little-endian word */
    uint32_t *t;
    uint64_t m;
    shard_info info;
    assert_int_equal(shard_read_info(p, &t, &m, &info), CT_OK);
    assert_int_equal(info.version, SHARD_VERSION_DOCS);
    assert_memory_equal(t, words, sizeof words);
    shard_free(t);
    assert_int_equal(shard_verify(p, &info), CT_OK);
    assert_int_equal(info.documents, 2);
    /* a version 3 shard counts none, whatever its bit 30 */
    path_of(p, "masked3.bin");
    w = shard_writer_open_masked(p);
    assert_int_equal(shard_writer_append(w, words, 6), CT_OK);
    assert_int_equal(shard_writer_close(w), CT_OK);
    assert_int_equal(shard_verify(p, &info), CT_OK);
    assert_int_equal(info.version, 3);
    assert_int_equal(info.documents, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_sizes),
        cmocka_unit_test(test_header_is_the_documented_layout),
        cmocka_unit_test(test_malformed_files_are_refused),
        cmocka_unit_test(test_version_1_is_still_read),
        cmocka_unit_test(test_streaming_writer_is_atomic),
        cmocka_unit_test(test_masked_version_3),
        cmocka_unit_test(test_doc_starts_version_4),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
