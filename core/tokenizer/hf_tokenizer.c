/* hf_tokenizer.c: a Hugging Face tokenizer.json (and its tokenizer_config.json) checked key by key
 * and turned into an hf_spec for tokenizer_from_hf. What is accepted is listed in hf_tokenizer.h. */
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/unicode_nfc.h"
#include "base/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ID (1 << 24)
#define MAX_TOKEN_TEXT 4096   /* bytes of a merge's joined text; real tokens are far shorter */

/* ---- ByteLevel's alphabet: every byte is shown as one code point ------------------------------- */

/* Bytes that are printable (33..126, 161..172, 174..255) stand for themselves; the other 68 take
 * U+0100.. in byte order. byte_of_cp[code] is the byte + 1, 0 for code points outside the alphabet. */
static void byte_alphabet(int byte_of_cp[324]) {
    memset(byte_of_cp, 0, 324 * sizeof *byte_of_cp);
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_of_cp[printable ? b : next++] = b + 1;
    }
}

/* Decodes one UTF-8 code point of a JSON string (jansson guarantees valid UTF-8). */
static uint32_t utf8_next(const unsigned char **p) {
    const unsigned char *s = *p;
    uint32_t code;
    int n;
    if (s[0] < 0x80) { code = s[0]; n = 1; }
    else if (s[0] < 0xe0) { code = s[0] & 0x1f; n = 2; }
    else if (s[0] < 0xf0) { code = s[0] & 0x0f; n = 3; }
    else { code = s[0] & 0x07; n = 4; }
    for (int i = 1; i < n; i++) code = code << 6 | (s[i] & 0x3f);
    *p = s + n;
    return code;
}

/* ---- \u0000 in the file: read through U+FFFF ------------------------------------------------------ */

/* jansson refuses a NUL in an object key (JSON_ALLOW_NUL covers values only), yet a vocabulary may
 * have the key "\u0000" (torchtitan's test tokenizer gives byte 0 its raw character). So before
 * parsing, each \u0000 escape inside a string becomes \uFFFF: six characters for six, so jansson's
 * line:column stay true. U+FFFF is a noncharacter, which no tokenizer has reason to hold; a file
 * holding both is refused. Where a string's bytes matter (vocabulary keys, added tokens' content) the
 * mark is read back as NUL; where a string is only looked up (merges in the vocabulary) both sides
 * hold the mark. */
#define NUL_MARK "\xef\xbf\xbf"   /* U+FFFF in UTF-8 */

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v << 4 | (unsigned)d;
    }
    return 1;
}

/* The file with its \u0000 escapes rewritten (*masked, malloc'd, len bytes), or *masked NULL when it
 * has none. Only escapes inside strings whose backslash is not itself escaped count ("\\u0000" is a
 * backslash and five characters); anything that is not JSON is left to jansson. */
ct_status hf_json_mask_nul(const char *json, size_t len, const char *label, char **masked) {
    char *copy = NULL;
    size_t line = 1, line_start = 0, mark_line = 0, mark_col = 0;
    int in_string = 0;
    *masked = NULL;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)json[i];
        if (c == '\n') {
            line++;
            line_start = i + 1;
        }
        if (c == '"' || !in_string) {
            if (c == '"') in_string = !in_string;
            continue;
        }
        size_t at = i;
        unsigned v;
        int mark = c == 0xef && len - i >= 3 && memcmp(json + i, NUL_MARK, 3) == 0;
        if (c == '\\' && len - i >= 6 && json[i + 1] == 'u' && hex4(json + i + 2, &v)) {
            if (v == 0) {
                if (!copy) {
                    if (!(copy = malloc(len))) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", label);
                    memcpy(copy, json, len);
                }
                memcpy(copy + i + 2, "FFFF", 4);
            }
            mark = v == 0xffff;
            i += 5;
        } else if (c == '\\') {
            i++;   /* \" and \\ neither end the string nor escape what follows */
        }
        if (mark && !mark_line) {
            mark_line = line;
            mark_col = at - line_start + 1;
        }
    }
    if (copy && mark_line) {
        free(copy);
        return ct_fail(CT_ERR_INVALID, "%s:%zu:%zu: U+FFFF in a file that also holds \\u0000: ctitan reads "
                       "\\u0000 (which its JSON parser refuses in object keys) as U+FFFF and cannot tell the two "
                       "apart", label, mark_line, mark_col);
    }
    *masked = copy;
    return CT_OK;
}

