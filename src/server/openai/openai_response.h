// Pieces shared by the chat and completion responses (usage, log-probabilities, ids), and the whole
// /v1/completions output: the final JSON and the stream chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "server/openai/openai_schema.h"
#include "server/serving/output_common.h"

namespace tern {
class Tokenizer;
}

namespace tern::server {

struct ResponseMeta {
  std::string id;        // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;   // Unix seconds
  std::string model;
};

// {"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details":{"cached_tokens"},
//  "completion_tokens_details":{"reasoning_tokens"}} (reasoning: the tokens inside an open <think> block)
Json usage_json(const GenerationResult& result);
// "stop" / "length" (the context limit is "length" too, as in OpenAI and vLLM).
const char* finish_reason_text(FinishReason reason);

// Chat log-probability entry of one token: {"token","logprob","bytes","top_logprobs":[...]}.
Json chat_logprob_entry(const Tokenizer& tokenizer, const TokenEvent& event);
// A token's text for JSON (invalid UTF-8 replaced) and its raw bytes.
std::string token_text(const Tokenizer& tokenizer, int32_t id);

// /v1/completions output. Feed every token event, then finish().
class CompletionOutput {
 public:
  CompletionOutput(const CompletionRequest& request, const Tokenizer& tokenizer, ResponseMeta meta,
                   std::string echo_text);
  // Stream chunks for this token (none when it added no text and carries no log-probabilities).
  std::vector<Json> on_token(const TokenEvent& event);
  // The last stream chunks: finish_reason, then usage (include_usage).
  std::vector<Json> finish_chunks(const GenerationResult& result);
  // The non-streamed response.
  Json response(const GenerationResult& result) const;

 private:
  Json chunk(const std::string& text, const Json& logprobs, const Json& finish_reason) const;
  Json logprobs_of(const std::vector<TokenEvent>& events, size_t text_offset) const;

  const CompletionRequest& request_;
  const Tokenizer& tokenizer_;
  ResponseMeta meta_;
  std::string echo_text_;
  std::string text_;                  // generated text so far
  std::vector<TokenEvent> events_;    // kept only when logprobs are asked for
  bool echo_sent_ = false;
};

}  // namespace tern::server
