// Norms, conv1d, RoPE and attention against straightforward double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/ops_attention.h"
#include "cpu/ops_conv1d.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"
#include "core/check.h"
#include "cpu_test_util.h"

namespace tern {
namespace {

double silu_d(double x) { return x / (1.0 + std::exp(-x)); }

TEST(CpuNorm, RmsGatedL2) {
  test::Rng rng(test::fresh_seed("norm"));
  const int64_t n = 5, d = 48;
  const auto x = rng.normals(n * d, 2.0f), z = rng.normals(n * d), w = rng.normals(d);
  std::vector<float> y(n * d), yg(n * d), yl(n * d);
  cpu::rms_norm(x.data(), w.data(), n, d, 1e-6f, y.data());
  cpu::gated_rms_norm(x.data(), z.data(), w.data(), n, d, 1e-6f, yg.data());
  cpu::l2_norm(x.data(), n, d, 1e-6f, 0.5f, yl.data());
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / d + 1e-6), inv2 = 1.0 / std::sqrt(ss + 1e-6);
    for (int64_t i = 0; i < d; ++i) {
      const size_t j = size_t(r * d + i);
      const double e1 = x[j] * inv * w[size_t(i)], e2 = e1 * silu_d(z[j]), e3 = x[j] * inv2 * 0.5;
      EXPECT_NEAR(y[j], e1, 1e-5 * (1 + std::fabs(e1)));
      EXPECT_NEAR(yg[j], e2, 1e-5 * (1 + std::fabs(e2)));
      EXPECT_NEAR(yl[j], e3, 1e-6 * (1 + std::fabs(e3)));
    }
  }
  cpu::rms_norm(x.data(), w.data(), n, d, 1e-6f, const_cast<float*>(x.data()));  // in place is allowed
  for (size_t j = 0; j < x.size(); ++j) ASSERT_EQ(x[j], y[j]);
}

TEST(CpuConv1d, FormulaAndContinuation) {
  test::Rng rng(test::fresh_seed("conv1d"));
  const int64_t T = 11, C = 37;
  const int Ck = 4;
  const auto x = rng.normals(T * C), w = rng.normals(C * Ck);
  std::vector<float> y(T * C), state(3 * C, 0.0f);
  cpu::conv1d_causal_silu({.x = x.data(), .T = T, .C = C, .w = w.data(), .Ck = Ck, .state = state.data(),
                           .y = y.data()});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double u = 0;
      for (int j = 0; j < Ck; ++j) {
        const int64_t s = t - (Ck - 1) + j;
        if (s >= 0) u += double(w[c * Ck + j]) * x[s * C + c];
      }
      ASSERT_NEAR(y[t * C + c], silu_d(u), 1e-5 * (1 + std::fabs(u))) << "t " << t << " c " << c;
    }
  // The state holds the last 3 inputs.
  for (int j = 0; j < 3; ++j)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(state[j * C + c], x[(T - 3 + j) * C + c]);
  // Split into 4 + 1 + 6 tokens with the state carried: the same outputs, bit for bit.
  std::vector<float> y2(T * C), st2(3 * C, 0.0f);
  int64_t t0 = 0;
  for (int64_t len : {4, 1, 6}) {
    cpu::conv1d_causal_silu({.x = x.data() + t0 * C, .T = len, .C = C, .w = w.data(), .Ck = Ck,
                             .state = st2.data(), .y = y2.data() + t0 * C});
    t0 += len;
  }
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], y2[i]);
}

