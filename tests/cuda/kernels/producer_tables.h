// The batched products' activation tables written by the kernels before them (producer tables, dp4a_tables.cuh:
// gdn_decode_batched, attention_batched, moe_decode_batched) against what the products' own pre-quantising kernel
// makes of the same rows (qmv_dp4a_mma_quantize), byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels/qmv/qmv_dp4a_mma.cuh"
#include "../cuda_test_util.h"

namespace tern::cuda::test {

// Zeroed device tables for B tokens of `cols` columns (slots past B stay zero, as the pre-quantising kernel writes
// them).
struct ZeroTables {
  DeviceBuf<uint8_t> buf;
  ZeroTables(int B, int64_t cols) : buf(qmv_dp4a_mma_scratch_bytes(B, cols)) {
    TERN_CUDA(cudaMemset(buf.p, 0, buf.n));
  }
};

// got (a ZeroTables a producer wrote) against qmv_dp4a_mma_quantize of rows x [B][ldx] (norm_w: x·norm_w and the
// RMSNorm's rinv; null: rinv 1), every byte; the tables must hold some nonzero bytes.
inline void expect_tables_match(const ZeroTables& got, const float* x, int64_t ldx, int64_t cols, const float* norm_w,
                                float eps, int B, const std::string& what) {
  ZeroTables want(B, cols);
  qmv_dp4a_mma_quantize(x, ldx, cols, norm_w, eps, B, want.buf.p, want.buf.n, nullptr);
  TERN_CUDA(cudaGetLastError());
  const std::vector<uint8_t> g = got.buf.host(), w = want.buf.host();
  ASSERT_EQ(g.size(), w.size());
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] != w[i] && diff++ == 0) first = i;
  EXPECT_EQ(diff, 0u) << what << ": the producer's tables differ from the pre-quantising kernel's in " << diff
                      << " of " << g.size() << " bytes; first at byte " << first << " (tile "
                      << first / size_t(qmv_dp4a_mma_scratch_bytes(8, cols)) << ")";
  EXPECT_TRUE(std::any_of(w.begin(), w.end(), [](uint8_t b) { return b != 0; })) << what << ": empty tables";
}

}  // namespace tern::cuda::test
