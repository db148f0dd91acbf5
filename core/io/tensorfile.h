/* tensorfile.h: the "ctt" named-tensor file, a reader and an atomic writer.
 *
 * Golden files from PyTorch (tests/golden/) and other small tensor dumps use this format.
 * Everything is little-endian:
 *
 *   header, 24 bytes:  "CTTENSOR" (8 bytes) | u32 version = 2 | u32 tensor count | u64 reserved = 0
 *   then per tensor:   u32 name_len (1..1024) | name (UTF-8, no NUL, not terminated)
 *                      | u32 dtype (1 = f32, 5 = int32) | u32 ndim (0..6) | u64 shape[ndim]
 *                      | numel * 4 bytes of data, row-major (ndim 0 is a scalar: numel 1)
 *   then (version 2) per tensor, in file order: u64 FNV-1a 64 of its record (name_len through its
 *                      last data byte), so a flipped bit anywhere in a record names that tensor.
 *
 * Names are unique within a file. Nothing follows the checksums (version 1: the last tensor).
 * Version 1 files (no checksums: the golden files of tests/golden/) are still read; tf_file.version
 * tells a caller that wants to say their data could not be verified.
 *
 * The reader checks the magic, the version, the reserved field, and every length against the file's
 * size before it allocates or reads anything, so a truncated or hostile file gives a one-line error
 * ("path: tensor 3 'name' at byte 120: what is wrong"; tensors count from 0), never a crash or a huge
 * allocation. The writer streams tensors to "path.tmp" (no count needed up front), then patches the
 * count, fsyncs and renames, so `path` is either the old file or the complete new one.
 *
 * Errors: functions that can fail return a ct_status (or NULL) and leave one line for ct_last_error()
 * (base/error.h). Ownership: tf_read's result owns every name and data buffer; tf_free releases them
 * all.
 */
#ifndef CTITAN_TENSORFILE_H
#define CTITAN_TENSORFILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define TF_VERSION 2 /* written; 1 is still read */
#define TF_MAX_DIMS 6
#define TF_MAX_NAME 1024

/* The dtype codes are those of ct_dtype in ctitan/tensor.h. */
enum { TF_F32 = 1, TF_I32 = 5 };

typedef struct tf_entry {
    char *name;                /* NUL-terminated copy of the stored name */
    int dtype;                 /* TF_F32 or TF_I32 */
    int ndim;                  /* 0..TF_MAX_DIMS */
    int64_t shape[TF_MAX_DIMS];/* shape[ndim..] are 0 */
    int64_t numel;             /* product of shape; 1 for a scalar */
    void *data;                /* numel * 4 bytes, aligned for float/int32_t */
} tf_entry;

typedef struct tf_file {
    tf_entry *entries;         /* in file order */
    int count;
    int version;               /* as read: 1 = no checksums, 2 = every record checked */
} tf_file;

/* Reads and validates a whole file. NULL on error. */
tf_file *tf_read(const char *path);

/* The same over bytes in memory; `label` stands for the path in error messages. */
tf_file *tf_read_mem(const void *buf, size_t len, const char *label);

/* Only the first tensor, when its record (name, header and data) fits in `cap` bytes: a tf_file of
 * that one entry, validated and (version 2) checked against its checksum as tf_read does; of no
 * entry when the file has none or the first is larger. Reads that record and one checksum, not the
 * file: what a reader of a model's description (written first) needs. NULL on error. */
tf_file *tf_read_first(const char *path, size_t cap);

/* The entry called `name`, or NULL. */
const tf_entry *tf_find(const tf_file *f, const char *name);

/* The entry called `name` if it has this dtype and shape; otherwise NULL and a message such as
 * "tensor 'x' has shape (3, 4), expected (4, 3)". `label` prefixes the message (may be NULL). */
const tf_entry *tf_expect(const tf_file *f, const char *label, const char *name, int dtype, int ndim,
                          const int64_t *shape);

void tf_free(tf_file *f);

/* CT_OK if every f32 entry is finite; else CT_ERR_INVALID and "label: tensor 'name' holds NaN at element
 * 17 of 4096" (the first non-finite value, file order). A model with NaN or Inf weights is refused on
 * load. */
ct_status tf_check_finite(const tf_file *f, const char *label);
/* The same over n floats of one tensor; `what` names it in the message. */
ct_status tf_check_finite_data(const float *x, int64_t n, const char *label, const char *what);

/* Writer. tf_writer_add copies nothing it does not write at once; it returns CT_OK, or a status with the
 * message set (CT_ERR_INVALID for a bad argument, CT_ERR_IO, CT_ERR_NOMEM). The first error is sticky:
 * later adds return its status again and do nothing, tf_writer_error gives the message, and
 * tf_writer_close reports it (its status and ct_last_error). */
typedef struct tf_writer tf_writer;

tf_writer *tf_writer_open(const char *path);
ct_status tf_writer_add(tf_writer *w, const char *name, int dtype, int ndim, const int64_t *shape,
                        const void *data);
const char *tf_writer_error(const tf_writer *w); /* "" while there is no error */
/* Patches the count, fsyncs, renames path.tmp to path and frees w. On any error (including an
 * earlier add's) it removes path.tmp, leaves path untouched, frees w and returns its status. */
ct_status tf_writer_close(tf_writer *w);
/* Gives up: removes path.tmp and frees w. NULL is a no-op. */
void tf_writer_abort(tf_writer *w);

/* Text in an entry (a model file's description, JSON): the UTF-8 bytes packed four to an int32
 * element, byte k in bits 8(k%4).. of element k/4 (so the file holds the bytes in order), the last
 * element padded with NULs; shape (ceil(len/4)). Readers that do not know the entry skip it as any
 * other non-parameter. tf_writer_add_text: a status as tf_writer_add. tf_text: in *text a malloc'd
 * NUL-terminated copy of entry `name`'s text, or NULL when there is no such entry (both CT_OK); an
 * error and a one-line message ("label: tensor 'name': ...") when it is not text (dtype, rank, a NUL
 * before the padding, invalid UTF-8). */
ct_status tf_writer_add_text(tf_writer *w, const char *name, const char *text);
ct_status tf_text(const tf_file *f, const char *label, const char *name, char **text);

#endif
