// Asking L2 to fetch weights ahead of the kernel that reads them (Hopper's cp.async.bulk.prefetch.L2; a hint, a
// no-op before sm_90; L2 is the coherence point, so a prefetch can never return stale data and may be issued at any
// time, before pdl_wait() too). A one-token decode step is a chain of short kernels, each a few µs above the read
// time of its bytes, and device memory idles across each kernel boundary; a prefetch issued a kernel or more ahead
// keeps it busy there, and the later kernel reads L2.
//
// What the decode plan asks for (decode_plan.cu, TERN_L2_PREFETCH; H200, docs/benchmarks.md): the MoE gate_up kernel,
// once it has read the routing, the chosen experts' down matrices (moe_dp4a.cu), and each mixer's output projection
// the next layer's first projection (an L2Ranges the plan fills at capture: weights are launch constants); together
// 4K decode ~582 -> ~611 tok/s. Prefetching a kernel's own later rows, or anything only one kernel ahead of a
// product that streams its own weights, measured slower: the prefetch then only competes with the loads it should
// have hidden.
//
// Pieces of L2Ranges::kPiece bytes are spread over every thread of the issuing grid (one prefetch per thread at the
// model's shapes), never issued by one SM alone: one block that prefetched 16 MB held up the MoE block for ~100 µs.
// Included by .cu files only.
#pragma once

#include <cstdint>

#include "cuda/common/l2_ranges.h"

namespace tern::cuda {

// Hopper: asks L2 to fetch [p, p + bytes) (p 16-byte aligned, bytes a multiple of 16); a hint, no-op elsewhere.
__device__ __forceinline__ void l2_prefetch_bulk(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// Calls fn(piece pointer, piece bytes) for pieces thread, thread + threads, ... of the ranges taken one after another
// (threads past the last piece return at once: the grids are larger than the piece counts).
template <typename Fn>
__device__ inline void l2_for_each_piece(const L2Ranges& r, int64_t thread, int64_t threads, Fn fn) {
  int i = 0;
  for (int64_t g = thread; g < int64_t(r.pieces); g += threads) {
    while (i + 1 < r.n && int64_t(r.first[i + 1]) <= g) ++i;
    const uint32_t off = uint32_t(g - r.first[i]) * L2Ranges::kPiece;
    const uint32_t left = r.bytes[i] - off;
    fn(r.p[i] + off, left < L2Ranges::kPiece ? left : L2Ranges::kPiece);
  }
}

// Thread `thread` of `threads` asks L2 for its pieces of r.
__device__ inline void l2_prefetch_share(const L2Ranges& r, int64_t thread, int64_t threads) {
  l2_for_each_piece(r, thread, threads, [](const char* p, uint32_t bytes) { l2_prefetch_bulk(p, bytes); });
}

// The calling thread's index in the grid and the grid's thread count (1-D grids).
__device__ __forceinline__ int64_t grid_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }

}  // namespace tern::cuda
