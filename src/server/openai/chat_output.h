// /v1/chat/completions: the prompt from the chat template, and the model's text turned into an OpenAI message or
// stream deltas: reasoning (before </think>) -> reasoning_content, <tool_call> XML -> tool_calls (incremental
// deltas when streaming), the rest -> content.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "engine/generator.h"
#include "server/openai/openai_response.h"
#include "server/openai/openai_schema.h"
#include "text/output_parser.h"

namespace tern {
class ChatTemplate;
class Tokenizer;
}  // namespace tern

namespace tern::server {

struct ChatPrompt {
  std::string text;                  // the rendered prompt; escaped special tokens appear as placeholders
  bool starts_in_reasoning = false;  // the prompt ends inside an open <think> block
  // Special tokens found in the request's strings (content, tool calls, tools, template kwargs) are replaced by
  // placeholder code points (plane-16 private use, placeholder_base + i for escaped[i]) before rendering, so
  // that the template's own special tokens are the only control tokens of the prompt.
  std::vector<std::string> escaped;
  uint32_t placeholder_base = 0;
};

// Renders the request's messages and tools. Template errors (a system message in the middle, no user query, ...)
// become a 400 that quotes the template's message. escape_special: the texts of the tokenizer's special tokens
// to treat as text where the request wrote them (empty: none escaped, --allow-special-in-content).
std::variant<ChatPrompt, ApiError> chat_render_prompt(const ChatRequest& request, const ChatTemplate& chat_template,
                                                      const std::vector<std::string>& escape_special = {});

// The prompt's tokens: the template's text with its special tokens, each placeholder as its token's text.
std::vector<int32_t> chat_prompt_tokens(const ChatPrompt& prompt, const Tokenizer& tokenizer);

// True when `prompt` ends inside a thinking block: its last <think> comes after its last </think>.
bool prompt_ends_in_reasoning(const std::string& prompt);

// A call written back as the model's XML (<tool_call><function=...><parameter=...>): used when the request offered
// no tools, so that the text stays text (OpenAI content, an Anthropic text block).
std::string tool_call_as_text(const ToolCall& call);

class ChatOutput {
 public:
  ChatOutput(const ChatRequest& request, const Tokenizer& tokenizer, ResponseMeta meta, bool starts_in_reasoning);
  ~ChatOutput();

  // The first stream chunk: {"delta":{"role":"assistant","content":""}}.
  Json first_chunk() const;
  // Stream chunks for one token event (often none: text held back by the parser).
  std::vector<Json> on_token(const TokenEvent& event);
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
