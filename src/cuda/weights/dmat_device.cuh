// Device-side readers of a DMat: dequantise 8 consecutive elements of one row. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>

#include "cuda/weights/device_weights.cuh"

namespace tern::cuda {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

// out[j] = W[expert][row][col + j], j < 8; col is a multiple of 8.
template <WeightFormat F>
__device__ __forceinline__ void dmat_load8(const DMat& w, int64_t expert, int64_t row, int64_t col, float out[8]) {
  const int64_t r = expert * w.rows + row;
  if constexpr (F == WeightFormat::f32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(w.data) + r * w.row_words + col);
    const float4 a = p[0], b = p[1];
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
  } else if constexpr (F == WeightFormat::bf16) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w.data) + r * w.row_words + col);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[2 * j] = __uint_as_float(u[j] << 16);
      out[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
    }
  } else {
    const int64_t g = r * w.groups_per_row + col / w.group_size;
    const float s = bf16_bits_to_float(w.scales[g]), b = bf16_bits_to_float(w.biases[g]);
    const uint32_t* words = static_cast<const uint32_t*>(w.data) + r * w.row_words;
    if constexpr (F == WeightFormat::affine4) {
      const uint32_t q = words[col / 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = s * float((q >> (4 * j)) & 15u) + b;
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(words + col / 4);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[j] = s * float((q.x >> (8 * j)) & 255u) + b;
        out[4 + j] = s * float((q.y >> (8 * j)) & 255u) + b;
      }
    }
  }
}

}  // namespace tern::cuda
