// Request validation: every bad field is a 400 that names it; good bodies become the internal structs.
#include <gtest/gtest.h>

#include <random>

#include "../api_test_util.h"
#include "server/http/errors.h"
#include "server/openai/openai_schema.h"

namespace tern::server {
namespace {

ParseOptions options() {
  ParseOptions o;
  o.model_id = "tern-demo";
  o.vocab_size = 1000;
  return o;
}

ApiError chat_error(const std::string& body, ParseOptions o = options()) {
  return expect_rejected(parse_chat_request(body, o), body);
}

ChatRequest chat_ok(const std::string& body, ParseOptions o = options()) {
  return expect_accepted(parse_chat_request(body, o), body);
}

const std::string kUser = R"("messages":[{"role":"user","content":"hi"}])";

TEST(OpenaiSchema, MinimalChatGetsDefaults) {
  ChatRequest r = chat_ok("{" + kUser + "}");
  EXPECT_EQ(r.model, "tern-demo");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0]["content"], "hi");
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.sampling.temperature.has_value());
  EXPECT_TRUE(r.tools.empty());
  EXPECT_TRUE(r.continue_final_message);  // a last assistant message is a prefill
  EXPECT_FALSE(r.return_progress);
}

// llama.cpp's return_progress: a boolean (null: not given), on chat and completions.
TEST(OpenaiSchema, ReturnProgress) {
  EXPECT_TRUE(chat_ok("{" + kUser + R"(,"stream":true,"return_progress":true})").return_progress);
  EXPECT_FALSE(chat_ok("{" + kUser + R"(,"return_progress":false})").return_progress);
  EXPECT_FALSE(chat_ok("{" + kUser + R"(,"return_progress":null})").return_progress);
  const ApiError e = chat_error("{" + kUser + R"(,"return_progress":"yes"})");
  EXPECT_EQ(e.param, "return_progress");
  EXPECT_EQ(e.message, "'return_progress' must be a boolean, got a string.");
  auto completion = parse_completion_request(R"({"prompt":"hi","stream":true,"return_progress":true})", options());
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(completion));
  EXPECT_TRUE(std::get<CompletionRequest>(completion).return_progress);
  auto bad = parse_completion_request(R"({"prompt":"hi","return_progress":[true]})", options());
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "return_progress");
}

TEST(OpenaiSchema, ParsesEveryParameter) {
  ChatRequest r = chat_ok(R"({"model":"tern-demo","messages":[{"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"max_completion_tokens":7,
      "temperature":0,"top_p":0.5,"top_k":-1,"min_p":0.1,"presence_penalty":1.5,"frequency_penalty":-1,
      "repetition_penalty":1.1,"seed":-3,"logit_bias":{"12":-100,"7":5.5},"stop":["x","","yy"],
      "logprobs":true,"top_logprobs":20,"n":1,"user":"u","metadata":{"a":1},"unknown_field":[1,2],
      "response_format":{"type":"text"},"chat_template_kwargs":{"enable_thinking":false},
      "reasoning_effort":"high"})");
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(*r.sampling.temperature, 0.0f);
  EXPECT_EQ(*r.sampling.top_k, -1);
  EXPECT_EQ(*r.sampling.seed, uint64_t(-3));
  EXPECT_EQ(r.sampling.logit_bias.at(12), -100.0f);
  EXPECT_EQ(r.sampling.logit_bias.at(7), 5.5f);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yy"}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 20);
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.chat_template_kwargs["reasoning_effort"], "high");
}

