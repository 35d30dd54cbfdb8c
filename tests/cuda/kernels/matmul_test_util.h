// Helpers shared by the prefill-product tests (matmul_test.cpp, matmul_int8_test.cpp): the fp32 CPU product, a
// token-by-token relative error check, model-like activations and SwiGLU.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "cpu/ops_matmul.h"

namespace tern::cuda::test {

inline std::vector<float> cpu_product(const Matrix& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> y(size_t(n * w.rows));
  if (n > 0) cpu::matmul(w, x.data(), n, y.data());
  return y;
}

// got vs want (both [tokens][row_len]) token by token: the rms and the worst error of each token's row, relative to
// the rms of that token's row of `prod` (the product alone: want less any accumulated base), or to mag[n] where given
// and larger (a matrix of few rows: one output can be small by cancellation). Defaults: an exact kernel against the
// fp32 CPU product.
inline void expect_product(const std::vector<float>& got, const std::vector<float>& want,
                           const std::vector<float>& prod, int64_t row_len, const std::string& what,
                           double rms_tol = 1e-5, double worst_tol = 6e-5, const std::vector<double>& mag = {}) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(prod.size(), want.size()) << what;
  double worst_rms = 0, worst_el = 0;
  int64_t at_rms = 0, at_el = 0;
  for (int64_t n = 0; n * row_len < int64_t(want.size()); ++n) {
    double pp = 0, se = 0, mx = 0;
    for (int64_t r = 0; r < row_len; ++r) {
      const size_t i = size_t(n * row_len + r);
      const double e = std::fabs(double(got[i]) - double(want[i]));
      pp += double(prod[i]) * prod[i];
      se += e * e;
      mx = std::isnan(e) ? 1e30 : std::max(mx, e);
    }
    const double scale = std::max(std::sqrt(pp / double(row_len)), mag.empty() ? 0.0 : mag[size_t(n)]) + 1e-30;
    const double rel_rms = std::sqrt(se / double(row_len)) / scale, rel_el = mx / scale;
    if (!(rel_rms <= worst_rms)) {
      worst_rms = std::isnan(rel_rms) ? 1e30 : rel_rms;
      at_rms = n;
    }
    if (!(rel_el <= worst_el)) {
      worst_el = rel_el;
      at_el = n;
    }
  }
  EXPECT_LE(worst_rms, rms_tol) << what << ": rms error / rms of the product, worst at token " << at_rms;
  EXPECT_LE(worst_el, worst_tol) << what << ": worst error / rms of the product, at token " << at_el;
}
inline void expect_product(const std::vector<float>& got, const std::vector<float>& want, int64_t row_len,
                           const std::string& what, double rms_tol = 1e-5, double worst_tol = 6e-5) {
  expect_product(got, want, want, row_len, what, rms_tol, worst_tol);
}

// y [T, ldy] (accumulated onto base) -> its first `rows` columns as [T, rows] (got_prod) and want = ref + base there;
// fails when a column past `rows` changed.
inline void unstride_accumulated(const std::vector<float>& got, const std::vector<float>& base,
                                 const std::vector<float>& ref, int64_t T, int64_t rows, int64_t ldy,
                                 std::vector<float>& got_prod, std::vector<float>& want) {
  got_prod.assign(ref.size(), 0.0f);
  want.assign(ref.size(), 0.0f);
  for (int64_t n = 0; n < T; ++n) {
    for (int64_t r = 0; r < ldy; ++r) {
      const size_t i = size_t(n * ldy + r);
      if (r >= rows) {
        ASSERT_EQ(got[i], base[i]) << "the product wrote outside its rows (token " << n << ", column " << r << ")";
        continue;
      }
      const size_t j = size_t(n * rows + r);
      got_prod[j] = got[i];
      want[j] = ref[j] + base[i];
    }
  }
}

// h = silu(g) · u, as cpu::swiglu computes it.
inline std::vector<float> swiglu_of(const std::vector<float>& g, const std::vector<float>& u) {
  std::vector<float> h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  return h;
}

