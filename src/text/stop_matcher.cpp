#include "text/stop_matcher.h"

#include <algorithm>

namespace tern {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  Result r;
  if (stopped_) {
    r.stopped = true;
    return r;
  }
  held_.append(text);
  // The earliest complete stop string wins (the longest one when several start at the same place).
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stops_) {
    size_t p = held_.find(s);
    if (p != std::string::npos && (p < best || (p == best && s.size() > which->size()))) {
      best = p;
      which = &s;
    }
  }
  if (which) {
    r.text = held_.substr(0, best);
    r.stopped = stopped_ = true;
    matched_ = *which;
    held_.clear();
    return r;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    size_t most = std::min(s.size() - 1, held_.size());
    for (size_t k = most; k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  r.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace tern
