// Anthropic Messages request bodies (POST /v1/messages, /v1/messages/count_tokens) -> the internal chat request.
//
// The translation, so that the chat template, the engine and the output parser serve both APIs alike:
//   system (string or text blocks)          -> a leading system message
//   user text blocks                        -> the user message's content
//   user tool_result blocks                 -> one "tool" message each (before the user's text, in order)
//   assistant text / thinking / tool_use    -> content / reasoning_content / tool_calls (input as the arguments)
//   tools[{name, description, input_schema}] -> OpenAI function tools (parameters = input_schema)
//   tool_choice auto | any | tool | none    -> auto | required | named | none; disable_parallel_tool_use -> one call
//   thinking enabled | adaptive | disabled  -> the template's enable_thinking true | true | false
//   stop_sequences                          -> stop strings (stop_reason "stop_sequence" names the one that matched)
// Image and document blocks are a 400. Nothing here throws to the caller: a bad body yields an ApiError.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "server/http/errors.h"
#include "server/serving/chat_request.h"

namespace tern::server {

struct AnthropicRequest {
  ChatRequest chat;               // messages, tools, tool_choice, sampling, stop, template kwargs, stream, forced
  int64_t max_tokens = 0;         // required by /v1/messages (>= 1); 0 for count_tokens
  std::optional<int64_t> thinking_budget;  // thinking.budget_tokens: reasoning tokens before </think> is forced
};

enum class AnthropicEndpoint { messages, count_tokens };

// options.model_id / model_aliases: a request naming another model gets 404 (not_found_error).
std::variant<AnthropicRequest, ApiError> parse_anthropic_request(std::string_view body, const ParseOptions& options,
                                                                 AnthropicEndpoint endpoint);

}  // namespace tern::server
