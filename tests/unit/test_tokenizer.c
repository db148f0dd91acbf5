/* test_tokenizer.c: the BPE tokenizer reproduces tiktoken, the trainer reproduces a naive trainer,
 * bad vocabulary files are refused line by line, and the tokenize/tokenizer commands do what their
 * usage says.
 *
 * Committed data (tests/data/tokenizer/, see tests/golden/gen_tokenizer_golden.py):
 *   corpus.txt      fortune files + a multilingual sample, "%"-separated
 *   vocab.tiktoken  vocab 1024 trained on it by this project's trainer
 *   golden.txt      tiktoken's ids for ~50 strings with that vocabulary
 * Run from the repository root (tests/run.sh does). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "cmd/cmd_tokenize.h"
#include "data/shard.h"
#include "tokenizer/tokenizer.h"

#define VOCAB "tests/data/tokenizer/vocab.tiktoken"
#define GOLDEN "tests/data/tokenizer/golden.txt"
#define CORPUS "tests/data/tokenizer/corpus.txt"

static ct_tokenizer *tok;   /* the committed vocabulary */

/* ---- helpers ------------------------------------------------------------------------------------ */

static int setup(void **state) {
    (void)state;
    if (tmpdir_make("tokenizer")) return -1;
    tok = tokenizer_load(VOCAB);
    if (!tok) fprintf(stderr, "cannot load %s (run from the repository root): %s\n", VOCAB, ct_last_error());
    return tok ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tokenizer_free(tok);
    tmpdir_remove();
    return 0;
}

