#include "server/http/sse.h"

namespace tern::server {

std::string json_dump(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string sse_data(const nlohmann::ordered_json& payload) { return "data: " + json_dump(payload) + "\n\n"; }

}  // namespace tern::server
