// Applies llguidance token bitmasks to logits rows on the GPU, in place.
//
// A mask row is ceil(V / 32) uint32 words; token t is allowed when bit (t & 31) of word (t >> 5)
// is set. Disallowed logits become -inf; tokens past the mask's words are disallowed.
//
// One warp owns a chunk of 1024 logits (32 mask words) of one row:
//   * lane i loads word i (one coalesced 128-byte load per warp);
//   * if all 32 words allow everything, the warp leaves the chunk without touching the logits;
//   * otherwise the lanes walk the chunk in 16-byte vectors (VEC elements), consecutive lanes on
//     consecutive vectors so every access is coalesced; each lane takes its VEC bits from the
//     lane that holds the word (a shuffle). A vector whose bits are all 1 is skipped, a vector
//     whose bits are all 0 is overwritten with -inf without being read;
//   * mixed vectors are never read where that pays (fp32 rows, and 16-bit launches that fit in
//     L2): the warp stores -inf into the disallowed elements of their 32-vector span, lane i into
//     element i of each word, and the L2 merges the partial writes. Otherwise a mixed vector is
//     read, selected and written back.
// VEC == 1 is the path for rows that are not 16-byte aligned (e.g. fp32 with V = 32001).
// Small launches (mask_flat) are latency-bound instead: one vector per thread (two for the larger
// fp32 ones). Mid-size 16-bit launches (mask_by_word) take one warp per chunk in a grid that covers
// every chunk once, with fewer registers than the chunked kernels so that one wave holds them all;
// so do small launches whose masks mostly allow everything (the loader samples them).
// Rows are base + row * row_stride for one strided tensor, or an array of pointers for separate
// per-request tensors (TensorRT-LLM's logits post-processor).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Build-time knobs. The defaults won the most cells against xgrammar's kernel in
// `python -m bench.mask_kernel --variant ...` runs on an H200 (docs/kernel.md):
//   LLGT_PHASE_PIECES: vectors per lane loaded before the first store of a chunk (registers vs
//                      loads in flight);
//   LLGT_MIN_BLOCKS:   blocks of 256 threads an SM must hold at once (__launch_bounds__);
//   LLGT_STREAM_STORES: 1 marks stores of logits evict-first (st.global.cs): each is written once;
//   LLGT_CHUNKS_PER_PASS: chunks whose mask words a warp loads at once;
//   LLGT_MIXED_SCATTER: 0 makes the chunked kernels read, select and write back every mixed vector;
//   LLGT_FLAT_SCATTER: 0 makes fp32 small launches load their logits with their mask words (as the
//                      16-bit ones do) instead of scattering into mixed spans;
//   LLGT_FLAT_BOUNDS:  the most threads per block the small-launch kernels are built for
//                      (__launch_bounds__; the applier's flat_threads picks the block size);
//   LLGT_SCAN_PIECE_WORDS, LLGT_SCAN_PIECES: the sparse plan's kernel (scan_rows) checks mask words
//                      in pieces of this many words (a multiple of 64), this many pieces at a time;
#ifndef LLGT_PHASE_PIECES
#define LLGT_PHASE_PIECES 4
#endif
#ifndef LLGT_CHUNKS_PER_PASS
#define LLGT_CHUNKS_PER_PASS 4
#endif
#ifndef LLGT_MIN_BLOCKS
#define LLGT_MIN_BLOCKS 1
#endif
#ifndef LLGT_STREAM_STORES
#define LLGT_STREAM_STORES 1
#endif
#ifndef LLGT_MIXED_SCATTER
#define LLGT_MIXED_SCATTER 1
#endif
#ifndef LLGT_FLAT_SCATTER
#define LLGT_FLAT_SCATTER 1
#endif
#ifndef LLGT_FLAT_BOUNDS
#define LLGT_FLAT_BOUNDS 256
#endif
#if LLGT_STREAM_STORES
#define LLGT_STORE_VEC(p, v) __stcs((p), (v))
#else
#define LLGT_STORE_VEC(p, v) (*(p) = (v))
#endif

