// Writing a handler's answer, and what the request log line says about it. Handlers never throw: they write a
// JSON body or an ApiError (errors.h) through these.
#pragma once

#include <chrono>
#include <string>

#include <httplib.h>

#include "server/http/errors.h"
#include "server/http/json.h"

namespace tern::server {

// What the structured request log line says about the request being served on this thread. The handler fills
// `fields`; the logger (which runs on the same thread after the response is written) prints and clears it. Every
// error answer written through the functions below puts its message in fields["error"] (why a 400 was a 400).
struct RequestLog {
  std::chrono::steady_clock::time_point start{};
  const char* route = "other";   // the route label used in metrics (a literal)
  Json fields = Json::object();
};
RequestLog& request_log();

void respond_json(httplib::Response& res, const Json& body, int status = 200);
// Writes the error as the response in OpenAI's shape (status, JSON body, Retry-After); its message goes into the
// request log line (fields["error"]).
void respond_error(httplib::Response& res, const ApiError& error);
// The same with the body of another API's error shape (Anthropic's, Ollama's): status, Retry-After, `body`; logged
// the same way.
void respond_error_with_body(httplib::Response& res, const ApiError& error, const Json& body);

}  // namespace tern::server
