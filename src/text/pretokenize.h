// The pre-tokenizer's split regex (tokenizer.json "Split" with behavior "Isolated"), run with PCRE2 (UTF, UCP, JIT).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tern {

class SplitRegex {
 public:
  // Compiles the pattern as written in tokenizer.json (Oniguruma syntax as Hugging Face uses it). `\s` and `\S`
  // are spelled out as Oniguruma's Unicode classes (PCRE2 differs on U+0085 and U+180E). Throws tern::Error naming
  // the pattern. Property data is PCRE2's (Unicode 14 in PCRE2 10.42): code points assigned later may split
  // differently from Hugging Face (Oniguruma, Unicode 16).
  explicit SplitRegex(const std::string& pattern);
  ~SplitRegex();
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;

  // Splits valid UTF-8 `text` into consecutive pieces (matches and the gaps between them; none empty). Calls
  // fn(piece) for each, in order. Thread-safe.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t b, e;
      if (!find(text, pos, b, e)) break;
      if (b > pos) fn(text.substr(pos, b - pos));
      fn(text.substr(b, e - b));
      pos = e;
    }
    if (pos < text.size()) fn(text.substr(pos));
  }

  const std::string& pattern() const { return pattern_; }

 private:
  // Next non-empty match at or after `from`: [b, e). False when there is none.
  bool find(std::string_view text, size_t from, size_t& b, size_t& e) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

// The pattern rewritten for PCRE2 (exposed for tests).
std::string split_regex_to_pcre2(const std::string& pattern);

}  // namespace tern
