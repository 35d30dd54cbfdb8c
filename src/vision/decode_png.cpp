// PNG through libpng, giving the RGB Pillow gives (PngImagePlugin's modes, then convert_to_rgb):
//   gray 1/2/4/8 bit   scaled to 8 bits (x255, x85, x17, x1)
//   gray 16 bit        Pillow's "I;16", clipped to 255 (not scaled)
//   RGB, gray+alpha, RGBA at 16 bits   the high byte of each sample
//   palette            PLTE (entries past its end black), alpha from tRNS (entries past its end opaque)
// A gray or RGB tRNS key makes transparent the pixels whose 8-bit values equal the key's low byte (Pillow's
// convert_transparent; at 1 bit the key is 0 or 255 first), unscaled at 2 and 4 bits as in Pillow. Then anything
// transparent is composited onto white. No gamma, sRGB or ICC handling (Pillow applies none).
//
// libpng reports errors by longjmp. The functions that call into libpng under a setjmp hold only plain data in
// their frames; the handles and buffers they fill live in the caller (C++ objects that longjmp never skips).
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "vision/image_decoders.h"

namespace tern::vision_detail {
namespace {

struct PngReader {
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  bool ran_out = false;
  char message[256] = {};
};

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->size - r->pos) {
    r->ran_out = true;
    png_error(png, "the data ends early");
  }
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

[[noreturn]] void png_on_error(png_structp png, png_const_charp message) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

struct PngHandles {
  png_structp png = nullptr;
  png_infop info = nullptr, end = nullptr;
  ~PngHandles() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, end ? &end : nullptr);
  }
};

// The samples libpng hands over (after packing and, except for 16-bit gray, stripping to 8 bits) and what turns
// them into RGB.
struct PngPixels {
  uint32_t width = 0, height = 0;
  int color_type = 0, bit_depth = 0, interlace = 0;
  size_t row_bytes = 0;
  png_color palette[256] = {};
  uint8_t palette_alpha[256] = {};
  bool has_key = false;
  png_color_16 key = {};
};

bool png_read_header(PngHandles& h, PngPixels& px) {
  if (setjmp(png_jmpbuf(h.png))) return false;
  png_read_info(h.png, h.info);
  int depth = 0, color = 0, interlace = 0;
  png_get_IHDR(h.png, h.info, &px.width, &px.height, &depth, &color, &interlace, nullptr, nullptr);
  px.color_type = color;
  px.bit_depth = depth;
  px.interlace = interlace;
  std::fill(std::begin(px.palette_alpha), std::end(px.palette_alpha), uint8_t(255));
  if (color == PNG_COLOR_TYPE_PALETTE) {
    png_colorp plte = nullptr;
    int n = 0;
    if (png_get_PLTE(h.png, h.info, &plte, &n) & PNG_INFO_PLTE)
      for (int i = 0; i < n && i < 256; ++i) px.palette[i] = plte[i];
  }
  png_bytep trans = nullptr;
  int n_trans = 0;
  png_color_16p key = nullptr;
  if (png_get_tRNS(h.png, h.info, &trans, &n_trans, &key) & PNG_INFO_tRNS) {
    if (color == PNG_COLOR_TYPE_PALETTE && trans) {
      for (int i = 0; i < n_trans && i < 256; ++i) px.palette_alpha[i] = trans[i];
    } else if ((color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_RGB) && key) {
      px.has_key = true;
      px.key = *key;
    }
  }
  if (depth < 8) png_set_packing(h.png);                                     // one byte per sample, values unscaled
  if (depth == 16 && color != PNG_COLOR_TYPE_GRAY) png_set_strip_16(h.png);  // the high byte, as Pillow's ;16B modes
  if (interlace != PNG_INTERLACE_NONE) png_set_interlace_handling(h.png);
  png_read_update_info(h.png, h.info);
  px.row_bytes = png_get_rowbytes(h.png, h.info);
  return true;
}

