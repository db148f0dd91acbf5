/* zstd_frames.c: standard input to standard output as zstd frames of at most N input bytes each (the
 * last frame may be shorter) with a content checksum each, as the zstd CLI writes them, so a test can
 * make multi-frame .zst files without the CLI.
 *   zstd_frames N < in > out.zst */
#include <stdio.h>
#include <stdlib.h>
#include <zstd.h>

int main(int argc, char **argv) {
    long n = argc == 2 ? strtol(argv[1], NULL, 10) : 0;
    if (n <= 0) {
        fprintf(stderr, "usage: zstd_frames N < in > out.zst\n");
        return 2;
    }
    char *in = malloc((size_t)n);
    size_t cap = ZSTD_compressBound((size_t)n);
    char *out = malloc(cap);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    if (!in || !out || !cc || ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1))) return 1;
    size_t got;
    while ((got = fread(in, 1, (size_t)n, stdin)) > 0) {
        size_t k = ZSTD_compress2(cc, out, cap, in, got);
        if (ZSTD_isError(k) || fwrite(out, 1, k, stdout) != k) return 1;
    }
    ZSTD_freeCCtx(cc);
    free(in);
    free(out);
    return ferror(stdin) ? 1 : 0;
}
