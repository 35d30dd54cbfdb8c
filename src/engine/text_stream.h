// Turns the byte stream of generated tokens into stop-safe, UTF-8-complete text pieces.
//
//   bytes of token 1, 2, ... -> [UTF-8 completion: hold an unfinished multi-byte character]
//                             -> [StopMatcher: hold any tail that could still become a stop string]
//                             -> text safe to show now
// Invalid UTF-8 becomes U+FFFD (as HF's decode with errors="replace"). A stop string never reaches the output, even
// when it spans tokens; the text before it does. Works on raw token bytes, so the generator can run from any
// source of token text (a Tokenizer, or a table in tests).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/stop_matcher.h"

namespace tern {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop_strings = {});

  // Appends the bytes of one token; appends the text that is now safe to `out`. Returns true when a stop string
  // completed: `out` then ends just before it and the stream is finished.
  bool push(std::string_view bytes, std::string& out);

  // End of generation: appends everything still held (a partial stop string, an incomplete UTF-8 tail as U+FFFD).
  void finish(std::string& out);

  const std::string& matched_stop() const { return stops_.matched_stop(); }
  bool stopped() const { return stops_.stopped(); }

 private:
  StopMatcher stops_;
  std::string raw_;  // bytes of an unfinished character
};

}  // namespace tern
