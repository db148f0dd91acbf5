/* tokenizer.c: loads a tiktoken vocabulary or (through hf_tokenizer.c) a Hugging Face tokenizer.json,
 * splits text with the pre-tokenizer's regex, BPE-merges by rank. The formats and the encoding rules
 * are described in tokenizer.h and hf_tokenizer.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"
#include "tokenizer/hf_tokenizer.h"
#include "base/error.h"
#include "base/util.h"

#include <sys/stat.h>
#include <errno.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_RANK UINT32_MAX
#define MAX_FILE_BYTES (1u << 30)   /* token offsets are u32 */

/* ---- special tokens ---------------------------------------------------------------------------- */

/* Llama 3.1's named specials; the rest are <|reserved_special_token_3|> ... _247|>. */
static const char *const special_named[] = {
    "<|begin_of_text|>",           "<|end_of_text|>",  "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
    "<|start_header_id|>",          "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>",                   "<|python_tag|>",
};
#define N_NAMED ((int)(sizeof special_named / sizeof special_named[0]))

static char special_reserved[TOKENIZER_N_SPECIAL - N_NAMED][40];
static pthread_once_t special_once = PTHREAD_ONCE_INIT;

static void special_init(void) {
    for (int i = N_NAMED; i < TOKENIZER_N_SPECIAL; i++)
        snprintf(special_reserved[i - N_NAMED], sizeof special_reserved[0],
                 "<|reserved_special_token_%d|>", i - N_NAMED + 3);
}

const char *tokenizer_special_name(int i) {
    if (i < 0 || i >= TOKENIZER_N_SPECIAL) return NULL;
    if (i < N_NAMED) return special_named[i];
    pthread_once(&special_once, special_init);
    return special_reserved[i - N_NAMED];
}

/* ---- a hash set of byte strings, each named by an index into (arena, off[], len[]) ------------ */

typedef struct bmap {
    uint32_t *slots;        /* index + 1; 0 = empty */
    uint32_t mask;
    const unsigned char *arena;
    const uint32_t *off, *len;
} bmap;

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}

/* CT_OK, or CT_ERR_NOMEM with nothing set (the caller names the file). */
static ct_status bmap_init(bmap *m, size_t n, const unsigned char *arena, const uint32_t *off,
                           const uint32_t *len) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return CT_ERR_NOMEM;
    m->mask = (uint32_t)(cap - 1);
    m->arena = arena;
    m->off = off;
    m->len = len;
    return CT_OK;
}

/* Index of the string equal to (p, n), or -1. */
static int64_t bmap_get(const bmap *m, const unsigned char *p, size_t n) {
    for (uint64_t i = hash_bytes(p, n) & m->mask;; i = (i + 1) & m->mask) {
        uint32_t s = m->slots[i];
        if (s == 0) return -1;
        uint32_t k = s - 1;
        if (m->len[k] == n && memcmp(m->arena + m->off[k], p, n) == 0) return k;
    }
}

/* Inserts index k; returns k, or the index already holding the same bytes. */
static int64_t bmap_put(bmap *m, uint32_t k) {
    const unsigned char *p = m->arena + m->off[k];
    size_t n = m->len[k];
    for (uint64_t i = hash_bytes(p, n) & m->mask;; i = (i + 1) & m->mask) {
        uint32_t s = m->slots[i];
        if (s == 0) {
            m->slots[i] = k + 1;
            return k;
        }
        if (m->len[s - 1] == n && memcmp(m->arena + m->off[s - 1], p, n) == 0) return s - 1;
    }
}

/* ---- the tokenizer object ----------------------------------------------------------------------- */

/* (left id, right id) -> (merge rank, merged id), open addressing; a tokenizer.json's merges. */
typedef struct pmap {
    uint64_t *keys;         /* left << 32 | right; PMAP_EMPTY = free */
    uint32_t *rank;
    int32_t *id;
    uint32_t mask;
} pmap;

#define PMAP_EMPTY UINT64_MAX

/* CT_OK, or CT_ERR_NOMEM with nothing set (the caller names the file). */
static ct_status pmap_init(pmap *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    m->keys = malloc(cap * sizeof *m->keys);
    m->rank = malloc(cap * sizeof *m->rank);
    m->id = malloc(cap * sizeof *m->id);
    if (!m->keys || !m->rank || !m->id) return CT_ERR_NOMEM;
    memset(m->keys, 0xff, cap * sizeof *m->keys);
    m->mask = (uint32_t)(cap - 1);
    return CT_OK;
}

static uint64_t pmap_slot(const pmap *m, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    uint64_t i = (h ^ (h >> 29)) & m->mask;
    while (m->keys[i] != PMAP_EMPTY && m->keys[i] != key) i = (i + 1) & m->mask;
    return i;
}

/* A later merge of the same pair replaces the earlier one, as the tokenizers package's map does. */
static void pmap_put(pmap *m, int32_t left, int32_t right, uint32_t rank, int32_t id) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right, i = pmap_slot(m, key);
    m->keys[i] = key;
    m->rank[i] = rank;
    m->id[i] = id;
}

/* The merge of (left, right): its rank, and its merged id in *id; NO_RANK if none. */
static uint32_t pmap_get(const pmap *m, int32_t left, int32_t right, int32_t *id) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right, i = pmap_slot(m, key);
    if (m->keys[i] == PMAP_EMPTY) return NO_RANK;
    *id = m->id[i];
    return m->rank[i];
}

/* What an id is (tokenizer.json ids may leave gaps). */
enum { ID_NONE = 0, ID_BASE = 1, ID_ADDED = 2, ID_SPECIAL = 3 };

