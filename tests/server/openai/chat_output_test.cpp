// The chat response builder: reasoning, content and tool calls from text split anywhere; stream chunks add up to
// the non-streamed message.
#include <gtest/gtest.h>

#include <random>

#include "engine/model_source.h"
#include "server/openai/chat_output.h"
#include "text/tokenizer.h"

namespace tern::server {
namespace {

const Tokenizer& tokenizer() {
  static std::shared_ptr<const Tokenizer> t = demo_tokenizer();
  return *t;
}

ChatRequest request_with_tools(bool include_usage) {
  ChatRequest r;
  r.include_usage = include_usage;
  r.tools = Json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");
  return r;
}

const std::string kOutput =
    "Need weather.</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";

GenerationResult stopped_result() {
  GenerationResult r;
  r.finish = FinishReason::stop;
  r.prompt_tokens = 10;
  r.completion_tokens = 40;
  return r;
}

TEST(ChatOutput, StreamChunksAddUpToTheMessage) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    ChatRequest req = request_with_tools(true);
    ChatOutput streamed(req, tokenizer(), ResponseMeta{"chatcmpl-x", 1, "m"}, true);
    ChatOutput whole(req, tokenizer(), ResponseMeta{"chatcmpl-x", 1, "m"}, true);
    std::string reasoning, content;
    Json calls = Json::array();
    std::vector<Json> chunks = {streamed.first_chunk()};
    for (size_t at = 0; at < kOutput.size();) {  // random piece sizes, including splits inside tags
      const size_t n = std::min(kOutput.size() - at, size_t(1 + rng() % 7));
      TokenEvent e;
      e.id = 1;
      e.text = kOutput.substr(at, n);
      at += n;
      for (Json& c : streamed.on_token(e)) chunks.push_back(std::move(c));
      whole.on_token(e);
    }
    for (Json& c : streamed.finish_chunks(stopped_result())) chunks.push_back(std::move(c));
    ASSERT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
    for (size_t i = 1; i + 1 < chunks.size(); ++i) {
      const Json& d = chunks[i]["choices"][0]["delta"];
      EXPECT_TRUE(chunks[i]["usage"].is_null());
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const Json& c : d["tool_calls"]) calls.push_back(c);
    }
    EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], "tool_calls");
    const Json& usage_chunk = chunks.back();
    EXPECT_TRUE(usage_chunk["choices"].empty());
    EXPECT_EQ(usage_chunk["usage"]["total_tokens"], 50);

    const Json message = whole.response(stopped_result())["choices"][0]["message"];
    EXPECT_EQ(reasoning, "Need weather.");
    EXPECT_EQ(message["reasoning_content"], reasoning);
    EXPECT_EQ(content, "Checking.");
    EXPECT_EQ(message["content"], content);
    ASSERT_EQ(calls.size(), 2u);
    ASSERT_EQ(message["tool_calls"].size(), 2u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(calls[i]["index"], i);
      EXPECT_EQ(calls[i]["function"]["name"], "get_weather");
      EXPECT_EQ(message["tool_calls"][i]["function"]["name"], "get_weather");
    }
    EXPECT_EQ(Json::parse(calls[0]["function"]["arguments"].get<std::string>()), Json::parse(R"({"city":"Paris","days":3})"));
    EXPECT_EQ(Json::parse(message["tool_calls"][1]["function"]["arguments"].get<std::string>()),
              Json::parse(R"({"city":"Oslo"})"));
  }
}

TEST(ChatOutput, NoToolsKeepsCallTextAsContent) {
  ChatRequest req;
  ChatOutput out(req, tokenizer(), ResponseMeta{"chatcmpl-x", 1, "m"}, false);
  TokenEvent e;
  e.text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
  out.on_token(e);
  const Json r = out.response(stopped_result());
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(r["choices"][0]["message"]["content"].get<std::string>().find("<function=f>"), std::string::npos);
}

