// The chat request every API is translated to (OpenAI's chat completions, OpenAI Responses, Anthropic Messages,
// Ollama): the messages and tools the chat template renders, the sampling, stop and length settings, and the
// output constraint. Each API's parser (its <api>_schema.h) fills it from a body; the serving code (chat_prompt.h,
// generation.h) renders, tokenizes and queues it alike for every API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "server/http/json.h"

namespace tern::server {

// Sampling values the request set; unset ones take the model's generation_config defaults.
struct SamplingOverrides {
  std::optional<float> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::unordered_map<int32_t, float> logit_bias;
};

enum class ToolChoice { tool_choice_auto, tool_choice_none, tool_choice_required, tool_choice_named };
enum class ResponseFormat { text, json_object, json_schema };

// An image a request carries, as its API's parser found it (serving/request_images.h); serving/prompt_images.h
// decodes it and turns it into the prompt's image tokens.
struct RequestImage {
  std::string param;  // where it is in the body, for errors: "messages[1].content[0].image_url"
  std::string bytes;  // the image file's bytes (base64-decoded from a data: URL or a base64 field, or fetched)
  std::string url;    // or the http(s) URL the request gave: refused, or fetched into `bytes` with
                      // --allow-image-urls (serving/prompt_images.h: request_images_fetch)
};

struct ChatRequest {
  std::string model;
  Json messages = Json::array();   // normalised: content as a string (an array of text and {"type": "image"} parts
                                   // when the message holds images), developer -> system, tool-call arguments
                                   // as objects, reasoning -> reasoning_content
  // The images, in the order the chat template meets their {"type": "image"} parts (message by message, part by
  // part): each becomes one <|image_pad|> run of the prompt.
  std::vector<RequestImage> images;
  Json tools = Json::array();      // the tools to render (empty for tool_choice none; only the named one)
  ToolChoice tool_choice = ToolChoice::tool_choice_auto;
  std::string tool_choice_name;    // tool_choice_named
  bool parallel_tool_calls = true; // false: only the first call of a turn is returned
  // A last assistant message is continued (prefill: its text is the start of the reply, which holds only what the
  // model adds), not closed with a new turn after it; see chat_render_prompt. Chat completions, Anthropic, Ollama.
  bool continue_final_message = false;
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
  bool return_progress = false;    // llama.cpp's: a streamed answer first reports the queue and the prompt's reading
  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens
  SamplingOverrides sampling;
  std::vector<std::string> stop;   // non-empty strings, at most 4
  bool logprobs = false;
  int top_logprobs = 0;            // 0..20, only with logprobs
  Json chat_template_kwargs = Json::object();  // enable_thinking, preserve_thinking, ... (reasoning_effort folded in)
  std::optional<int64_t> thinking_budget;      // thinking_budget (tern): reasoning tokens before </think> is forced
  std::optional<int64_t> truncate_prompt_tokens;  // vLLM's: keep only the prompt's last N tokens (N >= 1)
  std::optional<std::string> forced_output;    // tern_debug_forced_output (only when the server allows it)
  std::optional<std::string> prediction;       // Predicted Outputs: the expected reply (drafts; tern serve
                                               // --speculative), OpenAI's prediction.content
  ResponseFormat response_format = ResponseFormat::text;
  std::string response_schema_name;            // json_schema: json_schema.name
  // The output constraint (src/grammar), compiled while parsing: tool_choice required or named -> the tool-call
  // grammar of the shown tools (exactly one call with parallel_tool_calls false); else response_format
  // json_object / json_schema -> one JSON value. Null: free text. A forced tool call takes precedence over
  // response_format (the turn's output is then the call).
  grammar::GrammarPtr grammar;
};

struct ParseOptions {
  std::string model_id;                // the name answers give; requests may name any model (see strict_model_name)
  std::vector<std::string> model_aliases;  // tern serve --alias: other names for the model
  bool strict_model_name = false;      // --strict-model-name: requests naming another model (not an alias) get 404
  int64_t vocab_size = 0;              // token ids (logit_bias, prompt ids) must be below it
  bool allow_forced_output = false;    // --debug-allow-forced-output
  int max_json_depth = 64;             // deeper bodies are refused before parsing
};

}  // namespace tern::server
