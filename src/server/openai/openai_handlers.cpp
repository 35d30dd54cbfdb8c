// The OpenAI API's own routes: POST /v1/chat/completions and /v1/completions (validate, build the prompt, queue a
// task for the engine loop, then answer through the shared serving path, serving/generation.h, with ChatOutput or
// CompletionOutput shaping the answer), and GET /v1/models. Errors have OpenAI's shape.
#include "server/openai/openai_handlers.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "server/openai/chat_output.h"
#include "server/openai/openai_response.h"
#include "server/openai/openai_schema.h"
#include "server/serving/chat_prompt.h"
#include "server/serving/generation.h"
#include "server/serving/prompt_images.h"
#include "server/serving/request_fields.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

// The names the model is served under: the id first, then each alias. While it loads, the names announced in the
// options (none when they were not given).
std::vector<std::string> served_names(const ServerState& state) {
  const bool ready = state.ready.load(std::memory_order_acquire);
  const std::string& id = ready ? state.model.model_id : state.options.model_id;
  if (id.empty()) return {};
  std::vector<std::string> names = {id};
  const std::vector<std::string>& aliases = ready ? state.model.aliases : state.options.model_aliases;
  names.insert(names.end(), aliases.begin(), aliases.end());
  return names;
}

// One /v1/models entry of `names` (served_names: the id first). max_model_len (the context) is known once the model
// is loaded.
Json model_entry(const ServerState& state, const std::vector<std::string>& names, const std::string& name) {
  Json entry = {{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "tern"}};
  if (state.ready.load(std::memory_order_acquire)) entry["max_model_len"] = state.model.context;
  entry["root"] = names.front();
  return entry;
}

}  // namespace

void handle_chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/chat/completions";
  if (!model_ready(state, res)) return;
  auto parsed = parse_chat_request(req.body, parse_options(state));
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  auto ex = std::make_shared<Exchange<ChatRequest, ChatOutput>>();
  ex->state = &state;
  ex->request = std::move(std::get<ChatRequest>(parsed));
  if (auto e = request_images_fetch(state, ex->request.images)) return respond_error(res, *e);
  const ChatRequest& request = ex->request;

  static const std::vector<std::string> kNone;
  auto prompt = chat_render_prompt(request, *state.model.chat_template,
                                   state.options.allow_special_in_content ? kNone : state.special_tokens);
  if (auto* e = std::get_if<ApiError>(&prompt)) return respond_error(res, *e);
  const ChatPrompt& chat_prompt = std::get<ChatPrompt>(prompt);
  auto sampling = sampling_params(state, request.sampling, request.logprobs ? request.top_logprobs : -1);
  if (auto* e = std::get_if<ApiError>(&sampling)) return respond_error(res, *e);

  // Asked to truncate, a prompt may be longer than the context: only its last tokens are kept.
  if (!request.truncate_prompt_tokens)
    if (auto e = check_prompt_bytes(state, chat_prompt.text.size(), "messages")) return respond_error(res, *e);

  auto task = std::make_shared<GenerationTask>();
  task->id = response_id("chatcmpl-");
  try {
    task->request.prompt = chat_prompt_tokens(chat_prompt, *state.model.tokenizer);
    if (request.forced_output) task->request.forced_tokens = state.model.tokenizer->encode(*request.forced_output);
    if (request.prediction) task->request.prediction = state.model.tokenizer->encode(*request.prediction);
  } catch (const Error& e) {
    return respond_error(res, api_error_invalid("messages", strip_error_location(e.what())));
  }
  if (auto e = prompt_images_attach(state, request.images, task->request.prompt, &task->request.images,
                                    request.truncate_prompt_tokens.has_value()))
    return respond_error(res, *e);
  if (auto e = truncate_prompt_images(task->request.prompt, task->request.images, request.truncate_prompt_tokens))
    return respond_error(res, *e);
  if (auto e = check_context(state, task->request.prompt.size()))
    return respond_error(res, *e);
  // The prefix cache also snapshots where the generation prompt starts (the prompt's last <|im_start|>): the next
  // turn renders this turn's generation prompt and reply as the template renders history, which may differ from
  // what was generated (thinking dropped), but everything before that point is the same.
  task->request.checkpoint_at = chat_prompt_checkpoints(task->request.prompt, *state.model.tokenizer);
  task->request.sampling = std::get<SamplingParams>(sampling);
  task->request.max_tokens = request.max_tokens.value_or(-1);
  task->request.stop = request.stop;
  // The output constraint (response_format, a forced tool call). With thinking on, the prompt ends inside
  // <think>: the reasoning stays free and the constraint starts after the model closes it.
  task->request.grammar = request.grammar;
  if (request.grammar && chat_prompt.starts_in_reasoning) task->request.grammar_start_after = "</think>";
  set_reasoning_controls(state, task->request, request.thinking_budget, chat_prompt.starts_in_reasoning);
  task->report_progress = request.stream && request.return_progress;  // a non-streamed answer has nowhere to show it
  ex->task = task;
  ex->output = std::make_unique<ChatOutput>(ex->request, *state.model.tokenizer,
                                            ResponseMeta{task->id, unix_now(), state.model.model_id},
                                            chat_prompt.starts_in_reasoning);
  serve(state, req, res, ex, request.stream);
}

