// compile_json_schema / compile_json_object: JSON Schema (the subset of OpenAI's strict mode and common clients)
// into a grammar of JSON text.
#include <algorithm>
#include <cctype>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "grammar/number_range.h"
#include "grammar/regex.h"
#include "grammar/schema_compiler.h"
#include "text/json_ref.h"

namespace tern::grammar {

namespace {

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title",      "description", "default",  "examples", "example",
                                          "$schema",    "$id",         "$comment", "deprecated", "readOnly",
                                          "writeOnly",  "strict",      "$defs",    "definitions"};
  return k;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> k = {
      "type",     "properties", "required",  "additionalProperties", "items",     "prefixItems",
      "enum",     "const",      "anyOf",     "oneOf",                "allOf",     "$ref",
      "nullable", "minItems",   "maxItems",  "uniqueItems",          "minLength", "maxLength",
      "pattern",  "format",     "minimum",   "maximum",              "exclusiveMinimum", "exclusiveMaximum"};
  return k;
}

const std::set<std::string>& type_names() {
  static const std::set<std::string> k = {"object", "array", "string", "number", "integer", "boolean", "null"};
  return k;
}

std::string child(const std::string& path, const std::string& key) { return path + "/" + json_pointer_escape(key); }

// Regexes of the supported string formats (RFC 3339 date/time, RFC 4122 uuid, a practical email).
const char* format_regex(const std::string& format) {
  static const std::string date =
      "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
      "02-(?:0[1-9]|1[0-9]|2[0-9]))";
  static const std::string time =
      "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::string date_time = date + "T" + time;
  static const std::string uuid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
  static const std::string email =
      "[A-Za-z0-9_%+-]{1,64}(?:\\.[A-Za-z0-9_%+-]{1,64}){0,8}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?"
      "(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?){0,4}\\.[A-Za-z]{2,12}";
  if (format == "date") return date.c_str();
  if (format == "time") return time.c_str();
  if (format == "date-time") return date_time.c_str();
  if (format == "uuid") return uuid.c_str();
  if (format == "email") return email.c_str();
  return nullptr;
}

bool is_integral(const ojson& v) {
  if (v.is_number_integer()) return true;
  if (v.is_number_float()) {
    double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }
  return false;
}

bool value_has_type(const ojson& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return is_integral(v);
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

}  // namespace

// ---- SchemaCompiler ---------------------------------------------------------------------------------------------

SchemaCompiler::SchemaCompiler(const ojson& root, Mode mode, GrammarBuilder& builder)
    : root_(root), mode_(mode), b_(builder) {
  any_rules_.assign(kAnyValueDepth + 1, -1);
}

void SchemaCompiler::fail(const std::string& keyword, const std::string& path, const std::string& message) {
  throw SchemaError(keyword, message + " (at " + (path.empty() ? std::string("/") : path) + ")");
}

void SchemaCompiler::check_keywords(const ojson& s, const std::string& path) const {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (annotation_keywords().count(k) || supported_keywords().count(k)) continue;
    fail(k, child(path, k), "unsupported JSON Schema keyword \"" + k + "\"");
  }
  for (const char* defs : {"$defs", "definitions"})
    if (s.contains(defs) && !s[defs].is_object()) fail(defs, child(path, defs), std::string("\"") + defs + "\" must be an object");
}

const ojson* SchemaCompiler::resolve_ref(const ojson& s, const std::string& path, std::string* target_path) const {
  const ojson& r = s["$ref"];
  std::string at = child(path, "$ref");
  if (!r.is_string()) fail("$ref", at, "\"$ref\" must be a string");
  const std::string ref = r.get<std::string>();
  if (ref.empty() || ref[0] != '#') fail("$ref", at, "only local references (\"#/...\") are supported, got \"" + ref + "\"");
  if (ref.size() > 1 && ref[1] != '/') fail("$ref", at, "unsupported reference \"" + ref + "\" (anchors are not supported)");
  const ojson* target = resolve_local_ref(root_, ref, target_path);
  if (!target) fail("$ref", at, "dangling reference \"" + ref + "\"");
  return target;
}

ExprPtr SchemaCompiler::ws() const { return expr_optional(expr_literal(" ")); }

ExprPtr SchemaCompiler::leading_whitespace() {
  ByteSet ws;
  for (char c : {' ', '\t', '\n', '\r'}) ws.set(static_cast<uint8_t>(c));
  return expr_repeat(expr_bytes(ws), 0, 4);
}

ExprPtr SchemaCompiler::json_string_of(ExprPtr content) const {
  return expr_seq({expr_literal("\""), std::move(content), expr_literal("\"")});
}

