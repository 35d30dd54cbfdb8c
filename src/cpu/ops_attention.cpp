#include "cpu/ops_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"

namespace tern::cpu {

void kv_cache_write(const KvWriteArgs& a) {
  TERN_CHECK(a.pos0 >= 0 && a.T >= 0 && a.pos0 + a.T <= a.capacity, "kv_cache_write: positions [", a.pos0, ", ",
             a.pos0 + a.T, ") exceed the cache capacity ", a.capacity);
  for (int64_t t = 0; t < a.T; ++t)
    for (int h = 0; h < a.Hkv; ++h) {
      const int64_t src = (t * a.Hkv + h) * a.dh;
      const int64_t dst = (int64_t(h) * a.capacity + a.pos0 + t) * a.dh;
      std::memcpy(a.k_cache + dst, a.k + src, size_t(a.dh) * 4);
      std::memcpy(a.v_cache + dst, a.v + src, size_t(a.dh) * 4);
    }
}

void attention_causal(const AttentionArgs& a) {
  TERN_CHECK(a.Hq > 0 && a.Hkv > 0 && a.Hq % a.Hkv == 0, "attention: ", a.Hq, " query heads do not group over ",
             a.Hkv, " KV heads");
  TERN_CHECK(a.pos0 >= 0 && a.pos0 + a.T <= a.capacity, "attention: positions exceed the cache capacity");
  const int group = a.Hq / a.Hkv;
  const int64_t dh = a.dh;
  // One task per (token, query head); each is computed by one thread in a fixed order.
  thread_pool_global().parallel_for(a.T * a.Hq, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> score;
    std::vector<double> acc(static_cast<size_t>(dh));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / a.Hq;
      const int h = int(i % a.Hq);
      const int kvh = h / group;
      const int64_t n = a.pos0 + t + 1;  // keys 0 .. pos0 + t
      const float* q = a.q + i * dh;
      const float* K = a.k_cache + int64_t(kvh) * a.capacity * dh;
      const float* V = a.v_cache + int64_t(kvh) * a.capacity * dh;
      score.resize(size_t(n));
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* k = K + j * dh;
        float s = 0.0f;
        for (int64_t d = 0; d < dh; ++d) s += q[d] * k[d];
        s *= a.scale;
        score[size_t(j)] = s;
        mx = std::max(mx, s);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        score[size_t(j)] = std::exp(score[size_t(j)] - mx);
        sum += score[size_t(j)];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const float p = score[size_t(j)];
        const float* v = V + j * dh;
        for (int64_t d = 0; d < dh; ++d) acc[size_t(d)] += double(p) * double(v[d]);
      }
      float* o = a.out + i * dh;
      const double inv = 1.0 / sum;
      for (int64_t d = 0; d < dh; ++d) o[d] = float(acc[size_t(d)] * inv);
    }
  });
}

}  // namespace tern::cpu
