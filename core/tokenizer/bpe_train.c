/* bpe_train.c: byte-level BPE training on Llama 3's regex chunks (`ctitan tokenizer train`).
 *
 * Documents are split into chunks by the pre-tokenizer and the distinct chunks counted; merges never
 * cross a chunk. Training then works on the distinct chunks ("words"), each weighted by its count:
 *
 *   pair counts  (a, b) -> sum of weights of the words' adjacent (a, b), kept up to date as words change
 *   where lists  (a, b) -> the words that held the pair when it was counted (may be stale; re-checked)
 *   a max-heap   (count, a, b), lazily corrected: an entry whose count is out of date is re-pushed
 *
 * A merge of (a, b) into a new token n rewrites only the words on (a, b)'s where list; only pairs that
 * contain n can gain count, so only those are pushed. Ties in count go to the lowest (a, b).
 * The 256 single bytes are ranks 0..255 in byte order; merge k makes rank 256 + k. A merge whose bytes
 * already name a token (possible when two different splits spell the same bytes) reuses that token.
 */
#include "tokenizer/tokenizer.h"
#include "base/error.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Grows *p (elements of size sz) to hold at least n. The helpers below that grow something return
 * CT_OK, or CT_ERR_NOMEM with nothing set (bpe_trainer_train and bpe_trainer_add say it). */
static ct_status grow(void **p, size_t *cap, size_t n, size_t sz) {
    if (n <= *cap) return CT_OK;
    size_t c = *cap ? *cap : 16;
    while (c < n) c *= 2;
    void *q = realloc(*p, c * sz);
    if (!q) return CT_ERR_NOMEM;
    *p = q;
    *cap = c;
    return CT_OK;
}

/* ---- a map of byte strings (owning its keys) to u64 -------------------------------------------- */

typedef struct strmap {
    unsigned char *arena;
    size_t arena_len, arena_cap;
    size_t *off;
    uint32_t *len;
    uint64_t *val;
    size_t n, cap;          /* entries */
    uint32_t *slots;        /* entry + 1; 0 = empty */
    size_t nslots;          /* power of two */
} strmap;

