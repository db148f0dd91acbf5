/* fuzz_tokenizer_file.c: any bytes, as a vocabulary file and as text, never crash the tokenizer.
 *
 * Each input is (1) loaded as a tiktoken vocabulary: it must load or give a "fuzz:..." message; a
 * vocabulary that loads must encode and decode the input itself exactly; and (2) encoded as text, with
 * and without special tokens, by a small fixed vocabulary: decode(encode(x)) must equal x.
 *
 * libFuzzer:  clang -g -O1 -fsanitize=fuzzer,address,undefined -Isdk/include -Icore -D_GNU_SOURCE \
 *                 tests/fuzz/fuzz_tokenizer_file.c core/tools/tokenizer.c -lpcre2-8 -lpthread
 * plain:      link with tests/fuzz/replay_main.c instead of -fsanitize=fuzzer (tests/cli/fuzz_replay.sh) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tokenizer.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_tokenizer_file: %s failed\n", #c); __builtin_trap(); } } while (0)

static size_t b64(const unsigned char *p, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    return o;
}

/* The 256 bytes plus a few merges, so that text gets merged. */
static ct_tokenizer *fixed_tokenizer(void) {
    static const char *merges[] = {"th", "he", "the", " t", " the", "in", "ing", "er", "  ", "    ",
                                   "\n\n", "aa", "aaaa", "<|", "|>", "\xc3\xa9", "'s", "12", "123",
                                   " a", "an", " an", "and", " and", "\xe4\xb8", "\xe4\xb8\xad"};
    size_t n = sizeof merges / sizeof merges[0];
    char *text = malloc((256 + n) * 32), *o = text;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        o += b64(&c, 1, o);
        o += sprintf(o, " %d\n", b);
    }
    for (size_t k = 0; k < n; k++) {
        o += b64((const unsigned char *)merges[k], strlen(merges[k]), o);
        o += sprintf(o, " %zu\n", 256 + k);
    }
    char err[256];
    ct_tokenizer *t = tokenizer_load_mem(text, (size_t)(o - text), "fixed", err, sizeof err);
    free(text);
    if (!t) fprintf(stderr, "fuzz_tokenizer_file: %s\n", err);
    CHECK(t);
    return t;
}

static void roundtrip(const ct_tokenizer *t, const uint8_t *data, size_t size) {
    char err[256];
    for (int allow = 0; allow < 2; allow++) {
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        CHECK(tokenizer_encode(t, (const char *)data, size, allow, &ids, &n, err, sizeof err) == 0);
        for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(t));
        char *back = tokenizer_decode(t, ids, n, &len, err, sizeof err);
        CHECK(back && len == size && memcmp(back, data, size) == 0);
        free(back);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ct_tokenizer *fixed;
    if (!fixed) fixed = fixed_tokenizer();
    char err[512] = "";
    ct_tokenizer *t = tokenizer_load_mem((const char *)data, size, "fuzz", err, sizeof err);
    if (t) {
        CHECK(tokenizer_vocab_size(t) == tokenizer_n_base(t) + 256);
        roundtrip(t, data, size < 4096 ? size : 4096);
        tokenizer_free(t);
    } else {
        CHECK(strncmp(err, "fuzz:", 5) == 0);
    }
    roundtrip(fixed, data, size);
    return 0;
}
