/* shard.h: token shards, the files `ctitan tokenize` writes and the data loader reads.
 *
 * Layout, little-endian:
 *
 *   header, 32 bytes:  "CTTOKENS" (8 bytes) | u32 version = 2, 3 or 4 | u32 bytes per token = 4
 *                      | u64 token count | u64 checksum
 *   then count tokens, u32 each.
 *
 * Version 3 (a shard with a loss mask, as `ctitan tokenize --format chat` writes) is version 2 whose
 * token words carry a flag in bit 31 (SHARD_MASKED): that token, as the target of the token before it,
 * does not count in the loss (the loader gives CT_IGNORE_INDEX for it); as an input it is the id in
 * the low 31 bits. Token ids are below 2^31 in every version, so a version 1 or 2 word with bit 31 set
 * is an id out of any vocabulary, never a mask; the version, not the bit, says which a shard means.
 * A version 3 shard must hold at least one unmasked token after its first (else nothing would count).
 *
 * Version 4 (what `ctitan tokenize --format chat` writes since document starts were recorded) is
 * version 3 whose words may also carry SHARD_DOC_START in bit 30: that token starts a document (a
 * conversation). Under block-causal attention the loader then takes its documents from these starts,
 * not from the EOS (a chat template whose turns end in the EOS, ChatML's <|im_end|> as Qwen's EOS, would
 * otherwise make each turn a document). Its ids are below 2^30. Versions 1 to 3 read exactly as before;
 * a reader that knows only versions 1 to 3 refuses a version 4 shard, naming its version.
 *
 * Version 2's checksum is the CRC-32 (zlib's crc32, the one gzip and Python's zlib.crc32 compute) of
 * the 4 * count token bytes in the low 32 bits, the high 32 bits zero. Version 1 (written before the
 * checksum) has 0 there and is still read, unchecked. CRC-32 finds every corruption of up to 32
 * consecutive bits (any flipped byte, any torn 4-byte token) and runs at GB/s; the header's own fields
 * are checked against each other and the file size instead.
 *
 * The reader checks the magic, the version (1 to 4), the bytes per token, the checksum field's high
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
#define SHARD_VERSION 2        /* what writers write; readers read 1 (no checksum), 2 and 3 (masked) */
#define SHARD_VERSION_MASKED 3 /* version 2 with SHARD_MASKED flags in the token words */
#define SHARD_VERSION_DOCS 4   /* version 3 with SHARD_DOC_START flags as well */
#define SHARD_MASKED 0x80000000u
#define SHARD_ID_MASK 0x7fffffffu
#define SHARD_DOC_START 0x40000000u /* version 4: the token starts a document */
#define SHARD_DOC_ID_MASK 0x3fffffffu
#define SHARD_HEADER_BYTES 32

/* Writes n tokens (atomically). */
ct_status shard_write(const char *path, const uint32_t *tokens, uint64_t n);

/* Reads a whole shard: *tokens is malloc'd (free with shard_free; NULL when *n is 0). A version 3 or 4
 * shard's words keep their SHARD_MASKED (and SHARD_DOC_START) flags: use shard_read_info to know which version was read. */
ct_status shard_read(const char *path, uint32_t **tokens, uint64_t *n);
void shard_free(uint32_t *tokens);

/* Checks the header and size only (no pass over the tokens); *n is the token count. */
ct_status shard_count(const char *path, uint64_t *n);

/* What a shard's header says, after every check shard_read makes (the checksum included), streaming
 * the tokens through a fixed buffer: for a reader that maps the file, or a tool that only checks it. */
typedef struct shard_info {
    uint32_t version;     /* 1, 2, 3 (SHARD_VERSION_MASKED) or 4 (SHARD_VERSION_DOCS) */
    uint64_t count;       /* tokens */
    uint32_t checksum;    /* CRC-32 of the token bytes (version 1: computed here, not stored) */
    uint64_t documents;   /* version 4, shard_verify: the words flagged SHARD_DOC_START; else 0 */
} shard_info;
ct_status shard_verify(const char *path, shard_info *info);
/* shard_read that also fills *info (may be NULL). */
ct_status shard_read_info(const char *path, uint32_t **tokens, uint64_t *n, shard_info *info);

/* A streaming writer: tokens are appended to "path.tmp" (path's folder is made when missing);
 * shard_writer_close patches the count and checksum, fsyncs and renames. shard_writer_abort (or a
 * failed close) removes the temporary file. */
typedef struct shard_writer shard_writer;
shard_writer *shard_writer_open(const char *path);
/* The same, writing version 3: the words appended carry SHARD_MASKED where a target is masked. */
shard_writer *shard_writer_open_masked(const char *path);
/* The same, writing version 4: SHARD_MASKED, and SHARD_DOC_START on each document's first token. */
shard_writer *shard_writer_open_docs(const char *path);
ct_status shard_writer_append(shard_writer *w, const uint32_t *tokens, size_t n);
uint64_t shard_writer_count(const shard_writer *w);
ct_status shard_writer_close(shard_writer *w);   /* frees w */
void shard_writer_abort(shard_writer *w);         /* frees w */

#endif
