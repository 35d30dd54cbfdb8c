// Pieces shared by the one-token MoE kernels on integer dot products (moe_dp4a.cu: gate_up and down as two kernels;
// moe_fused.cu: the whole block in one): a stacked 4-bit matrix, one warp's dot of a 2048-column row against the
// quantised activations (dp4a_tile.cuh), and the host-side shape checks. Included by .cu files only.
#pragma once

#include <cstdint>

#include "cuda/device_weights.cuh"
#include "cuda/dp4a_tile.cuh"

namespace tern::cuda::moe_tile {

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// A stacked 4-bit matrix: words, scales, biases and per-expert strides (in words and groups).
struct Q4 {
  const uint32_t* words;
  const uint16_t* scales;
  const uint16_t* biases;
  int64_t expert_words, expert_groups;
};

// a or b, field by field (a reference to one of two kernel-parameter structs would send them to local memory).
__device__ __forceinline__ Q4 pick(bool first, const Q4& a, const Q4& b) {
  return Q4{first ? a.words : b.words, first ? a.scales : b.scales, first ? a.biases : b.biases,
            first ? a.expert_words : b.expert_words, first ? a.expert_groups : b.expert_groups};
}

inline Q4 q4_of(const DMat& m) {
  return Q4{static_cast<const uint32_t*>(m.data), m.scales, m.biases, m.rows * m.row_words, m.rows * m.groups_per_row};
}

// One lane's part of a warp's dot of a 4-bit row (S pieces of 32 columns per lane: 16 bytes of weights and the packed
// bf16 scale|bias of their group each) with the quantised activations xq (per piece its 4 words), σ and σ·Σv.
template <int S>
__device__ __forceinline__ float dot_row(const uint4 (&w)[S], const uint32_t (&sb)[S], const uint4 (&xq)[S][4],
                                         const float (&sig)[S], const float (&sx)[S]) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < S; ++j) {
    int dh = 0, dl = 0;
    dp4a::dot_word(w[j].x, xq[j][0], dh, dl);
    dp4a::dot_word(w[j].y, xq[j][1], dh, dl);
    dp4a::dot_word(w[j].z, xq[j][2], dh, dl);
    dp4a::dot_word(w[j].w, xq[j][3], dh, dl);
    acc = fmaf(dp4a::scale_of(sb[j]) * sig[j], float(dh * 256 + dl), acc);
    acc = fmaf(dp4a::bias_of(sb[j]), sx[j], acc);
  }
  return acc;
}

// Host checks: a 4-bit group-64 matrix laid out for these kernels; two matrices of one shape.
inline bool q4_dp4a_ok(const DMat& m) {
  return m.format == WeightFormat::affine4 && m.group_size == 64 && m.row_words == m.cols / 8 &&
         m.experts * m.rows * m.row_words < (int64_t(1) << 31) && (reinterpret_cast<uintptr_t>(m.data) & 15) == 0;
}
inline bool same_shape(const DMat& a, const DMat& b) { return a.rows == b.rows && a.cols == b.cols; }

}  // namespace tern::cuda::moe_tile
