#include "core/check.h"

#include <cstring>

namespace tern {

namespace {
// " [src/file.cpp:123]": only the path below src/, so that messages are stable across checkouts.
std::string location(const char* file, int line) {
  const char* short_file = std::strstr(file, "src/");
  return " [" + std::string(short_file ? short_file : file) + ":" + std::to_string(line) + "]";
}
}  // namespace

void fail_at(const char* file, int line, const std::string& message) { throw Error(message + location(file, line)); }

void internal_fail_at(const char* file, int line, const std::string& message) {
  throw InternalError(message + location(file, line));
}

}  // namespace tern