// One code point class as JSON string content: raw UTF-8 where JSON allows it, otherwise one fixed escape.
ExprPtr SchemaCompiler::encode_json_class(const CodepointClass& c0) const {
  CodepointClass c = cp_normalize(c0);
  CodepointClass special = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  if (mode_ == Mode::ToolJson) special.push_back({'<', '<'});
  special = cp_normalize(special);
  std::vector<ExprPtr> alts;
  CodepointClass raw = cp_subtract(c, special);
  if (!raw.empty()) alts.push_back(expr_utf8_class(raw));
  std::vector<ExprPtr> tails;
  ByteSet short_escapes;
  static const char* kHex = "0123456789abcdef";
  for (auto r : cp_intersect(c, special))
    for (uint32_t cp = r.lo; cp <= r.hi; ++cp) {
      char letter = cp == '"' ? '"' : cp == '\\' ? '\\' : cp == '\b' ? 'b' : cp == '\f' ? 'f' : cp == '\n' ? 'n'
                  : cp == '\r' ? 'r' : cp == '\t' ? 't' : 0;
      if (letter) {
        short_escapes.set(static_cast<uint8_t>(letter));
      } else {
        std::string u = "u00";
        u += kHex[(cp >> 4) & 0xF];
        u += kHex[cp & 0xF];
        tails.push_back(expr_literal(u));
      }
    }
  if (short_escapes.any()) tails.insert(tails.begin(), expr_bytes(short_escapes));
  if (!tails.empty()) alts.push_back(expr_seq({expr_literal("\\"), expr_alt(std::move(tails))}));
  return expr_alt(std::move(alts));
}

ExprPtr SchemaCompiler::string_char() {
  if (string_char_rule_ < 0) string_char_rule_ = b_.add_rule(encode_json_class(cp_all()));
  return expr_ref(string_char_rule_);
}

ExprPtr SchemaCompiler::literal_value(const ojson& v) const {
  std::string text = v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  if (mode_ == Mode::ToolJson) {  // '<' only occurs inside strings in JSON text
    std::string out;
    for (char c : text) {
      if (c == '<')
        out += "\\u003c";
      else
        out += c;
    }
    text = out;
  }
  return expr_literal(text);
}

ExprPtr SchemaCompiler::any_value(int depth_left) {
  depth_left = std::clamp(depth_left, 0, kAnyValueDepth);
  if (any_rules_[static_cast<size_t>(depth_left)] >= 0) return expr_ref(any_rules_[static_cast<size_t>(depth_left)]);
  int r = b_.new_rule();
  any_rules_[static_cast<size_t>(depth_left)] = r;
  if (free_string_rule_ < 0) free_string_rule_ = b_.add_rule(json_string_of(expr_repeat(string_char(), 0, -1)));
  ExprPtr str = expr_ref(free_string_rule_);
  std::vector<ExprPtr> alts = {str, integer(ojson::object(), ""), number(ojson::object(), ""), expr_literal("true"),
                               expr_literal("false"), expr_literal("null")};
  if (depth_left > 0) {
    ExprPtr inner = any_value(depth_left - 1);
    ExprPtr sep = expr_seq({expr_literal(","), ws()});
    ExprPtr pair = expr_seq({str, expr_literal(":"), ws(), inner});
    alts.push_back(expr_seq({expr_literal("{"), expr_optional(expr_seq({pair, expr_repeat(expr_seq({sep, pair}), 0, -1)})),
                             expr_literal("}")}));
    alts.push_back(expr_seq({expr_literal("["), expr_optional(expr_seq({inner, expr_repeat(expr_seq({sep, inner}), 0, -1)})),
                             expr_literal("]")}));
  }
  b_.define(r, expr_alt(std::move(alts)));
  return expr_ref(r);
}