/* A string of the file (len bytes) with the mark read back as NUL when the file was masked; returns
 * the new length (out has room for len bytes). */
static size_t unmask(const char *s, size_t len, int masked, unsigned char *out) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (masked && (unsigned char)s[i] == 0xef && len - i >= 3 && memcmp(s + i, NUL_MARK, 3) == 0) {
            out[n++] = 0;
            i += 2;
        } else {
            out[n++] = (unsigned char)s[i];
        }
    }
    return n;
}

/* A vocabulary key's bytes as the tokenizers package's ByteLevel decoder gives them: each code point
 * through the alphabet when all are in it (*in_alphabet: encoding can give the token), else the key's
 * own UTF-8 (a key outside the alphabet is never produced by encoding). out has room for strlen(key). */
static size_t key_bytes(const int byte_of_cp[324], const char *key, int masked, unsigned char *out,
                        int *in_alphabet) {
    const unsigned char *p = (const unsigned char *)key;
    size_t n = 0;
    while (*p) {
        uint32_t code = utf8_next(&p);
        if (code >= 324 || !byte_of_cp[code]) {
            *in_alphabet = 0;
            return unmask(key, strlen(key), masked, out);
        }
        out[n++] = (unsigned char)(byte_of_cp[code] - 1);
    }
    *in_alphabet = 1;
    return n;
}

/* A key as messages show it: its first 60 bytes, control characters (and the mark, in a masked file)
 * written \u00XX as in JSON. */
static void show_key(const char *key, int masked, char *out, size_t n) {
    size_t o = 0, len = strlen(key);
    for (size_t i = 0; i < len && i < 60 && o + 7 < n; i++) {
        unsigned char c = (unsigned char)key[i];
        if (masked && c == 0xef && len - i >= 3 && memcmp(key + i, NUL_MARK, 3) == 0) {
            o += (size_t)snprintf(out + o, n - o, "\\u0000");
            i += 2;
        } else if (c < 0x20 || c == 0x7f) {
            o += (size_t)snprintf(out + o, n - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = 0;
}

/* ---- reading ----------------------------------------------------------------------------------- */

typedef struct reader {
    const char *label;
    int masked;              /* the file held \u0000, read as NUL_MARK */
    json_t *root, *vocab;
    hf_spec s;
    unsigned char *arena;    /* the vocabulary's bytes */
    unsigned char *encodable; /* per vocab index: the key is in the byte alphabet */
    unsigned char *added_text; /* added tokens' content with the mark read back (masked files) */
    const char **keys;       /* per vocab index: its text in the file */
    int32_t *owner;          /* per id (up to the highest): vocab index + 1, -(added index + 1), or 0 */
    char notice[320];        /* the bytes with no token, when there are some */
} reader;

/* A value shown in a message: strings quoted and cut, other kinds by name. */
static void show(const json_t *v, char *out, size_t n) {
    if (!v) snprintf(out, n, "(missing)");
    else if (json_is_string(v)) snprintf(out, n, "\"%.60s%s\"", json_string_value(v),
                                         json_string_length(v) > 60 ? "..." : "");
    else if (json_is_null(v)) snprintf(out, n, "null");
    else if (json_is_true(v)) snprintf(out, n, "true");
    else if (json_is_false(v)) snprintf(out, n, "false");
    else if (json_is_integer(v)) snprintf(out, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_object(v)) snprintf(out, n, "an object");
    else if (json_is_array(v)) snprintf(out, n, "an array");
    else snprintf(out, n, "a number");
}

/* Sets "label: key: <value> what" and returns CT_ERR_INVALID. The readers below return CT_OK, or a
 * status with their line set. */
static ct_status bad(reader *r, const char *key, const json_t *v, const char *what) {
    char shown[96];
    show(v, shown, sizeof shown);
    ct_set_error("%s: %s: %s %s", r->label, key, shown, what);
    return CT_ERR_INVALID;
}

/* A boolean that may be absent (dflt). */
static ct_status get_bool(reader *r, const json_t *obj, const char *name, const char *key, int dflt, int *out) {
    const json_t *v = json_object_get(obj, name);
    if (!v) { *out = dflt; return CT_OK; }
    if (!json_is_boolean(v)) return bad(r, key, v, "is not true or false");
    *out = json_is_true(v);
    return CT_OK;
}

/* Keys that must be absent, null, false, 0 or "" (features ctitan does not implement). */
static ct_status must_be_off(reader *r, const json_t *obj, const char *name, const char *key) {
    const json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v) || json_is_false(v) || (json_is_string(v) && !json_string_length(v)) ||
        (json_is_number(v) && json_number_value(v) == 0))
        return CT_OK;
    return bad(r, key, v, "is not supported (ctitan reads it only when null, false or empty)");
}

static ct_status read_model(reader *r) {
    const json_t *m = json_object_get(r->root, "model");
    if (!json_is_object(m)) return bad(r, "model", m, "is not an object with the tokenizer's model");
    const json_t *type = json_object_get(m, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "BPE"))
        return bad(r, "model.type", type, "is not supported (ctitan reads byte-level \"BPE\" models)");
    if (must_be_off(r, m, "dropout", "model.dropout") != CT_OK ||
        must_be_off(r, m, "continuing_subword_prefix", "model.continuing_subword_prefix") != CT_OK ||
        must_be_off(r, m, "end_of_word_suffix", "model.end_of_word_suffix") != CT_OK ||
        get_bool(r, m, "ignore_merges", "model.ignore_merges", 0, &r->s.ignore_merges) != CT_OK)
        return CT_ERR_INVALID;
    r->vocab = json_object_get(m, "vocab");
    if (!json_is_object(r->vocab) || json_object_size(r->vocab) == 0)
        return bad(r, "model.vocab", r->vocab, "is not a non-empty object of token -> id");
    return CT_OK;
}

