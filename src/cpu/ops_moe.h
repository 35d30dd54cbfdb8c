// Sparse MoE block: router (fp32 softmax over all experts, top-k, renormalise), routed SwiGLU experts, and the
// shared expert scaled by its sigmoid gate.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace tern::cpu {

// From router logits [T, E]: p = softmax(logits) in fp32; the k largest p (ties: lower expert id first) in
// descending order of p; weights renormalised to sum 1 when `renormalize`.
// ids [T, k] int32, weights [T, k] fp32.
struct RouteArgs {
  const float* logits = nullptr;
  int64_t T = 0;
  int E = 0;
  int k = 0;
  bool renormalize = true;
  int32_t* ids = nullptr;
  float* weights = nullptr;
};
void moe_route(const RouteArgs& args);

// One SwiGLU expert over n tokens: y[n, D] = down · (silu(gate · x) ⊙ (up · x)); gate/up plain [F, D], down [D, F].
// x [n, D]. scratch must hold 2·n·F floats.
void expert_swiglu(const Matrix& gate, const Matrix& up, const Matrix& down, const float* x, int64_t n, float* y,
                   float* scratch);

// The whole block for T tokens: x [T, D] (post-attention-normed hidden) -> y [T, D]:
//   y = Σ_{slot} w_slot · expert_{id_slot}(x) + sigmoid(x · shared_expert_gateᵀ) · shared(x)
// Routed contributions are added in ascending expert id for every token (one fixed order for prefill and decode).
// When ids/weights are given ([T, k] each) the routing decision is written there (tests, activation dumps).
struct MoeArgs {
  const LayerWeights* layer = nullptr;
  const Config* config = nullptr;
  const float* x = nullptr;
  int64_t T = 0;
  float* y = nullptr;
  int32_t* ids = nullptr;        // optional out [T, k]
  float* weights = nullptr;      // optional out [T, k]
};
void moe_forward(const MoeArgs& args);

}  // namespace tern::cpu