ExprPtr SchemaCompiler::value(const ojson& s, const std::string& path, int depth) {
  if (depth > kMaxSchemaDepth)
    fail("$ref", path, "the schema nests deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
  if (s.is_boolean()) return s.get<bool>() ? any_value(kAnyValueDepth) : expr_nothing();
  if (!s.is_object()) fail("type", path, "a schema must be an object or a boolean");
  check_keywords(s, path);

  auto only_annotations_besides = [&](const char* keyword) {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != keyword && it.key() != "nullable" && !annotation_keywords().count(it.key()))
        fail(it.key(), child(path, it.key()),
             std::string("\"") + it.key() + "\" next to \"" + keyword + "\" is not supported");
  };
  ExprPtr result;
  if (s.contains("$ref")) {
    only_annotations_besides("$ref");
    std::string target_path;
    const ojson* target = resolve_ref(s, path, &target_path);
    auto it = ref_rules_.find(target_path);
    if (it != ref_rules_.end()) {
      result = expr_ref(it->second);
    } else {
      int r = b_.new_rule();
      ref_rules_[target_path] = r;
      b_.define(r, value(*target, target_path, depth + 1));
      result = expr_ref(r);
    }
  } else if (s.contains("anyOf") || s.contains("oneOf")) {
    const char* k = s.contains("anyOf") ? "anyOf" : "oneOf";
    only_annotations_besides(k);
    const ojson& list = s[k];
    if (!list.is_array() || list.empty()) fail(k, child(path, k), std::string("\"") + k + "\" must be a non-empty array");
    std::vector<ExprPtr> alts;
    for (size_t i = 0; i < list.size(); ++i)
      alts.push_back(value(list[i], child(child(path, k), std::to_string(i)), depth + 1));
    result = expr_alt(std::move(alts));
  } else if (s.contains("allOf")) {
    only_annotations_besides("allOf");
    const ojson& list = s["allOf"];
    if (!list.is_array() || list.empty()) fail("allOf", child(path, "allOf"), "\"allOf\" must be a non-empty array");
    if (list.size() > 1) fail("allOf", child(path, "allOf"), "\"allOf\" with more than one schema is not supported");
    result = value(list[0], child(child(path, "allOf"), "0"), depth + 1);
  } else {
    // The types this schema allows: "type" (a name or a list), else what its keywords imply, else any.
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      std::string at = child(path, "type");
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) fail("type", at, "\"type\" must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail("type", at, "\"type\" must be a string or a non-empty array of strings");
      }
      for (const auto& x : types)
        if (!type_names().count(x)) fail("type", at, "unknown type \"" + x + "\"");
    }
    bool has_enum = s.contains("enum"), has_const = s.contains("const");
    if (has_const || has_enum) {
      std::vector<ojson> values;
      if (has_const) {
        values.push_back(s["const"]);
      } else {
        const ojson& e = s["enum"];
        if (!e.is_array() || e.empty()) fail("enum", child(path, "enum"), "\"enum\" must be a non-empty array");
        for (const auto& v : e) values.push_back(v);
      }
      std::vector<ExprPtr> alts;
      for (const auto& v : values) {
        bool ok = types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(v, t); });
        if (ok) alts.push_back(literal_value(v));
      }
      if (alts.empty())
        fail(has_const ? "const" : "enum", child(path, has_const ? "const" : "enum"), "no value matches \"type\"");
      result = expr_alt(std::move(alts));
    } else {
      if (types.empty()) {
        auto has_any = [&](std::initializer_list<const char*> ks) {
          for (const char* k : ks)
            if (s.contains(k)) return true;
          return false;
        };
        if (has_any({"properties", "required", "additionalProperties"})) types.push_back("object");
        if (has_any({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})) types.push_back("array");
        if (has_any({"pattern", "format", "minLength", "maxLength"})) types.push_back("string");
        if (has_any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
      }
      if (types.empty()) {
        result = any_value(kAnyValueDepth);
      } else {
        std::vector<ExprPtr> alts;
        for (const auto& t : types) alts.push_back(typed(t, s, path, depth));
        result = expr_alt(std::move(alts));
      }
    }
  }
  if (s.contains("nullable")) {
    if (!s["nullable"].is_boolean()) fail("nullable", child(path, "nullable"), "\"nullable\" must be a boolean");
    if (s["nullable"].get<bool>()) result = expr_alt({result, expr_literal("null")});
  }
  return result;
}

ExprPtr SchemaCompiler::typed(const std::string& t, const ojson& s, const std::string& path, int depth) {
  if (t == "object") return object(s, path, depth);
  if (t == "array") return array(s, path, depth);
  if (t == "string") return string(s, path);
  if (t == "integer") return integer(s, path);
  if (t == "number") return number(s, path);
  if (t == "boolean") return expr_alt({expr_literal("true"), expr_literal("false")});
  return expr_literal("null");
}

namespace {
// How many sets of at most `max` (< 0: any number) out of n values there are, or more than kMaxUniqueSets.
size_t unique_sets(size_t n, int max) {
  if (n > 63) return kMaxUniqueSets + 1;
  const size_t top = max < 0 ? n : std::min(n, size_t(max));
  size_t sum = 0, choose = 1;  // choose: C(n, k)
  for (size_t k = 0; k <= top && sum <= kMaxUniqueSets; ++k) {
    sum += choose;
    choose = choose * (n - k) / (k + 1);
  }
  return sum;
}

// A non-negative integer keyword, or `fallback` when absent.
int count_keyword(const ojson& s, const char* k, const std::string& path, int fallback) {
  if (!s.contains(k)) return fallback;
  const ojson& v = s[k];
  if (!is_integral(v) || v.get<double>() < 0)
    SchemaCompiler::fail(k, child(path, k), std::string("\"") + k + "\" must be a non-negative integer");
  double d = v.get<double>();
  if (d > kMaxRepeat)
    SchemaCompiler::fail(k, child(path, k), std::string("\"") + k + "\" above " + std::to_string(kMaxRepeat) + " is not supported");
  return static_cast<int>(d);
}
}  // namespace

