// The Anthropic Messages translation: request bodies -> the internal chat request (every bad field a 400 naming
// it), and the model's text -> content blocks and the stream's event sequence, whatever the text's split.
#include <gtest/gtest.h>

#include <random>

#include "../api_test_util.h"
#include "server/anthropic/anthropic_output.h"
#include "server/anthropic/anthropic_schema.h"

namespace tern::server {
namespace {

ParseOptions options() {
  ParseOptions o;
  o.model_id = "org/model";
  o.model_aliases = {"alias"};
  o.vocab_size = 1000;
  return o;
}

AnthropicRequest ok(const std::string& body, AnthropicEndpoint endpoint = AnthropicEndpoint::messages,
                    ParseOptions o = options()) {
  return expect_accepted(parse_anthropic_request(body, o, endpoint), body);
}

ApiError error(const std::string& body, AnthropicEndpoint endpoint = AnthropicEndpoint::messages,
               ParseOptions o = options()) {
  return expect_rejected(parse_anthropic_request(body, o, endpoint), body);
}

ParseOptions strict() {
  ParseOptions o = options();
  o.strict_model_name = true;
  return o;
}

const char* kTool = R"({"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}})";

TEST(AnthropicSchema, TranslatesAConversationWithToolUse) {
  const std::string body = std::string(R"({"model":"org/model","max_tokens":64,"system":[{"type":"text","text":"A"},
      {"type":"text","text":"B"}],"tools":[)") + kTool + R"(],"messages":[
      {"role":"user","content":"weather?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"ok"},
        {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"18C"}]},
        {"type":"text","text":"thanks"}]}],"stop_sequences":["X"],"temperature":0.5,"top_k":5,"stream":true})";
  const AnthropicRequest r = ok(body);
  const Json& m = r.chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], (Json{{"role", "system"}, {"content", "A\nB"}}));
  EXPECT_EQ(m[1]["role"], "user");
  EXPECT_EQ(m[2]["content"], "ok");
  EXPECT_EQ(m[2]["reasoning_content"], "hm");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], (Json{{"city", "Paris"}}));
  EXPECT_EQ(m[3], (Json{{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "18C"}}));
  EXPECT_EQ(m[4], (Json{{"role", "user"}, {"content", "thanks"}}));
  EXPECT_TRUE(r.chat.continue_final_message);  // a last assistant message would be a prefill
  EXPECT_EQ(r.chat.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_EQ(r.max_tokens, 64);
  EXPECT_EQ(r.chat.stop, std::vector<std::string>{"X"});
  EXPECT_EQ(*r.chat.sampling.temperature, 0.5f);
  EXPECT_EQ(*r.chat.sampling.top_k, 5);
  EXPECT_TRUE(r.chat.stream);
  EXPECT_EQ(r.chat.tool_choice, ToolChoice::tool_choice_auto);
  EXPECT_EQ(r.chat.grammar, nullptr);
}

TEST(AnthropicSchema, ToolChoiceAndThinking) {
  const std::string tools = std::string(R"("tools":[)") + kTool + "]";
  AnthropicRequest r = ok(R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],)" + tools +
                          R"(,"tool_choice":{"type":"any","disable_parallel_tool_use":true}})");
  EXPECT_EQ(r.chat.tool_choice, ToolChoice::tool_choice_required);
  EXPECT_FALSE(r.chat.parallel_tool_calls);
  EXPECT_NE(r.chat.grammar, nullptr);  // the forced call is constrained
  r = ok(R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],)" + tools + R"(,"tool_choice":{"type":"none"}})");
  EXPECT_TRUE(r.chat.tools.empty());
  r = ok(R"({"messages":[{"role":"user","content":"x"}],)" + tools + R"(,"tool_choice":{"type":"any"}})",
         AnthropicEndpoint::count_tokens);
  EXPECT_EQ(r.chat.grammar, nullptr);  // counting compiles nothing
  r = ok(R"({"max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(r.chat.chat_template_kwargs["enable_thinking"], true);
  EXPECT_EQ(*r.thinking_budget, 1024);
  r = ok(R"({"max_tokens":8,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(r.chat.chat_template_kwargs["enable_thinking"], false);
  r = ok(R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}]})");  // no thinking field: no thinking
  EXPECT_EQ(r.chat.chat_template_kwargs["enable_thinking"], false);
  EXPECT_FALSE(r.thinking_budget.has_value());
  r = ok(R"({"max_tokens":8,"model":"alias","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(r.chat.model, "org/model");
}

