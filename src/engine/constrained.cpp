#include "engine/constrained.h"

#include "core/check.h"

namespace tern {

OutputConstraint::OutputConstraint(grammar::GrammarPtr grammar, std::shared_ptr<const grammar::TokenVocabulary> vocab,
                                   std::string start_after)
    : matcher_(std::move(grammar), vocab), start_after_(std::move(start_after)), active_(start_after_.empty()) {
  TERN_CHECK(vocab != nullptr, "output constraint: no token vocabulary");
  mask_.assign(size_t(vocab->mask_words()), 0u);
}

std::span<const uint32_t> OutputConstraint::fill() {
  if (!active_) return {};
  matcher_.fill_mask(mask_);
  return mask_;
}

bool OutputConstraint::accept(int32_t id, std::string_view bytes) {
  if (active_) return matcher_.accept(id);
  std::string window = tail_;
  window.append(bytes);
  if (window.find(start_after_) != std::string::npos) {
    active_ = true;  // the next token is the first constrained one
    tail_.clear();
    return true;
  }
  const size_t keep = start_after_.size() - 1;
  tail_ = window.size() > keep ? window.substr(window.size() - keep) : window;
  return true;
}

}  // namespace tern
