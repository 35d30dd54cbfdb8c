// Values of the Jinja2-subset interpreter, with Python's semantics where chat templates can see them: str() and
// repr(), truthiness, ==, <, `in`, and json.dumps (tojson) with Python's separators and ensure_ascii=False.
//
// Strings are UTF-8; length, indexing and slicing count code points as Python does. Lists, dicts and namespaces are
// shared (reference semantics, like Python objects); dicts keep insertion order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tern::jinja {

struct Value;
struct MacroDef;  // a parsed {% macro %} (jinja_ast.h)
class Scope;

using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered; string keys only

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Macro, Builtin };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                      // String; Builtin: function name; Undefined: what was looked up (for errors)
  std::shared_ptr<List> list;         // List
  std::shared_ptr<Dict> dict;         // Dict, Namespace
  const MacroDef* macro = nullptr;    // Macro (owned by the template)
  bool tuple = false;                 // List: a Python tuple (only repr differs: "(1, 2)")

  static Value undefined(std::string what = "") { Value v; v.s = std::move(what); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value new_list(List items = {}) {
    Value v; v.kind = Kind::List; v.list = std::make_shared<List>(std::move(items)); return v;
  }
  static Value new_dict(Dict items = {}) {
    Value v; v.kind = Kind::Dict; v.dict = std::make_shared<Dict>(std::move(items)); return v;
  }
  static Value new_namespace(Dict items = {}) {
    Value v; v.kind = Kind::Namespace; v.dict = std::make_shared<Dict>(std::move(items)); return v;
  }
  static Value new_tuple(List items) { Value v = new_list(std::move(items)); v.tuple = true; return v; }
  static Value builtin(std::string name) { Value v; v.kind = Kind::Builtin; v.s = std::move(name); return v; }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_mapping() const { return kind == Kind::Dict; }
};

// Python's type name of a value, for error messages ("str", "dict", ...).
const char* type_name(const Value& v);

// Dict look-up; nullptr when the key is absent.
const Value* dict_find(const Dict& d, std::string_view key);
void dict_set(Dict& d, const std::string& key, Value v);

bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Python's <; throws tern::Error for unorderable types.
bool less_than(const Value& a, const Value& b);

std::string to_str(const Value& v);   // Python str(): what {{ x }} prints
std::string to_repr(const Value& v);  // Python repr()
std::string float_repr(double x);     // Python repr(float): 1.0, 1e-05, 1e+16, inf

struct JsonOptions {
  int indent = -1;  // < 0: one line
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_separator = ", ";  // Python's defaults (", " and ": ", or "," when indenting)
  std::string key_separator = ": ";
};
std::string to_json(const Value& v, const JsonOptions& options);

Value from_json(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_ordered_json(const Value& v);

// ---- UTF-8 helpers (code points, as Python sees strings) ----
std::vector<uint32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<uint32_t>& cps);
void utf8_append(std::string& out, uint32_t cp);
size_t utf8_length(std::string_view s);
bool is_py_space(uint32_t cp);  // str.isspace()
// str.strip() family; chars empty = whitespace.
std::string py_strip(std::string_view s, std::string_view chars, bool left, bool right, bool chars_given);

}  // namespace tern::jinja
