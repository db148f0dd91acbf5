/* data.h: the data loader. It cuts the token stream into windows of seq_len + 1 tokens
 * (inputs and the targets shifted by one), shuffles the windows per epoch with the seed, and
 * numbers the resulting sequences 0, 1, 2, ... over all epochs.
 *
 * Step k's global batch is sequences [k*G, (k+1)*G) whatever the parallel layout; data-parallel
 * rank r of dp takes the contiguous slice [k*G + r*G/dp, k*G + (r+1)*G/dp), cut into microbatches.
 * So every layout sees the same global batch as the single-rank run, and the position (the next
 * sequence number) is the loader's whole state, saved for resume.
 */
#ifndef CT_DATA_H
#define CT_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct dataloader {
    uint32_t *tokens;
    uint64_t n_tokens;
    int64_t seq_len;
    int64_t n_windows;
    uint64_t seed;
    uint32_t *perm; /* window order of epoch perm_epoch */
    int64_t perm_epoch;
    int64_t position; /* next global sequence number */
} dataloader;

/* Opens a shard file or a folder of *.bin shards (concatenated in name order). Every token must
 * be below vocab. */
int dataloader_open(dataloader *dl, const char *path, int64_t seq_len, uint64_t seed, int64_t vocab, char *err,
                    size_t errlen);
void dataloader_close(dataloader *dl);
/* The global sequence number of row i of data-parallel rank dp_rank's slice of the global batch of
 * G sequences that starts at sequence `base` (G divisible by dp). */
static inline int64_t dataloader_global_index(int64_t base, int64_t G, int64_t dp_rank, int64_t dp, int64_t i) {
    return base + dp_rank * (G / dp) + i;
}

/* Sequence number s: inputs and targets (seq_len each). */
int dataloader_sequence(dataloader *dl, int64_t s, int32_t *inputs, int32_t *targets);

#endif
