// Teacher-forced comparison of two sets of logits (mean KL, perplexity, top-1) and of two activations (relative
// error): the whole-model checks of runner_test.cpp and whole_model_test.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace tern::cuda::test {

// One position's figures, for the worst positions of a comparison.
struct PositionFidelity {
  int64_t position = 0;
  double kl = 0;
  bool same_top1 = true;
  double ref_margin = 0;  // the reference's logit of its top-1 minus that of its top-2 (a near-tie when small)
};

struct Fidelity {
  double ppl_ref = 0, ppl = 0, kl = 0, top1 = 0, max_abs = 0;
  double median_kl = 0;  // the middle position's KL: a systematic error moves it, one flipped routing does not
  double worst_share = 0;                // the share of the summed KL that the worst 1% of positions carry
  std::vector<PositionFidelity> worst;   // the kWorst positions of largest KL, largest first
  static constexpr size_t kWorst = 5;
};

// Teacher-forced over positions 0..n-2 (predicting token i+1), restricted to ids < vocab_real.
inline Fidelity compare_logits(const std::vector<float>& ref, const std::vector<float>& got, const std::vector<int32_t>& tokens,
                        int64_t V, int64_t real) {
  Fidelity f;
  const int64_t n = int64_t(tokens.size());
  double nll_ref = 0, nll = 0;
  std::vector<double> per_position;
  std::vector<PositionFidelity> positions;
  for (int64_t i = 0; i + 1 < n; ++i) {
    const float* a = ref.data() + i * V;
    const float* b = got.data() + i * V;
    const double ma = *std::max_element(a, a + real), mb = *std::max_element(b, b + real);
    double za = 0, zb = 0;
    for (int64_t j = 0; j < real; ++j) {
      za += std::exp(a[j] - ma);
      zb += std::exp(b[j] - mb);
    }
    const double la = ma + std::log(za), lb = mb + std::log(zb);
    double kl = 0;
    for (int64_t j = 0; j < real; ++j) {
      const double pa = std::exp(a[j] - la);
      kl += pa * ((a[j] - la) - (b[j] - lb));
      f.max_abs = std::max(f.max_abs, double(std::fabs(a[j] - b[j])));
    }
    f.kl += kl;
    per_position.push_back(kl);
    PositionFidelity pf{i, kl, true, 0};
    const int64_t ta = std::max_element(a, a + real) - a, tb = std::max_element(b, b + real) - b;
    pf.same_top1 = ta == tb;
    double second = -1e300;
    for (int64_t j = 0; j < real; ++j)
      if (j != ta) second = std::max(second, double(a[j]));
    pf.ref_margin = a[ta] - second;
    positions.push_back(pf);
    nll_ref += la - a[tokens[size_t(i + 1)]];
    nll += lb - b[tokens[size_t(i + 1)]];
    f.top1 += pf.same_top1;
  }
  const double m = double(n - 1);
  f.ppl_ref = std::exp(nll_ref / m);
  f.ppl = std::exp(nll / m);
  f.top1 /= m;
  if (!per_position.empty()) {
    std::nth_element(per_position.begin(), per_position.begin() + per_position.size() / 2, per_position.end());
    f.median_kl = per_position[per_position.size() / 2];
    std::sort(positions.begin(), positions.end(), [](const auto& x, const auto& y) { return x.kl > y.kl; });
    const size_t one_percent = std::max<size_t>(1, positions.size() / 100);
    double top = 0;
    for (size_t i = 0; i < one_percent; ++i) top += positions[i].kl;
    f.worst_share = f.kl > 0 ? top / f.kl : 0;
    positions.resize(std::min(positions.size(), Fidelity::kWorst));
    f.worst = std::move(positions);
  }
  f.kl /= m;
  return f;
}

// ||a - b|| / ||b|| over everything, and the median over rows of the same ratio per row.
inline std::pair<double, double> relative_error(const std::vector<float>& a, const std::vector<float>& b,
                                                int64_t cols) {
  double num = 0, den = 0;
  std::vector<double> rows;
  for (size_t r = 0; r * size_t(cols) < b.size(); ++r) {
    double rn = 0, rd = 0;
    for (size_t j = r * size_t(cols); j < (r + 1) * size_t(cols); ++j) {
      rn += (double(a[j]) - b[j]) * (double(a[j]) - b[j]);
      rd += double(b[j]) * b[j];
    }
    num += rn;
    den += rd;
    rows.push_back(std::sqrt(rn / std::max(rd, 1e-300)));
  }
  std::nth_element(rows.begin(), rows.begin() + rows.size() / 2, rows.end());
  return {std::sqrt(num / std::max(den, 1e-300)), rows.empty() ? 0.0 : rows[rows.size() / 2]};
}

}  // namespace tern::cuda::test
