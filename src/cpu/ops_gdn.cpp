#include "cpu/ops_gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_norm.h"

namespace tern::cpu {
namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));

// Σ a[i]·b[i] with eight lanes, then a fixed horizontal sum and the scalar tail.
inline float dot(const float* a, const float* b, int64_t n) {
  v8f acc = {};
  const int64_t n8 = n / 8 * 8;
  for (int64_t i = 0; i < n8; i += 8)
    acc += *reinterpret_cast<const v8f_unaligned*>(a + i) * *reinterpret_cast<const v8f_unaligned*>(b + i);
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (int64_t i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if defined(__x86_64__) && !defined(__clang__)
#define TERN_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TERN_CPU_CLONES
#endif

void check_args(const GdnArgs& a, const char* what) {
  const GdnDims& d = a.dims;
  TERN_CHECK(d.Hk > 0 && d.Hv > 0 && d.Hv % d.Hk == 0 && d.dk > 0 && d.dv > 0, what, ": bad dims Hk=", d.Hk,
             " Hv=", d.Hv, " dk=", d.dk, " dv=", d.dv);
  TERN_CHECK(a.q && a.k && a.v && a.g && a.beta && a.state && a.out, what, ": null pointer");
  TERN_CHECK(a.T >= 0, what, ": negative token count");
}

// Heads [h0, h1) of the recurrent form.
TERN_CPU_CLONES void gdn_recurrent_heads(const GdnArgs& a, int64_t h0, int64_t h1) {
  const GdnDims& d = a.dims;
  const int ratio = d.Hv / d.Hk;
  for (int64_t h = h0; h < h1; ++h) {
    const int kh = int(h) / ratio;
    float* M = a.state + h * d.dv * d.dk;  // [dv, dk]
    for (int64_t t = 0; t < a.T; ++t) {
      const float* q = a.q + t * a.ld + int64_t(kh) * d.dk;
      const float* k = a.k + t * a.ld + int64_t(kh) * d.dk;
      const float* v = a.v + t * a.ld + h * d.dv;
      const float alpha = std::exp(a.g[t * d.Hv + h]);
      const float beta = a.beta[t * d.Hv + h];
      float* o = a.out + (t * d.Hv + h) * d.dv;
      for (int64_t j = 0; j < d.dv; ++j) {
        float* row = M + j * d.dk;
        for (int64_t i = 0; i < d.dk; ++i) row[i] *= alpha;
        const float delta = beta * (v[j] - dot(row, k, d.dk));
        for (int64_t i = 0; i < d.dk; ++i) row[i] += delta * k[i];
        o[j] = dot(row, q, d.dk);
      }
    }
  }
}

// Heads [h0, h1) of the chunked form.
TERN_CPU_CLONES void gdn_chunked_heads(const GdnArgs& a, int chunk, int64_t h0, int64_t h1) {
  const GdnDims& d = a.dims;
  const int ratio = d.Hv / d.Hk;
  const int64_t dk = d.dk, dv = d.dv;
  const int64_t L = chunk;
  std::vector<float> G(static_cast<size_t>(L)), KK(static_cast<size_t>(L * L)), QK(static_cast<size_t>(L * L));
  const size_t Ldv = static_cast<size_t>(L * dv);
  std::vector<float> Mk(Ldv), Mq(Ldv), delta(Ldv);  // [L, dv] each
  for (int64_t h = h0; h < h1; ++h) {
    const int kh = int(h) / ratio;
    float* M = a.state + h * dv * dk;  // [dv, dk]
    for (int64_t c0 = 0; c0 < a.T; c0 += L) {
      const int64_t n = std::min(L, a.T - c0);
      auto q = [&](int64_t s) { return a.q + (c0 + s) * a.ld + int64_t(kh) * dk; };
      auto k = [&](int64_t s) { return a.k + (c0 + s) * a.ld + int64_t(kh) * dk; };
      auto v = [&](int64_t s) { return a.v + (c0 + s) * a.ld + h * dv; };
      auto beta = [&](int64_t s) { return a.beta[(c0 + s) * d.Hv + h]; };
      // G: cumulative log decay inside the chunk.
      float acc = 0.0f;
      for (int64_t s = 0; s < n; ++s) {
        acc += a.g[(c0 + s) * d.Hv + h];
        G[size_t(s)] = acc;
      }
      // Gram matrices: KK[t][s] = k_t·k_s (s < t), QK[t][s] = q_t·k_s (s <= t).
      for (int64_t t = 0; t < n; ++t)
        for (int64_t s = 0; s <= t; ++s) {
          if (s < t) KK[size_t(t * L + s)] = dot(k(t), k(s), dk);
          QK[size_t(t * L + s)] = dot(q(t), k(s), dk);
        }
      // Reads of the chunk-start state: Mk[t] = M0 k_t, Mq[t] = M0 q_t (length dv each).
      for (int64_t j = 0; j < dv; ++j) {
        const float* row = M + j * dk;
        for (int64_t t = 0; t < n; ++t) {
          Mk[size_t(t * dv + j)] = dot(row, k(t), dk);
          Mq[size_t(t * dv + j)] = dot(row, q(t), dk);
        }
      }
      // Forward substitution: Δ_t = β_t (v_t − e^{G_t} M0 k_t) − Σ_{s<t} β_t e^{G_t−G_s} (k_t·k_s) Δ_s.
      for (int64_t t = 0; t < n; ++t) {
        const float bt = beta(t), gt = std::exp(G[size_t(t)]);
        float* dt = delta.data() + t * dv;
        const float* vt = v(t);
        for (int64_t j = 0; j < dv; ++j) dt[j] = bt * (vt[j] - gt * Mk[size_t(t * dv + j)]);
        for (int64_t s = 0; s < t; ++s) {
          const float c = bt * std::exp(G[size_t(t)] - G[size_t(s)]) * KK[size_t(t * L + s)];
          const float* ds = delta.data() + s * dv;
          for (int64_t j = 0; j < dv; ++j) dt[j] -= c * ds[j];
        }
      }
      // Outputs: o_t = e^{G_t} M0 q_t + Σ_{s<=t} e^{G_t−G_s} (q_t·k_s) Δ_s.
      for (int64_t t = 0; t < n; ++t) {
        const float gt = std::exp(G[size_t(t)]);
        float* o = a.out + ((c0 + t) * d.Hv + h) * dv;
        for (int64_t j = 0; j < dv; ++j) o[j] = gt * Mq[size_t(t * dv + j)];
        for (int64_t s = 0; s <= t; ++s) {
          const float c = std::exp(G[size_t(t)] - G[size_t(s)]) * QK[size_t(t * L + s)];
          const float* ds = delta.data() + s * dv;
          for (int64_t j = 0; j < dv; ++j) o[j] += c * ds[j];
        }
      }
      // State at the chunk end: M = e^{G_n} M0 + Σ_s e^{G_n−G_s} Δ_s k_sᵀ.
      const float gn = G[size_t(n - 1)];
      std::vector<float> w(static_cast<size_t>(n));
      for (int64_t s = 0; s < n; ++s) w[size_t(s)] = std::exp(gn - G[size_t(s)]);
      const float decay = std::exp(gn);
      for (int64_t j = 0; j < dv; ++j) {
        float* row = M + j * dk;
        for (int64_t i = 0; i < dk; ++i) row[i] *= decay;
        for (int64_t s = 0; s < n; ++s) {
          const float c = w[size_t(s)] * delta[size_t(s * dv + j)];
          const float* ks = k(s);
          for (int64_t i = 0; i < dk; ++i) row[i] += c * ks[i];
        }
      }
    }
  }
}

}  // namespace

void gdn_gates(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t T, int Hv,
               float* g, float* beta) {
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      g[i] = -std::exp(A_log[h]) * softplus(a[i] + dt_bias[h]);
      beta[i] = sigmoid(b[i]);
    }
}