/* Bytes whose alphabet character is no key: the tokenizers package drops them from the text (no
 * unk_token, no byte_fallback) and so does ctitan, but it says so once, in r->notice. */
static void note_missing_bytes(reader *r, const int have_byte[256]) {
    int missing = 0, ranges = 0;
    char list[160];
    size_t o = 0;
    for (int b = 0; b < 256; b++) missing += !have_byte[b];
    if (!missing) return;
    for (int b = 0; b < 256; b++) {
        if (have_byte[b]) continue;
        int e = b;
        while (e + 1 < 256 && !have_byte[e + 1]) e++;
        if (ranges++ == 6) {
            o += (size_t)snprintf(list + o, sizeof list - o, ", ...");
            break;
        }
        o += (size_t)snprintf(list + o, sizeof list - o, e > b ? "%s0x%02x-0x%02x" : "%s0x%02x", o ? ", " : "", b, e);
        b = e;
    }
    static const struct { int byte; const char *name; } named[] = {{' ', "space"}, {'\n', "newline"}, {'\t', "tab"}};
    char names[40] = "";
    int k = 0;
    for (int i = 0; i < 3; i++)
        if (!have_byte[named[i].byte])
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k++ ? ", " : "; ", named[i].name);
    if (k) strcat(names, " among them");
    snprintf(r->notice, sizeof r->notice, "%s: %d of the 256 bytes have no token of their own in model.vocab "
             "(%s%s); like the tokenizers package, encoding drops them from the text", r->label, missing, list, names);
    r->s.notice = r->notice;
}

