#include "engine/eval_metrics.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace tern {

void log_softmax_masked(std::span<const float> row, int64_t vocab_real, std::span<double> out) {
  TERN_CHECK(vocab_real > 0, "log_softmax_masked: vocab_real must be positive, got ", vocab_real);
  TERN_CHECK(int64_t(row.size()) >= vocab_real, "logits row has ", row.size(), " values, fewer than the ",
             vocab_real, " real vocabulary ids");
  TERN_CHECK(int64_t(out.size()) >= vocab_real, "log_softmax_masked: output holds ", out.size(), " < ", vocab_real);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocab_real; ++i) {
    const float v = row[i];
    TERN_CHECK(!std::isnan(v) && v != std::numeric_limits<float>::infinity(), "logit of id ", i,
               " is not finite (", v, ")");
    if (v > mx) mx = v;
  }
  TERN_CHECK(std::isfinite(mx), "every logit of the row is -inf");
  double sum = 0;
  for (int64_t i = 0; i < vocab_real; ++i) sum += std::exp(double(row[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < vocab_real; ++i) out[i] = double(row[i]) - lse;
}

int64_t argmax_masked(std::span<const float> row, int64_t vocab_real) { return top2_masked(row, vocab_real).best; }

Top2 top2_masked(std::span<const float> row, int64_t vocab_real) {
  TERN_CHECK(vocab_real > 0 && int64_t(row.size()) >= vocab_real, "top-1 of a row of ", row.size(),
             " values for vocab_real ", vocab_real);
  int64_t best = 0;
  float second = -std::numeric_limits<float>::infinity();
  for (int64_t i = 1; i < vocab_real; ++i) {
    if (row[i] > row[best]) {
      second = row[best];
      best = i;
    } else if (row[i] > second) {
      second = row[i];
    }
  }
  const double top = row[best];
  return {best, second == -std::numeric_limits<float>::infinity() ? std::numeric_limits<double>::infinity()
                                                                  : top - double(second)};
}

EvalAccumulator::EvalAccumulator(int64_t vocab_real)
    : vocab_real_(vocab_real), logp_(size_t(vocab_real > 0 ? vocab_real : 0)) {
  TERN_CHECK(vocab_real > 0, "EvalAccumulator: vocab_real must be positive, got ", vocab_real);
}

void EvalAccumulator::add(std::span<const float> row, std::span<const float> reference, int32_t next) {
  const int64_t pos = positions_;
  TERN_CHECK(next >= -1 && next < vocab_real_, "position ", pos, ": next token id ", next,
             " is outside the real vocabulary [0, ", vocab_real_, ")");
  const bool with_ref = !reference.empty();
  TERN_CHECK(pos == 0 || with_ref == (reference_positions_ > 0), "position ", pos,
             ": reference logits given for some positions only");
  try {
    log_softmax_masked(row, vocab_real_, logp_);
  } catch (const Error& e) {
    TERN_FAIL("tern logits at position ", pos, ": ", e.what());
  }
  if (next >= 0) {
    nll_sum_ -= logp_[size_t(next)];
    ++predictions_;
  }
  if (with_ref) {
    if (logq_.empty()) logq_.resize(size_t(vocab_real_));
    try {
      log_softmax_masked(reference, vocab_real_, logq_);
    } catch (const Error& e) {
      TERN_FAIL("reference logits at position ", pos, ": ", e.what());
    }
    // KL(ref || tern) = sum_i q_i (log q_i - log p_i), q = reference.
    double kl = 0;
    for (int64_t i = 0; i < vocab_real_; ++i) {
      const double lq = logq_[size_t(i)];
      if (lq == -std::numeric_limits<double>::infinity()) continue;  // q_i = 0 contributes nothing
      kl += std::exp(lq) * (lq - logp_[size_t(i)]);
    }
    if (kl < 0) kl = 0;  // rounding when the two rows are equal
    kl_sum_ += kl;
    if (kl > kl_max_ || kl_max_position_ < 0) {
      kl_max_ = kl;
      kl_max_position_ = pos;
    }
    if (next >= 0) reference_nll_sum_ -= logq_[size_t(next)];
    const Top2 t = top2_masked(row, vocab_real_), r = top2_masked(reference, vocab_real_);
    if (t.best == r.best) ++agree_;
    records_.push_back({pos, kl, t.best, r.best, t.margin, r.margin,
                        logq_[size_t(r.best)] - logq_[size_t(t.best)]});
    ++reference_positions_;
  }
  ++positions_;
}

EvalSummary EvalAccumulator::summary() const {
  EvalSummary s;
  s.positions = positions_;
  s.predictions = predictions_;
  if (predictions_ > 0) {
    s.nll_mean = nll_sum_ / double(predictions_);
    s.perplexity = std::exp(s.nll_mean);
  }
  if (reference_positions_ > 0) {
    s.has_reference = true;
    s.kl_mean = kl_sum_ / double(reference_positions_);
    s.kl_max = kl_max_;
    s.kl_max_position = kl_max_position_;
    s.top1_agreement = double(agree_) / double(reference_positions_);
    if (predictions_ > 0) {
      s.reference_nll_mean = reference_nll_sum_ / double(predictions_);
      s.reference_perplexity = std::exp(s.reference_nll_mean);
      s.perplexity_rel_diff = (s.perplexity - s.reference_perplexity) / s.reference_perplexity;
    }
  }
  return s;
}

}  // namespace tern