template <typename T> struct NegInf;
template <> struct NegInf<float> { static constexpr uint32_t pattern = 0xff800000u; };
template <> struct NegInf<__half> { static constexpr uint32_t pattern = 0xfc00fc00u; };
template <> struct NegInf<__nv_bfloat16> { static constexpr uint32_t pattern = 0xff80ff80u; };
// (16-bit types: the pattern holds two -inf elements, so it fills a 32-bit word.)

template <typename T> __device__ __forceinline__ T neg_inf_scalar() {
    const uint32_t pattern = NegInf<T>::pattern;
    return *reinterpret_cast<const T*>(&pattern);
}

// Keep the elements of a 32-bit word whose bits are set, replace the others with -inf.
template <typename T>
__device__ __forceinline__ uint32_t select_word(uint32_t value, uint32_t bits) {
    const uint32_t pattern = NegInf<T>::pattern;
    if constexpr (sizeof(T) == 4) {
        return (bits & 1u) ? value : pattern;
    } else {
        const uint32_t keep = ((bits & 1u) ? 0x0000ffffu : 0u) | ((bits & 2u) ? 0xffff0000u : 0u);
        return (value & keep) | (pattern & ~keep);
    }
}

// Keep the elements of a 16-byte vector whose bits are set (bit k: element k), the others -inf.
template <typename T> __device__ __forceinline__ uint4 select_vector(uint4 values, uint32_t bits) {
    constexpr int PER_WORD = 4 / sizeof(T);  // elements in 32 bits
    uint4 out;
    out.x = select_word<T>(values.x, bits);
    out.y = select_word<T>(values.y, bits >> PER_WORD);
    out.z = select_word<T>(values.z, bits >> (2 * PER_WORD));
    out.w = select_word<T>(values.w, bits >> (3 * PER_WORD));
    return out;
}

// -inf into the disallowed elements of the row's last, partial vector (from `first` to the row's end).
template <typename T>
__device__ __forceinline__ void mask_tail(T* __restrict__ logits, int first, uint32_t bits, int vocab) {
    for (int k = 0; first + k < vocab; ++k) {
        if (!((bits >> k) & 1u)) {
            logits[first + k] = neg_inf_scalar<T>();
        }
    }
}

// -inf into one element, marked evict-first like the vector stores.
template <typename T> __device__ __forceinline__ void store_neg_inf(T* p) {
    if constexpr (sizeof(T) == 4) {
        __stcs(reinterpret_cast<unsigned int*>(p), NegInf<T>::pattern);
    } else {
        __stcs(reinterpret_cast<unsigned short*>(p), static_cast<unsigned short>(NegInf<T>::pattern & 0xffffu));
    }
}

// -inf into the disallowed elements of a warp's span of VEC mask words (the 32 * VEC logits from
// `first`) without reading any: lane i takes element i of each word, so each store instruction
// covers one contiguous run of 32 logits. Word k is held by lane src_first + k * src_step.
template <typename T, int VEC>
__device__ __forceinline__ void scatter_span(T* __restrict__ logits, uint32_t word, int src_first, int src_step,
                                             int first, int lane, int vocab) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        const uint32_t source = __shfl_sync(0xffffffffu, word, src_first + k * src_step);
        const int e = first + k * 32 + lane;
        if (e < vocab && !((source >> lane) & 1u)) {
            store_neg_inf(logits + e);
        }
    }
}

constexpr int CHUNKS_PER_PASS = LLGT_CHUNKS_PER_PASS;  // mask words of this many chunks are loaded at once

