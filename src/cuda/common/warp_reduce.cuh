// Warp-wide reductions shared by the kernel families (every lane gets the result). Included by .cu files only.
#pragma once

namespace tern::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Transposed butterflies: several warp_sums at once, each value bit for bit warp_sum's. warp_sum forms at level o
// (16, 8, 4, 2, 1) in lane L the partial P(L) + P(L ^ o) of the level before, and since a + b == b + a bit for bit,
// lanes L and L ^ o then hold the same partial. So a lane may keep one value's partial and hand its partner the
// other's: from that level on the lane carries one value, forming the same partials from the same operands.

// warp_sum(a) in lanes 0..15 and warp_sum(b) in lanes 16..31: 5 shuffles for the two sums (warp_sum's 10).
__device__ __forceinline__ float warp_sum_halves(float a, float b, int lane) {
  const bool upper = lane & 16;
  float v = (upper ? b : a) + __shfl_xor_sync(0xffffffffu, upper ? a : b, 16);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// warp_sum of a, b, c, d in lanes 0..7, 8..15, 16..23, 24..31 respectively: 6 shuffles for the four sums (20).
__device__ __forceinline__ float warp_sum_quarters(float a, float b, float c, float d, int lane) {
  const bool upper = lane & 16, odd_eighth = lane & 8;
  const float ac = (upper ? c : a) + __shfl_xor_sync(0xffffffffu, upper ? a : c, 16);  // level 16: a below, c above
  const float bd = (upper ? d : b) + __shfl_xor_sync(0xffffffffu, upper ? b : d, 16);  // b below, d above
  float v = (odd_eighth ? bd : ac) + __shfl_xor_sync(0xffffffffu, odd_eighth ? ac : bd, 8);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Two sums of 16 values at once, each a pairwise tree in order: u_0..u_15 in the even lanes (u_m in lane 2m) and
// v_0..v_15 in the odd ones (v_m in lane 2m + 1); every even lane gets ((u0 + u1) + (u2 + u3)) + ... and every odd
// lane the same of v. The one-token integer product (qmv_dp4a) adds its 16 groups' leaves of two rows so, which its
// batched tensor-core form (qmv_dp4a_mma.cu) reproduces with each group's leaf in a register of one thread.
__device__ __forceinline__ float warp_sum_groups(float v) {
#pragma unroll
  for (int o = 2; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace tern::cuda