struct ct_tokenizer {
    int hf;                 /* 0: tiktoken; 1: tokenizer.json */
    int n_base;             /* base tokens (tiktoken ranks, or model.vocab's tokens) */
    int vocab;              /* highest id + 1 */
    int bos, eos;           /* -1 when there is none */
    unsigned char *arena;   /* token bytes: base tokens, then special names / added tokens' text */
    uint32_t *off, *len;    /* per id */
    unsigned char *kind;    /* per id: ID_* */
    bmap ranks;             /* base token bytes -> id (= rank for tiktoken) */
    bmap specials;          /* tiktoken: special text -> id */
    uint32_t byte_rank[256];
    ct_pretok *pretok;      /* tiktoken: Llama 3's regex; hf: the Split's, or NULL */
    /* tokenizer.json only */
    ct_pretok *byte_level;  /* ByteLevel's GPT-2 regex (use_regex), or NULL */
    int add_prefix_space, ignore_merges, nfc;
    pmap merges;
    size_t n_added;
    uint32_t *added_off, *added_len; /* the added tokens' text in the arena, by added index */
    int32_t *added_id;
    unsigned char *added_special;
    bmap added[2];          /* text -> added index; [0] normalized=false (matched first), [1] true */
    unsigned char added_first[2][256];   /* a byte that starts some added token of the class */
    uint32_t *added_lens[2];             /* distinct lengths of the class, longest first */
    size_t n_added_lens[2];
    char *notice;           /* hf_spec's, or NULL */
};

void tokenizer_free(ct_tokenizer *tok) {
    if (!tok) return;
    free(tok->arena);
    free(tok->off);
    free(tok->len);
    free(tok->kind);
    free(tok->notice);
    free(tok->ranks.slots);
    free(tok->specials.slots);
    pretok_free(tok->pretok);
    pretok_free(tok->byte_level);
    free(tok->merges.keys);
    free(tok->merges.rank);
    free(tok->merges.id);
    free(tok->added_off);
    free(tok->added_len);
    free(tok->added_id);
    free(tok->added_special);
    for (int c = 0; c < 2; c++) {
        free(tok->added[c].slots);
        free(tok->added_lens[c]);
    }
    free(tok);
}

int tokenizer_vocab_size(const ct_tokenizer *tok) { return tok->vocab; }
int tokenizer_n_base(const ct_tokenizer *tok) { return tok->n_base; }
int tokenizer_bos_id(const ct_tokenizer *tok) { return tok->bos; }
int tokenizer_eos_id(const ct_tokenizer *tok) { return tok->eos; }
const char *tokenizer_notice(const ct_tokenizer *tok) { return tok->notice; }

int tokenizer_is_special(const ct_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->vocab && tok->kind[id] == ID_SPECIAL;
}

const char *tokenizer_token_bytes(const ct_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->vocab || tok->kind[id] == ID_NONE) return NULL;
    if (len) *len = tok->len[id];
    return (const char *)tok->arena + tok->off[id];
}

int tokenizer_special_id(const ct_tokenizer *tok, const char *name) {
    size_t n = strlen(name);
    if (tok->hf) {
        for (int c = 0; c < 2; c++) {
            int64_t k = tok->added[c].slots ? bmap_get(&tok->added[c], (const unsigned char *)name, n) : -1;
            if (k >= 0) return tok->added_id[k];
        }
        return -1;
    }
    int64_t k = bmap_get(&tok->specials, (const unsigned char *)name, n);
    return k < 0 ? -1 : (int)k;
}

/* ---- loading ----------------------------------------------------------------------------------- */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict standard base64 with '=' padding; the unused bits of the last group must be zero.
 * Returns the decoded length, or -1 with a reason. */
static long b64_decode(const unsigned char *s, size_t n, unsigned char *out, const char **why) {
    if (n == 0) { *why = "empty token"; return -1; }
    if (n % 4) { *why = "bad base64 (length is not a multiple of 4)"; return -1; }
    size_t pad = 0;
    if (s[n - 1] == '=') pad++;
    if (n >= 2 && s[n - 2] == '=') pad++;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            int last_group = i + 4 == n;
            if (last_group && j >= 4 - (int)pad) { v[j] = 0; continue; }
            v[j] = b64_value(s[i + j]);
            if (v[j] < 0) {
                *why = s[i + j] == '=' ? "bad base64 ('=' before the end)"
                                       : "bad base64 (a character outside A-Z a-z 0-9 + /)";
                return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        int bytes = i + 4 == n ? 3 - (int)pad : 3;
        if ((bytes == 1 && (w & 0xffff)) || (bytes == 2 && (w & 0xff))) {
            *why = "bad base64 (non-zero padding bits)";
            return -1;
        }
        out[o++] = (unsigned char)(w >> 16);
        if (bytes > 1) out[o++] = (unsigned char)(w >> 8);
        if (bytes > 2) out[o++] = (unsigned char)w;
    }
    return o;
}

/* A printable, bounded rendering of token bytes for messages. */
static void show_bytes(const unsigned char *p, size_t n, char *out, size_t outlen) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < outlen; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\'' && p[i] != '\\') out[o++] = (char)p[i];
        else o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", p[i]);
        if (i + 1 < n && o + 8 >= outlen) { memcpy(out + o, "...", 3); o += 3; break; }
    }
    out[o] = 0;
}

typedef struct line_iter {
    const char *p, *end;
    long lineno;
} line_iter;

/* The next line without its "\n" (or "\r\n"); 0 at the end. */
static int next_line(line_iter *it, const char **s, size_t *n) {
    if (it->p >= it->end) return 0;
    const char *nl = memchr(it->p, '\n', (size_t)(it->end - it->p));
    const char *e = nl ? nl : it->end;
    *s = it->p;
    *n = (size_t)(e - it->p);
    if (*n && (*s)[*n - 1] == '\r') (*n)--;
    it->p = nl ? nl + 1 : it->end;
    it->lineno++;
    return 1;
}

