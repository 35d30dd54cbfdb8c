// Warp-wide reductions shared by the kernel families (every lane gets the result). Included by .cu files only.
#pragma once

namespace tern::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The same sum as a pairwise tree in lane order: (v0 + v1), (v2 + v3), ..., then pairs of those, and so on. The
// one-token integer product (qmv_dp4a) sums its lanes so, which its batched tensor-core form (qmv_dp4a_mma.cu)
// reproduces with each lane's leaf in a register of one thread.
__device__ __forceinline__ float warp_sum_pairs(float v) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace tern::cuda