static ct_status read_vocab(reader *r) {
    int byte_of_cp[324];
    byte_alphabet(byte_of_cp);
    size_t n = json_object_size(r->vocab), bytes = 0;
    const char *key;
    json_t *v;
    json_int_t max_id = 0;   /* owner[] covers every id seen, vocab and added */
    json_object_foreach(r->vocab, key, v) {
        bytes += strlen(key);
        if (json_is_integer(v) && json_integer_value(v) > max_id && json_integer_value(v) < MAX_ID)
            max_id = json_integer_value(v);
    }
    const json_t *added = json_object_get(r->root, "added_tokens"), *a;
    size_t ai;
    json_array_foreach(added, ai, a) {
        const json_t *id = json_object_get(a, "id");
        if (json_is_integer(id) && json_integer_value(id) > max_id && json_integer_value(id) < MAX_ID)
            max_id = json_integer_value(id);
    }
    r->arena = malloc(bytes + 1);
    r->s.vocab_bytes = malloc(n * sizeof *r->s.vocab_bytes);
    r->s.vocab_len = malloc(n * sizeof *r->s.vocab_len);
    r->s.vocab_id = malloc(n * sizeof *r->s.vocab_id);
    r->keys = malloc(n * sizeof *r->keys);
    r->encodable = malloc(n);
    r->owner = calloc((size_t)max_id + 1, sizeof *r->owner);
    if (!r->arena || !r->s.vocab_bytes || !r->s.vocab_len || !r->s.vocab_id || !r->keys || !r->encodable ||
        !r->owner) {
        ct_set_error("%s: out of memory reading model.vocab", r->label);
        return CT_ERR_NOMEM;
    }
    size_t i = 0, o = 0;
    int have_byte[256] = {0};
    json_object_foreach(r->vocab, key, v) {
        char k[460], shown[400];
        show_key(key, r->masked, shown, sizeof shown);
        snprintf(k, sizeof k, "model.vocab[\"%s\"]", shown);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
            return bad(r, k, v, "is not a token id (an integer 0..16777215)");
        int32_t id = (int32_t)json_integer_value(v);
        if (r->owner[id]) {
            show_key(r->keys[r->owner[id] - 1], r->masked, shown, sizeof shown);
            ct_set_error("%s: %s: id %d is also the id of \"%s\" (ids must be unique)", r->label, k, id, shown);
            return CT_ERR_INVALID;
        }
        int in_alphabet;
        size_t blen = key_bytes(byte_of_cp, key, r->masked, r->arena + o, &in_alphabet);
        if (blen == 0) {
            ct_set_error("%s: %s: an empty token", r->label, k);
            return CT_ERR_INVALID;
        }
        if (blen == 1 && in_alphabet) have_byte[r->arena[o]] = 1;
        r->s.vocab_bytes[i] = r->arena + o;
        r->s.vocab_len[i] = (uint32_t)blen;
        r->s.vocab_id[i] = id;
        r->encodable[i] = (unsigned char)in_alphabet;
        r->keys[i] = key;
        r->owner[id] = (int32_t)i + 1;
        o += (size_t)blen;
        i++;
    }
    r->s.n_vocab = n;
    r->s.vocab_encodable = r->encodable;
    note_missing_bytes(r, have_byte);
    return CT_OK;
}

/* The id of a vocab token's text, or -1 with a message. */
static int32_t vocab_id(reader *r, const char *key, const char *text, size_t len) {
    char buf[MAX_TOKEN_TEXT];
    if (len >= sizeof buf) {
        ct_set_error("%s: %s: a token of %zu bytes, more than the %d read", r->label, key, len,
                     MAX_TOKEN_TEXT - 1);
        return -1;
    }
    memcpy(buf, text, len);
    buf[len] = 0;
    const json_t *v = json_object_get(r->vocab, buf);
    if (!v) {
        ct_set_error("%s: %s: \"%.*s\" is not a token of model.vocab", r->label, key,
                     (int)(len > 60 ? 60 : len), text);
        return -1;
    }
    return (int32_t)json_integer_value(v);
}

static ct_status read_merges(reader *r) {
    const json_t *m = json_object_get(json_object_get(r->root, "model"), "merges");
    if (!json_is_array(m)) return bad(r, "model.merges", m, "is not an array of merges (\"a b\" or [\"a\", \"b\"])");
    size_t n = json_array_size(m);
    r->s.merges = malloc((n ? n : 1) * sizeof *r->s.merges);
    if (!r->s.merges) {
        ct_set_error("%s: out of memory reading model.merges", r->label);
        return CT_ERR_NOMEM;
    }
    char joined[MAX_TOKEN_TEXT];
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(m, i);
        char key[48];
        snprintf(key, sizeof key, "model.merges[%zu]", i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = strchr(a, ' ');
            if (!sp || sp == a || !sp[1] || strchr(sp + 1, ' '))
                return bad(r, key, e, "is not two tokens separated by one space");
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            al = strlen(a);
            bl = strlen(b);
        } else {
            return bad(r, key, e, "is not a merge (\"a b\" or [\"a\", \"b\"])");
        }
        if (al + bl >= sizeof joined) return bad(r, key, e, "joins into a token too long to read");
        int32_t ia = vocab_id(r, key, a, al), ib = ia < 0 ? -1 : vocab_id(r, key, b, bl);
        if (ib < 0) return CT_ERR_INVALID;
        memcpy(joined, a, al);
        memcpy(joined + al, b, bl);
        int32_t ij = vocab_id(r, key, joined, al + bl);
        if (ij < 0) return CT_ERR_INVALID;
        r->s.merges[i][0] = ia;
        r->s.merges[i][1] = ib;
        r->s.merges[i][2] = ij;
    }
    r->s.n_merges = n;
    return CT_OK;
}

