// Gated attention core: KV-cache write and causal softmax attention with grouped KV heads, fp32.
#pragma once

#include <cstdint>

namespace tern::cpu {

// KV cache of one attention layer: K and V each [Hkv, capacity, dh] fp32, position-major within a head.

// Copies k, v [T, Hkv, dh] into the caches at positions [pos0, pos0 + T). Throws if pos0 + T > capacity.
struct KvWriteArgs {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t T = 0;
  int Hkv = 0;
  int dh = 0;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  int64_t capacity = 0;
  int64_t pos0 = 0;
};
void kv_cache_write(const KvWriteArgs& args);

// out[t, h, :] = softmax_j( scale · q[t, h] · K[h / (Hq/Hkv), j] ) · V[.., j]   over j in [0, pos0 + t]
// q [T, Hq, dh] (after q_norm and RoPE), caches as above holding positions [0, pos0 + T), out [T, Hq, dh].
// Prefill (pos0 = 0, T = N) and decode (T = 1) are the same call. Softmax in fp32 with the max subtracted.
struct AttentionArgs {
  const float* q = nullptr;
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  int64_t capacity = 0;
  int64_t pos0 = 0;
  int64_t T = 0;
  int Hq = 0;
  int Hkv = 0;
  int dh = 0;
  float scale = 0.0f;  // 1/sqrt(dh)
  float* out = nullptr;
};
void attention_causal(const AttentionArgs& args);

// Bidirectional attention within segments (the vision encoder: each image frame attends to itself only):
//   out[t, h, :] = softmax_j( scale · q[t, h] · k[j, h] ) · v[j, h]   over j in t's segment
// q, k, v, out [N, H, dh]; segment s is tokens [bounds[s], bounds[s + 1]) (bounds [S + 1], from 0 up to N).
struct SegmentAttentionArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t N = 0;
  int H = 0;
  int dh = 0;
  const int64_t* bounds = nullptr;
  int64_t segments = 0;
  float scale = 0.0f;
  float* out = nullptr;
};
void attention_segments(const SegmentAttentionArgs& args);

}  // namespace tern::cpu
