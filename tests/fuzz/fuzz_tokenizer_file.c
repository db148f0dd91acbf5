/* fuzz_tokenizer_file.c: any bytes, as a tokenizer file and as text, never crash the tokenizer.
 *
 * Each input is (1) loaded as a tokenizer file (a tiktoken vocabulary or a Hugging Face tokenizer.json,
 * by content): it must load or give a one-line "fuzz..." message; a tiktoken vocabulary that loads
 * must encode and decode the input itself exactly, a tokenizer.json must encode it to ids that decode
 * (its ByteLevel add_prefix_space may add spaces); and (2) encoded as text, with and without special
 * tokens, by a small fixed tiktoken vocabulary and a small fixed tokenizer.json: decode(encode(x))
 * must equal x; and (3) handed to hf_json_mask_nul, the tokenizer.json reader's rewrite of \u0000 to
 * \uFFFF: a copy of the same length that differs only in "0000" -> "FFFF" right after a "\u", or a
 * one-line refusal.
 *
 * libFuzzer:  make build/fuzz/fuzz_tokenizer_file (links build/fuzz/libctitan-core.a, the core built with the
 *             fuzzer's instrumentation); replay: tests/cli/fuzz_replay.sh's build of it.
 * plain:      link with tests/fuzz/replay_main.c instead of -fsanitize=fuzzer (tests/cli/fuzz_replay.sh) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

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
    ct_tokenizer *t = tokenizer_load_mem(text, (size_t)(o - text), "fixed");
    free(text);
    if (!t) fprintf(stderr, "fuzz_tokenizer_file: %s\n", ct_last_error());
    CHECK(t);
    return t;
}

/* ByteLevel's alphabet: the code point that stands for byte b, as UTF-8. */
static size_t byte_char(int b, char *out) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = b;
    if (!printable) {
        cp = 256;
        for (int k = 0; k < b; k++)
            if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255))) cp++;
    }
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* A tokenizer.json: the 256 bytes, a few merges (Llama 3's pre-tokenizer, ignore_merges) and two
 * added tokens, one special. */
static ct_tokenizer *fixed_hf_tokenizer(void) {
    static const char *merges[][2] = {{"t", "h"}, {"h", "e"}, {"th", "e"}, {"\u0120", "t"}, {"\u0120t", "he"},
                                      {"i", "n"}, {"in", "g"}, {"\u0120", "\u0120"}, {"a", "a"}, {"aa", "aa"}};
    size_t nm = sizeof merges / sizeof merges[0];
    char *text = malloc(65536), *o = text;
    o += sprintf(o, "{\"added_tokens\": [{\"id\": 300, \"content\": \"<|eot|>\", \"special\": true},"
                    " {\"id\": 301, \"content\": \"<x>\", \"special\": false, \"normalized\": true}],"
                    " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
                    "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", "
                    "\"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                    "\"use_regex\": false}]}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": "
                    "\"BPE\", \"ignore_merges\": true, \"vocab\": {",
                 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}"
                 "| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+");
    for (int b = 0; b < 256; b++) {
        char c[3] = {0};
        byte_char(b, c);
        if (b == '"' || b == '\\') o += sprintf(o, "\"\\%s\": %d, ", c, b);
        else o += sprintf(o, "\"%s\": %d, ", c, b);
    }
    for (size_t k = 0; k < nm; k++)
        o += sprintf(o, "\"%s%s\": %zu%s", merges[k][0], merges[k][1], 256 + k, k + 1 < nm ? ", " : "}, \"merges\": [");
    for (size_t k = 0; k < nm; k++)
        o += sprintf(o, "[\"%s\", \"%s\"]%s", merges[k][0], merges[k][1], k + 1 < nm ? ", " : "]}}");
    ct_tokenizer *t = tokenizer_load_mem(text, (size_t)(o - text), "fixed-hf");
    free(text);
    if (!t) fprintf(stderr, "fuzz_tokenizer_file: %s\n", ct_last_error());
    CHECK(t);
    return t;
}

/* Loaded from the input: every id in range and decodable (no exact round trip: add_prefix_space). */
static void encode_decodes(const ct_tokenizer *t, const uint8_t *data, size_t size) {
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    if (tokenizer_encode(t, (const char *)data, size, 1, &ids, &n) != CT_OK) {
        CHECK(!strchr(ct_last_error(), '\n'));   /* a regex of the file's may fail on the text, in one line */
        return;
    }
    for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(t));
    char *back = tokenizer_decode(t, ids, n, &len);
    CHECK(back);
    free(back);
    free(ids);
}

static void roundtrip(const ct_tokenizer *t, const uint8_t *data, size_t size) {
    for (int allow = 0; allow < 2; allow++) {
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        CHECK(tokenizer_encode(t, (const char *)data, size, allow, &ids, &n) == CT_OK);
        for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(t));
        char *back = tokenizer_decode(t, ids, n, &len);
        CHECK(back && len == size && memcmp(back, data, size) == 0);
        free(back);
        free(ids);
    }
}

/* hf_json_mask_nul: only \u0000 escapes change, each to \uFFFF, in place. */
static void mask_nul_rewrites_only_escapes(const uint8_t *data, size_t size) {
    char *masked = (char *)1;
    ct_status st = hf_json_mask_nul((const char *)data, size, "fuzz", &masked);
    if (st != CT_OK) {
        CHECK(st == CT_ERR_INVALID && !masked && strncmp(ct_last_error(), "fuzz:", 5) == 0 &&
              !strchr(ct_last_error(), '\n'));
        return;
    }
    for (size_t i = 0; masked && i < size; i++) {
        if (masked[i] == (char)data[i]) continue;
        /* the first of four changed bytes: "\u0000" became "\uFFFF", its backslash not itself escaped
         * (an odd run of backslashes) */
        CHECK(i >= 2 && i + 4 <= size && memcmp(data + i - 2, "\\u0000", 6) == 0 && memcmp(masked + i - 2, "\\uFFFF", 6) == 0);
        size_t run = 0;
        while (run < i - 1 && data[i - 2 - run] == '\\') run++;
        CHECK(run % 2 == 1);
        i += 3;
    }
    free(masked);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ct_tokenizer *fixed, *fixed_hf;
    if (!fixed) fixed = fixed_tokenizer();
    if (!fixed_hf) fixed_hf = fixed_hf_tokenizer();
    ct_tokenizer *t = tokenizer_load_mem((const char *)data, size, "fuzz");
    if (t) {
        CHECK(tokenizer_vocab_size(t) >= tokenizer_n_base(t));
        size_t i = size >= 3 && memcmp(data, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
        while (i < size && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n')) i++;
        if (i == size || data[i] != '{')
            roundtrip(t, data, size < 4096 ? size : 4096);   /* tiktoken */
        else
            encode_decodes(t, data, size < 4096 ? size : 4096);
        tokenizer_free(t);
    } else {
        CHECK(strncmp(ct_last_error(), "fuzz", 4) == 0 && !strchr(ct_last_error(), '\n'));
        /* every \u0000 inside a string was rewritten: jansson never sees one */
        CHECK(!strstr(ct_last_error(), "NUL byte in object key") && !strstr(ct_last_error(), "JSON_ALLOW_NUL"));
    }
    roundtrip(fixed, data, size);
    roundtrip(fixed_hf, data, size);
    mask_nul_rewrites_only_escapes(data, size);
    return 0;
}