static ct_status read_added(reader *r) {
    const json_t *a = json_object_get(r->root, "added_tokens");
    if (!a || json_is_null(a)) return CT_OK;
    if (!json_is_array(a)) return bad(r, "added_tokens", a, "is not an array");
    size_t n = json_array_size(a), room = 0, used = 0;
    for (size_t i = 0; r->masked && i < n; i++)
        room += json_string_length(json_object_get(json_array_get(a, i), "content"));
    r->s.added = calloc(n ? n : 1, sizeof *r->s.added);
    r->added_text = malloc(room ? room : 1);
    if (!r->s.added || !r->added_text) {
        ct_set_error("%s: out of memory reading added_tokens", r->label);
        return CT_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(a, i);
        char key[64];
        snprintf(key, sizeof key, "added_tokens[%zu]", i);
        if (!json_is_object(t)) return bad(r, key, t, "is not an object");
        const json_t *id = json_object_get(t, "id"), *content = json_object_get(t, "content");
        char k2[96];
        snprintf(k2, sizeof k2, "%s.id", key);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_ID)
            return bad(r, k2, id, "is not a token id (an integer 0..16777215)");
        snprintf(k2, sizeof k2, "%s.content", key);
        if (!json_is_string(content) || !json_string_length(content))
            return bad(r, k2, content, "is not a non-empty string");
        hf_added *e = &r->s.added[i];
        e->content = (const unsigned char *)json_string_value(content);
        e->len = json_string_length(content);
        if (r->masked) {   /* its bytes are matched in the text: the mark back to NUL */
            e->len = unmask(json_string_value(content), e->len, 1, r->added_text + used);
            e->content = r->added_text + used;
            used += e->len;
        }
        e->id = (int32_t)json_integer_value(id);
        char kb[96];
        snprintf(kb, sizeof kb, "%s.special", key);
        if (get_bool(r, t, "special", kb, 0, &e->special) != CT_OK) return CT_ERR_INVALID;
        snprintf(kb, sizeof kb, "%s.normalized", key);
        if (get_bool(r, t, "normalized", kb, !e->special, &e->normalized) != CT_OK) return CT_ERR_INVALID;
        static const char *const off[] = {"single_word", "lstrip", "rstrip"};
        for (int k = 0; k < 3; k++) {
            snprintf(kb, sizeof kb, "%s.%s", key, off[k]);
            if (must_be_off(r, t, off[k], kb) != CT_OK) return CT_ERR_INVALID;
        }
        int32_t own = r->owner[e->id];
        if (own > 0) {
            /* the id is a vocab token's: only the same text may name it (GPT-2's <|endoftext|>) */
            const json_t *vid = json_object_get(r->vocab, json_string_value(content));
            if (!vid || json_integer_value(vid) != e->id) {
                ct_set_error("%s: %s: id %d is already the id of another token in "
                             "model.vocab (ids must be unique)", r->label, k2, e->id);
                return CT_ERR_INVALID;
            }
        } else if (own < 0) {
            ct_set_error("%s: %s.id: id %d is also the id of added_tokens[%d] (ids must "
                         "be unique)", r->label, key, e->id, -own - 1);
            return CT_ERR_INVALID;
        } else {
            const json_t *vid = json_object_get(r->vocab, json_string_value(content));
            if (vid) {
                ct_set_error("%s: %s: \"%.60s\" has id %d here but %lld in model.vocab",
                             r->label, k2, json_string_value(content), e->id, (long long)json_integer_value(vid));
                return CT_ERR_INVALID;
            }
            r->owner[e->id] = -(int32_t)i - 1;
        }
    }
    r->s.n_added = n;
    return CT_OK;
}