TEST(AnthropicSchema, BadBodiesNameTheField) {
  struct Case {
    std::string body, param, words;
  };
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  const Case cases[] = {
      {"{" + m + "}", "max_tokens", "required"},
      {R"({"max_tokens":-1,)" + m + "}", "max_tokens", "[1,"},
      {R"({"max_tokens":1.5,)" + m + "}", "max_tokens", "integer"},
      {R"({"max_tokens":8})", "messages", "required"},
      {R"({"max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"image","source":{}}]}]})",
       "messages[0].content[0]", "images are read in user messages"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
       "messages[0].content[0].source.type", "base64"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"a*b"}}]}]})",
       "messages[0].content[0].source.data", "not valid base64"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"text/plain","data":"aGk="}}]}]})",
       "messages[0].content[0].source.media_type", "not an image"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"document"}]}]})", "messages[0].content[0]",
       "document"},
      {R"({"max_tokens":8,"messages":[{"role":"tool","content":"x"}]})", "messages[0].role", "user"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_use","name":"f","input":{}}]}]})",
       "messages[0].content[0]", "assistant"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]})",
       "messages[0].content[0].tool_use_id", "tool_use"},
      {R"({"max_tokens":8,"temperature":1.5,)" + m + "}", "temperature", "[0, 1]"},
      {R"({"max_tokens":8,"top_p":0,)" + m + "}", "top_p", "(0"},
      {R"({"max_tokens":8,"stop_sequences":[""],)" + m + "}", "stop_sequences", "non-empty"},
      {R"({"max_tokens":8,"tools":[{"name":"f"}],)" + m + "}", "tools[0].input_schema", "schema"},
      {R"({"max_tokens":8,"tools":[{"type":"web_search_20250305","name":"web_search"}],)" + m + "}", "tools[0].type",
       "server tools"},
      {R"({"max_tokens":8,"tool_choice":{"type":"sometimes"},)" + m + "}", "tool_choice.type", "auto, any"},
      {R"({"max_tokens":8,"tool_choice":{"type":"any"},)" + m + "}", "tool_choice", "'tools' is empty"},
      {R"({"max_tokens":8,"thinking":{"type":"enabled","budget_tokens":9},)" + m + "}", "thinking.budget_tokens",
       "less than"},
      {R"({"max_tokens":8,"system":5,)" + m + "}", "system", "string"},
      {R"({"max_tokens":8,"tern_debug_forced_output":"x",)" + m + "}", "tern_debug_forced_output", "test-only"},
      {"[1]", "", "object"},
  };
  for (const Case& c : cases) {
    const ApiError e = error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.words), std::string::npos) << c.body << " -> " << e.message;
  }
  // Any model name is the served model (the name tools send by default), unless --strict-model-name.
  for (const char* name : {"claude-3-5-haiku-latest", "alias:latest"})
    EXPECT_EQ(ok(R"({"model":")" + std::string(name) + R"(","max_tokens":8,)" + m + "}").chat.model, "org/model");
  EXPECT_EQ(ok(R"({"model":"alias:latest","max_tokens":8,)" + m + "}", AnthropicEndpoint::messages, strict())
                .chat.model,
            "org/model");
  const ApiError e = error(R"({"model":"claude-x","max_tokens":8,)" + m + "}", AnthropicEndpoint::messages, strict());
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(anthropic_error_json(e)["error"]["type"], "not_found_error");
}

// Feeds `text` to a fresh output in random pieces; returns the stream events and the non-streamed response.
std::pair<std::vector<Json>, Json> run_output(const std::string& text, bool starts_in_reasoning, std::mt19937& rng) {
  AnthropicOutputOptions o;
  o.id = "msg_1";
  o.model = "m";
  o.prompt_tokens = 10;
  o.tools = Json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");
  o.starts_in_reasoning = starts_in_reasoning;
  AnthropicOutput streamed(o), whole(o);
  std::vector<Json> events = streamed.first_events();
  for (Json& ev : feed_in_pieces(streamed, whole, text, rng)) events.push_back(std::move(ev));
  GenerationResult r;
  r.prompt_tokens = 10;
  r.cached_tokens = 4;
  r.completion_tokens = 7;
  for (Json& ev : streamed.finish_chunks(r)) events.push_back(std::move(ev));
  return {events, whole.response(r)};
}