static void strmap_free(strmap *m) {
    free(m->arena);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static ct_status strmap_rehash(strmap *m, size_t nslots) {
    uint32_t *s = calloc(nslots, sizeof *s);
    if (!s) return CT_ERR_NOMEM;
    for (size_t k = 0; k < m->n; k++) {
        uint64_t i = hash_bytes(m->arena + m->off[k], m->len[k]) & (nslots - 1);
        while (s[i]) i = (i + 1) & (nslots - 1);
        s[i] = (uint32_t)(k + 1);
    }
    free(m->slots);
    m->slots = s;
    m->nslots = nslots;
    return CT_OK;
}

/* The entry for (p, n), added with value 0 if new; -1 on allocation failure. */
static int64_t strmap_get_or_add(strmap *m, const unsigned char *p, size_t n, int *added) {
    if (2 * (m->n + 1) > m->nslots && strmap_rehash(m, m->nslots ? 2 * m->nslots : 1024) != CT_OK) return -1;
    uint64_t i = hash_bytes(p, n) & (m->nslots - 1);
    for (; m->slots[i]; i = (i + 1) & (m->nslots - 1)) {
        uint32_t k = m->slots[i] - 1;
        if (m->len[k] == n && memcmp(m->arena + m->off[k], p, n) == 0) {
            if (added) *added = 0;
            return k;
        }
    }
    if (m->n >= UINT32_MAX - 1 || n > UINT32_MAX) return -1;
    size_t cap = m->cap;
    if (grow((void **)&m->off, &cap, m->n + 1, sizeof *m->off) != CT_OK) return -1;
    cap = m->cap;
    if (grow((void **)&m->len, &cap, m->n + 1, sizeof *m->len) != CT_OK) return -1;
    cap = m->cap;
    if (grow((void **)&m->val, &cap, m->n + 1, sizeof *m->val) != CT_OK) return -1;
    m->cap = cap;
    if (grow((void **)&m->arena, &m->arena_cap, m->arena_len + n, 1) != CT_OK) return -1;
    if (n) memcpy(m->arena + m->arena_len, p, n);
    m->off[m->n] = m->arena_len;
    m->len[m->n] = (uint32_t)n;
    m->val[m->n] = 0;
    m->arena_len += n;
    m->slots[i] = (uint32_t)(m->n + 1);
    if (added) *added = 1;
    return (int64_t)m->n++;
}

/* ---- pairs --------------------------------------------------------------------------------------- */

typedef struct pair_info {
    uint32_t a, b;
    int64_t count;
    uint32_t *where;        /* word indices */
    uint32_t nwhere, capwhere;
    uint32_t touched;       /* merge number that last pushed it */
} pair_info;

typedef struct pair_table {
    pair_info *p;
    size_t n, cap;
    uint64_t *keys;         /* (a << 32 | b) + 1 per slot; 0 = empty */
    uint32_t *idx;
    size_t nslots;
} pair_table;

static void pairs_free(pair_table *t) {
    for (size_t i = 0; i < t->n; i++) free(t->p[i].where);
    free(t->p);
    free(t->keys);
    free(t->idx);
    memset(t, 0, sizeof *t);
}

static ct_status pairs_rehash(pair_table *t, size_t nslots) {
    uint64_t *keys = calloc(nslots, sizeof *keys);
    uint32_t *idx = malloc(nslots * sizeof *idx);
    if (!keys || !idx) {
        free(keys);
        free(idx);
        return CT_ERR_NOMEM;
    }
    for (size_t k = 0; k < t->n; k++) {
        uint64_t key = ((uint64_t)t->p[k].a << 32 | t->p[k].b) + 1;
        uint64_t i = hash_u64(key) & (nslots - 1);
        while (keys[i]) i = (i + 1) & (nslots - 1);
        keys[i] = key;
        idx[i] = (uint32_t)k;
    }
    free(t->keys);
    free(t->idx);
    t->keys = keys;
    t->idx = idx;
    t->nslots = nslots;
    return CT_OK;
}

static int64_t pairs_get(pair_table *t, uint32_t a, uint32_t b, int create) {
    if (create && 2 * (t->n + 1) > t->nslots && pairs_rehash(t, t->nslots ? 2 * t->nslots : 1 << 16) != CT_OK)
        return -1;
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    uint64_t i = hash_u64(key) & (t->nslots - 1);
    for (; t->keys[i]; i = (i + 1) & (t->nslots - 1))
        if (t->keys[i] == key) return t->idx[i];
    if (!create) return -1;
    if (grow((void **)&t->p, &t->cap, t->n + 1, sizeof *t->p) != CT_OK) return -1;
    t->p[t->n] = (pair_info){.a = a, .b = b, .touched = UINT32_MAX};
    t->keys[i] = key;
    t->idx[i] = (uint32_t)t->n;
    return (int64_t)t->n++;
}

static ct_status pair_add_where(pair_info *p, uint32_t w) {
    if (p->nwhere && p->where[p->nwhere - 1] == w) return CT_OK;
    if (p->nwhere == p->capwhere) {
        uint32_t c = p->capwhere ? 2 * p->capwhere : 4;
        uint32_t *q = realloc(p->where, c * sizeof *q);
        if (!q) return CT_ERR_NOMEM;
        p->where = q;
        p->capwhere = c;
    }
    p->where[p->nwhere++] = w;
    return CT_OK;
}

/* Max-heap of (count, pair): higher count first, then lower a, then lower b. */
typedef struct heap_entry {
    int64_t count;
    uint32_t a, b;
    uint32_t pair;
} heap_entry;

static int heap_before(const heap_entry *x, const heap_entry *y) {
    if (x->count != y->count) return x->count > y->count;
    if (x->a != y->a) return x->a < y->a;
    return x->b < y->b;
}

typedef struct pair_heap {
    heap_entry *h;
    size_t n, cap;
} pair_heap;

static ct_status heap_push(pair_heap *q, heap_entry e) {
    if (grow((void **)&q->h, &q->cap, q->n + 1, sizeof *q->h) != CT_OK) return CT_ERR_NOMEM;
    size_t i = q->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_before(&e, &q->h[p])) break;
        q->h[i] = q->h[p];
        i = p;
    }
    q->h[i] = e;
    return CT_OK;
}

static heap_entry heap_pop(pair_heap *q) {
    heap_entry top = q->h[0], v = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && heap_before(&q->h[c + 1], &q->h[c])) c++;
        if (!heap_before(&q->h[c], &v)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = v;
    return top;
}

/* ---- the trainer --------------------------------------------------------------------------------- */

struct ct_bpe_trainer {
    ct_pretok *pretok;
    strmap chunks;          /* distinct chunk -> count */
    strmap vocab;           /* token bytes -> rank; entry k is rank k */
    ct_bpe_stats stats;
    int trained;
};

