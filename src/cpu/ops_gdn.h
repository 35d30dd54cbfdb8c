// Gated DeltaNet core (the linear-attention layers): gates, q/k normalisation, and the gated delta rule in two
// forms that compute the same function: the recurrent step (decode, and the oracle) and the chunked form (prefill).
//
// Recurrent state layout, shared with the CUDA kernels: V-major [Hv, dv, dk] fp32, i.e. M = Sᵀ with
// M[h][j][i] = S_hf[h][i][j] (HF keeps [Hv, dk, dv]). Zero for a new sequence.
//
// Per v-head h (q/k head h / (Hv/Hk): consecutive v-heads share a key head), per token t:
//   α = exp(g_t)                      (g_t <= 0 is the log decay)
//   M ← α M
//   δ = β_t (v_t − M k_t)             (length dv)
//   M ← M + δ k_tᵀ
//   o_t = M q_t                       (read after the update)
#pragma once

#include <cstdint>

namespace tern::cpu {

struct GdnDims {
  int Hk = 16;   // q/k heads
  int Hv = 32;   // v heads
  int dk = 128;  // key head dim
  int dv = 128;  // value head dim
};

// g[t, h] = -exp(A_log[h]) · softplus(a[t, h] + dt_bias[h]);  beta[t, h] = sigmoid(b[t, h]).
// a, b, g, beta [T, Hv]; A_log, dt_bias [Hv].
void gdn_gates(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t T, int Hv,
               float* g, float* beta);

// In place on the conv output qkv [T, C = 2·Hk·dk + Hv·dv] (row stride C): q heads (offset 0) become
// q · rsqrt(Σq² + 1e-6) · dk^-0.5, k heads (offset Hk·dk) become k · rsqrt(Σk² + 1e-6); v is untouched.
void gdn_qk_norm(float* qkv, int64_t T, const GdnDims& dims);

// Inputs of the delta rule over T tokens. q, k, v point into rows of ld floats (the qkv buffer: q = qkv,
// k = qkv + Hk·dk, v = qkv + 2·Hk·dk, ld = C); head h of q/k is at q + h·dk, v-head h at v + h·dv.
struct GdnArgs {
  const float* q = nullptr;     // [T, Hk, dk] rows of ld
  const float* k = nullptr;     // [T, Hk, dk] rows of ld
  const float* v = nullptr;     // [T, Hv, dv] rows of ld
  int64_t ld = 0;
  const float* g = nullptr;     // [T, Hv] log decay
  const float* beta = nullptr;  // [T, Hv]
  int64_t T = 0;
  GdnDims dims;
  float* state = nullptr;       // [Hv, dv, dk] in/out
  float* out = nullptr;         // [T, Hv, dv]
};

// Token by token (the definition). Parallel over v-heads.
void gdn_recurrent(const GdnArgs& args);

// Chunked form: tokens are processed in chunks of `chunk`; inside a chunk the deltas are found by forward
// substitution of the unit lower-triangular system (I + A)Δ = β(V − Γ K Mᵀ) with A[t,s] = β_t e^{G_t−G_s} k_t·k_s
// (s < t, G the in-chunk cumulative log decay), then outputs and the end-of-chunk state use matrix products.
// Equal to gdn_recurrent up to rounding for any T (including T not a multiple of chunk). Parallel over v-heads.
void gdn_chunked(const GdnArgs& args, int chunk = 64);

}  // namespace tern::cpu
