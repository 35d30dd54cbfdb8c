// The arithmetic follows transformers' Qwen2VLImageProcessorPil: smart_resize in doubles, the rescale in float64
// stored as float32, the normalisation in float32 ((x - mean) / std). Compiled with -ffp-contract=off (CMake).
#include "core/text_file.h"
#include "vision/image_processor.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "vision/image_resize.h"

namespace tern {

using json = nlohmann::json;

namespace {

const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t positive_integer(const json& v, const std::string& where, const char* key, int64_t max) {
  TERN_CHECK(v.is_number_integer(), where, ": field '", key, "' must be an integer, got ", v.dump());
  const int64_t x = v.get<int64_t>();
  TERN_CHECK(x >= 1 && x <= max, where, ": field '", key, "' = ", x, " is out of range [1, ", max, "]");
  return x;
}

std::array<float, 3> per_channel(const json& v, const std::string& where, const char* key) {
  if (v.is_number()) return {v.get<float>(), v.get<float>(), v.get<float>()};
  TERN_CHECK(v.is_array() && v.size() == 3 && v[0].is_number() && v[1].is_number() && v[2].is_number(), where,
             ": field '", key, "' must be a number or 3 numbers, got ", v.dump());
  return {v[0].get<float>(), v[1].get<float>(), v[2].get<float>()};
}

ImageProcessorConfig config_from_json(const json& j, const std::string& where) {
  TERN_CHECK(j.is_object(), where, " must be a JSON object");
  ImageProcessorConfig c;
  constexpr int64_t kMaxPixels = int64_t(1) << 28;  // 16 times Qwen3.6's own maximum
  if (const json* v = field(j, "patch_size")) c.patch_size = int(positive_integer(*v, where, "patch_size", 1024));
  if (const json* v = field(j, "temporal_patch_size"))
    c.temporal_patch_size = int(positive_integer(*v, where, "temporal_patch_size", 64));
  if (const json* v = field(j, "merge_size")) c.merge_size = int(positive_integer(*v, where, "merge_size", 64));
  if (const json* size = field(j, "size")) {
    TERN_CHECK(size->is_object(), where, ": field 'size' must be an object, got ", size->dump());
    const json* shortest = field(*size, "shortest_edge");
    const json* longest = field(*size, "longest_edge");
    TERN_CHECK(shortest && longest, where,
               ": field 'size' must hold 'shortest_edge' and 'longest_edge' (pixel counts), got ", size->dump());
    c.min_pixels = positive_integer(*shortest, where, "size.shortest_edge", kMaxPixels);
    c.max_pixels = positive_integer(*longest, where, "size.longest_edge", kMaxPixels);
  }
  if (const json* v = field(j, "min_pixels")) c.min_pixels = positive_integer(*v, where, "min_pixels", kMaxPixels);
  if (const json* v = field(j, "max_pixels")) c.max_pixels = positive_integer(*v, where, "max_pixels", kMaxPixels);
  TERN_CHECK(c.min_pixels <= c.max_pixels, where, ": the minimum pixel count ", c.min_pixels, " is above the maximum ",
             c.max_pixels);
  if (const json* v = field(j, "rescale_factor")) {
    TERN_CHECK(v->is_number() && v->get<double>() > 0, where,
               ": field 'rescale_factor' must be a positive number, got ", v->dump());
    c.rescale_factor = v->get<double>();
  }
  if (const json* v = field(j, "image_mean")) c.image_mean = per_channel(*v, where, "image_mean");
  if (const json* v = field(j, "image_std")) c.image_std = per_channel(*v, where, "image_std");
  for (float s : c.image_std) TERN_CHECK(s != 0.0f, where, ": field 'image_std' holds a zero");
  for (const char* key : {"do_resize", "do_rescale", "do_normalize", "do_convert_rgb"}) {
    if (const json* v = field(j, key))
      TERN_CHECK(v->is_boolean() && v->get<bool>(), where, ": field '", key, "' = ", v->dump(),
                 " is not supported (only true)");
  }
  if (const json* v = field(j, "resample"))
    TERN_CHECK(v->is_number_integer() && v->get<int64_t>() == 3, where, ": field 'resample' = ", v->dump(),
               " is not supported (only 3, bicubic)");
  return c;
}

}  // namespace

ImageProcessorConfig image_processor_config_parse(const std::string& json_text, const std::string& file_name) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  TERN_CHECK(!j.is_discarded(), file_name, " is not valid JSON");
  return config_from_json(j, file_name);
}