ct_bpe_trainer *bpe_trainer_create(void) {
    ct_bpe_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) {
        ct_set_error("tokenizer train: out of memory");
        return NULL;
    }
    tr->pretok = pretok_create();
    if (!tr->pretok) goto fail;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (strmap_get_or_add(&tr->vocab, &c, 1, NULL) != b) {
            ct_set_error("tokenizer train: out of memory");
            goto fail;
        }
    }
    tr->stats.n_base = 256;
    return tr;
fail:
    bpe_trainer_free(tr);
    return NULL;
}

void bpe_trainer_free(ct_bpe_trainer *tr) {
    if (!tr) return;
    pretok_free(tr->pretok);
    strmap_free(&tr->chunks);
    strmap_free(&tr->vocab);
    free(tr);
}

void bpe_trainer_stats(const ct_bpe_trainer *tr, ct_bpe_stats *out) { *out = tr->stats; }

/* CT_OK, or CT_ERR_NOMEM with nothing set (bpe_trainer_add says it). */
static ct_status count_chunk(void *ctx, const unsigned char *c, size_t n) {
    ct_bpe_trainer *tr = ctx;
    int64_t k = strmap_get_or_add(&tr->chunks, c, n, NULL);
    if (k < 0) return CT_ERR_NOMEM;
    tr->chunks.val[k]++;
    tr->stats.chunks++;
    return CT_OK;
}

ct_status bpe_trainer_add(ct_bpe_trainer *tr, const char *text, size_t len) {
    ct_status st = pretok_split(tr->pretok, text, len, count_chunk, tr);
    if (st == CT_ERR_NOMEM) return ct_fail(CT_ERR_NOMEM, "tokenizer train: out of memory counting chunks");
    if (st != CT_OK) return st;   /* the regex failed on the text (CT_ERR_INVALID): its message is set */
    tr->stats.documents++;
    tr->stats.bytes += len;
    tr->stats.unique_chunks = tr->chunks.n;
    return CT_OK;
}

/* The words: every distinct chunk as a sequence of token ids, with its count as weight. */
typedef struct words {
    uint32_t *sym;          /* all words' symbols, word w at sym + start[w] */
    size_t *start;
    uint32_t *len;
    uint64_t *weight;
    uint32_t *stamp;        /* merge number that last rewrote the word */
    size_t n;
} words;

static void words_free(words *w) {
    free(w->sym);
    free(w->start);
    free(w->len);
    free(w->weight);
    free(w->stamp);
}

static ct_status words_init(words *w, const strmap *chunks) {
    w->n = chunks->n;
    w->sym = malloc((chunks->arena_len + 1) * sizeof *w->sym);
    w->start = malloc((w->n + 1) * sizeof *w->start);
    w->len = malloc((w->n + 1) * sizeof *w->len);
    w->weight = malloc((w->n + 1) * sizeof *w->weight);
    w->stamp = malloc((w->n + 1) * sizeof *w->stamp);
    if (!w->sym || !w->start || !w->len || !w->weight || !w->stamp) return CT_ERR_NOMEM;
    for (size_t k = 0; k < w->n; k++) {
        const unsigned char *c = chunks->arena + chunks->off[k];
        w->start[k] = chunks->off[k];
        w->len[k] = chunks->len[k];
        w->weight[k] = chunks->val[k];
        w->stamp[k] = UINT32_MAX;
        for (uint32_t i = 0; i < chunks->len[k]; i++) w->sym[chunks->off[k] + i] = c[i];
    }
    return CT_OK;
}

/* Adds weight * delta for every adjacent pair of word k; with note_new, records the word on the where
 * list of each pair that holds token nt and pushes those pairs once per merge. */
static ct_status word_count_pairs(pair_table *t, const words *w, size_t k, int64_t delta, uint32_t nt,
                                  uint32_t merge_no, uint32_t **touched, size_t *ntouched, size_t *captouched) {
    const uint32_t *s = w->sym + w->start[k];
    for (uint32_t i = 0; i + 1 < w->len[k]; i++) {
        int64_t pi = pairs_get(t, s[i], s[i + 1], delta > 0);
        if (pi < 0) return CT_ERR_NOMEM;   /* a decrement always finds its pair */
        pair_info *p = &t->p[pi];
        p->count += delta * (int64_t)w->weight[k];
        if (delta > 0 && (s[i] == nt || s[i + 1] == nt)) {
            if (pair_add_where(p, (uint32_t)k) != CT_OK) return CT_ERR_NOMEM;
            if (p->touched != merge_no) {
                p->touched = merge_no;
                if (grow((void **)touched, captouched, *ntouched + 1, sizeof **touched) != CT_OK) return CT_ERR_NOMEM;
                (*touched)[(*ntouched)++] = (uint32_t)pi;
            }
        }
    }
    return CT_OK;
}

