// compile_tool_calls: forced tool calls in the Qwen3.6 XML format that src/text/output_parser.cpp reads back.
//
//   <tool_call>\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call>
//
// The parser types a VALUE by its property's schema (tool_parameter_is_text, text/output_parser.h): when the types
// the schema gives (its "type", its anyOf/oneOf members', else what $ref, allOf, enum/const, properties or items
// imply) include "string", or there are none, the raw text becomes a JSON string; otherwise the text is parsed as
// JSON. So a string-typed VALUE is raw text valid for the string part of the schema, and any other VALUE is JSON
// text of the schema. Neither may contain "</parameter>", "<tool_call>" or "</tool_call>", which would
// end the value or the block early: raw text avoids the words, JSON values write '<' as \u003c.
#include <algorithm>
#include <map>

#include "grammar/schema_compiler.h"
#include "text/output_parser.h"

namespace tern::grammar {

const std::vector<std::string>& tool_call_forbidden_words() {
  static const std::vector<std::string> w = {"</parameter>", "<tool_call>", "</tool_call>"};
  return w;
}

// An Aho-Corasick automaton over the words; one rule per state that has not completed a word. ASCII bytes move
// between states; a multi-byte UTF-8 character returns to the root (the words are ASCII).
ExprPtr raw_text_excluding(GrammarBuilder& b, const std::vector<std::string>& forbidden) {
  struct Node {
    std::map<uint8_t, int> next;
    int fail = 0;
    bool out = false;
  };
  std::vector<Node> nodes(1);
  for (const auto& w : forbidden) {
    int cur = 0;
    for (char ch : w) {
      uint8_t c = static_cast<uint8_t>(ch);
      auto it = nodes[static_cast<size_t>(cur)].next.find(c);
      if (it == nodes[static_cast<size_t>(cur)].next.end()) {
        nodes.emplace_back();
        int id = static_cast<int>(nodes.size() - 1);
        nodes[static_cast<size_t>(cur)].next[c] = id;
        cur = id;
      } else {
        cur = it->second;
      }
    }
    nodes[static_cast<size_t>(cur)].out = true;
  }
  // Failure links, breadth first.
  std::vector<int> order{0};
  for (size_t i = 0; i < order.size(); ++i) {
    int q = order[i];
    for (auto [c, t] : nodes[static_cast<size_t>(q)].next) {
      order.push_back(t);
      if (q == 0) continue;
      int f = nodes[static_cast<size_t>(q)].fail;
      while (f != 0 && !nodes[static_cast<size_t>(f)].next.count(c)) f = nodes[static_cast<size_t>(f)].fail;
      auto it = nodes[static_cast<size_t>(f)].next.find(c);
      nodes[static_cast<size_t>(t)].fail = it != nodes[static_cast<size_t>(f)].next.end() ? it->second : 0;
      if (nodes[static_cast<size_t>(nodes[static_cast<size_t>(t)].fail)].out) nodes[static_cast<size_t>(t)].out = true;
    }
  }
  auto step = [&](int q, uint8_t c) {
    while (q != 0 && !nodes[static_cast<size_t>(q)].next.count(c)) q = nodes[static_cast<size_t>(q)].fail;
    auto it = nodes[static_cast<size_t>(q)].next.find(c);
    return it != nodes[static_cast<size_t>(q)].next.end() ? it->second : 0;
  };
  std::vector<int> rules(nodes.size(), -1);
  for (size_t q = 0; q < nodes.size(); ++q)
    if (!nodes[q].out) rules[q] = b.new_rule();
  ExprPtr multibyte = expr_utf8_class({{0x80, kMaxCodepoint}});
  for (size_t q = 0; q < nodes.size(); ++q) {
    if (nodes[q].out) continue;
    std::map<int, ByteSet> by_target;
    for (int c = 0; c < 0x7F; ++c) {
      if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') continue;
      int t = step(static_cast<int>(q), static_cast<uint8_t>(c));
      if (!nodes[static_cast<size_t>(t)].out) by_target[t].set(static_cast<size_t>(c));
    }
    std::vector<ExprPtr> alts = {expr_empty()};
    for (const auto& [t, set] : by_target) alts.push_back(expr_seq({expr_bytes(set), expr_ref(rules[static_cast<size_t>(t)])}));
    alts.push_back(expr_seq({multibyte, expr_ref(rules[0])}));
    b.define(rules[q], expr_alt(std::move(alts)));
  }
  return expr_ref(rules[0]);
}

namespace {

bool tag_safe(const std::string& s) {
  if (s.empty() || s.find_first_of("<>\n\r") != std::string::npos) return false;
  auto ws = [](char c) { return c == ' ' || c == '\t'; };
  return !ws(s.front()) && !ws(s.back());
}

// "<function=NAME>\n" parameters "</function>\n" for one tool.
ExprPtr function_call(const ToolSpec& tool, GrammarBuilder& b, std::vector<std::unique_ptr<ojson>>& keep,
                      std::vector<std::unique_ptr<SchemaCompiler>>& compilers) {
  if (!tag_safe(tool.name))
    throw SchemaError("name", "tool name \"" + tool.name + "\" cannot be written in a <function=...> tag");
  keep.push_back(std::make_unique<ojson>(!tool.ordered_parameters.is_null() ? tool.ordered_parameters
                                                                            : ojson::parse(tool.parameters.dump())));
  const ojson& root = *keep.back();
  compilers.push_back(std::make_unique<SchemaCompiler>(root, SchemaCompiler::Mode::ToolJson, b));
  SchemaCompiler& c = *compilers.back();
  std::string where = "tool \"" + tool.name + "\" parameters";
  std::vector<ExprPtr> params;
  std::vector<bool> required;
  if (!root.is_null() && !(root.is_object() && root.empty())) {
    const ojson* s = &root;
    std::string path;
    if (!s->is_object()) SchemaCompiler::fail("parameters", "", where + ": must be a JSON Schema object");
    c.check_keywords(*s, path);
    if (s->contains("$ref")) s = c.resolve_ref(*s, path, &path);
    for (const char* k : {"anyOf", "oneOf", "allOf", "enum", "const"})
      if (s->contains(k)) SchemaCompiler::fail(k, path + "/" + k, where + ": \"" + k + "\" at the top is not supported");
    if (s->contains("type")) {
      const ojson& t = (*s)["type"];
      bool object_ok = t == "object" || (t.is_array() && std::find(t.begin(), t.end(), ojson("object")) != t.end());
      if (!object_ok) SchemaCompiler::fail("type", path + "/type", where + ": the parameters must be an object");
    }
    std::vector<std::string> names;
    std::vector<const ojson*> schemas;
    if (s->contains("properties")) {
      const ojson& p = (*s)["properties"];
      if (!p.is_object()) SchemaCompiler::fail("properties", path + "/properties", "\"properties\" must be an object");
      for (auto it = p.begin(); it != p.end(); ++it) {
        names.push_back(it.key());
        schemas.push_back(&it.value());
      }
    }
    std::vector<bool> req(names.size(), false);
    static const ojson any_value = true;
    if (s->contains("required")) {
      const ojson& r = (*s)["required"];
      if (!r.is_array()) SchemaCompiler::fail("required", path + "/required", "\"required\" must be an array of strings");
      for (const auto& x : r) {
        if (!x.is_string()) SchemaCompiler::fail("required", path + "/required", "\"required\" must be an array of strings");
        auto it = std::find(names.begin(), names.end(), x.get<std::string>());
        if (it != names.end()) {
          req[static_cast<size_t>(it - names.begin())] = true;
        } else {  // required but undeclared: any value, which the parser reads as a string
          names.push_back(x.get<std::string>());
          schemas.push_back(&any_value);
          req.push_back(true);
        }
      }
    }
    for (size_t i = 0; i < names.size(); ++i) {
      std::string ppath = path + "/properties/" + names[i];
      bool ok = tag_safe(names[i]);
      ExprPtr v;
      if (ok)
        v = tool_parameter_is_text(*schemas[i], root) ? c.raw_string(*schemas[i], ppath, 1)
                                                      : c.value(*schemas[i], ppath, 1);
      if (!ok || !v) {
        if (req[i])
          SchemaCompiler::fail("properties", ppath, where + ": required parameter \"" + names[i] +
                                                        "\" cannot be written in the tool-call format");
        continue;
      }
      params.push_back(expr_seq({expr_literal("<parameter=" + names[i] + ">\n"), v, expr_literal("\n</parameter>\n")}));
      required.push_back(req[i]);
    }
  }
  ExprPtr rest = expr_empty();
  for (size_t i = params.size(); i-- > 0;) {
    ExprPtr with = expr_seq({params[i], rest});
    rest = expr_ref(b.add_rule(required[i] ? with : expr_alt({with, rest})));
  }
  return expr_seq({expr_literal("<function=" + tool.name + ">\n"), rest, expr_literal("</function>\n")});
}

}  // namespace

namespace {
GrammarPtr build_tool_calls(const std::vector<ToolSpec>& tools, bool parallel) {
  GrammarBuilder b;
  std::vector<std::unique_ptr<ojson>> keep;
  std::vector<std::unique_ptr<SchemaCompiler>> compilers;
  std::vector<ExprPtr> functions;
  try {
    for (const auto& t : tools) functions.push_back(function_call(t, b, keep, compilers));
  } catch (const GrammarError& e) {
    throw SchemaError("parameters", std::string("the tool parameters cannot be compiled: ") + e.what());
  }
  int call = b.add_rule(expr_seq({expr_literal("<tool_call>\n"), expr_alt(std::move(functions)), expr_literal("</tool_call>")}));
  ExprPtr calls = expr_ref(call);
  if (parallel) calls = expr_seq({calls, expr_repeat(expr_seq({expr_literal("\n"), expr_ref(call)}), 0, 7)});
  ojson empty = ojson::object();
  SchemaCompiler ws_source(empty, SchemaCompiler::Mode::ToolJson, b);
  int start = b.add_rule(expr_seq({ws_source.leading_whitespace(), calls}));
  return build_or_throw(b, start, "tool calls");
}
}  // namespace

GrammarPtr compile_tool_calls(const std::vector<ToolSpec>& tools, bool parallel) {
  if (tools.empty()) throw SchemaError("tools", "no tools to call");
  std::string key = parallel ? "tool-calls-parallel:" : "tool-calls:";
  for (const auto& t : tools) {
    constexpr auto kReplace = ojson::error_handler_t::replace;
    key += ojson(t.name).dump(-1, ' ', false, kReplace) + "=";
    key += (t.ordered_parameters.is_null() ? t.parameters.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                           : t.ordered_parameters.dump(-1, ' ', false, kReplace)) + ";";
  }
  return cached_grammar(key, [&] { return build_tool_calls(tools, parallel); });
}

}  // namespace tern::grammar
