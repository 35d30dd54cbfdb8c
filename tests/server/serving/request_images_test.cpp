// The four APIs' image forms, parsed into the chat request (ChatRequest::images in the order the template meets them,
// {"type": "image"} parts where they go in the content; text-only content stays a string), and the parsers' refusals.
#include <gtest/gtest.h>

#include "../api_test_util.h"
#include "server/anthropic/anthropic_schema.h"
#include "server/ollama/ollama_schema.h"
#include "server/openai/openai_schema.h"
#include "server/responses/responses_schema.h"
#include "server/serving/request_images.h"

namespace tern::server {
namespace {

ParseOptions options() {
  ParseOptions o;
  o.model_id = "m";
  o.vocab_size = 1000;
  return o;
}

const Json kImagePart = {{"type", "image"}};

std::vector<std::string> image_bytes(const ChatRequest& r) {
  std::vector<std::string> out;
  for (const RequestImage& im : r.images) out.push_back(im.bytes);
  return out;
}

TEST(RequestImages, OpenaiImageUrlParts) {
  const std::string body = R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[
      {"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/png;base64,aGk="}},
      {"type":"text","text":"b"},{"type":"text","text":"c"},{"type":"image_url","image_url":"data:;base64,eW8="}]},
      {"role":"assistant","content":"x"},{"role":"user","content":[{"type":"text","text":"plain"}]}]})";
  const ChatRequest r = expect_accepted(parse_chat_request(body, options()), body);
  EXPECT_EQ(image_bytes(r), (std::vector<std::string>{"hi", "yo"}));
  EXPECT_EQ(r.images[0].param, "messages[1].content[1].image_url.url");
  EXPECT_EQ(r.images[1].param, "messages[1].content[4].image_url");
  EXPECT_EQ(r.messages[1]["content"], Json::array({{{"type", "text"}, {"text", "a"}}, kImagePart,
                                                   {{"type", "text"}, {"text", "bc"}}, kImagePart}));
  EXPECT_EQ(r.messages[3]["content"], "plain");  // text parts alone: a string, as before
  const std::string remote = R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"HTTPS://x/a.png"}}]}]})";
  const ChatRequest u = expect_accepted(parse_chat_request(remote, options()), remote);
  ASSERT_EQ(u.images.size(), 1u);
  EXPECT_EQ(u.images[0].url, "HTTPS://x/a.png");  // kept for the server to fetch or refuse
  EXPECT_TRUE(u.images[0].bytes.empty());
  for (const char* bad : {
           R"({"messages":[{"role":"assistant","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,aGk="}}]}]})",
           R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
           R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,"}}]}]})",
           R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64;aGk="}}]}]})",
           R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,aGk=","detail":3}}]}]})",
       })
    EXPECT_EQ(expect_rejected(parse_chat_request(bad, options()), bad).status, 400) << bad;
}

TEST(RequestImages, ResponsesInputImage) {
  const std::string body = R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/webp;base64,aGk="},
      {"type":"input_text","text":"what?"}]}]})";
  const ResponsesRequest r = expect_accepted(parse_responses_request(body, options()), body);
  EXPECT_EQ(image_bytes(r.chat), (std::vector<std::string>{"hi"}));
  EXPECT_EQ(r.chat.images[0].param, "input[0].content[0].image_url");
  EXPECT_EQ(r.chat.messages[0]["content"], Json::array({kImagePart, {{"type", "text"}, {"text", "what?"}}}));
  const std::string file = R"({"input":[{"role":"user","content":[{"type":"input_image","file_id":"f1"}]}]})";
  EXPECT_EQ(expect_rejected(parse_responses_request(file, options()), file).param, "input[0].content[0].file_id");
  const std::string system = R"({"input":[{"role":"system","content":[{"type":"input_image","image_url":"data:;base64,aGk="}]}]})";
  EXPECT_EQ(expect_rejected(parse_responses_request(system, options()), system).param, "input[0].content[0]");
}

TEST(RequestImages, AnthropicImageBlocksInOrder) {
  // The tool result's image renders before the user's own (its tool message comes first).
  const std::string body = R"({"max_tokens":4,"messages":[{"role":"user","content":[
      {"type":"image","source":{"type":"base64","media_type":"image/png","data":"aGk="}},
      {"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","data":"eW8="}}]},
      {"type":"text","text":"look"}]}]})";
  const AnthropicRequest r = expect_accepted(parse_anthropic_request(body, options(), AnthropicEndpoint::messages), body);
  EXPECT_EQ(image_bytes(r.chat), (std::vector<std::string>{"yo", "hi"}));
  EXPECT_EQ(r.chat.images[0].param, "messages[0].content[1].content[0].source.data");
  ASSERT_EQ(r.chat.messages.size(), 2u);
  EXPECT_EQ(r.chat.messages[0]["role"], "tool");
  EXPECT_EQ(r.chat.messages[0]["content"], Json::array({kImagePart}));
  EXPECT_EQ(r.chat.messages[1]["content"], Json::array({kImagePart, {{"type", "text"}, {"text", "look"}}}));
  const std::string url = R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]})";
  const AnthropicRequest u = expect_accepted(parse_anthropic_request(url, options(), AnthropicEndpoint::messages), url);
  EXPECT_EQ(u.chat.images[0].url, "https://x/y.png");
}

TEST(RequestImages, OllamaImagesGoBeforeTheText) {
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"what?","images":["aGk=","eW8="]}]})";
  const OllamaRequest r = expect_accepted(parse_ollama_request(chat, options(), OllamaEndpoint::chat), chat);
  EXPECT_EQ(image_bytes(r.chat), (std::vector<std::string>{"hi", "yo"}));
  EXPECT_EQ(r.chat.images[1].param, "messages[0].images[1]");
  EXPECT_EQ(r.chat.messages[0]["content"], Json::array({kImagePart, kImagePart, {{"type", "text"}, {"text", "what?"}}}));
  const std::string gen = R"({"model":"m","prompt":"","images":["aGk="]})";
  const OllamaRequest g = expect_accepted(parse_ollama_request(gen, options(), OllamaEndpoint::generate), gen);
  EXPECT_FALSE(g.load_only);  // an image alone is a request
  EXPECT_EQ(g.chat.images[0].param, "images[0]");
  const std::string raw = R"({"model":"m","prompt":"x","raw":true,"images":["aGk="]})";
  EXPECT_EQ(expect_rejected(parse_ollama_request(raw, options(), OllamaEndpoint::generate), raw).param, "images");
}

TEST(RequestImages, MessageContentKeepsTextOnlyAString) {
  MessageContent c;
  c.add_text("a");
  c.add_text("b");
  EXPECT_EQ(c.json(), "ab");
  c.add_image();
  EXPECT_EQ(c.json(), Json::array({{{"type", "text"}, {"text", "ab"}}, kImagePart}));
  EXPECT_EQ(c.text(), "ab");
}

}  // namespace
}  // namespace tern::server
