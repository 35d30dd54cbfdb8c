// The MTP draft head on the CPU (docs/model.md §2.8), composed from the ops: for each pair (h_t, x_{t+1}),
//   u = [rms_norm(embed(x_{t+1}); pre_fc_norm_embedding) ; rms_norm(h_t; pre_fc_norm_hidden)]     [2D]
//   x = fc · u                                                                                     [D]
//   x = x + gated_attention(rms_norm(x; input_norm)) at position t (the head's own KV cache)
//   x = x + moe(rms_norm(x; post_attn_norm))
//   out = rms_norm(x; mtp.norm)   -> the shared LM head gives the logits of token t+2; out is also the next
//                                    draft step's h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/weights.h"

namespace tern::cpu {

// The MTP layer's KV cache of one sequence: K and V [Hkv, allocated, dh], grown on demand up to `capacity`.
struct MtpCache {
  std::vector<float> k, v;
  int64_t allocated = 0;
  int64_t rows = 0;  // positions [0, rows) written (contiguously)
  void reserve(const Config& c, int64_t needed, int64_t capacity);
  void clear() { rows = 0; }
};

struct MtpForwardArgs {
  const ModelWeights* weights = nullptr;  // with weights->mtp
  MtpCache* cache = nullptr;
  int64_t capacity = 0;                   // the session's context: positions < capacity
  const float* hidden = nullptr;          // [T, D] h_t (the main model's after the final norm, or a draft's out)
  std::span<const int32_t> tokens;        // [T] x_{t+1}
  int64_t pos0 = 0;                       // t of the first pair; <= cache->rows (rows from pos0 on are rewritten)
  float* out = nullptr;                   // [T, D] the head's hidden after mtp.norm (the LM head's input)
};
// Throws tern::Error on a bad token id or position before touching the cache.
void mtp_forward(const MtpForwardArgs& args);

}  // namespace tern::cpu