/* Replaces every (a, b) in word k by nt, left to right; returns whether anything changed. */
static int word_merge(words *w, size_t k, uint32_t a, uint32_t b, uint32_t nt) {
    uint32_t *s = w->sym + w->start[k];
    uint32_t n = w->len[k], o = 0;
    for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            s[o++] = nt;
            i += 2;
        } else {
            s[o++] = s[i++];
        }
    }
    w->len[k] = o;
    return o != n;
}

static int word_has_pair(const words *w, size_t k, uint32_t a, uint32_t b) {
    const uint32_t *s = w->sym + w->start[k];
    for (uint32_t i = 0; i + 1 < w->len[k]; i++)
        if (s[i] == a && s[i + 1] == b) return 1;
    return 0;
}

/* The token for bytes(a) + bytes(b): an existing one, or a new rank. -1 on allocation failure. */
static int64_t merged_token(strmap *vocab, uint32_t a, uint32_t b, unsigned char **buf, size_t *cap) {
    size_t la = vocab->len[a], lb = vocab->len[b];
    if (grow((void **)buf, cap, la + lb, 1) != CT_OK) return -1;
    memcpy(*buf, vocab->arena + vocab->off[a], la);
    memcpy(*buf + la, vocab->arena + vocab->off[b], lb);
    return strmap_get_or_add(vocab, *buf, la + lb, NULL);
}

/* The merge loop's working state, freed together: the words, the pair counts, the heap of candidate
 * merges, and scratch lists. */
typedef struct merge_state {
    words w;
    pair_table t;
    pair_heap q;
    uint32_t *touched; /* pairs whose count rose in the current merge */
    uint32_t *list;    /* the merged pair's where list, taken */
    size_t ntouched, captouched, caplist;
} merge_state;

/* Every adjacent pair of every word counted, with the words it occurs in, and heaped. */
static ct_status merge_state_init(merge_state *m, const strmap *chunks) {
    words *w = &m->w;
    if (words_init(w, chunks) != CT_OK || pairs_rehash(&m->t, 1 << 16) != CT_OK) return CT_ERR_NOMEM;
    for (size_t k = 0; k < w->n; k++)
        if (word_count_pairs(&m->t, w, k, +1, UINT32_MAX, 0, NULL, NULL, NULL) != CT_OK) return CT_ERR_NOMEM;
    for (size_t k = 0; k < w->n; k++) { /* where lists for the byte pairs */
        const uint32_t *s = w->sym + w->start[k];
        for (uint32_t i = 0; i + 1 < w->len[k]; i++)
            if (pair_add_where(&m->t.p[pairs_get(&m->t, s[i], s[i + 1], 0)], (uint32_t)k) != CT_OK) return CT_ERR_NOMEM;
    }
    for (size_t i = 0; i < m->t.n; i++)
        if (m->t.p[i].count > 0 &&
            heap_push(&m->q, (heap_entry){m->t.p[i].count, m->t.p[i].a, m->t.p[i].b, (uint32_t)i}) != CT_OK)
            return CT_ERR_NOMEM;
    return CT_OK;
}

static void merge_state_free(merge_state *m) {
    words_free(&m->w);
    pairs_free(&m->t);
    free(m->q.h);
    free(m->touched);
    free(m->list);
}

/* Merge number merge_no: pair e becomes token nt in every word that holds it; the pairs whose count
 * rose go back on the heap. */
