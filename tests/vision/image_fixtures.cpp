#include "image_fixtures.h"

#include <cstdio>
// clang-format off: jpeglib.h needs <cstdio> before it
#include <jpeglib.h>
// clang-format on
#include <webp/encode.h>

#include <cstring>
#include <stdexcept>

namespace tern::test {
namespace {

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
}
void put_le16(Bytes& b, uint32_t v) {
  b.push_back(uint8_t(v));
  b.push_back(uint8_t(v >> 8));
}
void put_le32(Bytes& b, uint32_t v) {
  for (int s = 0; s < 32; s += 8) b.push_back(uint8_t(v >> s));
}
void put(Bytes& b, const char* s) { b.insert(b.end(), s, s + std::strlen(s)); }

uint32_t crc32(const uint8_t* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
  }
  return ~crc;
}

void png_chunk(Bytes& out, const std::string& type, const Bytes& data) {
  put_be32(out, uint32_t(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type.begin(), type.end());
  out.insert(out.end(), data.begin(), data.end());
  put_be32(out, crc32(out.data() + start, out.size() - start));
}

// zlib with stored (uncompressed) deflate blocks.
Bytes zlib_stored(const Bytes& raw) {
  Bytes z = {0x78, 0x01};
  size_t at = 0;
  do {
    const size_t n = std::min<size_t>(raw.size() - at, 65535);
    z.push_back(at + n == raw.size() ? 1 : 0);
    put_le16(z, uint32_t(n));
    put_le16(z, uint32_t(~n & 0xffff));
    z.insert(z.end(), raw.begin() + long(at), raw.begin() + long(at + n));
    at += n;
  } while (at < raw.size());
  uint32_t a = 1, b = 0;
  for (uint8_t v : raw) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  put_be32(z, b << 16 | a);
  return z;
}

}  // namespace

RgbImage fixture_image(int width, int height, uint32_t seed) {
  RgbImage image(width, height);
  uint32_t s = seed * 2654435761u + 12345u;
  for (uint8_t& v : image.pixels) {
    s = s * 1664525u + 1013904223u;
    v = uint8_t(s >> 24);
  }
  return image;
}

Bytes png_write(int width, int height, int channels, const Bytes& samples, const std::vector<PngChunk>& extra,
                int declared_width, int declared_height) {
  static const int kColorType[5] = {0, 0, 4, 2, 6};
  Bytes out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes ihdr;
  put_be32(ihdr, uint32_t(declared_width >= 0 ? declared_width : width));
  put_be32(ihdr, uint32_t(declared_height >= 0 ? declared_height : height));
  ihdr.insert(ihdr.end(), {8, uint8_t(kColorType[channels]), 0, 0, 0});
  png_chunk(out, "IHDR", ihdr);
  for (const PngChunk& c : extra) png_chunk(out, c.type, c.data);
  Bytes raw;
  const size_t row = size_t(width) * size_t(channels);
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), samples.begin() + long(y * row), samples.begin() + long((y + 1) * row));
  }
  png_chunk(out, "IDAT", zlib_stored(raw));
  png_chunk(out, "IEND", {});
  return out;
}

Bytes png_write_rgb(const RgbImage& image, const std::vector<PngChunk>& extra) {
  return png_write(image.width, image.height, 3, image.pixels, extra);
}

Bytes jpeg_write_rgb(const RgbImage& image, int quality, const std::vector<Bytes>& app1) {
  jpeg_compress_struct c;
  jpeg_error_mgr errors;
  c.err = jpeg_std_error(&errors);
  jpeg_create_compress(&c);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buffer, &size);
  c.image_width = JDIMENSION(image.width);
  c.image_height = JDIMENSION(image.height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  c.comp_info[0].h_samp_factor = c.comp_info[0].v_samp_factor = 1;  // 4:4:4
  jpeg_start_compress(&c, TRUE);
  for (const Bytes& a : app1) jpeg_write_marker(&c, JPEG_APP0 + 1, a.data(), unsigned(a.size()));
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(image.row(int(c.next_scanline)));
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  Bytes out(buffer, buffer + size);
  free(buffer);
  jpeg_destroy_compress(&c);
  return out;
}

