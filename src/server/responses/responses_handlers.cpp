// POST /v1/responses: the OpenAI Responses API over the same machinery as /v1/chat/completions. The body is
// translated into the internal chat request (responses_schema.h), rendered through the chat template and tokenized
// exactly as a chat completion is, queued to the engine loop with the same prefix-cache checkpoints, and answered
// through serve_output (serving/generation.h: the queueing, streaming and cancellation of every generation
// route) with ResponsesOutput shaping the response object and its events. Errors have OpenAI's shape.
//
// The server is stateless: nothing is stored, so GET /v1/responses/{id} is a 404 that says so.
#include "server/responses/responses_handlers.h"

#include <cstdio>
#include <cstdlib>

#include "core/check.h"
#include "server/responses/responses_output.h"
#include "server/responses/responses_schema.h"
#include "server/serving/chat_prompt.h"
#include "server/serving/generation.h"
#include "server/serving/prompt_images.h"
#include "server/serving/output_common.h"
#include "server/serving/server_state.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

// A float sampling value as the request wrote it (0.7, not 0.699999988).
double tidy(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", double(v));
  return std::strtod(buf, nullptr);
}

// The response object's fields that echo the request (OpenAI returns them with every response and event).
Json response_skeleton(const std::string& id, const ServerState& state, const ResponsesRequest& r,
                       const SamplingParams& sampling) {
  return Json{{"id", id},
              {"object", "response"},
              {"created_at", unix_now()},
              {"status", "in_progress"},
              {"background", false},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"instructions", r.instructions},
              {"max_output_tokens", r.max_output_tokens ? Json(*r.max_output_tokens) : Json(nullptr)},
              {"max_tool_calls", nullptr},
              {"model", state.model.model_id},
              {"output", Json::array()},
              {"parallel_tool_calls", r.chat.parallel_tool_calls},
              {"previous_response_id", nullptr},
              {"reasoning", r.reasoning},
              {"service_tier", "default"},
              {"store", r.store},
              {"temperature", tidy(sampling.temperature)},
              {"text", Json{{"format", r.text_format}}},
              {"tool_choice", r.tool_choice},
              {"tools", r.tools},
              {"top_logprobs", 0},
              {"top_p", tidy(sampling.top_p)},
              {"truncation", "disabled"},
              {"usage", nullptr},
              {"user", r.user},
              {"metadata", r.metadata}};
}

}  // namespace

void handle_responses(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/responses";
  if (!model_ready(state, res)) return;
  auto parsed = parse_responses_request(req.body, parse_options(state));
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  ResponsesRequest& request = std::get<ResponsesRequest>(parsed);
  const ChatRequest& chat = request.chat;

  auto sampling = sampling_params(state, chat.sampling, -1);
  if (auto* e = std::get_if<ApiError>(&sampling)) return respond_error(res, *e);
  if (auto e = request_images_fetch(state, request.chat.images)) return respond_error(res, *e);
  static const std::vector<std::string> kNone;
  auto rendered = chat_render_prompt(chat, *state.model.chat_template,
                                     state.options.allow_special_in_content ? kNone : state.special_tokens);
  if (auto* e = std::get_if<ApiError>(&rendered)) {
    ApiError error = *e;
    if (error.param == "messages") error.param = "input";
    return respond_error(res, error);
  }
  const ChatPrompt& prompt = std::get<ChatPrompt>(rendered);
  if (auto e = check_prompt_bytes(state, prompt.text.size(), "input")) return respond_error(res, *e);

  auto task = std::make_shared<GenerationTask>();
  task->id = response_id("resp_");
  try {
    task->request.prompt = chat_prompt_tokens(prompt, *state.model.tokenizer);
    if (chat.forced_output) task->request.forced_tokens = state.model.tokenizer->encode(*chat.forced_output);
  } catch (const Error& e) {
    return respond_error(res, api_error_invalid("input", strip_error_location(e.what())));
  }
  if (auto e = prompt_images_attach(state, chat.images, task->request.prompt, &task->request.images))
    return respond_error(res, *e);
  if (auto e = check_context(state, task->request.prompt.size())) {
    e->param = "input";
    return respond_error(res, *e);
  }
  task->request.checkpoint_at = chat_prompt_checkpoints(task->request.prompt, *state.model.tokenizer);
  task->request.sampling = std::get<SamplingParams>(sampling);
  task->request.max_tokens = request.max_output_tokens.value_or(-1);
  // The output constraint (text.format, a forced tool call) starts after the reasoning when the prompt opened it.
  task->request.grammar = chat.grammar;
  if (chat.grammar && prompt.starts_in_reasoning) task->request.grammar_start_after = "</think>";
  set_reasoning_controls(state, task->request, std::nullopt, prompt.starts_in_reasoning);  // the server's --thinking-budget

  ResponsesOutputOptions o;
  o.response = response_skeleton(task->id, state, request, task->request.sampling);
  o.prompt_tokens = int64_t(task->request.prompt.size());
  o.tools = chat.tools;
  o.parallel_tool_calls = chat.parallel_tool_calls;
  o.starts_in_reasoning = prompt.starts_in_reasoning;
  o.thinking_budget = task->request.thinking_budget >= 0;
  serve_output(state, req, res, std::move(task), std::make_unique<ResponsesOutput>(std::move(o)), chat.stream);
}

void handle_response_lookup(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  (void)state;
  request_log().route = "/v1/responses/{id}";
  const std::string id = req.matches.size() > 1 ? std::string(req.matches[1]) : std::string();
  ApiError e = api_error_not_found("No response with id '" + id + "': this server is stateless and stores no "
                                   "responses ('store' is ignored); keep what POST /v1/responses returned.");
  e.param = "response_id";
  respond_error(res, e);
}

}  // namespace tern::server
