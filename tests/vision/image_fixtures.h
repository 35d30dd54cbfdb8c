// Small images written in memory for the vision tests: PNG and GIF by hand (every byte under the test's control:
// chunks, declared sizes, palettes), JPEG through libjpeg and WebP through libwebp's encoders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vision/image.h"

namespace tern::test {

using Bytes = std::vector<uint8_t>;

// A random-looking RGB image whose pixels all differ from their neighbours (deterministic in `seed`).
RgbImage fixture_image(int width, int height, uint32_t seed);

struct PngChunk {
  std::string type;  // four letters
  Bytes data;
};
// A PNG of 8-bit samples (`channels` per pixel: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA; color_type to match), the
// pixel data stored uncompressed in zlib. `extra` chunks go before IDAT. `declared_width/height` (when >= 0)
// replace the real size in IHDR.
Bytes png_write(int width, int height, int channels, const Bytes& samples, const std::vector<PngChunk>& extra = {},
                int declared_width = -1, int declared_height = -1);
Bytes png_write_rgb(const RgbImage& image, const std::vector<PngChunk>& extra = {});

// Baseline JPEG (4:4:4 at quality 100 unless told), with optional APP1 segments written after the header.
Bytes jpeg_write_rgb(const RgbImage& image, int quality = 100, const std::vector<Bytes>& app1 = {});

// Lossless WebP; with `exif`, in the extended (VP8X) container with an EXIF chunk.
Bytes webp_write_lossless_rgb(const RgbImage& image, const Bytes& exif = {});

// A GIF89a of one frame of palette indices at (left, top) on a screen; `transparent` < 0 for none.
Bytes gif_write(int screen_width, int screen_height, int left, int top, int width, int height, const Bytes& indices,
                const std::vector<uint8_t>& global_palette_rgb, int transparent = -1, bool interlace = false);

// A TIFF-structured EXIF block ("Exif\0\0" + header + IFD0 with one Orientation entry of the given type and count).
Bytes exif_orientation_block(uint32_t orientation, bool big_endian = false, uint16_t type = 3, uint32_t count = 1);

}  // namespace tern::test
