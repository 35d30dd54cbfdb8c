#include "engine/image_prompt.h"

#include "core/check.h"
#include "vision/image_decode.h"

namespace tern {

ImageSettings image_settings(const Config& config, const std::string& runner_unavailable,
                             const std::filesystem::path& model_dir) {
  ImageSettings s;
  s.image_token_id = config.image_token_id;
  s.unavailable = runner_unavailable;
  if (!s.unavailable.empty()) return s;
  if (!config.vision) {
    s.unavailable = "this model has no vision encoder (its config.json has no vision_config), so it reads text only";
    return s;
  }
  const VisionConfig& v = *config.vision;
  s.merge = v.spatial_merge_size;
  try {
    s.processor = model_dir.empty() ? ImageProcessorConfig{} : image_processor_config_load(model_dir);
  } catch (const Error& e) {  // a processor setting tern does not implement: text still works
    s.unavailable = std::string("the model's image processor settings cannot be used: ") + e.what();
    return s;
  }
  const ImageProcessorConfig& p = s.processor;
  if (p.patch_size != v.patch_size || p.temporal_patch_size != v.temporal_patch_size ||
      p.merge_size != v.spatial_merge_size)
    s.unavailable = detail::concat(
        "the model's preprocessor_config.json (patch ", p.patch_size, ", temporal patch ", p.temporal_patch_size,
        ", merge ", p.merge_size, ") does not match its vision_config (patch ", v.patch_size, ", temporal patch ",
        v.temporal_patch_size, ", merge ", v.spatial_merge_size, "), so images are not available");
  return s;
}

PreparedImage image_prompt_decode(std::span<const uint8_t> bytes, const ImageSettings& settings,
                                  const std::string& name) {
  PreparedImage out;
  out.name = name;
  out.image = image_decode(bytes, settings.limits, name).image;
  out.tokens = image_token_count(out.image.height, out.image.width, settings.processor, name);
  return out;
}

std::vector<int64_t> image_pads_expand(std::vector<int32_t>& prompt, std::span<const int64_t> counts,
                                       int32_t image_token_id) {
  size_t pads = 0;
  for (int32_t id : prompt) pads += id == image_token_id;
  TERN_CHECK(pads == counts.size(), "the chat template placed ", pads, " image", pads == 1 ? "" : "s",
             " in the prompt for the request's ", counts.size());
  std::vector<int32_t> out;
  std::vector<int64_t> offsets;
  size_t extra = 0;
  for (int64_t c : counts) extra += size_t(c - 1);
  out.reserve(prompt.size() + extra);
  for (int32_t id : prompt) {
    if (id != image_token_id) {
      out.push_back(id);
      continue;
    }
    offsets.push_back(int64_t(out.size()));
    out.insert(out.end(), size_t(counts[offsets.size() - 1]), image_token_id);
  }
  prompt = std::move(out);
  return offsets;
}

PromptImage image_prompt_process(const PreparedImage& image, int64_t offset, const ImageSettings& settings) {
  ImagePatches patches = image_process(image.image, settings.processor, image.name);
  auto pixels = std::make_shared<ImagePixels>();
  pixels->grid = {patches.grid_t, patches.grid_h, patches.grid_w};
  pixels->patch_dim = patches.patch_dim;
  pixels->values = std::move(patches.pixel_values);
  PromptImage out = prompt_image_make(std::move(pixels), offset, settings.merge);
  TERN_CHECK(out.tokens == image.tokens, image.name, ": the processor made ", out.tokens, " tokens where ",
             image.tokens, " were counted");
  return out;
}

}  // namespace tern
