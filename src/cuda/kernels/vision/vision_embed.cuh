// The vision tower's input side: after the patch embedding (a vision_gemm of the pixel rows, rounded to bf16 on the
// host, with the Conv3d's weight as a [Dv, C·Tp·P·P] matrix), the learned positions resampled to the image's grid
// added to its output.
//
// vision_add_positions: x[t] += Σ_{j<4} weight[t, j] · table[index[t, j]]   (j in order, the sum first, then added)
//                       x [N, Dv] fp32, table [rows, Dv] fp32, index [N, 4] int32 (each in [0, rows): the caller's
//                       promise, cpu::vision_pos_taps makes them), weight [N, 4] fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

void vision_add_positions(float* x, const float* table, const int32_t* index, const float* weight, int64_t N,
                          int64_t Dv, cudaStream_t stream);

}  // namespace tern::cuda
