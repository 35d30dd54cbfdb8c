// OutputParser: reasoning / content / tool calls from text pushed piece by piece. The same text split at every
// point into two pieces, and at (sampled) pairs of points into three, must give the same result as one push.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "text/output_parser.h"

namespace tern {
namespace {

using ojson = nlohmann::ordered_json;

struct Result {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments_json
  bool operator==(const Result&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "reasoning=" << ::testing::PrintToString(r.reasoning) << " content=" << ::testing::PrintToString(r.content);
  for (const auto& [n, a] : r.calls) os << " call " << n << a;
  return os;
}

void absorb(Result& r, const ParsedDelta& d, std::set<std::string>* ids = nullptr) {
  r.reasoning += d.reasoning;
  r.content += d.content;
  for (const auto& c : d.tool_calls_completed) {
    EXPECT_EQ(c.index, static_cast<int>(r.calls.size()));
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
    if (ids) {
      EXPECT_TRUE(ids->insert(c.id).second) << "duplicate id " << c.id;
    }
    r.calls.emplace_back(c.name, c.arguments_json);
  }
}

ojson weather_tools() {
  return ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},
    "opts":{"type":"object"},"tags":{"type":"array"},"ratio":{"type":["number","null"]}}}}}])");
}

Result parse_pieces(const std::vector<std::string_view>& pieces, bool reasoning, const ojson& tools) {
  OutputParser p(reasoning, tools, 1234);
  Result r;
  std::set<std::string> ids;
  for (auto piece : pieces) absorb(r, p.push(piece), &ids);
  absorb(r, p.finish(), &ids);
  return r;
}

// Every 2-split and every 3-split (or a random sample of them for long texts) equals the one-push result.
void check_splits(const std::string& text, bool reasoning, const ojson& tools, std::mt19937_64& rng) {
  const Result whole = parse_pieces({text}, reasoning, tools);
  std::string_view t = text;
  for (size_t i = 0; i <= t.size(); ++i)
    ASSERT_EQ(parse_pieces({t.substr(0, i), t.substr(i)}, reasoning, tools), whole) << "split at " << i;
  const size_t n = t.size();
  const bool all = n <= 160;
  const size_t samples = all ? (n + 1) * (n + 2) / 2 : 3000;
  for (size_t s = 0; s < samples; ++s) {
    size_t i, j;
    if (all) {  // enumerate i <= j
      size_t k = s;
      i = 0;
      while (k > n - i) { k -= n - i + 1; ++i; }
      j = i + k;
    } else {
      i = rng() % (n + 1);
      j = i + rng() % (n + 1 - i);
    }
    ASSERT_EQ(parse_pieces({t.substr(0, i), t.substr(i, j - i), t.substr(j)}, reasoning, tools), whole)
        << "splits at " << i << ", " << j;
  }
}

uint64_t fresh_seed() {
  uint64_t s = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(s));
  return s;
}

TEST(OutputParser, ReasoningContentAndTwoCalls) {
  const std::string text =
      "Let me think about Paris.</think>\n\nI'll check.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon, \"FR\"\n</parameter>\n<parameter=metric>\n"
      "True\n</parameter>\n</function>\n</tool_call>";
  Result r = parse_pieces({text}, true, weather_tools());
  EXPECT_EQ(r.reasoning, "Let me think about Paris.");
  EXPECT_EQ(r.content, "I'll check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].first, "get_weather");
  EXPECT_EQ(r.calls[0].second, R"({"city":"Paris","days":3})");
  EXPECT_EQ(r.calls[1].second, R"({"city":"Lyon, \"FR\"","metric":true})");
  std::mt19937_64 rng(fresh_seed());
  check_splits(text, true, weather_tools(), rng);
}

TEST(OutputParser, ArgumentTypingFollowsSchema) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\nseven\n"
      "</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\", \"ü\"]\n</parameter>\n"
      "<parameter=ratio>\n0.5\n</parameter>\n<parameter=unknown>\n12\n</parameter>\n<parameter=metric>\nfalse\n"
      "</parameter>\n</function>\n</tool_call>";
  Result r = parse_pieces({text}, false, weather_tools());
  ASSERT_EQ(r.calls.size(), 1u);
  // string schema keeps "42" a string; unparsable integer falls back to a string; no schema -> string.
  EXPECT_EQ(r.calls[0].second,
            R"({"city":"42","days":"seven","opts":{"a":[1,2]},"tags":["x","ü"],"ratio":0.5,"unknown":"12","metric":false})");
  EXPECT_EQ(r.content, "");
}