Bytes webp_write_lossless_rgb(const RgbImage& image, const Bytes& exif) {
  uint8_t* data = nullptr;
  const size_t size = WebPEncodeLosslessRGB(image.pixels.data(), image.width, image.height, image.width * 3, &data);
  if (size == 0) throw std::runtime_error("WebPEncodeLosslessRGB failed");
  Bytes simple(data, data + size);
  WebPFree(data);
  if (exif.empty()) return simple;
  // RIFF, VP8X (EXIF flag, canvas size), the simple file's VP8L chunk, EXIF.
  Bytes body;
  put(body, "WEBP");
  put(body, "VP8X");
  put_le32(body, 10);
  body.insert(body.end(), {0x08, 0, 0, 0});
  for (int v : {image.width - 1, image.height - 1})
    body.insert(body.end(), {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16)});
  body.insert(body.end(), simple.begin() + 12, simple.end());
  put(body, "EXIF");
  put_le32(body, uint32_t(exif.size()));
  body.insert(body.end(), exif.begin(), exif.end());
  if (exif.size() % 2) body.push_back(0);
  Bytes out;
  put(out, "RIFF");
  put_le32(out, uint32_t(body.size()));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

Bytes gif_write(int screen_width, int screen_height, int left, int top, int width, int height, const Bytes& indices,
                const std::vector<uint8_t>& global_palette_rgb, int transparent, bool interlace) {
  Bytes out;
  put(out, "GIF89a");
  put_le16(out, uint32_t(screen_width));
  put_le16(out, uint32_t(screen_height));
  if (!global_palette_rgb.empty()) {
    int bits = 1;
    while ((3u << bits) < global_palette_rgb.size()) ++bits;
    out.insert(out.end(), {uint8_t(0x80 | 0x70 | (bits - 1)), 0, 0});
    Bytes pal = global_palette_rgb;
    pal.resize(3u << bits, 0);
    out.insert(out.end(), pal.begin(), pal.end());
  } else {
    out.insert(out.end(), {0, 0, 0});
  }
  if (transparent >= 0) out.insert(out.end(), {'!', 0xf9, 4, 1, 0, 0, uint8_t(transparent), 0});
  out.push_back(',');
  for (int v : {left, top, width, height}) put_le16(out, uint32_t(v));
  out.push_back(interlace ? 0x40 : 0);
  // LZW with 8-bit literals and a clear code every 254 of them, so that codes stay 9 bits.
  std::vector<int> rows;
  if (interlace) {
    for (int pass : {0, 1, 2, 3})
      for (int y = pass == 0   ? 0
                   : pass == 1 ? 4
                   : pass == 2 ? 2
                               : 1;
           y < height; y += pass <= 1   ? 8
                            : pass == 2 ? 4
                                        : 2)
        rows.push_back(y);
  } else {
    for (int y = 0; y < height; ++y) rows.push_back(y);
  }
  std::vector<int> codes;
  int literals = 0;
  for (int y : rows)
    for (int x = 0; x < width; ++x) {
      if (literals++ % 254 == 0) codes.push_back(256);
      codes.push_back(indices[size_t(y) * size_t(width) + size_t(x)]);
    }
  codes.push_back(257);
  Bytes lzw;
  uint32_t acc = 0;
  int nbits = 0;
  for (int c : codes) {
    acc |= uint32_t(c) << nbits;
    nbits += 9;
    while (nbits >= 8) {
      lzw.push_back(uint8_t(acc));
      acc >>= 8;
      nbits -= 8;
    }
  }
  if (nbits) lzw.push_back(uint8_t(acc));
  out.push_back(8);
  for (size_t at = 0; at < lzw.size(); at += 255) {
    const size_t n = std::min<size_t>(255, lzw.size() - at);
    out.push_back(uint8_t(n));
    out.insert(out.end(), lzw.begin() + long(at), lzw.begin() + long(at + n));
  }
  out.push_back(0);
  out.push_back(';');
  return out;
}

Bytes exif_orientation_block(uint32_t orientation, bool big_endian, uint16_t type, uint32_t count) {
  Bytes b;
  put(b, "Exif");
  b.insert(b.end(), {0, 0});
  auto u16 = [&](uint32_t v) {
    if (big_endian)
      b.insert(b.end(), {uint8_t(v >> 8), uint8_t(v)});
    else
      b.insert(b.end(), {uint8_t(v), uint8_t(v >> 8)});
  };
  auto u32 = [&](uint32_t v) {
    if (big_endian)
      put_be32(b, v);
    else
      put_le32(b, v);
  };
  if (big_endian)
    b.insert(b.end(), {'M', 'M', 0, '*'});
  else
    b.insert(b.end(), {'I', 'I', '*', 0});
  u32(8);  // IFD0 right after the header
  u16(1);  // one entry
  u16(0x0112);
  u16(type);
  u32(count);
  if (type == 3) {
    u16(orientation);
    u16(0);
  } else if (type == 1) {
    b.insert(b.end(), {uint8_t(orientation), 0, 0, 0});
  } else {
    u32(orientation);
  }
  u32(0);  // no next IFD
  return b;
}

}  // namespace tern::test