static ct_status read_byte_level(reader *r, const json_t *p, const char *key) {
    char k[96];
    snprintf(k, sizeof k, "%s.add_prefix_space", key);
    if (get_bool(r, p, "add_prefix_space", k, 1, &r->s.add_prefix_space) != CT_OK) return CT_ERR_INVALID;
    snprintf(k, sizeof k, "%s.use_regex", key);
    return get_bool(r, p, "use_regex", k, 1, &r->s.byte_level_regex);
}

static ct_status read_split(reader *r, const json_t *p, const char *key) {
    char k[96];
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    snprintf(k, sizeof k, "%s.pattern", key);
    const char *text = json_string_value(json_is_string(re) ? re : str);
    if (r->masked && text && strstr(text, NUL_MARK))
        return bad(r, k, pat, "holds \\u0000, which ctitan cannot hand to its regex engine");
    if (json_is_string(re)) {
        r->s.split_pattern = json_string_value(re);
    } else if (json_is_string(str)) {
        r->s.split_pattern = json_string_value(str);
        r->s.split_literal = 1;
    } else {
        return bad(r, k, pat, "is not {\"Regex\": ...} or {\"String\": ...}");
    }
    const json_t *beh = json_object_get(p, "behavior");
    snprintf(k, sizeof k, "%s.behavior", key);
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
        return bad(r, k, beh, "is not supported (ctitan reads \"Isolated\")");
    snprintf(k, sizeof k, "%s.invert", key);
    return must_be_off(r, p, "invert", k);
}

static const char *type_of(const json_t *o) { return json_string_value(json_object_get(o, "type")); }

static ct_status read_pre_tokenizer(reader *r) {
    static const char expect[] = "is not supported (ctitan reads ByteLevel, or a Sequence of a Split "
                                 "and a ByteLevel)";
    const json_t *p = json_object_get(r->root, "pre_tokenizer");
    const char *t = type_of(p);
    if (t && strcmp(t, "ByteLevel") == 0) return read_byte_level(r, p, "pre_tokenizer");
    if (!t || strcmp(t, "Sequence")) return bad(r, "pre_tokenizer.type", t ? json_object_get(p, "type") : p, expect);
    const json_t *list = json_object_get(p, "pretokenizers");
    size_t n = json_array_size(list);
    if (n < 1 || n > 2) return bad(r, "pre_tokenizer.pretokenizers", list, "does not hold one or two pre-tokenizers "
                                   "(ctitan reads a Split then a ByteLevel)");
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(list, i);
        char key[64];
        snprintf(key, sizeof key, "pre_tokenizer.pretokenizers[%zu]", i);
        const char *et = type_of(e);
        if (et && strcmp(et, "Split") == 0 && i + 1 < n) {
            if (read_split(r, e, key) != CT_OK) return CT_ERR_INVALID;
        } else if (et && strcmp(et, "ByteLevel") == 0 && i + 1 == n) {
            if (read_byte_level(r, e, key) != CT_OK) return CT_ERR_INVALID;
        } else {
            strcat(key, ".type");
            return bad(r, key, et ? json_object_get(e, "type") : e, expect);
        }
    }
    return CT_OK;
}

static ct_status read_other_keys(reader *r) {
    const json_t *norm = json_object_get(r->root, "normalizer");
    const char *nt = type_of(norm);
    if (nt && strcmp(nt, "NFC") == 0)
        r->s.nfc = 1;   /* Qwen2's: text must already be in NFC (hf_nfc_check) */
    else if (norm && !json_is_null(norm))
        return bad(r, "normalizer.type", json_is_object(norm) ? json_object_get(norm, "type") : norm,
                   "is not supported (ctitan reads a null or \"NFC\" normalizer)");
    const json_t *dec = json_object_get(r->root, "decoder");
    if (dec && !json_is_null(dec) && (!type_of(dec) || strcmp(type_of(dec), "ByteLevel")))
        return bad(r, "decoder.type", json_is_object(dec) ? json_object_get(dec, "type") : dec,
                   "is not supported (ctitan reads null or \"ByteLevel\")");
    return CT_OK;
}