// SCATTER: a span of 32 vectors with a mixed one gets scatter_span instead of reading its mixed
// vectors (see mask_rows).
template <typename T, int VEC, bool SCATTER>
__device__ __forceinline__ void mask_chunk(T* __restrict__ logits, uint32_t word, int base, int lane, int vocab) {
    constexpr int PIECES = 1024 / (32 * VEC);
    constexpr int PHASE = PIECES < LLGT_PHASE_PIECES ? PIECES : LLGT_PHASE_PIECES;
    constexpr uint32_t ALL = (1u << VEC) - 1u;
    // PHASE vectors at a time, loads then stores, so a phase's loads are all in flight before its
    // first store; fewer vectors per phase means fewer registers and more warps per SM.
#pragma unroll
    for (int start = 0; start < PIECES; start += PHASE) {
        uint32_t bits[PHASE];
        uint4 values[PHASE];
#pragma unroll
        for (int it = 0; it < PHASE; ++it) {
            const int piece = (start + it) * 32 + lane;  // this lane's vector inside the chunk
            const uint32_t source = __shfl_sync(0xffffffffu, word, (piece * VEC) >> 5);
            bits[it] = (source >> ((piece * VEC) & 31)) & ALL;
            if constexpr (VEC > 1) {
                const int first = base + piece * VEC;
                if (!SCATTER && first + VEC <= vocab && bits[it] != ALL && bits[it] != 0u) {
                    values[it] = *reinterpret_cast<const uint4*>(logits + first);
                }
            }
        }
#pragma unroll
        for (int it = 0; it < PHASE; ++it) {
            const int first = base + ((start + it) * 32 + lane) * VEC;
            if constexpr (VEC > 1 && SCATTER) {
                if (__any_sync(0xffffffffu, first < vocab && bits[it] != ALL && bits[it] != 0u)) {
                    scatter_span<T, VEC>(logits, word, (start + it) * VEC, 1, base + (start + it) * 32 * VEC, lane,
                                         vocab);
                    continue;
                }
            }
            if (first >= vocab || bits[it] == ALL) {
                continue;
            }
            if constexpr (VEC == 1) {
                logits[first] = neg_inf_scalar<T>();
            } else if (first + VEC <= vocab) {
                uint4 out;
                if (bits[it] == 0u) {  // nothing allowed: write without reading
                    const uint32_t p = NegInf<T>::pattern;
                    out = make_uint4(p, p, p, p);
                } else {
                    out = select_vector<T>(values[it], bits[it]);
                }
                LLGT_STORE_VEC(reinterpret_cast<uint4*>(logits + first), out);
            } else {  // the row's last, partial vector
                mask_tail(logits, first, bits[it], vocab);
            }
        }
    }
}

// Rows are base + row * row_stride when row_stride > 0 (one strided tensor: no pointer to load
// first), otherwise rows[row] (separate per-request tensors, as TensorRT-LLM passes them).
template <typename T>
__device__ __forceinline__ T* row_at(T* const* rows, T* base, long long row_stride, long long row) {
    return row_stride > 0 ? base + row * row_stride : rows[row];
}

// The row of this block (blockIdx.y), for the kernels whose grid has one row per blockIdx.y.
template <typename T>
__device__ __forceinline__ T* row_of(T* const* rows, T* base, long long row_stride) {
    return row_at(rows, base, row_stride, blockIdx.y);
}

// The mask words of one pass: chunk first_chunk + c * stride for each c, lane i loading word i
// of its chunk (independent loads, all in flight together). Chunks past the row allow everything.
__device__ __forceinline__ void load_pass(uint32_t (&words)[CHUNKS_PER_PASS], const uint32_t* __restrict__ mask,
                                          int first_chunk, int stride, int chunks, int mask_words, int lane) {
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_PASS; ++c) {
        const int word_index = (first_chunk + c * stride) * 32 + lane;
        words[c] = (first_chunk + c * stride < chunks && word_index < mask_words) ? __ldg(mask + word_index)
                                                                                  : 0xffffffffu;
    }
}

// A large launch whose masks fit in L2 comfortably (the loader decides: the `prefetch` parameter):
// the grid's first blocks (one 128-byte line per thread) fetch all the masks into L2 at the start,
// in one burst of reads, so the warps' own mask loads hit L2 instead of reading DRAM in among the
// stores. (Not inlined: its registers stay out of the chunk loop's count.)
__device__ __noinline__ void prefetch_masks(const uint32_t* masks, int mask_stride) {
    const long long mask_bytes = static_cast<long long>(gridDim.y) * mask_stride * 4;
    const long long line = (static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    if (line < mask_bytes / 128 + 2) {  // (+2: the masks need not start on a line)
        asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(masks + line * 32));
    }
}

