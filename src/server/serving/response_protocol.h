// How a generation's response goes on the wire, per API. The serving path (generation.h) queues, streams and cancels
// alike for every API; only the framing of stream events, the stream's end and the shape of errors differ.
// OpenAI's (this default): `data: {json}` events ending with `data: [DONE]`, errors as {"error": {...}}. Each other
// API specializes ResponseProtocol for its output type beside that output (anthropic_output.h: `event: NAME` +
// `data:` lines, no terminator, errors as {"type": "error", "error": {...}}; responses_output.h likewise with its
// own error event; ollama_output.h: NDJSON, one object per line, its own content_type(), no keep-alive text, errors
// as {"error": "message"}). Optional members: content_type() (default text/event-stream) and keep_alive() (default
// an SSE comment).
#pragma once

#include <string>

#include <httplib.h>

#include "server/http/errors.h"
#include "server/http/json.h"
#include "server/http/respond.h"
#include "server/http/sse.h"

namespace tern::server {

template <typename Output>
struct ResponseProtocol {
  static std::string stream_event(const Json& payload) { return sse_data(payload); }
  static std::string stream_end() { return sse_done(); }
  static Json error_body(const ApiError& error) { return Json::parse(api_error_body(error)); }
  static void respond_error(httplib::Response& res, const ApiError& error) { server::respond_error(res, error); }
};

}  // namespace tern::server
