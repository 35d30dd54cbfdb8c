// Teacher-forced fidelity metrics over rows of logits: log-softmax, perplexity, KL divergence and top-1 agreement
// (tern eval). A row is float32 [V] over the padded vocabulary; ids >= vocab_real are padding and are left out of
// every sum, in the engine's rows and in the reference's alike (the reference may be wider or narrower than V, as
// long as it covers vocab_real). All sums run in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tern {

// out[i] = row[i] - logsumexp(row[0:vocab_real]) for i < vocab_real. out.size() >= vocab_real.
// Throws tern::Error when a value in row[0:vocab_real] is NaN or +inf (-inf is allowed: probability 0).
void log_softmax_masked(std::span<const float> row, int64_t vocab_real, std::span<double> out);

// Index of the largest of row[0:vocab_real]; the lowest index wins ties.
int64_t argmax_masked(std::span<const float> row, int64_t vocab_real);

// The largest of row[0:vocab_real] (the lowest index wins ties, as argmax_masked) and its margin over the next
// largest: row[best] - row[second], which equals the difference of their log-probabilities. A tie gives 0; one id,
// or a runner-up at -inf, gives +inf.
struct Top2 {
  int64_t best = 0;
  double margin = 0;
};
Top2 top2_masked(std::span<const float> row, int64_t vocab_real);

// One position compared with the reference (what tern eval --report lists). Margins and gaps are in nats.
struct EvalPosition {
  int64_t position = 0;
  double kl = 0;                 // KL(p_ref || p_tern)
  int64_t tern_top1 = 0;         // argmax of tern's row
  int64_t reference_top1 = 0;    // argmax of the reference's row
  double tern_margin = 0;        // tern's top-1 minus top-2 log-prob
  double reference_margin = 0;   // the reference's top-1 minus top-2 log-prob
  double reference_gap = 0;      // the reference's log-prob of its top-1 minus of tern's top-1 (0 when they agree;
                                 // equals reference_margin when tern chose the reference's runner-up)
};

struct EvalSummary {
  int64_t positions = 0;            // rows seen
  int64_t predictions = 0;          // rows with a known next token (the perplexity terms)
  double nll_mean = 0;              // mean -log p_tern(next), nats
  double perplexity = 0;            // exp(nll_mean)
  bool has_reference = false;       // the fields below are set only with reference rows
  double reference_nll_mean = 0;    // mean -log p_ref(next)
  double reference_perplexity = 0;  // exp(reference_nll_mean)
  double perplexity_rel_diff = 0;   // (perplexity - reference_perplexity) / reference_perplexity
  double kl_mean = 0;               // mean over positions of KL(p_ref || p_tern), nats
  double kl_max = 0;                // largest per-position KL
  int64_t kl_max_position = -1;
  double top1_agreement = 0;        // fraction of positions where argmax tern == argmax reference
};

// Accumulates the metrics one position at a time, so that logits never need to be held all at once.
class EvalAccumulator {
 public:
  explicit EvalAccumulator(int64_t vocab_real);

  // One position. row: tern's logits [>= vocab_real]; reference: the reference's logits for the same position
  // (empty: none; then every call must pass none); next: the token that follows, or -1 when unknown (the last
  // position). Throws tern::Error on a short row, a bad next id, or a non-finite logit.
  void add(std::span<const float> row, std::span<const float> reference, int32_t next);

  EvalSummary summary() const;

  // One record per position added with reference logits, in order (empty without a reference).
  const std::vector<EvalPosition>& positions() const { return records_; }

 private:
  int64_t vocab_real_;
  std::vector<double> logp_, logq_;  // [vocab_real] scratch: tern, reference
  int64_t positions_ = 0, predictions_ = 0, reference_positions_ = 0, agree_ = 0;
  double nll_sum_ = 0, reference_nll_sum_ = 0, kl_sum_ = 0, kl_max_ = 0;
  int64_t kl_max_position_ = -1;
  std::vector<EvalPosition> records_;
};

}  // namespace tern
