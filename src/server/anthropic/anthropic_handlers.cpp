// POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API over the same machinery as
// /v1/chat/completions. The body is translated into the internal chat request (anthropic_schema.h), rendered
// through the chat template and tokenized exactly as a chat completion is, queued to the engine loop with the same
// prefix-cache checkpoints, and answered through serve_output (serving/generation.h: the queueing,
// streaming and cancellation of every generation route) with AnthropicOutput shaping the message and its events.
// Every error has Anthropic's shape: {"type":"error","error":{"type","message"}}.
#include "server/anthropic/anthropic_handlers.h"

#include <cstdio>

#include "core/check.h"
#include "server/anthropic/anthropic_output.h"
#include "server/anthropic/anthropic_schema.h"
#include "server/serving/chat_prompt.h"
#include "server/serving/generation.h"
#include "server/serving/prompt_images.h"
#include "server/serving/output_common.h"
#include "server/serving/server_state.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

struct RenderedPrompt {
  std::vector<int32_t> tokens;
  std::vector<PromptImage> images;
  bool starts_in_reasoning = false;
};

// The request's prompt as the chat template renders it, tokenized as /v1/chat/completions does (special tokens
// typed in content stay text unless --allow-special-in-content), its images' tokens in place (their pixels
// processed when `process_images`; a count needs only their sizes). Image URLs are fetched first (with
// --allow-image-urls), into `chat`'s images.
std::variant<RenderedPrompt, ApiError> render_prompt(const ServerState& state, ChatRequest& chat,
                                                     bool process_images) {
  if (auto e = request_images_fetch(state, chat.images)) return *e;
  static const std::vector<std::string> kNone;
  auto prompt = chat_render_prompt(chat, *state.model.chat_template,
                                   state.options.allow_special_in_content ? kNone : state.special_tokens);
  if (auto* e = std::get_if<ApiError>(&prompt)) return *e;
  const ChatPrompt& p = std::get<ChatPrompt>(prompt);
  if (auto e = check_prompt_bytes(state, p.text.size(), "messages")) return *e;
  RenderedPrompt out;
  out.starts_in_reasoning = p.starts_in_reasoning;
  try {
    out.tokens = chat_prompt_tokens(p, *state.model.tokenizer);
  } catch (const Error& e) {
    return api_error_invalid("messages", strip_error_location(e.what()));
  }
  if (auto e = prompt_images_attach(state, chat.images, out.tokens, process_images ? &out.images : nullptr)) return *e;
  return out;
}

}  // namespace

void handle_anthropic_messages(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/messages";
  if (!model_ready(state, res, respond_anthropic_error)) return;
  auto parsed = parse_anthropic_request(req.body, parse_options(state), AnthropicEndpoint::messages);
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_anthropic_error(res, *e);
  AnthropicRequest& request = std::get<AnthropicRequest>(parsed);
  ChatRequest& chat = request.chat;

  auto sampling = sampling_params(state, chat.sampling, -1);
  if (auto* e = std::get_if<ApiError>(&sampling)) return respond_anthropic_error(res, *e);
  auto rendered = render_prompt(state, chat, /*process_images=*/true);
  if (auto* e = std::get_if<ApiError>(&rendered)) return respond_anthropic_error(res, *e);
  RenderedPrompt& prompt = std::get<RenderedPrompt>(rendered);

  auto task = std::make_shared<GenerationTask>();
  task->id = response_id("msg_");
  if (chat.forced_output) {
    try {
      task->request.forced_tokens = state.model.tokenizer->encode(*chat.forced_output);
    } catch (const Error& e) {
      return respond_anthropic_error(res, api_error_invalid("tern_debug_forced_output", strip_error_location(e.what())));
    }
  }
  if (auto e = check_context(state, prompt.tokens.size())) return respond_anthropic_error(res, *e);
  task->request.checkpoint_at = chat_prompt_checkpoints(prompt.tokens, *state.model.tokenizer);
  task->request.sampling = std::get<SamplingParams>(sampling);
  task->request.max_tokens = request.max_tokens;
  task->request.stop = chat.stop;
  // A forced tool call (tool_choice any / tool) is constrained after the reasoning, when the prompt opened <think>.
  task->request.grammar = chat.grammar;
  if (chat.grammar && prompt.starts_in_reasoning) task->request.grammar_start_after = "</think>";
  set_reasoning_controls(state, task->request, request.thinking_budget, prompt.starts_in_reasoning);

  AnthropicOutputOptions o;
  o.id = task->id;
  o.model = state.model.model_id;
  o.prompt_tokens = int64_t(prompt.tokens.size());
  o.tools = chat.tools;
  o.parallel_tool_calls = chat.parallel_tool_calls;
  o.starts_in_reasoning = prompt.starts_in_reasoning;
  task->request.prompt = std::move(prompt.tokens);
  task->request.images = std::move(prompt.images);
  serve_output(state, req, res, std::move(task), std::make_unique<AnthropicOutput>(std::move(o)),
                           chat.stream);
}

void handle_anthropic_count_tokens(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/messages/count_tokens";
  if (!model_ready(state, res, respond_anthropic_error)) return;
  auto parsed = parse_anthropic_request(req.body, parse_options(state), AnthropicEndpoint::count_tokens);
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_anthropic_error(res, *e);
  auto rendered = render_prompt(state, std::get<AnthropicRequest>(parsed).chat, /*process_images=*/false);
  if (auto* e = std::get_if<ApiError>(&rendered)) return respond_anthropic_error(res, *e);
  respond_json(res, Json{{"input_tokens", std::get<RenderedPrompt>(rendered).tokens.size()}});
}

}  // namespace tern::server
