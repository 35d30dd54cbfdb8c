// Server-sent events as OpenAI streams them: each chunk is `data: <json>\n\n`, the stream ends `data: [DONE]\n\n`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tern::server {

// One event carrying a JSON object (compact; invalid UTF-8 in strings is replaced, never thrown on).
std::string sse_data(const nlohmann::ordered_json& payload);
// The terminator.
inline std::string sse_done() { return "data: [DONE]\n\n"; }
// A comment line: ignored by clients, used to keep a queued stream alive and to notice a closed connection.
inline std::string sse_comment(const std::string& text) { return ": " + text + "\n\n"; }

// JSON text of a value that may hold invalid UTF-8 (bad bytes become U+FFFD).
std::string json_dump(const nlohmann::ordered_json& value);

}  // namespace tern::server
