#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretokenize.h"

#include <pcre2.h>

#include "core/check.h"

namespace tern {

std::string split_regex_to_pcre2(const std::string& pattern) {
  static constexpr const char* kSpace = "\\t-\\r\\x{85}\\p{Z}";
  // Oniguruma's Unicode \s (what Hugging Face runs) is [\t\n\v\f\r\x{85}\p{Z}]. PCRE2 10.42's \s with UCP leaves
  // out U+0085 and adds U+180E, so both are spelled out.
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[++i];
      if (n == 's') out += in_class ? kSpace : "[" + std::string(kSpace) + "]";
      else if (n == 'S' && !in_class) out += "[^" + std::string(kSpace) + "]";
      else { out += c; out += n; }
      continue;
    }
    if (c == '[' && !in_class) in_class = true;
    else if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct SplitRegex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { if (code) pcre2_code_free(code); }
};

namespace {

// Per-thread scratch: match data (one pair of offsets is all split needs) and a JIT stack.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    if (data) pcre2_match_data_free(data);
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

SplitRegex::SplitRegex(const std::string& pattern) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  std::string p = split_regex_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &off,
                              nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    TERN_FAIL("tokenizer split regex does not compile (at offset ", off, ": ", reinterpret_cast<const char*>(msg),
              "): ", pattern);
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // the interpreter is used when JIT is unavailable
}

SplitRegex::~SplitRegex() = default;
SplitRegex::SplitRegex(SplitRegex&&) noexcept = default;
SplitRegex& SplitRegex::operator=(SplitRegex&&) noexcept = default;

bool SplitRegex::find(std::string_view text, size_t from, size_t& b, size_t& e) const {
  MatchScratch& s = match_scratch();
  TERN_CHECK(s.data && s.context, "out of memory for the tokenizer's regex match data");
  size_t start = from;
  while (start < text.size()) {
    int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                         PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      TERN_FAIL("tokenizer split regex failed on a text of ", text.size(), " bytes: ",
                reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    b = ov[0];
    e = ov[1];
    if (e > b) return true;
    // Empty match: move one character on and look again.
    start = b + 1;
    while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
  }
  return false;
}

}  // namespace tern
