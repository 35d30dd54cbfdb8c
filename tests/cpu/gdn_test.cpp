// Gated DeltaNet: the recurrent step against the HF formula (state [dk, dv], double), and the chunked form
// against the recurrent one, including lengths that end exactly on chunk boundaries and continuation from state.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/ops_elementwise.h"
#include "cpu/ops_gdn.h"
#include "core/check.h"
#include "cpu_test_util.h"

namespace tern {
namespace {

struct GdnInputs {
  cpu::GdnDims d;
  int64_t T = 0, C = 0;
  std::vector<float> qkv, g, beta;
};

GdnInputs make_inputs(test::Rng& rng, const cpu::GdnDims& d, int64_t T) {
  GdnInputs in;
  in.d = d;
  in.T = T;
  in.C = 2LL * d.Hk * d.dk + int64_t(d.Hv) * d.dv;
  in.qkv = rng.normals(size_t(T * in.C));
  cpu::gdn_qk_norm(in.qkv.data(), T, d);
  const auto a = rng.normals(static_cast<size_t>(T * d.Hv)), b = rng.normals(static_cast<size_t>(T * d.Hv));
  std::vector<float> A_log(static_cast<size_t>(d.Hv)), dt(static_cast<size_t>(d.Hv));
  for (int h = 0; h < d.Hv; ++h) {
    A_log[size_t(h)] = std::log(rng.uniform(0.01f, 16.0f));
    dt[size_t(h)] = rng.normal(1.0f);
  }
  in.g.resize(size_t(T * d.Hv));
  in.beta.resize(size_t(T * d.Hv));
  cpu::gdn_gates(a.data(), b.data(), A_log.data(), dt.data(), T, d.Hv, in.g.data(), in.beta.data());
  for (int64_t i = 0; i < T * d.Hv; ++i) {  // the gate formulas themselves
    const int h = int(i % d.Hv);
    const double sp = std::log1p(std::exp(double(a[size_t(i)]) + dt[size_t(h)]));
    EXPECT_NEAR(in.g[size_t(i)], -std::exp(double(A_log[size_t(h)])) * sp, 1e-5 * (1 + 16 * sp));
    EXPECT_NEAR(in.beta[size_t(i)], 1.0 / (1.0 + std::exp(-double(b[size_t(i)]))), 1e-6);
  }
  return in;
}

cpu::GdnArgs args_for(const GdnInputs& in, int64_t t0, int64_t T, float* state, float* out) {
  const auto& d = in.d;
  const float* base = in.qkv.data() + t0 * in.C;
  return {.q = base, .k = base + int64_t(d.Hk) * d.dk, .v = base + 2LL * d.Hk * d.dk, .ld = in.C,
          .g = in.g.data() + t0 * d.Hv, .beta = in.beta.data() + t0 * d.Hv, .T = T, .dims = d, .state = state,
          .out = out + t0 * d.Hv * d.dv};
}

// HF torch_recurrent_gated_delta_rule in double, state S[Hv][dk][dv].
std::vector<double> reference_out(const GdnInputs& in) {
  const auto& d = in.d;
  std::vector<double> S(static_cast<size_t>(d.Hv * d.dk * d.dv), 0.0), out(static_cast<size_t>(in.T * d.Hv * d.dv));
  for (int64_t t = 0; t < in.T; ++t)
    for (int h = 0; h < d.Hv; ++h) {
      const int kh = h / (d.Hv / d.Hk);
      const float* q = in.qkv.data() + t * in.C + kh * d.dk;
      const float* k = q + int64_t(d.Hk) * d.dk;
      const float* v = in.qkv.data() + t * in.C + 2LL * d.Hk * d.dk + h * d.dv;
      double* s = S.data() + size_t(h) * d.dk * d.dv;
      const double alpha = std::exp(double(in.g[size_t(t * d.Hv + h)])), beta = in.beta[size_t(t * d.Hv + h)];
      for (int i = 0; i < d.dk * d.dv; ++i) s[i] *= alpha;
      for (int j = 0; j < d.dv; ++j) {
        double mem = 0;
        for (int i = 0; i < d.dk; ++i) mem += s[i * d.dv + j] * k[i];
        const double delta = (v[j] - mem) * beta;
        for (int i = 0; i < d.dk; ++i) s[i * d.dv + j] += k[i] * delta;
      }
      for (int j = 0; j < d.dv; ++j) {
        double o = 0;
        for (int i = 0; i < d.dk; ++i) o += s[i * d.dv + j] * q[i];
        out[size_t((t * d.Hv + h) * d.dv + j)] = o;
      }
    }
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

const cpu::GdnDims kDims{.Hk = 2, .Hv = 4, .dk = 16, .dv = 24};

TEST(CpuGdn, RecurrentMatchesFormula) {
  test::Rng rng(test::fresh_seed("gdn recurrent"));
  const GdnInputs in = make_inputs(rng, kDims, 40);
  std::vector<float> state(static_cast<size_t>(kDims.Hv * kDims.dv * kDims.dk), 0.0f);
  std::vector<float> out(static_cast<size_t>(in.T * kDims.Hv * kDims.dv));
  cpu::gdn_recurrent(args_for(in, 0, in.T, state.data(), out.data()));
  const auto ref = reference_out(in);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << i;
}

// Chunked vs recurrent for lengths around chunk boundaries; max|Δ| / max|ref| <= 5e-5 (fp32 rounding of two
// summation orders: observed up to ~1.2e-5 over thousands of seeds).
TEST(CpuGdn, ChunkedMatchesRecurrent) {
  test::Rng rng(test::fresh_seed("gdn chunked"));
  for (int chunk : {64, 16}) {
    for (int64_t T : {1, 7, 15, 16, 17, 63, 64, 65, 128, 150}) {
      const GdnInputs in = make_inputs(rng, kDims, T);
      const size_t ns = size_t(kDims.Hv * kDims.dv * kDims.dk), no = size_t(T * kDims.Hv * kDims.dv);
      std::vector<float> s1(ns, 0.0f), s2(ns, 0.0f), o1(no), o2(no);
      cpu::gdn_recurrent(args_for(in, 0, T, s1.data(), o1.data()));
      cpu::gdn_chunked(args_for(in, 0, T, s2.data(), o2.data()), chunk);
      const double so = max_abs(o1), ss = max_abs(s1);
      for (size_t i = 0; i < no; ++i) ASSERT_LE(std::fabs(o1[i] - o2[i]), 5e-5 * so) << "T " << T << " i " << i;
      for (size_t i = 0; i < ns; ++i) ASSERT_LE(std::fabs(s1[i] - s2[i]), 5e-5 * ss) << "T " << T << " state " << i;
    }
  }
}

// Chunked prefill of 70 tokens, then 30 recurrent steps, equals 100 recurrent steps.
TEST(CpuGdn, DecodeContinuesFromChunkedPrefill) {
  test::Rng rng(test::fresh_seed("gdn continuation"));
  const GdnInputs in = make_inputs(rng, kDims, 100);
  const size_t ns = size_t(kDims.Hv * kDims.dv * kDims.dk), no = size_t(in.T * kDims.Hv * kDims.dv);
  std::vector<float> s1(ns, 0.0f), s2(ns, 0.0f), o1(no), o2(no);
  cpu::gdn_recurrent(args_for(in, 0, in.T, s1.data(), o1.data()));
  cpu::gdn_chunked(args_for(in, 0, 70, s2.data(), o2.data()), 64);
  for (int64_t t = 70; t < in.T; ++t) cpu::gdn_recurrent(args_for(in, t, 1, s2.data(), o2.data()));
  const double so = max_abs(o1);
  for (size_t i = 0; i < no; ++i) ASSERT_LE(std::fabs(o1[i] - o2[i]), 5e-5 * so) << i;
}

TEST(CpuGdn, QkNorm) {
  test::Rng rng(test::fresh_seed("gdn qk norm"));
  const int64_t C = 2LL * kDims.Hk * kDims.dk + int64_t(kDims.Hv) * kDims.dv;
  auto x = rng.normals(static_cast<size_t>(2 * C));
  const auto x0 = x;
  cpu::gdn_qk_norm(x.data(), 2, kDims);
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2 * kDims.Hk; ++h) {
      const float* a = x0.data() + t * C + h * kDims.dk;
      const float* b = x.data() + t * C + h * kDims.dk;
      double ss = 0;
      for (int i = 0; i < kDims.dk; ++i) ss += double(a[i]) * a[i];
      const double scale = (h < kDims.Hk ? 1.0 / std::sqrt(double(kDims.dk)) : 1.0) / std::sqrt(ss + 1e-6);
      for (int i = 0; i < kDims.dk; ++i) ASSERT_NEAR(b[i], a[i] * scale, 1e-6);
    }
  for (int t = 0; t < 2; ++t)  // v untouched
    for (int64_t i = 2LL * kDims.Hk * kDims.dk; i < C; ++i) ASSERT_EQ(x[size_t(t * C + i)], x0[size_t(t * C + i)]);
}

}  // namespace
}  // namespace tern
