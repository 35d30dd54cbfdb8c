#include "server/http/request_head.h"

#include "server/http/ascii.h"

namespace tern::server {

const std::string* RequestHead::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers)
    if (k == lower_name) return &v;
  return nullptr;
}

bool parse_request_head(std::string_view head, RequestHead& out) {
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0) return false;
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1) return false;
  out.method = std::string(line.substr(0, sp1));
  out.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  out.version = std::string(line.substr(sp2 + 1));
  out.path = out.target.substr(0, out.target.find('?'));
  out.headers.clear();
  while (eol != std::string_view::npos) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    std::string_view h = head.substr(start, eol == std::string_view::npos ? std::string_view::npos : eol - start);
    if (h.empty()) continue;
    const size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    out.headers.emplace_back(ascii_lower(trim_blanks(h.substr(0, colon))), std::string(trim_blanks(h.substr(colon + 1))));
  }
  return true;
}

}  // namespace tern::server