TEST(OpenaiSchema, BadValuesNameTheParameter) {
  struct Case {
    std::string fields;
    std::string param;
  } cases[] = {
      {R"("temperature":-0.5)", "temperature"},       {R"("temperature":"hot")", "temperature"},
      {R"("top_p":0)", "top_p"},
      {R"("top_p":1.5)", "top_p"},                    {R"("max_tokens":-1)", "max_tokens"},
      {R"("max_tokens":0)", "max_tokens"},            {R"("max_tokens":1.5)", "max_tokens"},
      {R"("max_tokens":99999999999999999999999)", "max_tokens"},
      {R"("n":2)", "n"},                              {R"("top_logprobs":21,"logprobs":true)", "top_logprobs"},
      {R"("top_logprobs":3)", "top_logprobs"},        {R"("stop":["a","b","c","d","e"])", "stop"},
      {R"("stop":5)", "stop"},                        {R"("logit_bias":{"abc":1})", "logit_bias"},
      {R"("logit_bias":{"5000":1})", "logit_bias"},   {R"("logit_bias":{"5":101})", "logit_bias"},
      {R"("seed":1.5)", "seed"},                      {R"("stream":"yes")", "stream"},
      {R"("return_progress":1)", "return_progress"},  {R"("return_progress":"true")", "return_progress"},
      {R"("response_format":{"type":"xml"})", "response_format"},
      {R"("response_format":{"type":"json_schema","json_schema":{}})", "response_format"},
      {R"("tool_choice":"maybe")", "tool_choice"},    {R"("tool_choice":"required")", "tool_choice"},
      {R"("tools":{"a":1})", "tools"},                {R"("tools":[{"type":"function"}])", "tools[0].function"},
      {R"("chat_template_kwargs":[1])", "chat_template_kwargs"},
      {R"("chat_template_kwargs":{"enable_thinking":"no"})", "chat_template_kwargs.enable_thinking"},
      {R"("reasoning_effort":"max")", "reasoning_effort"},
      {R"("tern_debug_forced_output":"x")", "tern_debug_forced_output"},
  };
  for (const Case& c : cases) {
    ApiError e = chat_error("{" + kUser + "," + c.fields + "}");
    EXPECT_EQ(e.status, 400) << c.fields;
    EXPECT_EQ(e.param, c.param) << c.fields << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
}

// ---- structured output (issue 14): response_format and forced tool calls become a grammar ----
TEST(OpenaiSchema, ResponseFormatAndForcedToolCallsCompileAGrammar) {
  EXPECT_EQ(chat_ok("{" + kUser + R"(,"response_format":{"type":"text"}})").grammar, nullptr);
  ChatRequest o = chat_ok("{" + kUser + R"(,"response_format":{"type":"json_object"}})");
  EXPECT_EQ(o.response_format, ResponseFormat::json_object);
  EXPECT_NE(o.grammar, nullptr);
  ChatRequest s = chat_ok("{" + kUser + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"n",
      "strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}})");
  EXPECT_EQ(s.response_format, ResponseFormat::json_schema);
  EXPECT_EQ(s.response_schema_name, "n");
  EXPECT_NE(s.grammar, nullptr);
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"x":{"type":"string"}},"required":["x"]}}},{"type":"function","function":{"name":"g"}}])";
  EXPECT_EQ(chat_ok("{" + kUser + "," + tools + "}").grammar, nullptr);  // auto: free
  EXPECT_NE(chat_ok("{" + kUser + "," + tools + R"(,"tool_choice":"required"})").grammar, nullptr);
  ChatRequest named = chat_ok("{" + kUser + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}},
      "parallel_tool_calls":false})");
  EXPECT_NE(named.grammar, nullptr);
  EXPECT_EQ(named.tools.size(), 1u);
  EXPECT_FALSE(named.parallel_tool_calls);
}

TEST(OpenaiSchema, RefusedSchemasNameTheKeyword) {
  struct Case {
    std::string fields, param, keyword;
  } cases[] = {
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"strin"}}})",
       "response_format", "type"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"string","pattern":"(("}}})",
       "response_format", "pattern"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"$ref":"#/$defs/no"}}})",
       "response_format", "$ref"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":5}})", "response_format", "schema"},
      {R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":
          {"x":{"type":"string","pattern":"(("}}}}}],"tool_choice":"required")",
       "tools", "pattern"},
  };
  for (const Case& c : cases) {
    ApiError e = chat_error("{" + kUser + "," + c.fields + "}");
    EXPECT_EQ(e.status, 400) << c.fields;
    EXPECT_EQ(e.param, c.param) << c.fields << " -> " << e.message;
    EXPECT_NE(e.message.find(c.keyword), std::string::npos) << c.fields << " -> " << e.message;
  }
}

TEST(OpenaiSchema, RangesAreInTheMessage) {
  ApiError e = chat_error("{" + kUser + R"(,"temperature":3})");
  EXPECT_NE(e.message.find("[0, 2]"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("3"), std::string::npos) << e.message;
}

TEST(OpenaiSchema, BadMessages) {
  const char* bodies[] = {
      R"({})",
      R"({"messages":[]})",
      R"({"messages":"hi"})",
      R"({"messages":[{"content":"x"}]})",
      R"({"messages":[{"role":"wizard","content":"x"}]})",
      R"({"messages":[{"role":"user"}]})",
      R"({"messages":[{"role":"user","content":5}]})",
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"ftp://x"}}]}]})",
      R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})",
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]})",
      R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]})",
  };
  for (const char* b : bodies) EXPECT_EQ(chat_error(b).status, 400) << b;
  EXPECT_NE(chat_error(bodies[7]).message.find("data: URL"), std::string::npos);
}

TEST(OpenaiSchema, ToolCallArgumentsAsStringOrObject) {
  ChatRequest r = chat_ok(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":null,"tool_calls":[
         {"id":"c1","type":"function","function":{"name":"f","arguments":"{\"b\":1,\"a\":\"x\"}"}},
         {"id":"c2","type":"function","function":{"name":"g","arguments":{"z":true}}}]},
      {"role":"tool","tool_call_id":"c1","content":"ok"},
      {"role":"tool","tool_call_id":"nope","content":"orphan results are accepted"}]})");
  const Json& calls = r.messages[1]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"b":1,"a":"x"})");  // key order kept
  EXPECT_EQ(calls[1]["function"]["arguments"]["z"], true);
  EXPECT_EQ(r.messages[1]["content"], "");
}