ImageProcessorConfig image_processor_config_load(const std::filesystem::path& model_dir) {
  const std::filesystem::path pre = model_dir / "preprocessor_config.json";
  if (std::filesystem::exists(pre)) return image_processor_config_parse(read_text_file(pre), pre.string());
  // Newer saves put every processor's settings in one file, the image processor's under "image_processor".
  const std::filesystem::path combined = model_dir / "processor_config.json";
  if (std::filesystem::exists(combined)) {
    const json j = json::parse(read_text_file(combined), nullptr, /*allow_exceptions=*/false);
    TERN_CHECK(!j.is_discarded() && j.is_object(), combined.string(), " is not a valid JSON object");
    if (const json* v = field(j, "image_processor"))
      return config_from_json(*v, combined.string() + " image_processor");
  }
  return ImageProcessorConfig{};
}

ResizedSize image_smart_resize(int height, int width, const ImageProcessorConfig& config, const std::string& name) {
  TERN_CHECK(height > 0 && width > 0, name, ": an image of ", width, "x", height, " has no pixels");
  const double ratio = double(std::max(height, width)) / double(std::min(height, width));
  if (ratio > 200)
    throw ImageError(ImageErrorKind::aspect_ratio, name + ": the image is " + std::to_string(width) + "x" +
                                                       std::to_string(height) +
                                                       ", its longer side more than 200 times the shorter");
  const int64_t factor = int64_t(config.patch_size) * config.merge_size;
  const double f = double(factor);
  // Python's round() on a float: to nearest, ties to even (nearbyint in the default rounding mode).
  int64_t h = int64_t(std::nearbyint(height / f)) * factor;
  int64_t w = int64_t(std::nearbyint(width / f)) * factor;
  const double area = double(int64_t(height) * width);
  if (h * w > config.max_pixels) {
    const double beta = std::sqrt(area / double(config.max_pixels));
    h = std::max<int64_t>(factor, int64_t(std::floor(height / beta / f)) * factor);
    w = std::max<int64_t>(factor, int64_t(std::floor(width / beta / f)) * factor);
  } else if (h * w < config.min_pixels) {
    const double beta = std::sqrt(double(config.min_pixels) / area);
    h = int64_t(std::ceil(height * beta / f)) * factor;
    w = int64_t(std::ceil(width * beta / f)) * factor;
  }
  TERN_CHECK(h <= (int64_t(1) << 20) && w <= (int64_t(1) << 20), name, ": resizing ", width, "x", height, " gives ", w,
             "x", h, " (check min_pixels)");
  return {int(h), int(w)};
}

int64_t image_token_count(int height, int width, const ImageProcessorConfig& config, const std::string& name) {
  const ResizedSize r = image_smart_resize(height, width, config, name);
  const int64_t gh = r.height / config.patch_size, gw = r.width / config.patch_size;
  return gh * gw / (int64_t(config.merge_size) * config.merge_size);
}

RgbImage image_process_resized(const RgbImage& image, const ImageProcessorConfig& config, const std::string& name) {
  const ResizedSize r = image_smart_resize(image.height, image.width, config, name);
  return image_resize_bicubic(image, r.width, r.height);
}

ImagePatches image_process(const RgbImage& image, const ImageProcessorConfig& config, const std::string& name) {
  const RgbImage resized = image_process_resized(image, config, name);
  const int p = config.patch_size, m = config.merge_size, t_size = config.temporal_patch_size;
  ImagePatches out;
  out.resized_height = resized.height;
  out.resized_width = resized.width;
  out.grid_h = resized.height / p;
  out.grid_w = resized.width / p;
  out.patch_dim = int64_t(3) * t_size * p * p;
  out.num_tokens = out.grid_h * out.grid_w / (int64_t(m) * m);

  // Every uint8 value's float per channel: float32(v * rescale_factor in float64), then (x - mean) / std in float32.
  float lut[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) {
      const float x = float(double(v) * config.rescale_factor);
      lut[c][v] = (x - config.image_mean[size_t(c)]) / config.image_std[size_t(c)];
    }

  out.pixel_values.resize(size_t(out.grid_h * out.grid_w * out.patch_dim));
  float* dst = out.pixel_values.data();
  const int64_t blocks_h = out.grid_h / m, blocks_w = out.grid_w / m;
  for (int64_t bh = 0; bh < blocks_h; ++bh)
    for (int64_t bw = 0; bw < blocks_w; ++bw)
      for (int mh = 0; mh < m; ++mh)
        for (int mw = 0; mw < m; ++mw) {
          const int64_t y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
          for (int c = 0; c < 3; ++c) {
            float* plane = dst;  // [p, p] for t = 0; the other frames repeat it
            for (int py = 0; py < p; ++py) {
              const uint8_t* src = resized.row(int(y0 + py)) + 3 * x0 + c;
              for (int px = 0; px < p; ++px) *dst++ = lut[c][src[3 * px]];
            }
            for (int t = 1; t < t_size; ++t, dst += p * p) std::copy(plane, plane + p * p, dst);
          }
        }
  return out;
}

}  // namespace tern
