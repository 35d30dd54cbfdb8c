// tern_vision_probe: runs the CPU vision encoder for tests/py/test_vision_encoder.py, which compares the result
// with transformers' Qwen3_5MoeVisionModel (a test tool, not part of tern).
//
//   tern_vision_probe [--model] DIR PIXELS.npy GRID_THW.npy OUT.npy
//
// DIR holds config.json (with a vision_config) and the vision tensors (model.visual.* or vision_tower.*); with
// --model, DIR is a whole checkpoint loaded through model_load (the language model too, as stored). PIXELS.npy is
// float32 [N, C·Tp·P·P], GRID_THW.npy int32 [images, 3]; OUT.npy receives float32 [N / M², out_hidden_size].
// Errors go to stderr with exit status 1.
#include <cstdio>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/npy.h"
#include "cpu/vision_encoder.h"
#include "model/checkpoint.h"
#include "model/vision_checkpoint.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool whole = false;
  if (!args.empty() && args[0] == "--model") {
    whole = true;
    args.erase(args.begin());
  }
  if (args.size() != 4) {
    std::fprintf(stderr, "usage: tern_vision_probe [--model] DIR PIXELS.npy GRID_THW.npy OUT.npy\n");
    return 2;
  }
  try {
    std::shared_ptr<const tern::VisionWeights> vision;
    tern::ModelWeights model;
    if (whole) {
      tern::LoadOptions options;
      options.dtype = tern::LoadOptions::Dtype::stored;
      options.progress = false;
      model = tern::model_load(args[0], options);
      TERN_CHECK(model.has_vision(), "the checkpoint has no vision encoder (images unavailable)");
      vision = model.vision;
    } else {
      vision = tern::vision_load(args[0]);
    }
    const tern::NpyArray pixels = tern::npy_read(args[1]);
    const tern::NpyArray grid = tern::npy_read(args[2]);
    TERN_CHECK(pixels.dtype == "<f4" && pixels.shape.size() == 2, "PIXELS.npy must be float32 [N, patch_dim]");
    TERN_CHECK(grid.dtype == "<i4" && grid.shape.size() == 2 && grid.shape[1] == 3, "GRID_THW.npy must be int32 [n, 3]");
    std::vector<tern::cpu::VisionGrid> grids;
    for (int64_t i = 0; i < grid.shape[0]; ++i)
      grids.push_back({grid.i32[size_t(3 * i)], grid.i32[size_t(3 * i + 1)], grid.i32[size_t(3 * i + 2)]});
    const std::vector<float> out =
        tern::cpu::vision_encode(*vision, pixels.f32.data(), pixels.shape[0], pixels.shape[1], grids);
    const int64_t width = vision->config.out_hidden_size;
    tern::npy_write_f32(args[3], out.data(), {int64_t(out.size()) / width, width});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
