// How a generation's response goes on the wire, per API. The generation handlers (generation_handlers.cpp) queue,
// stream and cancel alike for every API; only the framing of stream events, the stream's end and the shape of
// errors differ. OpenAI's (the default): `data: {json}` events ending with `data: [DONE]`, errors as
// {"error": {...}}. Anthropic's Messages (AnthropicOutput): `event: NAME` + `data:` lines, no terminator,
// errors as {"type": "error", "error": {...}}. Ollama's (OllamaOutput, ollama_output.h): NDJSON, one object per line
// (its own content_type(), no keep-alive text), errors as {"error": "message"}.
#pragma once

#include <string>

#include <httplib.h>

#include "server/http/errors.h"
#include "server/http/respond.h"
#include "server/http/sse.h"
#include "server/openai/openai_schema.h"

namespace tern::server {

template <typename Output>
struct ResponseProtocol {
  static std::string stream_event(const Json& payload) { return sse_data(payload); }
  static std::string stream_end() { return sse_done(); }
  static Json error_body(const ApiError& error) { return Json::parse(api_error_body(error)); }
  static void respond_error(httplib::Response& res, const ApiError& error) { server::respond_error(res, error); }
};

class AnthropicOutput;

template <>
struct ResponseProtocol<AnthropicOutput> {
  static std::string stream_event(const Json& payload);  // "event: <payload.type>\ndata: <payload>\n\n"
  static std::string stream_end() { return ""; }
  static Json error_body(const ApiError& error);
  static void respond_error(httplib::Response& res, const ApiError& error);
};

}  // namespace tern::server
