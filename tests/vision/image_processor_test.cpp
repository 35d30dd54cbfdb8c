// The processor: smart_resize's sizes (values from transformers' smart_resize), the 200:1 refusal, pixel_values'
// order and values checked by reading each patch back to the pixel it came from, the resize's fixed points, and
// preprocessor_config.json parsing. Equality with transformers on real files is tests/py/test_image_processor.py.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "image_fixtures.h"
#include "vision/image_processor.h"
#include "vision/image_resize.h"

namespace tern {
namespace {

TEST(ImageProcessor, SmartResizeMatchesTransformers) {
  const ImageProcessorConfig c;  // Qwen3.6: factor 32, [65536, 16777216] pixels
  struct Case {
    int h, w, want_h, want_w;
  };
  // transformers' smart_resize(h, w, 32, 65536, 16777216).
  for (const Case& k :
       {Case{1, 1, 256, 256}, Case{80, 336, 128, 544}, Case{48, 48, 256, 256}, Case{300, 400, 288, 384},
        Case{4000, 5000, 3648, 4576}, Case{1, 200, 32, 3648}, Case{2, 390, 32, 3584}, Case{4096, 4097, 4096, 4096}}) {
    const ResizedSize r = image_smart_resize(k.h, k.w, c, "img");
    EXPECT_EQ(r.height, k.want_h) << k.h << "x" << k.w;
    EXPECT_EQ(r.width, k.want_w) << k.h << "x" << k.w;
    EXPECT_EQ(image_token_count(k.h, k.w, c, "img"), int64_t(k.want_h) * k.want_w / (32 * 32));
  }
  ImageProcessorConfig small;
  small.min_pixels = 4096;
  small.max_pixels = 40000;
  const ResizedSize r = image_smart_resize(333, 517, small, "img");
  EXPECT_EQ(r.height, 160);
  EXPECT_EQ(r.width, 224);
}

TEST(ImageProcessor, MoreThan200To1IsRefused) {
  const ImageProcessorConfig c;
  try {
    image_smart_resize(10000, 3, c, "image 2");
    FAIL() << "accepted";
  } catch (const ImageError& e) {
    EXPECT_EQ(e.kind(), ImageErrorKind::aspect_ratio);
    EXPECT_EQ(std::string(e.what()).rfind("image 2: the image is 3x10000", 0), 0u) << e.what();
  }
  EXPECT_THROW(image_smart_resize(1, 201, c, "i"), ImageError);
  EXPECT_NO_THROW(image_smart_resize(1, 200, c, "i"));
}

TEST(ImageProcessor, PatchesInTheEncodersOrder) {
  // 256 x 320 is already a multiple of 32 within the bounds: no resize, so each value traces back to one pixel.
  const RgbImage img = test::fixture_image(320, 256, 21);
  const ImageProcessorConfig c;
  const ImagePatches p = image_process(img, c, "img");
  ASSERT_EQ(p.grid_t, 1);
  ASSERT_EQ(p.grid_h, 16);
  ASSERT_EQ(p.grid_w, 20);
  ASSERT_EQ(p.patch_dim, 1536);
  EXPECT_EQ(p.num_tokens, 80);
  ASSERT_EQ(p.pixel_values.size(), size_t(320 * 1536));
  for (int64_t patch = 0; patch < 320; ++patch) {
    // patch = ((block_row * 10 + block_col) * 2 + row_in_block) * 2 + col_in_block
    const int64_t col_in_block = patch % 2, row_in_block = patch / 2 % 2, block = patch / 4;
    const int64_t py0 = (block / 10 * 2 + row_in_block) * 16, px0 = (block % 10 * 2 + col_in_block) * 16;
    for (int64_t i = 0; i < 1536; ++i) {
      const int64_t x = i % 16, y = i / 16 % 16, channel = i / 512;  // (channel, frame, y, x); both frames the same
      const uint8_t v = img.row(int(py0 + y))[3 * (px0 + x) + channel];
      const float want = (float(double(v) / 255.0) - 0.5f) / 0.5f;
      ASSERT_EQ(p.pixel_values[size_t(patch * 1536 + i)], want) << patch << " " << i;
    }
  }
}

TEST(ImageProcessor, NormalisationEndsAtMinusOneAndOne) {
  RgbImage img(256, 256);
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = (i / 3) % 2 ? 255 : 0;
  const ImagePatches p = image_process(img, ImageProcessorConfig{}, "img");
  EXPECT_EQ(p.pixel_values[0], -1.0f);
  EXPECT_EQ(p.pixel_values[1], 1.0f);
}

TEST(ImageResize, SameSizeIsACopyAndFlatStaysFlat) {
  const RgbImage img = test::fixture_image(13, 7, 22);
  EXPECT_EQ(image_resize_bicubic(img, 13, 7).pixels, img.pixels);
  for (auto [w, h, ow, oh] : {std::array{1, 1, 256, 256}, std::array{300, 20, 17, 64}, std::array{5, 900, 40, 31}}) {
    RgbImage flat(w, h);
    for (size_t i = 0; i < flat.pixels.size(); ++i) flat.pixels[i] = uint8_t(i % 3 == 0 ? 255 : i % 3 == 1 ? 0 : 77);
    const RgbImage out = image_resize_bicubic(flat, ow, oh);
    ASSERT_EQ(out.width, ow);
    ASSERT_EQ(out.height, oh);
    for (size_t i = 0; i < out.pixels.size(); ++i) ASSERT_EQ(out.pixels[i], flat.pixels[i % 3]) << i;
  }
}

TEST(ImageProcessorConfig, ParsesQwenFileAndRefusesWhatItDoesNotDo) {
  const ImageProcessorConfig q = image_processor_config_parse(R"({
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"})",
                                                              "preprocessor_config.json");
  EXPECT_EQ(q.min_pixels, 65536);
  EXPECT_EQ(q.max_pixels, 16777216);
  EXPECT_EQ(q.patch_size, 16);
  const ImageProcessorConfig old = image_processor_config_parse(
      R"({"min_pixels": 3136, "max_pixels": 1003520, "patch_size": 14,
          "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": 0.25, "resample": 3, "do_resize": true})",
      "p.json");
  EXPECT_EQ(old.min_pixels, 3136);
  EXPECT_EQ(old.max_pixels, 1003520);
  EXPECT_EQ(old.patch_size, 14);
  EXPECT_FLOAT_EQ(old.image_mean[1], 0.4578275f);
  EXPECT_EQ(old.image_std[2], 0.25f);
  for (const char* bad : {R"({"do_resize": false})", R"({"resample": 2})", R"({"size": {"height": 224}})",
                          R"({"image_std": [0.5, 0, 0.5]})", R"({"patch_size": 0})",
                          R"({"min_pixels": 10, "max_pixels": 5})", "[1]", "{"}) {
    EXPECT_THROW(image_processor_config_parse(bad, "p.json"), Error) << bad;
  }
  try {
    image_processor_config_parse(R"({"resample": 2})", "preprocessor_config.json");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("preprocessor_config.json: field 'resample' = 2 is not supported"),
              std::string::npos)
        << e.what();
  }
}

TEST(ImageProcessorConfig, LoadsFromTheModelFolder) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tern_vision_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_EQ(image_processor_config_load(dir).max_pixels, 16777216);  // no file: the defaults
  std::ofstream(dir / "processor_config.json")
      << R"({"image_processor": {"size": {"shortest_edge": 100, "longest_edge": 200}}})";
  EXPECT_EQ(image_processor_config_load(dir).max_pixels, 200);
  std::ofstream(dir / "preprocessor_config.json") << R"({"min_pixels": 100, "max_pixels": 300})";
  EXPECT_EQ(image_processor_config_load(dir).max_pixels, 300);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tern