void png_row_to_rgb(const uint8_t* in, uint8_t* out, const PngPixels& px) {
  const uint32_t w = px.width;
  switch (px.color_type) {
    case PNG_COLOR_TYPE_GRAY: {
      const uint32_t key = px.bit_depth == 1 ? (px.key.gray ? 255u : 0u) : px.key.gray & 0xffu;
      if (px.bit_depth == 16) {
        for (uint32_t x = 0; x < w; ++x, out += 3) {
          const uint32_t v = std::min<uint32_t>(uint32_t(in[2 * x]) << 8 | in[2 * x + 1], 255);
          out[0] = out[1] = out[2] = (px.has_key && v == key) ? 255 : uint8_t(v);
        }
        break;
      }
      const uint32_t scale = px.bit_depth == 1 ? 255 : px.bit_depth == 2 ? 85 : px.bit_depth == 4 ? 17 : 1;
      for (uint32_t x = 0; x < w; ++x, out += 3) {
        const uint32_t v = in[x] * scale;
        out[0] = out[1] = out[2] = (px.has_key && v == key) ? 255 : uint8_t(v);
      }
      break;
    }
    case PNG_COLOR_TYPE_RGB:
      for (uint32_t x = 0; x < w; ++x, in += 3, out += 3) {
        const bool transparent = px.has_key && in[0] == (px.key.red & 0xff) && in[1] == (px.key.green & 0xff) &&
                                 in[2] == (px.key.blue & 0xff);
        out[0] = transparent ? 255 : in[0];
        out[1] = transparent ? 255 : in[1];
        out[2] = transparent ? 255 : in[2];
      }
      break;
    case PNG_COLOR_TYPE_PALETTE:
      for (uint32_t x = 0; x < w; ++x, out += 3) {
        const png_color c = px.palette[in[x]];
        const uint32_t a = px.palette_alpha[in[x]];
        out[0] = composite_on_white(c.red, a);
        out[1] = composite_on_white(c.green, a);
        out[2] = composite_on_white(c.blue, a);
      }
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      for (uint32_t x = 0; x < w; ++x, in += 2, out += 3) out[0] = out[1] = out[2] = composite_on_white(in[0], in[1]);
      break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      for (uint32_t x = 0; x < w; ++x, in += 4, out += 3)
        for (int c = 0; c < 3; ++c) out[c] = composite_on_white(in[c], in[3]);
      break;
  }
}

// Rows one at a time into `row` (non-interlaced) or all at once into `whole` (interlaced), converted into `out`.
bool png_read_pixels(PngHandles& h, const PngPixels& px, uint8_t* row, uint8_t* whole, png_bytep* row_pointers,
                     RgbImage& out) {
  if (setjmp(png_jmpbuf(h.png))) return false;
  if (px.interlace == PNG_INTERLACE_NONE) {
    for (uint32_t y = 0; y < px.height; ++y) {
      png_read_row(h.png, row, nullptr);
      png_row_to_rgb(row, out.row(int(y)), px);
    }
  } else {
    for (uint32_t y = 0; y < px.height; ++y) row_pointers[y] = whole + size_t(y) * px.row_bytes;
    png_read_image(h.png, row_pointers);
    for (uint32_t y = 0; y < px.height; ++y) png_row_to_rgb(row_pointers[y], out.row(int(y)), px);
  }
  return true;
}

// The chunks after the image data (an eXIf may be there). Pillow stops quietly at a damaged tail, and so do we.
bool png_read_tail(PngHandles& h) {
  if (setjmp(png_jmpbuf(h.png))) return false;
  png_read_end(h.png, h.end);
  return true;
}

