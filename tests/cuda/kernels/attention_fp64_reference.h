// The fp64 attention reference the scaled caches' tests share (attention_fp8_test.cpp, attention_i16_test.cpp): the
// outputs of attention() over a cache whose values the test knows exactly, against causal softmax attention in fp64
// over those values and the kernels' own q, gated by sigmoid(gate) in fp64.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {

// out [T, Hq, dh] against the reference over K, V [Hkv, pos0 + T, dh] (fp64) and q [T, Hq, dh] (attn_prepare's): every
// ungated element within element_bound of its row's rms, and the row-normalised rms error below rms_bound. `tag`
// names the cache in the printed line.
inline void expect_attention_matches_fp64(const AttnDims& d, int64_t pos0, const std::vector<float>& q,
                                          const std::vector<float>& qg, const std::vector<double>& K,
                                          const std::vector<double>& V, const std::vector<float>& out,
                                          double element_bound, double rms_bound, const char* tag,
                                          const std::string& what) {
  const int64_t T = d.T, Hq = d.Hq, dh = d.dh, G = d.Hq / d.Hkv, L = pos0 + T;
  const double scale = 1.0 / std::sqrt(double(dh));
  size_t bad = 0;
  double worst = 0.0, sum_sq_rel = 0.0;
  std::vector<double> p, o(static_cast<size_t>(dh));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      const int kvh = int(h / G);
      const int64_t n = pos0 + t + 1;
      const float* qr = q.data() + (t * Hq + h) * dh;
      p.assign(size_t(n), 0.0);
      double mx = -1e300;
      for (int64_t j = 0; j < n; ++j) {
        const double* kr = K.data() + (kvh * L + j) * dh;
        double s = 0.0;
        for (int64_t i = 0; i < dh; ++i) s += double(qr[i]) * kr[i];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      double sum = 0.0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double* vr = V.data() + (kvh * L + j) * dh;
        for (int64_t i = 0; i < dh; ++i) o[size_t(i)] += p[size_t(j)] / sum * vr[i];
      }
      double ss = 0.0, es = 0.0;
      for (int64_t i = 0; i < dh; ++i) ss += o[size_t(i)] * o[size_t(i)];
      const double row_rms = std::sqrt(ss / double(dh)) + 1e-30;
      for (int64_t i = 0; i < dh; ++i) {
        const size_t e = size_t((t * Hq + h) * dh + i);
        const double gate = 1.0 / (1.0 + std::exp(-double(qg[size_t((t * Hq + h) * 2 * dh + dh + i)])));
        const double err = std::fabs(double(out[e]) / gate - o[size_t(i)]);
        const double ratio = std::isnan(err) ? 1e30 : err / row_rms;
        es += std::min(ratio, 1e15) * std::min(ratio, 1e15);
        if (!(ratio <= element_bound)) ++bad;
        worst = std::max(worst, ratio);
      }
      sum_sq_rel += es / double(dh);
    }
  const double rel_rms = std::sqrt(sum_sq_rel / double(T * Hq));
  EXPECT_EQ(bad, 0u) << what << ": elements off by more than " << element_bound << " of their row's rms (worst "
                     << worst << ")";
  EXPECT_LT(rel_rms, rms_bound) << what << ": row-normalised rms error";
  std::printf("[attention %s] %s: row-normalised rms error %.2e, worst %.2e\n", tag, what.c_str(), rel_rms, worst);
}

}  // namespace tern::cuda::test
