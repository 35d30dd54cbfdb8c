#include "cuda/kernels/vision/vision_embed.cuh"

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"

namespace tern::cuda {
namespace {

// One block per patch, threads along Dv.
__global__ void vision_add_positions_kernel(float* x, const float* table, const int32_t* index, const float* weight,
                                            int64_t Dv) {
  const int64_t t = blockIdx.x;
  const float* rows[4];
  float wt[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    rows[j] = table + int64_t(index[4 * t + j]) * Dv;
    wt[j] = weight[4 * t + j];
  }
  float* xr = x + t * Dv;
  for (int64_t i = threadIdx.x; i < Dv; i += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) sum += rows[j][i] * wt[j];
    xr[i] += sum;
  }
}

}  // namespace

void vision_add_positions(float* x, const float* table, const int32_t* index, const float* weight, int64_t N,
                          int64_t Dv, cudaStream_t stream) {
  TERN_CHECK(N >= 0 && N < (int64_t(1) << 31) && Dv > 0 && x && table && index && weight,
             "vision_add_positions: [", N, ", ", Dv, "] needs x, the table and the taps");
  if (N == 0) return;
  vision_add_positions_kernel<<<unsigned(N), 256, 0, stream>>>(x, table, index, weight, Dv);
  TERN_CUDA_LAUNCHED("vision_add_positions");
}

}  // namespace tern::cuda