/* ---- BOS / EOS --------------------------------------------------------------------------------- */

/* The id of a token's text (an added token or a vocab token), or -1. */
static int32_t token_id(reader *r, const char *text) {
    if (r->masked && strstr(text, NUL_MARK)) return -1;   /* U+FFFF stands for NUL in the file's keys */
    for (size_t i = 0; i < r->s.n_added; i++)
        if (strlen(text) == r->s.added[i].len && memcmp(text, r->s.added[i].content, r->s.added[i].len) == 0)
            return r->s.added[i].id;
    const json_t *v = json_object_get(r->vocab, text);
    return v ? (int32_t)json_integer_value(v) : -1;
}

/* bos_token / eos_token of tokenizer_config.json: 1 = set (*id, -1 for null), 0 = absent, -1 = bad. */
static int config_token(reader *r, const char *cpath, json_t *cfg, const char *name, int32_t *id) {
    const json_t *v = json_object_get(cfg, name);
    if (!v) return 0;
    if (json_is_null(v)) { *id = -1; return 1; }
    const json_t *c = json_is_object(v) ? json_object_get(v, "content") : v;
    if (!json_is_string(c)) {
        char shown[96];
        show(v, shown, sizeof shown);
        ct_set_error("%s: %s: %s is not a string, null or {\"content\": ...}", cpath, name, shown);
        return -1;
    }
    *id = token_id(r, json_string_value(c));
    if (*id < 0) {
        ct_set_error("%s: %s: \"%.60s\" is not a token of %s", cpath, name,
                     json_string_value(c), r->label);
        return -1;
    }
    return 1;
}

static ct_status read_bos_eos(reader *r, const char *config_path) {
    r->s.bos = token_id(r, "<|begin_of_text|>");
    r->s.eos = token_id(r, "<|end_of_text|>");
    if (r->s.eos < 0) r->s.eos = token_id(r, "<|endoftext|>");
    FILE *f = config_path ? fopen(config_path, "rb") : NULL;
    if (!f) return CT_OK;   /* no tokenizer_config.json: the well-known names */
    json_error_t je;
    json_t *cfg = json_loadf(f, 0, &je);
    fclose(f);
    if (!cfg) {
        ct_set_error("%s:%d:%d: not valid JSON: %s", config_path, je.line, je.column, je.text);
        return CT_ERR_INVALID;
    }
    ct_status st = CT_ERR_INVALID;
    if (!json_is_object(cfg)) {
        ct_set_error("%s: is not a JSON object", config_path);
    } else if (config_token(r, config_path, cfg, "bos_token", &r->s.bos) >= 0 &&
               config_token(r, config_path, cfg, "eos_token", &r->s.eos) >= 0) {
        st = CT_OK;
    }
    json_decref(cfg);
    return st;
}

ct_tokenizer *hf_tokenizer_load_json(const char *json, size_t len, const char *label, const char *config_path) {
    reader r = {.label = label};
    ct_tokenizer *tok = NULL;
    json_error_t je;
    char *masked;
    if (hf_json_mask_nul(json, len, label, &masked) != CT_OK) return NULL;
    r.masked = masked != NULL;
    r.root = json_loadb(masked ? masked : json, len, JSON_REJECT_DUPLICATES, &je);
    free(masked);
    if (!r.root) {
        ct_set_error("%s:%d:%d: not valid JSON: %s", label, je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(r.root)) {
        ct_set_error("%s: is not a JSON object (a tokenizer.json holds one)", label);
        goto done;
    }
    if (read_model(&r) != CT_OK || read_other_keys(&r) != CT_OK || read_pre_tokenizer(&r) != CT_OK ||
        read_vocab(&r) != CT_OK || read_merges(&r) != CT_OK || read_added(&r) != CT_OK ||
        read_bos_eos(&r, config_path) != CT_OK)
        goto done;
    tok = tokenizer_from_hf(&r.s, label);
done:
    free(r.arena);
    free(r.encodable);
    free(r.added_text);
    free(r.owner);
    free(r.keys);
    free(r.s.vocab_bytes);
    free(r.s.vocab_len);
    free(r.s.vocab_id);
    free(r.s.merges);
    free(r.s.added);
    json_decref(r.root);
    return tok;
}

/* ---- NFC: is the text already normalised? ------------------------------------------------------- */

static void nfc_props(uint32_t code, int *ccc, int *flags) {
    size_t lo = 0, hi = sizeof nfc_ranges / sizeof nfc_ranges[0];
    *ccc = *flags = 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (code < nfc_ranges[mid].first) hi = mid;
        else if (code > nfc_ranges[mid].last) lo = mid + 1;
        else {
            *ccc = nfc_ranges[mid].ccc;
            *flags = nfc_ranges[mid].flags;
            return;
        }
    }
}

