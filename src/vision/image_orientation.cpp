#include "vision/image_orientation.h"

#include <cstring>

namespace tern {
namespace {

// Bounds-checked reads from a TIFF block of either byte order.
struct TiffReader {
  std::span<const uint8_t> bytes;
  bool big_endian = false;

  bool has(uint64_t offset, uint64_t n) const { return offset <= bytes.size() && n <= bytes.size() - offset; }
  uint32_t u16(uint64_t at) const {
    const uint8_t* p = bytes.data() + at;
    return big_endian ? uint32_t(p[0]) << 8 | p[1] : uint32_t(p[1]) << 8 | p[0];
  }
  uint32_t u32(uint64_t at) const {
    const uint8_t* p = bytes.data() + at;
    return big_endian ? uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]
                      : uint32_t(p[3]) << 24 | uint32_t(p[2]) << 16 | uint32_t(p[1]) << 8 | p[0];
  }
};

constexpr uint32_t kTagOrientation = 0x0112;

}  // namespace

std::optional<int64_t> image_exif_orientation(std::span<const uint8_t> exif) {
  if (exif.size() >= 6 && std::memcmp(exif.data(), "Exif\0\0", 6) == 0) exif = exif.subspan(6);
  if (exif.size() < 8) return std::nullopt;
  TiffReader tiff{exif};
  if (std::memcmp(exif.data(), "II*\0", 4) == 0) {
    tiff.big_endian = false;
  } else if (std::memcmp(exif.data(), "MM\0*", 4) == 0) {
    tiff.big_endian = true;
  } else {
    return std::nullopt;
  }
  const uint64_t ifd = tiff.u32(4);
  if (!tiff.has(ifd, 2)) return std::nullopt;
  const uint32_t entries = tiff.u16(ifd);
  std::optional<int64_t> found;
  for (uint32_t i = 0; i < entries; ++i) {
    const uint64_t at = ifd + 2 + 12 * uint64_t(i);
    if (!tiff.has(at, 12)) break;  // a truncated directory: the entries read so far stand
    if (tiff.u16(at) != kTagOrientation) continue;
    const uint32_t type = tiff.u16(at + 2), count = tiff.u32(at + 4);
    const uint64_t value = at + 8;        // a single value of 4 bytes or fewer sits in the entry itself
    if (type < 1 || type > 13) continue;  // a type Pillow does not know: it skips the entry
    if (count != 1) {
      found = 0;  // several values: Pillow reads a tuple, which names no orientation
      continue;
    }
    switch (type) {
      case 1: found = exif[value]; break;                         // BYTE
      case 3: found = tiff.u16(value); break;                     // SHORT
      case 4: found = tiff.u32(value); break;                     // LONG
      case 6: found = int8_t(exif[value]); break;                 // SBYTE
      case 8: found = int16_t(uint16_t(tiff.u16(value))); break;  // SSHORT
      case 9: found = int32_t(tiff.u32(value)); break;            // SLONG
      default: found = 0; break;                                  // text, fractions, floats
    }
  }
  return found;
}

std::optional<int> image_xmp_orientation(std::span<const uint8_t> xmp) {
  static constexpr std::string_view kName = "tiff:Orientation";
  const std::string_view text(reinterpret_cast<const char*>(xmp.data()), xmp.size());
  for (size_t at = text.find(kName); at != std::string_view::npos; at = text.find(kName, at + 1)) {
    size_t p = at + kName.size();
    if (text.substr(p, 2) == "=\"") {
      p += 2;
    } else if (text.substr(p, 1) == ">") {
      p += 1;
    } else {
      continue;
    }
    if (p < text.size() && text[p] >= '0' && text[p] <= '9') return text[p] - '0';
  }
  return std::nullopt;
}

int image_orientation_from_metadata(std::span<const uint8_t> exif, std::span<const uint8_t> xmp) {
  std::optional<int64_t> value = image_exif_orientation(exif);
  if (!value) value = image_xmp_orientation(xmp);
  return value && *value >= 1 && *value <= 8 ? int(*value) : 1;
}

RgbImage image_apply_orientation(RgbImage image, int orientation) {
  if (orientation < 2 || orientation > 8) return image;
  const int w = image.width, h = image.height;
  const bool swaps = orientation >= 5;  // 5..8 exchange width and height
  RgbImage out(swaps ? h : w, swaps ? w : h);
  // For each output pixel (x, y), the input pixel it comes from (Pillow's Image.transpose methods).
  for (int y = 0; y < out.height; ++y) {
    uint8_t* o = out.row(y);
    for (int x = 0; x < out.width; ++x, o += 3) {
      int sx = x, sy = y;
      switch (orientation) {
        case 2: sx = w - 1 - x; break;                  // FLIP_LEFT_RIGHT
        case 3: sx = w - 1 - x, sy = h - 1 - y; break;  // ROTATE_180
        case 4: sy = h - 1 - y; break;                  // FLIP_TOP_BOTTOM
        case 5: sx = y, sy = x; break;                  // TRANSPOSE
        case 6: sx = y, sy = h - 1 - x; break;          // ROTATE_270 (90 degrees clockwise)
        case 7: sx = w - 1 - y, sy = h - 1 - x; break;  // TRANSVERSE
        case 8: sx = w - 1 - y, sy = x; break;          // ROTATE_90 (90 degrees counter-clockwise)
      }
      std::memcpy(o, image.row(sy) + 3 * size_t(sx), 3);
    }
  }
  return out;
}

}  // namespace tern
