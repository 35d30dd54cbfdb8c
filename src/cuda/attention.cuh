// Gated full attention (model.md §2.5): q/k RMSNorm + partial rotate-half RoPE + KV-cache append, causal attention
// over the bf16 KV cache split along the keys (flash-decoding), and the merge with the sigmoid output gate.
// Positions live in device memory (*pos0 = tokens already in the cache), so a step needs no host value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

struct AttnDims {
  int64_t T = 0;        // new tokens
  int Hq = 16, Hkv = 2, dh = 256, rot = 64;
  float theta = 1e7f;
  float eps = 1e-6f;
  int64_t capacity = 0; // KV cache length
};

// qg [T, Hq·2·dh] (per head [q | gate]), k, v [T, Hkv·dh] ->
//   q_out [T, Hq, dh] = rope(rmsnorm(q)·q_norm), cache_k[kvh][pos0+t] = rope(rmsnorm(k)·k_norm), cache_v[..] = v (bf16).
// cache_k, cache_v: [Hkv, capacity, dh] bf16 bits.
void attn_prepare(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                  const int* pos0, const AttnDims& d, float* q_out, uint16_t* cache_k, uint16_t* cache_v,
                  cudaStream_t stream);

// Scratch for the split partials: o [T, Hq, splits, dh], m and l [T, Hq, splits].
int attn_splits_for(int64_t T, int Hkv);
int64_t attn_partial_floats(int64_t T, int Hq, int dh, int splits);

// out [T, Hq·dh] = softmax(q·Kᵀ/√dh, causal over positions 0..pos0+t) · V, times sigmoid(gate) from qg.
void attention(const float* q, const float* qg, const uint16_t* cache_k, const uint16_t* cache_v, const int* pos0,
               const AttnDims& d, float* partial, float* out, cudaStream_t stream);

}  // namespace tern::cuda
