// Streaming detokenizer: turns ids into text as soon as the bytes form complete UTF-8, never a partial character.
// The concatenation of every push() and the final flush() equals Tokenizer::decode(all ids, skip_special).
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace tern {

class StreamingDetokenizer {
 public:
  // `tok` must outlive this object.
  explicit StreamingDetokenizer(const Tokenizer& tok, bool skip_special = false);
  // Returns the text completed by this token (may be empty). Throws tern::Error on an id not in the vocabulary.
  std::string push(int32_t id);
  // Whatever remains: an unfinished character becomes U+FFFD. The detokenizer is empty afterwards.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an unfinished character (at most 3)
};

}  // namespace tern