// SCATTER: mixed vectors are scattered into (scatter_span) instead of read, selected and written back.
template <typename T, int VEC, bool SCATTER>
__device__ __forceinline__ void mask_rows(T* const* __restrict__ rows, T* base, long long row_stride,
                                          const uint32_t* __restrict__ masks, int mask_stride, int mask_words,
                                          int vocab, int prefetch) {
    static_assert(VEC == 1 || VEC * sizeof(T) == 16, "a vector is one element or 16 bytes");
    const int lane = threadIdx.x & 31;
    const int warps = blockDim.x >> 5;
    const int chunks = (vocab + 1023) >> 10;
    const int stride = gridDim.x * warps;
    T* __restrict__ logits = row_of(rows, base, row_stride);
    const uint32_t* __restrict__ mask = masks + static_cast<size_t>(blockIdx.y) * mask_stride;

    if (prefetch) {
        prefetch_masks(masks, mask_stride);
    }
    const int pass = stride * CHUNKS_PER_PASS;
    int first_chunk = blockIdx.x * warps + (threadIdx.x >> 5);
    uint32_t words[CHUNKS_PER_PASS];
    for (; first_chunk < chunks; first_chunk += pass) {
        load_pass(words, mask, first_chunk, stride, chunks, mask_words, lane);
#pragma unroll 1  // one copy of the chunk code: small kernels are latency- and instruction-cache-bound
        for (int c = 0; c < CHUNKS_PER_PASS; ++c) {
            const int chunk = first_chunk + c * stride;
            // A chunk whose words all allow everything is left alone (the warp agrees, then moves on).
            // Words past the mask but inside the vocabulary disallow everything.
            const int word_index = chunk * 32 + lane;
            // (constant-index picks keep `words` in registers inside the rolled loop)
            uint32_t loaded = words[0];
#pragma unroll
            for (int k = 1; k < CHUNKS_PER_PASS; ++k) {
                loaded = c == k ? words[k] : loaded;
            }
            const uint32_t word = (chunk < chunks && word_index >= mask_words) ? 0u : loaded;
            if (chunk >= chunks || __all_sync(0xffffffffu, word == 0xffffffffu)) {
                continue;
            }
            mask_chunk<T, VEC, SCATTER && LLGT_MIXED_SCATTER>(logits, word, chunk << 10, lane, vocab);
        }
    }
}

// The sparse plan's kernel, for steps whose masks mostly allow everything: the kernel then mostly
// reads mask words, so what counts is how many of those reads are in flight and how few
// instructions each costs. The launch's masks are one array of rows * mask_words words (the loader
// takes this kernel only when mask_stride == mask_words); warps walk it in pieces of
// SCAN_PIECE_WORDS words, SCAN_PIECES pieces in flight at a time (the loader launches the fewest
// warps that read it all in one such round, up to all the SMs hold), lane i loading 8-byte pairs i,
// i + 32, ... of each piece (no division, no row arithmetic). A piece whose words all allow
// everything is done. Otherwise each chunk of a row that it touches (two or three) is loaded again
// (from L2) and masked as in mask_rows; a chunk two pieces touch may be masked twice, which writes
// the same values. Small pieces keep that serial work short: a constrained row's chunks spread
// over many warps (with 256-word pieces, a bf16 batch of 256 rows, every tenth a JSON string's,
// took 12-21 us against 8-9 us for xgrammar, docs/kernel.md).
#ifndef LLGT_SCAN_PIECES
#define LLGT_SCAN_PIECES 8
#endif
#ifndef LLGT_SCAN_PIECE_WORDS
#define LLGT_SCAN_PIECE_WORDS 64
#endif
constexpr int SCAN_PIECES = LLGT_SCAN_PIECES;
constexpr int SCAN_PIECE_WORDS = LLGT_SCAN_PIECE_WORDS;  // a multiple of 64

