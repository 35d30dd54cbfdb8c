#include "engine/constrained.h"

#include "core/check.h"

namespace tern {

OutputConstraint::OutputConstraint(grammar::GrammarPtr grammar, std::shared_ptr<const grammar::TokenVocabulary> vocab,
                                   std::string start_after)
    : matcher_(std::move(grammar), vocab), start_after_(std::move(start_after)), active_(start_after_.empty()) {
  TERN_CHECK(vocab != nullptr, "output constraint: no token vocabulary");
  mask_words_ = size_t(vocab->mask_words());
}

OutputConstraint::OutputConstraint(grammar::Matcher matcher, std::string start_after, std::string tail, bool active,
                                   size_t words)
    : matcher_(std::move(matcher)), start_after_(std::move(start_after)), tail_(std::move(tail)), active_(active),
      mask_words_(words) {}

OutputConstraint OutputConstraint::fork() const {
  return OutputConstraint(matcher_.clone(), start_after_, tail_, active_, mask_words_);
}

std::span<const uint32_t> OutputConstraint::fill() {
  if (!active_) return {};
  if (mask_.size() != mask_words_) mask_.assign(mask_words_, 0u);
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
