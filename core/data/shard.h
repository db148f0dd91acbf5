/* shard.h: token shards, the files `ctitan tokenize` writes and the data loader reads.
 *
 * Layout, little-endian:
 *
 *   header, 32 bytes:  "CTTOKENS" (8 bytes) | u32 version = 2 | u32 bytes per token = 4
 *                      | u64 token count | u64 checksum
 *   then count tokens, u32 each.
 *
 * Version 2's checksum is the CRC-32 (zlib's crc32, the one gzip and Python's zlib.crc32 compute) of
 * the 4 * count token bytes in the low 32 bits, the high 32 bits zero. Version 1 (written before the
 * checksum) has 0 there and is still read, unchecked. CRC-32 finds every corruption of up to 32
 * consecutive bits (any flipped byte, any torn 4-byte token) and runs at GB/s; the header's own fields
 * are checked against each other and the file size instead.
 *
 * The reader checks the magic, the version (1 or 2), the bytes per token, the checksum field's high
 * half (version 1: the whole field is 0), and that the file is exactly 32 + 4 * count bytes long before
 * it allocates anything; shard_read and shard_verify then check the checksum over the tokens ("data.bin:
 * checksum mismatch: the header says 0x1234abcd, the tokens give 0x89abcdef; the file is corrupt").
 * Every message names the file and what is wrong ("data.bin: truncated: header says 100 tokens (432
 * bytes), file has 400 bytes"). Writers write version 2, computing the checksum as tokens stream
 * through; they go to "path.tmp", fsync, then rename, so `path` is either absent/old or complete.
 *
 * Errors: functions that can fail return a ct_status (shard_writer_open: NULL) and leave one line for
 * ct_last_error() (base/error.h). Nothing here exits.
 */
#ifndef CTITAN_SHARD_H
#define CTITAN_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define SHARD_MAGIC "CTTOKENS"
#define SHARD_VERSION 2        /* what writers write; readers read 1 (no checksum) and 2 */
#define SHARD_HEADER_BYTES 32

/* Writes n tokens (atomically). */
ct_status shard_write(const char *path, const uint32_t *tokens, uint64_t n);

/* Reads a whole shard: *tokens is malloc'd (free with shard_free; NULL when *n is 0). */
ct_status shard_read(const char *path, uint32_t **tokens, uint64_t *n);
void shard_free(uint32_t *tokens);

/* Checks the header and size only (no pass over the tokens); *n is the token count. */
ct_status shard_count(const char *path, uint64_t *n);

/* What a shard's header says, after every check shard_read makes (the checksum included), streaming
 * the tokens through a fixed buffer: for a reader that maps the file, or a tool that only checks it. */
typedef struct shard_info {
    uint32_t version;     /* 1 or 2 */
    uint64_t count;       /* tokens */
    uint32_t checksum;    /* CRC-32 of the token bytes (version 1: computed here, not stored) */
} shard_info;
ct_status shard_verify(const char *path, shard_info *info);

/* A streaming writer: tokens are appended to "path.tmp" (path's folder is made when missing);
 * shard_writer_close patches the count and checksum, fsyncs and renames. shard_writer_abort (or a
 * failed close) removes the temporary file. */
typedef struct shard_writer shard_writer;
shard_writer *shard_writer_open(const char *path);
ct_status shard_writer_append(shard_writer *w, const uint32_t *tokens, size_t n);
uint64_t shard_writer_count(const shard_writer *w);
ct_status shard_writer_close(shard_writer *w);   /* frees w */
void shard_writer_abort(shard_writer *w);         /* frees w */

#endif
