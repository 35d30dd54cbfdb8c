// Causal depthwise conv1d with SiLU, the first step of Gated DeltaNet (over the in_proj_qkv channels only).
#pragma once

#include <cstdint>

namespace tern::cpu {

// For every channel c and token t (history before the sequence start is zeros, or the state):
//   u[t, c] = Σ_{j=0..Ck-1} w[c, j] · x[t - (Ck-1) + j, c]        (tap Ck-1 multiplies the current token)
//   y[t, c] = silu(u[t, c])
// x [T, C] pre-conv inputs (in_proj_qkv outputs); w [C, Ck]; y [T, C] (must not overlap x).
// state [Ck-1, C] in/out: the last Ck-1 pre-conv inputs, row 0 the oldest; zeros for a new sequence. On return it
// holds the last Ck-1 inputs including this call's tokens, so a later call continues exactly.
struct Conv1dArgs {
  const float* x = nullptr;
  int64_t T = 0;
  int64_t C = 0;
  const float* w = nullptr;
  int Ck = 4;
  float* state = nullptr;
  float* y = nullptr;
};
void conv1d_causal_silu(const Conv1dArgs& args);

}  // namespace tern::cpu
