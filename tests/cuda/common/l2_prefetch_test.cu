// L2 prefetch lists (src/cuda/common/l2_ranges.h, l2_prefetch.cuh): how ranges are trimmed and counted on the host, and
// that the pieces a grid's threads issue cover every 16-byte unit of every range exactly once and nothing else,
// whatever the grid's size against the piece count. (That the prefetches change no result is checked in qmv_test and
// moe_decode_test, with them on and off.)
#include <cstdint>
#include <random>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/common/l2_prefetch.cuh"

namespace tern::cuda::test {
namespace {

constexpr uint32_t kUnit = 16;  // the instruction's alignment

// Each thread adds 1 to the 16-byte units of its pieces, counted from `base` (pieces outside [base, base + units·16)
// count in *outside).
__global__ void count_pieces_kernel(L2Ranges r, const char* base, int64_t units, unsigned* hits, unsigned* outside) {
  l2_for_each_piece(r, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x,
                    [&](const char* p, uint32_t bytes) {
                      if (p < base || p + bytes > base + units * kUnit || bytes % kUnit || (p - base) % kUnit) {
                        atomicAdd(outside, 1u);
                        return;
                      }
                      for (uint32_t o = 0; o < bytes; o += kUnit) atomicAdd(&hits[(p - base + o) / kUnit], 1u);
                    });
}

TEST(CudaL2Prefetch, RangesAreTrimmedInwardAndCounted) {
  alignas(64) static char buf[1 << 16];
  L2Ranges r;
  EXPECT_TRUE(r.add(nullptr, 100));  // nothing to add
  EXPECT_TRUE(r.add(buf, 0));
  EXPECT_TRUE(r.add(buf + 3, 20));  // [3, 23) holds no whole 16-byte unit past 16: [16, 16) is empty
  EXPECT_EQ(r.n, 0);
  ASSERT_TRUE(r.add(buf + 1, 4096 + 40));  // [1, 4137) -> [16, 4128): 4112 bytes, 2 pieces
  ASSERT_EQ(r.n, 1);
  EXPECT_EQ(r.p[0], buf + 16);
  EXPECT_EQ(r.bytes[0], 4112u);
  EXPECT_EQ(r.first[0], 0u);
  EXPECT_EQ(r.pieces, 2u);
  ASSERT_TRUE(r.add(buf + 8192, 3 * L2Ranges::kPiece));  // aligned: whole, 3 pieces
  EXPECT_EQ(r.first[1], 2u);
  EXPECT_EQ(r.pieces, 5u);
  // A range of more than 4 GB (never dereferenced here) is cut below 4 GB.
  ASSERT_TRUE(r.add(buf, int64_t(5) << 30));
  EXPECT_EQ(r.bytes[2], 0xFFFFF000u);
  EXPECT_EQ(r.pieces, 5u + 0xFFFFF000u / L2Ranges::kPiece);
  while (r.n < L2Ranges::kMax) ASSERT_TRUE(r.add(buf, 64));
  const L2Ranges full = r;
  EXPECT_FALSE(r.add(buf, 64));  // full: refused, nothing changed
  EXPECT_EQ(r.n, full.n);
  EXPECT_EQ(r.pieces, full.pieces);
}

TEST(CudaL2Prefetch, PiecesCoverEachRangeOnceWhateverTheGrid) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaL2Prefetch"));
  const int64_t units = 1 << 16;  // a 1 MB arena
  DeviceBuf<char> arena(size_t(units * kUnit));
  DeviceBuf<unsigned> hits(static_cast<size_t>(units)), outside(1);
  for (int trial = 0; trial < 6; ++trial) {
    // Disjoint random ranges at random offsets (unaligned starts and ends), in order through the arena.
    L2Ranges r;
    std::vector<int> want(static_cast<size_t>(units), 0);
    int64_t at = 0;
    const int n = 1 + int(rng() % uint64_t(L2Ranges::kMax));
    for (int i = 0; i < n; ++i) {
      const int64_t gap = int64_t(rng() % 5000), len = int64_t(rng() % (3 * L2Ranges::kPiece + 100));
      const int64_t lo = at + gap;
      if ((lo + len) / kUnit >= units) break;
      ASSERT_TRUE(r.add(arena.p + lo, len));
      for (int64_t u = (lo + kUnit - 1) / kUnit; u < (lo + len) / kUnit; ++u) want[size_t(u)] = 1;
      at = lo + len;
    }
    for (const int threads : {1, 7, 256, 100000}) {
      TERN_CUDA(cudaMemset(hits.p, 0, hits.n * sizeof(unsigned)));
      TERN_CUDA(cudaMemset(outside.p, 0, sizeof(unsigned)));
      const int block = threads < 256 ? threads : 256;
      count_pieces_kernel<<<(threads + block - 1) / block, block>>>(r, arena.p, units, hits.p, outside.p);
      TERN_CUDA(cudaGetLastError());
      const auto got = hits.host();
      EXPECT_EQ(outside.host()[0], 0u) << "trial " << trial << ", " << threads << " threads";
      size_t wrong = 0, first_wrong = 0;
      for (size_t u = 0; u < got.size(); ++u)
        if (int(got[u]) != want[u] && wrong++ == 0) first_wrong = u;
      EXPECT_EQ(wrong, 0u) << "trial " << trial << ", " << threads << " threads: unit " << first_wrong << " hit "
                           << got[first_wrong] << " times, want " << want[first_wrong];
    }
  }
}

}  // namespace
}  // namespace tern::cuda::test
