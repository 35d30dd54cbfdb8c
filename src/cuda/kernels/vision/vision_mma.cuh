// Device helpers of the vision encoder's kernels: one float to and from bf16 bits. The cp.async copies, ldmatrix
// fragment loads and the bf16 mma.sync m16n8k16 of its tensor-core kernels (vision_gemm.cu, vision_attention.cu) are
// common/ptx.cuh's (included here; fragment layout there). Included by the vision .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace tern::cuda::vision_mma {

// One float -> bf16 bits (round to nearest even).
__device__ __forceinline__ uint16_t to_bf16(float x) { return uint16_t(cvt_bf16x2(x, 0.0f) & 0xffffu); }
__device__ __forceinline__ float from_bf16(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

}  // namespace tern::cuda::vision_mma
