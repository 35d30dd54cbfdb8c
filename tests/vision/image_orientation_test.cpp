// Orientation: the EXIF parser (either byte order, the integer types, malformed blocks read safely), Pillow's XMP
// fallback, and each of the eight orientations applied to PNG (eXIf), JPEG (APP1) and WebP (EXIF chunk) files,
// checked against the upright image built here from flips and a transpose.
#include <gtest/gtest.h>

#include "image_fixtures.h"
#include "vision/image_decode.h"
#include "vision/image_orientation.h"

namespace tern {
namespace {

using test::Bytes;

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

RgbImage flip_left_right(const RgbImage& in) {
  RgbImage out(in.width, in.height);
  for (int y = 0; y < in.height; ++y)
    for (int x = 0; x < in.width; ++x) std::copy_n(in.row(y) + 3 * (in.width - 1 - x), 3, out.row(y) + 3 * x);
  return out;
}
RgbImage flip_top_bottom(const RgbImage& in) {
  RgbImage out(in.width, in.height);
  for (int y = 0; y < in.height; ++y) std::copy_n(in.row(in.height - 1 - y), 3 * in.width, out.row(y));
  return out;
}
RgbImage transpose(const RgbImage& in) {
  RgbImage out(in.height, in.width);
  for (int y = 0; y < out.height; ++y)
    for (int x = 0; x < out.width; ++x) std::copy_n(in.row(x) + 3 * y, 3, out.row(y) + 3 * x);
  return out;
}

// What a viewer shows for each orientation: 6 is turned a quarter clockwise, 8 a quarter counter-clockwise.
RgbImage upright(const RgbImage& stored, int orientation) {
  switch (orientation) {
    case 2: return flip_left_right(stored);
    case 3: return flip_top_bottom(flip_left_right(stored));
    case 4: return flip_top_bottom(stored);
    case 5: return transpose(stored);
    case 6: return flip_left_right(transpose(stored));
    case 7: return flip_top_bottom(flip_left_right(transpose(stored)));
    case 8: return flip_top_bottom(transpose(stored));
    default: return stored;
  }
}

TEST(ImageOrientation, ExifEitherByteOrderAndIntegerTypes) {
  for (bool big : {false, true}) {
    for (uint32_t o = 1; o <= 8; ++o) EXPECT_EQ(image_exif_orientation(test::exif_orientation_block(o, big)), o);
    EXPECT_EQ(image_exif_orientation(test::exif_orientation_block(6, big, /*LONG*/ 4)), 6);
    EXPECT_EQ(image_exif_orientation(test::exif_orientation_block(6, big, /*BYTE*/ 1)), 6);
    // Two values: present, but no orientation (Pillow reads a tuple); an unknown type: skipped, as if absent.
    EXPECT_EQ(image_exif_orientation(test::exif_orientation_block(6, big, 3, 2)), 0);
    EXPECT_EQ(image_exif_orientation(test::exif_orientation_block(6, big, 99)), std::nullopt);
  }
  // Without the "Exif\0\0" prefix too (PNG's eXIf holds the TIFF structure alone).
  const Bytes block = test::exif_orientation_block(3);
  EXPECT_EQ(image_exif_orientation(std::span(block).subspan(6)), 3);
}

TEST(ImageOrientation, MalformedExifIsReadSafely) {
  EXPECT_EQ(image_exif_orientation({}), std::nullopt);
  EXPECT_EQ(image_exif_orientation(bytes_of(std::string("Exif\0\0XX*\0\x08\0\0\0", 14))), std::nullopt);
  Bytes far = test::exif_orientation_block(6);
  far[10] = 0xf0;  // IFD0 offset past the end
  EXPECT_EQ(image_exif_orientation(far), std::nullopt);
  Bytes many = test::exif_orientation_block(6);
  many[14] = 0xff, many[15] = 0xff;  // 65535 entries declared, one present: the present one still counts
  EXPECT_EQ(image_exif_orientation(many), 6);
  const Bytes full = test::exif_orientation_block(8, true);
  for (size_t n = 0; n < full.size(); ++n) {
    const std::optional<int64_t> v = image_exif_orientation(std::span(full).first(n));
    EXPECT_TRUE(!v || *v == 8) << n;
  }
  uint32_t s = 99;
  for (int round = 0; round < 2000; ++round) {
    Bytes b = {'M', 'M', 0, '*', 0, 0, 0, uint8_t(round % 24)};
    for (int i = 0; i < round % 60; ++i) {
      s = s * 1664525u + 1013904223u;
      b.push_back(uint8_t(s >> 24));
    }
    (void)image_exif_orientation(b);
  }
}

TEST(ImageOrientation, XmpFallbackAsPillowReadsIt) {
  EXPECT_EQ(image_xmp_orientation(bytes_of(R"(<rdf:Description tiff:Orientation="6"/>)")), 6);
  EXPECT_EQ(image_xmp_orientation(bytes_of("<tiff:Orientation>8</tiff:Orientation>")), 8);
  EXPECT_EQ(image_xmp_orientation(bytes_of(R"(tiff:Orientation='6' tiff:Orientation="3")")), 3);
  EXPECT_EQ(image_xmp_orientation(bytes_of(R"(tiff:Orientation="x")")), std::nullopt);
  EXPECT_EQ(image_xmp_orientation(bytes_of("tiff:Orientation")), std::nullopt);

  const Bytes xmp_six = {'t', 'i', 'f', 'f', ':', 'O', 'r', 'i', 'e', 'n', 't', 'a', 't', 'i', 'o', 'n', '>', '6'};
  EXPECT_EQ(image_orientation_from_metadata({}, xmp_six), 6);
  EXPECT_EQ(image_orientation_from_metadata(test::exif_orientation_block(3), xmp_six), 3);
  // An EXIF entry that names no orientation still hides the XMP one; 0 and 9 mean "as stored".
  EXPECT_EQ(image_orientation_from_metadata(test::exif_orientation_block(6, false, 3, 2), xmp_six), 1);
  EXPECT_EQ(image_orientation_from_metadata(test::exif_orientation_block(9), {}), 1);
  EXPECT_EQ(image_orientation_from_metadata(test::exif_orientation_block(0), {}), 1);
}

TEST(ImageOrientation, EachOrientationTurnsTheImageUpright) {
  const RgbImage stored = test::fixture_image(5, 3, 11);
  const RgbImage jpeg_stored = image_decode(test::jpeg_write_rgb(stored), {}, "stored").image;
  for (int o = 1; o <= 8; ++o) {
    SCOPED_TRACE(o);
    const Bytes exif = test::exif_orientation_block(uint32_t(o), o % 2 == 0);
    const RgbImage want = upright(stored, o);
    const DecodedImage png =
        image_decode(test::png_write_rgb(stored, {{"eXIf", Bytes(exif.begin() + 6, exif.end())}}), {}, "png");
    EXPECT_EQ(png.orientation, o);
    EXPECT_EQ(png.image.width, want.width);
    EXPECT_EQ(png.image.pixels, want.pixels);
    const DecodedImage webp = image_decode(test::webp_write_lossless_rgb(stored, exif), {}, "webp");
    EXPECT_EQ(webp.orientation, o);
    EXPECT_EQ(webp.image.pixels, want.pixels);
    const DecodedImage jpeg = image_decode(test::jpeg_write_rgb(stored, 100, {exif}), {}, "jpeg");
    EXPECT_EQ(jpeg.orientation, o);
    EXPECT_EQ(jpeg.image.pixels, upright(jpeg_stored, o).pixels);
  }
}

TEST(ImageOrientation, JpegXmpOrientation) {
  const RgbImage stored = test::fixture_image(4, 2, 12);
  static const char kXmp[] = "http://ns.adobe.com/xap/1.0/\0<x tiff:Orientation=\"8\"/>";
  const std::string xmp(kXmp, sizeof kXmp - 1);
  const DecodedImage d = image_decode(test::jpeg_write_rgb(stored, 100, {Bytes(xmp.begin(), xmp.end())}), {}, "j");
  EXPECT_EQ(d.orientation, 8);
  EXPECT_EQ(d.image.width, 2);
  EXPECT_EQ(d.image.height, 4);
}

}  // namespace
}  // namespace tern