// Activations: uniform in [-2, 2); `ranged`: each token scaled by a random power of two in [2^-8, 2^8] and every
// 37th column 30x larger (outlier channels), as real activations are.
inline std::vector<float> activations(std::mt19937_64& rng, int64_t T, int64_t cols, bool ranged) {
  auto x = random_floats(rng, size_t(T * cols), -2.0f, 2.0f);
  if (ranged) {
    for (int64_t n = 0; n < T; ++n) {
      const float f = std::ldexp(1.0f, int(rng() % 17) - 8);
      for (int64_t c = 0; c < cols; ++c) x[size_t(n * cols + c)] *= f * (c % 37 == 0 ? 30.0f : 1.0f);
    }
  }
  return x;
}

// The dense product's arguments: y [T, w.rows] = x [T, w.cols] · Wᵀ, both rows packed.
inline MatmulArgs dense_args(const DMat& w, const float* x, float* y, int64_t T) {
  MatmulArgs a;
  a.w = w;
  a.x = x;
  a.ldx = w.cols;
  a.y = y;
  a.ldy = w.rows;
  a.tokens = T;
  return a;
}

// Top-k routing of T tokens over E experts, k distinct per token: random, or skewed (expert 0 on every token, expert
// 1 on token 0 only).
inline std::vector<int> routing_ids(std::mt19937_64& rng, int64_t T, int E, int k, bool skewed) {
  std::vector<int> ids(size_t(T * k));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> perm(static_cast<size_t>(E));
    std::iota(perm.begin(), perm.end(), 0);
    if (skewed) {
      std::shuffle(perm.begin() + 2, perm.end(), rng);
      if (t != 0) std::swap(perm[1], perm[size_t(k)]);
    } else {
      std::shuffle(perm.begin(), perm.end(), rng);
    }
    std::copy_n(perm.begin(), k, ids.begin() + t * k);
  }
  return ids;
}

// The fp32 references of the grouped expert products, by sorted position (pos_of, from moe_group): gate [T·k, F] of
// x [T, D] (the pair's token), swiglu = silu(gate) ⊙ up, and down [T·k, D] of xd [T·k, F] (rows by sorted position).
struct GroupedReferences {
  std::vector<float> gate, swiglu, down;
};
inline GroupedReferences grouped_references(const Matrix& gate, const Matrix& up, const Matrix& down,
                                            const std::vector<int>& ids, const std::vector<int>& pos_of,
                                            const std::vector<float>& x, const std::vector<float>& xd, int64_t T, int E,
                                            int k, int64_t D, int64_t F) {
  GroupedReferences r;
  r.gate.resize(size_t(T * k * F));
  r.swiglu.resize(size_t(T * k * F));
  r.down.resize(size_t(T * k * D));
  for (int e = 0; e < E; ++e) {
    std::vector<int> pairs;
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == e) pairs.push_back(int(i));
    if (pairs.empty()) continue;
    const int64_t n = int64_t(pairs.size());
    std::vector<float> xg(size_t(n * D)), xdg(size_t(n * F));
    for (int64_t p = 0; p < n; ++p) {
      const int i = pairs[size_t(p)], pos = pos_of[size_t(i)];
      std::copy_n(x.begin() + (i / k) * D, D, xg.begin() + p * D);
      std::copy_n(xd.begin() + int64_t(pos) * F, F, xdg.begin() + p * F);
    }
    const auto rg = cpu_product(gate.expert(e), xg, n), rd = cpu_product(down.expert(e), xdg, n);
    const auto rs = swiglu_of(rg, cpu_product(up.expert(e), xg, n));
    for (int64_t p = 0; p < n; ++p) {
      const int pos = pos_of[size_t(pairs[size_t(p)])];
      std::copy_n(rg.begin() + p * F, F, r.gate.begin() + int64_t(pos) * F);
      std::copy_n(rs.begin() + p * F, F, r.swiglu.begin() + int64_t(pos) * F);
      std::copy_n(rd.begin() + p * D, D, r.down.begin() + int64_t(pos) * D);
    }
  }
  return r;
}

}  // namespace tern::cuda::test