/* dir/name, in one of 32 rotating buffers. */
static char *path_of(const char *name) {
    static char bufs[32][256];
    static int k;
    char *p = bufs[k++ % 32];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *b = malloc(cap + 1);
    while ((got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) b = realloc(b, (cap *= 2) + 1);
    }
    fclose(f);
    b[n] = 0;
    if (len) *len = n;
    return b;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t encode(const char *text, size_t len, int allow_special, int32_t **ids) {
    size_t n = 0;
    if (tokenizer_encode(tok, text, len, allow_special, ids, &n) != CT_OK) fail_msg("encode failed: %s", ct_last_error());
    return n;
}

static void expect_roundtrip(const char *text, size_t len, const int32_t *ids, size_t n) {
    size_t back_len = 0;
    char *back = tokenizer_decode(tok, ids, n, &back_len);
    assert_non_null(back);
    assert_int_equal(back_len, len);
    if (len) assert_memory_equal(back, text, len);
    free(back);
}

/* Runs a command with stdout and stderr captured (each NUL-terminated, malloc'd). */
typedef ct_status (*cmd_fn)(int, char **);
static ct_status run_cmdv(cmd_fn fn, int argc, char **argv, char **out, char **errout) {
    static char po[256], pe[256];
    snprintf(po, sizeof po, "%s/stdout.txt", dir);
    snprintf(pe, sizeof pe, "%s/stderr.txt", dir);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    ct_status rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    close(fo);
    close(fe);
    char *o = read_file(po, NULL), *e = read_file(pe, NULL);
    if (out) *out = o; else free(o);
    if (errout) *errout = e; else free(e);
    return rc;
}

/* The same with the arguments listed, NULL-terminated. */
static ct_status run_cmd(cmd_fn fn, char **out, char **errout, const char *arg0, ...) {
    char *argv[64];
    int argc = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < 63; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return run_cmdv(fn, argc, argv, out, errout);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

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
    out[o] = 0;
    return o;
}

/* ---- tiktoken's ids ------------------------------------------------------------------------------ */

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

static void test_golden_ids_match_tiktoken(void **state) {
    (void)state;
    size_t len;
    char *g = read_file(GOLDEN, &len);
    if (!g) fail_msg("cannot read %s (run from the repository root)", GOLDEN);
    int cases = 0, bad = 0, lineno = 0;
    for (char *line = strtok(g, "\n"); line; line = strtok(NULL, "\n")) {
        lineno++;
        if (line[0] == '#') continue;
        char *t1 = strchr(line, '\t');
        char *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        assert_non_null(t2);
        int allow = strncmp(line, "all\t", 4) == 0;
        assert_true(allow || strncmp(line, "none\t", 5) == 0);
        char *hex = t1 + 1;
        size_t hexlen = (size_t)(t2 - hex), hl = hexlen == 1 && hex[0] == '-' ? 0 : hexlen / 2;
        if (hl > (1u << 24)) fail_msg("%s:%d: text too long", GOLDEN, lineno);
        char *text = malloc((hl & 0xffffff) + 1);
        for (size_t i = 0; i < hl; i++) text[i] = (char)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
        int32_t *want = malloc((strlen(t2) + 1) * sizeof *want);
        size_t nw = 0;
        for (char *p = t2 + 1, *end; *p; p = end) {
            want[nw++] = (int32_t)strtol(p, &end, 10);
            if (end == p) fail_msg("%s:%d: bad id list", GOLDEN, lineno);
        }
        int32_t *ids;
        size_t n = encode(text, hl, allow, &ids);
        cases++;
        if (n != nw || (n && memcmp(ids, want, n * sizeof *ids))) {
            size_t k = 0;
            while (k < n && k < nw && ids[k] == want[k]) k++;
            print_error("%s:%d (%s, %zu bytes): %zu ids, tiktoken has %zu; first difference at %zu: "
                        "%d vs %d\n", GOLDEN, lineno, allow ? "all" : "none", hl, n, nw, k,
                        k < n ? ids[k] : -1, k < nw ? want[k] : -1);
            bad++;
        }
        expect_roundtrip(text, hl, ids, n);
        free(ids);
        free(want);
        free(text);
    }
    free(g);
    assert_true(cases >= 80);
    assert_int_equal(bad, 0);
}

static void test_specials_follow_llama31_order(void **state) {
    (void)state;
    int nb = tokenizer_n_base(tok);
    assert_int_equal(nb, 768);
    assert_int_equal(tokenizer_vocab_size(tok), 1024);
    assert_int_equal(tokenizer_bos_id(tok), nb);
    assert_int_equal(tokenizer_eos_id(tok), nb + 1);
    static const struct { int i; const char *name; } named[] = {
        {0, "<|begin_of_text|>"}, {1, "<|end_of_text|>"}, {2, "<|reserved_special_token_0|>"},
        {3, "<|reserved_special_token_1|>"}, {4, "<|finetune_right_pad_id|>"},
        {5, "<|reserved_special_token_2|>"}, {6, "<|start_header_id|>"}, {7, "<|end_header_id|>"},
        {8, "<|eom_id|>"}, {9, "<|eot_id|>"}, {10, "<|python_tag|>"},
        {11, "<|reserved_special_token_3|>"}, {255, "<|reserved_special_token_247|>"},
    };
    for (size_t k = 0; k < sizeof named / sizeof named[0]; k++) {
        assert_string_equal(tokenizer_special_name(named[k].i), named[k].name);
        assert_int_equal(tokenizer_special_id(tok, named[k].name), nb + named[k].i);
        size_t len;
        const char *b = tokenizer_token_bytes(tok, nb + named[k].i, &len);
        assert_int_equal(len, strlen(named[k].name));
        assert_memory_equal(b, named[k].name, len);
    }
    for (int i = 11; i < 256; i++) {   /* reserved numbering continues from 3 without gaps */
        char want[64];
        snprintf(want, sizeof want, "<|reserved_special_token_%d|>", i - 8);
        assert_string_equal(tokenizer_special_name(i), want);
    }
    assert_null(tokenizer_special_name(256));
    assert_null(tokenizer_special_name(-1));
    assert_int_equal(tokenizer_special_id(tok, "<|reserved_special_token_248|>"), -1);
    assert_null(tokenizer_token_bytes(tok, 1024, NULL));
    assert_null(tokenizer_token_bytes(tok, -1, NULL));
    assert_int_equal(tokenizer_eos_id(tok), tokenizer_special_id(tok, "<|end_of_text|>"));
    assert_int_equal(nb + TOKENIZER_EOT, tokenizer_special_id(tok, "<|eot_id|>"));

    /* allow_special decides whether the text of a special is one id or ordinary text. */
    const char *t = "a<|eot_id|>b";
    int32_t *ids;
    size_t n = encode(t, strlen(t), 1, &ids);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], nb + 9);
    free(ids);
    n = encode(t, strlen(t), 0, &ids);
    assert_true(n > 3);
    for (size_t i = 0; i < n; i++) assert_true(ids[i] < nb);
    expect_roundtrip(t, strlen(t), ids, n);
    free(ids);
}

/* ---- BPE: the heap merge equals tiktoken's rescan-per-merge merge ------------------------------- */

typedef struct tok_bytes {
    const char *p;
    size_t n;
    int32_t rank;
} tok_bytes;

static int cmp_tok(const void *a, const void *b) {
    const tok_bytes *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, m);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static tok_bytes *sorted_vocab;
static int32_t rank_lookup(const unsigned char *p, size_t n) {
    tok_bytes key = {(const char *)p, n, 0};
    tok_bytes *f = bsearch(&key, sorted_vocab, (size_t)tokenizer_n_base(tok), sizeof key, cmp_tok);
    return f ? f->rank : INT32_MAX;
}

