// JSON Schema -> Expr, shared by compile_json_schema and compile_tool_calls (internal).
//
// The grammar generates a subset of the documents the schema accepts, in a canonical form: properties in the
// schema's order, required ones always, optional ones optional; strings with one fixed escape per character;
// numbers with bounded digit counts; whitespace only as one optional space after ':' and ','.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar_impl.h"

namespace tern::grammar {

using ojson = nlohmann::ordered_json;

constexpr int kMaxSchemaDepth = 64;    // nesting of subschemas (and $ref chains) while compiling
constexpr int kAnyValueDepth = 32;     // nesting of arbitrary JSON values (json_object, `true` schemas)
constexpr size_t kMaxUniqueSets = 4096;  // uniqueItems over listed values: rules (sets of values used) at most

class SchemaCompiler {
 public:
  enum class Mode {
    Json,      // a JSON document
    ToolJson,  // a JSON value inside a tool-call parameter: '<' is written as \u003c so no tag can appear
  };
  // Rules are added to `builder` (several compilers may share one: one per tool of a tool-call grammar).
  SchemaCompiler(const ojson& root, Mode mode, GrammarBuilder& builder);

  // A JSON value valid for `schema` (located at `path`, a JSON pointer).
  ExprPtr value(const ojson& schema, const std::string& path, int depth);
  // Raw text (a tool-call parameter of string type: no quotes, no escapes, never containing a tag that ends the
  // value) that is a string valid for `schema`; nullptr when no string is valid.
  ExprPtr raw_string(const ojson& schema, const std::string& path, int depth);
  ExprPtr any_value(int depth_left);
  ExprPtr leading_whitespace();  // a short optional run of whitespace before the value
  // Checks the keywords of one schema object (unsupported ones throw SchemaError naming them).
  void check_keywords(const ojson& schema, const std::string& path) const;
  const ojson* resolve_ref(const ojson& schema, const std::string& path, std::string* target_path) const;

  GrammarBuilder& builder() { return b_; }

  [[noreturn]] static void fail(const std::string& keyword, const std::string& path, const std::string& message);

 private:
  ExprPtr typed(const std::string& type, const ojson& s, const std::string& path, int depth);
  ExprPtr object(const ojson& s, const std::string& path, int depth);
  ExprPtr array(const ojson& s, const std::string& path, int depth);
  bool unique_items(const ojson& s, const std::string& path) const;  // uniqueItems: true (checked to be a boolean)
  // The values an items schema lists (enum or const, or a type with values that can be listed: boolean, null;
  // through $refs; its type and nullable applied as value() applies them; each value once), or nullopt.
  std::optional<std::vector<ojson>> listed_values(const ojson& items, const std::string& path) const;
  // An array of distinct values out of `values` with min..max items (max < 0: up to every value): one rule per set
  // of values used so far, offering each value not used yet.
  ExprPtr unique_array(const std::vector<ojson>& values, int min, int max);
  ExprPtr string(const ojson& s, const std::string& path);
  ExprPtr integer(const ojson& s, const std::string& path);
  ExprPtr number(const ojson& s, const std::string& path);
  ExprPtr literal_value(const ojson& v) const;
  ExprPtr json_string_of(ExprPtr content) const;
  ExprPtr encode_json_class(const CodepointClass& c) const;
  ExprPtr string_char();  // one character of a free JSON string (a shared rule)
  ExprPtr key_excluding(const std::vector<std::string>& names);
  ExprPtr ws() const;  // one optional space
  ExprPtr raw_class(const CodepointClass& c) const;  // a code point class as raw tool-call text (no '<')

  const ojson& root_;
  Mode mode_;
  GrammarBuilder& b_;
  std::map<std::string, int> ref_rules_;  // $ref target pointer -> rule
  std::vector<int> any_rules_;            // depth_left -> rule of any JSON value
  int string_char_rule_ = -1;
  int free_string_rule_ = -1;
  int raw_free_rule_ = -1;
};

// Raw text that never contains any of `forbidden` (ASCII words) and is valid UTF-8 without control characters
// other than tab, newline and carriage return.
ExprPtr raw_text_excluding(GrammarBuilder& b, const std::vector<std::string>& forbidden);
// The tags that must not appear inside a tool-call parameter value.
const std::vector<std::string>& tool_call_forbidden_words();

// The grammar cached under `key`, or build() (cached when it returns; errors are not cached).
GrammarPtr cached_grammar(const std::string& key, const std::function<GrammarPtr()>& build);

// Wraps the schema compilers' internal errors (GrammarError) into SchemaError.
GrammarPtr build_or_throw(GrammarBuilder& b, int start, const std::string& description);

}  // namespace tern::grammar
