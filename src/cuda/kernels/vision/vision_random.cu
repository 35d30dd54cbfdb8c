#include "cuda/kernels/vision/vision_random.cuh"

#include <algorithm>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/vision/vision_mma.cuh"

namespace tern::cuda {
namespace {

// Uniform on [-1, 1) from a 64-bit mix of (seed, i) (splitmix64's finaliser).
__device__ __forceinline__ float uniform_pm1(uint64_t seed, int64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * uint64_t(i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void fill_bf16_kernel(uint16_t* y, int64_t n, float amplitude, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = vision_mma::to_bf16(amplitude * uniform_pm1(seed, i));
}

__global__ void fill_f32_kernel(float* y, int64_t n, float center, float spread, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = center + spread * uniform_pm1(seed, i);
}

unsigned blocks(int64_t n) { return unsigned(std::clamp<int64_t>((n + 255) / 256, 1, 8192)); }

}  // namespace

void vision_fill_bf16(uint16_t* y, int64_t n, float amplitude, uint64_t seed, cudaStream_t stream) {
  TERN_CHECK(n >= 0 && (y || n == 0), "vision_fill_bf16: ", n, " values");
  if (n == 0) return;
  fill_bf16_kernel<<<blocks(n), 256, 0, stream>>>(y, n, amplitude, seed);
  TERN_CUDA_LAUNCHED("vision_fill_bf16");
}

void vision_fill_f32(float* y, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream) {
  TERN_CHECK(n >= 0 && (y || n == 0), "vision_fill_f32: ", n, " values");
  if (n == 0) return;
  fill_f32_kernel<<<blocks(n), 256, 0, stream>>>(y, n, center, spread, seed);
  TERN_CUDA_LAUNCHED("vision_fill_f32");
}

}  // namespace tern::cuda