/* Parses "<base64> <rank>" lines into tok (arena, off, len, ranks). */
static ct_status load_lines(ct_tokenizer *tok, const char *data, size_t size, const char *label,
                            uint32_t *line_of) {
    line_iter it = {data, data + size, 0};
    const char *s;
    size_t n;
    uint32_t used = 0;   /* arena bytes */
    while (next_line(&it, &s, &n)) {
        if (n == 0) continue;
        const char *sp = memchr(s, ' ', n);
        if (!sp) return ct_fail(CT_ERR_INVALID, "%s:%ld: missing rank (expected '<base64> <rank>')", label, it.lineno);
        const char *r = sp + 1, *rend = s + n;
        if (r == rend)
            return ct_fail(CT_ERR_INVALID, "%s:%ld: missing rank (expected '<base64> <rank>')", label, it.lineno);
        uint64_t rank = 0;
        for (const char *q = r; q < rend; q++) {
            if (*q < '0' || *q > '9')
                return ct_fail(CT_ERR_INVALID, "%s:%ld: rank is not a non-negative decimal integer "
                               "(expected '<base64> <rank>')", label, it.lineno);
            rank = rank * 10 + (uint64_t)(*q - '0');
            if (rank > (uint64_t)tok->n_base) break;
        }
        if (rank >= (uint64_t)tok->n_base)
            return ct_fail(CT_ERR_INVALID, "%s:%ld: rank %.*s out of range: the file has %d tokens, so ranks "
                           "must run 0..%d", label, it.lineno, (int)(rend - r > 20 ? 20 : rend - r), r,
                           tok->n_base, tok->n_base - 1);
        if (line_of[rank])
            return ct_fail(CT_ERR_INVALID, "%s:%ld: rank %llu already used on line %u (ranks must be "
                           "0..n-1, each once)", label, it.lineno, (unsigned long long)rank, line_of[rank]);
        const char *why = NULL;
        long blen = b64_decode((const unsigned char *)s, (size_t)(sp - s), tok->arena + used, &why);
        if (blen < 0) return ct_fail(CT_ERR_INVALID, "%s:%ld: %s", label, it.lineno, why);
        tok->off[rank] = used;
        tok->len[rank] = (uint32_t)blen;
        int64_t k = bmap_put(&tok->ranks, (uint32_t)rank);
        if (k != (int64_t)rank) {
            char shown[64];
            show_bytes(tok->arena + used, (size_t)blen, shown, sizeof shown);
            return ct_fail(CT_ERR_INVALID, "%s:%ld: duplicate token '%s' (also rank %lld on line %u)", label,
                           it.lineno, shown, (long long)k, line_of[k]);
        }
        line_of[rank] = (uint32_t)it.lineno;
        used += (uint32_t)blen;
    }
    return CT_OK;
}

/* The special tokens after the base ones. CT_OK, or CT_ERR_NOMEM with nothing set. */
static ct_status add_specials(ct_tokenizer *tok, size_t base_bytes) {
    size_t o = base_bytes;
    for (int i = 0; i < TOKENIZER_N_SPECIAL; i++) {
        const char *name = tokenizer_special_name(i);
        size_t n = strlen(name);
        memcpy(tok->arena + o, name, n);
        tok->off[tok->n_base + i] = (uint32_t)o;
        tok->len[tok->n_base + i] = (uint32_t)n;
        o += n;
    }
    if (bmap_init(&tok->specials, TOKENIZER_N_SPECIAL, tok->arena, tok->off, tok->len) != CT_OK) return CT_ERR_NOMEM;
    for (int i = 0; i < TOKENIZER_N_SPECIAL; i++) bmap_put(&tok->specials, (uint32_t)(tok->n_base + i));
    memset(tok->kind, ID_BASE, (size_t)tok->n_base);
    memset(tok->kind + tok->n_base, ID_SPECIAL, TOKENIZER_N_SPECIAL);
    tok->vocab = tok->n_base + TOKENIZER_N_SPECIAL;
    tok->bos = tok->n_base + TOKENIZER_BEGIN_OF_TEXT;
    tok->eos = tok->n_base + TOKENIZER_END_OF_TEXT;
    return CT_OK;
}

static ct_tokenizer *tiktoken_load_mem(const char *data, size_t size, const char *label) {
    if (size > MAX_FILE_BYTES) {
        ct_set_error("%s: file too large (%zu bytes; at most %u)", label, size, MAX_FILE_BYTES);
        return NULL;
    }
    /* Count non-empty lines: that is the number of tokens, so every rank must be below it. */
    long count = 0;
    line_iter it = {data, data + size, 0};
    const char *s;
    size_t n;
    while (next_line(&it, &s, &n)) count += n > 0;
    if (count == 0) {
        ct_set_error("%s: empty vocabulary file (no '<base64> <rank>' lines)", label);
        return NULL;
    }
    if (count > TOKENIZER_MAX_BASE) {
        ct_set_error("%s: %ld tokens, more than the %d allowed", label, count, TOKENIZER_MAX_BASE);
        return NULL;
    }
    ct_tokenizer *tok = calloc(1, sizeof *tok);
    uint32_t *line_of = calloc((size_t)count, sizeof *line_of);
    size_t special_bytes = 40 * TOKENIZER_N_SPECIAL;
    if (!tok || !line_of) goto oom;
    tok->n_base = (int)count;
    size_t ids = (size_t)count + TOKENIZER_N_SPECIAL;
    tok->arena = malloc(size + special_bytes);
    tok->off = malloc(ids * sizeof *tok->off);
    tok->len = malloc(ids * sizeof *tok->len);
    tok->kind = malloc(ids);
    if (!tok->arena || !tok->off || !tok->len || !tok->kind) goto oom;
    if (bmap_init(&tok->ranks, (size_t)count, tok->arena, tok->off, tok->len) != CT_OK) goto oom;
    if (load_lines(tok, data, size, label, line_of) != CT_OK) goto fail;
    /* Every rank below count was seen once (count lines, no duplicates, none out of range). */
    size_t base_bytes = 0;
    for (long r = 0; r < count; r++) base_bytes += tok->len[r];
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        int64_t k = bmap_get(&tok->ranks, &c, 1);
        if (k < 0) {
            ct_set_error("%s: no token for byte 0x%02x (a byte-level BPE vocabulary must "
                         "hold all 256 single bytes)", label, b);
            goto fail;
        }
        tok->byte_rank[b] = (uint32_t)k;
    }
    if (add_specials(tok, base_bytes) != CT_OK) goto oom;
    tok->pretok = pretok_create();
    if (!tok->pretok) goto fail;
    free(line_of);
    return tok;
oom:
    ct_set_error("%s: out of memory loading the vocabulary", label);
fail:
    free(line_of);
    tokenizer_free(tok);
    return NULL;
}

/* The whole file, NUL-terminated; NULL with a message. */
static char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ct_set_error("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > MAX_FILE_BYTES) {
                ct_set_error("%s: file too large (more than %u bytes)", path, MAX_FILE_BYTES);
                goto fail;
            }
            cap = cap ? cap * 2 : 1 << 16;
            char *nb = realloc(buf, cap);
            if (!nb) {
                ct_set_error("%s: out of memory reading the file", path);
                goto fail;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        ct_set_error("%s: read error: %s", path, strerror(errno));
        goto fail;
    }
    fclose(f);
    buf[len] = 0;
    *size = len;
    return buf;