/* tiktoken's _byte_pair_merge, transcribed: parts (start, rank of the pair starting there). */
static size_t bpe_linear(const unsigned char *c, size_t n, int32_t *out) {
    if (n == 1) { out[0] = rank_lookup(c, 1); return 1; }
    size_t np = n + 1, *start = malloc(np * sizeof *start);
    int32_t *rank = malloc(np * sizeof *rank);
    for (size_t i = 0; i < n - 1; i++) { start[i] = i; rank[i] = rank_lookup(c + i, 2); }
    start[n - 1] = n - 1; rank[n - 1] = INT32_MAX;
    start[n] = n; rank[n] = INT32_MAX;
    for (;;) {
        size_t best = SIZE_MAX;
        int32_t br = INT32_MAX;
        for (size_t i = 0; i + 1 < np; i++)
            if (rank[i] < br) { br = rank[i]; best = i; }
        if (best == SIZE_MAX) break;
#define GET_RANK(i) ((i) + 3 < np ? rank_lookup(c + start[i], start[(i) + 3] - start[i]) : INT32_MAX)
        if (best > 0) rank[best - 1] = GET_RANK(best - 1);
        rank[best] = GET_RANK(best);
#undef GET_RANK
        memmove(start + best + 1, start + best + 2, (np - best - 2) * sizeof *start);
        memmove(rank + best + 1, rank + best + 2, (np - best - 2) * sizeof *rank);
        np--;
    }
    size_t m = 0;
    for (size_t i = 0; i + 1 < np; i++) out[m++] = rank_lookup(c + start[i], start[i + 1] - start[i]);
    free(start);
    free(rank);
    return m;
}

static void test_heap_merge_equals_tiktoken_rescan(void **state) {
    (void)state;
    int nb = tokenizer_n_base(tok);
    sorted_vocab = malloc((size_t)nb * sizeof *sorted_vocab);
    for (int r = 0; r < nb; r++) {
        sorted_vocab[r].p = tokenizer_token_bytes(tok, r, &sorted_vocab[r].n);
        sorted_vocab[r].rank = r;
    }
    qsort(sorted_vocab, (size_t)nb, sizeof *sorted_vocab, cmp_tok);
    static const char *alphabet[] = {"e", "t", "a", "o", "i", "n", " ", "s", "h", "r", "th", "the",
                                     "in", "er", "\n", "é", "中", "ll", "a"};
    unsigned char buf[1200];
    int32_t *a = malloc(sizeof buf * sizeof *a), *b = malloc(sizeof buf * sizeof *b);
    int merged_some = 0;
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0, want = 1 + rnd() % (iter < 2900 ? 40 : 1000);
        while (n < want) {
            const char *s = alphabet[rnd() % (sizeof alphabet / sizeof alphabet[0])];
            size_t k = strlen(s);
            if (n + k > sizeof buf) break;
            memcpy(buf + n, s, k);
            n += k;
        }
        if (iter % 97 == 0) for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)rnd();
        size_t na = tokenizer_bpe_chunk(tok, buf, n, a), nb2 = bpe_linear(buf, n, b);
        assert_int_equal(na, nb2);
        assert_memory_equal(a, b, na * sizeof *a);
        merged_some += na < n;
    }
    assert_true(merged_some > 1000);   /* the vocabulary has real merges */
    free(a);
    free(b);
    free(sorted_vocab);
}

static void test_any_bytes_roundtrip(void **state) {
    (void)state;
    char buf[4096];
    int nb = tokenizer_n_base(tok);
    for (int iter = 0; iter < 300; iter++) {
        size_t n = rnd() % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd();
            buf[i] = r % 4 == 0 ? (char)(r >> 8) : "ab <|>\n\xc3\xa9\xe4"[(r >> 8) % 10];
        }
        for (int allow = 0; allow < 2; allow++) {
            int32_t *ids;
            size_t m = encode(buf, n, allow, &ids);
            for (size_t i = 0; i < m; i++) assert_true(ids[i] >= 0 && ids[i] < nb + 256);
            expect_roundtrip(buf, n, ids, m);
            free(ids);
        }
    }
    /* An invalid UTF-8 byte is a chunk of its own: the text around it encodes as if it were apart. */
    int32_t *whole, *left, *right;
    const char *t = "hello\xffworld";
    size_t n = encode(t, strlen(t), 0, &whole), nl = encode("hello", 5, 0, &left),
           nr = encode("world", 5, 0, &right);
    assert_int_equal(n, nl + 1 + nr);
    assert_memory_equal(whole, left, nl * sizeof *left);
    assert_int_equal(whole[nl], 0xff);   /* byte 0xff is rank 0xff in a trained vocabulary */
    assert_memory_equal(whole + nl + 1, right, nr * sizeof *right);
    free(whole);
    free(left);
    free(right);

    int32_t *ids = (int32_t *)1;
    assert_int_equal(encode("", 0, 1, &ids), 0);
    assert_null(ids);
    int32_t bad[2] = {5, 1024};
    assert_null(tokenizer_decode(tok, bad, 2, NULL));
    assert_non_null(strstr(ct_last_error(), "1024"));
    bad[1] = -3;
    assert_null(tokenizer_decode(tok, bad, 2, NULL));
}

