// A request body's framing and coding: see request_body.h.
#include "server/http/request_body.h"

#include <httplib.h>

#include <memory>

#include "server/http/ascii.h"

namespace tern::server {

namespace {
// A chunk-size line (extensions after ';' ignored): its size, or false when it is not 1..15 hex digits.
bool parse_chunk_size(std::string_view line, size_t& size) {
  line = trim_blanks(line.substr(0, line.find(';')));
  if (line.empty() || line.size() > 15) return false;
  size = 0;
  for (char ch : line) {
    const int d = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
                  : (ch >= 'a' && ch <= 'f')                  ? ch - 'a' + 10
                  : (ch >= 'A' && ch <= 'F')                  ? ch - 'A' + 10
                                                              : -1;
    if (d < 0) return false;
    size = size * 16 + size_t(d);
  }
  return true;
}
}  // namespace

bool ChunkedScanner::scan(std::string_view body) {
  pending_ = 0;
  while (!done_) {
    const size_t eol = body.find("\r\n", at_);
    if (eol == std::string_view::npos) return body.size() - at_ <= 4096;  // a size or trailer line is short
    if (in_trailer_) {
      if (eol == at_) {  // the empty line that ends the trailer
        done_ = true;
        end_ = eol + 2;
        return true;
      }
      at_ = eol + 2;
      continue;
    }
    size_t size = 0;
    if (!parse_chunk_size(body.substr(at_, eol - at_), size)) return false;
    if (size == 0) {
      in_trailer_ = true;
      at_ = eol + 2;
      continue;
    }
    if (body.size() < eol + 2 + size + 2) {
      pending_ = size;  // announced, not all here yet (counts against the size cap already)
      return true;
    }
    if (body.substr(eol + 2 + size, 2) != "\r\n") return false;
    decoded_ += size;
    at_ = eol + 2 + size + 2;
  }
  return true;
}

std::string dechunk(std::string_view body) {
  std::string out;
  size_t at = 0, size = 0;
  for (size_t eol; (eol = body.find("\r\n", at)) != std::string_view::npos; at = eol + 2 + size + 2) {
    if (!parse_chunk_size(body.substr(at, eol - at), size) || size == 0 || eol + 2 + size > body.size()) break;
    out.append(body.substr(eol + 2, size));
  }
  return out;
}

std::optional<std::string> content_coding(std::string_view header_value) {
  const std::string v = ascii_lower(trim_blanks(header_value));
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