fail:
    fclose(f);
    free(buf);
    return NULL;
}

static int is_b64(unsigned char c) { return b64_value(c) >= 0 || c == '='; }

/* Which format the bytes hold: 'j' (a JSON object), 't' (tiktoken: the first non-empty line is
 * "<base64> <rank>", or there is no such line), 0 (neither). */
static int sniff(const char *data, size_t size) {
    size_t i = 0;
    if (size >= 3 && memcmp(data, "\xef\xbb\xbf", 3) == 0) i = 3;   /* a UTF-8 byte-order mark */
    while (i < size && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n')) i++;
    if (i < size && data[i] == '{') return 'j';
    line_iter it = {data, data + size, 0};
    const char *s;
    size_t n;
    while (next_line(&it, &s, &n) && n == 0) {}
    if (it.lineno == 0 || n == 0) return 't';   /* empty: the tiktoken reader says so */
    size_t k = 0;
    while (k < n && is_b64((unsigned char)s[k])) k++;
    if (k == 0 || k == n || s[k] != ' ' || k + 1 == n) return 0;
    for (k++; k < n; k++)
        if (s[k] < '0' || s[k] > '9') return 0;
    return 't';
}

static ct_tokenizer *load_bytes(const char *data, size_t size, const char *label, const char *config) {
    switch (sniff(data, size)) {
    case 'j': return hf_tokenizer_load_json(data, size, label, config);
    case 't': return tiktoken_load_mem(data, size, label);
    }
    ct_set_error("%s: not a tokenizer file: ctitan reads a Hugging Face tokenizer.json (a JSON "
                 "object), a tiktoken vocabulary ('<base64> <rank>' lines, Llama 3's tokenizer.model), or a "
                 "folder holding tokenizer.json or tokenizer.model", label);
    return NULL;
}

ct_tokenizer *tokenizer_load_mem(const char *data, size_t size, const char *label) {
    return load_bytes(data, size, label, NULL);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static ct_tokenizer *load_file(const char *path, const char *config) {
    size_t len = 0;
    char *buf = read_all(path, &len);
    if (!buf) return NULL;
    ct_tokenizer *tok = load_bytes(buf, len, path, config);
    free(buf);
    return tok;
}

/* A model folder (torchtitan's model.hf_assets_path, a Hub download): tokenizer.json with its
 * tokenizer_config.json, else tiktoken's tokenizer.model or original/tokenizer.model. */
static ct_tokenizer *load_folder(const char *dir) {
    static const char *const tiktoken[] = {"tokenizer.model", "original/tokenizer.model"};
    char path[4096], config[4096];
    const char *sep = dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/";
    snprintf(path, sizeof path, "%s%stokenizer.json", dir, sep);
    if (is_file(path)) {
        snprintf(config, sizeof config, "%s%stokenizer_config.json", dir, sep);
        return load_file(path, config);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s%s%s", dir, sep, tiktoken[i]);
        if (is_file(path)) return load_file(path, NULL);
    }
    ct_set_error("%s: a folder without tokenizer.json, tokenizer.model or original/tokenizer.model "
                 "(the tokenizer files ctitan reads)", dir);
    return NULL;
}

ct_tokenizer *tokenizer_load(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return load_folder(path);
    /* a tokenizer.json named directly still takes bos/eos from the tokenizer_config.json beside it */
    char config[4096];
    const char *slash = strrchr(path, '/');
    snprintf(config, sizeof config, "%.*stokenizer_config.json", slash ? (int)(slash - path + 1) : 0, path);
    return load_file(path, config);
}

/* ---- the pre-tokenizer ------------------------------------------------------------------------- */

struct ct_pretok {
    pcre2_code *code;
    pcre2_match_context *mctx;   /* read-only once made, so threads may share it */
};

ct_pretok *pretok_create(void) { return pretok_create_pattern(TOKENIZER_LLAMA3_PATTERN, 0); }

ct_pretok *pretok_create_pattern(const char *pattern, int literal) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &ec, &eo, NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        ct_set_error("pre-tokenizer regex: %s at offset %zu", (const char *)msg, (size_t)eo);
        return NULL;
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);   /* optional: the interpreter is the fallback */
    ct_pretok *pt = malloc(sizeof *pt);
    pcre2_match_context *mctx = pcre2_match_context_create(NULL);
    if (!pt || !mctx) {
        pcre2_code_free(code);
        pcre2_match_context_free(mctx);
        free(pt);
        ct_set_error("pre-tokenizer: out of memory");
        return NULL;
    }
    /* No alternative of the known patterns backtracks more than the length of the run it matches (a
     * run of n spaces before a letter costs n steps in \s*[\r\n]+), so the work is linear; PCRE2's
     * default limits (10M steps) would refuse runs of whitespace longer than that. Another pattern
     * from a tokenizer.json keeps the defaults: a pathological one fails with a message, not a hang. */
    if (!literal && (strcmp(pattern, TOKENIZER_LLAMA3_PATTERN) == 0 || strcmp(pattern, HF_GPT2_PATTERN) == 0 ||
                     strcmp(pattern, HF_QWEN2_PATTERN) == 0)) {
        pcre2_set_match_limit(mctx, UINT32_MAX);
        pcre2_set_depth_limit(mctx, UINT32_MAX);
        pcre2_set_heap_limit(mctx, UINT32_MAX);
    }
    pt->code = code;
    pt->mctx = mctx;
    return pt;
}