/* Inputs that would be quadratic with naive code finish quickly. */
static void test_long_inputs_stay_fast(void **state) {
    (void)state;
    size_t n = 1 << 20;
    char *t = malloc(n + 2);
    const char *pieces[] = {"thethe", " ", "<|", "a"};
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < n; i++) t[i] = pieces[k][i % strlen(pieces[k])];
        t[n] = 'x';
        double t0 = now_s();
        int32_t *ids;
        size_t m = encode(t, n + 1, 1, &ids);
        double dt = now_s() - t0;
        expect_roundtrip(t, n + 1, ids, m);
        free(ids);
        print_message("1 MiB of '%s': %zu tokens in %.3f s\n", pieces[k], m, dt);
        assert_true(dt < 20.0);
    }
    free(t);
}

/* ---- loading: every malformed file is refused with path:line ----------------------------------- */

/* The 256 single bytes, in byte order, then `extra` (already formatted lines). */
static char *byte_vocab(const char *extra, int skip_byte) {
    char *s = malloc(256 * 16 + strlen(extra) + 1);
    size_t o = 0;
    int rank = 0;
    for (int b = 0; b < 256; b++) {
        if (b == skip_byte) continue;
        unsigned char c = (unsigned char)b;
        o += b64(&c, 1, s + o);
        o += (size_t)sprintf(s + o, " %d\n", rank++);
    }
    strcpy(s + o, extra);
    return s;
}

static void expect_load_error(const char *content, size_t len, const char *where, const char *what) {
    char *p = path_of("bad.tiktoken");
    write_file(p, content, len);
    char want_where[300];
    ct_tokenizer *t = tokenizer_load(p);
    if (t) fail_msg("loaded a bad file; expected '%s'", what);
    const char *err = ct_last_error();
    snprintf(want_where, sizeof want_where, "%s%s", p, where);
    if (strncmp(err, want_where, strlen(want_where)) || !strstr(err, what))
        fail_msg("message '%s' should start '%s' and say '%s'", err, want_where, what);
    assert_null(tokenizer_load_mem(content, len, "mem"));
}

static void bad_line(const char *line, const char *what) {
    char *s = byte_vocab(line, -1);
    expect_load_error(s, strlen(s), ":257: ", what);
    free(s);
}

static void test_bad_vocab_files_are_refused(void **state) {
    (void)state;
    expect_load_error("", 0, ": ", "empty vocabulary file");
    expect_load_error("\n\n\r\n", 4, ": ", "empty vocabulary file");
    bad_line("QUJD\n", "missing rank");
    bad_line("QUJD \n", "missing rank");
    bad_line("QUJD x1\n", "rank is not");
    bad_line("QUJD 256 7\n", "rank is not");
    bad_line("QUJD -1\n", "rank is not");
    bad_line("QU!D 256\n", "bad base64");
    bad_line("QUJ 256\n", "bad base64 (length");
    bad_line("Q=JD 256\n", "'=' before the end");
    bad_line("QUJ= 256\n", "non-zero padding bits");
    bad_line(" 256\n", "empty token");
    bad_line("YQ== 256\n", "duplicate token 'a' (also rank 97 on line 98)");
    bad_line("QUJD 5\n", "rank 5 already used on line 6");
    bad_line("QUJD 300\n", "rank 300 out of range: the file has 257 tokens");
    bad_line("QUJD 99999999999999999999999999\n", "out of range");
    char *s = byte_vocab("", 0x41);
    expect_load_error(s, strlen(s), ": ", "no token for byte 0x41");
    free(s);
    assert_null(tokenizer_load(path_of("does-not-exist")));
    assert_non_null(strstr(ct_last_error(), "does-not-exist: cannot open"));
    /* Random garbage and random damage to a good file never crash (the fuzz target does more). */
    size_t len;
    char *good = read_file(VOCAB, &len);
    for (int iter = 0; iter < 200; iter++) {
        char *d = malloc(len);
        memcpy(d, good, len);
        for (int k = 0; k < 1 + iter % 5; k++) d[rnd() % len] = (char)rnd();
        ct_tokenizer *t = tokenizer_load_mem(d, len - (iter % 3 ? 0 : rnd() % len), "fuzz");
        if (t) {
            int32_t *ids;
            size_t n;
            assert_int_equal(tokenizer_encode(t, good, 2000, 1, &ids, &n), CT_OK);
            free(ids);
            tokenizer_free(t);
        } else {
            assert_int_equal(strncmp(ct_last_error(), "fuzz:", 5), 0);
        }
        free(d);
    }
    free(good);
}

