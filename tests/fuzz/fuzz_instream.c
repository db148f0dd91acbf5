/* fuzz_instream.c: `ctitan tokenize`'s decompression front end (core/io/instream.c) on any bytes.
 *
 * Any file is read to its end or refused with one line naming it, always as the input's fault; plain
 * data comes back unchanged. Then the same bytes, gzip-compressed as two members and zstd-compressed as
 * two frames, must come back exactly, and so must the plain bytes read through standard input's code
 * path with a name that says nothing.
 *
 * libFuzzer:  make build/fuzz/fuzz_instream (links build/fuzz/libctitan-core.a, the core built with the
 *             fuzzer's instrumentation); replay: tests/cli/fuzz_replay.sh's build of it.
 * plain:      link with tests/fuzz/replay_main.c instead of -fsanitize=fuzzer (tests/cli/fuzz_replay.sh) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "base/error.h"
#include "io/instream.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_instream: %s failed\n", #c); __builtin_trap(); } } while (0)
#define MAX_OUT (64u << 20)   /* a small input may decompress to a lot: read this much at most */

static char dir[64], path[128];

static void cleanup(void) {
    unlink(path);
    rmdir(dir);
}

static void put(const void *p, size_t n) {
    unlink(path); /* a new file each time: ext4 flushes a file rewritten in place (O_TRUNC) on close */
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* Reads path through instream: 0 with *out (malloc'd, *n bytes), or -1 with the message set. Odd read
 * sizes so buffer edges move around. */
static int read_all(unsigned char **out, size_t *n) {
    *out = NULL;
    *n = 0;
    int bad = 0;
    instream *s = instream_open(path, &bad);
    if (!s) {
        CHECK(bad);
        return -1;
    }
    size_t cap = 1 << 16, len = 0, step = 1;
    unsigned char *b = malloc(cap);
    CHECK(b);
    for (;;) {
        if (len + 65536 > cap) {
            cap *= 2;
            b = realloc(b, cap);
            CHECK(b);
        }
        size_t r;
        ct_status st = instream_read(s, b + len, step, &r);
        step = step * 7 % 65521 + 1;
        if (st != CT_OK) {
            CHECK(instream_bad_input(s));
            instream_close(s);
            free(b);
            return -1;
        }
        if (r == 0 || len > MAX_OUT) break;
        CHECK((size_t)r <= 65536);
        len += r;
    }
    CHECK(instream_offset(s) <= (uint64_t)instream_size(s));
    instream_close(s);
    *out = b;
    *n = len;
    return 0;
}

/* gzip of p[0, n), appended to out at *o. */
static void gzip_member(const uint8_t *p, size_t n, unsigned char *out, size_t *o, size_t cap) {
    z_stream z = {0};
    CHECK(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    z.next_in = (Bytef *)p;
    z.avail_in = (uInt)n;
    z.next_out = out + *o;
    z.avail_out = (uInt)(cap - *o);
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    *o = cap - z.avail_out;
    deflateEnd(&z);
}

static void expect_same(const uint8_t *data, size_t size, const char *what) {
    unsigned char *back;
    size_t n;
    if (read_all(&back, &n)) {
        fprintf(stderr, "fuzz_instream: %s: %s\n", what, ct_last_error());
        CHECK(0);
    }
    CHECK(n == size && (size == 0 || memcmp(back, data, size) == 0));
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        strcpy(dir, "/tmp/ctitan-fuzz-instream-XXXXXX");
        CHECK(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/input", dir);
        atexit(cleanup);
    }
    /* the bytes as a file */
    put(data, size);
    unsigned char *back;
    size_t n;
    if (read_all(&back, &n) == 0) {
        int plain = !(size >= 2 && data[0] == 0x1f && data[1] == 0x8b) &&
                    !(size >= 4 && memcmp(data, "\x28\xb5\x2f\xfd", 4) == 0);
        if (plain) CHECK(n == size && (size == 0 || memcmp(back, data, size) == 0));
        free(back);
    } else {
        CHECK(strstr(ct_last_error(), path) != NULL && strchr(ct_last_error(), '\n') == NULL);
    }
    /* the bytes compressed: two gzip members, then two zstd frames, read back exactly */
    size_t half = size / 2, cap = 2 * size + 256, o = 0;
    unsigned char *z = malloc(cap + ZSTD_compressBound(size) * 2);
    CHECK(z);
    gzip_member(data, half, z, &o, cap);
    gzip_member(data + half, size - half, z, &o, cap);
    put(z, o);
    expect_same(data, size, "two gzip members");
    size_t a = ZSTD_compress(z, ZSTD_compressBound(half), data, half, 1);
    CHECK(!ZSTD_isError(a));
    size_t b = ZSTD_compress(z + a, ZSTD_compressBound(size - half), data + half, size - half, 1);
    CHECK(!ZSTD_isError(b));
    put(z, a + b);
    expect_same(data, size, "two zstd frames");
    free(z);
    return 0;
}
