// MoE: routing (softmax, top-k, renormalise) and the whole block against a per-token formula in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu/ops_moe.h"
#include "core/check.h"
#include "cpu_test_util.h"

namespace tern {
namespace {

TEST(CpuMoe, RouteSoftmaxTopkRenormalise) {
  test::Rng rng(test::fresh_seed("route"));
  const int64_t T = 6;
  const int E = 16, k = 4;
  const auto logits = rng.normals(static_cast<size_t>(T * E), 2.0f);
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> w(static_cast<size_t>(T * k)), wraw(static_cast<size_t>(T * k));
  cpu::moe_route({.logits = logits.data(), .T = T, .E = E, .k = k, .renormalize = true, .ids = ids.data(),
                  .weights = w.data()});
  cpu::moe_route({.logits = logits.data(), .T = T, .E = E, .k = k, .renormalize = false, .ids = ids.data(),
                  .weights = wraw.data()});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(double(logits[size_t(t * E + e)])));
    for (auto& x : p) x /= sum;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    double top = 0;
    for (int s = 0; s < k; ++s) top += p[size_t(order[size_t(s)])];
    for (int s = 0; s < k; ++s) {
      ASSERT_EQ(ids[size_t(t * k + s)], order[size_t(s)]);
      EXPECT_NEAR(w[size_t(t * k + s)], p[size_t(order[size_t(s)])] / top, 1e-6);
      EXPECT_NEAR(wraw[size_t(t * k + s)], p[size_t(order[size_t(s)])], 1e-6);
    }
  }
}

TEST(CpuMoe, BlockMatchesFormula) {
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::affine4}) {
    test::TinyModelSpec spec;
    spec.layers = 1;
    spec.format = f;
    spec.D = 128;
    spec.F = 64;
    spec.Fs = 64;
    const uint64_t seed = test::fresh_seed("moe block");
    auto model = test::make_tiny_model(spec, seed);
    const LayerWeights& l = model->layers[0];
    test::Rng rng(seed + 1);
    const int64_t T = 5, D = spec.D;
    const auto x = rng.normals(static_cast<size_t>(T * D));
    std::vector<float> y(static_cast<size_t>(T * D));
    std::vector<int32_t> ids(static_cast<size_t>(T * spec.k));
    std::vector<float> wts(static_cast<size_t>(T * spec.k));
    cpu::moe_forward({.layer = &l, .config = &model->config, .x = x.data(), .T = T, .y = y.data(), .ids = ids.data(),
                      .weights = wts.data()});
    // Reference per token with dequantised rows, in double.
    auto row = [&](const Matrix& m, int64_t r) {
      std::vector<float> v(static_cast<size_t>(m.cols));
      matrix_row_to_f32(m, r, v.data());
      return v;
    };
    auto apply = [&](const Matrix& m, const std::vector<double>& in) {
      std::vector<double> out(static_cast<size_t>(m.rows));
      for (int64_t r = 0; r < m.rows; ++r) {
        const auto w = row(m, r);
        double s = 0;
        for (int64_t c = 0; c < m.cols; ++c) s += double(w[size_t(c)]) * in[size_t(c)];
        out[size_t(r)] = s;
      }
      return out;
    };
    auto swiglu = [&](const Matrix& g, const Matrix& u, const Matrix& d, const std::vector<double>& in) {
      auto a = apply(g, in), b = apply(u, in);
      for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
      return apply(d, a);
    };
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> xt(x.begin() + t * D, x.begin() + (t + 1) * D);
      auto ref = swiglu(l.shared_gate, l.shared_up, l.shared_down, xt);
      const double sg = 1.0 / (1.0 + std::exp(-apply(l.shared_expert_gate, xt)[0]));
      for (auto& v : ref) v *= sg;
      for (int s = 0; s < spec.k; ++s) {
        const int e = ids[size_t(t * spec.k + s)];
        const auto ye = swiglu(l.expert_gate.expert(e), l.expert_up.expert(e), l.expert_down.expert(e), xt);
        for (int64_t i = 0; i < D; ++i) ref[size_t(i)] += wts[size_t(t * spec.k + s)] * ye[size_t(i)];
      }
      double mx = 0;
      for (double v : ref) mx = std::max(mx, std::fabs(v));
      for (int64_t i = 0; i < D; ++i)
        ASSERT_NEAR(y[size_t(t * D + i)], ref[size_t(i)], 1e-5 * mx) << weight_format_name(f) << " t " << t;
    }
    // One token at a time gives the same rows, bit for bit.
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> y1(static_cast<size_t>(D));
      cpu::moe_forward({.layer = &l, .config = &model->config, .x = x.data() + t * D, .T = 1, .y = y1.data()});
      for (int64_t i = 0; i < D; ++i) ASSERT_EQ(y1[size_t(i)], y[size_t(t * D + i)]);
    }
  }
}

}  // namespace
}  // namespace tern
