// Normalisations, fp32 throughout.
#pragma once

#include <cstdint>

namespace tern::cpu {

// RMSNorm, multiplier form (the multiplier is final: HF's zero-centred weights already became 1 + w at load):
//   y[n, d] = x * rsqrt(mean(x²) + eps) * w[d]
// x [n, d], w [d], y [n, d]; y may equal x.
void rms_norm(const float* x, const float* w, int64_t n, int64_t d, float eps, float* y);

// Gated RMSNorm of Gated DeltaNet (norm first, then gate), per row of d (= dv, one v-head):
//   y = (x * rsqrt(mean(x²) + eps)) * w * silu(z)
// x, z, y [n, d] (n = tokens × Hv); w [d] used as is; y may equal x.
void gated_rms_norm(const float* x, const float* z, const float* w, int64_t n, int64_t d, float eps, float* y);

// LayerNorm (the vision encoder's), per row of d: y = (x − mean) · rsqrt(var + eps) · w + b, var the biased
// variance (mean and variance accumulated in double). x, y [n, d]; w, b [d]; y may equal x.
void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t d, float eps, float* y);

// L2 normalisation with a scale, per row: y = x * rsqrt(Σx² + eps) * scale. x, y [n, d]; y may equal x.
void l2_norm(const float* x, int64_t n, int64_t d, float eps, float scale, float* y);

}  // namespace tern::cpu
