#include "server/http/errors.h"

#include "server/http/json.h"

namespace tern::server {

namespace {
ApiError make(int status, std::string message, std::string type, std::string param, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}
}  // namespace

ApiError api_error_invalid(std::string param, std::string message) {
  return make(400, std::move(message), "invalid_request_error", std::move(param), "");
}

ApiError api_error_not_found(std::string message) {
  return make(404, std::move(message), "invalid_request_error", "", "not_found");
}

ApiError api_error_unauthorized() {
  return make(401, "Missing or invalid API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>').",
              "authentication_error", "", "invalid_api_key");
}

ApiError api_error_too_large(size_t limit_bytes) {
  return make(413,
              "The request body is larger than the limit of " + std::to_string(limit_bytes) +
                  " bytes (tern serve --max-body-bytes).",
              "invalid_request_error", "", "request_too_large");
}

ApiError api_error_overloaded(size_t queue_depth, int retry_after_s) {
  ApiError e = make(503,
                    "The server is busy: " + std::to_string(queue_depth) +
                        " requests are already waiting (tern serve --max-queue). Retry later.",
                    "server_error", "", "queue_full");
  e.retry_after_s = retry_after_s;
  return e;
}

ApiError api_error_not_found_model(const std::string& model, const std::string& served) {
  return make(404, "The model '" + model + "' does not exist; this server serves '" + served + "' (GET /v1/models).",
              "invalid_request_error", "model", "model_not_found");
}

ApiError api_error_internal(std::string message) {
  return make(500, std::move(message), "server_error", "", "internal_error");
}

ApiError api_error_client_closed() {
  return make(499, "The client closed the connection before the answer was ready; the generation was cancelled.",
              "invalid_request_error", "", "client_closed_request");
}

ApiError api_error_shutting_down(std::string message) {
  ApiError e = api_error_internal(std::move(message));
  e.status = 503;
  e.code = "shutting_down";
  e.retry_after_s = 1;
  return e;
}

ApiError api_error_context(int64_t prompt_tokens, int64_t context) {
  std::string m = "This model's context is " + std::to_string(context) + " tokens, but the prompt has " +
                  std::to_string(prompt_tokens) + " tokens: it must leave room for at least one generated token "
                  "(generation stops at the context's end whatever max_tokens asks). Shorten the prompt (or raise "
                  "tern serve --ctx-size); truncate_prompt_tokens: N keeps only the prompt's last N tokens.";
  return make(400, std::move(m), "invalid_request_error", "messages", "context_length_exceeded");
}

std::string api_error_body(const ApiError& error) {
  Json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? Json() : Json(error.param)},
            {"code", error.code.empty() ? Json() : Json(error.code)}};
  // Messages may quote client text that is not valid UTF-8: replace bad bytes rather than throw.
  return json_dump(Json{{"error", e}});
}

std::string strip_error_location(const std::string& message) {
  const size_t open = message.rfind(" [src/");
  if (open != std::string::npos && !message.empty() && message.back() == ']') return message.substr(0, open);
  return message;
}

}  // namespace tern::server