// Types found through local $refs ($defs, definitions, chains), anyOf members that are refs, the first allOf member
// that names one, enum/const values, and properties/items alone; unresolvable refs and ref cycles stay strings.
TEST(OutputParser, ArgumentTypingFollowsRefsAllOfEnumsAndShapes) {
  const ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"plan","parameters":{"type":"object",
    "$defs":{"Count":{"type":"integer"},"Name":{"type":"string"},"Alias":{"$ref":"#/$defs/Count"},
             "Loop":{"$ref":"#/$defs/Loop"},"a/b":{"type":"number"}},
    "definitions":{"Flag":{"type":"boolean"}},
    "properties":{"count":{"$ref":"#/$defs/Count"},"name":{"$ref":"#/$defs/Name"},"alias":{"$ref":"#/$defs/Alias"},
      "flag":{"$ref":"#/definitions/Flag"},"escaped":{"$ref":"#/$defs/a~1b"},
      "maybe":{"anyOf":[{"$ref":"#/$defs/Count"},{"type":"null"}]},
      "both":{"allOf":[{"description":"no type here"},{"type":"number"}]},
      "level":{"enum":[1,2,3]},"mode":{"enum":["1","2"]},"mixed":{"enum":[1,"x"]},"fixed":{"const":true},
      "point":{"properties":{"x":{"type":"number"}}},"list":{"items":{"type":"integer"}},
      "typed":{"type":"string","$ref":"#/$defs/Count"},
      "loop":{"$ref":"#/$defs/Loop"},"dangling":{"$ref":"#/$defs/Missing"},"remote":{"$ref":"https://x.org/s.json"}
    }}}}])");
  std::string text = "<tool_call>\n<function=plan>\n";
  for (const auto& [k, v] :
       std::vector<std::pair<std::string, std::string>>{
           {"count", "7"}, {"name", "7"}, {"alias", "7"}, {"flag", "true"}, {"escaped", "1.5"}, {"maybe", "None"},
           {"both", "2.5"}, {"level", "2"}, {"mode", "2"}, {"mixed", "1"}, {"fixed", "True"}, {"point", "{\"x\": 1}"},
           {"list", "[1, 2]"}, {"typed", "7"}, {"loop", "5"}, {"dangling", "5"}, {"remote", "5"}})
    text += "<parameter=" + k + ">\n" + v + "\n</parameter>\n";
  text += "</function>\n</tool_call>";
  Result r = parse_pieces({text}, false, tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second,
            R"({"count":7,"name":"7","alias":7,"flag":true,"escaped":1.5,"maybe":null,"both":2.5,"level":2,"mode":"2",)"
            R"("mixed":"1","fixed":true,"point":{"x":1},"list":[1,2],"typed":"7","loop":"5","dangling":"5",)"
            R"("remote":"5"})");
  // The parameters object itself may be a reference.
  const ojson by_ref = ojson::parse(R"([{"type":"function","function":{"name":"f","parameters":{
    "$ref":"#/$defs/Args","$defs":{"Args":{"type":"object","properties":{"n":{"type":"integer"}}}}}}}])");
  r = parse_pieces({"<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"}, false,
                   by_ref);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, R"({"n":3})");
}

