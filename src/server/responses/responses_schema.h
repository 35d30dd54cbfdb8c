// OpenAI Responses request bodies (POST /v1/responses) -> the internal chat request.
//
// The translation, so that the chat template, the engine and the output parser serve this API as they serve
// /v1/chat/completions:
//   instructions (+ leading system/developer items) -> one leading system message
//   input: a string                                 -> one user message
//   input items: message (user/system/developer/assistant; a string or input_text/output_text parts)
//                                                   -> a message (developer -> system)
//                reasoning / message(assistant) / function_call items in a row
//                                                   -> one assistant turn: reasoning_content, content, tool_calls
//                function_call_output               -> a "tool" message (call_id -> tool_call_id)
//   tools[{type: function, name, description, parameters}] -> OpenAI chat function tools
//   tool_choice auto | none | required | {type: function, name}, parallel_tool_calls -> the same as chat
//   text.format text | json_object | json_schema    -> response_format (constrained decoding, src/grammar)
//   reasoning.effort none | minimal                 -> the template's enable_thinking false; other levels true
//   max_output_tokens, temperature, top_p, stream    -> as chat
// The server is stateless: previous_response_id, conversation, stored prompts and item references are a 400, and
// background mode is refused. A field this API does not have is a 400 naming it (as OpenAI answers), so that a
// misspelt or Chat-Completions-only field (max_tokens) is not silently ignored. Nothing here throws to the caller:
// a bad body yields an ApiError.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "server/http/errors.h"
#include "server/serving/chat_request.h"

namespace tern::server {

struct ResponsesRequest {
  ChatRequest chat;                 // messages, tools, tool_choice, sampling, template kwargs, grammar, stream
  // Echoed in the response object as the request gave them (null when not given).
  Json instructions = nullptr;
  Json tools = Json::array();       // the function tools in Responses form
  Json tool_choice = "auto";
  Json text_format = Json{{"type", "text"}};
  Json reasoning = Json{{"effort", nullptr}, {"summary", nullptr}};
  Json metadata = Json::object();
  Json user = nullptr;
  bool store = false;               // accepted; nothing is stored (the echo says false)
  std::optional<int64_t> max_output_tokens;
};

// options.model_id / model_aliases: a request naming another model gets 404.
std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view body, const ParseOptions& options);

}  // namespace tern::server