void pretok_free(ct_pretok *pt) {
    if (!pt) return;
    pcre2_code_free(pt->code);
    pcre2_match_context_free(pt->mctx);
    free(pt);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if s does not start one. Same rules as
 * PCRE2's check: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint32_t code;
    if (c >= 0xc2 && c <= 0xdf) { need = 2; code = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { need = 3; code = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { need = 4; code = c & 0x07; }
    else return 0;
    if (n < need) return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        code = code << 6 | (s[i] & 0x3f);
    }
    if (need == 3 && (code < 0x800 || (code >= 0xd800 && code <= 0xdfff))) return 0;
    if (need == 4 && (code < 0x10000 || code > 0x10ffff)) return 0;
    return need;
}

/* Runs the regex over a run of valid UTF-8: as pretok_split. */
static ct_status split_valid(const ct_pretok *pt, const unsigned char *s, size_t len, pcre2_match_data *md,
                             pretok_chunk_fn fn, void *ctx) {
    size_t off = 0;
    while (off < len) {
        int rc = pcre2_match(pt->code, s, len, off, PCRE2_NO_UTF_CHECK, md, pt->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)   /* a pathological run: the interpreter uses the heap */
            rc = pcre2_match(pt->code, s, len, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, pt->mctx);
        size_t ms, me;
        if (rc == PCRE2_ERROR_NOMATCH) {
            ms = me = len;
        } else if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ct_fail(CT_ERR_INVALID, "pre-tokenizer: regex match failed at byte %zu: %s", off,
                           (const char *)msg);
        } else {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
        }
        /* The pattern matches at every character, so there are no gaps and no empty matches; if
         * there were, the bytes still become chunks so that nothing is lost. */
        if (ms > off) {
            ct_status st = fn(ctx, s + off, ms - off);
            if (st != CT_OK) return st;
        }
        if (me == ms) {
            if (ms >= len) break;
            me = ms + utf8_seq(s + ms, len - ms);
        }
        ct_status st = fn(ctx, s + ms, me - ms);
        if (st != CT_OK) return st;
        off = me;
    }
    return CT_OK;
}

ct_status pretok_split(const ct_pretok *pt, const char *text, size_t len, pretok_chunk_fn fn, void *ctx) {
    const unsigned char *s = (const unsigned char *)text;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(pt->code, NULL);
    if (!md) return ct_fail(CT_ERR_NOMEM, "pre-tokenizer: out of memory");
    ct_status st = CT_OK;
    size_t i = 0;
    while (i < len && st == CT_OK) {
        size_t start = i;
        for (size_t k; i < len && (k = utf8_seq(s + i, len - i)) != 0;) i += k;
        if (i > start) st = split_valid(pt, s + start, i - start, md, fn, ctx);
        if (st == CT_OK && i < len) st = fn(ctx, s + i++, 1);   /* an invalid byte: a chunk of its own */
    }
    pcre2_match_data_free(md);
    return st;
}

/* ---- BPE --------------------------------------------------------------------------------------- */

/* Scratch for merging one chunk of n bytes. Parts are named by the offset of their first byte. */
typedef struct bpe_scratch {
    size_t cap;
    uint32_t *next, *prev;
    uint32_t *pair_rank;    /* rank of part i joined with the part after it, or NO_RANK */
    uint32_t *part_rank;    /* rank of part i itself */
    uint64_t *heap;         /* (pair rank << 32 | part), min first: lowest rank, then leftmost */
} bpe_scratch;