template <typename T, int VEC, bool SCATTER>
__device__ __noinline__ void scan_piece(T* const* __restrict__ rows, T* base, long long row_stride,
                                        const uint32_t* __restrict__ masks, int mask_words, int vocab,
                                        long long first, long long end, int lane) {
    const long long last = (first + SCAN_PIECE_WORDS < end ? first + SCAN_PIECE_WORDS : end) - 1;
    const int chunk_words = 32;
    long long row = first / mask_words;
    int chunk = static_cast<int>(first - row * mask_words) / chunk_words;
    const long long last_row = last / mask_words;
    const int last_chunk = static_cast<int>(last - last_row * mask_words) / chunk_words;
    for (; row < last_row || (row == last_row && chunk <= last_chunk);) {
        const int word_index = chunk * chunk_words + lane;
        const uint32_t word = word_index < mask_words ? __ldg(masks + row * mask_words + word_index)
                              : word_index * 32 < vocab ? 0u
                                                        : 0xffffffffu;
        if (!__all_sync(0xffffffffu, word == 0xffffffffu)) {
            T* __restrict__ logits = row_at(rows, base, row_stride, row);
            mask_chunk<T, VEC, SCATTER && LLGT_MIXED_SCATTER>(logits, word, chunk << 10, lane, vocab);
        }
        if (++chunk * chunk_words >= mask_words) {
            chunk = 0;
            ++row;
        }
    }
}

template <typename T, int VEC, bool SCATTER>
__device__ __forceinline__ void scan_rows(T* const* __restrict__ rows, T* base, long long row_stride,
                                          const uint32_t* __restrict__ masks, int mask_words, int vocab,
                                          int row_count) {
    static_assert(VEC * sizeof(T) == 16, "a vector is 16 bytes");
    constexpr int PAIRS = SCAN_PIECE_WORDS / 64;  // 8-byte loads per lane per piece
    const int lane = threadIdx.x & 31;
    const long long total = static_cast<long long>(row_count) * mask_words;
    const long long warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    // (masks is 8-byte aligned: the row pointers before it are 8 bytes each. The pairs run over the
    // whole array, across row ends; the guard below bounds the last.)
    const uint2* __restrict__ pairs = reinterpret_cast<const uint2*>(masks);
    for (long long piece = warp; piece * SCAN_PIECE_WORDS < total; piece += warps * SCAN_PIECES) {
        uint2 loaded[SCAN_PIECES][PAIRS];
#pragma unroll
        for (int p = 0; p < SCAN_PIECES; ++p) {
#pragma unroll
            for (int k = 0; k < PAIRS; ++k) {
                const long long w = (piece + p * warps) * SCAN_PIECE_WORDS + (k * 32 + lane) * 2;
                loaded[p][k] = w + 1 < total ? __ldg(pairs + w / 2)
                               : w < total   ? make_uint2(__ldg(masks + w), 0xffffffffu)
                                             : make_uint2(0xffffffffu, 0xffffffffu);
            }
        }
        uint32_t mixed = 0;  // bit p: piece p has a word that does not allow everything
#pragma unroll
        for (int p = 0; p < SCAN_PIECES; ++p) {
            uint32_t all = 0xffffffffu;
#pragma unroll
            for (int k = 0; k < PAIRS; ++k) {
                all &= loaded[p][k].x & loaded[p][k].y;
            }
            mixed |= __all_sync(0xffffffffu, all == 0xffffffffu) ? 0u : 1u << p;
        }
        for (int p = 0; mixed != 0; ++p, mixed >>= 1) {  // (rare in this plan's steps)
            const long long first = (piece + p * warps) * SCAN_PIECE_WORDS;
            if ((mixed & 1u) && first < total) {
                scan_piece<T, VEC, SCATTER>(rows, base, row_stride, masks, mask_words, vocab, first, total, lane);
            }
        }
    }
}

// Small launches are latency-bound: threads on consecutive 16-byte vectors of a row (each access of a
// warp is coalesced), PER_THREAD vectors per thread (1, or 2 for fp32 launches that would otherwise
// fill most of a wave: half the blocks to launch), a block's width apart. A thread's loads are all
// issued before its first store.