void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/completions";
  if (!model_ready(state, res)) return;
  auto parsed = parse_completion_request(req.body, parse_options(state));
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  auto ex = std::make_shared<Exchange<CompletionRequest, CompletionOutput>>();
  ex->state = &state;
  ex->request = std::move(std::get<CompletionRequest>(parsed));
  const CompletionRequest& request = ex->request;

  auto sampling = sampling_params(state, request.sampling, request.logprobs);
  if (auto* e = std::get_if<ApiError>(&sampling)) return respond_error(res, *e);
  if (!request.prompt_is_ids && !request.truncate_prompt_tokens)
    if (auto e = check_prompt_bytes(state, request.prompt_text.size(), "prompt")) return respond_error(res, *e);
  auto task = std::make_shared<GenerationTask>();
  task->id = response_id("cmpl-");
  std::string echo_text;
  try {
    if (request.prompt_is_ids) {
      task->request.prompt = request.prompt_ids;
      if (request.echo) echo_text = state.model.tokenizer->decode(request.prompt_ids);
    } else {
      task->request.prompt = state.model.tokenizer->encode(request.prompt_text);
      echo_text = request.prompt_text;
    }
    if (request.forced_output) task->request.forced_tokens = state.model.tokenizer->encode(*request.forced_output);
  } catch (const Error& e) {
    return respond_error(res, api_error_invalid("prompt", strip_error_location(e.what())));
  }
  if (task->request.prompt.empty()) return respond_error(res, api_error_invalid("prompt", "'prompt' encodes to no tokens."));
  if (truncate_prompt(task->request.prompt, request.truncate_prompt_tokens) && request.echo)
    echo_text = state.model.tokenizer->decode(task->request.prompt);  // what the model saw
  if (auto e = check_context(state, task->request.prompt.size())) {
    e->param = "prompt";
    return respond_error(res, *e);
  }
  task->request.sampling = std::get<SamplingParams>(sampling);
  task->request.max_tokens = request.max_tokens;
  task->request.stop = request.stop;
  task->report_progress = request.stream && request.return_progress;
  ex->task = task;
  ex->output = std::make_unique<CompletionOutput>(ex->request, *state.model.tokenizer,
                                                  ResponseMeta{task->id, unix_now(), state.model.model_id},
                                                  std::move(echo_text));
  serve(state, req, res, ex, request.stream);
}


void handle_tokenize_chat(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/tokenize";
  if (!model_ready(state, res)) return;
  auto parsed = parse_chat_request(req.body, parse_options(state));
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  ChatRequest& request = std::get<ChatRequest>(parsed);
  if (auto e = request_images_fetch(state, request.images)) return respond_error(res, *e);
  static const std::vector<std::string> kNone;
  auto prompt = chat_render_prompt(request, *state.model.chat_template,
                                   state.options.allow_special_in_content ? kNone : state.special_tokens);
  if (auto* e = std::get_if<ApiError>(&prompt)) return respond_error(res, *e);
  const ChatPrompt& chat_prompt = std::get<ChatPrompt>(prompt);
  if (auto e = check_prompt_bytes(state, chat_prompt.text.size(), "messages")) return respond_error(res, *e);
  std::vector<int32_t> tokens;
  try {
    tokens = chat_prompt_tokens(chat_prompt, *state.model.tokenizer);
  } catch (const Error& e) {
    return respond_error(res, api_error_invalid("messages", strip_error_location(e.what())));
  }
  if (auto e = prompt_images_attach(state, request.images, tokens, nullptr)) return respond_error(res, *e);
  const size_t count = tokens.size();
  respond_json(res, Json{{"tokens", std::move(tokens)}, {"count", count}, {"max_model_len", state.model.context}});
}

// The id first, then each --alias as an entry of its own (as vLLM lists its served names); also while the model
// loads, so that a client that reads the list once at start sees it.
void handle_models(ServerState& state, const httplib::Request&, httplib::Response& res) {
  request_log().route = "/v1/models";
  Json data = Json::array();
  const std::vector<std::string> names = served_names(state);
  for (const std::string& name : names) data.push_back(model_entry(state, names, name));
  respond_json(res, Json{{"object", "list"}, {"data", data}});
}

void handle_model(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/models/{id}";
  const std::string id = req.matches[1];
  const std::vector<std::string> names = served_names(state);
  for (const std::string& name : names)  // a name as listed, or with a ":latest" tag
    if (id == name || without_latest_tag(id) == name) return respond_json(res, model_entry(state, names, name));
  // Any other name is the served model too (as on the generation routes), unless --strict-model-name.
  if (!names.empty() && !state.options.strict_model_name) return respond_json(res, model_entry(state, names, names.front()));
  respond_error(res, api_error_not_found_model(id, names.empty() ? std::string() : names.front()));
}

}  // namespace tern::server
