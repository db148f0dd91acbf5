/* fuzz_tensorfile: feeds arbitrary bytes to the ctt reader (core/io/tensorfile.c).
 *
 * Properties checked on every input:
 *   - tf_read_mem never crashes, leaks or trips a sanitizer;
 *   - a rejected input gets one line of error that starts with the label;
 *   - an accepted input is self-consistent (numel = product of shape, names unique, dtype known),
 *     and writing it back with tf_writer gives exactly the input bytes (the format is canonical) for
 *     a version-2 input, and for a version-1 one (no checksums) a version-2 file with the same tensors;
 *   - tf_text on every entry gives its text or one line naming it; tf_read_first on the written file
 *     gives the same first entry (or none when it exceeds the cap).
 *
 * Two ways to build it:
 *   make build/fuzz/fuzz_tensorfile: a libFuzzer binary (run it on a corpus folder);
 *   cc -DFUZZ_REPLAY_MAIN -fsanitize=address,undefined -Isdk/include -Icore tests/fuzz/fuzz_tensorfile.c
 *       build/libctitan-core.a (and the core's libraries): a replay driver: `fuzz_tensorfile FILE_OR_DIR...` runs each file once, and with
 *       FUZZ_MUTATIONS=N also N seeded random mutations of each (byte changes and cuts).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/tensorfile.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_tensorfile: check failed at %s:%d: %s\n", __FILE__, __LINE__,    \
                    #cond);                                                                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static const char *roundtrip_path(void) {
    static char path[512];
    if (!path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/fuzz_tensorfile.%ld.ctt", dir && dir[0] ? dir : "/tmp",
                 (long)getpid());
    }
    return path;
}

/* Writes f with tf_writer and checks the file's bytes equal the input (version 2), or that it reads
 * back as the same tensors (version 1 input: the writer adds the checksums). */
static void check_round_trip(const tf_file *f, const uint8_t *data, size_t size) {
    const char *path = roundtrip_path();
    tf_writer *w = tf_writer_open(path);
    CHECK(w != NULL);
    for (int i = 0; i < f->count; i++) {
        const tf_entry *e = &f->entries[i];
        CHECK(tf_writer_add(w, e->name, e->dtype, e->ndim, e->shape, e->data) == CT_OK);
    }
    CHECK(tf_writer_close(w) == CT_OK);
    if (f->version == 1) {
        tf_file *g = tf_read(path);
        remove(path);
        CHECK(g != NULL && g->version == TF_VERSION && g->count == f->count);
        for (int i = 0; i < f->count; i++) {
            const tf_entry *a = &f->entries[i], *b = &g->entries[i];
            CHECK(!strcmp(a->name, b->name) && a->dtype == b->dtype && a->numel == b->numel);
            CHECK(memcmp(a->data, b->data, 4 * (size_t)a->numel) == 0);
        }
        tf_free(g);
        return;
    }
    /* the first record alone (a model's description is read so): the same first entry, or none */
    tf_file *first = tf_read_first(path, 1 << 16);
    CHECK(first != NULL && first->count <= 1 && (first->count == 1 || f->count == 0 || f->entries[0].numel * 4 > 60000));
    if (first->count == 1) {
        const tf_entry *a = &f->entries[0], *b = &first->entries[0];
        CHECK(!strcmp(a->name, b->name) && a->dtype == b->dtype && a->numel == b->numel);
        CHECK(memcmp(a->data, b->data, 4 * (size_t)a->numel) == 0);
    }
    tf_free(first);
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    uint8_t *back = malloc(size + 1);
    CHECK(back != NULL);
    size_t n = fread(back, 1, size + 1, fp);
    fclose(fp);
    remove(path);
    CHECK(n == size);
    CHECK(memcmp(back, data, size) == 0);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tf_file *f = tf_read_mem(data, size, "fuzz");
    if (!f) {
        CHECK(strncmp(ct_last_error(), "fuzz: ", 6) == 0);
        CHECK(strchr(ct_last_error(), '\n') == NULL);
        return 0;
    }
    for (int i = 0; i < f->count; i++) {
        const tf_entry *e = &f->entries[i];
        CHECK(e->name != NULL && e->data != NULL);
        CHECK(strlen(e->name) >= 1 && strlen(e->name) <= TF_MAX_NAME);
        CHECK(e->dtype == TF_F32 || e->dtype == TF_I32);
        CHECK(e->ndim >= 0 && e->ndim <= TF_MAX_DIMS);
        int64_t numel = 1;
        for (int k = 0; k < e->ndim; k++) numel *= e->shape[k];
        CHECK(numel == e->numel);
        CHECK(tf_find(f, e->name) == e);
        CHECK((uint64_t)e->numel * 4 <= size);
        char *text; /* text, or one line naming it */
        if (tf_text(f, "fuzz", e->name, &text) == CT_OK) CHECK(text && strlen(text) <= (size_t)e->numel * 4);
        else CHECK(!text && !strncmp(ct_last_error(), "fuzz: tensor '", 14));
        free(text);
    }
    check_round_trip(f, data, size);
    tf_free(f);
    return 0;
}

