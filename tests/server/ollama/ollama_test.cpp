// Ollama's API translation: request bodies -> the internal chat request (every bad field a 400 naming it, another
// model the served one, or with --strict-model-name a 404 in Ollama's words), and the model's text -> NDJSON objects whose pieces add up to the whole message
// whatever the text's split.
#include <gtest/gtest.h>

#include <random>

#include "../api_test_util.h"
#include "server/ollama/ollama_output.h"
#include "server/ollama/ollama_schema.h"

namespace tern::server {
namespace {

ParseOptions options() {
  ParseOptions o;
  o.model_id = "org/model";
  o.model_aliases = {"alias"};
  o.vocab_size = 1000;
  return o;
}

OllamaRequest ok(const std::string& body, OllamaEndpoint endpoint = OllamaEndpoint::chat) {
  return expect_accepted(parse_ollama_request(body, options(), endpoint), body);
}

ApiError error(const std::string& body, OllamaEndpoint endpoint = OllamaEndpoint::chat) {
  return expect_rejected(parse_ollama_request(body, options(), endpoint), body);
}

TEST(OllamaSchema, TranslatesAChatWithToolsThinkingAndOptions) {
  const OllamaRequest r = ok(R"({"model":"alias:latest","think":false,"keep_alive":"5m","messages":[
      {"role":"system","content":"Be brief."},{"role":"user","content":"weather?"},
      {"role":"assistant","content":"","thinking":"hm","tool_calls":[{"function":{"name":"get_weather",
        "arguments":{"city":"Paris"}}}]},
      {"role":"tool","content":"18C","tool_name":"get_weather"}],
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
      "options":{"temperature":0.5,"top_k":5,"seed":-1,"num_predict":-1,"stop":["X"],"repeat_penalty":1.1,
                 "num_ctx":2048,"num_gpu":99,"mirostat":0}})");
  EXPECT_EQ(r.model_name, "alias:latest");
  EXPECT_EQ(r.chat.model, "org/model");
  EXPECT_TRUE(r.chat.stream);  // Ollama's default
  EXPECT_TRUE(r.chat.continue_final_message);  // a last assistant message is continued, as Ollama does
  const Json& m = r.chat.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[2]["reasoning_content"], "hm");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], (Json{{"city", "Paris"}}));
  EXPECT_EQ(m[3], (Json{{"role", "tool"}, {"content", "18C"}, {"name", "get_weather"}}));
  EXPECT_EQ(r.chat.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(*r.chat.sampling.temperature, 0.5f);
  EXPECT_EQ(*r.chat.sampling.top_k, 5);
  EXPECT_FALSE(r.chat.sampling.seed.has_value());  // -1: random
  EXPECT_FALSE(r.chat.max_tokens.has_value());     // -1: no limit
  EXPECT_FLOAT_EQ(*r.chat.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.chat.stop, std::vector<std::string>{"X"});
  EXPECT_EQ(*r.num_ctx, 2048);
  EXPECT_EQ(r.chat.tools.size(), 1u);
  EXPECT_FALSE(r.chat.grammar);
  EXPECT_FALSE(r.load_only);

  const OllamaRequest j = ok(R"({"model":"org/model","messages":[{"role":"user","content":"x"}],"format":"json",
      "stream":false,"think":"high","options":{"num_predict":7,"seed":3}})");
  EXPECT_TRUE(j.chat.grammar);
  EXPECT_EQ(j.chat.response_format, ResponseFormat::json_object);
  EXPECT_FALSE(j.chat.stream);
  EXPECT_EQ(j.chat.chat_template_kwargs["enable_thinking"], true);
  EXPECT_EQ(*j.chat.max_tokens, 7);
  EXPECT_EQ(*j.chat.sampling.seed, 3u);
  EXPECT_TRUE(ok(R"({"model":"alias","messages":[]})").load_only);
}

