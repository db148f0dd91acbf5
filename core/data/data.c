/* data.c: windows of a token stream, shuffled per epoch, addressed by global sequence number. */
#include "data/data.h"

#include "engine/runtime.h"
#include "data/shard.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Reads one shard and appends it to dl->tokens. */
static int append_shard(dataloader *dl, const char *path, char *err, size_t errlen) {
    uint32_t *t;
    uint64_t n;
    if (shard_read(path, &t, &n, err, errlen)) return -1;
    uint32_t *grown = realloc(dl->tokens, sizeof(uint32_t) * (size_t)(dl->n_tokens + n + 1));
    if (!grown) {
        shard_free(t);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    dl->tokens = grown;
    if (n) memcpy(dl->tokens + dl->n_tokens, t, sizeof(uint32_t) * (size_t)n);
    dl->n_tokens += n;
    shard_free(t);
    return 0;
}

static int load_folder(dataloader *dl, const char *path, char *err, size_t errlen) {
    DIR *d = opendir(path);
    if (!d) {
        snprintf(err, errlen, "%s: cannot open the dataset folder", path);
        return -1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".bin")) continue;
        char **grown = realloc(names, sizeof(char *) * (n + 1));
        if (!grown) break;
        names = grown;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(char *), name_cmp);
    for (size_t i = 0; i < n && !rc; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        rc = append_shard(dl, p, err, errlen);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!rc && n == 0) {
        snprintf(err, errlen, "%s: no *.bin token shards in the dataset folder", path);
        rc = -1;
    }
    return rc;
}

int dataloader_open(dataloader *dl, const char *path, int64_t seq_len, uint64_t seed, int64_t vocab, char *err,
                    size_t errlen) {
    memset(dl, 0, sizeof *dl);
    dl->seq_len = seq_len;
    dl->seed = seed;
    dl->perm_epoch = -1;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: dataset not found (make one with `ctitan tokenize`)", path);
        return -1;
    }
    if ((S_ISDIR(st.st_mode) ? load_folder(dl, path, err, errlen) : append_shard(dl, path, err, errlen))) goto fail;
    for (uint64_t i = 0; i < dl->n_tokens; i++)
        if ((int64_t)dl->tokens[i] >= vocab) {
            snprintf(err, errlen, "%s: token %u at position %llu is outside the model's vocabulary of %lld", path,
                     dl->tokens[i], (unsigned long long)i, (long long)vocab);
            goto fail;
        }
    dl->n_windows = dl->n_tokens > 0 ? (int64_t)((dl->n_tokens - 1) / (uint64_t)seq_len) : 0;
    if (dl->n_windows < 1) {
        snprintf(err, errlen, "%s: %llu tokens are not enough for one sequence of %lld + 1", path,
                 (unsigned long long)dl->n_tokens, (long long)seq_len);
        goto fail;
    }
    dl->perm = malloc(sizeof(uint32_t) * (size_t)dl->n_windows);
    if (!dl->perm) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    return 0;
fail:
    dataloader_close(dl);
    return -1;
}

void dataloader_close(dataloader *dl) {
    free(dl->tokens);
    free(dl->perm);
    memset(dl, 0, sizeof *dl);
}

/* Fisher-Yates with the counter-based RNG keyed by (seed, epoch). */
static void shuffle(dataloader *dl, int64_t epoch) {
    uint64_t key = rng_splitmix64(dl->seed ^ 0xD474u) ^ rng_splitmix64((uint64_t)epoch);
    for (int64_t i = 0; i < dl->n_windows; i++) dl->perm[i] = (uint32_t)i;
    for (int64_t i = dl->n_windows - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_splitmix64(key ^ rng_splitmix64((uint64_t)i)) % (uint64_t)(i + 1));
        uint32_t t = dl->perm[i];
        dl->perm[i] = dl->perm[j];
        dl->perm[j] = t;
    }
    dl->perm_epoch = epoch;
}

int dataloader_sequence(dataloader *dl, int64_t s, int32_t *inputs, int32_t *targets) {
    if (s < 0) return -1;
    int64_t epoch = s / dl->n_windows;
    if (epoch != dl->perm_epoch) shuffle(dl, epoch);
    const uint32_t *w = dl->tokens + (uint64_t)dl->perm[s % dl->n_windows] * (uint64_t)dl->seq_len;
    for (int64_t i = 0; i < dl->seq_len; i++) {
        inputs[i] = (int32_t)w[i];
        targets[i] = (int32_t)w[i + 1];
    }
    return 0;
}