#ifdef FUZZ_REPLAY_MAIN
#include <dirent.h>
#include <sys/stat.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) { /* xorshift64: deterministic, so a failure replays */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* One random variant of a seed: a few byte changes (biased to the header and record fields, where the
 * reader's decisions are), or a cut, or a 32-bit field set to an extreme value. */
static size_t mutate(uint8_t *buf, size_t size) {
    if (size == 0) return 0;
    size_t span = size < 256 ? size : 256;
    switch (rng_next() % 4) {
    case 0: return (size_t)(rng_next() % size); /* cut */
    case 1: {
        size_t at = (size_t)(rng_next() % (size >= 4 ? size - 3 : 1));
        uint32_t v = (uint32_t[]){0, 1, 7, 0x7fffffff, 0xffffffff, 1025}[rng_next() % 6];
        for (int i = 0; i < 4 && at + i < size; i++) buf[at + i] = (uint8_t)(v >> (8 * i));
        return size;
    }
    default: {
        int n = 1 + (int)(rng_next() % 4);
        for (int i = 0; i < n; i++) {
            size_t at = (size_t)(rng_next() % (rng_next() % 2 ? span : size));
            buf[at] = (uint8_t)rng_next();
        }
        return size;
    }
    }
}

static int run_file(const char *path, long mutations) {
    FILE *fp = fopen(path, "rb");
    if (!fp) { fprintf(stderr, "fuzz_tensorfile: cannot open %s\n", path); return -1; }
    size_t cap = 1 << 16, n = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, fp)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *grown = realloc(buf, cap *= 2);
            if (!grown) { free(buf); buf = NULL; break; }
            buf = grown;
        }
    }
    fclose(fp);
    if (!buf) { fprintf(stderr, "fuzz_tensorfile: out of memory\n"); return -1; }
    LLVMFuzzerTestOneInput(buf, n);
    uint8_t *copy = malloc(n ? n : 1);
    for (long m = 0; copy && m < mutations; m++) {
        memcpy(copy, buf, n);
        size_t len = mutate(copy, n);
        uint8_t *exact = malloc(len ? len : 1); /* exact size, so ASan sees any overread */
        if (!exact) break;
        memcpy(exact, copy, len);
        LLVMFuzzerTestOneInput(exact, len);
        free(exact);
    }
    free(copy);
    free(buf);
    printf("ok %s (%zu bytes, %ld mutations)\n", path, n, mutations);
    return 0;
}

int main(int argc, char **argv) {
    const char *m = getenv("FUZZ_MUTATIONS");
    long mutations = m ? atol(m) : 0;
    int bad = 0, runs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *de;
            while (d && (de = readdir(d))) {
                if (de->d_name[0] == '.') continue;
                char p[4096];
                snprintf(p, sizeof p, "%s/%s", argv[i], de->d_name);
                bad |= run_file(p, mutations) != 0;
                runs++;
            }
            if (d) closedir(d);
        } else {
            bad |= run_file(argv[i], mutations) != 0;
            runs++;
        }
    }
    if (runs == 0) { fprintf(stderr, "usage: fuzz_tensorfile FILE_OR_DIR...\n"); return 2; }
    return bad;
}
#endif
