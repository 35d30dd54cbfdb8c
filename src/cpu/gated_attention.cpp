#include "cpu/gated_attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/ops_attention.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_matmul.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"

namespace tern::cpu {

void gated_attention(const GatedAttentionArgs& g) {
  const Config& c = *g.config;
  const LayerWeights& lw = *g.layer;
  const int64_t T = g.T;
  const int Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
  const float eps = float(c.rms_norm_eps);

  const size_t TQ = static_cast<size_t>(T * Hq * dh);
  std::vector<float> qg(2 * TQ), q(TQ), gate(TQ);
  std::vector<float> k(static_cast<size_t>(T * Hkv * dh)), v(static_cast<size_t>(T * Hkv * dh));
  matmul(lw.q_proj, g.a, T, qg.data());  // [T, Hq, (query dh | gate dh)]
  matmul(lw.k_proj, g.a, T, k.data());   // [T, Hkv, dh]
  matmul(lw.v_proj, g.a, T, v.data());   // [T, Hkv, dh]
  for (int64_t i = 0; i < T * Hq; ++i) {
    std::memcpy(q.data() + i * dh, qg.data() + i * 2 * dh, size_t(dh) * 4);
    std::memcpy(gate.data() + i * dh, qg.data() + i * 2 * dh + dh, size_t(dh) * 4);
  }
  rms_norm(q.data(), lw.q_norm.data(), T * Hq, dh, eps, q.data());
  rms_norm(k.data(), lw.k_norm.data(), T * Hkv, dh, eps, k.data());
  if (g.rope_angles) {
    rope_apply_angles(q.data(), T, Hq, dh, c.rotary_dims(), g.rope_angles);
    rope_apply_angles(k.data(), T, Hkv, dh, c.rotary_dims(), g.rope_angles);
  } else {
    const int64_t p0 = g.pos0 + g.rope_offset;
    rope_apply({.x = q.data(), .T = T, .H = Hq, .dh = dh, .rot = c.rotary_dims(), .theta = c.rope_theta, .pos0 = p0});
    rope_apply({.x = k.data(), .T = T, .H = Hkv, .dh = dh, .rot = c.rotary_dims(), .theta = c.rope_theta, .pos0 = p0});
  }
  kv_cache_write({.k = k.data(), .v = v.data(), .T = T, .Hkv = Hkv, .dh = dh, .k_cache = g.cache.k,
                  .v_cache = g.cache.v, .capacity = g.cache.capacity, .pos0 = g.pos0});
  std::vector<float> o(TQ);
  attention_causal({.q = q.data(), .k_cache = g.cache.k, .v_cache = g.cache.v, .capacity = g.cache.capacity,
                    .pos0 = g.pos0, .T = T, .Hq = Hq, .Hkv = Hkv, .dh = dh, .scale = 1.0f / std::sqrt(float(dh)),
                    .out = o.data()});
  if (g.core) std::memcpy(g.core, o.data(), TQ * sizeof(float));
  mul_sigmoid_inplace(o.data(), gate.data(), T * Hq * dh);
  matmul(lw.o_proj, o.data(), T, g.out);
}

}  // namespace tern::cpu
