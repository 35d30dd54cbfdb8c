// Server-sent events as OpenAI streams them: each chunk is `data: <json>\n\n`, the stream ends `data: [DONE]\n\n`.
#pragma once

#include <string>

#include "server/http/json.h"

namespace tern::server {

// One event carrying a JSON object (compact; invalid UTF-8 in strings is replaced, never thrown on).
std::string sse_data(const Json& payload);
// A named event: `event: <payload's "type">\n` + its data line (Anthropic's and OpenAI Responses' framing).
std::string sse_typed_event(const Json& payload);
// The terminator.
inline std::string sse_done() { return "data: [DONE]\n\n"; }
// A comment line: ignored by clients, used to keep a queued stream alive and to notice a closed connection.
inline std::string sse_comment(const std::string& text) { return ": " + text + "\n\n"; }

}  // namespace tern::server
