#include "cpu/ops_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_matmul.h"

namespace tern::cpu {

void moe_route(const RouteArgs& a) {
  TERN_CHECK(a.E > 0 && a.k > 0 && a.k <= a.E, "moe_route: top-", a.k, " of ", a.E, " experts");
  std::vector<float> p(static_cast<size_t>(a.E));
  std::vector<int32_t> order(static_cast<size_t>(a.E));
  for (int64_t t = 0; t < a.T; ++t) {
    const float* l = a.logits + t * a.E;
    const float mx = *std::max_element(l, l + a.E);
    double sum = 0.0;
    for (int e = 0; e < a.E; ++e) {
      p[size_t(e)] = std::exp(l[e] - mx);
      sum += p[size_t(e)];
    }
    const float inv = float(1.0 / sum);
    for (int e = 0; e < a.E; ++e) p[size_t(e)] *= inv;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + a.k, order.end(), [&](int32_t x, int32_t y) {
      return p[size_t(x)] > p[size_t(y)] || (p[size_t(x)] == p[size_t(y)] && x < y);
    });
    float top = 0.0f;
    for (int s = 0; s < a.k; ++s) top += p[size_t(order[size_t(s)])];
    for (int s = 0; s < a.k; ++s) {
      const int32_t e = order[size_t(s)];
      a.ids[t * a.k + s] = e;
      a.weights[t * a.k + s] = a.renormalize ? p[size_t(e)] / top : p[size_t(e)];
    }
  }
}

void expert_swiglu(const Matrix& gate, const Matrix& up, const Matrix& down, const float* x, int64_t n, float* y,
                   float* scratch) {
  const int64_t F = gate.rows;
  TERN_CHECK(up.rows == F && down.cols == F && gate.cols == up.cols && down.rows == gate.cols,
             "expert_swiglu: shapes gate [", gate.rows, ", ", gate.cols, "], up [", up.rows, ", ", up.cols,
             "], down [", down.rows, ", ", down.cols, "] do not fit together");
  float* g = scratch;          // [n, F]
  float* u = scratch + n * F;  // [n, F]
  matmul(gate, x, n, g);
  matmul(up, x, n, u);
  swiglu(g, u, n * F, g);
  matmul(down, g, n, y);
}

void moe_forward(const MoeArgs& a) {
  TERN_CHECK(a.layer && a.config && a.x && a.y, "moe_forward: null argument");
  const LayerWeights& lw = *a.layer;
  const Config& cfg = *a.config;
  const int64_t T = a.T, D = cfg.hidden_size;
  const int E = cfg.num_experts, k = cfg.num_experts_per_tok;
  TERN_CHECK(lw.router.rows == E && lw.router.cols == D, "moe_forward: router is [", lw.router.rows, ", ",
             lw.router.cols, "], expected [", E, ", ", D, "]");
  TERN_CHECK(lw.expert_gate.experts == E && lw.expert_up.experts == E && lw.expert_down.experts == E,
             "moe_forward: expert matrices do not have ", E, " experts");
  if (T == 0) return;

  // Router.
  std::vector<float> logits(static_cast<size_t>(T * E));
  matmul(lw.router, a.x, T, logits.data());
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  moe_route({.logits = logits.data(), .T = T, .E = E, .k = k, .renormalize = cfg.norm_topk_prob, .ids = ids.data(),
             .weights = wts.data()});
  if (a.ids) std::copy(ids.begin(), ids.end(), a.ids);
  if (a.weights) std::copy(wts.begin(), wts.end(), a.weights);

  // Shared expert, scaled by sigmoid(x · w_sg); it starts the sum.
  const int64_t Fs = lw.shared_gate.rows, F = lw.expert_gate.rows;
  std::vector<float> scratch(static_cast<size_t>(2 * T * std::max(F, Fs)));
  expert_swiglu(lw.shared_gate, lw.shared_up, lw.shared_down, a.x, T, a.y, scratch.data());
  std::vector<float> sg(static_cast<size_t>(T));
  matmul(lw.shared_expert_gate, a.x, T, sg.data());
  for (int64_t t = 0; t < T; ++t) {
    const float s = sigmoid(sg[size_t(t)]);
    for (int64_t i = 0; i < D; ++i) a.y[t * D + i] *= s;
  }

  // Routed experts in ascending id: gather the tokens of each expert, run it once over them, scatter-add.
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < k; ++s) by_expert[size_t(ids[size_t(t * k + s)])].emplace_back(t, wts[size_t(t * k + s)]);
  std::vector<float> xg, yg;
  for (int e = 0; e < E; ++e) {
    const auto& list = by_expert[size_t(e)];
    if (list.empty()) continue;
    const int64_t n = int64_t(list.size());
    xg.resize(size_t(n * D));
    yg.resize(size_t(n * D));
    for (int64_t i = 0; i < n; ++i) std::copy(a.x + list[size_t(i)].first * D, a.x + (list[size_t(i)].first + 1) * D,
                                              xg.begin() + i * D);
    if (scratch.size() < size_t(2 * n * F)) scratch.resize(size_t(2 * n * F));
    expert_swiglu(lw.expert_gate.expert(e), lw.expert_up.expert(e), lw.expert_down.expert(e), xg.data(), n,
                  yg.data(), scratch.data());
    for (int64_t i = 0; i < n; ++i) {
      const auto [t, w] = list[size_t(i)];
      for (int64_t j = 0; j < D; ++j) a.y[t * D + j] += w * yg[size_t(i * D + j)];
    }
  }
}

}  // namespace tern::cpu
