// image_decode: each format decoded as Pillow + convert_to_rgb would (exact where the format is lossless), and bad
// input refused with an ImageError that names the image and says why: unknown and unsupported formats, empty data,
// zero sizes, truncated and corrupt files of every format, and decompression bombs (a tiny file declaring a huge
// size is refused from its header, before any pixel memory is allocated). The pixel-exact comparison with Pillow
// itself is tests/py/test_image_processor.py.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>

#include <sys/resource.h>

#include "image_fixtures.h"
#include "vision/image_decode.h"

// The largest single C++ allocation made while `g_track_allocations` is set (the decoders' own buffers; the C
// libraries allocate through malloc and are only reached after the size checks).
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

void* operator new(size_t n) {
  if (g_track_allocations.load(std::memory_order_relaxed)) {
    size_t seen = g_largest_allocation.load();
    while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n)) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// GCC takes free() in a replacement operator delete for a mismatch with new; here it is the matching pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace tern {
namespace {

using test::Bytes;

DecodedImage decode(const Bytes& b, const ImageLimits& limits = {}) { return image_decode(b, limits, "image 3"); }

// The ImageError a decode throws (fails the test when it succeeds or throws anything else).
ImageError decode_error(const Bytes& b, const ImageLimits& limits = {}) {
  try {
    decode(b, limits);
  } catch (const ImageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("image 3: ", 0), 0u) << e.what();
    return e;
  }
  ADD_FAILURE() << "decoded without an error";
  return ImageError(ImageErrorKind::corrupt, "");
}

void expect_same(const RgbImage& a, const RgbImage& b) {
  ASSERT_EQ(a.width, b.width);
  ASSERT_EQ(a.height, b.height);
  EXPECT_EQ(a.pixels, b.pixels);
}

void put_be16(Bytes& b, size_t at, uint32_t v) {
  b[at] = uint8_t(v >> 8);
  b[at + 1] = uint8_t(v);
}

