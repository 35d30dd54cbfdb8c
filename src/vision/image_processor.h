// The image processor of Qwen3-VL / Qwen3.5 / Qwen3.6 (transformers' Qwen2VLImageProcessor, whose PIL path this
// reproduces): an upright RGB image resized to multiples of patch x merge pixels within [min_pixels, max_pixels]
// (smart_resize, bicubic), rescaled by 1/255, normalised by the mean and std, and cut into patches, each repeated
// temporal_patch_size times, in the order the vision encoder reads them.
//
// pixel_values [grid_h * grid_w, 3 * temporal_patch_size * patch_size^2] float32 (1536 for Qwen3.6):
//   patch index  ((bh * (grid_w / merge) + bw) * merge + mh) * merge + mw   (merge blocks in row order, the
//                merge x merge patches of a block in row order)
//   within       ((c * temporal_patch_size + t) * patch_size + py) * patch_size + px
//   value        image[c][(bh * merge + mh) * patch_size + py][(bw * merge + mw) * patch_size + px], the same for every
//   t
// grid_thw = (1, grid_h, grid_w), grid_h = resized height / patch_size. The prompt holds one <|image_pad|> per
// merged block: grid_h * grid_w / merge^2 tokens, between <|vision_start|> and <|vision_end|>.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "vision/image.h"

namespace tern {

// preprocessor_config.json's fields; the defaults are Qwen3.6-35B-A3B's file.
struct ImageProcessorConfig {
  int patch_size = 16;
  int temporal_patch_size = 2;
  int merge_size = 2;
  int64_t min_pixels = 65536;     // size.shortest_edge (256 x 256)
  int64_t max_pixels = 16777216;  // size.longest_edge (4096 x 4096)
  double rescale_factor = 1.0 / 255.0;
  std::array<float, 3> image_mean = {0.5f, 0.5f, 0.5f};
  std::array<float, 3> image_std = {0.5f, 0.5f, 0.5f};
};

// Parses preprocessor_config.json text (`file_name` names it in errors). Fields absent keep their defaults;
// min_pixels / max_pixels, where present, override size.shortest_edge / longest_edge (as transformers does). A
// setting this processor does not implement (do_resize false, a resample filter other than bicubic, ...) is a
// tern::Error naming the field.
ImageProcessorConfig image_processor_config_parse(const std::string& json_text, const std::string& file_name);
// The model folder's preprocessor_config.json, or the defaults when the folder has none.
ImageProcessorConfig image_processor_config_load(const std::filesystem::path& model_dir);

struct ResizedSize {
  int height = 0, width = 0;
};

// transformers' smart_resize with factor = patch_size * merge_size: each side rounded to the nearest multiple of
// the factor (ties to even, as Python's round), then both scaled by one factor when the area leaves
// [min_pixels, max_pixels]. Throws ImageError(aspect_ratio) when the longer side is over 200 times the shorter.
ResizedSize image_smart_resize(int height, int width, const ImageProcessorConfig& config, const std::string& name);

struct ImagePatches {
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;  // image_grid_thw
  int64_t patch_dim = 0;                       // 3 * temporal_patch_size * patch_size^2
  int64_t num_tokens = 0;                      // <|image_pad|> tokens: grid_h * grid_w / merge_size^2
  int resized_height = 0, resized_width = 0;
  std::vector<float> pixel_values;  // [grid_h * grid_w, patch_dim]
};

// The token count alone (no pixels touched): what the chat template needs for an image of this upright size.
int64_t image_token_count(int height, int width, const ImageProcessorConfig& config, const std::string& name);

// Resize (image_resize_bicubic), rescale, normalise and patch an upright image.
ImagePatches image_process(const RgbImage& image, const ImageProcessorConfig& config, const std::string& name);
// The resized uint8 image alone (the step before the floats), for checking against the reference.
RgbImage image_process_resized(const RgbImage& image, const ImageProcessorConfig& config, const std::string& name);

}  // namespace tern
