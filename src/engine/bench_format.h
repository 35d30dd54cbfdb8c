// Text helpers the tern bench outputs share (bench_output.cpp, bench_speculative_output.cpp).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace tern {

// printf into a string (at most 511 characters: one table cell or line).
std::string bench_format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// v printed with fmt, or "-" when v ≤ 0 (not measured).
std::string bench_number(double v, const char* fmt);
// value as a percentage of peak ("12.3%"), or "-" when either is not known.
std::string bench_percent(double value, double peak);
// The fields every tern bench JSON document starts with: what ran, where and on what.
void bench_json_identity(nlohmann::json& j, const std::string& version, const std::string& command,
                         const std::string& backend, const std::string& device, const std::string& model);

}  // namespace tern
