// The gated full-attention mixer (docs/model.md §2.5) composed from the ops: q|gate, k, v projections, q/k norms,
// partial RoPE (or M-RoPE's angles), the KV cache append, causal attention, the sigmoid gate and o_proj. Shared by
// the main model's attention layers (cpu_runner) and the MTP head's layer (mtp_forward).
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace tern::cpu {

// A KV cache in the layout the attention op reads: K and V each [Hkv, capacity, dh].
struct KvCacheView {
  float* k = nullptr;
  float* v = nullptr;
  int64_t capacity = 0;
};

struct GatedAttentionArgs {
  const Config* config = nullptr;
  const LayerWeights* layer = nullptr;  // type full_attention
  KvCacheView cache;                    // rows [pos0, pos0 + T) are written, rows [0, pos0) read
  int64_t pos0 = 0;                     // cache position of the first token (its KV row and the causal mask)
  // Rotary positions: pos0 + t + rope_offset on every axis (M-RoPE's delta after images; 0 for text-only sessions),
  // unless rope_angles gives each token's angles [T, rot/2] (M-RoPE over image tokens, mrope_angles).
  int64_t rope_offset = 0;
  const float* rope_angles = nullptr;
  const float* a = nullptr;             // [T, D] the normed hidden
  int64_t T = 0;
  float* out = nullptr;                 // [T, D]
  float* core = nullptr;                // optional [T, Hq, dh]: the attention output before the gate (dumps)
};
void gated_attention(const GatedAttentionArgs& args);

}  // namespace tern::cpu
