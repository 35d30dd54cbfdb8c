#include "server/serving/request_fields.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tern::server {

std::string_view without_latest_tag(std::string_view name) {
  constexpr std::string_view tag = ":latest";
  return name.size() > tag.size() && name.ends_with(tag) ? name.substr(0, name.size() - tag.size()) : name;
}

bool model_name_known(const ParseOptions& options, const std::string& name) {
  if (name.empty() || options.model_id.empty()) return true;
  const std::string_view untagged = without_latest_tag(name);
  auto is = [&](const std::string& served) { return name == served || untagged == served; };
  return is(options.model_id) || std::any_of(options.model_aliases.begin(), options.model_aliases.end(), is);
}

bool model_name_served(const ParseOptions& options, const std::string& name) {
  return !options.strict_model_name || model_name_known(options, name);
}

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth && (max_depth = depth) > limit) return limit + 1;
    } else if (c == ']' || c == '}') --depth;
  }
  return max_depth;
}

}  // namespace tern::server

namespace tern::server::request_fields {

void bad(const std::string& param, const std::string& message) { throw BadRequest{api_error_invalid(param, message)}; }

std::string json_kind(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

const Json* field(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

void bad_number_range(const char* key, double lo, double hi, bool lo_open, const Json& v) {
  bad(key, std::string("'") + key + "' must be a number in " + (lo_open ? "(" : "[") + number_text(lo) + ", " +
               number_text(hi) + "], got " + v.dump() + ".");
}

void bad_integer_range(const char* key, int64_t lo, int64_t hi, const Json& v) {
  bad(key, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
               "], got " + v.dump() + ".");
}

std::optional<double> get_number(const Json& o, const char* key, double lo, double hi, bool lo_open) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, std::string("'") + key + "' must be a number, got " + json_kind(*v) + ".");
  const double x = v->get<double>();
  const bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (!std::isfinite(x) || below || !(x <= hi)) bad_number_range(key, lo, hi, lo_open, *v);
  return x;
}

std::optional<int64_t> get_integer(const Json& o, const char* key, int64_t lo, int64_t hi) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(hi) || (lo > 0 && u < uint64_t(lo))) bad_integer_range(key, lo, hi, *v);
    return int64_t(u);
  }
  if (v->is_number_integer()) {
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) bad_integer_range(key, lo, hi, *v);
    return x;
  }
  bad(key, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
               "], got " + json_kind(*v) + (v->is_number() ? " " + v->dump() : "") + ".");
}

const Json* tools_field(const Json& j, const std::string& not_array_message) {
  const Json* tools = field(j, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) bad("tools", not_array_message);
  if (tools->size() > 1024) bad("tools", "'tools' may hold at most 1024 tools.");
  return tools;
}

ToolChoice tool_choice_word(const std::string& word, const std::string& object_form) {
  if (word == "auto") return ToolChoice::tool_choice_auto;
  if (word == "none") return ToolChoice::tool_choice_none;
  if (word == "required") return ToolChoice::tool_choice_required;
  bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or " + object_form + ", got \"" + word + "\".");
}

Json function_tools(const Json& j) {
  const Json* tools = tools_field(j, "'tools' must be an array of {\"type\": \"function\", \"function\": {...}} objects.");
  if (!tools) return Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const Json& t = (*tools)[i];
    if (!t.is_object()) bad(p, "'" + p + "' must be an object.");
    if (const Json* type = field(t, "type"); type && !(type->is_string() && type->get<std::string>() == "function"))
      bad(p + ".type", "'" + p + ".type' must be \"function\".");
    const Json* fn = field(t, "function");
    if (!fn || !fn->is_object()) bad(p + ".function", "'" + p + ".function' must be an object with a 'name'.");
    const Json* name = field(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      bad(p + ".function.name", "'" + p + ".function.name' must be a non-empty string.");
    if (const Json* params = field(*fn, "parameters"); params && !params->is_object())
      bad(p + ".function.parameters", "'" + p + ".function.parameters' must be a JSON schema object.");
  }
  return *tools;
}

void keep_chosen_tools(ChatRequest& r, const std::string& unknown_name_param, const std::string& unknown_name_message) {
  if ((r.tool_choice == ToolChoice::tool_choice_required || r.tool_choice == ToolChoice::tool_choice_named) &&
      r.tools.empty())
    bad("tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty.");
  if (r.tool_choice == ToolChoice::tool_choice_none) {
    r.tools = Json::array();
  } else if (r.tool_choice == ToolChoice::tool_choice_named) {
    Json kept = Json::array();
    for (const Json& t : r.tools)
      if (t["function"]["name"] == r.tool_choice_name) kept.push_back(t);
    if (kept.empty()) bad(unknown_name_param, unknown_name_message);
    r.tools = std::move(kept);
  }
}

Json parse_body(std::string_view body, const ParseOptions& options) {
  if (json_nesting_depth(body, options.max_json_depth) > options.max_json_depth)
    bad("", "The request body nests JSON deeper than " + std::to_string(options.max_json_depth) + " levels.");
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad("", "The request body is not valid JSON (or holds invalid UTF-8); send one JSON object.");
  if (!j.is_object()) bad("", "The request body must be a JSON object, got " + json_kind(j) + ".");
  return j;
}

}  // namespace tern::server::request_fields
