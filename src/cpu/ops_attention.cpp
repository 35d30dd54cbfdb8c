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

void attention_segments(const SegmentAttentionArgs& a) {
  TERN_CHECK(a.segments >= 0 && (a.segments == 0 || (a.bounds[0] == 0 && a.bounds[a.segments] == a.N)),
             "attention_segments: the segments must cover [0, ", a.N, ")");
  std::vector<int64_t> segment_of(size_t(a.N));
  for (int64_t s = 0; s < a.segments; ++s) {
    TERN_CHECK(a.bounds[s] <= a.bounds[s + 1], "attention_segments: segment ", s, " ends before it starts");
    for (int64_t t = a.bounds[s]; t < a.bounds[s + 1]; ++t) segment_of[size_t(t)] = s;
  }
  const int64_t dh = a.dh, row = int64_t(a.H) * dh;
  // One task per (token, head), each computed by one thread in a fixed order.
  thread_pool_global().parallel_for(a.N * a.H, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> score;
    std::vector<double> acc(static_cast<size_t>(dh));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / a.H;
      const int64_t h = i % a.H;
      const int64_t s = segment_of[size_t(t)];
      const int64_t j0 = a.bounds[s], j1 = a.bounds[s + 1];
      const float* q = a.q + t * row + h * dh;
      score.resize(size_t(j1 - j0));
      float mx = -INFINITY;
      for (int64_t j = j0; j < j1; ++j) {
        const float* k = a.k + j * row + h * dh;
        float dot = 0.0f;
        for (int64_t d = 0; d < dh; ++d) dot += q[d] * k[d];
        dot *= a.scale;
        score[size_t(j - j0)] = dot;
        mx = std::max(mx, dot);
      }
      double sum = 0.0;
      for (float& x : score) {
        x = std::exp(x - mx);
        sum += x;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = j0; j < j1; ++j) {
        const double p = score[size_t(j - j0)];
        const float* v = a.v + j * row + h * dh;
        for (int64_t d = 0; d < dh; ++d) acc[size_t(d)] += p * double(v[d]);
      }
      float* o = a.out + t * row + h * dh;
      const double inv = 1.0 / sum;
      for (int64_t d = 0; d < dh; ++d) o[d] = float(acc[size_t(d)] * inv);
    }
  });
}

}  // namespace tern::cpu
