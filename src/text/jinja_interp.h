// Internals shared by the interpreter (jinja_interp.cpp) and the built-in filters, tests and methods
// (jinja_builtins.cpp). Not part of the public API: use jinja.h.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace tern::jinja {

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

[[noreturn]] void runtime_fail(int line, const std::string& message);

// Attribute / item access with Jinja's rules: a missing key or attribute is Undefined; reading from Undefined fails.
Value get_attr(const Value& obj, const std::string& name, int line);
Value get_item(const Value& obj, const Value& key, int line);
// The items of a `for` loop (list elements, dict keys, string characters; Undefined is empty).
List iterate(const Value& v, int line);
// Python's `len`.
int64_t length_of(const Value& v, int line);

bool filter_known(const std::string& name);
bool test_known(const std::string& name);
Value apply_filter(const std::string& name, const Value& v, const Args& args, const Kwargs& kwargs, int line);
bool apply_test(const std::string& name, const Value& v, const Args& args, int line);
Value call_method(const Value& obj, const std::string& name, const Args& args, const Kwargs& kwargs, int line);
Value call_global(const std::string& name, const Args& args, const Kwargs& kwargs, int line);
// Case mapping of UTF-8 text (str.lower, str.upper, str.capitalize).
std::string lower_str(const std::string& s);
std::string upper_str(const std::string& s);
std::string capitalize_str(const std::string& s);

// The names call_global answers (namespace, range, dict, raise_exception, strftime_now).
const std::vector<std::string>& global_names();

}  // namespace tern::jinja