TEST(ChatOutput, LengthAndLogprobs) {
  ChatRequest req;
  req.logprobs = true;
  ChatOutput out(req, tokenizer(), ResponseMeta{"chatcmpl-x", 1, "m"}, false);
  TokenEvent e;
  e.id = tokenizer().encode("hello")[0];
  e.text = "hello";
  e.has_logprobs = true;
  e.logprob = -0.5f;
  e.top_logprobs = {{e.id, -0.5f}, {tokenizer().encode(" world")[0], -1.5f}};
  auto chunks = out.on_token(e);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["content"][0]["token"], "hello");
  GenerationResult r;
  r.finish = FinishReason::context;
  const Json resp = out.response(r);
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "length");
  const Json& lp = resp["choices"][0]["logprobs"]["content"][0];
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp["top_logprobs"][1]["token"], " world");
  EXPECT_EQ(lp["bytes"].size(), 5u);
}

TEST(CompletionOutput, EchoStreamAndUsage) {
  CompletionRequest req;
  req.echo = true;
  req.include_usage = true;
  CompletionOutput out(req, tokenizer(), ResponseMeta{"cmpl-x", 1, "m"}, "Hi");
  TokenEvent a, b;
  a.text = " there";
  b.text = "!";
  std::string streamed;
  for (const TokenEvent* e : {&a, &b})
    for (const Json& c : out.on_token(*e)) streamed += c["choices"][0]["text"].get<std::string>();
  GenerationResult r;
  r.finish = FinishReason::length;
  r.prompt_tokens = 1;
  r.completion_tokens = 2;
  auto last = out.finish_chunks(r);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last[1]["usage"]["completion_tokens"], 2);
  EXPECT_EQ(streamed, "Hi there!");
  EXPECT_EQ(out.response(r)["choices"][0]["text"], "Hi there!");
}

// return_progress: llama.cpp's prompt_progress on a chunk whose one choice has an empty delta (OpenAI's clients
// parse it as a chunk that adds nothing); tern's queued form adds queued and queued_ahead. Without the flag: none.
TEST(ChatOutput, ProgressChunksOnlyWhenAsked) {
  TaskProgress reading;
  reading.prompt = PromptProgress{.total = 31000, .cached = 2000, .processed = 12000, .elapsed_s = 1.2345};
  TaskProgress queued;
  queued.queued = true;
  queued.queued_ahead = 2;
  queued.prompt.total = 31000;

  ChatRequest plain;
  ChatOutput quiet(plain, tokenizer(), ResponseMeta{"chatcmpl-x", 1, "m"}, false);
  EXPECT_TRUE(quiet.progress_chunks(reading).empty());
  EXPECT_TRUE(quiet.progress_chunks(queued).empty());

  ChatRequest asked;
  asked.stream = asked.return_progress = asked.include_usage = true;
  ChatOutput out(asked, tokenizer(), ResponseMeta{"chatcmpl-x", 1, "m"}, false);
  std::vector<Json> chunks = out.progress_chunks(reading);
  ASSERT_EQ(chunks.size(), 1u);
  const Json& c = chunks[0];
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["id"], "chatcmpl-x");
  ASSERT_EQ(c["choices"].size(), 1u);
  EXPECT_EQ(c["choices"][0]["index"], 0);
  EXPECT_EQ(c["choices"][0]["delta"], Json::object());
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c["usage"].is_null());
  EXPECT_EQ(c["prompt_progress"], Json::parse(R"({"total":31000,"cache":2000,"processed":12000,"time_ms":1234})"));

  chunks = out.progress_chunks(queued);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["prompt_progress"],
            Json::parse(R"({"total":31000,"cache":0,"processed":0,"time_ms":0,"queued":true,"queued_ahead":2})"));
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], Json::object());
}

TEST(CompletionOutput, ProgressChunksOnlyWhenAsked) {
  TaskProgress reading;
  reading.prompt = PromptProgress{.total = 40, .cached = 0, .processed = 16, .elapsed_s = 0.05};
  CompletionRequest plain;
  const CompletionOutput quiet(plain, tokenizer(), ResponseMeta{"cmpl-x", 1, "m"}, "");
  EXPECT_TRUE(quiet.progress_chunks(reading).empty());
  CompletionRequest asked;
  asked.stream = asked.return_progress = true;
  CompletionOutput out(asked, tokenizer(), ResponseMeta{"cmpl-x", 1, "m"}, "");
  const std::vector<Json> chunks = out.progress_chunks(reading);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["object"], "text_completion");
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "");
  EXPECT_TRUE(chunks[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chunks[0]["prompt_progress"], Json::parse(R"({"total":40,"cache":0,"processed":16,"time_ms":50})"));
}

}  // namespace
}  // namespace tern::server
