// The bounded inflation of a coded request body: see request_body.h.
#include "server/http/request_body.h"

#include <httplib.h>

#include <memory>

namespace tern::server {

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