TEST(CpuRope, RotateHalfPartial) {
  test::Rng rng(test::fresh_seed("rope"));
  const int64_t T = 6;
  const int H = 3, dh = 32, rot = 16;
  const double theta = 1e7;
  const int64_t pos0 = 1000;
  auto x = rng.normals(T * H * dh);
  const auto x0 = x;
  cpu::rope_apply({.x = x.data(), .T = T, .H = H, .dh = dh, .rot = rot, .theta = theta, .pos0 = pos0});
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const float* a = x0.data() + (t * H + h) * dh;
      const float* b = x.data() + (t * H + h) * dh;
      for (int i = 0; i < rot / 2; ++i) {
        const double phi = double(pos0 + t) * std::pow(theta, -2.0 * i / rot);
        const double e0 = a[i] * std::cos(phi) - a[i + rot / 2] * std::sin(phi);
        const double e1 = a[i + rot / 2] * std::cos(phi) + a[i] * std::sin(phi);
        // fp32 angles as HF computes them: |Δφ| <= pos · 2^-23 relative.
        EXPECT_NEAR(b[i], e0, 2e-4);
        EXPECT_NEAR(b[i + rot / 2], e1, 2e-4);
      }
      for (int i = rot; i < dh; ++i) EXPECT_EQ(b[i], a[i]);
    }
}

TEST(CpuAttention, PrefillDecodeAndFormula) {
  test::Rng rng(test::fresh_seed("attention"));
  const int64_t T = 9, cap = 16;
  const int Hq = 4, Hkv = 2, dh = 8;
  const float scale = 1.0f / std::sqrt(float(dh));
  const auto q = rng.normals(T * Hq * dh), k = rng.normals(T * Hkv * dh), v = rng.normals(T * Hkv * dh);
  std::vector<float> kc(Hkv * cap * dh), vc(Hkv * cap * dh), out(T * Hq * dh);
  cpu::kv_cache_write({.k = k.data(), .v = v.data(), .T = T, .Hkv = Hkv, .dh = dh, .k_cache = kc.data(),
                       .v_cache = vc.data(), .capacity = cap, .pos0 = 0});
  cpu::attention_causal({.q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(), .capacity = cap, .pos0 = 0,
                         .T = T, .Hq = Hq, .Hkv = Hkv, .dh = dh, .scale = scale, .out = out.data()});
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hq; ++h) {
      const int kh = h / (Hq / Hkv);
      std::vector<double> s(static_cast<size_t>(t + 1));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int i = 0; i < dh; ++i) d += double(q[(t * Hq + h) * dh + i]) * k[(j * Hkv + kh) * dh + i];
        s[size_t(j)] = d * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int i = 0; i < dh; ++i) {
        double o = 0;
        for (int64_t j = 0; j <= t; ++j) o += s[size_t(j)] / sum * v[(j * Hkv + kh) * dh + i];
        ASSERT_NEAR(out[(t * Hq + h) * dh + i], o, 1e-5) << "t " << t << " h " << h;
      }
    }
  // Decode: prefill 5, then token by token; the outputs equal the prefill's rows.
  std::vector<float> kc2(kc.size()), vc2(vc.size()), out2(T * Hq * dh);
  for (int64_t t0 = 0; t0 < T;) {
    const int64_t len = t0 == 0 ? 5 : 1;
    cpu::kv_cache_write({.k = k.data() + t0 * Hkv * dh, .v = v.data() + t0 * Hkv * dh, .T = len, .Hkv = Hkv,
                         .dh = dh, .k_cache = kc2.data(), .v_cache = vc2.data(), .capacity = cap, .pos0 = t0});
    cpu::attention_causal({.q = q.data() + t0 * Hq * dh, .k_cache = kc2.data(), .v_cache = vc2.data(),
                           .capacity = cap, .pos0 = t0, .T = len, .Hq = Hq, .Hkv = Hkv, .dh = dh, .scale = scale,
                           .out = out2.data() + t0 * Hq * dh});
    t0 += len;
  }
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], out2[i]);
  EXPECT_THROW(cpu::kv_cache_write({.k = k.data(), .v = v.data(), .T = 2, .Hkv = Hkv, .dh = dh,
                                    .k_cache = kc2.data(), .v_cache = vc2.data(), .capacity = cap, .pos0 = 15}),
               Error);
}

}  // namespace
}  // namespace tern
