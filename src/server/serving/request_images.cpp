#include "server/serving/request_images.h"

#include <cctype>
#include <optional>

#include "core/base64.h"
#include "server/serving/request_fields.h"

namespace tern::server {

namespace {

using request_fields::bad;

bool starts_with_nocase(const std::string& s, const char* prefix) {
  size_t i = 0;
  for (; prefix[i]; ++i)
    if (i >= s.size() || std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

std::string decode(const std::string& text, const std::string& param) {
  std::string why;
  std::optional<std::string> bytes = base64_decode(text, &why);
  if (!bytes) bad(param, "'" + param + "' is not valid base64 image data: " + why + ".");
  if (bytes->empty()) bad(param, "'" + param + "' holds no image data (empty base64).");
  return std::move(*bytes);
}

}  // namespace

RequestImage request_image_from_url(const std::string& url, const std::string& param) {
  RequestImage im;
  im.param = param;
  if (starts_with_nocase(url, "http://") || starts_with_nocase(url, "https://")) {
    im.url = url;
    return im;
  }
  if (!starts_with_nocase(url, "data:"))
    bad(param, "'" + param + "' must be a data: URL holding the image as base64 (data:image/png;base64,...) or an "
                             "http(s) URL.");
  const size_t comma = url.find(',');
  if (comma == std::string::npos) bad(param, "'" + param + "' is a data: URL without a ',' before its data.");
  const std::string meta = url.substr(5, comma - 5);  // "image/png;base64"
  if (meta.size() < 7 || !starts_with_nocase(meta.substr(meta.size() - 7), ";base64"))
    bad(param, "'" + param + "' is a data: URL whose data is not base64: write it as data:image/png;base64,...");
  const std::string media = meta.substr(0, meta.size() - 7);
  if (!media.empty() && !starts_with_nocase(media, "image/"))
    bad(param, "'" + param + "' is a data: URL of media type '" + media + "', not an image.");
  im.bytes = decode(url.substr(comma + 1), param);
  return im;
}

RequestImage request_image_from_base64(const std::string& text, const std::string& param) {
  if (starts_with_nocase(text, "data:")) return request_image_from_url(text, param);
  RequestImage im;
  im.param = param;
  im.bytes = decode(text, param);
  return im;
}

void MessageContent::add_text(const std::string& text) {
  text_ += text;
  pending_ += text;
}

void MessageContent::add_image() {
  if (!pending_.empty()) parts_.push_back(Json{{"type", "text"}, {"text", pending_}});
  pending_.clear();
  parts_.push_back(Json{{"type", "image"}});
  ++images_;
}

Json MessageContent::json() const {
  if (images_ == 0) return text_;
  Json parts = parts_;
  if (!pending_.empty()) parts.push_back(Json{{"type", "text"}, {"text", pending_}});
  return parts;
}

}  // namespace tern::server