static int sorted_has32(const uint32_t *a, size_t n, uint32_t v) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a[mid] == v) return 1;
        if (a[mid] < v) lo = mid + 1; else hi = mid;
    }
    return 0;
}

/* The second of some composite (NFC_Quick_Check=Maybe): the table, Hangul vowels and trailing consonants. */
static int nfc_is_second(uint32_t code) {
    return (code >= 0x1161 && code <= 0x1175) || (code >= 0x11A8 && code <= 0x11C2) ||
           sorted_has32(nfc_seconds, sizeof nfc_seconds / sizeof nfc_seconds[0], code);
}

static int nfc_composes(uint32_t first, uint32_t second) {
    if (first >= 0x1100 && first <= 0x1112 && second >= 0x1161 && second <= 0x1175) return 1;   /* L + V */
    if (first >= 0xAC00 && first <= 0xD7A3 && (first - 0xAC00) % 28 == 0 && second >= 0x11A8 && second <= 0x11C2)
        return 1;   /* LV + T */
    uint64_t key = (uint64_t)first << 21 | second;
    size_t lo = 0, hi = sizeof nfc_pairs / sizeof nfc_pairs[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (nfc_pairs[mid] == key) return 1;
        if (nfc_pairs[mid] < key) lo = mid + 1; else hi = mid;
    }
    return 0;
}

/* Length of the valid UTF-8 sequence at s and its code point, 0 if none (overlong, surrogate ...). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *code) {
    unsigned char c = s[0];
    size_t need;
    if (c < 0x80) { *code = c; return 1; }
    if (c >= 0xc2 && c <= 0xdf) { need = 2; *code = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { need = 3; *code = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { need = 4; *code = c & 0x07; }
    else return 0;
    if (n < need) return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        *code = *code << 6 | (s[i] & 0x3f);
    }
    if ((need == 3 && (*code < 0x800 || (*code >= 0xd800 && *code <= 0xdfff))) || (need == 4 && (*code < 0x10000 || *code > 0x10ffff)))
        return 0;
    return need;
}

int hf_nfc_check(const unsigned char *s, size_t n, size_t *at, uint32_t *bad_cp) {
    int have_starter = 0, starter_decomp = 0, last_ccc = 0, max_between = 0, n_between = 0;
    uint32_t starter = 0;
    for (size_t i = 0; i < n;) {
        uint32_t code;
        size_t k = utf8_decode(s + i, n - i, &code);
        if (k == 0) {   /* not text: encoded byte by byte, nothing composes across it */
            have_starter = 0;
            last_ccc = 0;
            i++;
            continue;
        }
        int ccc, flags;
        nfc_props(code, &ccc, &flags);
        int bad = (flags & (NFC_NO | NFC_UNASSIGNED)) != 0 || (ccc && last_ccc > ccc) ||
                  /* a mark after a precomposed letter might reorder with the letter's own marks */
                  (ccc && have_starter && starter_decomp);
        if (!bad && have_starter && nfc_is_second(code)) {
            int blocked = ccc == 0 ? n_between > 0 : max_between >= ccc;
            bad = !blocked && nfc_composes(starter, code);
        }
        if (bad) {
            *at = i;
            *bad_cp = code;
            return 1;
        }
        if (ccc == 0) {
            have_starter = 1;
            starter = code;
            starter_decomp = (flags & NFC_DECOMP) != 0;
            n_between = max_between = 0;
        } else {
            n_between++;
            if (ccc > max_between) max_between = ccc;
        }
        last_ccc = ccc;
        i += k;
    }
    return 0;
}
