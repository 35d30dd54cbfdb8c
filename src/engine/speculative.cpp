#include "engine/speculative.h"

#include <algorithm>

#include "core/check.h"

namespace tern {

const char* speculative_mode_name(SpeculativeMode m) {
  switch (m) {
    case SpeculativeMode::off: return "off";
    case SpeculativeMode::ngram: return "ngram";
    case SpeculativeMode::mtp: return "mtp";
    case SpeculativeMode::auto_: return "auto";
  }
  return "?";
}

std::optional<SpeculativeMode> parse_speculative_mode(std::string_view s) {
  for (SpeculativeMode m : {SpeculativeMode::off, SpeculativeMode::ngram, SpeculativeMode::mtp, SpeculativeMode::auto_})
    if (s == speculative_mode_name(m)) return m;
  return std::nullopt;
}

SpeculativeMode speculative_effective_mode(SpeculativeMode mode, const ModelRunner& runner) {
  if (mode == SpeculativeMode::off || !runner.supports_verify()) return SpeculativeMode::off;
  if (mode == SpeculativeMode::auto_) return runner.supports_mtp() ? SpeculativeMode::mtp : SpeculativeMode::ngram;
  if (mode == SpeculativeMode::mtp && !runner.supports_mtp()) return SpeculativeMode::off;
  return mode;
}

std::string speculative_unavailable(SpeculativeMode mode, const ModelRunner& runner) {
  if (mode == SpeculativeMode::off || mode == SpeculativeMode::auto_) return "";
  const std::string flag = std::string("--speculative ") + speculative_mode_name(mode);
  if (!runner.supports_verify())
    return "the " + runner.backend_name() + " backend cannot verify drafts yet: " + flag + " is off";
  if (mode == SpeculativeMode::mtp && !runner.supports_mtp())
    return "the model has no MTP draft head (--draft-weights FILE gives one; tern extract-mtp writes it): " + flag +
           " runs without drafts";
  return "";
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

SequenceDrafter::SequenceDrafter(const SpeculativeOptions& options, SpeculativeMode mode,
                                 std::span<const int32_t> prompt, std::vector<int32_t> prediction,
                                 std::unique_ptr<MtpDrafter> mtp)
    : policy_(options.max_drafts), mtp_(std::move(mtp)) {
  TERN_INTERNAL_CHECK(mode == SpeculativeMode::ngram || mode == SpeculativeMode::mtp,
                      "a sequence drafter for mode ", speculative_mode_name(mode));
  TERN_INTERNAL_CHECK((mode == SpeculativeMode::mtp) == (mtp_ != nullptr), "mode ", speculative_mode_name(mode),
                      mtp_ ? " with" : " without", " an MTP drafter");
  // The n-gram index also under mtp: the drafts of a sequence whose head cannot be fed.
  ngram_.emplace(options.ngram_min_match);
  ngram_->append(prompt);
  if (!prediction.empty()) prediction_.emplace(std::move(prediction));
}

void SequenceDrafter::append(int32_t token) {
  if (ngram_) ngram_->append(token);
  if (prediction_) prediction_->append(token);
  if (mtp_) mtp_->append(token);
}

void SequenceDrafter::after_prompt_chunk() {
  if (mtp_) mtp_->catch_up();
}

void SequenceDrafter::finish() {
  if (mtp_) mtp_->catch_up();
}

// The MTP head is fed at every step, whoever drafts: the runner keeps only the last forward's hidden states.
std::vector<int32_t> SequenceDrafter::draft(int64_t limit) {
  const int64_t k = std::min<int64_t>(limit, policy_.next());
  if (k <= 0) {
    policy_.skip_step();
    if (mtp_) mtp_->catch_up();
    return {};
  }
  if (prediction_) {
    std::vector<int32_t> d = prediction_->draft(k);
    if (!d.empty()) {
      if (mtp_) mtp_->catch_up();
      return d;
    }
  }
  if (mtp_ && mtp_->usable()) {
    std::vector<int32_t> d = mtp_->draft(k);
    if (mtp_->usable()) return d;  // else the head found a gap: the n-gram drafts from now on
  }
  return ngram_->draft(k);
}

}  // namespace tern
