/* data.h: the data loader. It cuts each source's token stream into windows of seq_len + 1 tokens
 * (inputs and the targets shifted by one), shuffles each source's windows per epoch of that source
 * with the seed, and numbers the resulting sequences 0, 1, 2, ... over all epochs.
 *
 * Several sources mix by weight: every period of P sequences (P = data_period) holds exactly
 * count_i sequences of source i, count_i being P w_i / sum(w) rounded by largest remainder (ties to
 * the earlier source), at least 1; where in the period they fall is a permutation drawn from (seed,
 * period). Source i's k-th sequence is its own stream's k-th, so the source and the window of any
 * global sequence number follow from the number alone. One source is read exactly as before.
 *
 * Step k's global batch is sequences [k*G, (k+1)*G) whatever the parallel layout; data-parallel
 * rank r of dp takes the contiguous slice [k*G + r*G/dp, k*G + (r+1)*G/dp), cut into microbatches.
 * So every layout sees the same global batch as the single-rank run, and the position (the next
 * sequence number) is the loader's whole state, saved for resume.
 *
 * An ordered loader (validation) neither shuffles nor mixes: its sequences are the sources' windows in
 * order, source after source, each read once (data_ordered_count of them).
 *
 * Errors: the functions returning a ct_status leave one line for ct_last_error() (base/error.h).
 */
#ifndef CT_DATA_H
#define CT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct data_source {
    char *path;         /* as opened */
    uint32_t *tokens;   /* a masked source's words keep SHARD_MASKED (data/shard.h) */
    uint64_t n_tokens;
    int masked;         /* one of its shards is version 3 or 4 (the others have no flags to strip) */
    int docs;           /* its shards record document starts (version 4, all of them) */
    int64_t n_windows;
    double weight;
    int64_t count;      /* sequences per period */
    uint32_t *perm;     /* window order of epoch perm_epoch */
    int64_t perm_epoch;
    int64_t first;      /* ordered: the global number of its first window */
    int64_t seen;       /* scratch while a period is laid out */
} data_source;

typedef struct dataloader {
    data_source *src;
    int n_src;
    int ordered;        /* validation: no shuffle, no mixing */
    int docs;           /* some source records document starts (dataloader_sequence_docs) */
    int64_t seq_len;
    uint64_t seed;
    uint64_t n_tokens;  /* over every source */
    int64_t n_windows;
    int64_t period;     /* P: sequences per mixing period (several sources) */
    uint32_t *slot_src, *slot_rank; /* period slot_period: each slot's source and its rank among that source's */
    int64_t slot_period;
    int64_t position;   /* next global sequence number */
} dataloader;

/* An empty loader: add sources, then dataloader_mix (or nothing more when ordered). */
void dataloader_init(dataloader *dl, int64_t seq_len, uint64_t seed, int ordered);
/* Adds a shard file or a folder of *.bin shards (concatenated in name order) with its weight (> 0,
 * finite). Every token must be below vocab, and the source must hold one window of seq_len + 1. */
ct_status dataloader_add(dataloader *dl, const char *path, double weight, int64_t vocab);
/* After the last source: the per-period counts. */
ct_status dataloader_mix(dataloader *dl);
/* One source, as training.dataset_path: init, add, mix. */
ct_status dataloader_open(dataloader *dl, const char *path, int64_t seq_len, uint64_t seed, int64_t vocab);
void dataloader_close(dataloader *dl);
/* The global sequence number of row i of data-parallel rank dp_rank's slice of the global batch of
 * G sequences that starts at sequence `base` (G divisible by dp). */
static inline int64_t dataloader_global_index(int64_t base, int64_t G, int64_t dp_rank, int64_t dp, int64_t i) {
    return base + dp_rank * (G / dp) + i;
}

/* Sequence number s: inputs and targets (seq_len each). A target that a masked shard (version 3) flags
 * is CT_IGNORE_INDEX. An ordered loader past its last window gives
 * padding (inputs 0, targets CT_IGNORE_INDEX: no loss, no count). CT_OK; CT_ERR_INVALID with the line
 * set for a negative s. */
ct_status dataloader_sequence(dataloader *dl, int64_t s, int32_t *inputs, int32_t *targets);
/* dataloader_sequence, and for block-causal attention the window's documents: starts[t] (seq_len of
 * them) is 1 where input t starts a document, as a version 4 shard records it, or, for a source that
 * records none, right after an input equal to eos (-1: none). Either way a target that starts a
 * document is CT_IGNORE_INDEX (nothing of its document is visible to the query before it). Padding
 * rows have no starts. */
ct_status dataloader_sequence_docs(dataloader *dl, int64_t s, int32_t *inputs, int32_t *targets, uint8_t *starts,
                                   int32_t eos);
/* The index of the source sequence s comes from (-1: an ordered loader's padding, or s < 0). */
int dataloader_source_of(dataloader *dl, int64_t s);

#endif
