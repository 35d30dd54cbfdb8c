// Images as the vision side sees them: 8-bit RGB in memory, the limits bad input is held to, and the one error
// type that says what was wrong with an image (a tern::Error: the server answers it with 400).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"

namespace tern {

// [height, width, 3] uint8, rows top to bottom, channels interleaved R, G, B.
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;

  RgbImage() = default;
  RgbImage(int w, int h) : width(w), height(h), pixels(size_t(w) * size_t(h) * 3) {}
  uint8_t* row(int y) { return pixels.data() + size_t(y) * size_t(width) * 3; }
  const uint8_t* row(int y) const { return pixels.data() + size_t(y) * size_t(width) * 3; }
};

enum class ImageFormat { png, jpeg, webp, gif };
const char* image_format_name(ImageFormat f);  // "PNG", "JPEG", "WebP", "GIF"

// What an image was refused for; the message says it in words.
enum class ImageErrorKind {
  empty,               // no bytes, or an image with no pixels
  unsupported_format,  // not PNG, JPEG, WebP or GIF, or a variant of one that is not decoded (12-bit JPEG, ...)
  corrupt,             // the decoder refused the data
  truncated,           // the data ends before the image does
  too_large,           // a side or the pixel count over ImageLimits, checked from the header before decoding
  aspect_ratio,        // longer side more than 200 times the shorter (the reference processor refuses these)
};

class ImageError : public Error {
 public:
  ImageError(ImageErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  ImageErrorKind kind() const { return kind_; }

 private:
  ImageErrorKind kind_;
};

// Limits checked against the dimensions a file declares, before any pixel memory is allocated. The decoded image
// takes 3 bytes a pixel and its decoding at most 8 more for a moment (an interlaced PNG's rows, a WebP's RGBA, an
// animated WebP's two canvases, the upright copy), so at the defaults one image's decode peaks between 200 and
// 740 MB.
struct ImageLimits {
  int max_side = 16384;                   // pixels, either side
  int64_t max_pixels = int64_t(1) << 26;  // 67,108,864 (e.g. 8192 x 8192)
  int max_jpeg_scans = 500;               // progressive JPEG scans (many tiny scans make decoding slow)
};

}  // namespace tern
