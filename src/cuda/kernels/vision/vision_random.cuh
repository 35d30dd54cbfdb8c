// Random vision-tower weights generated on the device (tern bench --synthetic --image: the encoder's speed at the real
// widths without a checkpoint). Deterministic in (seed, element index); not the demo model's values.
//
// vision_fill_bf16: y[i] = bf16(amplitude · u_i), u_i uniform on [-1, 1)          y [n] bf16
// vision_fill_f32:  y[i] = center + spread · u_i                                   y [n] fp32
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

void vision_fill_bf16(uint16_t* y, int64_t n, float amplitude, uint64_t seed, cudaStream_t stream);
void vision_fill_f32(float* y, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream);

}  // namespace tern::cuda
