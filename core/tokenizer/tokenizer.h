/* tokenizer.h: byte-level BPE tokenizers (tiktoken files, Hugging Face tokenizer.json), the trainer,
 * the pre-tokenizer.
 *
 * tokenizer_load reads, by content: a tiktoken vocabulary (below), a Hugging Face tokenizer.json (a
 * JSON object; what it may hold and how it encodes: hf_tokenizer.h), or a folder (torchtitan's
 * model.hf_assets_path, a Hub download) holding tokenizer.json (+ tokenizer_config.json for BOS/EOS),
 * else tokenizer.model, else original/tokenizer.model. Anything else: one line naming those formats.
 *
 * Vocabulary file (Llama 3's tokenizer.model, "tiktoken" format): one line per base token,
 *
 *     <base64 of the token's bytes> <rank>
 *
 * with ranks 0..n-1, each once, in any order; blank lines are skipped. The file must hold all 256
 * single bytes (a byte-level BPE can then encode any input). Token id = rank for base tokens; the 256
 * special tokens follow at ids n..n+255 in Llama 3.1's order (<|begin_of_text|>, <|end_of_text|>, ...),
 * so tokenizer_vocab_size() is n + 256 (128256 for Llama 3).
 *
 * Encoding does what tiktoken's Encoding.encode does:
 *   1. with allow_special, the text is cut at every special token's text (emitted as its id);
 *   2. each piece is split into chunks by Llama 3's regex (PCRE2, UTF + UCP);
 *   3. a chunk that is itself a token is emitted as is; otherwise its bytes are merged by rank: the
 *      adjacent pair whose concatenation has the lowest rank is merged first (leftmost on ties), until
 *      no adjacent pair is a token.
 * Bytes that are not valid UTF-8 (which tiktoken, taking Python str, never sees) are cut out of the
 * text and encoded as single-byte tokens, so decode(encode(x)) == x for every byte string x.
 *
 * Errors: functions that can fail return NULL or a ct_status and leave one line in ct_last_error
 * (base/error.h). Loading errors read "path:line: what is wrong". Nothing here exits.
 * Threads: a loaded ct_tokenizer is read-only; tokenizer_encode/decode may run on it concurrently.
 */
#ifndef CTITAN_TOKENIZER_H
#define CTITAN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "ctitan/abi.h"

#define TOKENIZER_N_SPECIAL 256
#define TOKENIZER_MAX_BASE  (1 << 24)   /* base tokens a file may hold */

/* Llama 3's pre-tokenisation pattern (PCRE2 syntax; identical to tiktoken's pat_str). */
#define TOKENIZER_LLAMA3_PATTERN                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Offsets of some specials from the first special id (n_base). */
enum {
    TOKENIZER_BEGIN_OF_TEXT = 0,
    TOKENIZER_END_OF_TEXT = 1,
    TOKENIZER_START_HEADER = 6,
    TOKENIZER_END_HEADER = 7,
    TOKENIZER_EOM = 8,
    TOKENIZER_EOT = 9,
};

typedef struct ct_tokenizer ct_tokenizer;

/* ---- the tokenizer ---------------------------------------------------------------------------- */

/* Reads and validates a vocabulary file. NULL on error ("path:line: what is wrong"). */
ct_tokenizer *tokenizer_load(const char *path);

/* The same over bytes in memory; `label` stands for the path in messages. */
ct_tokenizer *tokenizer_load_mem(const char *data, size_t len, const char *label);

void tokenizer_free(ct_tokenizer *tok);

/* Encodes len bytes of text. allow_special: 1 = special-token text becomes the special id
 * (tiktoken's allowed_special="all"); 0 = it is ordinary text. On success *ids is a malloc'd array of
 * *n ids (the caller frees it; NULL when *n is 0). CT_ERR_INVALID for text the tokenizer refuses (not
 * in NFC, or its regex fails on it), CT_ERR_NOMEM. */
ct_status tokenizer_encode(const ct_tokenizer *tok, const char *text, size_t len, int allow_special,
                           int32_t **ids, size_t *n);

/* The bytes of n ids concatenated (specials decode to their text). Returns a malloc'd buffer of *len
 * bytes plus a terminating NUL that *len does not count; the bytes may be invalid UTF-8 and may hold
 * NULs. NULL on error (an id out of range). */
char *tokenizer_decode(const ct_tokenizer *tok, const int32_t *ids, size_t n, size_t *len);

