/* replay_main.c: runs a libFuzzer target without libFuzzer, over seed files and mutations of them.
 *
 *   fuzz_x [-m N] [-s SEED] FILE|DIR ...
 *
 * Each file (a directory stands for the files in it) is passed to LLVMFuzzerTestOneInput as is, then N
 * times with 1-4 random edits (byte flips, interesting bytes, truncation, deletion, duplication). The
 * mutations come from a fixed seed, so a failure repeats. Build with -fsanitize=address,undefined. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static size_t mutate(uint8_t *b, size_t n, size_t cap) {
    static const uint8_t interesting[] = {0, 1, 0x7f, 0x80, 0xff, ' ', '\n', '\r', '=', '0', '9',
                                          'A', '/', '<', '|', '>', 0xc3, 0xe4, 0xf0};
    int edits = 1 + (int)(rnd() % 4);
    for (int e = 0; e < edits; e++) {
        uint32_t op = rnd() % 6, at = n ? rnd() % (uint32_t)n : 0;
        if (op == 0 && n) b[at] ^= (uint8_t)(1u << (rnd() % 8));
        else if (op == 1 && n) b[at] = interesting[rnd() % sizeof interesting];
        else if (op == 2) n = n ? at : 0;                                  /* truncate */
        else if (op == 3 && n) {                                          /* delete a run */
            size_t k = 1 + rnd() % 16;
            if (at + k > n) k = n - at;
            memmove(b + at, b + at + k, n - at - k);
            n -= k;
        } else if (op == 4 && n && n < cap) {                             /* duplicate a run */
            size_t k = 1 + rnd() % 16;
            if (at + k > n) k = n - at;
            if (n + k > cap) k = cap - n;
            memmove(b + at + k, b + at, n - at);
            n += k;
        } else if (n < cap) {                                             /* insert a byte */
            memmove(b + at + 1, b + at, n - at);
            b[at] = (uint8_t)rnd();
            n++;
        }
    }
    return n;
}

static long runs;

static int replay_file(const char *path, int mutations) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0, got;
    uint8_t *b = malloc(cap);
    while ((got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    uint8_t *copy = malloc(n + 4096);
    memcpy(copy, b, n);   /* exact size: ASan sees reads past the end */
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    runs++;
    for (int m = 0; m < mutations; m++) {
        uint8_t *w = malloc(n + 256);
        memcpy(w, b, n);
        size_t k = mutate(w, n, n + 256);
        uint8_t *exact = malloc(k ? k : 1);
        memcpy(exact, w, k);
        LLVMFuzzerTestOneInput(exact, k);
        free(exact);
        free(w);
        runs++;
    }
    free(b);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    int mutations = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-m") == 0 && i + 1 < argc) { mutations = atoi(argv[++i]); continue; }
        if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) { rng ^= strtoull(argv[++i], NULL, 0); continue; }
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            char **names = NULL;
            size_t nn = 0;
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.') continue;
                names = realloc(names, (nn + 1) * sizeof *names);
                names[nn] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
                sprintf(names[nn++], "%s/%s", argv[i], e->d_name);
            }
            if (d) closedir(d);
            qsort(names, nn, sizeof *names, cmp_str);   /* readdir order is not stable */
            for (size_t k = 0; k < nn; k++) {
                if (replay_file(names[k], mutations)) return 1;
                files++;
                free(names[k]);
            }
            free(names);
        } else {
            if (replay_file(argv[i], mutations)) return 1;
            files++;
        }
    }
    printf("replayed %ld inputs from %d files\n", runs, files);
    return files ? 0 : 1;
}
