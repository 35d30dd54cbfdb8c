// Loading the vision encoder's tensors (model/vision_weights.h) from a checkpoint: HF's model.visual.* (the official
// BF16 files) or mlx-vlm's vision_tower.* (kept unquantised; its Conv3d weight channels-last, as mlx-vlm's
// sanitize writes it: [Dv, Tp, P, P, C]). Shapes are checked against config.json's vision_config; every mismatch,
// missing or unexpected tensor is named in one tern::Error.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "model/safetensors.h"
#include "model/vision_weights.h"

namespace tern {

// The vision tower's key prefix in a checkpoint: "model.visual." (HF), "vision_tower." (mlx-vlm), or "" when it
// holds no vision tensor. Throws when it holds both.
std::string vision_prefix(const SafetensorsSet& set);

// Loads every tensor under `prefix` (as vision_prefix found it) into the internal layout. Matrices stored BF16 or
// F32 and aligned point into the mapped files (the set is kept alive by the result); others are copied. Throws
// tern::Error listing the problems (missing tensors, wrong shapes or dtypes, unexpected names).
std::shared_ptr<VisionWeights> vision_weights_load(const std::shared_ptr<SafetensorsSet>& set,
                                                   const VisionConfig& config, const std::string& prefix);

// DIR's config.json (its vision_config) and safetensors: the vision encoder alone (tests and tools). Throws when
// the config has no vision_config or the checkpoint no vision tensors.
std::shared_ptr<VisionWeights> vision_load(const std::filesystem::path& dir);

}  // namespace tern
