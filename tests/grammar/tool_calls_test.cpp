// compile_tool_calls: text the grammar generates parses with tern's output parser into calls whose arguments
// satisfy the tool's schema.
#include <gtest/gtest.h>

#include <random>

#include "grammar_test_util.h"
#include "text/output_parser.h"

namespace tern::grammar {
namespace {

using ojson = nlohmann::ordered_json;

const char* kTools = R"([
 {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
   "location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},
   "days":{"type":"integer","minimum":1,"maximum":7}},"required":["location"]}}},
 {"type":"function","function":{"name":"book","parameters":{"type":"object","properties":{
   "date":{"type":"string","format":"date"},"guests":{"type":["integer","null"]},
   "notes":{"type":"string","maxLength":20},"code":{"type":"string","pattern":"^[A-Z]{3}$"},
   "rooms":{"type":"array","items":{"type":"object","properties":{"kind":{"enum":["single","double"]},"n":{"type":"integer"}},
            "required":["kind","n"],"additionalProperties":false},"maxItems":3},
   "vip":{"type":"boolean"}},"required":["date","guests","rooms"]}}},
 {"type":"function","function":{"name":"ping","parameters":{}}}
])";

std::vector<ToolSpec> specs(const ojson& tools) {
  std::vector<ToolSpec> out;
  for (const auto& t : tools) {
    ToolSpec s;
    s.name = t["function"]["name"];
    s.parameters = nlohmann::json::parse(t["function"]["parameters"].dump());
    s.ordered_parameters = t["function"]["parameters"];
    out.push_back(std::move(s));
  }
  return out;
}

// Parses generated text the way the server does and checks every call.
int check_calls(const std::string& text, const ojson& tools, bool parallel) {
  OutputParser parser(false, tools, 1);
  ParsedDelta d = parser.push(text);
  ParsedDelta f = parser.finish();
  std::vector<ToolCall> calls = d.tool_calls_completed;
  calls.insert(calls.end(), f.tool_calls_completed.begin(), f.tool_calls_completed.end());
  EXPECT_TRUE(d.content.empty() && f.content.empty()) << "content left over: [" << d.content << f.content << "]\n" << text;
  EXPECT_GE(calls.size(), 1u) << text;
  if (!parallel) {
    EXPECT_EQ(calls.size(), 1u) << text;
  }
  for (const auto& c : calls) {
    const ojson* params = nullptr;
    for (const auto& t : tools)
      if (t["function"]["name"] == c.name) params = &t["function"]["parameters"];
    EXPECT_NE(params, nullptr) << c.name;
    if (!params) continue;
    ojson args = ojson::parse(c.arguments_json);
    std::string why;
    ojson schema = params->empty() ? ojson{{"type", "object"}} : *params;
    EXPECT_TRUE(test::validate(args, schema, schema, &why)) << why << "\n" << text;
  }
  return static_cast<int>(calls.size());
}

