// Bytes to an upright RGB image, as the reference pipeline sees an image: Pillow's Image.open, ImageOps.exif_transpose
// and transformers' convert_to_rgb (alpha and transparency keys composited onto white). PNG (libpng), JPEG
// (libjpeg-turbo), WebP (libwebp) and GIF (giflib; the first frame), told apart by their first bytes, never by a
// name. Every failure is an ImageError whose message starts with the image's name and says why; the declared
// dimensions are checked against ImageLimits before any pixel memory is allocated.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "vision/image.h"

namespace tern {

struct DecodedImage {
  RgbImage image;  // upright
  ImageFormat format = ImageFormat::png;
  int orientation = 1;  // the EXIF/XMP orientation that was applied (1: none)
};

// The format the first bytes announce, or nullopt.
std::optional<ImageFormat> image_sniff_format(std::span<const uint8_t> bytes);

// `name` says which image in messages ("image 2", "messages[1].content[0]").
DecodedImage image_decode(std::span<const uint8_t> bytes, const ImageLimits& limits, const std::string& name);

}  // namespace tern
