/* data.c: windows of token streams, shuffled per epoch and mixed by weight, addressed by global sequence
 * number. */
#include "data/data.h"

#include "base/error.h"
#include "base/util.h"
#include "data/shard.h"
#include "ctitan/model.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Reads one shard, checks its ids against the vocabulary and appends it to the source's tokens (a
 * masked shard's words keep their SHARD_MASKED flags; an unmasked one's ids are checked whole, so a
 * word with bit 31 set is refused as out of the vocabulary, as it always was). */
static ct_status append_shard(data_source *src, const char *path, const char *source, int64_t vocab) {
    uint32_t *t;
    uint64_t n;
    shard_info info;
    ct_status st = shard_read_info(path, &t, &n, &info);
    if (st != CT_OK) return st;
    uint32_t id_mask = info.version == SHARD_VERSION_DOCS     ? SHARD_DOC_ID_MASK
                       : info.version == SHARD_VERSION_MASKED ? SHARD_ID_MASK
                                                              : UINT32_MAX;
    /* one source's document starts are its shards' or none: a folder mixing both would have documents
     * end at the EOS in some windows and not in others */
    int docs = info.version == SHARD_VERSION_DOCS;
    if (src->n_tokens && docs != src->docs) {
        ct_set_error("%s: %s is a version %u shard, %s; expected every shard of a source to record document "
                     "starts (version 4, `ctitan tokenize --format chat`) or none", source, path, info.version,
                     docs ? "recording document starts, but the shards before it do not"
                          : "without document starts, but the shards before it record them");
        shard_free(t);
        return CT_ERR_INVALID;
    }
    for (uint64_t i = 0; i < n; i++)
        if ((int64_t)(t[i] & id_mask) >= vocab) {
            ct_set_error("%s: token %u at position %llu is outside the model's vocabulary of %lld", source,
                         t[i] & id_mask, (unsigned long long)(src->n_tokens + i), (long long)vocab);
            shard_free(t);
            return CT_ERR_INVALID;
        }
    if (info.version >= SHARD_VERSION_MASKED) src->masked = 1;
    src->docs = docs;
    uint32_t *grown = realloc(src->tokens, sizeof(uint32_t) * (size_t)(src->n_tokens + n + 1));
    if (!grown) {
        shard_free(t);
        return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    }
    src->tokens = grown;
    if (n) memcpy(src->tokens + src->n_tokens, t, sizeof(uint32_t) * (size_t)n);
    src->n_tokens += n;
    shard_free(t);
    return CT_OK;
}

static ct_status load_folder(data_source *src, const char *path, int64_t vocab) {
    DIR *d = opendir(path);
    if (!d) return ct_fail(CT_ERR_IO, "%s: cannot open the dataset folder", path);
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    ct_status rc = CT_OK;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".bin")) continue;
        char **grown = realloc(names, sizeof(char *) * (n + 1));
        if (!grown) break;
        names = grown;
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof(char *), name_cmp);
    for (size_t i = 0; i < n && rc == CT_OK; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        rc = append_shard(src, p, path, vocab);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc == CT_OK && n == 0) rc = ct_fail(CT_ERR_INVALID, "%s: no *.bin token shards in the dataset folder", path);
    return rc;
}

void dataloader_init(dataloader *dl, int64_t seq_len, uint64_t seed, int ordered) {
    memset(dl, 0, sizeof *dl);
    dl->seq_len = seq_len;
    dl->seed = seed;
    dl->ordered = ordered;
    dl->slot_period = -1;
}

static void source_free(data_source *src) {
    free(src->path);
    free(src->tokens);
    free(src->perm);
    memset(src, 0, sizeof *src);
}

