// The regular-expression subset of JSON Schema `pattern` (ECMA-262 syntax), matched against a whole string:
// anchors ^ $ (at the ends only), literals and escapes, classes [a-z] [^...] \d \w \s \D \W \S ., groups (...)
// (?:...), alternation |, quantifiers * + ? {n} {n,} {n,m} (a lazy ? suffix is accepted: same language).
// Lookaround, backreferences and word boundaries are rejected with RegexError.
#pragma once

#include <functional>
#include <stdexcept>
#include <string_view>

#include "grammar/grammar_impl.h"

namespace tern::grammar {

class RegexError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The pattern as an Expr; encode_class turns one code point class into the bytes that stand for it (raw UTF-8, or
// JSON-escaped for a string inside a JSON document).
ExprPtr compile_regex(std::string_view pattern, const std::function<ExprPtr(const CodepointClass&)>& encode_class);

}  // namespace tern::grammar
