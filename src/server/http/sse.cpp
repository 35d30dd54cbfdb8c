#include "server/http/sse.h"

namespace tern::server {

std::string sse_data(const Json& payload) { return "data: " + json_dump(payload) + "\n\n"; }

std::string sse_typed_event(const Json& payload) {
  return "event: " + payload.value("type", std::string("message")) + "\n" + sse_data(payload);
}

}  // namespace tern::server
