/* fuzz_safetensors: feeds arbitrary bytes to the safetensors reader (core/io/safetensors.c) and, as
 * JSON, to the index and config.json parsers (core/io/safetensors.c; core/io/hf_export.c's view of
 * a config.json, what the host reads a model pack's options from).
 *
 * Properties checked on every input:
 *   - nothing crashes, leaks or trips a sanitizer, and no allocation is sized by the input's claims;
 *   - a rejected input gets one line of error that starts with the label;
 *   - an accepted file is self-consistent (names sorted and unique, numel = product of the shape,
 *     bytes = numel * dtype size, inside the data section, no two tensors overlapping), its float
 *     tensors convert to float32 and its others refuse to; written back with st_write and read again
 *     it holds the same tensors, bytes and metadata;
 *   - an accepted config.json describes a model ctitan can build (sizes that divide).
 *
 * Two ways to build it:
 *   make build/fuzz/fuzz_safetensors: a libFuzzer binary (links build/fuzz/libctitan-core.a);
 *   tests/cli/fuzz_safetensors.sh: with tests/fuzz/replay_main.c against build/libctitan-core.a
 *       a replay driver (`fuzz_safetensors [-m N] FILE|DIR ...`, see replay_main.c).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/hf_export.h"
#include "io/safetensors.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_safetensors: check failed at %s:%d: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void check_error_line(void) {
    CHECK(strncmp(ct_last_error(), "fuzz: ", 6) == 0);
    CHECK(strchr(ct_last_error(), '\n') == NULL);
}

static const char *roundtrip_path(void) {
    static char path[512];
    if (!path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/fuzz_safetensors.%ld.st", dir && dir[0] ? dir : "/tmp", (long)getpid());
    }
    return path;
}

static void check_consistent(const st_file *f, const uint8_t *data, size_t size) {
    for (int i = 0; i < f->count; i++) {
        const st_tensor *t = &f->tensors[i];
        CHECK(t->name && t->name[0]);
        CHECK(i == 0 || strcmp(f->tensors[i - 1].name, t->name) < 0);
        CHECK(t->dtype >= 0 && t->dtype < ST_N_DTYPES);
        CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        uint64_t numel = 1;
        for (int k = 0; k < t->ndim; k++) numel *= (uint64_t)t->shape[k];
        CHECK(numel == (uint64_t)t->numel);
        CHECK(t->nbytes == numel * st_dtype_size(t->dtype));
        CHECK((const uint8_t *)t->data >= data && t->nbytes <= size &&
              (const uint8_t *)t->data - data <= (ptrdiff_t)(size - t->nbytes));
        CHECK(st_find(f, t->name) == t);
    }
    for (int i = 0; i < f->count; i++) /* pairwise: fine, inputs are small */
        for (int k = i + 1; k < f->count; k++) {
            const st_tensor *a = &f->tensors[i], *b = &f->tensors[k];
            if (!a->nbytes || !b->nbytes) continue;
            CHECK(a->offset + a->nbytes <= b->offset || b->offset + b->nbytes <= a->offset);
        }
}

static void check_conversions(const st_file *f) {
    for (int i = 0; i < f->count; i++) {
        const st_tensor *t = &f->tensors[i];
        float *out = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
        CHECK(out != NULL);
        int is_float = t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16 || t->dtype == ST_F64;
        ct_status rc = st_to_f32(t, out, "fuzz");
        CHECK(rc == (is_float ? CT_OK : CT_ERR_UNSUPPORTED));
        if (rc != CT_OK) check_error_line();
        free(out);
    }
}

static void check_round_trip(const st_file *f) {
    st_entry *e = calloc((size_t)f->count + 1, sizeof *e);
    CHECK(e != NULL);
    for (int i = 0; i < f->count; i++) {
        const st_tensor *t = &f->tensors[i];
        e[i] = (st_entry){t->name, t->dtype, t->ndim, t->shape, NULL, t->data};
    }
    const char *path = roundtrip_path();
    ct_status rc = st_write(path, e, f->count, (const char *const *)f->meta, f->n_meta);
    free(e);
    CHECK(rc == CT_OK); /* whatever the reader accepts, the writer can write */
    st_file *g = st_read(path);
    CHECK(g != NULL);
    CHECK(g->count == f->count && g->n_meta == f->n_meta);
    for (int i = 0; i < f->count; i++) {
        const st_tensor *a = &f->tensors[i], *b = &g->tensors[i];
        CHECK(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim);
        CHECK(memcmp(a->shape, b->shape, sizeof a->shape) == 0);
        CHECK(a->nbytes == b->nbytes && (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0));
    }
    for (int i = 0; i < 2 * f->n_meta; i++) CHECK(strcmp(f->meta[i], g->meta[i]) == 0);
    st_free(g);
    remove(path);
}

static void check_json_parsers(const uint8_t *data, size_t size) {
    /* config.json as the host reads it before a model pack's options are set from it (hf_pack.c) */
    json_error_t je;
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je), *view = NULL;
    if (root && hf_config_view(root, "fuzz", &view) == CT_OK) {
        json_t *rs = json_object_get(view, "rope_scaling");
        CHECK(json_is_object(view) && !json_object_get(view, "rope_parameters") && rs);
        CHECK(json_is_null(rs) || (json_number_value(json_object_get(rs, "factor")) != 0 &&
                                   json_integer_value(json_object_get(rs, "original_max_position_embeddings")) >= 1));
    } else if (root) {
        check_error_line();
    }
    json_decref(view);
    json_decref(root);
    char **pairs;
    int n;
    if (st_index_parse(data, size, "fuzz", &pairs, &n) == CT_OK) {
        CHECK(n > 0);
        for (int i = 0; i < n; i++) {
            CHECK(pairs[2 * i][0] && pairs[2 * i + 1][0] && !strchr(pairs[2 * i + 1], '/'));
            free(pairs[2 * i]);
            free(pairs[2 * i + 1]);
        }
        free(pairs);
    } else {
        check_error_line();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file *f = st_read_mem(data, size, "fuzz");
    if (!f) {
        check_error_line();
    } else {
        check_consistent(f, data, size);
        check_conversions(f);
        check_round_trip(f);
        st_free(f);
    }
    if (size && (data[0] == '{' || data[0] == '[' || data[0] == ' ')) check_json_parsers(data, size);
    return 0;
}
