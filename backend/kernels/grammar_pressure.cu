// How hard a step's masks push its rows (issue 53): one read of each row's logits and mask, before
// the mask kernel writes -inf, gives the mass the mask removes and whether it removes the row's
// first choice.
//
// Two launches. pressure_parts_*: a grid of (chunks, rows) blocks, each over one chunk of a row (one
// block per row would leave most SMs idle and wait on one load after another). Each thread keeps an
// online log-sum-exp (max and scaled sum) over every logit and over the allowed ones, and the first
// index of the largest logit; a block merges its threads' into one Partial. pressure_merge: a warp
// per row merges the row's chunks. out[2 * row] is the removed mass, 1 - exp(lse(allowed) - lse(all)),
// and out[2 * row + 1] is 1.0 when the mask refuses the first choice (torch's argmax: the lowest
// index of the maximum). -inf logits add nothing; a row of only -inf removes nothing.
// Rows and masks are addressed as in mask_logits.cu: base + row * row_stride when row_stride > 0,
// otherwise rows[row]; tokens past the mask's words are refused.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#define PRESSURE_THREADS 256

struct Partial {
    float all_max, all_sum;    // every logit: sum of exp(x - all_max)
    float kept_max, kept_sum;  // the allowed ones
    float best;                // the largest logit, at index best_index (the lowest such index)
    int best_index;
};

__device__ __forceinline__ void add_to(float& max_value, float& sum, float x) {
    if (x == -CUDART_INF_F) {
        return;
    }
    if (x > max_value) {
        sum = sum * __expf(max_value - x) + 1.0f;  // (exp(-inf) is 0 while max_value is still -inf)
        max_value = x;
    } else {
        sum += __expf(x - max_value);
    }
}

__device__ __forceinline__ void merge_into(float& max_value, float& sum, float other_max, float other_sum) {
    if (other_max == -CUDART_INF_F) {
        return;
    }
    if (max_value == -CUDART_INF_F) {
        max_value = other_max;
        sum = other_sum;
        return;
    }
    const float top = fmaxf(max_value, other_max);
    sum = sum * __expf(max_value - top) + other_sum * __expf(other_max - top);
    max_value = top;
}

__device__ __forceinline__ void merge(Partial& into, const Partial& other) {
    merge_into(into.all_max, into.all_sum, other.all_max, other.all_sum);
    merge_into(into.kept_max, into.kept_sum, other.kept_max, other.kept_sum);
    if (other.best > into.best || (other.best == into.best && other.best_index < into.best_index)) {
        into.best = other.best;
        into.best_index = other.best_index;
    }
}

__device__ __forceinline__ Partial from_lane(const Partial& mine, int lane) {
    Partial other;
    other.all_max = __shfl_down_sync(0xffffffffu, mine.all_max, lane);
    other.all_sum = __shfl_down_sync(0xffffffffu, mine.all_sum, lane);
    other.kept_max = __shfl_down_sync(0xffffffffu, mine.kept_max, lane);
    other.kept_sum = __shfl_down_sync(0xffffffffu, mine.kept_sum, lane);
    other.best = __shfl_down_sync(0xffffffffu, mine.best, lane);
    other.best_index = __shfl_down_sync(0xffffffffu, mine.best_index, lane);
    return other;
}

__device__ __forceinline__ bool allowed(const uint32_t* mask, int mask_words, int token) {
    const int word = token >> 5;
    return word < mask_words && ((__ldg(mask + word) >> (token & 31)) & 1u);
}

__device__ __forceinline__ Partial empty_partial(int vocab) {
    Partial empty = {-CUDART_INF_F, 0.0f, -CUDART_INF_F, 0.0f, -CUDART_INF_F, vocab};
    return empty;
}

__device__ __forceinline__ Partial warp_merged(Partial mine) {
    for (int lane = 16; lane > 0; lane >>= 1) {
        merge(mine, from_lane(mine, lane));
    }
    return mine;
}

// The span of a chunk: a whole number of mask words, so that a warp reads one word per pass.
__device__ __forceinline__ int chunk_span(int vocab, int chunks) {
    return ((vocab + chunks - 1) / chunks + 31) & ~31;
}

template <typename T>
__device__ __forceinline__ void pressure_parts(T* const* rows, T* base, long long row_stride, const uint32_t* masks,
                                               int mask_stride, int mask_words, int vocab, Partial* parts,
                                               int chunks) {
    const long long row = blockIdx.y;
    const T* logits = row_stride > 0 ? base + row * row_stride : rows[row];
    const uint32_t* mask = masks + row * mask_stride;
    const int span = chunk_span(vocab, chunks);
    const int first = blockIdx.x * span;
    const int end = min(first + span, vocab);
    Partial mine = empty_partial(vocab);
#pragma unroll 4
    for (int token = first + threadIdx.x; token < end; token += blockDim.x) {
        const float x = static_cast<float>(logits[token]);
        if (x != x) {
            continue;  // NaN: no mass, never the first choice
        }
        add_to(mine.all_max, mine.all_sum, x);
        if (allowed(mask, mask_words, token)) {
            add_to(mine.kept_max, mine.kept_sum, x);
        }
        if (x > mine.best) {  // (tokens rise, so the first maximum stays)
            mine.best = x;
            mine.best_index = token;
        }
    }
    mine = warp_merged(mine);
    __shared__ Partial warps[PRESSURE_THREADS / 32];
    if ((threadIdx.x & 31) == 0) {
        warps[threadIdx.x >> 5] = mine;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int other = 1; other < static_cast<int>(blockDim.x >> 5); ++other) {
            merge(mine, warps[other]);
        }
        parts[row * chunks + blockIdx.x] = mine;
    }
}

// One warp per row (blockIdx.x): the row's chunks merged, the figures written.
extern "C" __global__ void pressure_merge(const Partial* parts, int chunks, const uint32_t* masks, int mask_stride,
                                          int mask_words, int vocab, float* out) {
    const long long row = blockIdx.x;
    Partial mine = empty_partial(vocab);
    for (int chunk = threadIdx.x; chunk < chunks; chunk += 32) {
        merge(mine, parts[row * chunks + chunk]);
    }
    mine = warp_merged(mine);
    if (threadIdx.x != 0) {
        return;
    }
    float removed = 0.0f;
    if (mine.all_max != -CUDART_INF_F) {
        const float kept =
            mine.kept_max == -CUDART_INF_F ? 0.0f : mine.kept_sum * __expf(mine.kept_max - mine.all_max) / mine.all_sum;
        removed = fminf(fmaxf(1.0f - kept, 0.0f), 1.0f);
    }
    const uint32_t* mask = masks + row * mask_stride;
    const bool forbidden = mine.best_index < vocab && !allowed(mask, mask_words, mine.best_index);
    out[2 * row] = removed;
    out[2 * row + 1] = forbidden ? 1.0f : 0.0f;
}

#define LLGT_PRESSURE_ENTRY(name, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(PRESSURE_THREADS)                                           \
        name(T* const* rows, T* base, long long row_stride, const uint32_t* masks, int mask_stride,           \
             int mask_words, int vocab, Partial* parts, int chunks) {                                         \
        pressure_parts<T>(rows, base, row_stride, masks, mask_stride, mask_words, vocab, parts, chunks);      \
    }

LLGT_PRESSURE_ENTRY(pressure_f32, float)
LLGT_PRESSURE_ENTRY(pressure_f16, __half)
LLGT_PRESSURE_ENTRY(pressure_bf16, __nv_bfloat16)
