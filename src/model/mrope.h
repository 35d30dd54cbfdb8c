// The language model's 3-axis rotary positions (M-RoPE) for prompts with images, as transformers'
// Qwen3_5MoeModel.get_rope_index computes them. Text tokens advance one position on all three axes (t, h, w); the
// tokens of one image (one run of <|image_pad|>, its grid merged M x M) take t = start + frame,
// h = start + row, w = start + col, and the text after it resumes at start + max(h, w) / M. Text-only prompts get
// the plain positions 0 .. n-1 on every axis (delta 0). Decoding continues at cache position + delta on every axis.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace tern {

struct MropeGrid {  // grid_thw of one image or video, in patches (before the merge)
  int64_t t = 1, h = 0, w = 0;
};

struct MropeInput {
  std::span<const int32_t> tokens;
  std::vector<MropeGrid> images;   // in the order their <|image_pad|> runs appear
  std::vector<MropeGrid> videos;   // each frame is its own run of <|video_pad|> (timestamps separate them)
  int32_t image_token_id = 248056;
  int32_t video_token_id = 248057;
  int spatial_merge_size = 2;
};

struct MropePositions {
  std::array<std::vector<int64_t>, 3> axes;  // [3][n]: t, h, w
  int64_t delta = 0;  // max position + 1 - n: the offset of every later (decoded) position
};

// Throws tern::Error when a run of vision tokens does not hold its grid's token count (t·h·w / M²), when runs
// outnumber the grids or grids are left over, or when a grid is not made of whole merge blocks.
MropePositions mrope_positions(const MropeInput& input);

// The tokens one grid makes in the prompt: t · (h / M) · (w / M). Throws tern::Error when the grid is not made of
// whole M x M merge blocks.
int64_t mrope_grid_tokens(const MropeGrid& g, int merge);
// Token k of a grid's run (frames, then merged rows, then merged columns): its offsets (t, h, w) from the run's
// start position.
std::array<int64_t, 3> mrope_token_offsets(const MropeGrid& g, int merge, int64_t k);
// How far the positions advance over a grid's run: the text after it starts at the run's start + max(h, w) / M.
int64_t mrope_grid_advance(const MropeGrid& g, int merge);

}  // namespace tern