TEST(ImageDecode, FormatsAreToldByTheirFirstBytes) {
  const RgbImage img = test::fixture_image(5, 4, 1);
  EXPECT_EQ(image_sniff_format(test::png_write_rgb(img)), ImageFormat::png);
  EXPECT_EQ(image_sniff_format(test::jpeg_write_rgb(img)), ImageFormat::jpeg);
  EXPECT_EQ(image_sniff_format(test::webp_write_lossless_rgb(img)), ImageFormat::webp);
  EXPECT_EQ(image_sniff_format(test::gif_write(2, 1, 0, 0, 2, 1, {0, 1}, {0, 0, 0, 255, 255, 255})), ImageFormat::gif);
  EXPECT_EQ(image_sniff_format(Bytes{'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'A', 'V', 'E'}), std::nullopt);
  EXPECT_EQ(image_sniff_format(Bytes{0xff, 0xd8}), std::nullopt);
}

TEST(ImageDecode, UnsupportedAndUnknownFormatsAreNamed) {
  ImageError bmp = decode_error(Bytes{'B', 'M', 1, 2, 3, 4, 5, 6});
  EXPECT_EQ(bmp.kind(), ImageErrorKind::unsupported_format);
  EXPECT_NE(std::string(bmp.what()).find("BMP images are not supported"), std::string::npos) << bmp.what();
  ImageError avif = decode_error(Bytes{0, 0, 0, 0x1c, 'f', 't', 'y', 'p', 'a', 'v', 'i', 'f', 0, 0});
  EXPECT_NE(std::string(avif.what()).find("AVIF"), std::string::npos) << avif.what();
  ImageError html = decode_error(Bytes{'<', 'h', 't', 'm', 'l', '>'});
  EXPECT_EQ(html.kind(), ImageErrorKind::unsupported_format);
  EXPECT_NE(std::string(html.what()).find("not a PNG, JPEG, WebP or GIF image (its data starts 3c 68 74 6d 6c 3e)"),
            std::string::npos)
      << html.what();
  EXPECT_EQ(decode_error(Bytes{}).kind(), ImageErrorKind::empty);
}

TEST(ImageDecode, PngRgbGrayAndAlpha) {
  const RgbImage img = test::fixture_image(7, 5, 2);
  expect_same(decode(test::png_write_rgb(img)).image, img);

  Bytes gray(7 * 5), ga(7 * 5 * 2), rgba(7 * 5 * 4);
  for (size_t i = 0; i < gray.size(); ++i) {
    gray[i] = img.pixels[3 * i];
    ga[2 * i] = img.pixels[3 * i];
    ga[2 * i + 1] = img.pixels[3 * i + 1];
    for (int c = 0; c < 3; ++c) rgba[4 * i + size_t(c)] = img.pixels[3 * i + size_t(c)];
    rgba[4 * i + 3] = img.pixels[3 * i + 2];
  }
  rgba[3] = 0, rgba[7] = 255;  // fully transparent and opaque pixels too
  const RgbImage g = decode(test::png_write(7, 5, 1, gray)).image;
  const RgbImage la = decode(test::png_write(7, 5, 2, ga)).image;
  const RgbImage a = decode(test::png_write(7, 5, 4, rgba)).image;
  for (size_t i = 0; i < gray.size(); ++i) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(g.pixels[3 * i + size_t(c)], gray[i]);
      // Onto white: round(v * a / 255 + 255 * (1 - a / 255)).
      const double alpha = ga[2 * i + 1] / 255.0;
      EXPECT_EQ(la.pixels[3 * i + size_t(c)], uint8_t(std::lround(ga[2 * i] * alpha + 255 * (1 - alpha))));
      const double alpha4 = rgba[4 * i + 3] / 255.0;
      EXPECT_EQ(a.pixels[3 * i + size_t(c)],
                uint8_t(std::lround(rgba[4 * i + size_t(c)] * alpha4 + 255 * (1 - alpha4))));
    }
  }
  EXPECT_EQ(a.pixels[0], 255);      // alpha 0: white
  EXPECT_EQ(a.pixels[3], rgba[4]);  // alpha 255: as stored
}

TEST(ImageDecode, PngTransparencyKeyMakesWhite) {
  const Bytes gray = {10, 20, 30, 20};
  const RgbImage g = decode(test::png_write(4, 1, 1, gray, {{"tRNS", {0, 20}}})).image;
  EXPECT_EQ(g.pixels, (Bytes{10, 10, 10, 255, 255, 255, 30, 30, 30, 255, 255, 255}));
  const Bytes rgb = {1, 2, 3, 1, 2, 4};
  const RgbImage c = decode(test::png_write(2, 1, 3, rgb, {{"tRNS", {0, 1, 0, 2, 0, 3}}})).image;
  EXPECT_EQ(c.pixels, (Bytes{255, 255, 255, 1, 2, 4}));
}

TEST(ImageDecode, WebpLosslessIsExact) {
  const RgbImage img = test::fixture_image(9, 6, 3);
  const DecodedImage d = decode(test::webp_write_lossless_rgb(img));
  EXPECT_EQ(d.format, ImageFormat::webp);
  expect_same(d.image, img);
}

TEST(ImageDecode, JpegDecodesCloseToItsSource) {
  const RgbImage img = test::fixture_image(16, 16, 4);
  const DecodedImage d = decode(test::jpeg_write_rgb(img, 100));
  EXPECT_EQ(d.format, ImageFormat::jpeg);
  ASSERT_EQ(d.image.pixels.size(), img.pixels.size());
  int worst = 0;
  for (size_t i = 0; i < img.pixels.size(); ++i) worst = std::max(worst, std::abs(d.image.pixels[i] - img.pixels[i]));
  EXPECT_LE(worst, 8);  // quality 100, 4:4:4: only the colour transform and the quantiser's rounding
}

TEST(ImageDecode, GifFirstFrameOnItsScreen) {
  // Screen 4x3, a 2x2 frame at (1, 1); palette of 3 entries padded to 4 (the 4th black); index 5 is past the
  // palette (black); transparent index 1 (white, and the canvas outside the frame is filled with it).
  const std::vector<uint8_t> palette = {200, 10, 20, 0, 255, 0, 5, 6, 7};
  const DecodedImage d = decode(test::gif_write(4, 3, 1, 1, 2, 2, {0, 1, 2, 5}, palette, 1));
  EXPECT_EQ(d.format, ImageFormat::gif);
  ASSERT_EQ(d.image.width, 4);
  ASSERT_EQ(d.image.height, 3);
  const Bytes W = {255, 255, 255};
  auto px = [&](int x, int y) { return Bytes(d.image.row(y) + 3 * x, d.image.row(y) + 3 * x + 3); };
  EXPECT_EQ(px(0, 0), W);
  EXPECT_EQ(px(3, 2), W);
  EXPECT_EQ(px(1, 1), (Bytes{200, 10, 20}));
  EXPECT_EQ(px(2, 1), W);
  EXPECT_EQ(px(1, 2), (Bytes{5, 6, 7}));
  EXPECT_EQ(px(2, 2), (Bytes{0, 0, 0}));

  // Without transparency the canvas is index 0; a frame reaching past the screen grows the canvas.
  const DecodedImage grown = decode(test::gif_write(2, 2, 1, 1, 2, 2, {2, 2, 2, 2}, palette));
  EXPECT_EQ(grown.image.width, 3);
  EXPECT_EQ(grown.image.height, 3);
  EXPECT_EQ(Bytes(grown.image.row(0), grown.image.row(0) + 3), (Bytes{200, 10, 20}));
  EXPECT_EQ(Bytes(grown.image.row(2) + 6, grown.image.row(2) + 9), (Bytes{5, 6, 7}));

  // A palette mapping each index i to (i, i, i) is read as gray, indices past it included (Pillow's mode L).
  const DecodedImage gray = decode(test::gif_write(2, 1, 0, 0, 2, 1, {1, 9}, {0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(gray.image.pixels, (Bytes{1, 1, 1, 9, 9, 9}));
}

TEST(ImageDecode, GifInterlacedRowsLandInPlace) {
  const int w = 3, h = 11;
  Bytes indices(size_t(w * h));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) indices[size_t(y * w + x)] = uint8_t(y * 16 + x);
  std::vector<uint8_t> palette(256 * 3);
  for (int i = 0; i < 256; ++i) palette[size_t(3 * i)] = uint8_t(i), palette[size_t(3 * i + 1)] = 7;
  const RgbImage a = decode(test::gif_write(w, h, 0, 0, w, h, indices, palette, -1, true)).image;
  const RgbImage b = decode(test::gif_write(w, h, 0, 0, w, h, indices, palette, -1, false)).image;
  expect_same(a, b);
  EXPECT_EQ(a.row(10)[0], 160);
}

TEST(ImageDecode, DecompressionBombsAreRefusedFromTheHeader) {
  const auto start = std::chrono::steady_clock::now();
  g_largest_allocation = 0;
  g_track_allocations = true;
  // PNG: a 1x1 image whose IHDR says 100000 x 100000.
  const ImageError png = decode_error(test::png_write(1, 1, 3, {1, 2, 3}, {}, 100000, 100000));
  // Within the side limit but over the pixel count.
  const ImageError png_area = decode_error(test::png_write(1, 1, 3, {1, 2, 3}, {}, 16000, 16000));
  // JPEG: SOF0 patched to 60000 x 60000.
  Bytes jpeg = test::jpeg_write_rgb(test::fixture_image(8, 8, 5));
  for (size_t i = 0; i + 8 < jpeg.size(); ++i)
    if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0) {
      put_be16(jpeg, i + 5, 60000);
      put_be16(jpeg, i + 7, 60000);
      break;
    }
  const ImageError jpg = decode_error(jpeg);
  // GIF: a 65535 x 65535 screen; a frame placed far outside a small one.
  const ImageError gif = decode_error(test::gif_write(65535, 65535, 0, 0, 1, 1, {0}, {0, 0, 0, 1, 1, 1}));
  const ImageError gif_far = decode_error(test::gif_write(4, 4, 60000, 0, 1, 1, {0}, {0, 0, 0, 1, 1, 1}));
  // WebP: the lossless header (after the 0x2f signature: 14 bits width - 1, 14 bits height - 1, alpha, version)
  // patched to 16384 x 16384.
  Bytes webp = test::webp_write_lossless_rgb(test::fixture_image(2, 2, 6));
  webp[21] = 0xff, webp[22] = 0xff, webp[23] = 0xff, webp[24] = 0x0f;
  const ImageError wp = decode_error(webp);
  g_track_allocations = false;

  for (const ImageError* e : {&png, &png_area, &jpg, &gif, &gif_far, &wp})
    EXPECT_EQ(e->kind(), ImageErrorKind::too_large) << e->what();
  EXPECT_NE(std::string(png.what()).find("100000x100000, more than 16384 pixels on a side"), std::string::npos)
      << png.what();
  EXPECT_NE(std::string(png_area.what()).find("256000000 pixels, more than 67108864"), std::string::npos)
      << png_area.what();
  EXPECT_NE(std::string(jpg.what()).find("60000x60000"), std::string::npos) << jpg.what();
  EXPECT_NE(std::string(gif_far.what()).find("60001x4"), std::string::npos) << gif_far.what();
  EXPECT_NE(std::string(wp.what()).find("16384x16384"), std::string::npos) << wp.what();
  EXPECT_LT(g_largest_allocation.load(), size_t(1) << 20);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(ImageDecode, ZeroSizesAreRefused) {
  EXPECT_EQ(decode_error(test::png_write(1, 1, 3, {1, 2, 3}, {}, 0, 5)).kind(), ImageErrorKind::empty);
  EXPECT_EQ(decode_error(test::gif_write(0, 0, 0, 0, 0, 0, {}, {0, 0, 0, 1, 1, 1})).kind(), ImageErrorKind::empty);
}

TEST(ImageDecode, TruncatedFilesAreRefusedEveryWhere) {
  const RgbImage img = test::fixture_image(24, 20, 7);
  const std::vector<std::pair<const char*, Bytes>> files = {
      {"png", test::png_write_rgb(img)},
      {"jpeg", test::jpeg_write_rgb(img, 90)},
      {"webp", test::webp_write_lossless_rgb(img)},
      {"gif", test::gif_write(24, 20, 0, 0, 24, 20, Bytes(img.pixels.begin(), img.pixels.begin() + 480),
                              std::vector<uint8_t>(768, 9))},
  };
  for (const auto& [what, full] : files) {
    SCOPED_TRACE(what);
    for (size_t n = 1; n < full.size(); n += std::max<size_t>(1, full.size() / 97)) {
      const Bytes cut(full.begin(), full.begin() + long(n));
      try {
        decode(cut);
      } catch (const ImageError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("image 3: ", 0), 0u);
      }
    }
    // Cut inside the pixel data: an error that says the data ends early.
    const Bytes half(full.begin(), full.begin() + long(full.size() * 6 / 10));
    const ImageError e = decode_error(half);
    EXPECT_EQ(e.kind(), ImageErrorKind::truncated) << e.what();
    EXPECT_NE(std::string(e.what()).find("ends early"), std::string::npos) << e.what();
  }
}

// The peak resident memory of this process so far, in bytes.
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

// A PNG chunk that declares more bytes than the file holds: libpng would allocate (and zero) the declared length
// before reading it. Before the pixels it is the truncation it is (data ending early) without that allocation; after
// them the image decodes and the damaged tail is dropped, as Pillow does.
TEST(ImageDecode, PngChunkLongerThanTheFileCostsNoMemory) {
  const RgbImage img = test::fixture_image(16, 16, 5);
  const Bytes text = {'R', 'a', 'w', 0, 'x', 'y'};
  Bytes head = test::png_write_rgb(img, {{"tEXt", text}});
  ASSERT_EQ(std::string(head.begin() + 37, head.begin() + 41), "tEXt");
  head[33] = 0x3c, head[34] = 0x72, head[35] = 0x5a, head[36] = 0x67;  // 1,014,127,207 bytes
  const int64_t before = peak_rss_bytes();
  const ImageError e = decode_error(head);
  EXPECT_EQ(e.kind(), ImageErrorKind::truncated) << e.what();
  EXPECT_NE(std::string(e.what()).find("ends early"), std::string::npos) << e.what();

  Bytes tail = test::png_write_rgb(img);
  tail.resize(tail.size() - 12);  // IEND out: a chunk after the pixels that runs past the end instead
  const Bytes header = {0x3c, 0x72, 0x5a, 0x67, 't', 'E', 'X', 't', 'R', 'a', 'w'};
  tail.insert(tail.end(), header.begin(), header.end());
  expect_same(decode(tail).image, img);
  EXPECT_LT(peak_rss_bytes() - before, int64_t(256) << 20) << "a declared length was allocated";
}

TEST(ImageDecode, CorruptFilesAreRefused) {
  const RgbImage img = test::fixture_image(12, 10, 8);
  // PNG: a CRC that does not match IHDR.
  Bytes png = test::png_write_rgb(img);
  png[29] ^= 0xff;
  EXPECT_EQ(decode_error(png).kind(), ImageErrorKind::corrupt);
  // JPEG: junk after the start-of-image marker.
  Bytes jpeg = {0xff, 0xd8, 0xff, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a};
  const ImageError j = decode_error(jpeg);
  EXPECT_TRUE(j.kind() == ImageErrorKind::corrupt || j.kind() == ImageErrorKind::truncated) << j.what();
  // GIF: an LZW code that names no table entry yet. The four 9-bit codes (clear, 0, 1, end) take five bytes,
  // followed by the block terminator and the trailer.
  Bytes gif = test::gif_write(2, 1, 0, 0, 2, 1, {0, 1}, {0, 0, 0, 1, 1, 1});
  const size_t codes = gif.size() - 2 - 5;
  gif[codes] = 0xff, gif[codes + 1] = 0xff, gif[codes + 2] = 0xff;
  EXPECT_EQ(decode_error(gif).kind(), ImageErrorKind::corrupt);
  // WebP: the lossless bitstream's signature byte damaged.
  Bytes webp = test::webp_write_lossless_rgb(img);
  webp[20] ^= 0xff;
  EXPECT_EQ(decode_error(webp).kind(), ImageErrorKind::corrupt);
}

TEST(ImageDecode, RandomBytesBehindEachSignatureNeverCrash) {
  uint32_t s = 12345;
  const std::vector<Bytes> heads = {{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'},
                                    {0xff, 0xd8, 0xff},
                                    {'R', 'I', 'F', 'F', 40, 0, 0, 0, 'W', 'E', 'B', 'P'},
                                    {'G', 'I', 'F', '8', '9', 'a'}};
  for (const Bytes& head : heads)
    for (int round = 0; round < 300; ++round) {
      Bytes b = head;
      const int n = round % 80;
      for (int i = 0; i < n; ++i) {
        s = s * 1664525u + 1013904223u;
        b.push_back(uint8_t(s >> 24));
      }
      try {
        decode(b);
      } catch (const ImageError&) {
      }
    }
}

}  // namespace
}  // namespace tern