TEST(ToolCalls, HandWrittenCallsAreAccepted) {
  ojson tools = ojson::parse(kTools);
  GrammarPtr g = compile_tool_calls(specs(tools), false);
  std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(test::accepts(g, call));
  EXPECT_TRUE(test::accepts(g, "\n\n" + call));
  EXPECT_EQ(check_calls(call, tools, false), 1);
  // Wrong: unknown function, missing required, bad enum, value containing the closing tag, two calls.
  EXPECT_FALSE(test::accepts(g, "<tool_call>\n<function=nope>\n</function>\n</tool_call>"));
  EXPECT_FALSE(test::accepts(g, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"));
  EXPECT_FALSE(test::accepts(g, "<tool_call>\n<function=get_weather>\n<parameter=location>\nX\n</parameter>\n"
                                "<parameter=unit>\nkelvin\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(test::accepts(g, "<tool_call>\n<function=get_weather>\n<parameter=location>\nX</parameter>y\n</parameter>\n"
                                "</function>\n</tool_call>"));
  EXPECT_FALSE(test::accepts(g, call + "\n" + call));
  GrammarPtr p = compile_tool_calls(specs(tools), true);
  EXPECT_TRUE(test::accepts(p, call + "\n" + call));
  EXPECT_EQ(check_calls(call + "\n" + call, tools, true), 2);
  // A raw string may contain '<' and even "</param", just not the whole tag.
  EXPECT_TRUE(test::accepts(g, "<tool_call>\n<function=get_weather>\n<parameter=location>\na<b </parameter x\n</parameter>\n"
                               "</function>\n</tool_call>"));
}

TEST(ToolCalls, RandomWalksParseIntoValidCalls) {
  ojson tools = ojson::parse(kTools);
  auto vocab = test::qwen3_vocab();
  uint64_t seed = test::fresh_seed();
  for (bool parallel : {false, true}) {
    GrammarPtr g = compile_tool_calls(specs(tools), parallel);
    int calls = 0;
    for (int i = 0; i < 10; ++i) {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(i));
      test::WalkResult w = test::random_walk(g, vocab, rng, 3000, 50 + static_cast<int>(rng() % 400));
      ASSERT_FALSE(w.dead_end) << w.text;
      ASSERT_TRUE(w.ended) << "not finished: " << w.text;
      calls += check_calls(w.text, tools, parallel);
    }
    std::printf("parallel=%d: %d calls in 10 walks\n", parallel, calls);
  }
}

// Parameters typed only through a $ref, allOf, enum/const or their shape (properties, items): the grammar writes JSON
// where the parser reads JSON (an integer behind a $ref is 7, not "7"), so the calls it generates still validate.
const char* kIndirectTools = R"([
 {"type":"function","function":{"name":"plan","parameters":{"type":"object",
   "$defs":{"Count":{"type":"integer","minimum":0,"maximum":99},"Name":{"type":"string","maxLength":8}},
   "definitions":{"Flag":{"type":"boolean"}},
   "properties":{"count":{"$ref":"#/$defs/Count"},"name":{"$ref":"#/$defs/Name"},"flag":{"$ref":"#/definitions/Flag"},
     "level":{"enum":[1,2,3]},"mode":{"enum":["fast","slow"]},"fixed":{"const":true},
     "ratio":{"allOf":[{"type":"number","minimum":0,"maximum":1}]},
     "point":{"properties":{"x":{"type":"integer"}},"required":["x"],"additionalProperties":false},
     "tags":{"items":{"type":"string","maxLength":5},"maxItems":2}},
   "required":["count","name","flag","level","fixed","ratio","point","tags"]}}}
])";

TEST(ToolCalls, ParametersTypedThroughRefsAllOfEnumsAndShapes) {
  ojson tools = ojson::parse(kIndirectTools);
  GrammarPtr g = compile_tool_calls(specs(tools), false);
  const std::string call =
      "<tool_call>\n<function=plan>\n<parameter=count>\n7\n</parameter>\n<parameter=name>\nbob\n</parameter>\n"
      "<parameter=flag>\ntrue\n</parameter>\n<parameter=level>\n2\n</parameter>\n<parameter=mode>\nslow\n</parameter>\n"
      "<parameter=fixed>\ntrue\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=point>\n{\"x\":1}\n"
      "</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(test::accepts(g, call));
  EXPECT_EQ(check_calls(call, tools, false), 1);
  EXPECT_FALSE(test::accepts(g, call.substr(0, call.find("7")) + "\"7\"" + call.substr(call.find("7") + 1)));
  auto vocab = test::qwen3_vocab();
  uint64_t seed = test::fresh_seed();
  for (int i = 0; i < 10; ++i) {
    std::mt19937_64 rng(seed + static_cast<uint64_t>(i));
    test::WalkResult w = test::random_walk(g, vocab, rng, 3000, 50 + static_cast<int>(rng() % 400));
    ASSERT_FALSE(w.dead_end) << w.text;
    ASSERT_TRUE(w.ended) << "not finished: " << w.text;
    check_calls(w.text, tools, false);
  }
}

TEST(ToolCalls, BadToolsThrow) {
  EXPECT_THROW(compile_tool_calls({}, false), SchemaError);
  EXPECT_THROW(compile_tool_calls({{"bad<name", nlohmann::json::object()}}, false), SchemaError);
  try {
    compile_tool_calls({{"f", nlohmann::json::parse(R"({"type":"object","properties":{"a":{"not":{}}}})")}}, false);
    ADD_FAILURE();
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.keyword(), "not");
  }
  EXPECT_THROW(compile_tool_calls({{"f", nlohmann::json::parse(R"({"type":"string"})")}}, false), SchemaError);
}

}  // namespace
}  // namespace tern::grammar