void png_collect_metadata(png_structp png, png_infop info, ImageMetadata& meta) {
  if (!info) return;
  png_bytep exif = nullptr;
  png_uint_32 n_exif = 0;
  if (png_get_eXIf_1(png, info, &n_exif, &exif) && exif && n_exif > 0) {
    // Pillow keeps an eXIf chunk as "Exif\0\0" + its bytes.
    static const uint8_t prefix[6] = {'E', 'x', 'i', 'f', 0, 0};
    meta.exif.assign(prefix, prefix + 6);
    meta.exif.insert(meta.exif.end(), exif, exif + n_exif);
  }
  png_textp text = nullptr;
  int n_text = 0;
  png_get_text(png, info, &text, &n_text);
  for (int i = 0; i < n_text; ++i) {
    if (!text[i].key || !text[i].text) continue;
    const size_t len = std::strlen(text[i].text);
    if (std::strcmp(text[i].key, "XML:com.adobe.xmp") == 0)
      meta.xmp.assign(text[i].text, text[i].text + len);
    else if (std::strcmp(text[i].key, "Raw profile type exif") == 0)
      meta.raw_profile_exif.assign(text[i].text, len);
  }
}

uint32_t read_be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

// The bytes up to the first chunk whose declared length runs past the end of the data (all of them when none does,
// or from IEND on). libpng allocates (and zeroes) a chunk's declared length before it reads the data, so a 1 KB file
// that declares a 1 GB text chunk would cost a gigabyte and a second; cut there, libpng runs out of data at that
// chunk instead, which is where it would have failed anyway (and a damaged tail after the pixels is dropped quietly,
// as before).
size_t png_framed_size(std::span<const uint8_t> bytes) {
  size_t pos = 8;  // past the signature
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) return pos;  // not even a whole header and CRC
    const uint64_t length = read_be32(bytes.data() + pos);
    if (length > bytes.size() - pos - 12) return pos;  // its data and CRC are not all there
    if (std::memcmp(bytes.data() + pos + 4, "IEND", 4) == 0) break;
    pos += 12 + size_t(length);
  }
  return bytes.size();
}

}  // namespace

RgbImage decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits, ImageMetadata& meta) {
  // The size from IHDR (the first chunk, at a fixed place) before libpng reads anything.
  if (bytes.size() < 33) throw ImageError(ImageErrorKind::truncated, "the PNG data ends inside its header");
  if (std::memcmp(bytes.data() + 12, "IHDR", 4) != 0)
    throw ImageError(ImageErrorKind::corrupt, "the PNG does not start with an IHDR chunk");
  check_image_size(read_be32(bytes.data() + 16), read_be32(bytes.data() + 20), limits);

  PngReader reader;
  reader.data = bytes.data();
  reader.size = png_framed_size(bytes);
  PngHandles h;
  h.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, png_on_error, png_on_warning);
  if (!h.png) throw std::bad_alloc();
  h.info = png_create_info_struct(h.png);
  h.end = png_create_info_struct(h.png);
  if (!h.info || !h.end) throw std::bad_alloc();
  png_set_read_fn(h.png, &reader, png_read_bytes);
  png_set_user_limits(h.png, uint32_t(limits.max_side), uint32_t(limits.max_side));
  png_set_chunk_malloc_max(h.png, 16u << 20);  // one ancillary chunk (text, ICC, eXIf) inflates to 16 MiB at most

  auto fail = [&](const char* stage) {
    throw ImageError(reader.ran_out ? ImageErrorKind::truncated : ImageErrorKind::corrupt,
                     std::string("the PNG ") + (reader.ran_out ? "data ends early" : "is corrupt") + " (" + stage +
                         ": libpng: " + reader.message + ")");
  };
  PngPixels px;
  if (!png_read_header(h, px)) fail("header");
  check_image_size(px.width, px.height, limits);

  RgbImage out(int(px.width), int(px.height));
  std::vector<uint8_t> row, whole;
  std::vector<png_bytep> row_pointers;
  if (px.interlace == PNG_INTERLACE_NONE) {
    row.resize(px.row_bytes);
  } else {
    whole.resize(px.row_bytes * px.height);
    row_pointers.resize(px.height);
  }
  if (!png_read_pixels(h, px, row.data(), whole.data(), row_pointers.data(), out)) fail("image data");
  const bool tail = png_read_tail(h);
  png_collect_metadata(h.png, h.info, meta);
  if (tail) png_collect_metadata(h.png, h.end, meta);
  return out;
}

}  // namespace tern::vision_detail
