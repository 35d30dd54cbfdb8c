// Causal depthwise conv1d with state, then SiLU (the Gated DeltaNet input conv).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// For every channel c and token t (window = the Ck-1 previous inputs of c, from `state` before token 0):
//   out[t, c] = silu( Σ_j w[c, j] · x_{t-(Ck-1)+j}[c] )      tap Ck-1 multiplies the current token
// and afterwards state holds the last Ck-1 inputs (oldest first).
//   x [T, ldx] (first C columns used), out [T, C], w [C, Ck], state [Ck-1, C]. Ck <= 8. out must not alias x.
// Parallel over (4 channels, 32 tokens) per thread (float4 when C and ldx are multiples of 4 and pointers aligned).
void conv1d_silu(const float* x, int64_t ldx, int64_t T, int64_t C, int Ck, const float* w, float* state, float* out,
                 cudaStream_t stream);

// conv1d_silu with the Gated DeltaNet q/k normalisation fused (prefill: replaces conv1d_silu + the norms of
// gdn_prepare; pair it with gdn_gates): out channels [0, q_channels) are then L2-normalised per head of head_dim
// channels and token (rsqrt(Σy² + 1e-6)) and scaled by 1/√head_dim, channels [q_channels, q_channels + k_channels)
// L2-normalised, the rest left as conv1d_silu writes them. head_dim 128, q_channels and k_channels multiples of 128,
// C and ldx multiples of 4, x / out / state 16-byte aligned.
void conv1d_silu_qknorm(const float* x, int64_t ldx, int64_t T, int64_t C, int Ck, const float* w, float* state,
                        float* out, int64_t q_channels, int64_t k_channels, int head_dim, cudaStream_t stream);

}  // namespace tern::cuda
