// The vision encoder's position bookkeeping, as transformers' vision_utils computes it for Qwen3_5MoeVisionModel:
// where each patch sits in its image, the learned position table resampled to the image's grid, the 2D rotary
// angles and the attention segments. Patches of one frame come in the processor's order: M x M merge blocks in
// raster order, the patches of a block in raster order inside it (block-major), frames one after another.
#pragma once

#include <cstdint>
#include <vector>

namespace tern::cpu {

struct VisionGrid {  // one image (t = 1) or video: frames x patch rows x patch columns (grid_thw)
  int64_t t = 1, h = 0, w = 0;
};

// Patches of all grids: t·h·w each. Throws tern::Error when a grid is empty or h, w are not multiples of merge.
int64_t vision_patch_count(const std::vector<VisionGrid>& grids, int merge);

// (row, col) of every patch within its frame, [N, 2] (get_vision_position_ids).
std::vector<int32_t> vision_patch_coords(const std::vector<VisionGrid>& grids, int merge);

// Bilinear taps into the side x side learned table (align_corners, clamped at the border), four per patch in the
// order (r0, c0), (r0, c1), (r1, c0), (r1, c1): index [N, 4] into the flattened table and weight [N, 4] in fp32,
// as get_vision_interpolation_indices_and_weights computes them (src = row · (side − 1) / max(h − 1, 1)).
struct VisionPosTaps {
  std::vector<int32_t> index;
  std::vector<float> weight;
};
VisionPosTaps vision_pos_taps(const std::vector<VisionGrid>& grids, int merge, int side);

// Rotary angles [N, head_dim/2]: the first head_dim/4 are row · f_j, the next head_dim/4 col · f_j, with
// f_j = 1 / theta^(2j / (head_dim/2)) in fp32 (the axial rope of Qwen3_5MoeVisionRotaryEmbedding).
std::vector<float> vision_rope_angles(const std::vector<VisionGrid>& grids, int merge, int head_dim, double theta);

// Attention segment bounds [frames + 1]: one segment of h·w patches per frame (cu_seqlens).
std::vector<int64_t> vision_segments(const std::vector<VisionGrid>& grids);

}  // namespace tern::cpu