ct_status dataloader_add(dataloader *dl, const char *path, double weight, int64_t vocab) {
    data_source src = {.weight = weight, .perm_epoch = -1};
    struct stat st;
    if (!(weight > 0) || !isfinite(weight))
        return ct_fail(CT_ERR_INVALID, "%s: weight %g: expected a finite number > 0", path, weight);
    if (stat(path, &st) != 0)
        return ct_fail(CT_ERR_INVALID, "%s: dataset not found (make one with `ctitan tokenize`)", path);
    ct_status rc = S_ISDIR(st.st_mode) ? load_folder(&src, path, vocab) : append_shard(&src, path, path, vocab);
    if (rc != CT_OK) goto fail;
    dl->docs |= src.docs;
    rc = CT_ERR_INVALID;
    src.n_windows = src.n_tokens > 0 ? (int64_t)((src.n_tokens - 1) / (uint64_t)dl->seq_len) : 0;
    if (src.n_windows < 1) {
        ct_set_error("%s: %llu tokens are not enough for one sequence of %lld + 1", path,
                     (unsigned long long)src.n_tokens, (long long)dl->seq_len);
        goto fail;
    }
    if (src.n_windows > UINT32_MAX) {
        ct_set_error("%s: %lld sequences; at most %u per source", path, (long long)src.n_windows, UINT32_MAX);
        goto fail;
    }
    data_source *grown = realloc(dl->src, sizeof *grown * (size_t)(dl->n_src + 1));
    if (!dl->ordered) src.perm = malloc(sizeof(uint32_t) * (size_t)src.n_windows);
    if (grown) dl->src = grown;
    src.path = strdup(path);
    if (!grown || (!dl->ordered && !src.perm) || !src.path) {
        rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    src.first = dl->n_windows;
    dl->src[dl->n_src++] = src;
    dl->n_tokens += src.n_tokens;
    dl->n_windows += src.n_windows;
    return CT_OK;
fail:
    source_free(&src);
    return rc;
}

/* Largest remainder of P w_i / W (ties to the earlier source), every source at least one sequence. */
static void period_counts(dataloader *dl) {
    double W = 0;
    for (int i = 0; i < dl->n_src; i++) W += dl->src[i].weight;
    int64_t given = 0;
    for (int i = 0; i < dl->n_src; i++) {
        dl->src[i].count = (int64_t)floor((double)dl->period * dl->src[i].weight / W);
        dl->src[i].seen = 0; /* marks a source that took a remainder */
        given += dl->src[i].count;
    }
    for (; given < dl->period; given++) {
        int best = -1;
        double top = -1;
        for (int i = 0; i < dl->n_src; i++) {
            double rem = (double)dl->period * dl->src[i].weight / W - (double)dl->src[i].count;
            if (!dl->src[i].seen && rem > top) {
                top = rem;
                best = i;
            }
        }
        if (best < 0) best = 0; /* rounding left more than one per source: cannot happen, but stays exact */
        dl->src[best].count++;
        dl->src[best].seen = 1;
    }
    for (int i = 0; i < dl->n_src; i++) /* a source that rounded to none takes one from the largest */
        if (dl->src[i].count == 0) {
            int big = 0;
            for (int j = 1; j < dl->n_src; j++)
                if (dl->src[j].count > dl->src[big].count) big = j;
            dl->src[big].count--;
            dl->src[i].count = 1;
        }
}

ct_status dataloader_mix(dataloader *dl) {
    if (dl->ordered || dl->n_src <= 1) {
        if (dl->n_src == 1) dl->src[0].count = dl->period = 1;
        return CT_OK;
    }
    /* P = 1000, or a multiple of 1000 large enough that the smallest share is one sequence */
    double W = 0, least = INFINITY;
    for (int i = 0; i < dl->n_src; i++) {
        W += dl->src[i].weight;
        if (dl->src[i].weight < least) least = dl->src[i].weight;
    }
    double need = ceil(W / least / 1000.0);
    if (!(need <= (double)(1 << 14)))
        return ct_fail(CT_ERR_INVALID, "weights from %g to a total of %g: a share below 1/%d of the sequences; "
                       "expected weights within a factor of %d of their total", least, W, 1000 << 14, 1000 << 14);
    dl->period = 1000 * (int64_t)(need < 1 ? 1 : need);
    period_counts(dl);
    dl->slot_src = malloc(sizeof(uint32_t) * (size_t)dl->period);
    dl->slot_rank = malloc(sizeof(uint32_t) * (size_t)dl->period);
    if (!dl->slot_src || !dl->slot_rank) return ct_fail(CT_ERR_NOMEM, "out of memory");
    return CT_OK;
}

ct_status dataloader_open(dataloader *dl, const char *path, int64_t seq_len, uint64_t seed, int64_t vocab) {
    dataloader_init(dl, seq_len, seed, 0);
    ct_status st = dataloader_add(dl, path, 1.0, vocab);
    if (st == CT_OK) st = dataloader_mix(dl);
    if (st != CT_OK) dataloader_close(dl);
    return st;
}

void dataloader_close(dataloader *dl) {
    for (int i = 0; i < dl->n_src; i++) source_free(&dl->src[i]);
    free(dl->src);
    free(dl->slot_src);
    free(dl->slot_rank);
    memset(dl, 0, sizeof *dl);
}

/* Fisher-Yates with the counter-based RNG keyed by (seed, source, epoch); source 0's key is the one
 * a single dataset always had. */
static void shuffle(dataloader *dl, int i, int64_t epoch) {
    data_source *src = &dl->src[i];
    uint64_t key = ct_util_splitmix64(dl->seed ^ 0xD474u) ^ ct_util_splitmix64((uint64_t)epoch) ^
                   (i ? ct_util_splitmix64(0x50C3u + (uint64_t)i) : 0);
    for (int64_t w = 0; w < src->n_windows; w++) src->perm[w] = (uint32_t)w;
    for (int64_t w = src->n_windows - 1; w > 0; w--) {
        int64_t j = (int64_t)(ct_util_splitmix64(key ^ ct_util_splitmix64((uint64_t)w)) % (uint64_t)(w + 1));
        uint32_t t = src->perm[w];
        src->perm[w] = src->perm[j];
        src->perm[j] = t;
    }
    src->perm_epoch = epoch;
}

/* Period p's slots: count_i of source i each, in an order drawn from (seed, p); each slot's rank among
 * its source's slots. */
static void period_layout(dataloader *dl, int64_t p) {
    int64_t at = 0;
    for (int i = 0; i < dl->n_src; i++)
        for (int64_t c = 0; c < dl->src[i].count; c++) dl->slot_src[at++] = (uint32_t)i;
    uint64_t key = ct_util_splitmix64(dl->seed ^ 0x313Bu) ^ ct_util_splitmix64((uint64_t)p);
    for (int64_t j = dl->period - 1; j > 0; j--) {
        int64_t r = (int64_t)(ct_util_splitmix64(key ^ ct_util_splitmix64((uint64_t)j)) % (uint64_t)(j + 1));
        uint32_t t = dl->slot_src[j];
        dl->slot_src[j] = dl->slot_src[r];
        dl->slot_src[r] = t;
    }
    for (int i = 0; i < dl->n_src; i++) dl->src[i].seen = 0;
    for (int64_t j = 0; j < dl->period; j++) dl->slot_rank[j] = (uint32_t)dl->src[dl->slot_src[j]].seen++;
    dl->slot_period = p;
}

/* Sequence s -> its source and the index k in that source's own stream. */
static int locate(dataloader *dl, int64_t s, int64_t *k) {
    if (dl->ordered) {
        int i = 0;
        while (i + 1 < dl->n_src && s >= dl->src[i + 1].first) i++;
        *k = s - dl->src[i].first;
        return s < dl->n_windows ? i : -1;
    }
    if (dl->n_src == 1) {
        *k = s;
        return 0;
    }
    int64_t p = s / dl->period, j = s % dl->period;
    if (p != dl->slot_period) period_layout(dl, p);
    int i = (int)dl->slot_src[j];
    *k = p * dl->src[i].count + dl->slot_rank[j];
    return i;
}

int dataloader_source_of(dataloader *dl, int64_t s) {
    int64_t k;
    return s < 0 ? -1 : locate(dl, s, &k);
}

ct_status dataloader_sequence(dataloader *dl, int64_t s, int32_t *inputs, int32_t *targets) {
    return dataloader_sequence_docs(dl, s, inputs, targets, NULL, -1);
}

/* A window's documents: from the starts its shard records (version 4), else after each EOS; and in
 * either case the target that starts a document does not count. */
static void window_docs(const data_source *src, const uint32_t *tok, int64_t T, int32_t *inputs, int32_t *targets,
                        uint8_t *starts, int32_t eos) {
    for (int64_t t = 0; t < T; t++) {
        if (src->docs) {
            starts[t] = (tok[t] & SHARD_DOC_START) != 0;
            if (tok[t + 1] & SHARD_DOC_START) targets[t] = CT_IGNORE_INDEX;
        } else {
            starts[t] = t > 0 && inputs[t - 1] == eos;
            if (inputs[t] == eos) targets[t] = CT_IGNORE_INDEX;
        }
    }
}

ct_status dataloader_sequence_docs(dataloader *dl, int64_t s, int32_t *inputs, int32_t *targets, uint8_t *starts,
                                   int32_t eos) {
    if (starts) memset(starts, 0, (size_t)dl->seq_len);
    if (s < 0) return ct_fail(CT_ERR_INVALID, "sequence number %lld: expected one >= 0", (long long)s);
    int64_t k;
    int i = locate(dl, s, &k);
    if (i < 0) { /* past an ordered loader's end */
        for (int64_t t = 0; t < dl->seq_len; t++) {
            inputs[t] = 0;
            targets[t] = CT_IGNORE_INDEX;
        }
        return CT_OK;
    }
    data_source *src = &dl->src[i];
    int64_t w = k % src->n_windows;
    if (!dl->ordered) {
        int64_t epoch = k / src->n_windows;
        if (epoch != src->perm_epoch) shuffle(dl, i, epoch);
        w = src->perm[w];
    }
    const uint32_t *tok = src->tokens + (uint64_t)w * (uint64_t)dl->seq_len;
    if (src->masked) { /* a masked shard's flag: this token, as a target, does not count */
        uint32_t id = src->docs ? SHARD_DOC_ID_MASK : SHARD_ID_MASK;
        for (int64_t t = 0; t < dl->seq_len; t++) {
            inputs[t] = (int32_t)(tok[t] & id);
            targets[t] = tok[t + 1] & SHARD_MASKED ? CT_IGNORE_INDEX : (int32_t)(tok[t + 1] & id);
        }
    } else {
        for (int64_t t = 0; t < dl->seq_len; t++) {
            inputs[t] = (int32_t)tok[t];
            targets[t] = (int32_t)tok[t + 1];
        }
    }
    if (starts) window_docs(src, tok, dl->seq_len, inputs, targets, starts, eos);
    return CT_OK;
}