static void test_crlf_blank_lines_and_shuffled_ranks_load(void **state) {
    (void)state;
    size_t len;
    char *good = read_file(VOCAB, &len);
    /* Reverse the lines, end them with "\r\n", add blank lines, drop the last newline. */
    char **lines = malloc(2048 * sizeof *lines);
    int n = 0;
    for (char *l = strtok(good, "\n"); l; l = strtok(NULL, "\n")) lines[n++] = l;
    char *out = malloc(len * 2 + 64);
    size_t o = 0;
    for (int i = n - 1; i >= 0; i--) o += (size_t)sprintf(out + o, "%s\r\n%s", lines[i], i % 100 ? "" : "\n");
    o -= 2;
    char *p = path_of("shuffled.tiktoken");
    write_file(p, out, o);
    ct_tokenizer *t = tokenizer_load(p);
    if (!t) fail_msg("%s", ct_last_error());
    assert_int_equal(tokenizer_vocab_size(t), tokenizer_vocab_size(tok));
    const char *text = "Hello there, it's a shuffled vocabulary: 12345 <|eot_id|>!";
    int32_t *a, *b;
    size_t na = encode(text, strlen(text), 1, &a), nb;
    assert_int_equal(tokenizer_encode(t, text, strlen(text), 1, &b, &nb), CT_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    free(a);
    free(b);
    tokenizer_free(t);
    free(out);
    free(lines);
    free(good);
}

/* ---- training ------------------------------------------------------------------------------------ */

/* The obvious trainer: recount every pair after every merge. vocab[] gets the tokens' bytes. */
typedef struct naive_word {
    int32_t *s;
    size_t n;
    long count;
} naive_word;

typedef struct naive_ctx {
    naive_word *w;
    size_t n, cap;
} naive_ctx;

static ct_status naive_chunk(void *ctx, const unsigned char *c, size_t n) {
    naive_ctx *x = ctx;
    for (size_t i = 0; i < x->n; i++) {
        if (x->w[i].n != n) continue;
        size_t k = 0;
        while (k < n && x->w[i].s[k] == c[k]) k++;
        if (k == n) { x->w[i].count++; return CT_OK; }
    }
    if (x->n == x->cap) x->w = realloc(x->w, (x->cap = x->cap ? 2 * x->cap : 64) * sizeof *x->w);
    naive_word *w = &x->w[x->n++];
    w->s = malloc(n * sizeof *w->s);
    for (size_t k = 0; k < n; k++) w->s[k] = c[k];
    w->n = n;
    w->count = 1;
    return CT_OK;
}

static int naive_train(char **docs, int ndocs, int vocab_size, char **tb, size_t *tl) {
    ct_pretok *pt = pretok_create();
    naive_ctx x = {0};
    for (int d = 0; d < ndocs; d++) pretok_split(pt, docs[d], strlen(docs[d]), naive_chunk, &x);
    pretok_free(pt);
    int nv = 256, target = vocab_size - 256;
    for (int b = 0; b < 256; b++) { tb[b] = malloc(1); tb[b][0] = (char)b; tl[b] = 1; }
    long *counts = malloc((size_t)target * target * sizeof *counts);
    while (nv < target) {
        memset(counts, 0, (size_t)target * target * sizeof *counts);
        for (size_t i = 0; i < x.n; i++)
            for (size_t k = 0; k + 1 < x.w[i].n; k++) counts[x.w[i].s[k] * target + x.w[i].s[k + 1]] += x.w[i].count;
        long best = 0;
        int ba = -1, bb = -1;
        for (int a = 0; a < nv; a++)
            for (int b = 0; b < nv; b++)
                if (counts[a * target + b] > best) { best = counts[a * target + b]; ba = a; bb = b; }
        if (ba < 0) break;
        char *joined = malloc(tl[ba] + tl[bb]);
        memcpy(joined, tb[ba], tl[ba]);
        memcpy(joined + tl[ba], tb[bb], tl[bb]);
        int nt = -1;
        for (int t = 0; t < nv; t++)
            if (tl[t] == tl[ba] + tl[bb] && memcmp(tb[t], joined, tl[t]) == 0) nt = t;
        if (nt < 0) { nt = nv; tb[nv] = joined; tl[nv++] = tl[ba] + tl[bb]; }
        else free(joined);
        for (size_t i = 0; i < x.n; i++) {
            size_t o = 0;
            for (size_t k = 0; k < x.w[i].n;) {
                if (k + 1 < x.w[i].n && x.w[i].s[k] == ba && x.w[i].s[k + 1] == bb) { x.w[i].s[o++] = nt; k += 2; }
                else x.w[i].s[o++] = x.w[i].s[k++];
            }
            x.w[i].n = o;
        }
    }
    free(counts);
    for (size_t i = 0; i < x.n; i++) free(x.w[i].s);
    free(x.w);
    return nv;
}

static void test_trainer_equals_naive_trainer(void **state) {
    (void)state;
    static const char *syll[] = {"ab", "ba", "aa", "a", "b", " ", "é", "中文", "!!", "123456", "\n",
                                 "  ", "the", "'s", "Ж", "😀", "ab ab", "x"};
    for (int trial = 0; trial < 6; trial++) {
        int ndocs = trial == 5 ? 3 : 5 + trial * 7;
        char **docs = malloc((size_t)ndocs * sizeof *docs);
        for (int d = 0; d < ndocs; d++) {
            docs[d] = malloc(2000);
            size_t n = 0, want = (size_t)(rnd() % (trial == 5 ? 200 : 1200));
            while (n < want) {
                const char *s = syll[rnd() % (trial < 3 ? 7 : sizeof syll / sizeof syll[0])];
                strcpy(docs[d] + n, s);
                n += strlen(s);
            }
        }
        int vocab_size = trial == 5 ? 4096 : 512 + 40 + trial * 30;   /* trial 5 runs out of pairs */
        ct_bpe_trainer *tr = bpe_trainer_create();
        assert_non_null(tr);
        for (int d = 0; d < ndocs; d++) assert_int_equal(bpe_trainer_add(tr, docs[d], strlen(docs[d])), CT_OK);
        assert_int_equal(bpe_trainer_train(tr, vocab_size), CT_OK);
        assert_int_equal(bpe_trainer_train(tr, vocab_size), CT_ERR_INVALID);   /* only once */
        char *p = path_of("trained.tiktoken");
        assert_int_equal(bpe_trainer_write(tr, p), CT_OK);
        ct_bpe_stats st;
        bpe_trainer_stats(tr, &st);
        bpe_trainer_free(tr);

        char *tb[4096];
        size_t tl[4096];
        int nv = naive_train(docs, ndocs, trial == 5 ? 1024 : vocab_size, tb, tl);
        ct_tokenizer *t = tokenizer_load(p);
        if (!t) fail_msg("trained vocabulary does not load: %s", ct_last_error());
        assert_int_equal(tokenizer_n_base(t), nv);
        assert_int_equal(st.n_base, nv);
        assert_int_equal(st.documents, (uint64_t)ndocs);
        if (trial < 5) assert_int_equal(nv, vocab_size - 256);
        else assert_true(nv < 1024 - 256);   /* both ran out of pairs */
        for (int r = 0; r < nv; r++) {
            size_t len;
            const char *b = tokenizer_token_bytes(t, r, &len);
            if (len != tl[r] || memcmp(b, tb[r], len)) fail_msg("trial %d: rank %d differs from the naive trainer", trial, r);
            free(tb[r]);
        }
        tokenizer_free(t);
        for (int d = 0; d < ndocs; d++) free(docs[d]);
        free(docs);
    }
    ct_bpe_trainer *tr = bpe_trainer_create();
    assert_int_equal(bpe_trainer_train(tr, 511), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "vocab size 511"));
    bpe_trainer_free(tr);
}

