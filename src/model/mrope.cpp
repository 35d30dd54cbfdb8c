#include "model/mrope.h"

#include <algorithm>

#include "core/check.h"

namespace tern {

int64_t mrope_grid_tokens(const MropeGrid& g, int M) {
  TERN_CHECK(M > 0 && g.t > 0 && g.h > 0 && g.w > 0 && g.h % M == 0 && g.w % M == 0, "M-RoPE: grid (", g.t, ", ",
             g.h, ", ", g.w, ") is not made of whole ", M, " x ", M, " merge blocks");
  return g.t * (g.h / M) * (g.w / M);
}

std::array<int64_t, 3> mrope_token_offsets(const MropeGrid& g, int M, int64_t k) {
  const int64_t gh = g.h / M, gw = g.w / M;
  return {k / (gh * gw), (k / gw) % gh, k % gw};
}

int64_t mrope_grid_advance(const MropeGrid& g, int M) { return std::max(g.h, g.w) / M; }

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
      const int64_t tokens = mrope_grid_tokens(g, M);
      TERN_CHECK(run == tokens, "M-RoPE: ", what[k], " ", next[k] - 1, " has ", run, " tokens at position ", i,
                 " but its grid (", g.t, ", ", g.h, ", ", g.w, ") makes ", tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        const std::array<int64_t, 3> o = mrope_token_offsets(g, M, t);
        for (int a = 0; a < 3; ++a) out.axes[size_t(a)].push_back(current + o[size_t(a)]);
      }
      current += mrope_grid_advance(g, M);
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