ExprPtr SchemaCompiler::object(const ojson& s, const std::string& path, int depth) {
  struct Prop {
    std::string name;
    const ojson* schema;
    std::string path;
    bool required;
  };
  std::vector<Prop> props;
  ojson any = true;
  if (s.contains("properties")) {
    const ojson& p = s["properties"];
    if (!p.is_object()) fail("properties", child(path, "properties"), "\"properties\" must be an object");
    for (auto it = p.begin(); it != p.end(); ++it)
      props.push_back({it.key(), &it.value(), child(child(path, "properties"), it.key()), false});
  }
  // additionalProperties: false -> none; true or a schema -> allowed; absent -> allowed only when there are no
  // declared properties (the grammar may generate a subset of the valid documents).
  const ojson* extra = nullptr;
  std::string extra_path = child(path, "additionalProperties");
  if (s.contains("additionalProperties")) {
    const ojson& a = s["additionalProperties"];
    if (!a.is_boolean() && !a.is_object()) fail("additionalProperties", extra_path, "\"additionalProperties\" must be a boolean or a schema");
    if (!(a.is_boolean() && !a.get<bool>())) extra = &a;
  } else if (props.empty()) {
    extra = &any;
  }
  if (s.contains("required")) {
    const ojson& r = s["required"];
    std::string at = child(path, "required");
    if (!r.is_array()) fail("required", at, "\"required\" must be an array of strings");
    std::set<std::string> seen;
    for (const auto& x : r) {
      if (!x.is_string()) fail("required", at, "\"required\" must be an array of strings");
      std::string name = x.get<std::string>();
      if (!seen.insert(name).second) continue;
      auto it = std::find_if(props.begin(), props.end(), [&](const Prop& p) { return p.name == name; });
      if (it != props.end()) {
        it->required = true;
      } else if (extra) {
        props.push_back({name, extra, extra_path, true});
      } else if (!s.contains("additionalProperties")) {  // undeclared but required: any value
        props.push_back({name, &any, child(at, name), true});
      } else {
        fail("required", at, "required property \"" + name + "\" is not allowed by \"properties\"/\"additionalProperties\"");
      }
    }
  }
  ExprPtr sep = expr_seq({expr_literal(","), ws()});
  // Additional members after the declared ones: keys other than the declared names.
  std::vector<ExprPtr> tails(2);  // [emitted_before]
  if (extra) {
    std::vector<std::string> names;
    for (const auto& p : props) names.push_back(p.name);
    ExprPtr key = key_excluding(names);
    ExprPtr v = value(*extra, extra_path, depth + 1);
    int pair = b_.add_rule(expr_seq({key, expr_literal(":"), ws(), v}));
    ExprPtr more = expr_repeat(expr_seq({sep, expr_ref(pair)}), 0, -1);
    tails[1] = more;
    tails[0] = expr_optional(expr_seq({expr_ref(pair), more}));
  } else {
    tails[0] = tails[1] = expr_empty();
  }
  // rest(i, emitted): members from property i on; emitted: something came before (a comma is due).
  int n = static_cast<int>(props.size());
  std::vector<std::vector<ExprPtr>> rest(static_cast<size_t>(n) + 1, std::vector<ExprPtr>(2));
  rest[static_cast<size_t>(n)][0] = tails[0];
  rest[static_cast<size_t>(n)][1] = tails[1];
  for (int i = n - 1; i >= 0; --i) {
    const Prop& p = props[static_cast<size_t>(i)];
    ExprPtr kv = expr_ref(b_.add_rule(
        expr_seq({literal_value(ojson(p.name)), expr_literal(":"), ws(), value(*p.schema, p.path, depth + 1)})));
    for (int e = 0; e < 2; ++e) {
      ExprPtr with = expr_seq({e ? sep : expr_empty(), kv, rest[static_cast<size_t>(i) + 1][1]});
      ExprPtr body = p.required ? with : expr_alt({with, rest[static_cast<size_t>(i) + 1][static_cast<size_t>(e)]});
      rest[static_cast<size_t>(i)][static_cast<size_t>(e)] = expr_ref(b_.add_rule(body));
    }
  }
  return expr_seq({expr_literal("{"), rest[0][0], expr_literal("}")});
}

// A JSON string (with quotes) whose value is none of `names`: a trie over their code points, leaving it at the
// first code point that differs.
ExprPtr SchemaCompiler::key_excluding(const std::vector<std::string>& names) {
  if (free_string_rule_ < 0) free_string_rule_ = b_.add_rule(json_string_of(expr_repeat(string_char(), 0, -1)));
  if (names.empty()) return expr_ref(free_string_rule_);
  struct Node {
    std::map<uint32_t, int> children;
    bool terminal = false;
  };
  std::vector<Node> nodes(1);
  for (const auto& name : names) {
    int cur = 0;
    for (size_t i = 0; i < name.size();) {  // decode UTF-8 (invalid bytes as themselves: they cannot be matched)
      uint8_t c = static_cast<uint8_t>(name[i]);
      int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
      for (int k = 1; k < len && i + static_cast<size_t>(k) < name.size(); ++k)
        cp = (cp << 6) | (static_cast<uint8_t>(name[i + static_cast<size_t>(k)]) & 0x3Fu);
      i += static_cast<size_t>(len);
      auto it = nodes[static_cast<size_t>(cur)].children.find(cp);
      if (it == nodes[static_cast<size_t>(cur)].children.end()) {
        nodes.emplace_back();
        int id = static_cast<int>(nodes.size() - 1);
        nodes[static_cast<size_t>(cur)].children[cp] = id;
        cur = id;
      } else {
        cur = it->second;
      }
    }
    nodes[static_cast<size_t>(cur)].terminal = true;
  }
  ExprPtr free_rest = expr_seq({expr_repeat(string_char(), 0, -1), expr_literal("\"")});
  std::vector<int> rules(nodes.size());
  for (auto& r : rules) r = b_.new_rule();
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<ExprPtr> alts;
    if (!nodes[i].terminal) alts.push_back(expr_literal("\""));
    CodepointClass used;
    for (const auto& [cp, next] : nodes[i].children) {
      used.push_back({cp, cp});
      alts.push_back(expr_seq({encode_json_class({{cp, cp}}), expr_ref(rules[static_cast<size_t>(next)])}));
    }
    CodepointClass other = cp_complement(used);
    if (!other.empty()) alts.push_back(expr_seq({encode_json_class(other), free_rest}));
    b_.define(rules[i], expr_alt(std::move(alts)));
  }
  return expr_seq({expr_literal("\""), expr_ref(rules[0])});
}

