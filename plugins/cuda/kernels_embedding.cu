/* kernels_embedding.cu: the embedding backward, deterministic without float atomics.
 *
 *   1. keys[i] = ids[i] - begin for ids inside the table, else `rows` (a key past every row);
 *      vals[i] = i.
 *   2. A stable radix sort of (key, i) pairs (CUB): tokens of one id become a contiguous run,
 *      in token order.
 *   3. One block per (sorted position, 128-column slice): a block at the start of a run adds
 *      the run's dout rows, in token order, into its table row (read once, written once).
 *
 * The sum for each table element therefore runs in token order, exactly as the CPU plugin's
 * column-block loop does, and gives the same bits run to run. Blocks not at the start of a run
 * exit after two loads. Cost: a sort of n pairs and one read of dout; a run of a frequent id is
 * summed by one block per column slice (its length bounds that block's time).
 *
 * This file is apart from the others because CUB's templates are slow to compile.
 */
#include "kernels_common.cuh"

#include <cub/device/device_radix_sort.cuh>

/* Columns per block of the run sums. */
#define CUK_EMB_COLS 128

static __global__ void embedding_keys_k(int32_t *keys, int32_t *vals, const int32_t *ids, int64_t n,
                                        int64_t begin, int64_t rows, const unsigned long long *bad)
{
    if (cuk_is_bad(bad, n))
        return;
    CUK_FOR(i, n) {
        int64_t r = (int64_t)ids[i] - begin;
        keys[i] = (int32_t)(r >= 0 && r < rows ? r : rows);
        vals[i] = (int32_t)i;
    }
}

/* dtable[key] += the run of dout rows that starts at sorted position blockIdx.x. */
static __global__ void embedding_runs_k(float *dtable, const float *dout, const int32_t *keys,
                                        const int32_t *vals, int64_t n, int64_t c, int64_t rows,
                                        const unsigned long long *bad)
{
    if (cuk_is_bad(bad, n))
        return;
    const int64_t i = blockIdx.x;
    const int32_t key = keys[i];
    if (key >= rows || (i > 0 && keys[i - 1] == key))
        return;
    const int64_t col = (int64_t)blockIdx.y * CUK_EMB_COLS + threadIdx.x;
    if (col >= c)
        return;
    float *dst = dtable + (int64_t)key * c + col;
    float acc = *dst;
    for (int64_t j = i; j < n && keys[j] == key; j++)
        acc += dout[(int64_t)vals[j] * c + col];
    *dst = acc;
}

extern "C" cudaError_t cuk_embedding_backward(const cuk_env *e, float *dtable, const int32_t *ids,
                                              const float *dout, int64_t n, int64_t c, int64_t begin,
                                              int64_t rows, const unsigned long long *bad)
{
    /* the sort looks at the key bits that can be set: keys run to `rows` (the outsiders) */
    int end_bit = 1;
    while (end_bit < 31 && ((int64_t)1 << end_bit) <= rows)
        end_bit++;
    const int num = (int)n;
    size_t temp_bytes = 0;
    cudaError_t err = cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                                      (const int32_t *)NULL, (int32_t *)NULL, num, 0, end_bit,
                                                      e->stream);
    if (err != cudaSuccess)
        return err;
    size_t pairs = sizeof(int32_t) * (size_t)n, head = (4 * pairs + 255) / 256 * 256;
    char *scratch = (char *)cuda_scratch_get(e->dev, head + temp_bytes);
    if (!scratch)
        return cudaErrorMemoryAllocation;
    int32_t *keys_in = (int32_t *)scratch, *vals_in = keys_in + n, *keys = vals_in + n, *vals = keys + n;
    embedding_keys_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(keys_in, vals_in, ids, n,
                                                                                  begin, rows, bad);
    err = cudaGetLastError();
    if (err == cudaSuccess)
        err = cub::DeviceRadixSort::SortPairs(scratch + head, temp_bytes, keys_in, keys, vals_in, vals, num, 0,
                                              end_bit, e->stream);
    if (err == cudaSuccess) {
        dim3 grid((unsigned)n, (unsigned)((c + CUK_EMB_COLS - 1) / CUK_EMB_COLS));
        embedding_runs_k<<<grid, CUK_EMB_COLS, 0, e->stream>>>(dtable, dout, keys, vals, n, c, rows, bad);
        err = cudaGetLastError();
    }
    cuda_scratch_put(e->dev, scratch);
    return err;
}
