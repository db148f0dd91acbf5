/* fuzz_shard.c: any bytes, as a token shard file, are read back exactly or refused with a message.
 *
 * A shard that reads must have been 32 + 4 * count bytes with the documented header, and writing its
 * tokens again must reproduce the file byte for byte.
 *
 * libFuzzer:  clang -g -O1 -fsanitize=fuzzer,address,undefined -Isdk/include -Icore -D_GNU_SOURCE \
 *                 tests/fuzz/fuzz_shard.c core/data/shard.c
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
    FILE *f = fopen(in_path, "wb");
    CHECK(f);
    CHECK(fwrite(data, 1, size, f) == size);
    fclose(f);

    char err[512] = "";
    uint32_t *t = NULL;
    uint64_t n = 0, c = 0;
    int rc = shard_read(in_path, &t, &n, err, sizeof err);
    CHECK((shard_count(in_path, &c, NULL, 0) == 0) == (rc == 0));
    if (rc != 0) {
        CHECK(strstr(err, in_path) != NULL);
        CHECK(t == NULL && n == 0);
        return 0;
    }
    CHECK(c == n && size == 32 + 4 * n && memcmp(data, "CTTOKENS", 8) == 0);
    CHECK(shard_write(out_path, t, n, err, sizeof err) == 0);
    size_t m;
    unsigned char *back = slurp(out_path, &m);
    CHECK(m == size && memcmp(back, data, size) == 0);
    free(back);
    shard_free(t);
    return 0;
}
