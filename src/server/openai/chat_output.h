// /v1/chat/completions: the model's text turned into an OpenAI message or stream deltas: reasoning (before
// </think>) -> reasoning_content, <tool_call> XML -> tool_calls (incremental deltas when streaming), the rest ->
// content. (The prompt comes from serving/chat_prompt.h, as for every chat API.)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "server/openai/openai_response.h"
#include "server/openai/openai_schema.h"
#include "text/output_parser.h"

namespace tern {
class Tokenizer;
}  // namespace tern

namespace tern::server {

class ChatOutput {
 public:
  ChatOutput(const ChatRequest& request, const Tokenizer& tokenizer, ResponseMeta meta, bool starts_in_reasoning);
  ~ChatOutput();

  // The first stream chunk: {"delta":{"role":"assistant","content":""}}.
  Json first_chunk() const;
  // Stream chunks for one token event (often none: text held back by the parser).
  std::vector<Json> on_token(const TokenEvent& event);
  // A progress event's stream chunk (return_progress; none without): an empty delta and "prompt_progress", as
  // llama.cpp streams it (the choice keeps the chunk one that OpenAI's clients parse).
  std::vector<Json> progress_chunks(const TaskProgress& progress) const;
  // The last stream chunks: what the parser still held, the finish_reason, then usage (include_usage).
  std::vector<Json> finish_chunks(const GenerationResult& result);
  // The non-streamed response (call after every on_token; finish_chunks is not needed).
  Json response(const GenerationResult& result);

 private:
  // Adds the parser's output to the message; returns it as a stream delta object (empty when nothing new).
  Json absorb(const ParsedDelta& delta);
  Json chunk(Json delta, const Json& finish_reason);
  const char* finish_reason(const GenerationResult& result) const;

  const ChatRequest& request_;
  const Tokenizer& tokenizer_;
  ResponseMeta meta_;
  std::unique_ptr<OutputParser> parser_;
  bool parse_tools_ = true;           // false without tools (or tool_choice none): calls stay content
  bool finished_ = false;
  // The whole message so far.
  std::string reasoning_, content_;
  Json tool_calls_ = Json::array();   // complete calls: {"id","type","function":{"name","arguments"}}
  int dropped_calls_ = 0;             // calls beyond the first with parallel_tool_calls false
  Json logprobs_ = Json::array();     // every token's entry (non-stream response)
  Json pending_logprobs_ = Json::array();  // entries not yet sent in a chunk
};

}  // namespace tern::server