void gdn_qk_norm(float* qkv, int64_t T, const GdnDims& d) {
  const int64_t C = 2LL * d.Hk * d.dk + int64_t(d.Hv) * d.dv;
  const float q_scale = 1.0f / std::sqrt(float(d.dk));
  for (int64_t t = 0; t < T; ++t) {
    float* q = qkv + t * C;
    float* k = q + int64_t(d.Hk) * d.dk;
    l2_norm(q, d.Hk, d.dk, 1e-6f, 1.0f, q);
    for (int64_t i = 0; i < int64_t(d.Hk) * d.dk; ++i) q[i] *= q_scale;  // HF: l2norm, then q / sqrt(dk)
    l2_norm(k, d.Hk, d.dk, 1e-6f, 1.0f, k);
  }
}

void gdn_recurrent(const GdnArgs& a) {
  check_args(a, "gdn_recurrent");
  thread_pool_global().parallel_for(a.dims.Hv, 1,
                                    [&](int64_t h0, int64_t h1) { gdn_recurrent_heads(a, h0, h1); });
}

void gdn_chunked(const GdnArgs& a, int chunk) {
  check_args(a, "gdn_chunked");
  TERN_CHECK(chunk >= 1 && chunk <= 1024, "gdn_chunked: chunk size ", chunk, " outside [1, 1024]");
  thread_pool_global().parallel_for(a.dims.Hv, 1,
                                    [&](int64_t h0, int64_t h1) { gdn_chunked_heads(a, chunk, h0, h1); });
}

}  // namespace tern::cpu
