// Elementwise activations and helpers, fp32. Each is the oracle of the matching CUDA device function.
#pragma once

#include <cmath>
#include <cstdint>

namespace tern::cpu {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// Overflow-safe softplus, as PyTorch computes it (threshold 20: x itself above).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// GELU, exact (erf; torch's nn.GELU(), the vision merger's) and tanh-approximated (gelu_pytorch_tanh, the vision
// blocks' MLP): 0.5 x (1 + erf(x / √2)) and 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

// out[n] = silu(gate[n]) * up[n]. out may equal gate or up.
void swiglu(const float* gate, const float* up, int64_t n, float* out);
// y[n] += x[n]
void add_inplace(float* y, const float* x, int64_t n);
// x[n] *= sigmoid(gate[n])
void mul_sigmoid_inplace(float* x, const float* gate, int64_t n);

}  // namespace tern::cpu