/* The committed vocabulary is what `tokenizer train` makes of the committed corpus, byte for byte. */
static void test_train_command_reproduces_committed_vocab(void **state) {
    (void)state;
    char *out, *errs, *p = path_of("vocab.tiktoken");
    ct_status rc = run_cmd(cmd_tokenizer, &out, &errs, "tokenizer", "train", "--input", CORPUS, "--split-on",
                     "%", "--vocab-size", "1024", "--output", p, NULL);
    if (rc) fail_msg("rc %d: %s", rc, errs);
    assert_non_null(strstr(out, "512 merges"));
    assert_non_null(strstr(out, "vocab 1024"));
    size_t a, b;
    char *got = read_file(p, &a), *want = read_file(VOCAB, &b);
    assert_int_equal(a, b);
    assert_memory_equal(got, want, a);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    assert_false(exists(tmp));
    free(got);
    free(want);
    free(out);
    free(errs);
}

/* ---- commands ------------------------------------------------------------------------------------ */

/* Appends bos + encode(text) + eos to want. */
static size_t expect_doc(int32_t *want, size_t n, const char *text, size_t len) {
    int32_t *ids;
    size_t m = encode(text, len, 0, &ids);
    want[n++] = tokenizer_bos_id(tok);
    memcpy(want + n, ids, m * sizeof *ids);
    n += m;
    want[n++] = tokenizer_eos_id(tok);
    free(ids);
    return n;
}

