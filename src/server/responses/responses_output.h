// The model's chat output as an OpenAI Responses object, and the stream events OpenAI sends for it:
//
//   response.created / response.in_progress   {response: {..., status: "in_progress", output: []}}
//   per output item, in the order the model wrote them (a new item whenever the kind changes):
//     reasoning:     output_item.added, content_part.added {part: reasoning_text}, reasoning_text.delta...,
//                    reasoning_text.done, content_part.done, output_item.done
//     message:       output_item.added, content_part.added {part: output_text}, output_text.delta...,
//                    output_text.done, content_part.done, output_item.done
//     function_call: output_item.added, function_call_arguments.delta (the whole arguments), ...arguments.done,
//                    output_item.done
//   response.completed | response.incomplete (max_output_tokens / the context) | response.failed (server stopping)
//
// Every event carries "type" and "sequence_number" (0, 1, ...) and goes on the wire as `event: TYPE` + `data:`,
// with no [DONE] terminator. The text comes through the same output parser as /v1/chat/completions (reasoning,
// content, <tool_call> XML); a function call is sent whole once the model closed it. The reasoning item holds the
// model's reasoning as `content` [{type: reasoning_text}] (it is the raw reasoning, not a summary: `summary` is []).
// usage.output_tokens_details.reasoning_tokens counts the tokens generated inside the open reasoning block, as chat's
// completion_tokens_details does (GenerationResult::reasoning_tokens: not </think>, not a budget's forced note).
//
// A thought that the thinking budget cut (the server forced its closing note and </think>) is a reasoning item with
// status "incomplete"; the response itself is "completed" when the answer that follows it ends normally, and
// "incomplete" (reason max_output_tokens) only when the output tokens or the context ran out.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "server/http/errors.h"
#include "server/http/json.h"
#include "server/serving/response_protocol.h"
#include "text/output_parser.h"

namespace tern::server {

struct ResponsesOutputOptions {
  Json response;                   // the response object's request echo: id, created_at, model, instructions,
                                   // tools, tool_choice, text, reasoning, sampling, ... (status/output/usage added)
  int64_t prompt_tokens = 0;
  Json tools = Json::array();      // the tools offered (chat shape, for typing arguments); empty: calls stay text
  bool parallel_tool_calls = true; // false: only the first call is returned
  bool starts_in_reasoning = false;  // the prompt ends inside <think>
  bool thinking_budget = false;      // a thinking budget applies (the server's --thinking-budget): it may cut the thought
};

class ResponsesOutput {
 public:
  explicit ResponsesOutput(ResponsesOutputOptions options);
  ~ResponsesOutput();

  // Stream events before any token: response.created, response.in_progress.
  std::vector<Json> first_events();
  // Stream events for one token (often none: text held back by the parser).
  std::vector<Json> on_token(const TokenEvent& event);
  // The last stream events: what the parser still held, the open item's done events, response.completed (or
  // response.incomplete / response.failed).
  std::vector<Json> finish_chunks(const GenerationResult& result);
  // An error after the stream started: the `error` event, then response.failed.
  std::vector<Json> error_events(const ApiError& error);
  // The non-streamed response (after every on_token).
  Json response(const GenerationResult& result);

 private:
  enum class Item { none, reasoning, message };
  void absorb(const ParsedDelta& delta, std::vector<Json>& events);
  void append_text(Item kind, const std::string& text, std::vector<Json>& events);
  void close_item(std::vector<Json>& events, const char* status);
  void finish_parser(std::vector<Json>& events);
  Json event(const char* type, Json fields);
  Json snapshot(const char* status) const;
  Json usage(const GenerationResult& result) const;
  const char* status_of(const GenerationResult& result) const;
  bool cut_by_budget(const std::string& reasoning) const;

  ResponsesOutputOptions options_;
  std::unique_ptr<OutputParser> parser_;
  bool finished_ = false;
  int64_t sequence_ = 0;           // the next event's sequence_number
  Json output_ = Json::array();    // the output items so far
  Item open_ = Item::none;         // the kind of output_.back() while it may still grow
  int function_calls_ = 0;
};

template <>
struct ResponseProtocol<ResponsesOutput> {
  static std::string stream_event(const Json& payload) { return sse_typed_event(payload); }  // event: <type>
  static std::string stream_end() { return ""; }
  // Used only where the output object is not at hand: {"type": "error", "code", "message", "param"}.
  static Json error_body(const ApiError& error);
  static void respond_error(httplib::Response& res, const ApiError& error) { server::respond_error(res, error); }
};

}  // namespace tern::server
