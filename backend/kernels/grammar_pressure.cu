// How hard a step's masks push its rows (issue 53): one read of each row's logits and mask, before
// the mask kernel writes -inf, gives the mass the mask removes and whether it removes the row's
// first choice.
//
// One launch of a grid of (chunks, rows) blocks, each over one chunk of a row (one block per row
// would leave most SMs idle). Each thread reads 16 bytes of logits at a time (one token at a time
// waits on the loads, not on the bandwidth) and keeps an online log-sum-exp (max and scaled sum) over
// every logit and over the allowed ones, and the first index of the largest logit; a block merges
// its threads' into one Partial, and the last block of a row to finish merges the row's (one launch
// fewer than a merge kernel of its own). out[2 * row] is the removed mass,
// 1 - exp(lse(allowed) - lse(all)), and out[2 * row + 1] is 1.0 when the mask refuses the first
// choice (torch's argmax: the lowest index of the maximum). -inf and NaN logits add nothing; a row of
// only -inf removes nothing. finished[row] counts the row's blocks done, and is 0 between launches.
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

// A run of ``count`` tokens (x[i] is token first + i, bit i of ``bits`` says whether it is allowed)
// added to a thread's partial: one rescale per run and accumulator, not one per token.
template <int count>
__device__ __forceinline__ void add_run(Partial& mine, const float* x, uint32_t bits, int first) {
    float all_top = -CUDART_INF_F;
    float kept_top = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < count; ++i) {
        all_top = fmaxf(all_top, x[i]);
        if ((bits >> i) & 1u) {
            kept_top = fmaxf(kept_top, x[i]);
        }
        if (x[i] > mine.best) {  // (tokens rise, so the first maximum stays)
            mine.best = x[i];
            mine.best_index = first + i;
        }
    }
    if (all_top != -CUDART_INF_F) {
        if (all_top > mine.all_max) {
            mine.all_sum *= __expf(mine.all_max - all_top);  // (0 * exp(-inf) while all_max is still -inf)
            mine.all_max = all_top;
        }
#pragma unroll
        for (int i = 0; i < count; ++i) {
            mine.all_sum += __expf(x[i] - mine.all_max);  // (a -inf logit adds exp(-inf) = 0)
        }
    }
    if (kept_top != -CUDART_INF_F) {
        if (kept_top > mine.kept_max) {
            mine.kept_sum *= __expf(mine.kept_max - kept_top);
            mine.kept_max = kept_top;
        }
#pragma unroll
        for (int i = 0; i < count; ++i) {
            if ((bits >> i) & 1u) {
                mine.kept_sum += __expf(x[i] - mine.kept_max);
            }
        }
    }
}

// A logit as a float; NaN reads as -inf: no mass, never the first choice.
__device__ __forceinline__ float finite_or_minus_inf(float x) { return x == x ? x : -CUDART_INF_F; }

