// The model's chat output as an Anthropic Messages response: content blocks in the order the model wrote them
// (thinking, text, tool_use; a new block starts whenever the kind changes), stop_reason, usage; and the stream
// events Anthropic sends:
//
//   message_start  {message: {id, ..., content: [], usage: {input_tokens, output_tokens: 0}}}
//   ping
//   content_block_start {index, content_block: {type: thinking|text|tool_use, ...}}
//   content_block_delta {index, delta: thinking_delta | text_delta | input_json_delta}   (repeated)
//   content_block_stop  {index}
//   ... (more blocks)
//   message_delta  {delta: {stop_reason, stop_sequence}, usage: {input_tokens, output_tokens, cache_read_input_tokens}}
//   message_stop
//
// The text comes through the same output parser as /v1/chat/completions (reasoning, content, <tool_call> XML).
// A tool_use block is sent whole once the model closed its call: start, one input_json_delta with the complete
// arguments, stop. usage.input_tokens counts the prompt tokens that were computed and cache_read_input_tokens the
// ones resumed from the prefix cache (Anthropic's split: their sum is the prompt). message_start, sent before the
// engine ran, gives the whole prompt as input_tokens; message_delta corrects both.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "server/http/errors.h"
#include "server/http/json.h"
#include "server/serving/response_protocol.h"
#include "text/output_parser.h"

namespace tern::server {

struct AnthropicOutputOptions {
  std::string id;                  // "msg_..."
  std::string model;
  int64_t prompt_tokens = 0;
  Json tools = Json::array();      // the tools offered (OpenAI shape, for typing arguments); empty: calls stay text
  bool parallel_tool_calls = true; // false: only the first call is returned
  bool starts_in_reasoning = false;  // the prompt ends inside <think>
};

class AnthropicOutput {
 public:
  explicit AnthropicOutput(AnthropicOutputOptions options);
  ~AnthropicOutput();

  // Stream events before any token: message_start, ping.
  std::vector<Json> first_events() const;
  // Stream events for one token (often none: text held back by the parser).
  std::vector<Json> on_token(const TokenEvent& event);
  // The last stream events: what the parser still held, content_block_stop, message_delta, message_stop.
  std::vector<Json> finish_chunks(const GenerationResult& result);
  // The non-streamed response (after every on_token).
  Json response(const GenerationResult& result);

 private:
  enum class Block { none, thinking, text };
  void absorb(const ParsedDelta& delta, std::vector<Json>& events);
  void append_text(Block kind, const std::string& text, std::vector<Json>& events);
  void close_block(std::vector<Json>& events);
  Json stop_reason(const GenerationResult& result) const;
  Json usage(const GenerationResult& result) const;

  AnthropicOutputOptions options_;
  std::unique_ptr<OutputParser> parser_;
  bool finished_ = false;
  Json content_ = Json::array();   // the blocks so far (the non-streamed content)
  Block open_ = Block::none;       // the kind of content_.back() while it may still grow
  int tool_uses_ = 0;
};

// {"type":"error","error":{"type": invalid_request_error | authentication_error | permission_error |
// not_found_error | request_too_large | overloaded_error | api_error, "message": ...}} for an ApiError.
Json anthropic_error_json(const ApiError& error);
// Writes it as the response, with the error's status (and Retry-After).
void respond_anthropic_error(httplib::Response& res, const ApiError& error);

// A tool-call id in Anthropic's form: "call_HEX" -> "toolu_HEX".
std::string anthropic_tool_id(const std::string& call_id);

template <>
struct ResponseProtocol<AnthropicOutput> {
  static std::string stream_event(const Json& payload) { return sse_typed_event(payload); }  // event: <type>
  static std::string stream_end() { return ""; }
  static Json error_body(const ApiError& error) { return anthropic_error_json(error); }
  static void respond_error(httplib::Response& res, const ApiError& error) { respond_anthropic_error(res, error); }
};

}  // namespace tern::server