static ct_status merge_apply(merge_state *m, heap_entry e, uint32_t nt, uint32_t merge_no) {
    words *w = &m->w;
    pair_info *p = &m->t.p[e.pair];
    /* Take the where list: rewriting words appends only to lists of pairs holding nt. */
    size_t nlist = p->nwhere;
    if (grow((void **)&m->list, &m->caplist, nlist, sizeof *m->list) != CT_OK) return CT_ERR_NOMEM;
    if (nlist) memcpy(m->list, p->where, nlist * sizeof *m->list);
    free(p->where);
    p->where = NULL;
    p->nwhere = p->capwhere = 0;
    m->ntouched = 0;
    for (size_t i = 0; i < nlist; i++) {
        size_t k = m->list[i];
        if (w->stamp[k] == merge_no || !word_has_pair(w, k, e.a, e.b)) continue;
        w->stamp[k] = merge_no;
        if (word_count_pairs(&m->t, w, k, -1, UINT32_MAX, merge_no, NULL, NULL, NULL) != CT_OK) return CT_ERR_NOMEM;
        word_merge(w, k, e.a, e.b, nt);
        if (word_count_pairs(&m->t, w, k, +1, nt, merge_no, &m->touched, &m->ntouched, &m->captouched) != CT_OK)
            return CT_ERR_NOMEM;
    }
    for (size_t i = 0; i < m->ntouched; i++) {
        pair_info *np = &m->t.p[m->touched[i]];
        if (np->count > 0 && heap_push(&m->q, (heap_entry){np->count, np->a, np->b, m->touched[i]}) != CT_OK)
            return CT_ERR_NOMEM;
    }
    return CT_OK;
}

ct_status bpe_trainer_train(ct_bpe_trainer *tr, int vocab_size) {
    if (vocab_size < 2 * TOKENIZER_N_SPECIAL || vocab_size > TOKENIZER_MAX_BASE)
        return ct_fail(CT_ERR_INVALID, "tokenizer train: vocab size %d out of range (%d..%d: 256 bytes + merges "
                       "+ 256 specials)", vocab_size, 2 * TOKENIZER_N_SPECIAL, TOKENIZER_MAX_BASE);
    if (tr->trained) return ct_fail(CT_ERR_INVALID, "tokenizer train: already trained");
    tr->trained = 1;
    size_t target = (size_t)(vocab_size - TOKENIZER_N_SPECIAL);
    merge_state m = {0};
    unsigned char *buf = NULL;
    size_t capbuf = 0;
    ct_status rc = CT_ERR_NOMEM;
    if (merge_state_init(&m, &tr->chunks) != CT_OK) goto oom;
    uint32_t merge_no = 0;
    while (tr->vocab.n < target && m.q.n) {
        heap_entry e = heap_pop(&m.q);
        pair_info *p = &m.t.p[e.pair];
        if (p->count != e.count) { /* stale: counts only fall between pushes */
            if (p->count > 0 && heap_push(&m.q, (heap_entry){p->count, p->a, p->b, e.pair}) != CT_OK) goto oom;
            continue;
        }
        if (p->count <= 0) continue;
        int64_t nt = merged_token(&tr->vocab, e.a, e.b, &buf, &capbuf);
        if (nt < 0) goto oom;
        merge_no++;
        if (merge_apply(&m, e, (uint32_t)nt, merge_no) != CT_OK) goto oom;
        tr->stats.merges++;
    }
    tr->stats.n_base = (int)tr->vocab.n;
    rc = CT_OK;
    goto done;
oom:
    ct_set_error("tokenizer train: out of memory");
done:
    merge_state_free(&m);
    free(buf);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------------------- */

static size_t b64_encode(const unsigned char *p, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) v |= p[i + 2];
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    return o;
}

ct_status bpe_trainer_write(const ct_bpe_trainer *tr, const char *path) {
    const strmap *v = &tr->vocab;
    size_t maxlen = 0, total = 0;
    for (size_t k = 0; k < v->n; k++) {
        if (v->len[k] > maxlen) maxlen = v->len[k];
        total += 4 * ((size_t)v->len[k] + 2) / 3 + 16;
    }
    char *text = malloc(total + 1);
    size_t tmplen = strlen(path) + 8;
    char *tmp = malloc(tmplen);
    if (!text || !tmp) {
        free(text);
        free(tmp);
        return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t o = 0;
    for (size_t k = 0; k < v->n; k++) {
        o += b64_encode(v->arena + v->off[k], v->len[k], text + o);
        o += (size_t)sprintf(text + o, " %zu\n", k);
    }
    snprintf(tmp, tmplen, "%s.tmp", path);
    ct_status rc = CT_ERR_IO;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        ct_set_error("%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    if (ct_write_all(fd, text, o) || fsync(fd)) {
        ct_set_error("%s: write failed: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (close(fd) || rename(tmp, path)) {
        ct_set_error("%s: cannot finish writing: %s", path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    rc = CT_OK;
out:
    free(text);
    free(tmp);
    return rc;
}
