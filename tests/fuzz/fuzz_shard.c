/* fuzz_shard.c: any bytes, as a token shard file, are read back exactly or refused with a message.
 *
 * A shard that reads must have been 32 + 4 * count bytes with the documented header; shard_verify
 * agrees with shard_read, and shard_count with both except on a checksum mismatch or a version 3 shard
 * with no unmasked target (it reads only the header). Writing the tokens again reproduces a version-2
 * or version-3 (masked) file byte for byte, and a version-1 file with the version and the tokens'
 * CRC-32 put in; a version-3 file that reads has an unmasked token after its first.
 *
 * libFuzzer:  make build/fuzz/fuzz_shard (links build/fuzz/libctitan-core.a, the core built with the
 *             fuzzer's instrumentation); replay: tests/cli/fuzz_replay.sh's build of it.
 * plain:      link with tests/fuzz/replay_main.c instead of -fsanitize=fuzzer (tests/cli/fuzz_replay.sh) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/shard.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_shard: %s failed\n", #c); __builtin_trap(); } } while (0)

static char dir[64], in_path[128], out_path[128];

static void cleanup(void) {
    unlink(in_path);
    unlink(out_path);
    rmdir(dir);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    CHECK(fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        strcpy(dir, "/tmp/ctitan-fuzz-shard-XXXXXX");
        CHECK(mkdtemp(dir));
        snprintf(in_path, sizeof in_path, "%s/in.bin", dir);
        snprintf(out_path, sizeof out_path, "%s/out.bin", dir);
        atexit(cleanup);
    }
    /* a new file each time: rewriting one in place (O_TRUNC) makes ext4 flush it to disk on close,
     * which took 11 s of 300 mutations' 11.3 s (tests/cli/fuzz_replay.sh) */
    unlink(in_path);
    FILE *f = fopen(in_path, "wb");
    CHECK(f);
    CHECK(fwrite(data, 1, size, f) == size);
    fclose(f);

    char err[2048] = ""; /* shard_read's message, to compare with shard_verify's */
    uint32_t *t = NULL;
    uint64_t n = 0, c = 0;
    ct_status rc = shard_read(in_path, &t, &n);
    if (rc != CT_OK) snprintf(err, sizeof err, "%s", ct_last_error());
    shard_info info = {0};
    ct_status vrc = shard_verify(in_path, &info);
    CHECK((vrc == CT_OK) == (rc == CT_OK));
    CHECK(vrc == CT_OK || strcmp(ct_last_error(), err) == 0);
    /* faults in the tokens, which shard_count does not read */
    int tokens_only = rc != CT_OK && (strstr(err, "checksum mismatch") || strstr(err, "every target is masked"));
    CHECK((shard_count(in_path, &c) == CT_OK) == (rc == CT_OK || tokens_only));
    if (rc != CT_OK) {
        CHECK(strstr(err, in_path) != NULL && strchr(err, '\n') == NULL);
        CHECK(t == NULL && n == 0);
        return 0;
    }
    CHECK(c == n && info.count == n && size == 32 + 4 * n && memcmp(data, "CTTOKENS", 8) == 0);
    CHECK(info.version == data[8] && info.version >= 1 && info.version <= 4);
    if (info.version >= 3) { /* some word after the first is unmasked */
        uint64_t k = 1;
        while (k < n && (t[k] & SHARD_MASKED)) k++;
        CHECK(k < n);
    }
    shard_writer *w = info.version == 4   ? shard_writer_open_docs(out_path)
                      : info.version == 3 ? shard_writer_open_masked(out_path)
                                          : shard_writer_open(out_path);
    CHECK(w && shard_writer_append(w, t, (size_t)n) == CT_OK && shard_writer_close(w) == CT_OK);
    size_t m;
    unsigned char *back = slurp(out_path, &m);
    CHECK(m == size && memcmp(back + 32, data + 32, size - 32) == 0);
    unsigned char want[32];
    memcpy(want, data, 32);
    want[8] = info.version >= 3 ? (unsigned char)info.version : 2;
    for (int i = 0; i < 4; i++) want[24 + i] = (unsigned char)(info.checksum >> (8 * i));
    CHECK(memcmp(back, want, 32) == 0);
    free(back);
    shard_free(t);
    return 0;
}