TEST(OpenaiSchema, ToolChoice) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object"}}},
                  {"type":"function","function":{"name":"b"}}])";
  EXPECT_EQ(chat_ok("{" + kUser + "," + tools + "}").tools.size(), 2u);
  EXPECT_TRUE(chat_ok("{" + kUser + "," + tools + R"(,"tool_choice":"none"})").tools.empty());
  ChatRequest named = chat_ok("{" + kUser + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"b"}}})");
  ASSERT_EQ(named.tools.size(), 1u);
  EXPECT_EQ(named.tools[0]["function"]["name"], "b");
  EXPECT_EQ(chat_error("{" + kUser + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"c"}}})").param,
            "tool_choice");
  EXPECT_FALSE(chat_ok("{" + kUser + "," + tools + R"(,"parallel_tool_calls":false})").parallel_tool_calls);
}

TEST(OpenaiSchema, AnyModelNameIsTheServedModel) {
  for (const char* name : {"gpt-4o-mini", "tern-demo", "tern-demo:latest", "claude-3-5-haiku-latest"})
    EXPECT_EQ(chat_ok("{" + kUser + R"(,"model":")" + name + "\"}").model, "tern-demo") << name;
}

TEST(OpenaiSchema, UnknownModelIs404WhenStrict) {
  ParseOptions o = options();
  o.strict_model_name = true;
  ApiError e = chat_error("{" + kUser + R"(,"model":"gpt-4"})", o);
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_EQ(chat_ok("{" + kUser + R"(,"model":"tern-demo:latest"})", o).model, "tern-demo");
}

TEST(OpenaiSchema, ForcedOutputOnlyWhenAllowed) {
  ParseOptions o = options();
  o.allow_forced_output = true;
  EXPECT_EQ(*chat_ok("{" + kUser + R"(,"tern_debug_forced_output":"<think>x"})", o).forced_output, "<think>x");
}

TEST(OpenaiSchema, ReasoningEffortNoneTurnsThinkingOff) {
  EXPECT_EQ(chat_ok("{" + kUser + R"(,"reasoning_effort":"none"})").chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(chat_ok("{" + kUser + R"(,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}})")
                .chat_template_kwargs["enable_thinking"],
            true);
}

TEST(OpenaiSchema, Completions) {
  auto ok = [](const std::string& body) {
    auto r = parse_completion_request(body, options());
    EXPECT_TRUE(std::holds_alternative<CompletionRequest>(r)) << body;
    return std::holds_alternative<CompletionRequest>(r) ? std::get<CompletionRequest>(r) : CompletionRequest{};
  };
  auto err = [](const std::string& body) {
    auto r = parse_completion_request(body, options());
    EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
  };
  CompletionRequest a = ok(R"({"prompt":"hello","echo":true,"logprobs":2})");
  EXPECT_EQ(a.prompt_text, "hello");
  EXPECT_EQ(a.max_tokens, 16);
  EXPECT_EQ(a.logprobs, 2);
  EXPECT_TRUE(a.echo);
  EXPECT_EQ(ok(R"({"prompt":["x"]})").prompt_text, "x");
  CompletionRequest ids = ok(R"({"prompt":[1,2,3]})");
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(err(R"({})").param, "prompt");
  EXPECT_EQ(err(R"({"prompt":""})").param, "prompt");
  EXPECT_EQ(err(R"({"prompt":["a","b"]})").param, "prompt");
  EXPECT_EQ(err(R"({"prompt":[1,5000]})").param, "prompt");
  EXPECT_EQ(err(R"({"prompt":"x","suffix":"y"})").param, "suffix");
  EXPECT_EQ(err(R"({"prompt":"x","best_of":3})").param, "best_of");
}

TEST(OpenaiSchema, MalformedBodiesAreErrorsNotCrashes) {
  const std::string bodies[] = {
      "",  "{",  "[]", "null", "42", "\"x\"", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":NaN}",
      std::string(100000, '['), "{\"a\":" + std::string(5000, '{'), std::string("{\"messages\":\0}", 15),
  };
  for (const std::string& b : bodies) EXPECT_EQ(chat_error(b).status, 400) << b.substr(0, 40);
}

TEST(OpenaiSchema, RandomBytesNeverEscape) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::string base = R"({"messages":[{"role":"user","content":"hi"}],"temperature":0.5,"stop":["a"]})";
  for (int i = 0; i < 2000; ++i) {
    std::string b = base;
    const int edits = 1 + int(rng() % 4);
    for (int k = 0; k < edits; ++k) b[rng() % b.size()] = char(rng() % 256);
    auto r = parse_chat_request(b, options());  // must return, whatever it returns
    if (auto* e = std::get_if<ApiError>(&r)) {
      EXPECT_GE(e->status, 400);
    }
  }
}

}  // namespace
}  // namespace tern::server
