// The chat prompt every chat API (OpenAI's chat completions and Responses, Anthropic Messages, Ollama) builds from
// its chat request: the request's messages and tools rendered through the model's chat template, then tokenized,
// with the prefix cache's checkpoint and the thinking budget that go with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/generator.h"
#include "server/http/errors.h"
#include "server/serving/chat_request.h"

namespace tern {
class ChatTemplate;
class Tokenizer;
}  // namespace tern

namespace tern::server {

struct ServerState;

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
// become a 400 that quotes the template's message. With request.continue_final_message, a last assistant message
// is the start of the reply (prefill): the prompt is the template's rendering of that turn, cut where the message's
// text ends (its content, or its reasoning_content when the content is empty: the model continues its thought);
// one with tool calls, or content with a constrained reply (request.grammar), is a 400; one with no text is dropped. escape_special: the texts of the tokenizer's special tokens
// to treat as text where the request wrote them (empty: none escaped, --allow-special-in-content).
std::variant<ChatPrompt, ApiError> chat_render_prompt(const ChatRequest& request, const ChatTemplate& chat_template,
                                                      const std::vector<std::string>& escape_special = {});

// The prompt's tokens: the template's text with its special tokens, each placeholder as its token's text.
std::vector<int32_t> chat_prompt_tokens(const ChatPrompt& prompt, const Tokenizer& tokenizer);

// True when `prompt` ends inside a thinking block: its last <think> comes after its last </think>.
bool prompt_ends_in_reasoning(const std::string& prompt);

// Where the prefix cache should also snapshot a chat prompt: where its generation prompt starts (the last
// <|im_start|>). The next turn renders this turn's reply as history, which may differ from what was generated
// (thinking dropped), but everything before that point stays the same.
std::vector<int64_t> chat_prompt_checkpoints(const std::vector<int32_t>& prompt, const Tokenizer& tokenizer);

// What a chat prompt that may open the reasoning sets on its request: starts_in_reasoning; the tokens of the output
// constraint's start marker (GenerationRequest::grammar_start_tokens), when it has one, so that a constrained answer
// is never lost to an end id inside the reasoning; and a thinking budget (thinking_budget, Anthropic's
// thinking.budget_tokens; else the server's --thinking-budget): when the prompt ends inside <think>, at most that many
// reasoning tokens, then a short closing note and "</think>\n\n" are forced (GenerationRequest::thinking_budget);
// no budget without one.
void set_reasoning_controls(const ServerState& state, GenerationRequest& request, std::optional<int64_t> budget,
                         bool starts_in_reasoning);

}  // namespace tern::server
