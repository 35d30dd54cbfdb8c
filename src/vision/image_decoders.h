// The per-format decoders behind image_decode (private to src/vision). Each turns a whole file into RGB as stored
// (not yet turned upright) exactly as Pillow's Image.open followed by transformers' convert_to_rgb does: Pillow's
// mode for the file, converted to RGB, any alpha or transparency key composited onto white. Each checks the
// declared size against the limits before allocating pixels, throws ImageError with the reason only (image_decode
// adds which image), and collects the metadata that may carry an orientation.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vision/image.h"

namespace tern::vision_detail {

// Where an orientation may be written, as the file holds it (each empty when absent).
struct ImageMetadata {
  std::vector<uint8_t> exif;     // a TIFF structure, with or without a leading "Exif\0\0"
  std::vector<uint8_t> xmp;      // XMP packet text
  std::string raw_profile_exif;  // PNG "Raw profile type exif" text (ImageMagick's hex form)
};

RgbImage decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits, ImageMetadata& meta);
RgbImage decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits, ImageMetadata& meta);
RgbImage decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits, ImageMetadata& meta);
RgbImage decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits);

// Throws ImageError(too_large / empty) unless width x height fits the limits. `what` names the dimensions
// ("declared size", "GIF frame extent").
void check_image_size(int64_t width, int64_t height, const ImageLimits& limits, const char* what = "size");

// PIL's alpha_composite over opaque white, per channel: exactly round(v * a / 255 + 255 * (1 - a / 255)).
inline uint8_t composite_on_white(uint32_t v, uint32_t alpha) {
  return uint8_t((v * alpha + 255 * (255 - alpha) + 127) / 255);
}

}  // namespace tern::vision_detail
