// The vision tower's LayerNorm (every norm of the blocks and the merger's; eps 1e-6): fp32 rows of the residual
// stream in, the normalised rows in bf16 out, ready for the next product (vision_gemm).
//
//   y[r] = bf16((x[r] − mean(x[r])) / sqrt(var(x[r]) + eps) · w + b)     x [M, D] fp32, w, b [D] fp32, y [M, D] bf16
//
// mean and var (the biased one, over D) in fp32 in two passes over the row, one warp per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

void vision_layernorm(const float* x, const float* w, const float* b, float eps, int64_t M, int64_t D, uint16_t* y,
                      cudaStream_t stream);

}  // namespace tern::cuda
