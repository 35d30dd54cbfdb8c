#include "core/text_file.h"

#include <fstream>
#include <sstream>

#include "core/check.h"

namespace tern {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  TERN_CHECK(in, "cannot open ", path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace tern
