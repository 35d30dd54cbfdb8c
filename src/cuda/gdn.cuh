// Gated DeltaNet core (model.md §2.4): q/k normalisation and gates, the gated delta rule over an fp32 state, and the
// gated RMSNorm. The state is V-major: [Hv][dv][dk] fp32 (row j of head h holds S[:, j] over the key dims).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

struct GdnDims {
  int64_t T = 0;
  int Hk = 16, Hv = 32, dk = 128, dv = 128;
  __host__ __device__ int64_t C() const { return 2LL * Hk * dk + int64_t(Hv) * dv; }
};

// In place on qkv [T, C] = [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)] (after conv + SiLU):
//   q ← q·rsqrt(Σq² + 1e-6)/√dk, k ← k·rsqrt(Σk² + 1e-6) per key head;
// and per value head h: g_log[t,h] = −exp(A_log[h])·softplus(a[t,h] + dt_bias[h]), beta[t,h] = sigmoid(b[t,h]).
//   b, a [T, Hv]; g_log, beta [T, Hv].
void gdn_prepare(float* qkv, const float* b, const float* a, const float* A_log, const float* dt_bias, const GdnDims& d,
                 float* g_log, float* beta, cudaStream_t stream);

// The recurrence, token by token, v-head h using key head h / (Hv/Hk):
//   S ← e^{g}·S;  δ = β(v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq
// qkv as left by gdn_prepare; state [Hv, dv, dk] read and written in place; o [T, Hv·dv].
// dk must be 32, 64 or 128 and dv a multiple of 16.
void gdn_recurrent(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                   cudaStream_t stream);

// The same function as gdn_recurrent (same inputs, outputs and state layout) in the chunked (WY/UT) form: per v-head
// and chunk of `chunk` tokens, G = in-chunk cumulative log decay, the deltas solve (I + A)Δ = β(V − e^{G}·K·S₀ᵀ)
// with A[t,s] = β_t e^{G_t−G_s} k_t·k_s (s < t) by forward substitution; o = e^{G}·Q·S₀ᵀ + (e^{G_t−G_s} q_t·k_s)_{s≤t}·Δ;
// S ← e^{G_n}·S₀ + Σ_s e^{G_n−G_s} δ_s k_sᵀ. Any T (the last chunk may be short). fp32 throughout.
// dk 32, 64 or 128; dv a multiple of 32; 1 ≤ chunk ≤ 64.
void gdn_chunked(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                 cudaStream_t stream, int chunk = 64);

// out[t, h, :] = (o·rsqrt(mean(o²) + eps)·w) · silu(z[t, h, :]) per head over dv.  o, z, out [T, Hv·dv]; w [dv].
void gdn_gated_norm(const float* o, const float* z, const float* w, float eps, const GdnDims& d, float* out,
                    cudaStream_t stream);

}  // namespace tern::cuda
