#include "text/json_ref.h"

#include <algorithm>
#include <cctype>

namespace tern {

std::string json_pointer_escape(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

const nlohmann::ordered_json* resolve_local_ref(const nlohmann::ordered_json& root, std::string_view ref,
                                                std::string* normalized) {
  if (ref.empty() || ref[0] != '#') return nullptr;
  const std::string_view ptr = ref.substr(1);
  if (!ptr.empty() && ptr[0] != '/') return nullptr;  // an anchor
  const nlohmann::ordered_json* cur = &root;
  std::string path;
  for (size_t pos = 1; pos <= ptr.size() && !ptr.empty();) {
    size_t next = ptr.find('/', pos);
    if (next == std::string_view::npos) next = ptr.size();
    const std::string_view raw = ptr.substr(pos, next - pos);
    std::string token;
    for (size_t i = 0; i < raw.size(); ++i) {  // JSON pointer escapes, and URI percent-escapes
      if (raw[i] == '~' && i + 1 < raw.size() && (raw[i + 1] == '0' || raw[i + 1] == '1')) {
        token += raw[i + 1] == '0' ? '~' : '/';
        ++i;
      } else if (raw[i] == '%' && i + 2 < raw.size() && std::isxdigit(static_cast<unsigned char>(raw[i + 1])) &&
                 std::isxdigit(static_cast<unsigned char>(raw[i + 2]))) {
        token += static_cast<char>(std::stoi(std::string(raw.substr(i + 1, 2)), nullptr, 16));
        i += 2;
      } else {
        token += raw[i];
      }
    }
    if (cur->is_object() && cur->contains(token)) {
      cur = &(*cur)[token];
    } else if (cur->is_array() && !token.empty() && token.size() < 10 &&
               std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
               std::stoul(token) < cur->size()) {
      cur = &(*cur)[std::stoul(token)];
    } else {
      return nullptr;
    }
    path += "/" + json_pointer_escape(token);
    pos = next + 1;
  }
  if (normalized) *normalized = path;
  return cur;
}

}  // namespace tern
