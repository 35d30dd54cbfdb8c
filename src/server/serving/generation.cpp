// The serving path's parts that are no template (see generation.h).
#include "server/serving/generation.h"

#include "core/check.h"

namespace tern::server {

ParseOptions parse_options(const ServerState& state) {
  ParseOptions o;
  o.model_id = state.model.model_id;
  o.model_aliases = state.model.aliases;
  o.strict_model_name = state.options.strict_model_name;
  o.vocab_size = state.model.vocab_size;
  o.allow_forced_output = state.options.allow_forced_output;
  return o;
}

std::variant<SamplingParams, ApiError> sampling_params(const ServerState& state, const SamplingOverrides& o,
                                                       int top_logprobs) {
  SamplingParams p = state.model.defaults;
  if (o.temperature) p.temperature = *o.temperature;
  if (o.top_p) p.top_p = *o.top_p;
  if (o.min_p) p.min_p = *o.min_p;
  if (o.top_k) p.top_k = *o.top_k < 0 ? 0 : *o.top_k;
  if (o.presence_penalty) p.presence_penalty = *o.presence_penalty;
  if (o.frequency_penalty) p.frequency_penalty = *o.frequency_penalty;
  if (o.repetition_penalty) p.repetition_penalty = *o.repetition_penalty;
  if (o.seed) p.seed = *o.seed;
  p.logit_bias = o.logit_bias;
  p.top_logprobs = top_logprobs;
  try {
    p.validate();
  } catch (const Error& e) {
    return api_error_invalid("", strip_error_location(e.what()));
  }
  return p;
}

std::optional<ApiError> check_prompt_bytes(const ServerState& state, size_t bytes, const char* param) {
  const size_t limit = size_t(state.model.context) * state.max_token_bytes;
  if (bytes <= limit) return std::nullopt;
  ApiError e = api_error_invalid(param, "The prompt is " + std::to_string(bytes) + " bytes: more than this model's "
                                        "context of " + std::to_string(state.model.context) + " tokens can hold (" +
                                        std::to_string(limit) + " bytes at most, " +
                                        std::to_string(state.max_token_bytes) +
                                        " bytes being its longest token). Shorten the prompt.");
  e.code = "context_length_exceeded";
  return e;
}

std::optional<ApiError> check_context(const ServerState& state, size_t prompt_tokens) {
  if (int64_t(prompt_tokens) >= state.model.context)
    return api_error_context(int64_t(prompt_tokens), state.model.context);
  return std::nullopt;
}

bool truncate_prompt(std::vector<int32_t>& prompt, const std::optional<int64_t>& keep) {
  if (!keep || int64_t(prompt.size()) <= *keep) return false;
  prompt.erase(prompt.begin(), prompt.end() - *keep);
  return true;
}

bool model_ready(const ServerState& state, httplib::Response& res, void (*respond)(httplib::Response&, const ApiError&)) {
  if (state.ready.load(std::memory_order_acquire)) return true;
  ApiError e = api_error_internal("The model is still loading; retry shortly (GET /health says when it is ready).");
  e.status = 503;
  e.code = "model_loading";
  e.retry_after_s = 5;
  respond(res, e);
  return false;
}

namespace generation_detail {

ApiError shutdown_error() {
  return api_error_shutting_down("The server is shutting down; the generation was cancelled.");
}

void log_result(const GenerationResult& r, const std::string& id) {
  Json& f = request_log().fields;
  f["id"] = id;
  f["prompt_tokens"] = r.prompt_tokens;
  f["completion_tokens"] = r.completion_tokens;
  f["finish"] = finish_reason_name(r.finish);
  f["prefill_ms"] = int64_t(r.prefill_s * 1000);
  f["decode_tok_s"] = int64_t(r.decode_tok_s() * 10) / 10.0;
}

}  // namespace generation_detail

}  // namespace tern::server
