/* shard.h: token shards, the files `ctitan tokenize` writes and the data loader reads.
 *
 * Layout, little-endian:
 *
 *   header, 32 bytes:  "CTTOKENS" (8 bytes) | u32 version = 1 | u32 bytes per token = 4
 *                      | u64 token count | u64 reserved = 0
 *   then count tokens, u32 each.
 *
 * The reader checks the magic, the version, the bytes per token, the reserved field, and that the file
 * is exactly 32 + 4 * count bytes long before it allocates anything; every message names the file and
 * what is wrong ("data.bin: truncated: header says 100 tokens (432 bytes), file has 400 bytes").
 * Writers go to "path.tmp", fsync, then rename, so `path` is either absent/old or complete.
 *
 * Errors: functions that can fail take (char *err, size_t errlen), write one line there (err may be
 * NULL) and return -1 (0 on success). Nothing here exits.
 */
#ifndef CTITAN_SHARD_H
#define CTITAN_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC "CTTOKENS"
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 32

/* Writes n tokens (atomically). */
int shard_write(const char *path, const uint32_t *tokens, uint64_t n, char *err, size_t errlen);

/* Reads a whole shard: *tokens is malloc'd (free with shard_free; NULL when *n is 0). */
int shard_read(const char *path, uint32_t **tokens, uint64_t *n, char *err, size_t errlen);
void shard_free(uint32_t *tokens);

/* Checks the header and size only; *n is the token count. */
int shard_count(const char *path, uint64_t *n, char *err, size_t errlen);

/* A streaming writer: tokens are appended to "path.tmp"; shard_writer_close patches the count,
 * fsyncs and renames. shard_writer_abort (or a failed close) removes the temporary file. */
typedef struct shard_writer shard_writer;
shard_writer *shard_writer_open(const char *path, char *err, size_t errlen);
int shard_writer_append(shard_writer *w, const uint32_t *tokens, size_t n, char *err, size_t errlen);
uint64_t shard_writer_count(const shard_writer *w);
int shard_writer_close(shard_writer *w, char *err, size_t errlen);   /* frees w */
void shard_writer_abort(shard_writer *w);                             /* frees w */

#endif