// The thread loads its mask words and never reads the logits: a warp with a mixed vector (or the row's
// last, partial one) scatters into its whole span, the other warps' threads store a vector of -inf
// or leave theirs alone. (Every lane takes part in the vote and the shuffles; lanes past the row
// allow everything.)
template <typename T, int VEC, int PER_THREAD>
__device__ __forceinline__ void flat_scatter(T* __restrict__ logits, const uint32_t* __restrict__ mask, int mask_words,
                                             int first, int step, int vocab) {
    constexpr uint32_t ALL = (1u << VEC) - 1u;
    const int lane = threadIdx.x & 31;
    uint32_t words[PER_THREAD];
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int f = first + k * step;
        const int w = f >> 5;
        words[k] = f >= vocab ? 0xffffffffu : w < mask_words ? __ldg(mask + w) : 0u;
    }
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int f = first + k * step;
        const uint32_t bits = (words[k] >> (f & 31)) & ALL;
        if (__any_sync(0xffffffffu, f < vocab && ((bits != ALL && bits != 0u) || f + VEC > vocab))) {
            scatter_span<T, VEC>(logits, words[k], 0, 32 / VEC, f - lane * VEC, lane, vocab);  // word j: lane 32j/VEC
        } else if (f < vocab && bits == 0u) {
            const uint32_t p = NegInf<T>::pattern;
            *reinterpret_cast<uint4*>(logits + f) = make_uint4(p, p, p, p);
        }
    }
}

// The thread loads its logits and its mask words together, selects and writes back.
template <typename T, int VEC, int PER_THREAD>
__device__ __forceinline__ void flat_read(T* __restrict__ logits, const uint32_t* __restrict__ mask, int mask_words,
                                          int first, int step, int vocab) {
    constexpr uint32_t ALL = (1u << VEC) - 1u;
    uint4 values[PER_THREAD];
    uint32_t bits[PER_THREAD];
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int f = first + k * step;
        values[k] = make_uint4(0u, 0u, 0u, 0u);
        if (f + VEC <= vocab) {
            values[k] = *reinterpret_cast<const uint4*>(logits + f);
        }
        const int w = f >> 5;
        const uint32_t word = f >= vocab ? 0xffffffffu : w < mask_words ? __ldg(mask + w) : 0u;
        bits[k] = (word >> (f & 31)) & ALL;
    }
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int f = first + k * step;
        if (bits[k] == ALL) {
            continue;
        }
        if (f + VEC <= vocab) {
            *reinterpret_cast<uint4*>(logits + f) = select_vector<T>(values[k], bits[k]);
        } else {
            mask_tail(logits, f, bits[k], vocab);
        }
    }
}

// SCATTER (and LLGT_FLAT_SCATTER): flat_scatter, otherwise flat_read. Scattering 16-bit elements
// takes twice the store instructions, which a launch this short pays for in its mixed cells: 16-bit
// rows read, except in steps whose masks mostly allow
// nothing (the loader's refused plan: the _scatter builds), where the reads would be wasted.
template <typename T, int VEC, bool SCATTER, int PER_THREAD>
__device__ __forceinline__ void mask_flat(T* const* __restrict__ rows, T* base, long long row_stride,
                                          const uint32_t* __restrict__ masks, int mask_stride, int mask_words,
                                          int vocab) {
    const int first = (blockIdx.x * PER_THREAD * blockDim.x + threadIdx.x) * VEC;
    const int step = blockDim.x * VEC;  // between a thread's vectors
    T* __restrict__ logits = row_of(rows, base, row_stride);
    const uint32_t* __restrict__ mask = masks + static_cast<size_t>(blockIdx.y) * mask_stride;
    if constexpr (SCATTER && LLGT_FLAT_SCATTER) {
        flat_scatter<T, VEC, PER_THREAD>(logits, mask, mask_words, first, step, vocab);
    } else {
        flat_read<T, VEC, PER_THREAD>(logits, mask, mask_words, first, step, vocab);
    }
}

