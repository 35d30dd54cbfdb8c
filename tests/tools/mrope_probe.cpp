// tern_mrope_probe: the language model's M-RoPE positions (model/mrope) and interleaved angles (cpu/ops_rope) for
// tests/py/test_mrope.py, which compares them with transformers' get_rope_index and text rotary embedding (a test
// tool, not part of tern).
//
//   tern_mrope_probe IN.json OUT_DIR
//
// IN.json: {"tokens": [...], "images": [[t, h, w], ...], "videos": [[t, h, w], ...], "image_token_id",
// "video_token_id", "merge", "section": [3 ints], "rot", "theta"}. Writes OUT_DIR/positions.npy (int32 [3, n]) and
// OUT_DIR/angles.npy (float32 [n, rot/2]) and prints {"delta": d}. Errors go to stderr with exit status 1.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/npy.h"
#include "cpu/ops_rope.h"
#include "model/mrope.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tern_mrope_probe IN.json OUT_DIR\n");
    return 2;
  }
  try {
    std::ifstream f(argv[1]);
    const nlohmann::json in = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(f), {}));
    const std::vector<int32_t> tokens = in.at("tokens").get<std::vector<int32_t>>();
    tern::MropeInput input;
    input.tokens = tokens;
    for (const auto& g : in.at("images")) input.images.push_back({g[0], g[1], g[2]});
    for (const auto& g : in.at("videos")) input.videos.push_back({g[0], g[1], g[2]});
    input.image_token_id = in.at("image_token_id");
    input.video_token_id = in.at("video_token_id");
    input.spatial_merge_size = in.at("merge");
    const tern::MropePositions p = tern::mrope_positions(input);
    const int64_t n = int64_t(tokens.size());
    std::vector<int32_t> positions;
    for (const auto& a : p.axes)
      for (int64_t v : a) positions.push_back(int32_t(v));
    const std::string dir = argv[2];
    tern::npy_write_i32(dir + "/positions.npy", positions.data(), {3, n});
    const int rot = in.at("rot");
    const std::vector<int> section = in.at("section").get<std::vector<int>>();
    std::vector<float> angles(size_t(n * rot / 2));
    const int64_t* pos[3] = {p.axes[0].data(), p.axes[1].data(), p.axes[2].data()};
    tern::cpu::mrope_angles(pos, n, section.data(), rot, in.at("theta").get<double>(), angles.data());
    tern::npy_write_f32(dir + "/angles.npy", angles.data(), {n, rot / 2});
    std::printf("{\"delta\": %lld}\n", static_cast<long long>(p.delta));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