TEST(OllamaSchema, Generate) {
  const OllamaRequest t = ok(R"({"model":"org/model","prompt":"hi","system":"S"})", OllamaEndpoint::generate);
  EXPECT_EQ(t.chat.messages, Json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"hi"}])"));
  EXPECT_FALSE(t.raw);
  const OllamaRequest raw = ok(R"({"model":"org/model","prompt":"hi","raw":true})", OllamaEndpoint::generate);
  EXPECT_TRUE(raw.raw);
  EXPECT_EQ(raw.prompt, "hi");
  EXPECT_TRUE(raw.chat.messages.empty());
  EXPECT_TRUE(ok(R"({"model":"org/model"})", OllamaEndpoint::generate).load_only);
}

TEST(OllamaSchema, BadBodiesNameTheField) {
  const std::string m = R"("model":"org/model","messages":[{"role":"user","content":"x"}])";
  struct Case {
    std::string body, param, words;
  };
  const std::vector<Case> cases = {
      {R"({"messages":[]})", "model", "required"},
      {"{" + m + R"(,"stream":1})", "stream", "boolean"},
      {"{" + m + R"(,"think":"max"})", "think", "boolean"},
      {"{" + m + R"(,"format":"yaml"})", "format", "json"},
      {"{" + m + R"(,"format":{"type":"object","properties":{"a":{"$ref":"http://x"}}}})", "format", "$ref"},
      {"{" + m + R"(,"options":{"temperature":"hot"}})", "options.temperature", "number"},
      {"{" + m + R"(,"options":{"top_p":0}})", "options.top_p", "(0, 1]"},
      {"{" + m + R"(,"options":{"num_predict":0}})", "options.num_predict", "-1"},
      {"{" + m + R"(,"options":{"num_predict":1.5}})", "options.num_predict", "integer"},
      {"{" + m + R"(,"options":{"seed":1e30}})", "options.seed", "integer"},
      {"{" + m + R"(,"options":{"stop":[1]}})", "options.stop", "strings"},
      {"{" + m + R"(,"options":"x"})", "options", "object"},
      {"{" + m + R"(,"keep_alive":{}})", "keep_alive", "duration"},
      {R"({"model":"org/model","messages":[{"role":"robot","content":"x"}]})", "messages[0].role", "robot"},
      {R"({"model":"org/model","messages":[{"role":"user","content":1}]})", "messages[0].content", "string"},
      {R"({"model":"org/model","messages":[{"role":"user","content":"x","images":[1]}]})", "messages[0].images[0]",
       "base64"},
      {R"({"model":"org/model","messages":[{"role":"user","content":"x","images":["a$b"]}]})", "messages[0].images[0]",
       "not valid base64"},
      {R"({"model":"org/model","messages":[{"role":"assistant","content":"x","images":["aGk="]}]})",
       "messages[0].images", "user messages"},
      {R"({"model":"org/model","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":3}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "object"},
      {"{" + m + R"(,"tools":[{"type":"function","function":{}}]})", "tools[0].function.name", "name"},
      {"[1]", "", "object"},
  };
  for (const Case& c : cases) {
    const ApiError e = error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.words), std::string::npos) << c.body << " -> " << e.message;
  }
  EXPECT_EQ(error(R"({"model":"org/model","prompt":"x","suffix":"y"})", OllamaEndpoint::generate).param, "suffix");
  EXPECT_EQ(error(R"({"model":"org/model","prompt":"x","raw":true,"system":"s"})", OllamaEndpoint::generate).param,
            "system");
  // Another model's name is the served model, echoed as its id (a known name is echoed as written, as Ollama does);
  // with --strict-model-name it is a 404 in Ollama's words.
  EXPECT_EQ(ok(R"({"model":"llama3:8b","messages":[]})").model_name, "org/model");
  EXPECT_EQ(ok(R"({"model":"org/model:latest","messages":[]})").model_name, "org/model:latest");
  ParseOptions strict = options();
  strict.strict_model_name = true;
  const std::string body = R"({"model":"llama3:8b","messages":[]})";
  const ApiError e = expect_rejected(parse_ollama_request(body, strict, OllamaEndpoint::chat), body);
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(ollama_error_json(e), (Json{{"error", "model 'llama3:8b' not found"}}));
}