static void scratch_free(bpe_scratch *s) {
    free(s->next);
    free(s->prev);
    free(s->pair_rank);
    free(s->part_rank);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

/* Room for a chunk of n bytes. CT_OK, or CT_ERR_NOMEM with nothing set (the encoder says it). */
static ct_status scratch_reserve(bpe_scratch *s, size_t n) {
    if (n <= s->cap) return CT_OK;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    scratch_free(s);
    s->next = malloc(cap * sizeof *s->next);
    s->prev = malloc(cap * sizeof *s->prev);
    s->pair_rank = malloc(cap * sizeof *s->pair_rank);
    s->part_rank = malloc(cap * sizeof *s->part_rank);
    s->heap = malloc(3 * cap * sizeof *s->heap);
    if (!s->next || !s->prev || !s->pair_rank || !s->part_rank || !s->heap) {
        scratch_free(s);
        return CT_ERR_NOMEM;
    }
    s->cap = cap;
    return CT_OK;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

static uint32_t rank_of(const ct_tokenizer *tok, const unsigned char *p, size_t n) {
    int64_t k = bmap_get(&tok->ranks, p, n);
    return k < 0 ? NO_RANK : (uint32_t)k;
}

/* tiktoken's byte_pair_merge with a heap instead of a rescan per merge: the same merges in the same
 * order (lowest rank first, leftmost on ties), O(n log n) rather than O(n^2) on long chunks. */
static size_t bpe_merge(const ct_tokenizer *tok, const unsigned char *c, size_t n, bpe_scratch *s,
                        int32_t *out) {
    if (n == 1) {
        out[0] = (int32_t)tok->byte_rank[c[0]];
        return 1;
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        s->next[i] = (uint32_t)(i + 1);
        s->prev[i] = (uint32_t)i - 1;
        s->part_rank[i] = tok->byte_rank[c[i]];
        s->pair_rank[i] = i + 1 < n ? rank_of(tok, c + i, 2) : NO_RANK;
        if (s->pair_rank[i] != NO_RANK) heap_push(s->heap, &hn, (uint64_t)s->pair_rank[i] << 32 | i);
    }
    while (hn) {
        uint64_t e = heap_pop(s->heap, &hn);
        uint32_t r = (uint32_t)(e >> 32), i = (uint32_t)e;
        if (s->pair_rank[i] != r) continue;   /* stale: part i merged or re-paired since */
        uint32_t j = s->next[i], k = s->next[j];
        s->part_rank[i] = r;
        s->pair_rank[j] = NO_RANK;            /* j is gone */
        s->next[i] = k;
        if (k < n) s->prev[k] = i;
        s->pair_rank[i] = k < n ? rank_of(tok, c + i, s->next[k] - i) : NO_RANK;
        if (s->pair_rank[i] != NO_RANK) heap_push(s->heap, &hn, (uint64_t)s->pair_rank[i] << 32 | i);
        if (i > 0) {
            uint32_t p = s->prev[i];
            s->pair_rank[p] = rank_of(tok, c + p, k - p);
            if (s->pair_rank[p] != NO_RANK) heap_push(s->heap, &hn, (uint64_t)s->pair_rank[p] << 32 | p);
        }
    }
    size_t m = 0;
    for (uint32_t i = 0; i < n; i = s->next[i]) out[m++] = (int32_t)s->part_rank[i];
    return m;
}

static size_t hf_merge(const ct_tokenizer *tok, const unsigned char *c, size_t n, bpe_scratch *s, int32_t *out);

size_t tokenizer_bpe_chunk(const ct_tokenizer *tok, const unsigned char *chunk, size_t len,
                           int32_t *out) {
    if (len == 0) return 0;
    bpe_scratch s = {0};
    if (scratch_reserve(&s, len) != CT_OK) return 0;
    size_t m = tok->hf ? hf_merge(tok, chunk, len, &s, out) : bpe_merge(tok, chunk, len, &s, out);
    scratch_free(&s);
    return m;
}

/* ---- encoding ---------------------------------------------------------------------------------- */

typedef struct encoder {
    const ct_tokenizer *tok;
    int32_t *ids;
    size_t n, cap;
    bpe_scratch s;
} encoder;

/* The encoder's steps return CT_ERR_NOMEM with nothing set when out of memory (tokenizer_encode says
 * it); a refusal or a regex failure comes with its line. */
static ct_status enc_reserve(encoder *e, size_t more) {
    if (e->n + more <= e->cap) return CT_OK;
    size_t cap = e->cap ? e->cap : 256;
    while (cap < e->n + more) cap *= 2;
    int32_t *ids = realloc(e->ids, cap * sizeof *ids);
    if (!ids) return CT_ERR_NOMEM;
    e->ids = ids;
    e->cap = cap;
    return CT_OK;
}

static ct_status enc_chunk(void *ctx, const unsigned char *c, size_t n) {
    encoder *e = ctx;
    if (enc_reserve(e, n) != CT_OK) return CT_ERR_NOMEM;
    uint32_t r = rank_of(e->tok, c, n);
    if (r != NO_RANK) {
        e->ids[e->n++] = (int32_t)r;
        return CT_OK;
    }
    if (scratch_reserve(&e->s, n) != CT_OK) return CT_ERR_NOMEM;
    e->n += bpe_merge(e->tok, c, n, &e->s, e->ids + e->n);
    return CT_OK;
}

/* Next special token at or after from: its start in *at and its id; -1 if none. */
static int find_special(const ct_tokenizer *tok, const char *t, size_t len, size_t from, size_t *at) {
    const char *q = NULL;   /* the first "|>" after the last "<|" looked at */
    while (from + 4 <= len) {
        const char *p = memmem(t + from, len - from, "<|", 2);
        if (!p) return -1;
        size_t ps = (size_t)(p - t);
        /* A special is "<|name|>" and no name holds "|>", so it can only end at the first "|>". */
        if (!q || q < p + 2) q = ps + 2 < len ? memmem(p + 2, len - ps - 2, "|>", 2) : NULL;
        if (!q) return -1;
        int64_t k = bmap_get(&tok->specials, (const unsigned char *)p, (size_t)(q + 2 - p));
        if (k >= 0) {
            *at = ps;
            return (int)k;
        }
        from = ps + 1;
    }
    return -1;
}

/* ---- tokenizer.json: added tokens, the pre-tokenizer stages, merges by merge rank --------------- */

/* The tokenizers package's BPE (Word::merge_all): merges are looked up by the pair of ids, not by the
 * joined bytes, and the pair with the lowest merge rank goes first (leftmost on ties). Same heap and
 * linked list as bpe_merge; part_rank holds ids here, pair_rank merge ranks. */
static size_t hf_merge(const ct_tokenizer *tok, const unsigned char *c, size_t len, bpe_scratch *s,
                       int32_t *out) {
    size_t hn = 0, n = 0;
    int32_t merged;
    /* a byte with no token of its own is dropped, and its neighbours may merge (the package's merge_word) */
    for (size_t i = 0; i < len; i++)
        if (tok->byte_rank[c[i]] != NO_RANK) s->part_rank[n++] = tok->byte_rank[c[i]];
    for (size_t i = 0; i < n; i++) {
        s->next[i] = (uint32_t)(i + 1);
        s->prev[i] = (uint32_t)i - 1;
        s->pair_rank[i] = i + 1 < n ? pmap_get(&tok->merges, (int32_t)s->part_rank[i],
                                               (int32_t)s->part_rank[i + 1], &merged) : NO_RANK;
        if (s->pair_rank[i] != NO_RANK) heap_push(s->heap, &hn, (uint64_t)s->pair_rank[i] << 32 | i);
    }
    while (hn) {
        uint64_t e = heap_pop(s->heap, &hn);
        uint32_t r = (uint32_t)(e >> 32), i = (uint32_t)e;
        if (s->pair_rank[i] != r) continue;   /* stale: part i or its neighbour changed since */
        uint32_t j = s->next[i], k = s->next[j];
        pmap_get(&tok->merges, (int32_t)s->part_rank[i], (int32_t)s->part_rank[j], &merged);
        s->part_rank[i] = (uint32_t)merged;
        s->pair_rank[j] = NO_RANK;
        s->next[i] = k;
        if (k < n) s->prev[k] = i;
        s->pair_rank[i] = k < n ? pmap_get(&tok->merges, merged, (int32_t)s->part_rank[k], &merged) : NO_RANK;
        if (s->pair_rank[i] != NO_RANK) heap_push(s->heap, &hn, (uint64_t)s->pair_rank[i] << 32 | i);
        if (i > 0) {
            uint32_t p = s->prev[i];
            s->pair_rank[p] = pmap_get(&tok->merges, (int32_t)s->part_rank[p], (int32_t)s->part_rank[i], &merged);
            if (s->pair_rank[p] != NO_RANK) heap_push(s->heap, &hn, (uint64_t)s->pair_rank[p] << 32 | p);
        }
    }
    size_t m = 0;
    for (uint32_t i = 0; i < n; i = s->next[i]) out[m++] = (int32_t)s->part_rank[i];
    return m;
}

typedef struct hf_encoder {
    encoder e;
    int allow_special;
    unsigned char *buf;     /* a piece with ByteLevel's prefix space */
    size_t bufcap;
} hf_encoder;

static ct_status hf_chunk(void *ctx, const unsigned char *c, size_t n) {
    encoder *e = ctx;
    if (enc_reserve(e, n) != CT_OK) return CT_ERR_NOMEM;
    if (e->tok->ignore_merges) {
        int64_t k = bmap_get(&e->tok->ranks, c, n);
        if (k >= 0) {
            e->ids[e->n++] = (int32_t)k;
            return CT_OK;
        }
    }
    if (scratch_reserve(&e->s, n) != CT_OK) return CT_ERR_NOMEM;
    e->n += hf_merge(e->tok, c, n, &e->s, e->ids + e->n);
    return CT_OK;
}

/* ByteLevel: the prefix space, then GPT-2's regex (use_regex) or the piece whole. */
static ct_status hf_byte_level(void *ctx, const unsigned char *c, size_t n) {
    hf_encoder *h = ctx;
    const ct_tokenizer *tok = h->e.tok;
    if (n == 0) return CT_OK;
    if (tok->add_prefix_space && c[0] != ' ') {
        if (n + 1 > h->bufcap) {
            size_t cap = 2 * (n + 1);
            unsigned char *nb = realloc(h->buf, cap);
            if (!nb) return CT_ERR_NOMEM;
            h->buf = nb;
            h->bufcap = cap;
        }
        h->buf[0] = ' ';
        memcpy(h->buf + 1, c, n);
        c = h->buf;
        n++;
    }
    if (!tok->byte_level) return hf_chunk(&h->e, c, n);
    /* the prefixed piece lives in buf, which a nested piece does not touch: hf_chunk does not */
    return pretok_split(tok->byte_level, (const char *)c, n, hf_chunk, &h->e);
}

static ct_status hf_byte_level_cb(void *ctx, const unsigned char *c, size_t n) { return hf_byte_level(ctx, c, n); }

/* Text between added tokens: the Split stage (if any), then ByteLevel. */
static ct_status hf_pieces(hf_encoder *h, const unsigned char *t, size_t n) {
    if (n == 0) return CT_OK;
    if (!h->e.tok->pretok) return hf_byte_level(h, t, n);
    return pretok_split(h->e.tok->pretok, (const char *)t, n, hf_byte_level_cb, h);
}

/* Leftmost-longest added token of class cls at or after from: its added index, its start in *at. */
static int64_t find_added(const ct_tokenizer *tok, int cls, const unsigned char *t, size_t len, size_t from,
                          size_t *at) {
    if (!tok->n_added_lens[cls]) return -1;
    for (size_t p = from; p < len; p++) {
        if (!tok->added_first[cls][t[p]]) continue;
        for (size_t i = 0; i < tok->n_added_lens[cls]; i++) {
            uint32_t L = tok->added_lens[cls][i];
            if (L > len - p) continue;
            int64_t k = bmap_get(&tok->added[cls], t + p, L);
            if (k >= 0) {
                *at = p;
                return k;
            }
        }
    }
    return -1;
}

/* The tokenizers package's AddedVocabulary: the text is cut at the normalized=false tokens, the pieces
 * between at the normalized=true ones, and what is left is pre-tokenized. A special token's text is
 * plain text unless allow_special (the package's encode_special_tokens = !allow_special). */
static ct_status hf_split_added(hf_encoder *h, int cls, const unsigned char *t, size_t len) {
    const ct_tokenizer *tok = h->e.tok;
    size_t seg = 0, from = 0, at;
    int64_t k;
    while ((k = find_added(tok, cls, t, len, from, &at)) >= 0) {
        from = at + tok->added_len[k];
        if (tok->added_special[k] && !h->allow_special) continue;
        ct_status st = cls == 0 ? hf_split_added(h, 1, t + seg, at - seg) : hf_pieces(h, t + seg, at - seg);
        if (st != CT_OK) return st;
        if (enc_reserve(&h->e, 1) != CT_OK) return CT_ERR_NOMEM;
        h->e.ids[h->e.n++] = tok->added_id[k];
        seg = from;
    }
    return cls == 0 ? hf_split_added(h, 1, t + seg, len - seg) : hf_pieces(h, t + seg, len - seg);
}

static ct_status hf_encode(const ct_tokenizer *tok, const char *text, size_t len, int allow_special, encoder *e) {
    size_t at;
    uint32_t code;
    if (tok->nfc && hf_nfc_check((const unsigned char *)text, len, &at, &code))
        return ct_fail(CT_ERR_INVALID, "tokenizer: the text is not in Unicode NFC at byte %zu (U+%04X, or it cannot "
                       "be told without normalising); this tokenizer.json's normalizer is NFC, which ctitan does "
                       "not apply: normalise the text to NFC first", at, (unsigned)code);
    hf_encoder h = {.e = *e, .allow_special = allow_special};
    ct_status st = hf_split_added(&h, 0, (const unsigned char *)text, len);
    *e = h.e;
    free(h.buf);
    return st;
}

ct_status tokenizer_encode(const ct_tokenizer *tok, const char *text, size_t len, int allow_special,
                           int32_t **ids, size_t *n) {
    encoder e = {.tok = tok};
    size_t start = 0;
    ct_status st = tok->hf ? hf_encode(tok, text, len, allow_special, &e) : CT_OK;
    while (st == CT_OK && !tok->hf) {
        size_t at = len;
        int sid = allow_special ? find_special(tok, text, len, start, &at) : -1;
        if (sid < 0) at = len;
        st = pretok_split(tok->pretok, text + start, at - start, enc_chunk, &e);
        if (st != CT_OK || sid < 0) break;
        if ((st = enc_reserve(&e, 1)) != CT_OK) break;
        e.ids[e.n++] = sid;
        start = at + tok->len[sid];
    }
    scratch_free(&e.s);
    if (st != CT_OK) {
        free(e.ids);
        *ids = NULL;
        *n = 0;
        if (st == CT_ERR_NOMEM) return ct_fail(CT_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
        return st;   /* text it refuses, or the regex failed on it (CT_ERR_INVALID): the message is set */
    }
    if (e.n == 0) {
        free(e.ids);
        e.ids = NULL;
    }
    *ids = e.ids;
    *n = e.n;
    return CT_OK;
}

char *tokenizer_decode(const ct_tokenizer *tok, const int32_t *ids, size_t n, size_t *len) {
    int vocab = tokenizer_vocab_size(tok);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            ct_set_error("token id %ld (position %zu) out of range: vocabulary size is %d", (long)ids[i], i, vocab);
            return NULL;
        }
        if (tok->kind[ids[i]] == ID_NONE) {
            ct_set_error("token id %ld (position %zu) is not a token: the tokenizer.json gives it to none",
                         (long)ids[i], i);
            return NULL;
        }
        total += tok->len[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out) {
        ct_set_error("tokenizer: out of memory decoding %zu tokens", n);
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + o, tok->arena + tok->off[ids[i]], tok->len[ids[i]]);
        o += tok->len[ids[i]];
    }
    out[o] = 0;
    if (len) *len = o;
    return out;
}

/* ---- building from a tokenizer.json ------------------------------------------------------------ */

static int cmp_len_desc(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The added tokens: their text in the arena at o, a map per class, first bytes, lengths. CT_OK, or
 * CT_ERR_NOMEM with nothing set. */
static ct_status hf_build_added(ct_tokenizer *tok, const hf_spec *s, size_t o) {
    size_t n = s->n_added;
    tok->n_added = n;
    tok->added_off = malloc((n ? n : 1) * sizeof *tok->added_off);
    tok->added_len = malloc((n ? n : 1) * sizeof *tok->added_len);
    tok->added_id = malloc((n ? n : 1) * sizeof *tok->added_id);
    tok->added_special = malloc(n ? n : 1);
    if (!tok->added_off || !tok->added_len || !tok->added_id || !tok->added_special) return CT_ERR_NOMEM;
    for (int c = 0; c < 2; c++) {
        tok->added_lens[c] = malloc((n ? n : 1) * sizeof *tok->added_lens[c]);
        if (!tok->added_lens[c] ||
            bmap_init(&tok->added[c], n, tok->arena, tok->added_off, tok->added_len) != CT_OK)
            return CT_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const hf_added *a = &s->added[i];
        memcpy(tok->arena + o, a->content, a->len);
        tok->added_off[i] = (uint32_t)o;
        tok->added_len[i] = (uint32_t)a->len;
        tok->added_id[i] = a->id;
        tok->added_special[i] = (unsigned char)a->special;
        o += a->len;
        if (tok->kind[a->id] == ID_NONE) {   /* not a vocab token: it decodes to its text */
            tok->off[a->id] = tok->added_off[i];
            tok->len[a->id] = tok->added_len[i];
        }
        tok->kind[a->id] = a->special ? ID_SPECIAL : ID_ADDED;
        int c = a->normalized ? 1 : 0;
        if (bmap_put(&tok->added[c], (uint32_t)i) != (int64_t)i) continue;   /* same text twice: the first matches */
        tok->added_first[c][a->content[0]] = 1;
        size_t k = 0;
        while (k < tok->n_added_lens[c] && tok->added_lens[c][k] != a->len) k++;
        if (k == tok->n_added_lens[c]) tok->added_lens[c][tok->n_added_lens[c]++] = (uint32_t)a->len;
    }
    for (int c = 0; c < 2; c++)
        qsort(tok->added_lens[c], tok->n_added_lens[c], sizeof *tok->added_lens[c], cmp_len_desc);
    return CT_OK;
}

ct_tokenizer *tokenizer_from_hf(const hf_spec *s, const char *label) {
    ct_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) goto oom;
    tok->hf = 1;
    tok->n_base = (int)s->n_vocab;
    tok->bos = s->bos;
    tok->eos = s->eos;
    tok->add_prefix_space = s->add_prefix_space;
    tok->ignore_merges = s->ignore_merges;
    tok->nfc = s->nfc;
    int32_t top = -1;
    size_t bytes = 0;
    for (size_t i = 0; i < s->n_vocab; i++) {
        if (s->vocab_id[i] > top) top = s->vocab_id[i];
        bytes += s->vocab_len[i];
    }
    for (size_t i = 0; i < s->n_added; i++) {
        if (s->added[i].id > top) top = s->added[i].id;
        bytes += s->added[i].len;
    }
    tok->vocab = top + 1;
    tok->arena = calloc(bytes + 1, 1);   /* zeroed: -O1 cannot see it filled before bmap_init's use */
    tok->off = calloc((size_t)tok->vocab, sizeof *tok->off);
    tok->len = calloc((size_t)tok->vocab, sizeof *tok->len);
    tok->kind = calloc((size_t)tok->vocab, 1);
    if (!tok->arena || !tok->off || !tok->len || !tok->kind) goto oom;
    if (s->notice && !(tok->notice = strdup(s->notice))) goto oom;
    if (bmap_init(&tok->ranks, s->n_vocab, tok->arena, tok->off, tok->len) != CT_OK) goto oom;
    for (int b = 0; b < 256; b++) tok->byte_rank[b] = NO_RANK;   /* no token: dropped when encoding */
    size_t o = 0;
    for (size_t i = 0; i < s->n_vocab; i++) {   /* ids are unique: hf_tokenizer.c checked */
        int32_t id = s->vocab_id[i];
        memcpy(tok->arena + o, s->vocab_bytes[i], s->vocab_len[i]);
        tok->off[id] = (uint32_t)o;
        tok->len[id] = s->vocab_len[i];
        tok->kind[id] = ID_BASE;
        o += s->vocab_len[i];
        if (!s->vocab_encodable[i]) continue;   /* encoding never gives it; its bytes may repeat another's */
        bmap_put(&tok->ranks, (uint32_t)id);
        if (s->vocab_len[i] == 1) tok->byte_rank[s->vocab_bytes[i][0]] = (uint32_t)id;
    }
    if (pmap_init(&tok->merges, s->n_merges) != CT_OK) goto oom;
    for (size_t i = 0; i < s->n_merges; i++)
        pmap_put(&tok->merges, s->merges[i][0], s->merges[i][1], (uint32_t)i, s->merges[i][2]);
    if (hf_build_added(tok, s, o) != CT_OK) goto oom;
    if (s->split_pattern) {
        tok->pretok = pretok_create_pattern(s->split_pattern, s->split_literal);
        if (!tok->pretok) goto bad_regex;
    }
    if (s->byte_level_regex) {
        tok->byte_level = pretok_create_pattern(HF_GPT2_PATTERN, 0);
        if (!tok->byte_level) goto bad_regex;
    }
    return tok;
bad_regex:
    ct_set_error("%s: pre_tokenizer: Split pattern: %s", label, ct_last_error());
    tokenizer_free(tok);
    return NULL;
oom:
    ct_set_error("%s: out of memory building the tokenizer", label);
    tokenizer_free(tok);
    return NULL;
}
