// The device tables of an AttnBatch (attention.cuh) over B sequences, built from host vectors and owned here: each
// sequence's position (pos.p + b is its *pos0, as attn_prepare alone takes it), cache pointers, capacity and split
// count. For the batched attention tests (attention_test.cpp, attention_fp8_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {

struct DeviceAttnBatch {
  DeviceBuf<int> pos, splits;
  DeviceBuf<int64_t> capacity;
  DeviceBuf<const int*> pos_table;
  DeviceBuf<void*> k_table, v_table;
  AttnBatch batch;

  // ld: the row stride of qg, k and v (AttnBatch::ld_qkv).
  DeviceAttnBatch(const std::vector<int>& positions, const std::vector<int>& split_counts,
                  const std::vector<int64_t>& capacities, const std::vector<void*>& cache_k,
                  const std::vector<void*>& cache_v, int64_t ld)
      : pos(positions),
        splits(split_counts),
        capacity(capacities),
        pos_table(each_of(pos.p, positions.size())),
        k_table(cache_k),
        v_table(cache_v) {
    batch.B = int(positions.size());
    batch.ld_qkv = ld;
    batch.pos0 = pos_table.p;
    batch.cache_k = k_table.p;
    batch.cache_v = v_table.p;
    batch.capacity = capacity.p;
    batch.splits = splits.p;
  }

 private:
  static std::vector<const int*> each_of(const int* base, size_t n) {
    std::vector<const int*> p;
    for (size_t b = 0; b < n; ++b) p.push_back(base + b);
    return p;
  }
};

}  // namespace tern::cuda::test
