/* tests/cuda_emu: a stand-in for CUB's DeviceRadixSort::SortPairs: a stable sort on the key bits
 * [begin_bit, end_bit), as CUB's LSD radix sort orders them, queued to `stream` like CUB's kernels
 * (emu_enqueue: a capture records it; the size query queues nothing). Needs cuda_emu.h first. */
#ifndef CTITAN_CUDA_EMU_CUB_RADIX_SORT_CUH
#define CTITAN_CUDA_EMU_CUB_RADIX_SORT_CUH

#include <algorithm>
#include <numeric>
#include <vector>

namespace cub {
struct DeviceRadixSort {
    template <typename K, typename V>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out, const V *vals_in,
                                 V *vals_out, int n, int begin_bit, int end_bit, cudaStream_t stream)
    {
        if (!temp) {
            temp_bytes = 256 + (size_t)n; /* something to allocate, as CUB asks for */
            return cudaSuccess;
        }
        return emu_enqueue(stream, "cub::DeviceRadixSort::SortPairs", [=](bool run) {
            if (n < 0 || begin_bit < 0 || end_bit > (int)(8 * sizeof(K)) || begin_bit >= end_bit)
                return cudaErrorInvalidValue;
            if (run)
                sort(keys_in, keys_out, vals_in, vals_out, n, begin_bit, end_bit);
            return cudaSuccess;
        });
    }

  private:
    template <typename K, typename V>
    static void sort(const K *keys_in, K *keys_out, const V *vals_in, V *vals_out, int n, int begin_bit, int end_bit)
    {
        typedef typename std::make_unsigned<K>::type U;
        U mask = (U)((end_bit - begin_bit >= (int)(8 * sizeof(U))) ? ~(U)0 : (((U)1 << (end_bit - begin_bit)) - 1));
        auto digit = [&](K k) { return (U)(((U)k >> begin_bit) & mask); };
        std::vector<int> order((size_t)n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return digit(keys_in[a]) < digit(keys_in[b]); });
        std::vector<K> k2((size_t)n);
        std::vector<V> v2((size_t)n);
        for (int i = 0; i < n; i++) {
            k2[(size_t)i] = keys_in[order[(size_t)i]];
            v2[(size_t)i] = vals_in[order[(size_t)i]];
        }
        std::copy(k2.begin(), k2.end(), keys_out);
        std::copy(v2.begin(), v2.end(), vals_out);
    }
};
} // namespace cub

#endif
