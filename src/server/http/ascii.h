// Header text as HTTP compares it: ASCII case folded, blanks (space, tab) trimmed. Internal to src/server.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace tern::server {

inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

inline std::string_view trim_blanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace tern::server
