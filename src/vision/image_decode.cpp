#include "vision/image_decode.h"

#include <cstring>
#include <new>

#include "vision/image_decoders.h"
#include "vision/image_orientation.h"

namespace tern {

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::png: return "PNG";
    case ImageFormat::jpeg: return "JPEG";
    case ImageFormat::webp: return "WebP";
    case ImageFormat::gif: return "GIF";
  }
  return "?";
}

namespace {

bool starts_with(std::span<const uint8_t> bytes, size_t at, const char* magic, size_t n) {
  return bytes.size() >= at + n && std::memcmp(bytes.data() + at, magic, n) == 0;
}

// Formats people send that are not decoded here, named so that the message says what the file was.
const char* image_unsupported_format_name(std::span<const uint8_t> b) {
  if (starts_with(b, 0, "BM", 2)) return "BMP";
  if (starts_with(b, 0, "II*\0", 4) || starts_with(b, 0, "MM\0*", 4)) return "TIFF";
  if (starts_with(b, 4, "ftypavif", 8) || starts_with(b, 4, "ftypavis", 8)) return "AVIF";
  if (starts_with(b, 4, "ftyphei", 7) || starts_with(b, 4, "ftypmif1", 8) || starts_with(b, 4, "ftyphevc", 8))
    return "HEIF";
  if (starts_with(b, 0, "\xff\x0a", 2) || starts_with(b, 4, "JXL ", 4)) return "JPEG XL";
  if (starts_with(b, 0, "\0\0\1\0", 4)) return "ICO";
  if (starts_with(b, 0, "%PDF", 4)) return "PDF";
  if (starts_with(b, 0, "8BPS", 4)) return "PSD";
  if (starts_with(b, 0, "qoif", 4)) return "QOI";
  if (starts_with(b, 0, "<svg", 4) || starts_with(b, 0, "<?xml", 5)) return "SVG (or other XML)";
  return nullptr;
}

std::string hex_prefix(std::span<const uint8_t> b) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < b.size() && i < 8; ++i) {
    if (i) out += ' ';
    out += kDigits[b[i] >> 4];
    out += kDigits[b[i] & 15];
  }
  return out;
}

// ImageMagick's "Raw profile type exif" text: "\nexif\n<length>\n<hex, in lines>"; Pillow reads the hex after the
// third line break. Empty when malformed.
std::vector<uint8_t> raw_profile_to_exif(const std::string& text) {
  size_t at = 0;
  for (int i = 0; i < 3; ++i) {
    at = text.find('\n', at);
    if (at == std::string::npos) return {};
    ++at;
  }
  std::vector<uint8_t> out;
  int high = -1;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == ' ' || c == '\t' || c == '\r') continue;
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (v < 0) return {};
    if (high < 0) {
      high = v;
    } else {
      out.push_back(uint8_t(high << 4 | v));
      high = -1;
    }
  }
  return out;
}

}  // namespace

namespace vision_detail {

void check_image_size(int64_t width, int64_t height, const ImageLimits& limits, const char* what) {
  const std::string dims = std::to_string(width) + "x" + std::to_string(height);
  if (width <= 0 || height <= 0)
    throw ImageError(ImageErrorKind::empty, std::string("the image's ") + what + " is " + dims + ": no pixels");
  if (width > limits.max_side || height > limits.max_side)
    throw ImageError(ImageErrorKind::too_large, std::string("the image's ") + what + " is " + dims + ", more than " +
                                                    std::to_string(limits.max_side) + " pixels on a side");
  if (width * height > limits.max_pixels)
    throw ImageError(ImageErrorKind::too_large, std::string("the image's ") + what + " is " + dims + " = " +
                                                    std::to_string(width * height) + " pixels, more than " +
                                                    std::to_string(limits.max_pixels));
}

}  // namespace vision_detail

std::optional<ImageFormat> image_sniff_format(std::span<const uint8_t> b) {
  if (starts_with(b, 0, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::png;
  if (starts_with(b, 0, "\xff\xd8\xff", 3)) return ImageFormat::jpeg;
  if (starts_with(b, 0, "RIFF", 4) && starts_with(b, 8, "WEBP", 4)) return ImageFormat::webp;
  if (starts_with(b, 0, "GIF87a", 6) || starts_with(b, 0, "GIF89a", 6)) return ImageFormat::gif;
  return std::nullopt;
}

DecodedImage image_decode(std::span<const uint8_t> bytes, const ImageLimits& limits, const std::string& name) {
  if (bytes.empty()) throw ImageError(ImageErrorKind::empty, name + ": the image data is empty");
  const std::optional<ImageFormat> format = image_sniff_format(bytes);
  if (!format) {
    if (const char* other = image_unsupported_format_name(bytes))
      throw ImageError(ImageErrorKind::unsupported_format,
                       name + ": " + other + " images are not supported (PNG, JPEG, WebP and GIF are)");
    throw ImageError(ImageErrorKind::unsupported_format,
                     name + ": not a PNG, JPEG, WebP or GIF image (its data starts " + hex_prefix(bytes) + ")");
  }
  DecodedImage out;
  out.format = *format;
  vision_detail::ImageMetadata meta;
  try {
    switch (*format) {
      case ImageFormat::png: out.image = vision_detail::decode_png(bytes, limits, meta); break;
      case ImageFormat::jpeg: out.image = vision_detail::decode_jpeg(bytes, limits, meta); break;
      case ImageFormat::webp: out.image = vision_detail::decode_webp(bytes, limits, meta); break;
      case ImageFormat::gif: out.image = vision_detail::decode_gif(bytes, limits); break;
    }
  } catch (const ImageError& e) {
    throw ImageError(e.kind(), name + ": " + e.what());
  } catch (const std::bad_alloc&) {
    throw ImageError(ImageErrorKind::too_large,
                     name + ": not enough memory to decode the " + image_format_name(*format) + " image");
  }
  if (meta.exif.empty() && !meta.raw_profile_exif.empty()) meta.exif = raw_profile_to_exif(meta.raw_profile_exif);
  out.orientation = image_orientation_from_metadata(meta.exif, meta.xmp);
  out.image = image_apply_orientation(std::move(out.image), out.orientation);
  return out;
}

}  // namespace tern
