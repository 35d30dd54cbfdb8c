// Images made ready for a prompt, shared by the server's four APIs and tern run: the model's image settings (the
// processor's preprocessor_config.json checked against its vision_config), an image's bytes decoded and measured
// (src/vision: format, EXIF orientation, limits; its <|image_pad|> count), the chat template's one <|image_pad|> per
// image expanded to that count, and the pixels processed into a PromptImage for GenerationRequest::images.
//
//   ImageSettings s = image_settings(config, model_dir);            // s.unavailable: why images cannot be used
//   DecodedImage... d = image_prompt_decode(bytes, s, "image 1");   // throws ImageError naming "image 1"
//   offsets = image_pads_expand(prompt, {d.tokens}, s.image_token_id);
//   request.images.push_back(image_prompt_process(d, offsets[0], s));
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "engine/prompt_image.h"
#include "model/config.h"
#include "vision/image.h"
#include "vision/image_processor.h"

namespace tern {

struct ImageSettings {
  // "" when the model takes images; else why not (the runner's reason, a mismatch; image_settings() sets it).
  std::string unavailable = "images were not set up for this model";
  ImageProcessorConfig processor;    // preprocessor_config.json (its defaults when the folder has none)
  ImageLimits limits;
  int32_t image_token_id = -1;       // <|image_pad|> (config.json's image_token_id)
  int merge = 2;                     // vision_config.spatial_merge_size
};

// The settings for a model: `runner_unavailable` is the runner's ModelRunner::images_unavailable() (its reason wins);
// model_dir: the folder of preprocessor_config.json ("" for the demo: the defaults). A processor whose patch size,
// temporal patch size or merge size differs from the vision_config's makes images unavailable, saying so.
ImageSettings image_settings(const Config& config, const std::string& runner_unavailable,
                             const std::filesystem::path& model_dir);

// An image decoded and upright, with the <|image_pad|> tokens it will take.
struct PreparedImage {
  std::string name;  // what errors call it ("messages[0].content[1].image_url", "image 2")
  RgbImage image;
  int64_t tokens = 0;
};

// Decodes `bytes` and counts its tokens. Throws ImageError (a tern::Error) whose message starts with `name`: an
// empty, corrupt, truncated or unsupported file, a size over the limits (checked before decoding), an aspect ratio
// over 200:1.
PreparedImage image_prompt_decode(std::span<const uint8_t> bytes, const ImageSettings& settings,
                                  const std::string& name);

// Replaces the i-th <|image_pad|> of `prompt` by counts[i] of them; returns where each run starts. Throws tern::Error
// when the prompt holds another number of <|image_pad|> tokens than counts.size().
std::vector<int64_t> image_pads_expand(std::vector<int32_t>& prompt, std::span<const int64_t> counts,
                                       int32_t image_token_id);

// The image's pixels processed (resize, rescale, normalise, patches) into a PromptImage whose tokens start at
// `offset`.
PromptImage image_prompt_process(const PreparedImage& image, int64_t offset, const ImageSettings& settings);

}  // namespace tern