ExprPtr SchemaCompiler::array(const ojson& s, const std::string& path, int depth) {
  int min = count_keyword(s, "minItems", path, 0);
  int max = count_keyword(s, "maxItems", path, -1);
  if (max >= 0 && max < min) fail("maxItems", child(path, "maxItems"), "\"maxItems\" is smaller than \"minItems\"");
  std::vector<ExprPtr> prefix;
  if (s.contains("prefixItems")) {
    const ojson& p = s["prefixItems"];
    if (!p.is_array()) fail("prefixItems", child(path, "prefixItems"), "\"prefixItems\" must be an array of schemas");
    for (size_t i = 0; i < p.size(); ++i)
      prefix.push_back(expr_ref(b_.add_rule(value(p[i], child(child(path, "prefixItems"), std::to_string(i)), depth + 1))));
  }
  ExprPtr item;  // null: no items beyond the prefix
  if (s.contains("items")) {
    const ojson& it = s["items"];
    if (!it.is_object() && !it.is_boolean()) fail("items", child(path, "items"), "\"items\" must be a schema");
    if (!(it.is_boolean() && !it.get<bool>())) item = expr_ref(b_.add_rule(value(it, child(path, "items"), depth + 1)));
  } else {
    item = any_value(kAnyValueDepth / 4);
  }
  int k = static_cast<int>(prefix.size());
  if (!item) max = max < 0 ? k : std::min(max, k);
  if (max >= 0 && max < min) return expr_nothing();
  // uniqueItems is enforced where the items are listed values (enum / const, e.g. pydantic's set[SomeEnum], or
  // booleans) and the sets of values an array may hold are few; otherwise accepted, not enforced (docs/server.md).
  if (unique_items(s, path) && k == 0 && s.contains("items")) {
    const auto values = listed_values(s["items"], child(path, "items"));
    if (values && unique_sets(values->size(), max) <= kMaxUniqueSets) return unique_array(*values, min, max);
  }
  ExprPtr sep = expr_seq({expr_literal(","), ws()});
  // Beyond the prefix: a repetition of the item schema (count bounds shifted by the prefix).
  ExprPtr tail = expr_empty();
  if (item && (max < 0 || max > k)) {
    int lo = std::max(0, min - k), hi = max < 0 ? -1 : max - k;
    if (k == 0) {
      ExprPtr first_then = expr_seq({item, expr_repeat(expr_seq({sep, item}), std::max(0, lo - 1), hi < 0 ? -1 : hi - 1)});
      tail = lo == 0 ? expr_optional(first_then) : first_then;
    } else {
      tail = expr_repeat(expr_seq({sep, item}), lo, hi);
    }
  }
  // Positions 0..k-1 of the prefix: each may end the array once minItems is reached.
  ExprPtr rest = tail;
  for (int i = k - 1; i >= 0; --i) {
    ExprPtr with = expr_seq({i > 0 ? sep : expr_empty(), prefix[static_cast<size_t>(i)], rest});
    rest = expr_ref(b_.add_rule(i >= min ? expr_alt({with, expr_empty()}) : with));
  }
  return expr_seq({expr_literal("["), rest, expr_literal("]")});
}

bool SchemaCompiler::unique_items(const ojson& s, const std::string& path) const {
  if (!s.contains("uniqueItems")) return false;
  if (!s["uniqueItems"].is_boolean()) fail("uniqueItems", child(path, "uniqueItems"), "\"uniqueItems\" must be a boolean");
  return s["uniqueItems"].get<bool>();
}

