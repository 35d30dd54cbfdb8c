#include "server/serving/output_common.h"

#include <chrono>
#include <random>

#include "server/http/json.h"

namespace tern::server {

std::string response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string tool_call_as_text(const ToolCall& call) {
  std::string s = "<tool_call>\n<function=" + call.name + ">\n";
  const Json args = Json::parse(call.arguments_json, nullptr, false);
  if (args.is_object()) {
    for (const auto& [key, value] : args.items())
      s += "<parameter=" + key + ">\n" + (value.is_string() ? value.get<std::string>() : value.dump()) + "\n</parameter>\n";
  }
  return s + "</function>\n</tool_call>";
}

}  // namespace tern::server
