// JSON as the server reads and writes it. Objects keep their key order (ordered_json): tools are rendered into the
// prompt with tojson, whose output must follow the client's key order, and responses list their fields in the
// order the APIs document.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tern::server {

using Json = nlohmann::ordered_json;

// JSON text of a value that may hold invalid UTF-8 (bad bytes become U+FFFD): compact, never throws on strings.
inline std::string json_dump(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace tern::server
