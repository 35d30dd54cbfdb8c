// GIF through giflib's record-level API, reading only the first frame, as Pillow shows it: a canvas of the logical
// screen (grown if the frame reaches past it), filled with the frame's transparent index when it has one and with
// index 0 otherwise, the frame drawn at its offset, then each index looked up in the frame's palette (local, else
// global; entries past its end black; no palette, or one that maps every index i to (i, i, i), gives gray i) and
// the transparent index made white. giflib reports errors by return codes.
#include <gif_lib.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "vision/image_decoders.h"

namespace tern::vision_detail {
namespace {

struct GifReader {
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  bool ran_out = false;
};

int gif_read_bytes(GifFileType* gif, GifByteType* out, int n) {
  auto* r = static_cast<GifReader*>(gif->UserData);
  const size_t want = n > 0 ? size_t(n) : 0;
  const size_t got = std::min(want, r->size - r->pos);
  if (got < want) r->ran_out = true;
  std::memcpy(out, r->data + r->pos, got);
  r->pos += got;
  return int(got);
}

struct GifCloser {
  void operator()(GifFileType* gif) const {
    int error = 0;
    DGifCloseFile(gif, &error);
  }
};

[[noreturn]] void gif_fail(const GifReader& reader, int error, const char* stage) {
  const char* text = GifErrorString(error);
  const std::string detail = std::string(" (") + stage + ": giflib: " + (text ? text : "unknown error") + ")";
  if (reader.ran_out || error == D_GIF_ERR_READ_FAILED || error == D_GIF_ERR_EOF_TOO_SOON)
    throw ImageError(ImageErrorKind::truncated, "the GIF data ends early" + detail);
  if (error == D_GIF_ERR_NOT_ENOUGH_MEM) throw std::bad_alloc();
  throw ImageError(ImageErrorKind::corrupt, "the GIF is corrupt" + detail);
}

// Pillow's _is_palette_needed: false when entry i is (i, i, i) for every entry.
bool palette_is_gray_ramp(const ColorMapObject* map) {
  for (int i = 0; i < map->ColorCount; ++i) {
    const GifColorType c = map->Colors[i];
    if (c.Red != i || c.Green != i || c.Blue != i) return false;
  }
  return true;
}

}  // namespace

RgbImage decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  GifReader reader;
  reader.data = bytes.data();
  reader.size = bytes.size();
  int error = 0;
  std::unique_ptr<GifFileType, GifCloser> gif(DGifOpen(&reader, gif_read_bytes, &error));
  if (!gif) gif_fail(reader, error, "screen descriptor");
  int transparent = -1;
  for (;;) {
    GifRecordType record = UNDEFINED_RECORD_TYPE;
    if (DGifGetRecordType(gif.get(), &record) == GIF_ERROR) gif_fail(reader, gif->Error, "record");
    if (record == TERMINATE_RECORD_TYPE) throw ImageError(ImageErrorKind::corrupt, "the GIF holds no image");
    if (record == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* block = nullptr;
      if (DGifGetExtension(gif.get(), &code, &block) == GIF_ERROR) gif_fail(reader, gif->Error, "extension");
      // Graphic control: block[0] is the length, then flags, delay (2 bytes), transparent index.
      if (code == GRAPHICS_EXT_FUNC_CODE && block && block[0] >= 4 && (block[1] & 1)) transparent = block[4];
      while (block) {
        if (DGifGetExtensionNext(gif.get(), &block) == GIF_ERROR) gif_fail(reader, gif->Error, "extension");
      }
      continue;
    }
    if (record != IMAGE_DESC_RECORD_TYPE) continue;

    if (DGifGetImageDesc(gif.get()) == GIF_ERROR) gif_fail(reader, gif->Error, "image descriptor");
    const GifImageDesc& frame = gif->Image;
    const int64_t right = int64_t(frame.Left) + frame.Width, bottom = int64_t(frame.Top) + frame.Height;
    const int64_t width = std::max<int64_t>(gif->SWidth, right), height = std::max<int64_t>(gif->SHeight, bottom);
    check_image_size(width, height, limits);

    std::vector<uint8_t> canvas(size_t(width) * size_t(height), uint8_t(transparent >= 0 ? transparent : 0));
    if (frame.Width > 0 && frame.Height > 0) {
      // Interlaced frames store rows 0, 8, 16, ..., then 4, 12, ..., then 2, 6, ..., then 1, 3, ...
      static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
      const int passes = frame.Interlace ? 4 : 1;
      for (int pass = 0; pass < passes; ++pass) {
        const int start = frame.Interlace ? kStart[pass] : 0, step = frame.Interlace ? kStep[pass] : 1;
        for (int y = start; y < frame.Height; y += step) {
          GifPixelType* row = canvas.data() + size_t(frame.Top + y) * size_t(width) + size_t(frame.Left);
          if (DGifGetLine(gif.get(), row, frame.Width) == GIF_ERROR) gif_fail(reader, gif->Error, "image data");
        }
      }
    }

    const ColorMapObject* map = frame.ColorMap ? frame.ColorMap : gif->SColorMap;
    uint8_t lut[256][3] = {};
    const bool gray = !map || palette_is_gray_ramp(map);
    for (int i = 0; i < 256; ++i) {
      if (gray) {
        lut[i][0] = lut[i][1] = lut[i][2] = uint8_t(i);
      } else if (i < map->ColorCount) {
        lut[i][0] = map->Colors[i].Red, lut[i][1] = map->Colors[i].Green, lut[i][2] = map->Colors[i].Blue;
      }
    }
    if (transparent >= 0) lut[transparent][0] = lut[transparent][1] = lut[transparent][2] = 255;
    RgbImage out{int(width), int(height)};
    for (size_t i = 0; i < canvas.size(); ++i) std::memcpy(&out.pixels[3 * i], lut[canvas[i]], 3);
    return out;
  }
}

}  // namespace tern::vision_detail
