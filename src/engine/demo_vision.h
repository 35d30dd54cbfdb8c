// The demo model's vision encoder: Qwen3.6's vision structure (patches 2 x 16 x 16 of 3 channels, 2D rotary
// attention blocks, the 2 x 2 merger into the language model's width) at a small width, with deterministic random
// fp32 weights of its own seed stream (the language model's weights do not change with it). Images then run end to
// end on the demo (tern serve, tern run) with no download; what the demo "sees" is as meaningless as its text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/vision_weights.h"

namespace tern {

// The <|vision_start|>, <|vision_end|>, <|image_pad|> and <|video_pad|> ids of the demo's tokenizer (Qwen3's).
inline constexpr int32_t kDemoVisionStartId = 151652, kDemoVisionEndId = 151653, kDemoImageTokenId = 151655,
                         kDemoVideoTokenId = 151656;

// The demo's vision_config object (JSON text) for a language model of width out_hidden.
std::string demo_vision_config_json(int64_t out_hidden);

// Builds the encoder's weights for `config` (demo_vision_config_json's, parsed) from `seed`.
std::shared_ptr<const VisionWeights> demo_vision_build(const VisionConfig& config, uint64_t seed);

}  // namespace tern
