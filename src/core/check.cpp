#include "core/check.h"

#include <cstring>

namespace tern {

void fail_at(const char* file, int line, const std::string& message) {
  // Keep only the path below src/ so messages are stable across checkouts.
  const char* short_file = std::strstr(file, "src/");
  throw Error(message + " [" + (short_file ? short_file : file) + ":" + std::to_string(line) + "]");
}

}  // namespace tern
