// Orientation from an image's metadata, read as Pillow's ImageOps.exif_transpose reads it, and the turn or flip
// that makes the image upright.
//
// Orientation values (EXIF tag 0x0112): 1 as stored, 2 mirrored left-right, 3 turned 180 degrees, 4 mirrored
// top-bottom, 5 transposed (mirrored about the main diagonal), 6 turned 90 degrees clockwise to be upright, 7
// transversed (mirrored about the other diagonal), 8 turned 90 degrees counter-clockwise. Anything else: as stored.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "vision/image.h"

namespace tern {

// The Orientation entry of IFD0 in an EXIF block (a TIFF structure, "II*\0" or "MM\0*", with or without a leading
// "Exif\0\0"). nullopt when the block or the entry is absent or unreadable; an entry that is present but not one
// integer gives 0 (present, meaning "as stored"). Never reads outside `exif`.
std::optional<int64_t> image_exif_orientation(std::span<const uint8_t> exif);

// The first tiff:Orientation="N" or <tiff:Orientation>N in an XMP packet (Pillow's pattern), or nullopt.
std::optional<int> image_xmp_orientation(std::span<const uint8_t> xmp);

// EXIF first; XMP only when the EXIF block has no Orientation entry. Returns 1..8 (1 when nothing applies).
int image_orientation_from_metadata(std::span<const uint8_t> exif, std::span<const uint8_t> xmp);

// The upright image for an orientation (1..8; other values return the image unchanged).
RgbImage image_apply_orientation(RgbImage image, int orientation);

}  // namespace tern
