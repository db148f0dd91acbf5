/* instream.h: an input file or standard input, decompressed on the fly (`ctitan tokenize`'s reader).
 *
 * The format is told by the first bytes, not the name: gzip (1f 8b; several members one after another
 * are one stream, as `cat a.gz b.gz` makes), zstd (28 b5 2f fd; several frames, skippable frames
 * skipped), anything else is plain bytes. A name ending in .gz or .zst whose bytes are not that format,
 * and xz or bzip2 data, are refused. Memory is two fixed buffers and the decompressor's state (zstd's
 * window: up to 128 MiB for frames made with --long, 8 MiB at most at the CLI's default levels).
 *
 * Errors are one line (ct_last_error) naming the file (or "standard input") and what is wrong:
 * "a.jsonl.gz: truncated gzip data: the input ends inside member 2 (at compressed byte 1234)".
 * instream_bad_input tells a fault of the input (a missing file, corrupt or truncated data: exit status
 * 2) from one of the system (a read error, out of memory); instream_read's status says the same
 * (CT_ERR_INVALID for the input's fault, CT_ERR_IO or CT_ERR_NOMEM for the system's).
 */
#ifndef CTITAN_INSTREAM_H
#define CTITAN_INSTREAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ctitan/abi.h"

typedef enum { INSTREAM_PLAIN, INSTREAM_GZIP, INSTREAM_ZSTD } instream_format;

typedef struct instream instream;

/* Opens path, "-" for standard input (not closed by instream_close), and reads its first bytes to
 * tell the format. NULL with the message set, and *bad_input (may be NULL) 1 when it is the input's
 * fault. */
instream *instream_open(const char *path, int *bad_input);

/* Up to cap decompressed bytes into buf, their count in *got (0 at the end of the input). */
ct_status instream_read(instream *s, void *buf, size_t cap, size_t *got);

const char *instream_name(const instream *s);            /* the path, or "standard input" */
uint64_t instream_offset(const instream *s);             /* bytes read from the file (compressed) */
int64_t instream_size(const instream *s);                /* the file's size, -1 when not a regular file */
int instream_bad_input(const instream *s);               /* 1 when the last error was the input's fault */

void instream_close(instream *s);                        /* NULL is fine */

#endif