// Feeds `text` to fresh outputs in random pieces; returns the stream objects and the non-streamed response.
std::pair<std::vector<Json>, Json> run_output(const std::string& text, OllamaOutputOptions o, std::mt19937& rng) {
  OllamaOutput streamed(o), whole(o);
  std::vector<Json> objects = feed_in_pieces(streamed, whole, text, rng);
  GenerationResult r;
  r.prompt_tokens = 10;
  r.completion_tokens = 7;
  r.prefill_s = 0.25;
  r.decode_s = 0.5;
  for (Json& ob : streamed.finish_chunks(r)) objects.push_back(std::move(ob));
  return {objects, whole.response(r)};
}

TEST(OllamaOutput, ChatPiecesAddUpWhateverTheSplit) {
  std::mt19937 rng(std::random_device{}());
  const std::string text = "Let me look.</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
                           "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                           "</tool_call>";
  OllamaOutputOptions o;
  o.model = "alias";
  o.tools = Json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");
  o.starts_in_reasoning = true;
  for (int trial = 0; trial < 20; ++trial) {
    auto [objects, message] = run_output(text, o, rng);
    EXPECT_EQ(message["model"], "alias");
    EXPECT_EQ(message["message"]["thinking"], "Let me look.");
    EXPECT_EQ(message["message"]["content"], "Checking.");
    ASSERT_EQ(message["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(message["message"]["tool_calls"][0]["function"]["arguments"], (Json{{"city", "Paris"}, {"days", 3}}));
    EXPECT_EQ(message["done"], true);
    EXPECT_EQ(message["done_reason"], "stop");
    EXPECT_EQ(message["prompt_eval_count"], 10);
    EXPECT_EQ(message["eval_count"], 7);
    EXPECT_EQ(message["prompt_eval_duration"], 250000000);
    EXPECT_EQ(message["eval_duration"], 500000000);
    std::string thinking, content;
    Json calls = Json::array();
    ASSERT_GE(objects.size(), 2u);
    for (size_t i = 0; i < objects.size(); ++i) {
      const Json& ob = objects[i];
      EXPECT_EQ(ob["done"], i + 1 == objects.size());
      EXPECT_EQ(ob["message"]["role"], "assistant");
      thinking += ob["message"].value("thinking", "");
      content += ob["message"]["content"].get<std::string>();
      for (const Json& c : ob["message"].value("tool_calls", Json::array())) calls.push_back(c);
    }
    EXPECT_EQ(thinking, "Let me look.");
    EXPECT_EQ(content, "Checking.");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["function"], message["message"]["tool_calls"][0]["function"]);
    EXPECT_EQ(objects.back()["done_reason"], "stop");
    EXPECT_EQ(objects.back()["message"], (Json{{"role", "assistant"}, {"content", ""}}));
  }
}

TEST(OllamaOutput, RawGenerateAndLength) {
  std::mt19937 rng(1);
  OllamaOutputOptions o;
  o.model = "m";
  o.chat = false;
  o.parse = false;
  auto [objects, response] = run_output("a</think>b <tool_call>", o, rng);
  EXPECT_EQ(response["response"], "a</think>b <tool_call>");  // raw: as generated
  EXPECT_FALSE(response.contains("thinking"));
  EXPECT_FALSE(response.contains("message"));
  OllamaOutput out(o);
  GenerationResult r;
  r.finish = FinishReason::length;
  EXPECT_EQ(out.response(r)["done_reason"], "length");
  EXPECT_EQ(ResponseProtocol<OllamaOutput>::stream_event(Json{{"a", "x\ny"}}), "{\"a\":\"x\\ny\"}\n");
}

}  // namespace
}  // namespace tern::server