__device__ __forceinline__ float half_bits(float, uint32_t bits) { return __uint_as_float(bits); }
__device__ __forceinline__ float half_bits(__half, uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ float half_bits(__nv_bfloat16, uint32_t bits) { return __uint_as_float(bits << 16); }

// The 16 bytes at ``at`` (aligned) as 16 / sizeof(T) floats.
template <typename T>
__device__ __forceinline__ void load_16_bytes(const T* at, float* x) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(at));
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int word = 0; word < 4; ++word) {
        if (sizeof(T) == 4) {
            x[word] = finite_or_minus_inf(__uint_as_float(words[word]));
        } else {
            x[2 * word] = finite_or_minus_inf(half_bits(T(), words[word] & 0xffffu));
            x[2 * word + 1] = finite_or_minus_inf(half_bits(T(), words[word] >> 16));
        }
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

// The mask bits of ``token`` and the tokens after it in its word, from bit 0.
__device__ __forceinline__ uint32_t mask_bits(const uint32_t* mask, int mask_words, int token) {
    const int word = token >> 5;
    return word < mask_words ? __ldg(mask + word) >> (token & 31) : 0u;
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

// The figures of a row from its merged partial: the removed mass, and 1.0 when the mask refuses the
// first choice.
__device__ __forceinline__ void write_figures(const Partial& row_total, const uint32_t* mask, int mask_words, int vocab,
                                              float* out) {
    float removed = 0.0f;
    if (row_total.all_max != -CUDART_INF_F) {
        const float kept = row_total.kept_max == -CUDART_INF_F
                               ? 0.0f
                               : row_total.kept_sum * __expf(row_total.kept_max - row_total.all_max) / row_total.all_sum;
        removed = fminf(fmaxf(1.0f - kept, 0.0f), 1.0f);
    }
    const bool forbidden = row_total.best_index < vocab && !allowed(mask, mask_words, row_total.best_index);
    out[0] = removed;
    out[1] = forbidden ? 1.0f : 0.0f;
}

template <typename T>
__device__ __forceinline__ void pressure_rows(T* const* rows, T* base, long long row_stride, const uint32_t* masks,
                                              int mask_stride, int mask_words, int vocab, Partial* parts, int chunks,
                                              unsigned int* finished, float* out) {
    const long long row = blockIdx.y;
    const T* logits = row_stride > 0 ? base + row * row_stride : rows[row];
    const uint32_t* mask = masks + row * mask_stride;
    const int span = chunk_span(vocab, chunks);
    const int first = blockIdx.x * span;
    const int end = min(first + span, vocab);
    Partial mine = empty_partial(vocab);
    // 16-byte loads where the row allows them (a chunk starts on a whole mask word, so every run of
    // 16 bytes lies in one word); one token at a time otherwise and at the row's end.
    constexpr int per_load = 16 / sizeof(T);
    const int stride = blockDim.x * per_load;
    int token = first + threadIdx.x * per_load;
    if ((reinterpret_cast<uintptr_t>(logits) & 15) == 0) {
        for (; token + stride + per_load <= end; token += 2 * stride) {  // two loads in flight
            float x[per_load], y[per_load];
            load_16_bytes(logits + token, x);
            load_16_bytes(logits + token + stride, y);
            add_run<per_load>(mine, x, mask_bits(mask, mask_words, token), token);
            add_run<per_load>(mine, y, mask_bits(mask, mask_words, token + stride), token + stride);
        }
        for (; token + per_load <= end; token += stride) {
            float x[per_load];
            load_16_bytes(logits + token, x);
            add_run<per_load>(mine, x, mask_bits(mask, mask_words, token), token);
        }
    }
    for (; token < end; token += stride) {  // (the same runs, token by token, in order)
        for (int one = token; one < min(token + per_load, end); ++one) {
            const float x = finite_or_minus_inf(static_cast<float>(logits[one]));
            add_run<1>(mine, &x, allowed(mask, mask_words, one) ? 1u : 0u, one);
        }
    }
    mine = warp_merged(mine);
    __shared__ Partial warps[PRESSURE_THREADS / 32];
    __shared__ bool last_of_row;
    if ((threadIdx.x & 31) == 0) {
        warps[threadIdx.x >> 5] = mine;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int other = 1; other < static_cast<int>(blockDim.x >> 5); ++other) {
            merge(mine, warps[other]);
        }
        parts[row * chunks + blockIdx.x] = mine;
        __threadfence();  // (the part is seen by the row's last block before the count is)
        last_of_row = atomicAdd(finished + row, 1u) == static_cast<unsigned int>(chunks - 1);
    }
    __syncthreads();
    if (!last_of_row || threadIdx.x >= 32) {
        return;
    }
    // The row's last block: its first warp merges the row's chunks (read past L1, which may be stale)
    // and sets the count back for the next step.
    Partial row_total = empty_partial(vocab);
    for (int chunk = threadIdx.x; chunk < chunks; chunk += 32) {
        const volatile Partial* part = parts + row * chunks + chunk;
        const Partial other = {part->all_max, part->all_sum,  part->kept_max,
                               part->kept_sum, part->best, part->best_index};
        merge(row_total, other);
    }
    row_total = warp_merged(row_total);
    if (threadIdx.x == 0) {
        finished[row] = 0;
        write_figures(row_total, mask, mask_words, vocab, out + 2 * row);
    }
}

#define LLGT_PRESSURE_ENTRY(name, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(PRESSURE_THREADS)                                               \
        name(T* const* rows, T* base, long long row_stride, const uint32_t* masks, int mask_stride,               \
             int mask_words, int vocab, Partial* parts, int chunks, unsigned int* finished, float* out) {         \
        pressure_rows<T>(rows, base, row_stride, masks, mask_stride, mask_words, vocab, parts, chunks, finished, \
                         out);                                                                                    \
    }

LLGT_PRESSURE_ENTRY(pressure_f32, float)
LLGT_PRESSURE_ENTRY(pressure_f16, __half)
LLGT_PRESSURE_ENTRY(pressure_bf16, __nv_bfloat16)