static void expect_shard(const char *path, const int32_t *want, size_t n) {
    uint32_t *t;
    uint64_t m;
    if (shard_read(path, &t, &m) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(m, n);
    assert_memory_equal(t, want, n * sizeof *want);
    shard_free(t);
}

static void test_tokenize_text_and_jsonl(void **state) {
    (void)state;
    int32_t want[4096];
    size_t n = 0;
    char *in1 = path_of("a.txt"), *in2 = path_of("b.txt"), *sh = path_of("out.bin"), *out, *errs;
    const char *f1 = "doc one\n%\ndoc two <|eot_id|>\nline\n%\n%\r\n", *f2 = "%\nthird\r\n";
    write_file(in1, f1, strlen(f1));
    write_file(in2, f2, strlen(f2));
    ct_status rc = run_cmd(cmd_tokenize, &out, &errs, "tokenize", "--tokenizer", VOCAB, "--input", in1, "--input",
                 in2, "--output", sh, "--split-on", "%", NULL);
    if (rc) fail_msg("rc %d: %s", rc, errs);
    assert_non_null(strstr(out, "3 documents"));
    assert_string_equal(errs, "");
    n = expect_doc(want, 0, "doc one\n", 8);
    n = expect_doc(want, n, "doc two <|eot_id|>\nline\n", 24);
    n = expect_doc(want, n, "third\r\n", 7);
    expect_shard(sh, want, n);
    free(out);
    free(errs);

    /* Whole files are documents without --split-on; --allow-special makes <|eot_id|> one id. */
    rc = run_cmd(cmd_tokenize, &out, &errs, "tokenize", "--tokenizer=" VOCAB, "--input", in1,
                 "--output", sh, "--allow-special", NULL);
    assert_int_equal(rc, 0);
    int32_t *ids;
    size_t m = encode(f1, strlen(f1), 1, &ids);
    want[0] = tokenizer_bos_id(tok);
    memcpy(want + 1, ids, m * sizeof *ids);
    want[m + 1] = tokenizer_eos_id(tok);
    expect_shard(sh, want, m + 2);
    free(ids);
    free(out);
    free(errs);

    /* jsonl: one object per line, blank lines skipped, NUL allowed in strings. */
    char *jl = path_of("c.jsonl");
    const char *j = "{\"text\": \"hello w\\u00f6rld\", \"id\": 1}\n\n  \n{\"text\": \"a\\u0000b\"}\r\n{\"text\": \"\"}\n";
    write_file(jl, j, strlen(j));
    rc = run_cmd(cmd_tokenize, &out, &errs, "tokenize", "--tokenizer", VOCAB, "--input", jl, "--format",
                 "jsonl", "--output", sh, NULL);
    if (rc) fail_msg("rc %d: %s", rc, errs);
    assert_non_null(strstr(out, "2 documents"));
    n = expect_doc(want, 0, "hello w\xc3\xb6rld", 12);
    n = expect_doc(want, n, "a\0b", 3);
    expect_shard(sh, want, n);
    free(out);
    free(errs);
}

static void expect_cmd_fails(cmd_fn fn, ct_status want_rc, const char *what, const char *arg0, ...) {
    char *argv[32];
    int argc = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < 31; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    char *out, *errs;
    ct_status rc = run_cmdv(fn, argc, argv, &out, &errs);
    if (rc != want_rc || count_lines(errs) != 1 || !strstr(errs, what))
        fail_msg("rc %d (want %d), stderr '%s' (want one line saying '%s')", rc, want_rc, errs, what);
    free(out);
    free(errs);
}

static void test_command_errors(void **state) {
    (void)state;
    char *sh = path_of("never.bin"), *jl = path_of("bad.jsonl"), *txt = path_of("t.txt");
    write_file(txt, "hi\n", 3);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "--tokenizer FILE is required", "tokenize", NULL);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "unknown argument --bogus", "tokenize", "--bogus", NULL);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "--format must be text, jsonl or chat, got xml", "tokenize",
                     "--format", "xml", NULL);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "--output needs a file", "tokenize", "--tokenizer", VOCAB, "--input", txt, "--output", NULL);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "--output SHARD is required", "tokenize", "--tokenizer", VOCAB, "--input", txt, NULL);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "--split-on applies to --format text only", "tokenize", "--tokenizer", VOCAB,
                     "--input", txt, "--output", sh, "--format", "jsonl", "--split-on", "%", NULL);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "cannot open", "tokenize", "--tokenizer", "no-such.tiktoken", "--input", txt,
                     "--output", sh, NULL);
    expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, "no documents", "tokenize", "--tokenizer", VOCAB, "--input", "/dev/null",
                     "--output", sh, NULL);
    const char *bad[][2] = {
        {"{\"text\": \"ok\"}\n{\"text\": 5}\n", ":2: \"text\" is not a string"},
        {"{\"text\": \"ok\"}\n\n{\"txt\": \"x\"}\n", ":3: no \"text\" field"},
        {"[1, 2]\n", ":1: expected a JSON object"},
        {"{\"text\": \"ok\"} trailing\n", ":1: invalid JSON"},
        {"{\"text\": \"unterminated\n", ":1: invalid JSON"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_file(jl, bad[k][0], strlen(bad[k][0]));
        char want[400];
        snprintf(want, sizeof want, "%s%s", jl, bad[k][1]);
        expect_cmd_fails(cmd_tokenize, CT_ERR_INVALID, want, "tokenize", "--tokenizer", VOCAB, "--input", jl, "--output", sh,
                         "--format", "jsonl", NULL);
    }
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", sh);
    assert_false(exists(sh));   /* failures leave neither the shard nor its temporary */
    assert_false(exists(tmp));

    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "missing subcommand", "tokenizer", NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "unknown subcommand", "tokenizer", "frobnicate", NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "--vocab-size must be an integer in 512..", "tokenizer", "train", "--input",
                     txt, "--vocab-size", "100", "--output", sh, NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "--vocab-size must be", "tokenizer", "train", "--vocab-size", "12x", NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "--output FILE is required", "tokenizer", "train", "--input", txt,
                     "--vocab-size", "600", NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "cannot open", "tokenizer", "train", "--input", "no-such-file",
                     "--vocab-size", "600", "--output", sh, NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "--text STR is required", "tokenizer", "encode", "--tokenizer", VOCAB, NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "expected a token id", "tokenizer", "decode", "--tokenizer", VOCAB, "1", "x", NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "expected a token id", "tokenizer", "decode", "--tokenizer", VOCAB, "-1", NULL);
    expect_cmd_fails(cmd_tokenizer, CT_ERR_INVALID, "token id 5000", "tokenizer", "decode", "--tokenizer", VOCAB, "5000", NULL);
    assert_false(exists(sh));

    char *out, *errs;
    assert_int_equal(run_cmd(cmd_tokenize, &out, &errs, "tokenize", "--help", NULL), CT_OK);
    assert_non_null(strstr(out, "usage: ctitan tokenize"));
    assert_non_null(strstr(out, "--split-on"));
    free(out);
    free(errs);
    assert_int_equal(run_cmd(cmd_tokenizer, &out, &errs, "tokenizer", "train", "--help", NULL), CT_OK);
    assert_non_null(strstr(out, "tokenizer train"));
    assert_non_null(strstr(out, "--vocab-size"));
    free(out);
    free(errs);
}