// Mid-size 16-bit launches, and small launches whose masks mostly allow everything: one thread per
// mask word and one warp per chunk of 32 words, in a grid that covers every chunk once (no passes,
// few registers: one wave holds more warps than the chunked kernels'). A warp whose words all allow
// everything leaves after one coalesced load. Otherwise the lanes walk the chunk's vectors as the
// chunked kernel does (consecutive lanes on consecutive vectors, bits from the word's lane by a
// shuffle): a vector allowed nothing is stored without being read, a mixed one read, selected and
// written back. Rows must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ void mask_by_word(T* const* __restrict__ rows, T* base, long long row_stride,
                                             const uint32_t* __restrict__ masks, int mask_stride, int mask_words,
                                             int vocab) {
    constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte vector
    constexpr int VECS = 32 / VEC;       // vectors per word, and per lane
    constexpr uint32_t ALL = (1u << VEC) - 1u;
    const int lane = threadIdx.x & 31;
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    const int chunk_first = (w - lane) * 32;  // the warp's first logit
    if (chunk_first >= vocab) {
        return;
    }
    const uint32_t* __restrict__ mask = masks + static_cast<size_t>(blockIdx.y) * mask_stride;
    const uint32_t word = w * 32 >= vocab ? 0xffffffffu : w < mask_words ? __ldg(mask + w) : 0u;
    if (__all_sync(0xffffffffu, word == 0xffffffffu)) {
        return;
    }
    T* __restrict__ logits = row_of(rows, base, row_stride);
    const uint32_t p = NegInf<T>::pattern;
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int j = v * 32 + lane;  // the lane's vector within the chunk
        const uint32_t source = __shfl_sync(0xffffffffu, word, j / VECS);
        const uint32_t bits = (source >> ((j % VECS) * VEC)) & ALL;
        const int first = chunk_first + j * VEC;
        if (first >= vocab || bits == ALL) {
            continue;
        }
        if (first + VEC > vocab) {  // the row's last, partial vector
            mask_tail(logits, first, bits, vocab);
        } else if (bits == 0u) {
            *reinterpret_cast<uint4*>(logits + first) = make_uint4(p, p, p, p);
        } else {
            const uint4 values = *reinterpret_cast<const uint4*>(logits + first);
            *reinterpret_cast<uint4*>(logits + first) = select_vector<T>(values, bits);
        }
    }
}

#ifdef LLGT_NAIVE_KERNELS
// The plain kernel the benchmark compares against: one thread per logit (built for benchmarks only;
// bench/plain_kernel.py launches it).
template <typename T>
__device__ __forceinline__ void mask_naive(T* const* __restrict__ rows, T* base, long long row_stride,
                                           const uint32_t* __restrict__ masks, int mask_stride, int mask_words,
                                           int vocab) {
    T* logits = row_of(rows, base, row_stride);
    const uint32_t* mask = masks + static_cast<size_t>(blockIdx.y) * mask_stride;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x) {
        const int w = i >> 5;
        const uint32_t bits = w < mask_words ? __ldg(mask + w) : 0u;
        if (!((bits >> (i & 31)) & 1u)) {
            logits[i] = neg_inf_scalar<T>();
        }
    }
}
#endif

// An extern "C" kernel with the loader's parameter list; BOUNDS: its __launch_bounds__ arguments.
#define LLGT_KERNEL(name, body, T, BOUNDS)                                                           \
    extern "C" __global__ void __launch_bounds__ BOUNDS name(T* const* rows, T* base, long long row_stride, \
                                    const uint32_t* masks, int mask_stride, int mask_words, int vocab, \
                                    int prefetch, int row_count) {                                    \
        body;                                                                                         \
    }
#define LLGT_ENTRY(name, body, T) LLGT_KERNEL(name, body, T, (256, LLGT_MIN_BLOCKS))
#define LLGT_FLAT_ENTRY(name, body, T) LLGT_KERNEL(name, body, T, (LLGT_FLAT_BOUNDS, LLGT_MIN_BLOCKS))
#define LLGT_ARGS rows, base, row_stride, masks, mask_stride, mask_words, vocab

