#include "engine/draft_ngram.h"

#include <algorithm>

namespace tern {

std::vector<int32_t> NgramDrafter::draft(int64_t k) const {
  const TokenSuffixAutomaton::Match m = index_.last_match();
  std::vector<int32_t> out;
  if (k <= 0 || m.length < min_match_) return out;
  const std::vector<int32_t>& s = index_.tokens();
  const int64_t n = index_.size();
  out.reserve(size_t(k));
  // s' = s + out: position e + 1 + i is always before n + i (e < n - 1), so every draft is defined.
  for (int64_t i = 0; i < k; ++i) {
    const int64_t at = m.end + 1 + i;
    out.push_back(at < n ? s[size_t(at)] : out[size_t(at - n)]);
  }
  return out;
}

PredictionDrafter::PredictionDrafter(std::vector<int32_t> prediction, int64_t resync_match)
    : resync_match_(std::max<int64_t>(1, resync_match)) {
  index_.append(prediction);
}

void PredictionDrafter::append(int32_t token) {
  walk_ = index_.step(walk_, token);
  const std::vector<int32_t>& p = index_.tokens();
  if (cursor_ >= 0 && cursor_ < int64_t(p.size()) && p[size_t(cursor_)] == token) {
    ++cursor_;
    return;
  }
  cursor_ = walk_.length >= resync_match_ ? index_.first_end(walk_) + 1 : -1;
}

std::vector<int32_t> PredictionDrafter::draft(int64_t k) const {
  const std::vector<int32_t>& p = index_.tokens();
  if (cursor_ < 0 || cursor_ >= int64_t(p.size()) || k <= 0) return {};
  const int64_t n = std::min<int64_t>(k, int64_t(p.size()) - cursor_);
  return std::vector<int32_t>(p.begin() + cursor_, p.begin() + cursor_ + n);
}

}  // namespace tern
