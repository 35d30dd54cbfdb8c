// Text helpers of the tern bench outputs (bench_format.h).
#include "engine/bench_format.h"

#include <cstdarg>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace tern {

std::string bench_format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string bench_number(double v, const char* fmt) { return v > 0 ? bench_format(fmt, v) : std::string("-"); }

std::string bench_percent(double value, double peak) {
  return peak > 0 && value > 0 ? bench_format("%.1f%%", 100.0 * value / peak) : std::string("-");
}

void bench_json_identity(nlohmann::json& j, const std::string& version, const std::string& command,
                         const std::string& backend, const std::string& device, const std::string& model) {
  j["version"] = version;
  j["command"] = command;
  j["backend"] = backend;
  j["device"] = device;
  j["model"] = model;
}

}  // namespace tern