TEST(AnthropicOutput, BlocksAndEventsWhateverTheSplit) {
  std::mt19937 rng(std::random_device{}());
  const std::string text = "Let me look.</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
                           "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                           "</tool_call>";
  for (int trial = 0; trial < 20; ++trial) {
    auto [events, message] = run_output(text, /*starts_in_reasoning=*/true, rng);
    // The message.
    ASSERT_EQ(message["content"].size(), 3u) << message.dump();
    EXPECT_EQ(message["content"][0]["thinking"], "Let me look.");
    const std::string signature = message["content"][0]["signature"].get<std::string>();
    EXPECT_EQ(signature.rfind("tern-", 0), 0u) << signature;  // a digest of the text, the same however it streamed
    EXPECT_EQ(message["content"][1], (Json{{"type", "text"}, {"text", "Checking."}}));
    EXPECT_EQ(message["content"][2]["type"], "tool_use");
    EXPECT_EQ(message["content"][2]["input"], (Json{{"city", "Paris"}, {"days", 3}}));
    EXPECT_EQ(message["content"][2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
    EXPECT_EQ(message["stop_reason"], "tool_use");
    EXPECT_EQ(message["usage"], (Json{{"input_tokens", 6}, {"output_tokens", 7}, {"cache_creation_input_tokens", 0},
                                      {"cache_read_input_tokens", 4}}));
    // The events rebuild the same blocks, each opened, filled and closed in order.
    ASSERT_GE(events.size(), 6u);
    EXPECT_EQ(events[0]["type"], "message_start");
    EXPECT_EQ(events[1]["type"], "ping");
    EXPECT_EQ(events[events.size() - 2]["type"], "message_delta");
    EXPECT_EQ(events[events.size() - 2]["delta"]["stop_reason"], "tool_use");
    EXPECT_EQ(events.back()["type"], "message_stop");
    Json blocks = Json::array();
    std::string json_input;
    int open = -1;
    for (size_t i = 2; i + 2 < events.size(); ++i) {
      const Json& ev = events[i];
      if (ev["type"] == "content_block_start") {
        ASSERT_EQ(open, -1);
        open = ev["index"].get<int>();
        ASSERT_EQ(size_t(open), blocks.size());
        blocks.push_back(ev["content_block"]);
      } else if (ev["type"] == "content_block_delta") {
        ASSERT_EQ(ev["index"].get<int>(), open);
        const Json& d = ev["delta"];
        if (d["type"] == "signature_delta") {  // once, right before the thinking block's end
          ASSERT_EQ(blocks[open]["signature"], "");
          blocks[open]["signature"] = d["signature"];
          ASSERT_EQ(events[i + 1]["type"], "content_block_stop");
        } else if (d["type"] == "thinking_delta") blocks[open]["thinking"] = blocks[open]["thinking"].get<std::string>() + d["thinking"].get<std::string>();
        else if (d["type"] == "text_delta") blocks[open]["text"] = blocks[open]["text"].get<std::string>() + d["text"].get<std::string>();
        else json_input += d["partial_json"].get<std::string>();
      } else {
        ASSERT_EQ(ev["type"], "content_block_stop");
        ASSERT_EQ(ev["index"].get<int>(), open);
        open = -1;
      }
    }
    EXPECT_EQ(open, -1);
    ASSERT_EQ(blocks.size(), 3u);
    blocks[2]["input"] = Json::parse(json_input);
    for (Json* b : {&blocks[2], &message["content"][2]}) b->erase("id");  // each output draws its own ids
    EXPECT_EQ(blocks, message["content"]);
  }
}

TEST(AnthropicOutput, PlainTextAndStopReasons) {
  std::mt19937 rng(1);
  auto [events, message] = run_output("Just words.", /*starts_in_reasoning=*/false, rng);
  EXPECT_EQ(message["content"], Json::parse(R"([{"type":"text","text":"Just words."}])"));
  EXPECT_EQ(message["stop_reason"], "end_turn");
  AnthropicOutput out(AnthropicOutputOptions{});
  GenerationResult r;
  r.finish = FinishReason::length;
  EXPECT_EQ(out.response(r)["stop_reason"], "max_tokens");
  AnthropicOutput out2(AnthropicOutputOptions{});
  r.finish = FinishReason::stop;
  r.stop_string = "END";
  const Json m = out2.response(r);
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "END");
  EXPECT_EQ(m["content"], Json::array());
}

TEST(AnthropicOutput, ErrorShapes) {
  ApiError e = api_error_invalid("x", "bad");
  EXPECT_EQ(anthropic_error_json(e), Json::parse(R"({"type":"error","error":{"type":"invalid_request_error","message":"bad"}})"));
  for (auto [status, type] : std::vector<std::pair<int, const char*>>{{401, "authentication_error"},
                                                                     {403, "permission_error"},
                                                                     {413, "request_too_large"},
                                                                     {503, "overloaded_error"},
                                                                     {500, "api_error"}}) {
    e.status = status;
    EXPECT_EQ(anthropic_error_json(e)["error"]["type"], type);
  }
  EXPECT_EQ(ResponseProtocol<AnthropicOutput>::stream_event(Json{{"type", "ping"}}), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
  EXPECT_EQ(ResponseProtocol<AnthropicOutput>::stream_end(), "");
}

}  // namespace
}  // namespace tern::server
