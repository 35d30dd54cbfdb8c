#include "text/detokenizer.h"

#include "text/unicode.h"

namespace tern {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool skip_special)
    : tok_(&tok), skip_special_(skip_special) {}

std::string StreamingDetokenizer::push(int32_t id) {
  std::string bytes = tok_->token_bytes(id);  // throws on an unknown id
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += bytes;
  size_t n = utf8_complete_prefix(pending_);
  if (n == 0) return {};
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace tern
