// Ollama request bodies (POST /api/chat, /api/generate, /api/show) -> the internal chat request.
//
// The translation, so that the chat template, the engine and the output parser serve Ollama's API as they serve
// OpenAI's:
//   messages[{role, content, thinking, tool_calls, tool_name}] -> chat messages (thinking -> reasoning_content,
//                                           tool_calls[].function.arguments an object, tool_name -> the tool's name)
//   tools (OpenAI function tools)          -> tools (tool_choice auto: Ollama has no forced calls)
//   think true | false | "high"/"medium"/"low" -> the template's enable_thinking true | false | true
//   format "json" | {JSON Schema}          -> response_format json_object | json_schema (constrained decoding)
//   options {temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty, presence_penalty,
//            frequency_penalty, num_ctx}   -> sampling, max tokens (-1 / -2: no limit), stop strings; other
//                                             options are ignored, as Ollama ignores the ones a runner lacks
//   stream (default true), keep_alive (accepted, ignored)
// /api/generate: prompt (+ system) becomes one user turn rendered through the template, or with raw the prompt's
// tokens as they are. images and suffix are a 400. A missing model is a 400, another model's name a 404 in
// Ollama's words ("model 'x' not found"); names may carry ":latest". Nothing here throws to the caller.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "server/http/errors.h"
#include "server/serving/chat_request.h"

namespace tern::server {

enum class OllamaEndpoint { chat, generate };

struct OllamaRequest {
  OllamaEndpoint endpoint = OllamaEndpoint::chat;
  std::string model_name;            // echoed in responses: as the request wrote it (as Ollama does) when it is
                                     // the id or an alias (":latest" or not), else the served id
  ChatRequest chat;                  // messages, tools, sampling, stop, max_tokens, enable_thinking, grammar, stream
  bool raw = false;                  // generate: the prompt's tokens without the template
  std::string prompt;                // generate: the prompt (raw: the whole text)
  std::optional<int64_t> num_ctx;    // options.num_ctx: refused beyond the server's context
  bool load_only = false;            // no prompt / no messages: Ollama loads the model and answers done_reason "load"
};

std::variant<OllamaRequest, ApiError> parse_ollama_request(std::string_view body, const ParseOptions& options,
                                                           OllamaEndpoint endpoint);

// POST /api/show: the model named by "model" (or the older "name"); its name as written, or the error.
std::variant<std::string, ApiError> parse_ollama_show_request(std::string_view body, const ParseOptions& options);

}  // namespace tern::server
