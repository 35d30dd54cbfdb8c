#include "model/mrope.h"

#include <algorithm>

#include "core/check.h"

namespace tern {

MropePositions mrope_positions(const MropeInput& in) {
  const int M = in.spatial_merge_size;
  TERN_CHECK(M > 0, "M-RoPE: spatial merge size must be positive, got ", M);
  // Videos: one grid per frame (transformers repeats each video grid t times with t = 1).
  std::vector<MropeGrid> frames;
  for (const MropeGrid& g : in.videos)
    for (int64_t f = 0; f < g.t; ++f) frames.push_back({1, g.h, g.w});
  const std::vector<MropeGrid>* grids[3] = {nullptr, &in.images, &frames};
  size_t next[3] = {0, 0, 0};
  const char* what[3] = {"", "image", "video frame"};

  const int64_t n = int64_t(in.tokens.size());
  MropePositions out;
  for (auto& a : out.axes) a.reserve(size_t(n));
  auto kind = [&](int32_t id) { return id == in.image_token_id ? 1 : id == in.video_token_id ? 2 : 0; };
  int64_t current = 0;
  for (int64_t i = 0; i < n;) {
    const int k = kind(in.tokens[size_t(i)]);
    int64_t j = i;
    while (j < n && kind(in.tokens[size_t(j)]) == k) ++j;
    const int64_t run = j - i;
    if (k == 0) {
      for (int64_t p = 0; p < run; ++p)
        for (auto& a : out.axes) a.push_back(current + p);
      current += run;
    } else {
      TERN_CHECK(next[k] < grids[k]->size(), "M-RoPE: the prompt has more runs of ", what[k], " tokens than the ",
                 grids[k]->size(), " ", what[k], " grid(s) given");
      const MropeGrid g = (*grids[k])[next[k]++];
      TERN_CHECK(g.t > 0 && g.h > 0 && g.w > 0 && g.h % M == 0 && g.w % M == 0, "M-RoPE: ", what[k], " grid (",
                 g.t, ", ", g.h, ", ", g.w, ") is not made of whole ", M, " x ", M, " merge blocks");
      const int64_t gh = g.h / M, gw = g.w / M;
      TERN_CHECK(run == g.t * gh * gw, "M-RoPE: ", what[k], " ", next[k] - 1, " has ", run, " tokens at position ",
                 i, " but its grid (", g.t, ", ", g.h, ", ", g.w, ") makes ", g.t * gh * gw);
      for (int64_t f = 0; f < g.t; ++f)
        for (int64_t r = 0; r < gh; ++r)
          for (int64_t c = 0; c < gw; ++c) {
            out.axes[0].push_back(current + f);
            out.axes[1].push_back(current + r);
            out.axes[2].push_back(current + c);
          }
      current += std::max(g.h, g.w) / M;
    }
    i = j;
  }
  for (int k = 1; k < 3; ++k)
    TERN_CHECK(next[k] == grids[k]->size(), "M-RoPE: ", grids[k]->size(), " ", what[k], " grid(s) given but the prompt ",
               "has ", next[k], " run(s) of their tokens");
  int64_t top = -1;
  for (const auto& a : out.axes)
    for (int64_t p : a) top = std::max(top, p);
  out.delta = n == 0 ? 0 : top + 1 - n;
  return out;
}

}  // namespace tern
