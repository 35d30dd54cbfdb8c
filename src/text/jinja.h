// A Jinja2-subset interpreter for chat templates, matching what transformers' apply_chat_template renders
// (jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols, and transformers' globals).
//
// Covered: text with whitespace control ({%- -%} {{- -}} {#- -#}, {%+), comments; statements if/elif/else,
// for (with tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem), set (names, tuples, namespace attributes, block set), macro (defaults, keyword arguments), break,
// continue, generation; expressions with Python semantics (literals, lists, dicts, attribute/item access, slices,
// calls, arithmetic, ~, comparisons, in, and/or/not, conditional expressions); the filters and tests in
// jinja_builtins.cpp; string/dict methods (startswith, split, strip, items, get, ...); globals namespace, range,
// dict, raise_exception, strftime_now.
//
// Anything else is a tern::Error that names the construct and its line, raised when the template is parsed.
#pragma once

#include <memory>
#include <string>

#include "core/check.h"
#include "text/jinja_value.h"

namespace tern::jinja {

struct Program;

// Raised by the template's own raise_exception(message): what() is the template's message.
class TemplateException : public Error {
 public:
  using Error::Error;
};

class Template {
 public:
  // Parses the source; throws tern::Error (with the line) on a syntax error or an unsupported construct.
  static Template parse(const std::string& source);

  // Renders with `context` as the template's variables (a Dict value). Throws tern::Error on a runtime error,
  // TemplateException when the template calls raise_exception.
  std::string render(const Value& context) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace tern::jinja
