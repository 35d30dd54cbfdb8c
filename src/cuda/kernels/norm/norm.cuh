// Embedding lookup and RMSNorm forms (fp32 activations).
#pragma once

#include <cuda_runtime.h>

#include "cuda/weights/device_weights.cuh"

namespace tern::cuda {

// out[t] = dequant(embed row tokens[t]).   tokens [T] (device, each in [0, V)), out [T, D]
void embed_lookup(const DMat& embed, const int* tokens, int64_t T, float* out, cudaStream_t stream);

// out[t] = x[t] * rsqrt(mean(x[t]²) + eps) * w.   x, out [T, D] (row strides D), w [D]; out may equal x.
void rmsnorm(const float* x, const float* w, float eps, int64_t T, int64_t D, float* out, cudaStream_t stream);

}  // namespace tern::cuda
