// Whole-file reads of small text files (configs, indexes, templates).
#pragma once

#include <filesystem>
#include <string>

namespace tern {

// The bytes of the file at `path`; tern::Error "cannot open PATH" when it cannot be opened.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace tern
