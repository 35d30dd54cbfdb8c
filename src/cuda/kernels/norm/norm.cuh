// Embedding lookup and RMSNorm forms (fp32 activations).
#pragma once

#include <cuda_runtime.h>

#include "cuda/weights/device_weights.cuh"

namespace tern::cuda {

// out[t] = dequant(embed row tokens[t]).   tokens [T] (device, each in [0, V)), out [T, D]
void embed_lookup(const DMat& embed, const int* tokens, int64_t T, float* out, cudaStream_t stream);

// out[t] = x[t] * rsqrt(mean(x[t]²) + eps) * w.   x, out [T, D] (row strides D), w [D]; out may equal x.
void rmsnorm(const float* x, const float* w, float eps, int64_t T, int64_t D, float* out, cudaStream_t stream);

// rmsnorm that also writes its output in the prefill products' prepared forms, in one pass over x (the prefill plan's
// norms, whose outputs every product of the block reads prepared): normed [T, D] as rmsnorm (its sum of squares
// summed in another order); split (optional): normed in matmul_prepare_x's layout (qmatmul.cuh); q16 (optional):
// normed in matmul_quantize_x's (qmatmul_int8.cuh), and q16_rest (optional, with q16) its residual; f16x2
// (optional, D a multiple of 256): normed in matmul_prepare_x_f16x2's (qmatmul_wgmma.cuh: fp16 hi + lo). Each
// prepared byte is the one the preparing kernel writes from `normed`. Whether it takes D: a multiple of 128, at most
// 8192. x, w, normed and the prepared buffers 16-byte aligned; out must not alias x.
bool rmsnorm_prepare_takes(int64_t D);
void rmsnorm_prepare(const float* x, const float* w, float eps, int64_t T, int64_t D, float* normed, void* split,
                     void* q16, void* q16_rest, cudaStream_t stream, void* f16x2 = nullptr);

}  // namespace tern::cuda
