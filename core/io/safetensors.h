/* safetensors.h: Hugging Face's safetensors format, a validating reader and an atomic writer.
 *
 * A file is:
 *
 *   u64 N (little-endian) | N bytes of JSON, the header | the data section (the rest of the file)
 *
 * The header is one JSON object. Each key but "__metadata__" names a tensor:
 *
 *   "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}
 *
 * BEGIN and END are byte offsets into the data section; the tensor's bytes are data[BEGIN, END),
 * row-major, little-endian. "__metadata__", when present, is an object of string values
 * ({"format": "pt"} from PyTorch).
 *
 * The reader checks everything before it trusts anything: N against the file's size and a cap
 * (ST_MAX_HEADER), the JSON (well-formed, an object, no duplicate keys), and per tensor: a known
 * dtype, a shape of non-negative integers whose element count does not overflow, offsets with
 * BEGIN <= END <= the data section's size and END - BEGIN == numel * dtype size, and no two tensors
 * overlapping. A bad file gives one line ("path: tensor 'name': what is wrong"), never a crash or an
 * allocation sized by the file's claims.
 *
 * The writer puts tensors in name order (strcmp), pads the header with spaces so the data starts at
 * a multiple of 8 bytes, writes "path.tmp", fsyncs and renames it over path.
 *
 * A model may be split across several files named by "model.safetensors.index.json"
 * ({"weight_map": {"tensor": "model-00001-of-00002.safetensors", ...}}); st_model_open reads either
 * that or a single "model.safetensors".
 *
 * Errors: functions that can fail return a ct_status (or NULL) and leave one line for ct_last_error()
 * (base/error.h). Ownership: an st_file owns its names and metadata strings; st_read's result also
 * owns the mapping of the file. st_read_mem's result points into the caller's buffer, which must
 * outlive it.
 */
#ifndef CTITAN_SAFETENSORS_H
#define CTITAN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* bytes of JSON header we accept (real ones are < 1 MB) */

/* Every dtype of the format. All of them are read and written as bytes; st_to_f32 converts
 * ST_F32, ST_BF16, ST_F16 and ST_F64. */
typedef enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_N_DTYPES
} st_dtype;

/* "F32", "BF16", ...; "?" for a bad code. */
const char *st_dtype_name(int dtype);
/* Bytes per element; 0 for a bad code. */
size_t st_dtype_size(int dtype);
/* The code for a name such as "BF16", or -1. */
int st_dtype_from_name(const char *name);

typedef struct st_tensor {
    char *name;                 /* NUL-terminated, non-empty */
    int dtype;                  /* an st_dtype */
    int ndim;                   /* 0..ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS]; /* shape[ndim..] are 0 */
    int64_t numel;              /* product of shape; 1 for a scalar */
    uint64_t offset, nbytes;    /* where in the data section */
    const void *data;           /* nbytes, inside the file's bytes; not aligned (use memcpy) */
} st_tensor;

typedef struct st_file {
    char *label;          /* the path, for messages */
    st_tensor *tensors;   /* sorted by name (strcmp) */
    int count;
    char **meta;          /* __metadata__: key0, value0, key1, value1, ... in header order */
    int n_meta;
    void *map;            /* st_read: the mapped file (unmapped by st_free); NULL otherwise */
    size_t map_size;
} st_file;

/* Maps and validates a whole file. NULL on error. */
st_file *st_read(const char *path);
/* The same over bytes in memory (not copied: buf must outlive the result); `label` stands for the
 * path in messages. */
st_file *st_read_mem(const void *buf, size_t len, const char *label);
/* The tensor called name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* The metadata value for key, or NULL. */
const char *st_meta(const st_file *f, const char *key);
void st_free(st_file *f);

/* Converts t's numel elements to float32 into out. CT_ERR_UNSUPPORTED for a dtype with no float
 * conversion (the message names the tensor and its dtype); `label` prefixes the message (may be NULL). */
ct_status st_to_f32(const st_tensor *t, float *out, const char *label);

/* Scalar conversions. bf16 -> f32 and f16 -> f32 are exact; f32 -> bf16 rounds to nearest, ties to
 * even, keeps infinities, turns NaN into a quiet NaN of the same sign, and overflows to infinity
 * like any round-to-nearest. */
float st_bf16_to_f32(uint16_t h);
uint16_t st_f32_to_bf16(float f);
float st_f16_to_f32(uint16_t h);

/* Writer: one entry per tensor. Either f32 is set (float32 values, stored as dtype, which must then
 * be ST_F32 or ST_BF16) or raw is (numel * dtype size bytes already in dtype). */
typedef struct st_entry {
    const char *name;
    int dtype;
    int ndim;
    const int64_t *shape;
    const float *f32;
    const void *raw;
} st_entry;

/* Writes n entries (any order; the file holds them by name) and n_meta key/value string pairs as
 * __metadata__ (meta[2i] the key, meta[2i+1] the value; n_meta may be 0). Atomic. */
ct_status st_write(const char *path, const st_entry *entries, int n, const char *const *meta, int n_meta);

/* A model in a folder: "model.safetensors" if it exists, else the files that
 * "model.safetensors.index.json" names. Tensor names are unique across the files. */
typedef struct st_model {
    st_file **files;
    int n_files;
    const st_tensor **tensors; /* every tensor of every file, sorted by name */
    const char **where;        /* where[i]: the label of the file holding tensors[i] */
    int count;
} st_model;

st_model *st_model_open(const char *dir);
/* Parses an index file's JSON: on success *n (tensor, file) pairs in *pairs (pairs[2i] the tensor,
 * pairs[2i+1] its file: a plain file name, no '/'), owned by the caller (free each, then the array).
 * Exposed for the fuzzer. */
ct_status st_index_parse(const void *json, size_t len, const char *label, char ***pairs, int *n);
const st_tensor *st_model_find(const st_model *m, const char *name);
/* The label (path) of the file holding the tensor called name, or NULL. */
const char *st_model_where(const st_model *m, const char *name);
void st_model_free(st_model *m);

#endif