int tokenizer_vocab_size(const ct_tokenizer *tok); /* highest id + 1 (tiktoken: n_base + 256) */
int tokenizer_n_base(const ct_tokenizer *tok);     /* tokens in the file (tokenizer.json: model.vocab's) */
/* BOS / EOS: tiktoken's <|begin_of_text|> / <|end_of_text|>; tokenizer.json's from
 * tokenizer_config.json, else those names, else (EOS) <|endoftext|>. -1 when there is none (GPT-2
 * style files have no BOS). */
int tokenizer_bos_id(const ct_tokenizer *tok);
int tokenizer_eos_id(const ct_tokenizer *tok);

/* 1 if id is a special token (tiktoken: ids n_base..; tokenizer.json: added tokens marked
 * "special"), 0 otherwise (ordinary tokens, ids out of range). */
int tokenizer_is_special(const ct_tokenizer *tok, int32_t id);

/* The bytes of one token (not NUL-terminated), or NULL if id is out of range or names no token. */
const char *tokenizer_token_bytes(const ct_tokenizer *tok, int32_t id, size_t *len);

/* NULL, or one line the user should see once the tokenizer is loaded: a tokenizer.json whose vocabulary
 * leaves some bytes without a token, which encoding drops as the tokenizers package does ("PATH: 152 of
 * the 256 bytes have no token of their own ..."). The commands that encode print it on stderr. */
const char *tokenizer_notice(const ct_tokenizer *tok);

/* The text of special token i (0..255), e.g. "<|eot_id|>"; NULL if out of range. */
const char *tokenizer_special_name(int i);

/* Id of a special token's text (tokenizer.json: of any added token's), or -1. */
int tokenizer_special_id(const ct_tokenizer *tok, const char *name);

/* BPE-merges one chunk by rank (step 3 above, without the whole-chunk lookup; a tokenizer.json's by
 * merge rank, hf_tokenizer.h), appending the ids to
 * out (room for len ids). Returns the number of ids, 0 if out of memory (or, for a tokenizer.json,
 * when every byte of the chunk has no token and is dropped). Exposed for tests. */
size_t tokenizer_bpe_chunk(const ct_tokenizer *tok, const unsigned char *chunk, size_t len,
                           int32_t *out);

/* ---- the pre-tokenizer (shared by the tokenizer and the trainer) ------------------------------ */

typedef struct ct_pretok ct_pretok;

/* Compiles Llama 3's pattern (JIT when PCRE2 has it). NULL on error. */
ct_pretok *pretok_create(void);

/* Compiles another pattern (a tokenizer.json's); literal: the pattern is plain text. */
ct_pretok *pretok_create_pattern(const char *pattern, int literal);
void pretok_free(ct_pretok *pt);

/* Called once per chunk, in order; a status other than CT_OK stops the split and is returned by it. */
typedef ct_status (*pretok_chunk_fn)(void *ctx, const unsigned char *chunk, size_t len);

/* Splits text into regex chunks; every invalid UTF-8 byte becomes a chunk of its own. The chunks
 * cover the text exactly. Returns CT_OK, the callback's status, or (with the message set)
 * CT_ERR_INVALID when PCRE2 fails to match (a match limit) or CT_ERR_NOMEM. */
ct_status pretok_split(const ct_pretok *pt, const char *text, size_t len, pretok_chunk_fn fn, void *ctx);

/* ---- training (bpe_train.c) ------------------------------------------------------------------- */

typedef struct ct_bpe_trainer ct_bpe_trainer;

typedef struct ct_bpe_stats {
    uint64_t documents;     /* bpe_trainer_add calls */
    uint64_t bytes;         /* bytes of text seen */
    uint64_t chunks;        /* regex chunks seen */
    uint64_t unique_chunks; /* distinct chunks */
    int merges;             /* merges made */
    int n_base;             /* tokens in the trained vocabulary: 256 + merges (duplicates excepted) */
} ct_bpe_stats;

ct_bpe_trainer *bpe_trainer_create(void);
void bpe_trainer_free(ct_bpe_trainer *tr);

/* Adds one document's text (its chunks are counted; nothing crosses documents). */
ct_status bpe_trainer_add(ct_bpe_trainer *tr, const char *text, size_t len);

/* Learns merges until the base vocabulary has vocab_size - 256 tokens (the rest are the specials) or
 * no adjacent pair is left. The most frequent pair is merged first; ties go to the pair with the
 * lowest (left rank, right rank). vocab_size must be at least 512. */
ct_status bpe_trainer_train(ct_bpe_trainer *tr, int vocab_size);

/* Writes the vocabulary in tiktoken format (tmp file, fsync, rename). */
ct_status bpe_trainer_write(const ct_bpe_trainer *tr, const char *path);

void bpe_trainer_stats(const ct_bpe_trainer *tr, ct_bpe_stats *out);

#endif
