/* hf_tokenizer.h: reads a Hugging Face tokenizer.json (byte-level BPE) into a ct_tokenizer.
 *
 * What is read (anything else gets one line naming the JSON key and its value):
 *   model            type "BPE"; vocab {token: id}; merges as "a b" strings or ["a", "b"] pairs (rank =
 *                    position, may be empty); ignore_merges; dropout null, no subword prefix or word
 *                    suffix. A key in ByteLevel's byte alphabet stands for the bytes its characters
 *                    map to, and encoding can give it. A key with any character outside the alphabet
 *                    (torchtitan's test tokenizer has "\u0000", " the", "\\x80") can never come out of
 *                    encoding and decodes to its own UTF-8, as the package's ByteLevel decoder does.
 *                    A byte whose alphabet character is no key is dropped when encoding, as the
 *                    package does without unk_token or byte_fallback; the loaded tokenizer says so in
 *                    tokenizer_notice (how many bytes, which). "\u0000" is read through U+FFFF
 *                    (hf_json_mask_nul): a file that also holds U+FFFF is refused.
 *   pre_tokenizer    ByteLevel (use_regex: GPT-2's pattern; add_prefix_space), or a Sequence of one
 *                    Split (a Regex or String pattern, behavior Isolated, invert false) and a ByteLevel.
 *   normalizer       null, or NFC (Qwen2's): ctitan does not normalise; text already in NFC (where
 *                    NFC changes nothing) is encoded, other text is refused with the byte offset
 *                    and code point (hf_nfc_check; Unicode data from NFC_UNICODE_VERSION).
 *   added_tokens     id, content, special, normalized; single_word, lstrip and rstrip must be false.
 *   decoder          null or ByteLevel; post_processor, truncation and padding are not used (ctitan
 *                    adds BOS/EOS itself).
 * tokenizer_config.json (next to tokenizer.json) gives bos_token / eos_token, each a string, null or
 * {"content": ...}; without it, <|begin_of_text|> is the BOS and <|end_of_text|> or <|endoftext|> the
 * EOS when the file has them.
 *
 * Errors (ct_last_error, NULL returned) read "path: key: what is wrong" (path:line:column for JSON
 * syntax). Nothing here exits.
 */
#ifndef CTITAN_HF_TOKENIZER_H
#define CTITAN_HF_TOKENIZER_H

#include "tokenizer/tokenizer.h"

/* GPT-2's pre-tokenisation pattern (ByteLevel with use_regex true). */
#define HF_GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Qwen2's (Llama 3's with single digits). */
#define HF_QWEN2_PATTERN                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct hf_added {
    const unsigned char *content; /* the text that stands for the token (not NUL-terminated) */
    size_t len;
    int32_t id;
    int special;    /* "special": true */
    int normalized; /* matched in a second pass, after the normalized=false tokens */
} hf_added;

/* A validated tokenizer.json, handed to tokenizer_from_hf (tokenizer.c). Ids are below 2^24. */
typedef struct hf_spec {
    size_t n_vocab;            /* model.vocab */
    const unsigned char **vocab_bytes;
    uint32_t *vocab_len;
    int32_t *vocab_id;
    const unsigned char *vocab_encodable; /* 1: the key is in the byte alphabet (encoding can give it);
                                           * the bytes of these tokens are unique, the others' need not be */
    size_t n_merges;           /* model.merges in rank order: (left id, right id, merged id) */
    int32_t (*merges)[3];
    size_t n_added;
    hf_added *added;
    const char *split_pattern; /* Split's regex, or NULL */
    int split_literal;         /* Split's pattern is a String, not a Regex */
    int byte_level_regex;      /* ByteLevel's use_regex: GPT-2's pattern after the Split */
    int add_prefix_space;      /* ByteLevel's: a space before every piece that lacks one */
    int ignore_merges;         /* a chunk that is a vocab token is emitted whole */
    int nfc;                   /* normalizer NFC: text must already be in NFC */
    int32_t bos, eos;          /* -1 when there is none */
    const char *notice;        /* one line for the user (bytes with no token, dropped), or NULL */
} hf_spec;

/* 0 if the text is certainly in Unicode NFC (so NFC leaves it as it is); 1 if it is not, or cannot be
 * told without normalising (a combining mark after a precomposed letter, a code point unassigned in
 * NFC_UNICODE_VERSION), with the byte offset and code point in *at, *code. Invalid UTF-8 is skipped. */
int hf_nfc_check(const unsigned char *s, size_t n, size_t *at, uint32_t *code);

/* jansson refuses NUL in object keys: a copy of the JSON text with every \u0000 escape inside a
 * string rewritten to \uFFFF (same length) in *masked (malloc'd), or *masked NULL when there is none.
 * CT_ERR_INVALID ("label:line:column: ...") when the text holds U+FFFF too (raw or escaped), which
 * would then be read as NUL; CT_ERR_NOMEM. Exposed for tests. */
ct_status hf_json_mask_nul(const char *json, size_t len, const char *label, char **masked);

/* Reads tokenizer.json bytes; config_path (may be NULL or missing on disk) is tokenizer_config.json. */
ct_tokenizer *hf_tokenizer_load_json(const char *json, size_t len, const char *label, const char *config_path);

/* Builds the tokenizer from a validated spec (in tokenizer.c: it owns the struct). */
ct_tokenizer *tokenizer_from_hf(const hf_spec *s, const char *label);

#endif