std::optional<std::vector<ojson>> SchemaCompiler::listed_values(const ojson& items, const std::string& path) const {
  const ojson* s = &items;
  std::string at = path;
  for (int hops = 0; s->is_object() && s->contains("$ref"); ++hops) {
    if (hops > kMaxSchemaDepth) return std::nullopt;
    std::string target;
    s = resolve_ref(*s, at, &target);
    at = target;
  }
  if (!s->is_object() || s->contains("anyOf") || s->contains("oneOf") || s->contains("allOf")) return std::nullopt;
  std::vector<std::string> types;
  if (s->contains("type")) {
    const ojson& t = (*s)["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else for (const ojson& x : t) types.push_back(x.get<std::string>());
  }
  std::vector<ojson> listed;
  if (s->contains("const")) {
    listed.push_back((*s)["const"]);
  } else if (s->contains("enum")) {
    listed.assign((*s)["enum"].begin(), (*s)["enum"].end());
  } else if (!types.empty() && std::all_of(types.begin(), types.end(),
                                           [](const std::string& t) { return t == "boolean" || t == "null"; })) {
    listed = {true, false, nullptr};  // the types' own values (filtered below)
  } else {
    return std::nullopt;
  }
  // As value() reads them: only the values of the schema's types, then null when nullable; each value once.
  std::vector<ojson> values;
  std::set<std::string> seen;
  for (const ojson& v : listed) {
    const bool typed =
        types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(v, t); });
    if (typed && seen.insert(v.dump()).second) values.push_back(v);
  }
  if (s->value("nullable", false) && seen.insert("null").second) values.push_back(nullptr);
  return values;
}

ExprPtr SchemaCompiler::unique_array(const std::vector<ojson>& values, int min, int max) {
  const int n = static_cast<int>(values.size());
  if (max < 0 || max > n) max = n;
  if (min > max) return expr_nothing();
  std::vector<ExprPtr> literals;
  for (const ojson& v : values) literals.push_back(expr_ref(b_.add_rule(literal_value(v))));
  const ExprPtr sep = expr_seq({expr_literal(","), ws()});
  std::map<uint64_t, int> rules;  // the values used so far (bit i: values[i]) -> the rule of what may follow
  std::function<int(uint64_t)> rule_of = [&](uint64_t used) {
    if (auto it = rules.find(used); it != rules.end()) return it->second;
    const int rule = rules[used] = b_.new_rule();
    const int count = std::popcount(used);
    std::vector<ExprPtr> alts;
    if (count >= min) alts.push_back(expr_empty());
    if (count < max)
      for (int i = 0; i < n; ++i)
        if (!(used >> i & 1))
          alts.push_back(expr_seq({used ? sep : expr_empty(), literals[size_t(i)], expr_ref(rule_of(used | uint64_t(1) << i))}));
    b_.define(rule, expr_alt(std::move(alts)));
    return rule;
  };
  return expr_seq({expr_literal("["), expr_ref(rule_of(0)), expr_literal("]")});
}

ExprPtr SchemaCompiler::string(const ojson& s, const std::string& path) {
  int min = count_keyword(s, "minLength", path, 0);
  int max = count_keyword(s, "maxLength", path, -1);
  if (max >= 0 && max < min) fail("maxLength", child(path, "maxLength"), "\"maxLength\" is smaller than \"minLength\"");
  bool has_len = s.contains("minLength") || s.contains("maxLength");
  std::string regex;
  const char* regex_keyword = nullptr;
  if (s.contains("format")) {
    const ojson& f = s["format"];
    if (!f.is_string()) fail("format", child(path, "format"), "\"format\" must be a string");
    const char* r = format_regex(f.get<std::string>());
    if (!r) fail("format", child(path, "format"), "unsupported string format \"" + f.get<std::string>() + "\"");
    regex = r;
    regex_keyword = "format";
  }
  if (s.contains("pattern")) {
    const ojson& p = s["pattern"];
    if (!p.is_string()) fail("pattern", child(path, "pattern"), "\"pattern\" must be a string");
    if (regex_keyword) fail("pattern", child(path, "pattern"), "\"pattern\" together with \"format\" is not supported");
    regex = p.get<std::string>();
    regex_keyword = "pattern";
  }
  if (regex_keyword) {
    if (has_len)
      fail(s.contains("maxLength") ? "maxLength" : "minLength", path,
           std::string("length limits together with \"") + regex_keyword + "\" are not supported");
    try {
      return json_string_of(compile_regex(regex, [&](const CodepointClass& c) { return encode_json_class(c); }));
    } catch (const RegexError& e) {
      fail(regex_keyword, child(path, regex_keyword), std::string("bad ") + regex_keyword + ": " + e.what());
    }
  }
  if (!has_len) {
    if (free_string_rule_ < 0) free_string_rule_ = b_.add_rule(json_string_of(expr_repeat(string_char(), 0, -1)));
    return expr_ref(free_string_rule_);
  }
  return json_string_of(expr_repeat(string_char(), min, max));
}