static void test_encode_and_decode_commands(void **state) {
    (void)state;
    const char *text = "Hello<|eot_id|> world";
    char want[512], *out, *errs;
    for (int allow = 0; allow < 2; allow++) {
        int32_t *ids;
        size_t n = encode(text, strlen(text), allow, &ids), o = 0;
        for (size_t i = 0; i < n; i++) o += (size_t)sprintf(want + o, "%s%d", i ? " " : "", ids[i]);
        strcpy(want + o, "\n");
        ct_status rc = allow ? run_cmd(cmd_tokenizer, &out, &errs, "tokenizer", "encode", "--tokenizer", VOCAB, "--text",
                                 text, "--allow-special", NULL)
                       : run_cmd(cmd_tokenizer, &out, &errs, "tokenizer", "encode", "--tokenizer", VOCAB, "--text",
                                 text, NULL);
        assert_int_equal(rc, 0);
        assert_string_equal(out, want);
        free(out);
        free(errs);
        free(ids);
    }
    char a[16], b[16], c[16];
    int32_t *ids;
    size_t n = encode("Hi!", 3, 0, &ids);
    assert_true(n <= 3);
    snprintf(a, sizeof a, "%d", ids[0]);
    snprintf(b, sizeof b, "%d", n > 1 ? ids[1] : tokenizer_eos_id(tok));
    snprintf(c, sizeof c, "%d", tokenizer_eos_id(tok));
    free(ids);
    assert_int_equal(run_cmd(cmd_tokenizer, &out, &errs, "tokenizer", "decode", "--tokenizer", VOCAB, a, b, c, NULL), 0);
    assert_true(strncmp(out, "Hi", 2) == 0);
    assert_non_null(strstr(out, "<|end_of_text|>\n"));
    free(out);
    free(errs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_ids_match_tiktoken),
        cmocka_unit_test(test_specials_follow_llama31_order),
        cmocka_unit_test(test_heap_merge_equals_tiktoken_rescan),
        cmocka_unit_test(test_any_bytes_roundtrip),
        cmocka_unit_test(test_long_inputs_stay_fast),
        cmocka_unit_test(test_bad_vocab_files_are_refused),
        cmocka_unit_test(test_crlf_blank_lines_and_shuffled_ranks_load),
        cmocka_unit_test(test_trainer_equals_naive_trainer),
        cmocka_unit_test(test_train_command_reproduces_committed_vocab),
        cmocka_unit_test(test_tokenize_text_and_jsonl),
        cmocka_unit_test(test_command_errors),
        cmocka_unit_test(test_encode_and_decode_commands),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
