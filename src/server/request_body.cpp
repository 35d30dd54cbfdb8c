// Request body framing and coding checks: see request_body.h.
#include "server/request_body.h"

#include <httplib.h>

#include <cctype>
#include <memory>

namespace tern::server {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string dechunk(std::string_view body) {
  std::string out;
  size_t at = 0;
  for (;;) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string_view::npos) break;
    std::string_view line = body.substr(at, eol - at);
    line = trim(line.substr(0, line.find(';')));
    size_t size = 0;
    for (char ch : line) size = size * 16 + size_t(std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
                                                     : (ch | 0x20) - 'a' + 10);
    if (size == 0 || eol + 2 + size > body.size()) break;  // the last chunk (the trailer follows), or cut short
    out.append(body.substr(eol + 2, size));
    at = eol + 2 + size + 2;
  }
  return out;
}

std::optional<std::string> content_coding(std::string_view header_value) {
  std::string v(trim(header_value));
  for (char& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (v.empty() || v == "identity") return std::string();
  if (v == "gzip" || v == "deflate" || v == "br") return v;
  return std::nullopt;
}

InflateCheck check_inflated_size(std::string_view coding, std::string_view data, size_t cap) {
  std::unique_ptr<httplib::detail::decompressor> d;
  if (coding == "br")
    d = std::make_unique<httplib::detail::brotli_decompressor>();
  else
    d = std::make_unique<httplib::detail::gzip_decompressor>();  // gzip and deflate (zlib detects which)
  if (!d->is_valid()) return InflateCheck::malformed;
  size_t inflated = 0;
  bool over = false;
  const bool ok = d->decompress(data.data(), data.size(), [&](const char*, size_t n) {
    inflated += n;
    over = inflated > cap;
    return !over;  // stops inflating past the cap
  });
  if (over) return InflateCheck::too_large;
  return ok ? InflateCheck::fits : InflateCheck::malformed;
}

}  // namespace tern::server