namespace {
// A bound keyword as a number, or nullopt when absent. Draft 4's boolean exclusive* flags are read by the caller.
std::optional<double> number_keyword(const ojson& s, const char* k, const std::string& path) {
  if (!s.contains(k)) return std::nullopt;
  const ojson& v = s[k];
  if (v.is_boolean()) return std::nullopt;
  if (!v.is_number()) SchemaCompiler::fail(k, child(path, k), std::string("\"") + k + "\" must be a number");
  return v.get<double>();
}
bool flag(const ojson& s, const char* k) { return s.contains(k) && s[k].is_boolean() && s[k].get<bool>(); }
}  // namespace

ExprPtr SchemaCompiler::integer(const ojson& s, const std::string& path) {
  const double kMax = static_cast<double>(kMaxIntegerMagnitude);
  double lo = -kMax, hi = kMax;
  if (auto v = number_keyword(s, "minimum", path)) lo = std::max(lo, flag(s, "exclusiveMinimum") ? std::floor(*v) + 1 : std::ceil(*v));
  if (auto v = number_keyword(s, "maximum", path)) hi = std::min(hi, flag(s, "exclusiveMaximum") ? std::ceil(*v) - 1 : std::floor(*v));
  if (auto v = number_keyword(s, "exclusiveMinimum", path)) lo = std::max(lo, std::floor(*v) + 1);
  if (auto v = number_keyword(s, "exclusiveMaximum", path)) hi = std::min(hi, std::ceil(*v) - 1);
  if (s.contains("format")) {
    const ojson& f = s["format"];
    std::string fs = f.is_string() ? f.get<std::string>() : "";
    if (fs == "int32") {
      lo = std::max(lo, -2147483648.0);
      hi = std::min(hi, 2147483647.0);
    } else if (fs != "int64") {
      fail("format", child(path, "format"), "unsupported integer format " + f.dump());
    }
  }
  lo = std::max(lo, -kMax);
  hi = std::min(hi, kMax);
  if (lo > hi) return expr_nothing();
  return integer_range(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
}

ExprPtr SchemaCompiler::number(const ojson& s, const std::string& path) {
  if (s.contains("format")) {
    const ojson& f = s["format"];
    if (!f.is_string() || (f.get<std::string>() != "float" && f.get<std::string>() != "double"))
      fail("format", child(path, "format"), "unsupported number format " + f.dump());
  }
  ExprPtr digits = digit_range('0', '9');
  // Bounds: integers and decimals I.F (1 to kMaxFractionDigits fraction digits, no exponent) inside the range,
  // digit by digit (number_range.h).
  const double kInf = std::numeric_limits<double>::infinity();
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  if (auto v = number_keyword(s, "minimum", path)) lo = *v, lo_open = flag(s, "exclusiveMinimum");
  if (auto v = number_keyword(s, "maximum", path)) hi = *v, hi_open = flag(s, "exclusiveMaximum");
  if (auto v = number_keyword(s, "exclusiveMinimum", path); v && *v >= lo) lo = *v, lo_open = true;
  if (auto v = number_keyword(s, "exclusiveMaximum", path); v && *v <= hi) hi = *v, hi_open = true;
  if (lo > -kInf || hi < kInf) return decimal_range(lo, lo_open, hi, hi_open);
  ExprPtr int_part = expr_alt({expr_literal("0"), expr_seq({digit_range('1', '9'), expr_repeat(digits, 0, 17)})});
  ExprPtr frac = expr_optional(expr_seq({expr_literal("."), expr_repeat(digits, 1, 16)}));
  ByteSet e, sign;
  e.set('e'), e.set('E'), sign.set('+'), sign.set('-');
  ExprPtr exp = expr_optional(expr_seq({expr_bytes(e), expr_optional(expr_bytes(sign)), expr_repeat(digits, 1, 2)}));
  return expr_seq({expr_optional(expr_literal("-")), int_part, frac, exp});
}

// ---- raw strings (tool-call parameters of string type) -----------------------------------------------------------

ExprPtr SchemaCompiler::raw_class(const CodepointClass& c) const {
  CodepointClass allowed = cp_normalize({{'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}, {0x20, '<' - 1}, {'<' + 1, kMaxCodepoint}});
  return expr_utf8_class(cp_intersect(c, allowed));
}

ExprPtr SchemaCompiler::raw_string(const ojson& s, const std::string& path, int depth) {
  if (depth > kMaxSchemaDepth)
    fail("$ref", path, "the schema nests deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
  auto free_text = [&] {
    if (raw_free_rule_ < 0) raw_free_rule_ = b_.add_rule(raw_text_excluding(b_, tool_call_forbidden_words()));
    return expr_ref(raw_free_rule_);
  };
  if (s.is_boolean()) return s.get<bool>() ? free_text() : nullptr;
  if (!s.is_object()) fail("type", path, "a schema must be an object or a boolean");
  check_keywords(s, path);
  if (s.contains("$ref")) {
    std::string target_path;
    const ojson* target = resolve_ref(s, path, &target_path);
    return raw_string(*target, target_path, depth + 1);
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    const ojson& list = s[k];
    if (!list.is_array() || list.empty()) fail(k, child(path, k), std::string("\"") + k + "\" must be a non-empty array");
    std::vector<ExprPtr> alts;
    for (size_t i = 0; i < list.size(); ++i)
      if (ExprPtr e = raw_string(list[i], child(child(path, k), std::to_string(i)), depth + 1)) alts.push_back(e);
    return alts.empty() ? nullptr : expr_alt(std::move(alts));
  }
  if (s.contains("allOf")) {
    const ojson& list = s["allOf"];
    if (!list.is_array() || list.size() != 1)
      fail("allOf", child(path, "allOf"), "\"allOf\" is supported with exactly one schema");
    return raw_string(list[0], child(child(path, "allOf"), "0"), depth + 1);
  }
  if (s.contains("type")) {
    const ojson& t = s["type"];
    bool string_ok = (t.is_string() && t.get<std::string>() == "string") ||
                     (t.is_array() && std::any_of(t.begin(), t.end(), [](const ojson& x) { return x == "string"; }));
    if (!t.is_string() && !t.is_array()) fail("type", child(path, "type"), "\"type\" must be a string or an array of strings");
    if (!string_ok) return nullptr;
  }
  if (s.contains("const") || s.contains("enum")) {
    std::vector<ojson> values;
    if (s.contains("const")) {
      values.push_back(s["const"]);
    } else {
      if (!s["enum"].is_array() || s["enum"].empty()) fail("enum", child(path, "enum"), "\"enum\" must be a non-empty array");
      for (const auto& v : s["enum"]) values.push_back(v);
    }
    std::vector<ExprPtr> alts;
    for (const auto& v : values) {
      if (!v.is_string()) continue;
      std::string text = v.get<std::string>();
      bool clean = true;
      for (const auto& w : tool_call_forbidden_words()) clean = clean && text.find(w) == std::string::npos;
      if (clean) alts.push_back(expr_literal(text));
    }
    return alts.empty() ? nullptr : expr_alt(std::move(alts));
  }
  int min = count_keyword(s, "minLength", path, 0);
  int max = count_keyword(s, "maxLength", path, -1);
  if (max >= 0 && max < min) fail("maxLength", child(path, "maxLength"), "\"maxLength\" is smaller than \"minLength\"");
  bool has_len = s.contains("minLength") || s.contains("maxLength");
  for (const char* k : {"format", "pattern"}) {
    if (!s.contains(k)) continue;
    if (!s[k].is_string()) fail(k, child(path, k), std::string("\"") + k + "\" must be a string");
    if (has_len) fail("maxLength", path, std::string("length limits together with \"") + k + "\" are not supported");
  }
  if (s.contains("format") && s.contains("pattern"))
    fail("pattern", child(path, "pattern"), "\"pattern\" together with \"format\" is not supported");
  if (s.contains("format") || s.contains("pattern")) {
    const char* k = s.contains("format") ? "format" : "pattern";
    std::string regex = s[k].get<std::string>();
    if (s.contains("format")) {
      const char* r = format_regex(regex);
      if (!r) fail("format", child(path, "format"), "unsupported string format \"" + regex + "\"");
      regex = r;
    }
    try {
      // No raw '<' at all: the value can then never contain a tag.
      return compile_regex(regex, [&](const CodepointClass& c) { return raw_class(c); });
    } catch (const RegexError& e) {
      fail(k, child(path, k), std::string("bad ") + k + ": " + e.what());
    }
  }
  if (has_len) return expr_repeat(expr_ref(b_.add_rule(raw_class(cp_all()))), min, max);
  return free_text();
}

GrammarPtr build_or_throw(GrammarBuilder& b, int start, const std::string& description) {
  try {
    return b.build(start, description);
  } catch (const GrammarError& e) {
    std::string what = e.what();
    if (what.find("accepts no string") != std::string::npos)
      throw SchemaError("schema", "the schema accepts no JSON value (at /)");
    throw SchemaError("schema", std::string("the schema cannot be compiled: ") + what);
  }
}

GrammarPtr compile_json_schema(const nlohmann::ordered_json& schema) {
  std::string key = "json-schema:" + schema.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return cached_grammar(key, [&] {
    GrammarBuilder builder;
    SchemaCompiler c(schema, SchemaCompiler::Mode::Json, builder);
    int start = 0;
    try {  // add_rule lowers the body and may throw too (the grammar's size limit)
      start = c.builder().add_rule(expr_seq({c.leading_whitespace(), c.value(schema, "", 0)}));
    } catch (const GrammarError& e) {
      throw SchemaError("schema", std::string("the schema cannot be compiled: ") + e.what());
    }
    return build_or_throw(c.builder(), start, "json schema");
  });
}

GrammarPtr compile_json_schema(const nlohmann::json& schema) {
  return compile_json_schema(nlohmann::ordered_json::parse(schema.dump()));
}

GrammarPtr compile_json_object() {
  static const GrammarPtr g = [] {
    ojson schema = {{"type", "object"}};
    return compile_json_schema(schema);
  }();
  return g;
}

}  // namespace tern::grammar
