#include "engine/speculative.h"

#include <algorithm>

#include "core/check.h"

namespace tern {

const char* speculative_mode_name(SpeculativeMode m) {
  switch (m) {
    case SpeculativeMode::off: return "off";
    case SpeculativeMode::ngram: return "ngram";
    case SpeculativeMode::auto_: return "auto";
  }
  return "?";
}

std::optional<SpeculativeMode> parse_speculative_mode(std::string_view s) {
  for (SpeculativeMode m : {SpeculativeMode::off, SpeculativeMode::ngram, SpeculativeMode::auto_})
    if (s == speculative_mode_name(m)) return m;
  return std::nullopt;
}

DraftPolicy::DraftPolicy(int max_drafts) : max_(std::max(0, max_drafts)), k_(std::min(4, max_)) {}

int DraftPolicy::next() const { return pause_ > 0 ? 0 : k_; }

void DraftPolicy::skip_step() {
  if (pause_ > 0) --pause_;
}

void DraftPolicy::record(int drafted, int accepted) {
  if (drafted <= 0) return;
  const double r = double(accepted) / double(drafted);
  rate_ = 0.8 * rate_ + 0.2 * r;
  if (accepted == drafted) {
    k_ = std::min(max_, k_ + 2);
  } else {
    k_ = std::clamp(accepted + 1, 1, max_);
  }
  if (rate_ < 0.25) {  // rarely pays: stop drafting for a while, longer each time, then try again from a fresh rate
    pause_ = std::min(256, 16 << std::min(pauses_, 4));
    ++pauses_;
    rate_ = 0.5;
    k_ = std::min(2, max_);
  } else if (rate_ > 0.5) {
    pauses_ = 0;
  }
}

SequenceDrafter::SequenceDrafter(const SpeculativeOptions& options, std::span<const int32_t> prompt,
                                 std::vector<int32_t> prediction)
    : policy_(options.max_drafts) {
  TERN_INTERNAL_CHECK(options.mode != SpeculativeMode::off, "a drafter for a sequence without speculation");
  ngram_.emplace(options.ngram_min_match);
  ngram_->append(prompt);
  if (!prediction.empty()) prediction_.emplace(std::move(prediction));
}

void SequenceDrafter::append(int32_t token) {
  if (ngram_) ngram_->append(token);
  if (prediction_) prediction_->append(token);
}

std::vector<int32_t> SequenceDrafter::draft(int64_t limit) {
  const int64_t k = std::min<int64_t>(limit, policy_.next());
  if (k <= 0) {
    policy_.skip_step();
    return {};
  }
  if (prediction_) {
    std::vector<int32_t> d = prediction_->draft(k);
    if (!d.empty()) return d;
  }
  return ngram_ ? ngram_->draft(k) : std::vector<int32_t>{};
}

}  // namespace tern
