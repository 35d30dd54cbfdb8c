#include "cuda/kernels/vision/vision_layernorm.cuh"

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/vision/vision_mma.cuh"

namespace tern::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void vision_layernorm_kernel(const float* x, const float* w, const float* b, float eps, int64_t M,
                                        int64_t D, uint16_t* y) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= M) return;  // whole warps leave together
  const int lane = int(threadIdx.x) % 32;
  const float* xr = x + r * D;
  float s = 0.0f;
  for (int64_t i = lane; i < D; i += 32) s += xr[i];
  const float mean = warp_sum(s) / float(D);
  float ss = 0.0f;
  for (int64_t i = lane; i < D; i += 32) {
    const float e = xr[i] - mean;
    ss = fmaf(e, e, ss);
  }
  const float inv = rsqrtf(warp_sum(ss) / float(D) + eps);
  uint16_t* yr = y + r * D;
  for (int64_t i = lane; i < D; i += 32) yr[i] = vision_mma::to_bf16((xr[i] - mean) * inv * w[i] + b[i]);
}

}  // namespace

void vision_layernorm(const float* x, const float* w, const float* b, float eps, int64_t M, int64_t D, uint16_t* y,
                      cudaStream_t stream) {
  TERN_CHECK(M >= 0 && D > 0 && x && w && b && y, "vision_layernorm: [", M, ", ", D, "] needs x, w, b and y");
  if (M == 0) return;
  vision_layernorm_kernel<<<unsigned((M + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
      x, w, b, eps, M, D, y);
  TERN_CUDA_LAUNCHED("vision_layernorm");
}

}  // namespace tern::cuda
