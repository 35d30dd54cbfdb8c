// The vision encoder's dense products (every Linear of the tower, and the patch embedding as one): bf16 activations
// times bf16 weights on the tensor cores (mma.sync m16n8k16, fp32 accumulation), with the bias, the activation and
// the residual add in the epilogue.
//
//   acc[M, N] = x[M, K] · wᵀ + bias          x [M, K] bf16 (row stride K), w [N, K] bf16 (as stored), bias [N] fp32
//   v         = act(acc)                      act: none, gelu_tanh (gelu_pytorch_tanh) or gelu_erf (exact)
//   y_f32     = v  (or y_f32 += v with accumulate: the residual stream)    [M, N] fp32, optional
//   y_bf16    = bf16(v)                                                     [M, N] bf16, optional (the next input)
//
// Tiles of 128 x 128 outputs, 32 deep, in a 3-stage cp.async pipeline; the K tail and the M, N edges are zero-filled
// or masked, so any M >= 0, N even and K a multiple of 8 work (16-byte aligned rows). Launched on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

enum class VisionAct : int { none = 0, gelu_tanh = 1, gelu_erf = 2 };

struct VisionGemmArgs {
  const uint16_t* x = nullptr;     // [M, K] bf16 bits
  const uint16_t* w = nullptr;     // [N, K] bf16 bits
  const float* bias = nullptr;     // [N] or null
  int64_t M = 0, N = 0, K = 0;
  VisionAct act = VisionAct::none;
  float* y_f32 = nullptr;          // [M, N] or null
  bool accumulate = false;         // y_f32 += v instead of y_f32 = v
  uint16_t* y_bf16 = nullptr;      // [M, N] bf16 bits or null
};

// Throws tern::Error for shapes it cannot take (K not a multiple of 8, N odd, no output, misaligned pointers).
void vision_gemm(const VisionGemmArgs& a, cudaStream_t stream);

}  // namespace tern::cuda
