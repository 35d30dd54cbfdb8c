// OpenAI-shaped API errors: {"error":{"message","type","param","code"}} with the HTTP status that goes with them.
// Handlers never throw: request validation produces an ApiError value, and every exception that reaches a handler
// boundary is turned into one (tern::Error from a component -> 400; tern::InternalError, a fault of the device or
// of the engine, and anything else -> 500, logged).
#pragma once

#include <optional>
#include <string>

namespace tern::server {

struct ApiError {
  int status = 400;                // HTTP status
  std::string message;             // what a person reads: names the parameter and the allowed range
  std::string type = "invalid_request_error";
  std::string param;               // "" -> null
  std::string code;                // "" -> null
  int retry_after_s = 0;           // > 0: sent as Retry-After (503 queue full)
};

// Constructors for the common cases.
ApiError api_error_invalid(std::string param, std::string message);        // 400
ApiError api_error_not_found(std::string message);                        // 404
ApiError api_error_not_found_model(const std::string& model, const std::string& served);  // 404
ApiError api_error_unauthorized();                                         // 401
ApiError api_error_too_large(size_t limit_bytes);                         // 413
ApiError api_error_overloaded(size_t queue_depth, int retry_after_s);     // 503
ApiError api_error_internal(std::string message);                         // 500
ApiError api_error_shutting_down(std::string message);                    // 503, code shutting_down
ApiError api_error_context(int64_t prompt_tokens, int64_t context);  // 400, both numbers
// 499 (nginx's "client closed request"): the client hung up before its answer was ready. Nobody reads the body;
// the status is for the request log and the metrics.
ApiError api_error_client_closed();

// The JSON body (one line, no trailing newline).
std::string api_error_body(const ApiError& error);

// tern::Error messages end with " [src/file.cpp:123]"; clients get the message without the location.
std::string strip_error_location(const std::string& message);

}  // namespace tern::server
