// Pieces shared by the chat and completion responses (usage, log-probabilities, ids), and the whole
// /v1/completions output: the final JSON and the stream chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "server/openai/openai_schema.h"
#include "server/serving/output_common.h"
#include "server/serving/request_queue.h"

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
//  "completion_tokens_details":{"reasoning_tokens", "accepted_prediction_tokens", "rejected_prediction_tokens"}}
//  (reasoning: the tokens inside an open <think> block; predictions: speculative decoding's drafts, from the
//  request's `prediction` and the server's n-gram drafter, confirmed by the model or not)
Json usage_json(const GenerationResult& result);
// "stop" / "length" (the context limit is "length" too, as in OpenAI and vLLM).
const char* finish_reason_text(FinishReason reason);

// A stream chunk's "prompt_progress" (return_progress), llama.cpp's object: {"total","cache","processed","time_ms"}
// (prompt tokens; cache: reused from the prefix cache, counted in processed too; time_ms: since the prompt's
// reading started). While the request waits in the queue, tern's form: processed, cache and time_ms 0, and
// "queued": true with "queued_ahead": the requests waiting before it (0: it starts next).
Json prompt_progress_json(const TaskProgress& progress);

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
  // A progress event's stream chunk (return_progress; none without): an empty text choice and "prompt_progress".
  std::vector<Json> progress_chunks(const TaskProgress& progress) const;
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
