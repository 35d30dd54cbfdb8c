// Causal depthwise conv1d with state, then SiLU (the Gated DeltaNet input conv).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// For every channel c and token t (window = the Ck-1 previous inputs of c, from `state` before token 0):
//   out[t, c] = silu( Σ_j w[c, j] · x_{t-(Ck-1)+j}[c] )      tap Ck-1 multiplies the current token
// and afterwards state holds the last Ck-1 inputs (oldest first).
//   x [T, ldx] (first C columns used), out [T, C], w [C, Ck], state [Ck-1, C]. Ck <= 8. out must not alias x.
void conv1d_silu(const float* x, int64_t ldx, int64_t T, int64_t C, int Ck, const float* w, float* state, float* out,
                 cudaStream_t stream);

}  // namespace tern::cuda