using bf16 = __nv_bfloat16;
// Mixed vectors: fp32 rows are always scattered into. 16-bit rows take twice the store instructions
// per byte to scatter into, which pays only while the logits stay in L2 (partial writes that reach
// DRAM cost a read there anyway): the loader picks the _scatter kernels for launches up to a size.
LLGT_ENTRY(mask_f32_v4, (mask_rows<float, 4, true>(LLGT_ARGS, prefetch)), float)
LLGT_ENTRY(mask_f32_v1, (mask_rows<float, 1, false>(LLGT_ARGS, prefetch)), float)
LLGT_ENTRY(mask_f16_v8, (mask_rows<__half, 8, false>(LLGT_ARGS, prefetch)), __half)
LLGT_ENTRY(mask_f16_v8_scatter, (mask_rows<__half, 8, true>(LLGT_ARGS, prefetch)), __half)
LLGT_ENTRY(mask_f16_v1, (mask_rows<__half, 1, false>(LLGT_ARGS, prefetch)), __half)
LLGT_ENTRY(mask_bf16_v8, (mask_rows<bf16, 8, false>(LLGT_ARGS, prefetch)), bf16)
LLGT_ENTRY(mask_bf16_v8_scatter, (mask_rows<bf16, 8, true>(LLGT_ARGS, prefetch)), bf16)
LLGT_ENTRY(mask_bf16_v1, (mask_rows<bf16, 1, false>(LLGT_ARGS, prefetch)), bf16)
// The sparse plan's (aligned rows only: unaligned ones take mask_rows in either plan).
LLGT_ENTRY(scan_f32_v4, (scan_rows<float, 4, true>(rows, base, row_stride, masks, mask_words, vocab, row_count)), float)
LLGT_ENTRY(scan_f16_v8, (scan_rows<__half, 8, false>(rows, base, row_stride, masks, mask_words, vocab, row_count)), __half)
LLGT_ENTRY(scan_f16_v8_scatter, (scan_rows<__half, 8, true>(rows, base, row_stride, masks, mask_words, vocab, row_count)), __half)
LLGT_ENTRY(scan_bf16_v8, (scan_rows<bf16, 8, false>(rows, base, row_stride, masks, mask_words, vocab, row_count)), bf16)
LLGT_ENTRY(scan_bf16_v8_scatter, (scan_rows<bf16, 8, true>(rows, base, row_stride, masks, mask_words, vocab, row_count)), bf16)
// Small launches (_x2: two vectors per thread; 16-bit rows lost 3-17% with two, reading both).
LLGT_FLAT_ENTRY(flat_f32_v4, (mask_flat<float, 4, true, 1>(LLGT_ARGS)), float)
LLGT_FLAT_ENTRY(flat_f32_v4_x2, (mask_flat<float, 4, true, 2>(LLGT_ARGS)), float)
LLGT_FLAT_ENTRY(flat_f16_v8, (mask_flat<__half, 8, false, 1>(LLGT_ARGS)), __half)
LLGT_FLAT_ENTRY(flat_bf16_v8, (mask_flat<bf16, 8, false, 1>(LLGT_ARGS)), bf16)
LLGT_FLAT_ENTRY(flat_f16_v8_scatter, (mask_flat<__half, 8, true, 1>(LLGT_ARGS)), __half)
LLGT_FLAT_ENTRY(flat_bf16_v8_scatter, (mask_flat<bf16, 8, true, 1>(LLGT_ARGS)), bf16)
LLGT_ENTRY(words_f32, (mask_by_word<float>(LLGT_ARGS)), float)
LLGT_ENTRY(words_f16, (mask_by_word<__half>(LLGT_ARGS)), __half)
LLGT_ENTRY(words_bf16, (mask_by_word<bf16>(LLGT_ARGS)), bf16)
#ifdef LLGT_NAIVE_KERNELS
LLGT_ENTRY(naive_f32, (mask_naive<float>(LLGT_ARGS)), float)
LLGT_ENTRY(naive_f16, (mask_naive<__half>(LLGT_ARGS)), __half)
LLGT_ENTRY(naive_bf16, (mask_naive<bf16>(LLGT_ARGS)), bf16)
#endif
