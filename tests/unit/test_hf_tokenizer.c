/* test_hf_tokenizer.c: Hugging Face tokenizer.json files give the `tokenizers` package's ids, decode
 * back to their text (or, for torchtitan's kind of file, to what the package decodes), load from a
 * model folder with the right BOS/EOS, and bad files are refused with one line naming the file and
 * the JSON key.
 *
 * Committed data (tests/data/tokenizer/hf/, written by tests/golden/gen_hf_tokenizer_golden.py):
 *   llama3/tokenizer.json, tokenizer_config.json   Llama 3's layout, 1500 base tokens + 256 specials
 *   gpt2/tokenizer.json                             GPT-2's layout, 1500 base tokens + <|endoftext|>
 *   torchtitan/tokenizer.json, tokenizer_config.json  torchtitan's test tokenizer's shape: a "\u0000"
 *                                                   key, raw control characters, "\\x80".."\\xff", no
 *                                                   merges, 1972 base tokens + 3 specials
 *   golden.txt                                      the package's ids (and torchtitan's decodes) for ~60
 *                                                   strings, per tokenizer
 * Run from the repository root (tests/run.sh does). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

#define HF "tests/data/tokenizer/hf"
#define GOLDEN HF "/golden.txt"

static ct_tokenizer *llama3, *gpt2, *gpt2_prefix, *qwen2_nfc, *torchtitan, *torchtitan_ignore;

#define QWEN2_PATTERN "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" \
                      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

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

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* dir/name, in one of 16 rotating buffers. */
static char *path_of(const char *name) {
    static char bufs[16][256];
    static int k;
    char *p = bufs[k++ % 16];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

/* A tokenizer.json read with jansson, changed by the caller, then loaded from memory. */
static json_t *json_of(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s: %s", path, je.text);
    return j;
}

/* j as compact JSON text, every @NUL@ in it written \u0000 (a malloc'd string). */
static char *dump(const json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT), *out = malloc(2 * strlen(s) + 1), *o = out;
    for (const char *p = s; *p;) {
        if (strncmp(p, "@NUL@", 5) == 0) {
            o += sprintf(o, "\\u0000");
            p += 5;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    free(s);
    return out;
}

static ct_tokenizer *load_json(json_t *j, const char *label) {
    char *s = dump(j);
    ct_tokenizer *t = tokenizer_load_mem(s, strlen(s), label);
    free(s);
    return t;
}

static int setup(void **state) {
    (void)state;
    if (tmpdir_make("hf-tokenizer")) return -1;
    llama3 = tokenizer_load(HF "/llama3/");
    if (!llama3) fprintf(stderr, "%s\n", ct_last_error());
    gpt2 = tokenizer_load(HF "/gpt2/tokenizer.json");
    if (!gpt2) fprintf(stderr, "%s\n", ct_last_error());
    json_t *j = json_of(HF "/gpt2/tokenizer.json");
    json_object_set_new(json_object_get(j, "pre_tokenizer"), "add_prefix_space", json_true());
    gpt2_prefix = load_json(j, "gpt2-prefix");
    json_decref(j);
    /* Qwen2's layout: llama3's file with Qwen2's regex and normalizer NFC */
    j = json_of(HF "/llama3/tokenizer.json");
    json_object_set_new(j, "normalizer", json_pack("{ss}", "type", "NFC"));
    json_t *split = json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(json_object_get(split, "pattern"), "Regex", json_string(QWEN2_PATTERN));
    qwen2_nfc = load_json(j, "qwen2-nfc");
    if (!qwen2_nfc) fprintf(stderr, "%s\n", ct_last_error());
    json_decref(j);
    torchtitan = tokenizer_load(HF "/torchtitan");
    if (!torchtitan) fprintf(stderr, "%s\n", ct_last_error());
    /* ignore_merges set: jansson cannot read the file back (its "\u0000" key), so the text is edited */
    size_t len;
    char *text = read_file(HF "/torchtitan/tokenizer.json", &len), *at = text ? strstr(text, "\"ignore_merges\": false") : NULL;
    if (at) memcpy(at + 17, "true ", 5);
    torchtitan_ignore = at ? tokenizer_load_mem(text, len, "torchtitan-ignore") : NULL;
    if (!torchtitan_ignore) fprintf(stderr, "torchtitan-ignore: %s\n", at ? ct_last_error() : "no ignore_merges key");
    free(text);
    return llama3 && gpt2 && gpt2_prefix && qwen2_nfc && torchtitan && torchtitan_ignore ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tokenizer_free(llama3);
    tokenizer_free(gpt2);
    tokenizer_free(gpt2_prefix);
    tokenizer_free(qwen2_nfc);
    tokenizer_free(torchtitan);
    tokenizer_free(torchtitan_ignore);
    tmpdir_remove();
    return 0;
}

static size_t unhex(const char *h, char *out) {
    if (strcmp(h, "-") == 0) return 0;
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    return n;
}

/* Bytes as the package hands a decode to Python: UTF-8 with each maximal invalid part one U+FFFD
 * (Rust's String::from_utf8_lossy). out has room for 3 * n bytes. */
static size_t utf8_lossy(const unsigned char *s, size_t n, unsigned char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t need = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        size_t k = 1;   /* the valid prefix */
        while (need > 1 && k < need && i + k < n) {
            unsigned char lo = 0x80, hi = 0xbf;
            if (k == 1 && c == 0xe0) lo = 0xa0;
            if (k == 1 && c == 0xed) hi = 0x9f;
            if (k == 1 && c == 0xf0) lo = 0x90;
            if (k == 1 && c == 0xf4) hi = 0x8f;
            if (s[i + k] < lo || s[i + k] > hi) break;
            k++;
        }
        if (need && k == need) {
            memcpy(out + o, s + i, need);
            o += need;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        i += need ? k : 1;
    }
    return o;
}

/* ctitan's decode of ids, made into the package's str, against the golden hex (- for empty). */
static void check_decode(ct_tokenizer *tk, const char *tname, const int32_t *ids, size_t n, const char *want_hex) {
    size_t dlen;
    char *back = tokenizer_decode(tk, ids, n, &dlen);
    if (!back) fail_msg("%s: decode failed: %s", tname, ct_last_error());
    unsigned char *lossy = malloc(3 * dlen + 1);
    char *want = malloc(strlen(want_hex) / 2 + 1);
    size_t ln = utf8_lossy((const unsigned char *)back, dlen, lossy), wn = unhex(want_hex, want);
    if (ln != wn || memcmp(lossy, want, wn))
        fail_msg("%s: decode of %zu ids: %zu bytes, the package's %zu (%.80s)", tname, n, ln, wn, want_hex);
    free(want);
    free(lossy);
    free(back);
}

static ct_tokenizer *golden_tokenizer(const char *tname) {
    static const struct { const char *name; ct_tokenizer **tok; } all[] = {
        {"llama3", &llama3}, {"gpt2", &gpt2}, {"gpt2-prefix", &gpt2_prefix}, {"qwen2-nfc", &qwen2_nfc},
        {"torchtitan", &torchtitan}, {"torchtitan-ignore", &torchtitan_ignore}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(tname, all[i].name) == 0) return *all[i].tok;
    fail_msg("golden.txt: unknown tokenizer %s", tname);
    return NULL;
}

/* Every golden line of the tokenizers named `name` (NULL: all) against t (NULL: by name). */
static int check_golden(const char *name, ct_tokenizer *t) {
    size_t len;
    char *g = read_file(GOLDEN, &len);
    assert_non_null(g);
    int lines = 0;
    char *save = NULL, *prev_hex = NULL, *prev_want = NULL, *prev_dec = NULL;
    for (char *line = strtok_r(g, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char *tname = line, *mode = strchr(tname, '\t');
        assert_non_null(mode);
        *mode++ = 0;
        char *hex = strchr(mode, '\t');
        assert_non_null(hex);
        *hex++ = 0;
        char *want = strchr(hex, '\t');
        assert_non_null(want);
        *want++ = 0;
        char *dec = strchr(want, '\t');   /* torchtitan's lines: the package's decode of the ids */
        if (dec) *dec++ = 0;
        int decode_line = strcmp(mode, "decode") == 0;
        if (!decode_line) {
            if (strcmp(hex, "=") == 0) hex = prev_hex;
            if (strcmp(want, "=") == 0) want = prev_want;
            if (dec && strcmp(dec, "=") == 0) dec = prev_dec;
            prev_hex = hex;
            prev_want = want;
            prev_dec = dec;
        }
        if (name && strcmp(tname, name)) continue;
        ct_tokenizer *tk = t ? t : golden_tokenizer(tname);
        if (decode_line) {   /* hand-picked ids (in the text column) and their decode */
            int32_t ids[1024];
            size_t n = 0;
            for (char *p = hex, *end; *p && n < 1024; p = end) {
                ids[n++] = (int32_t)strtol(p, &end, 10);
                assert_true(end > p);
            }
            check_decode(tk, tname, ids, n, want);
            lines++;
            continue;
        }
        char *text = malloc(strlen(hex) / 2 + 1);
        size_t tlen = unhex(hex, text);
        int32_t *ids = NULL;
        size_t n = 0;
        ct_clear_error();
        ct_status rc = tokenizer_encode(tk, text, tlen, strcmp(mode, "all") == 0, &ids, &n);
        const char *err = ct_last_error();
        if (strcmp(want, "!") == 0) {   /* not in NFC: refused, never encoded as it is */
            if (rc == CT_OK || !strstr(err, "not in Unicode NFC at byte")) fail_msg("%s %s: wanted a refusal, got '%s'", tname, hex, err);
            free(text);
            lines++;
            continue;
        }
        if (rc != CT_OK) fail_msg("%s: encode failed: %s", tname, err);
        char got[65536];
        size_t o = 0;
        for (size_t i = 0; i < n && o + 16 < sizeof got; i++) o += (size_t)sprintf(got + o, "%s%d", i ? " " : "", ids[i]);
        got[o] = 0;
        if (strcmp(got, want)) fail_msg("%s %s text %.80s:\n got  %.300s\n want %.300s", tname, mode, hex, got, want);
        if (dec) {
            check_decode(tk, tname, ids, n, dec);
        } else if (tk != gpt2_prefix) {   /* the prefix space stays when decoding, as in the package */
            size_t dlen;
            char *back = tokenizer_decode(tk, ids, n, &dlen);
            assert_non_null(back);
            assert_int_equal(dlen, tlen);
            assert_memory_equal(back, text, tlen);
            free(back);
        }
        free(ids);
        free(text);
        lines++;
    }
    free(g);
    return lines;
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_golden_ids_match_tokenizers_package(void **state) {
    (void)state;
    assert_true(check_golden(NULL, NULL) >= 4 * 2 * 60);
}

/* The older "a b" form of merges gives the same tokenizer as the ["a", "b"] pairs. */
static void test_string_merges_read_like_pairs(void **state) {
    (void)state;
    static const char *const names[] = {"llama3", "gpt2"};
    for (int k = 0; k < 2; k++) {
        char path[128];
        snprintf(path, sizeof path, HF "/%s/tokenizer.json", names[k]);
        json_t *j = json_of(path), *merges = json_object_get(json_object_get(j, "model"), "merges"), *m;
        size_t i;
        json_array_foreach(merges, i, m) {
            char s[256];
            snprintf(s, sizeof s, "%s %s", json_string_value(json_array_get(m, 0)), json_string_value(json_array_get(m, 1)));
            json_array_set_new(merges, i, json_string(s));
        }
        ct_tokenizer *t = load_json(j, "strings");
        json_decref(j);
        if (!t) fail_msg("%s", ct_last_error());
        assert_true(check_golden(names[k], t) >= 100);
        tokenizer_free(t);
    }
}

static void test_folder_layout_bos_eos_and_specials(void **state) {
    (void)state;
    /* Llama 3 layout: tokenizer_config.json names them (eos as {"content": ...}) */
    assert_int_equal(tokenizer_vocab_size(llama3), 1500 + 256);
    assert_int_equal(tokenizer_n_base(llama3), 1500);
    assert_int_equal(tokenizer_bos_id(llama3), 1500);
    assert_int_equal(tokenizer_eos_id(llama3), 1501);
    assert_int_equal(tokenizer_special_id(llama3, "<|eot_id|>"), 1509);
    assert_true(tokenizer_is_special(llama3, 1500) && tokenizer_is_special(llama3, 1755));
    assert_false(tokenizer_is_special(llama3, 0) || tokenizer_is_special(llama3, 1499) ||
                 tokenizer_is_special(llama3, 1756) || tokenizer_is_special(llama3, -1));
    /* GPT-2 layout, no tokenizer_config.json: no BOS, <|endoftext|> the EOS */
    assert_int_equal(tokenizer_vocab_size(gpt2), 1501);
    assert_int_equal(tokenizer_bos_id(gpt2), -1);
    assert_int_equal(tokenizer_eos_id(gpt2), 1500);
    assert_true(tokenizer_is_special(gpt2, 1500));
    /* the same file named directly still reads the tokenizer_config.json beside it */
    ct_tokenizer *t = tokenizer_load(HF "/llama3/tokenizer.json");
    assert_non_null(t);
    assert_int_equal(tokenizer_eos_id(t), 1501);
    tokenizer_free(t);
    /* a config that renames them (GPT-2's own: both <|endoftext|>), and one naming no token */
    size_t len;
    char *g = read_file(HF "/gpt2/tokenizer.json", &len);
    mkdir(path_of("g"), 0755);
    write_file(path_of("g/tokenizer.json"), g, len);
    const char *cfg = "{\"bos_token\": \"<|endoftext|>\", \"eos_token\": {\"content\": \"<|endoftext|>\"}}";
    write_file(path_of("g/tokenizer_config.json"), cfg, strlen(cfg));
    t = tokenizer_load(path_of("g"));
    assert_non_null(t);
    assert_int_equal(tokenizer_bos_id(t), 1500);
    assert_int_equal(tokenizer_eos_id(t), 1500);
    tokenizer_free(t);
    cfg = "{\"bos_token\": null, \"eos_token\": \"<|im_end|>\"}";
    write_file(path_of("g/tokenizer_config.json"), cfg, strlen(cfg));
    assert_null(tokenizer_load(path_of("g")));
    assert_non_null(strstr(ct_last_error(), "tokenizer_config.json: eos_token: \"<|im_end|>\" is not a token of"));
    cfg = "{\"bos_token\": 7}";
    write_file(path_of("g/tokenizer_config.json"), cfg, strlen(cfg));
    assert_null(tokenizer_load(path_of("g")));
    assert_non_null(strstr(ct_last_error(), "tokenizer_config.json: bos_token: 7 is not a string, null or {\"content\": ...}"));
    unlink(path_of("g/tokenizer_config.json"));
    unlink(path_of("g/tokenizer.json"));
    free(g);
    /* a folder with only original/tokenizer.model (tiktoken), and an empty folder */
    g = read_file("tests/data/tokenizer/vocab.tiktoken", &len);
    mkdir(path_of("t"), 0755);
    mkdir(path_of("t/original"), 0755);
    write_file(path_of("t/original/tokenizer.model"), g, len);
    free(g);
    t = tokenizer_load(path_of("t"));
    assert_non_null(t);
    assert_int_equal(tokenizer_vocab_size(t), 1024);
    assert_int_equal(tokenizer_bos_id(t), 768);
    assert_true(tokenizer_is_special(t, 768) && !tokenizer_is_special(t, 767));
    tokenizer_free(t);
    unlink(path_of("t/original/tokenizer.model"));
    rmdir(path_of("t/original"));
    assert_null(tokenizer_load(path_of("t")));
    assert_non_null(strstr(ct_last_error(), "a folder without tokenizer.json, tokenizer.model or original/tokenizer.model"));
    rmdir(path_of("t"));
    rmdir(path_of("g"));
}

/* Loads `content` from a file; the message must be one line starting "path" + where, saying what. */
static void expect_error(const char *content, const char *where, const char *what) {
    char *p = path_of("bad.json");
    write_file(p, content, strlen(content));
    char want[512];
    ct_tokenizer *t = tokenizer_load(p);
    if (t) fail_msg("loaded a bad file; expected '%s'", what);
    const char *err = ct_last_error();
    snprintf(want, sizeof want, "%s%s", p, where);
    if (strncmp(err, want, strlen(want)) || !strstr(err, what) || strchr(err, '\n'))
        fail_msg("message '%s' should be one line starting '%s' and saying '%s'", err, want, what);
    assert_null(tokenizer_load_mem(content, strlen(content), "mem"));
}

/* gpt2's tokenizer.json with one change made by `edit`. */
static void expect_edit_error(void (*edit)(json_t *), const char *where, const char *what) {
    json_t *j = json_of(HF "/gpt2/tokenizer.json");
    edit(j);
    char *s = dump(j);
    json_decref(j);
    expect_error(s, where, what);
    free(s);
}

static json_t *model(json_t *j) { return json_object_get(j, "model"); }
static void wordpiece(json_t *j) { json_object_set_new(model(j), "type", json_string("WordPiece")); }
static void no_merges(json_t *j) { json_object_del(model(j), "merges"); }
static void merge_of_unknown(json_t *j) {
    json_array_set_new(json_object_get(model(j), "merges"), 3, json_pack("[ss]", "zq", "x"));
}
static void merge_to_unknown(json_t *j) {
    json_array_append_new(json_object_get(model(j), "merges"), json_string("q z"));
}
static void metaspace(json_t *j) {
    json_object_set_new(j, "pre_tokenizer", json_pack("{ss}", "type", "Metaspace"));
}
static void split_removed(json_t *j) {
    json_object_set_new(j, "pre_tokenizer", json_pack("{ss s[{ss s{ss} ss sb} {ss sb sb}]}", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex", "\\s+", "behavior", "Removed", "invert", 0,
        "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0));
}
static void bad_regex(json_t *j) {
    json_object_set_new(j, "pre_tokenizer", json_pack("{ss s[{ss s{ss} ss sb} {ss sb sb}]}", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex", "(unclosed", "behavior", "Isolated", "invert", 0,
        "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0));
}
static void nfd(json_t *j) { json_object_set_new(j, "normalizer", json_pack("{ss}", "type", "NFD")); }
static void wordpiece_decoder(json_t *j) { json_object_set_new(j, "decoder", json_pack("{ss}", "type", "WordPiece")); }
static void dup_vocab_id(json_t *j) { json_object_set_new(json_object_get(model(j), "vocab"), "Ġthe", json_integer(5)); }
static void dup_added_id(json_t *j) {
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{si ss sb}", "id", 1500, "content", "<|other|>", "special", 1));
}
static void added_on_vocab_id(json_t *j) {
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{si ss sb}", "id", 40, "content", "<|other|>", "special", 1));
}
static void lstrip(json_t *j) {
    json_object_set_new(json_array_get(json_object_get(j, "added_tokens"), 0), "lstrip", json_true());
}
/* Edits that need "\u0000", which jansson will not hold in a key: they write @NUL@ (see dump). */
static void nul_in_pattern(json_t *j) {
    json_object_set_new(j, "pre_tokenizer", json_pack("{ss s[{ss s{ss} ss sb} {ss sb sb}]}", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex", "a@NUL@b", "behavior", "Isolated", "invert", 0,
        "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0));
}
static void control_key_id(json_t *j) {
    json_object_set_new(json_object_get(model(j), "vocab"), "\x01@NUL@", json_string("7"));
}
static void bad_id(json_t *j) { json_object_set_new(json_object_get(model(j), "vocab"), "Ġthe", json_string("7")); }
static void dropout(json_t *j) { json_object_set_new(model(j), "dropout", json_real(0.1)); }
static void merge_three(json_t *j) { json_array_set_new(json_object_get(model(j), "merges"), 0, json_string("a b c")); }

static void test_bad_files_are_refused_in_one_line(void **state) {
    (void)state;
    expect_error("{ \"model\": ", ":1:", "not valid JSON");
    expect_error("[1, 2]", ": ", "not a tokenizer file");
    expect_error("{\"model\": 1} trailing", ":1:", "not valid JSON");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1, \"a\": 2}}}", ":1:", "duplicate object key");
    expect_error("Hello world, this is text.\n", ": ", "not a tokenizer file: ctitan reads a Hugging Face "
                 "tokenizer.json (a JSON object), a tiktoken vocabulary");
    expect_error("\x89PNG\r\n\x1a\n", ": ", "not a tokenizer file");
    expect_edit_error(wordpiece, ": model.type: ", "\"WordPiece\" is not supported (ctitan reads byte-level \"BPE\" models)");
    expect_edit_error(no_merges, ": model.merges: ", "(missing) is not an array of merges");
    expect_edit_error(merge_of_unknown, ": model.merges[3]: ", "\"zq\" is not a token of model.vocab");
    expect_edit_error(merge_to_unknown, ": model.merges[", "\"qz\" is not a token of model.vocab");
    expect_edit_error(merge_three, ": model.merges[0]: ", "\"a b c\" is not two tokens separated by one space");
    expect_edit_error(metaspace, ": pre_tokenizer.type: ", "\"Metaspace\" is not supported");
    expect_edit_error(split_removed, ": pre_tokenizer.pretokenizers[0].behavior: ", "\"Removed\" is not supported");
    expect_edit_error(bad_regex, ": pre_tokenizer: Split pattern: ", "regex");
    expect_edit_error(nfd, ": normalizer.type: ", "\"NFD\" is not supported (ctitan reads a null or \"NFC\" normalizer)");
    expect_edit_error(wordpiece_decoder, ": decoder.type: ", "\"WordPiece\" is not supported");
    expect_edit_error(dup_vocab_id, ": model.vocab[", "id 5 is also the id of");
    expect_edit_error(dup_added_id, ": added_tokens[1].id: ", "id 1500 is also the id of added_tokens[0]");
    expect_edit_error(added_on_vocab_id, ": added_tokens[1].content: ", "id 40 is already the id of another token");
    expect_edit_error(lstrip, ": added_tokens[0].lstrip: ", "true is not supported");
    expect_edit_error(bad_id, ": model.vocab[\"Ġthe\"]: ", "\"7\" is not a token id");
    expect_edit_error(dropout, ": model.dropout: ", "is not supported");
    /* \u0000 is read through U+FFFF: a file with both, and \u0000 where ctitan needs a C string */
    expect_error("{\"model\": {\"vocab\": {\"\\u0000\": 0,\n \"\\uffff\": 1}}}", ":2:3: ",
                 "U+FFFF in a file that also holds \\u0000: ctitan reads \\u0000");
    expect_edit_error(nul_in_pattern, ": pre_tokenizer.pretokenizers[0].pattern: ",
                      "holds \\u0000, which ctitan cannot hand to its regex engine");
    expect_edit_error(control_key_id, ": model.vocab[\"\\u0001\\u0000\"]: ", "\"7\" is not a token id");
}

/* torchtitan's test tokenizer's shape: a "\u0000" key, raw control characters and spaces, "\\x80"
 * strings, no merges. It loads and says which bytes it drops; every byte string, invalid UTF-8
 * included, encodes to the tokens of those of its bytes that have one, and they decode to those bytes. */
static void test_torchtitan_shape_loads_and_drops_bytes_with_no_token(void **state) {
    (void)state;
    assert_int_equal(tokenizer_vocab_size(torchtitan), 1975);
    assert_int_equal(tokenizer_n_base(torchtitan), 1972);
    assert_int_equal(tokenizer_bos_id(torchtitan), 1973);   /* tokenizer_config.json's */
    assert_int_equal(tokenizer_eos_id(torchtitan), 1974);
    assert_int_equal(tokenizer_special_id(torchtitan, "<|endoftext|>"), 1972);
    assert_true(tokenizer_is_special(torchtitan, 1972) && !tokenizer_is_special(torchtitan, 0));
    size_t len;
    const char *b = tokenizer_token_bytes(torchtitan, 0, &len);   /* "\u0000" */
    assert_int_equal(len, 1);
    assert_int_equal(b[0], 0);
    b = tokenizer_token_bytes(torchtitan, 128, &len);             /* "\\x80": four characters */
    assert_int_equal(len, 4);
    assert_memory_equal(b, "\\x80", 4);
    const char *note = tokenizer_notice(torchtitan);
    if (!note || !strstr(note, "torchtitan/tokenizer.json: 152 of the 256 bytes have no token of their own in "
                               "model.vocab (0x00-0x20, 0x7f-0xb1, ") || !strstr(note, "encoding drops them"))
        fail_msg("notice: %s", note ? note : "(none)");
    assert_null(tokenizer_notice(gpt2));
    assert_null(tokenizer_notice(llama3));
    int have[256], n_have = 0;
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        int32_t *ids;
        size_t n;
        assert_int_equal(tokenizer_encode(torchtitan, &ch, 1, 0, &ids, &n), CT_OK);
        assert_true(n <= 1);
        have[c] = (int)n;
        n_have += have[c];
        if (n) {
            b = tokenizer_token_bytes(torchtitan, ids[0], &len);
            assert_int_equal(len, 1);
            assert_int_equal((unsigned char)b[0], c);
        }
        free(ids);
    }
    assert_int_equal(n_have, 256 - 152);
    assert_true(have['!'] && have['~'] && !have[' '] && !have['\n'] && !have['\t'] && !have[0] && !have[0x80]);
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (int iter = 0; iter < 300; iter++) {
        char buf[300], kept[300];
        size_t n_buf = (size_t)(iter % 97) * 3, n_kept = 0, n, dlen;
        for (size_t i = 0; i < n_buf; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            buf[i] = iter % 2 ? (char)(rng >> 20) : " aé<|>\n\\"[(rng >> 20) % 9];
            if (have[(unsigned char)buf[i]]) kept[n_kept++] = buf[i];
        }
        int32_t *ids;
        assert_int_equal(tokenizer_encode(torchtitan, buf, n_buf, 0, &ids, &n), CT_OK);
        assert_int_equal(n, n_kept);
        char *back = tokenizer_decode(torchtitan, ids, n, &dlen);
        assert_non_null(back);
        assert_int_equal(dlen, n_kept);
        assert_memory_equal(back, kept, n_kept);
        free(back);
        free(ids);
    }
}

/* A key outside the byte alphabet is a token encoding never gives, decoding to its UTF-8 (even when
 * those are another key's bytes); a byte without a token is dropped, and the tokenizer says so. */
static void test_keys_outside_the_alphabet_and_bytes_without_a_token(void **state) {
    (void)state;
    json_t *j = json_of(HF "/gpt2/tokenizer.json"), *vocab = json_object_get(json_object_get(j, "model"), "vocab");
    json_object_set_new(vocab, "\u2581the", json_integer(9999));
    json_object_set_new(vocab, " the", json_integer(9998));   /* the bytes of "Ġthe" too */
    json_object_set_new(vocab, "@NUL@", json_integer(9997));  /* the bytes of "Ā" too */
    ct_tokenizer *t = load_json(j, "outside");
    if (!t) fail_msg("%s", ct_last_error());
    assert_null(tokenizer_notice(t));
    assert_true(check_golden("gpt2", t) >= 100);   /* the package's ids all the same */
    size_t len;
    const char *b = tokenizer_token_bytes(t, 9999, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(b, "\u2581the", 6);
    b = tokenizer_token_bytes(t, 9998, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(b, " the", 4);
    b = tokenizer_token_bytes(t, 9997, &len);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], 0);
    tokenizer_free(t);
    json_object_del(vocab, "\u0100");   /* "Ā": byte 0x00's character (no merge uses it) */
    t = load_json(j, "no-nul");
    json_decref(j);
    if (!t) fail_msg("%s", ct_last_error());
    const char *note = tokenizer_notice(t);
    if (!note || strcmp(note, "no-nul: 1 of the 256 bytes have no token of their own in model.vocab (0x00); like "
                              "the tokenizers package, encoding drops them from the text"))
        fail_msg("notice: %s", note ? note : "(none)");
    int32_t *ids, *a, *c;
    size_t n, na, nc;
    assert_int_equal(tokenizer_encode(t, "a\0b", 3, 0, &ids, &n), CT_OK);   /* GPT-2's regex: "\0" alone */
    assert_int_equal(tokenizer_encode(t, "a", 1, 0, &a, &na), CT_OK);
    assert_int_equal(tokenizer_encode(t, "b", 1, 0, &c, &nc), CT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(na + nc, 2);
    assert_int_equal(ids[0], a[0]);
    assert_int_equal(ids[1], c[0]);
    free(ids);
    free(a);
    free(c);
    assert_int_equal(tokenizer_encode(t, "\0", 1, 0, &ids, &n), CT_OK);
    assert_int_equal(n, 0);
    assert_null(ids);
    tokenizer_free(t);
}

/* jansson refuses NUL in object keys: \u0000 escapes inside strings are read through U+FFFF, in keys,
 * merges and added tokens alike; an escaped backslash is no escape; a file holding U+FFFF too is
 * refused with where it is. */
static void test_nul_is_read_through_a_mark(void **state) {
    (void)state;
    static const struct { const char *in, *out; } masks[] = {
        {"{\"a\": \"b\"}", NULL},
        {"{\"\\u0000\": 0}", "{\"\\uFFFF\": 0}"},
        {"{\"\\\\u0000\": 0}", NULL},                            /* a backslash, then u0000 */
        {"{\"\\\\\\u0000\": 0}", "{\"\\\\\\uFFFF\": 0}"},         /* a backslash, then NUL */
        {"{\"\\\"\\u0000\": \"x\\u0000y\\u0000\"}", "{\"\\\"\\uFFFF\": \"x\\uFFFFy\\uFFFF\"}"},
        {"{\"a\": 1} \\u0000", NULL},                            /* not in a string: jansson's to refuse */
        {"{\"\\u000g\": 0}", NULL},
        {"{\"\\uffff\": 0}", NULL},                              /* U+FFFF alone is plain text */
        {"\"\\u000", NULL},
        {"\"\\u0000", "\"\\uFFFF"},
    };
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        size_t len = strlen(masks[i].in);
        char *in = malloc(len), *out = (char *)1;   /* exactly len bytes: ASan sees a read past them */
        memcpy(in, masks[i].in, len);
        assert_int_equal(hf_json_mask_nul(in, len, "m", &out), CT_OK);
        if (!masks[i].out != !out || (out && memcmp(out, masks[i].out, len)))
            fail_msg("%s: masked as %.*s", masks[i].in, out ? (int)len : 6, out ? out : "(none)");
        free(out);
        free(in);
    }
    static const struct { const char *in, *where; } both[] = {
        {"{\"\\u0000\": 0,\n \"a\\uFFFF\": 1}", "m:2:4: "},
        {"{\"\\u0000\": 0, \"\xef\xbf\xbf\": 1}", "m:1:16: "},
        {"{\"\xef\xbf\xbf\\u0000\": 0}", "m:1:3: "},
    };
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++) {
        char *out = NULL;
        assert_int_equal(hf_json_mask_nul(both[i].in, strlen(both[i].in), "m", &out), CT_ERR_INVALID);
        assert_null(out);
        if (strncmp(ct_last_error(), both[i].where, strlen(both[i].where)) ||
            !strstr(ct_last_error(), "U+FFFF in a file that also holds \\u0000"))
            fail_msg("%s: %s", both[i].in, ct_last_error());
    }
    /* gpt2 with a "\u0000" key, a merge of it, and an added token holding NUL */
    json_t *j = json_of(HF "/gpt2/tokenizer.json"), *m = json_object_get(j, "model");
    json_object_set_new(json_object_get(m, "vocab"), "@NUL@", json_integer(5000));
    json_object_set_new(json_object_get(m, "vocab"), "@NUL@x", json_integer(5001));
    json_array_insert_new(json_object_get(m, "merges"), 0, json_pack("[ss]", "@NUL@", "x"));
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{si ss sb sb}", "id", 5002, "content", "<|x@NUL@|>", "special", 1, "normalized", 0));
    ct_tokenizer *t = load_json(j, "nul");
    json_decref(j);
    if (!t) fail_msg("%s", ct_last_error());
    assert_true(check_golden("gpt2", t) >= 100);
    size_t len;
    const char *b = tokenizer_token_bytes(t, 5001, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(b, "\0x", 2);
    int32_t *ids;
    size_t n;
    assert_int_equal(tokenizer_encode(t, "q<|x\0|>q", 8, 1, &ids, &n), CT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 5002);
    char *back = tokenizer_decode(t, ids, n, &len);
    assert_int_equal(len, 8);
    assert_memory_equal(back, "q<|x\0|>q", 8);
    free(back);
    free(ids);
    tokenizer_free(t);
}

/* Any bytes, invalid UTF-8 included, come back from decode(encode(x)); ids with no token do not decode. */
static void test_any_bytes_roundtrip(void **state) {
    (void)state;
    uint64_t rng = 88172645463325252ull;
    ct_tokenizer *ts[2] = {llama3, gpt2};
    for (int iter = 0; iter < 400; iter++) {
        char buf[300];
        size_t len = (size_t)(iter % 97) * 3;
        for (size_t i = 0; i < len; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            buf[i] = iter % 2 ? (char)(rng >> 20) : " aé<|>\n"[(rng >> 20) % 8];
        }
        for (int k = 0; k < 2; k++) {
            int32_t *ids;
            size_t n, dlen;
            assert_int_equal(tokenizer_encode(ts[k], buf, len, iter % 3 == 0, &ids, &n), CT_OK);
            char *back = tokenizer_decode(ts[k], ids, n, &dlen);
            assert_non_null(back);
            assert_int_equal(dlen, len);
            assert_memory_equal(back, buf, len);
            free(back);
            free(ids);
        }
    }
    int32_t past = 1756;
    assert_null(tokenizer_decode(llama3, &past, 1, NULL));
    assert_non_null(strstr(ct_last_error(), "out of range"));
}

/* Text already in NFC passes (NFC leaves it alone); text NFC would change is caught at its first
 * offending code point. */
static void test_nfc_check(void **state) {
    (void)state;
    static const char *const nfc[] = {
        "", "plain ASCII", "caf\u00e9 \u00c5ngstr\u00f6m", "\u0915\u093c (excluded from composition)",
        "\ud55c\uad6d\uc5b4 \uac00\uac01", "\u03a9 \u00c5", "\u0928\u094d\u092e", "\u1ea5 Vi\u1ec7t",
        "\u0627\u064e\u0644", "emoji \U0001F469\u200d\U0001F467 1\ufe0f\u20e3", "\xff\xfe invalid bytes",
    };
    for (size_t i = 0; i < sizeof nfc / sizeof nfc[0]; i++) {
        size_t at;
        uint32_t cp;
        if (hf_nfc_check((const unsigned char *)nfc[i], strlen(nfc[i]), &at, &cp))
            fail_msg("'%s' is in NFC but was refused at byte %zu (U+%04X)", nfc[i], at, (unsigned)cp);
    }
    static const struct { const char *text; size_t at; uint32_t cp; } not_nfc[] = {
        {"cafe\u0301", 4, 0x301},            /* e + acute composes */
        {"x\u0928\u093c", 4, 0x93c},         /* NA + nukta composes (to U+0929) */
        {"\u1100\u1161", 3, 0x1161},         /* Hangul L + V */
        {"\uac00\u11a8", 3, 0x11a8},         /* Hangul LV + T */
        {"ohm \u2126", 4, 0x2126},           /* a singleton: NFC maps it to U+03A9 */
        {"x\u0301\u0323", 3, 0x323},         /* marks out of canonical order */
        {"\u00e9\u0323", 2, 0x323},          /* a mark after a precomposed letter: cannot tell */
        {"\u0378", 0, 0x378},                /* unassigned */
        {"a\u0323", 1, 0x323},                /* a + dot below composes (to U+1EA1) */
    };
    for (size_t i = 0; i < sizeof not_nfc / sizeof not_nfc[0]; i++) {
        size_t at = 99;
        uint32_t cp = 0;
        assert_int_equal(hf_nfc_check((const unsigned char *)not_nfc[i].text, strlen(not_nfc[i].text), &at, &cp), 1);
        assert_int_equal(at, not_nfc[i].at);
        assert_int_equal(cp, not_nfc[i].cp);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tokenizer_encode(qwen2_nfc, "cafe\u0301", 6, 1, &ids, &n), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "not in Unicode NFC at byte 4 (U+0301"));
    assert_null(ids);
}

/* Encoding speed on the corpus (printed for the README; not a pass/fail bound beyond a loose one). */
static void test_encode_speed(void **state) {
    (void)state;
    size_t len;
    char *corpus = read_file("tests/data/tokenizer/corpus.txt", &len);
    assert_non_null(corpus);
    ct_tokenizer *ts[2] = {llama3, gpt2};
    const char *names[2] = {"llama3", "gpt2"};
    for (int k = 0; k < 2; k++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        size_t total = 0;
        for (int r = 0; r < 5; r++) {
            int32_t *ids;
            size_t n;
            assert_int_equal(tokenizer_encode(ts[k], corpus, len, 0, &ids, &n), CT_OK);
            total += n;
            free(ids);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double dt = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        printf("encode %s: %.2f MB/s (%zu bytes -> %zu tokens, x5 in %.3f s)\n", names[k],
               5.0 * (double)len / 1e6 / dt, len, total / 5, dt);
        assert_true(dt < 30);
    }
    free(corpus);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_ids_match_tokenizers_package),
        cmocka_unit_test(test_string_merges_read_like_pairs),
        cmocka_unit_test(test_folder_layout_bos_eos_and_specials),
        cmocka_unit_test(test_bad_files_are_refused_in_one_line),
        cmocka_unit_test(test_any_bytes_roundtrip),
        cmocka_unit_test(test_torchtitan_shape_loads_and_drops_bytes_with_no_token),
        cmocka_unit_test(test_keys_outside_the_alphabet_and_bytes_without_a_token),
        cmocka_unit_test(test_nul_is_read_through_a_mark),
        cmocka_unit_test(test_nfc_check),
        cmocka_unit_test(test_encode_speed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
