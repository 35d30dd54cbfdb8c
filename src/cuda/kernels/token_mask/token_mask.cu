#include "cuda/kernels/token_mask/token_mask.cuh"

#include <cmath>

#include "cuda/common/cuda_common.cuh"

namespace tern::cuda {

namespace {

// One thread per logit: the 32 threads of a warp read the same mask word (one broadcast load).
__global__ void token_mask_kernel(float* logits, int64_t V, const uint32_t* __restrict__ mask, int64_t words) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < V; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i >> 5;
    const bool allowed = w < words && ((mask[w] >> (i & 31)) & 1u) != 0u;
    if (!allowed) logits[i] = -INFINITY;
  }
}

}  // namespace

void token_mask_apply(float* logits, int64_t V, const uint32_t* mask, int64_t words, cudaStream_t stream) {
  if (V <= 0) return;
  const unsigned b = blocks_for(V, 256);
  token_mask_kernel<<<b > 2048 ? 2048 : b, 256, 0, stream>>>(logits, V, mask, words);
  TERN_CUDA_LAUNCHED("token_mask");
}

}  // namespace tern::cuda