TEST(OutputParser, ToolParameterTypes) {
  const ojson root = ojson::parse(R"({"$defs":{"N":{"type":"integer"},"S":{"type":"string"}}})");
  auto types = [&](const char* schema) { return tool_parameter_types(ojson::parse(schema), root); };
  using V = std::vector<std::string>;
  EXPECT_EQ(types(R"({"type":["integer","null"]})"), (V{"integer", "null"}));
  EXPECT_EQ(types(R"({"oneOf":[{"$ref":"#/$defs/N"},{"$ref":"#/$defs/S"}]})"), (V{"integer", "string"}));
  EXPECT_EQ(types(R"({"allOf":[{"$ref":"#/$defs/N"},{"type":"string"}]})"), (V{"integer"}));  // the first that types
  EXPECT_EQ(types(R"({"enum":[1, 2.5, "a", null, false]})"), (V{"integer", "number", "string", "null", "boolean"}));
  EXPECT_EQ(types(R"({"const":{"a":1}})"), (V{"object"}));
  EXPECT_EQ(types(R"({"items":{}})"), (V{"array"}));
  EXPECT_EQ(types(R"({"description":"anything"})"), V{});
  EXPECT_EQ(types("true"), V{});
  EXPECT_FALSE(tool_parameter_is_text(ojson::parse(R"({"$ref":"#/$defs/N"})"), root));
  EXPECT_TRUE(tool_parameter_is_text(ojson::parse(R"({"anyOf":[{"$ref":"#/$defs/N"},{"$ref":"#/$defs/S"}]})"), root));
  EXPECT_TRUE(tool_parameter_is_text(ojson::parse(R"({"$ref":"#/$defs/Missing"})"), root));
}

TEST(OutputParser, MultilineValuesKeepInnerNewlines) {
  const std::string text =
      "<tool_call>\n<function=write>\n<parameter=body>\nline 1\n\nline 3\n</parameter>\n</function>\n</tool_call>";
  Result r = parse_pieces({text}, false, nullptr);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, R"({"body":"line 1\n\nline 3"})");
}

TEST(OutputParser, MalformedAndUnterminatedBlocksBecomeContent) {
  std::mt19937_64 rng(fresh_seed());
  struct Case { std::string text, content; size_t calls; };
  const std::vector<Case> cases = {
      {"a <tool_call>no function here</tool_call> b", "a <tool_call>no function here</tool_call> b", 0},
      {"x<tool_call>\n<function=f>\n<parameter=k>\nv\n</function>\n</tool_call>",
       "x<tool_call>\n<function=f>\n<parameter=k>\nv\n</function>\n</tool_call>", 0},
      {"x<tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n", "x<tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n", 0},
      {"<tool_call>\n<function=f>\n</function>\ntrailing junk</tool_call>",
       "<tool_call>\n<function=f>\n</function>\ntrailing junk</tool_call>", 0},
      {"half <tool_", "half <tool_", 0},
      {"<tool_call><function=f></function></tool_call> after", " after", 1},
      {"<tool_call>\n<function=broken>\n<tool_call>\n<function=g>\n</function>\n</tool_call>",
       "<tool_call>\n<function=broken>", 1},
      {"a < b and <tool> </tool_call>", "a < b and <tool> </tool_call>", 0},
  };
  for (const auto& c : cases) {
    Result r = parse_pieces({c.text}, false, nullptr);
    EXPECT_EQ(r.content, c.content) << c.text;
    EXPECT_EQ(r.calls.size(), c.calls) << c.text;
    check_splits(c.text, false, nullptr, rng);
  }
}

TEST(OutputParser, ReasoningEdges) {
  // Unterminated reasoning stays reasoning; a repeated <think> at the start is dropped; no reasoning mode.
  EXPECT_EQ(parse_pieces({"still thinking </thi"}, true, nullptr).reasoning, "still thinking </thi");
  Result r = parse_pieces({"<think>\nhmm</think>\n\nok"}, true, nullptr);
  EXPECT_EQ(r.reasoning, "\nhmm");
  EXPECT_EQ(r.content, "ok");
  r = parse_pieces({"plain </think> text"}, false, nullptr);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "plain </think> text");
  r = parse_pieces({"why</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>"}, true, nullptr);
  EXPECT_EQ(r.reasoning, "why");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{}");
}

TEST(OutputParser, StreamingEmitsEarlyAndHoldsOnlyPossibleTags) {
  OutputParser p(true, nullptr, 7);
  EXPECT_EQ(p.push("abc</th").reasoning, "abc");
  ParsedDelta d = p.push("ink>\n\nHello <tool");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Hello");  // the space is held until we know whether a call follows
  d = p.push("s> world");
  EXPECT_EQ(d.content, " <tools> world");
  EXPECT_TRUE(p.finish().empty());
}

// Random outputs built from known parts: the parse must recover the parts, under every split.
TEST(OutputParser, RandomOutputsRoundTrip) {
  std::mt19937_64 rng(fresh_seed());
  const std::vector<std::string> words = {"hello", "ça va", "中文", "<b>", "a<b", "</", "<tool", "think", "\n", "x y"};
  auto phrase = [&] {
    std::string s;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) s += (k ? " " : "") + words[rng() % words.size()];
    return s;
  };
  for (int iter = 0; iter < 12; ++iter) {
    Result want;
    std::string text;
    bool reasoning = rng() % 2;
    if (reasoning) {
      want.reasoning = phrase();
      text += want.reasoning + "</think>\n\n";
    }
    std::string c = phrase();
    while (!c.empty() && (c.front() == '\n' || c.back() == '\n' || c.back() == ' ' || c.front() == ' ')) c = "q";
    want.content = c;
    text += c;
    for (int k = 0, n = static_cast<int>(rng() % 3); k < n; ++k) {
      std::string v = "[" + phrase() + "]";
      text += "\n\n<tool_call>\n<function=fn" + std::to_string(k) + ">\n<parameter=p>\n" + v +
              "\n</parameter>\n</function>\n</tool_call>";
      want.calls.emplace_back("fn" + std::to_string(k), ojson{{"p", v}}.dump());
    }
    ASSERT_EQ(parse_pieces({text}, reasoning, nullptr), want) << ::testing::PrintToString(text);
    check_splits(text, reasoning, nullptr, rng);
  }
}

}  // namespace
}  // namespace tern
