#include "cuda/conv1d.cuh"

#include "core/check.h"
#include "cuda/cuda_common.cuh"

namespace tern::cuda {
namespace {

constexpr int kMaxTaps = 8;

// One thread per channel walks the tokens in order, keeping the window in registers.
__global__ void conv1d_silu_kernel(const float* x, int64_t ldx, int64_t T, int64_t C, int Ck, const float* w,
                                   float* state, float* out) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float win[kMaxTaps], wc[kMaxTaps];
  for (int j = 0; j < Ck; ++j) wc[j] = w[c * Ck + j];
  for (int j = 0; j < Ck - 1; ++j) win[j] = state[j * C + c];
  for (int64_t t = 0; t < T; ++t) {
    win[Ck - 1] = x[t * ldx + c];
    float u = 0.0f;
    for (int j = 0; j < Ck; ++j) u += wc[j] * win[j];
    out[t * C + c] = u / (1.0f + expf(-u));
    for (int j = 0; j < Ck - 1; ++j) win[j] = win[j + 1];
  }
  for (int j = 0; j < Ck - 1; ++j) state[j * C + c] = win[j];
}

}  // namespace

void conv1d_silu(const float* x, int64_t ldx, int64_t T, int64_t C, int Ck, const float* w, float* state, float* out,
                 cudaStream_t stream) {
  TERN_CHECK(Ck >= 1 && Ck <= kMaxTaps, "conv1d: kernel width ", Ck, " not in [1, ", kMaxTaps, "]");
  if (C == 0) return;
  conv1d_silu_kernel<<<blocks_for(C, 128), 128, 0, stream>>>(x, ldx, T, C, Ck, w, state, out);
  TERN_CUDA_LAUNCHED("conv1d_silu");
}

}  // namespace tern::cuda
