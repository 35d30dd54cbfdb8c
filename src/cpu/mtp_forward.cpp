#include "cpu/mtp_forward.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "cpu/gated_attention.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_embed.h"
#include "cpu/ops_matmul.h"
#include "cpu/ops_moe.h"
#include "cpu/ops_norm.h"

namespace tern::cpu {

void MtpCache::reserve(const Config& c, int64_t needed, int64_t capacity) {
  if (needed <= allocated) return;
  const int64_t next = std::min(capacity, std::max(needed, std::max<int64_t>(256, 2 * allocated)));
  const int Hkv = c.num_key_value_heads;
  const int64_t dh = c.head_dim;
  for (std::vector<float>* cache : {&k, &v}) {
    std::vector<float> grown(static_cast<size_t>(Hkv * next * dh), 0.0f);
    for (int h = 0; h < Hkv && rows > 0; ++h)
      std::memcpy(grown.data() + h * next * dh, cache->data() + h * allocated * dh, size_t(rows * dh) * sizeof(float));
    cache->swap(grown);
  }
  allocated = next;
}

void mtp_forward(const MtpForwardArgs& a) {
  const ModelWeights& w = *a.weights;
  TERN_CHECK(w.mtp.has_value(), "mtp forward: the weights have no MTP head");
  const MtpWeights& m = *w.mtp;
  const Config& c = w.config;
  MtpCache& cache = *a.cache;
  const int64_t T = int64_t(a.tokens.size()), D = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  TERN_CHECK(T > 0, "mtp forward: no tokens");
  TERN_CHECK(a.pos0 >= 0 && a.pos0 <= cache.rows, "mtp forward: position ", a.pos0,
             " would leave a gap: the MTP cache holds positions [0, ", cache.rows, ")");
  TERN_CHECK(a.pos0 + T <= a.capacity, "mtp forward: positions up to ", a.pos0 + T,
             " exceed the session's capacity of ", a.capacity);

  // u = [norm_e(embed(x)) ; norm_h(h)]  [T, 2D]
  std::vector<float> e(size_t(T * D)), u(size_t(T * 2 * D));
  embed_lookup(w.embed, a.tokens, e.data());  // throws on a bad id before any state changes
  cache.reserve(c, a.pos0 + T, a.capacity);
  for (int64_t t = 0; t < T; ++t) {
    rms_norm(e.data() + t * D, m.pre_fc_norm_embedding.data(), 1, D, eps, u.data() + t * 2 * D);
    rms_norm(a.hidden + t * D, m.pre_fc_norm_hidden.data(), 1, D, eps, u.data() + t * 2 * D + D);
  }
  std::vector<float> x(size_t(T * D)), n(size_t(T * D)), mix(size_t(T * D));
  matmul(m.fc, u.data(), T, x.data());  // [T, D]

  // One full-attention decoder layer at positions [pos0, pos0 + T).
  const LayerWeights& l = m.layer;
  rms_norm(x.data(), l.input_norm.data(), T, D, eps, n.data());
  gated_attention({.config = &c, .layer = &l, .cache = {.k = cache.k.data(), .v = cache.v.data(),
                                                        .capacity = cache.allocated},
                   .pos0 = a.pos0, .a = n.data(), .T = T, .out = mix.data()});
  add_inplace(x.data(), mix.data(), T * D);
  rms_norm(x.data(), l.post_attn_norm.data(), T, D, eps, n.data());
  moe_forward({.layer = &l, .config = &c, .x = n.data(), .T = T, .y = mix.data()});
  add_inplace(x.data(), mix.data(), T * D);
  cache.rows = a.pos0 + T;

  rms_norm(x.data(), m.norm.data(), T, D, eps, a.out);
}

}  // namespace tern::cpu
