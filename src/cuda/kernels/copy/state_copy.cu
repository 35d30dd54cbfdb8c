#include "cuda/kernels/copy/state_copy.cuh"

#include <algorithm>
#include <climits>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"

namespace tern::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWordsPerThread = 4;                               // 16-byte words, all loaded before any is stored
constexpr int64_t kChunkWords = int64_t(kThreads) * kWordsPerThread;  // a block's words: 1024 (16 KB)

// One launch's parameters, passed by value (the parameter space, no upload): entries [count] and the block each
// entry's chunks start at. entry e's words [0, n16) are blocks [first_block[e], first_block[e + 1]) of the grid,
// chunk c of them block first_block[e] + c; an entry of 0 words has no block. first_block[count]: the grid's blocks.
struct StateCopyParams {
  StateCopy entry[kStateCopyMaxEntries];          // 24 bytes each
  int32_t first_block[kStateCopyMaxEntries + 1];
  int32_t count = 0;
  int32_t pos = 0;
  int* pos_dst = nullptr;  // null: no position to write
};
// A kernel's parameters: 4 KB on every architecture and CUDA version (32 KB only from CUDA 12.1 on Volta and later).
static_assert(sizeof(StateCopyParams) <= 4096, "state_copy's parameters must fit the 4 KB kernel parameter space");

// grid [max(first_block[count], 1)] x block [kThreads]. Block b copies words [c x 1024, (c + 1) x 1024) ∩ [0, n16) of
// entry e, where first_block[e] <= b < first_block[e + 1] and c = b - first_block[e]; thread i moves words
// c x 1024 + i + k x 256 (k < 4): each load and store instruction of a warp covers 512 consecutive bytes. Block 0's
// thread 0 writes the position. The kept states are not read again after a rollback: their loads evict first.
__global__ void __launch_bounds__(kThreads) state_copy_kernel(const __grid_constant__ StateCopyParams p) {
  const int32_t b = int32_t(blockIdx.x);
  if (b == 0 && threadIdx.x == 0 && p.pos_dst) *p.pos_dst = p.pos;
  if (b >= p.first_block[p.count]) return;  // the one block of a launch with no words (the position only)
  int lo = 0, hi = p.count - 1;  // the last entry whose chunks start at or before b (the same for the whole block)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  const StateCopy& e = p.entry[lo];
  const int64_t base = int64_t(b - p.first_block[lo]) * kChunkWords;
  const int64_t n = e.n16 - base < kChunkWords ? e.n16 - base : kChunkWords;  // > 0
  const uint4* src = static_cast<const uint4*>(e.src) + base;
  uint4* dst = static_cast<uint4*>(e.dst) + base;
  uint4 v[kWordsPerThread];
#pragma unroll
  for (int k = 0; k < kWordsPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i < n) v[k] = __ldcs(src + i);
  }
#pragma unroll
  for (int k = 0; k < kWordsPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i < n) dst[i] = v[k];
  }
}

}  // namespace

StateCopy state_copy_entry(void* dst, const void* src, size_t bytes) {
  TERN_INTERNAL_CHECK(aligned16(dst) && aligned16(src) && bytes % 16 == 0, "state copy: ", bytes, " bytes from ", src,
                      " to ", dst, " are not whole 16-byte words at 16-byte aligned addresses");
  return StateCopy{dst, src, int64_t(bytes / 16)};
}

void state_copy(std::span<const StateCopy> entries, int* pos_dst, int pos, cudaStream_t stream) {
  size_t at = 0;
  do {
    const size_t n = std::min(entries.size() - at, size_t(kStateCopyMaxEntries));
    StateCopyParams p;
    int64_t blocks = 0;
    for (size_t i = 0; i < n; ++i) {
      const StateCopy& e = entries[at + i];
      TERN_INTERNAL_CHECK(e.n16 >= 0 && aligned16(e.dst) && aligned16(e.src), "state copy: entry ", at + i, " (",
                          e.n16, " words from ", e.src, " to ", e.dst, ") is not 16-byte aligned");
      p.entry[i] = e;
      p.first_block[i] = int32_t(blocks);
      blocks += (e.n16 + kChunkWords - 1) / kChunkWords;
      TERN_INTERNAL_CHECK(blocks <= INT32_MAX, "state copy: ", blocks, " blocks in one launch");
    }
    p.first_block[n] = int32_t(blocks);
    p.count = int32_t(n);
    at += n;
    p.pos = pos;
    p.pos_dst = at == entries.size() ? pos_dst : nullptr;  // the last launch writes the position
    if (blocks > 0 || p.pos_dst) {
      state_copy_kernel<<<unsigned(std::max<int64_t>(blocks, 1)), kThreads, 0, stream>>>(p);
      TERN_CUDA_LAUNCHED("state_copy");
    }
  } while (at < entries.size());
}

}  // namespace tern::cuda
