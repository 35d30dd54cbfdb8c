// OpenAI request bodies (/v1/chat/completions, /v1/completions) -> validated internal structs: the chat request
// that every API is translated to (serving/chat_request.h), and the completion request. Every check names the
// parameter and the allowed range; nothing here throws to the caller: a bad body yields an ApiError (400, or 404
// for an unknown model).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/http/errors.h"
#include "server/serving/chat_request.h"

namespace tern::server {

struct CompletionRequest {
  std::string model;
  std::string prompt_text;             // when the prompt was text
  std::vector<int32_t> prompt_ids;     // when the prompt was token ids
  bool prompt_is_ids = false;
  bool stream = false;
  bool include_usage = false;
  bool return_progress = false;        // llama.cpp's: a stream first reports the queue and the prompt's reading
  int64_t max_tokens = 16;             // OpenAI's default for this endpoint
  SamplingOverrides sampling;
  std::vector<std::string> stop;
  int logprobs = -1;                   // -1: off; 0..20 alternatives
  bool echo = false;
  std::optional<int64_t> truncate_prompt_tokens;  // vLLM's: keep only the prompt's last N tokens (N >= 1)
  std::optional<std::string> forced_output;
};

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body, const ParseOptions& options);
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, const ParseOptions& options);

}  // namespace tern::server
