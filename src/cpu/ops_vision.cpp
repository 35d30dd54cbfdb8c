#include "cpu/ops_vision.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "cpu/ops_rope.h"

namespace tern::cpu {

int64_t vision_patch_count(const std::vector<VisionGrid>& grids, int merge) {
  TERN_CHECK(merge > 0, "vision: spatial merge size must be positive, got ", merge);
  int64_t n = 0;
  for (const VisionGrid& g : grids) {
    TERN_CHECK(g.t > 0 && g.h > 0 && g.w > 0 && g.t <= 4096 && g.h <= 65536 && g.w <= 65536,
               "vision: grid (t, h, w) = (", g.t, ", ", g.h, ", ", g.w, ") is empty or too large");
    TERN_CHECK(g.h % merge == 0 && g.w % merge == 0, "vision: grid (", g.t, ", ", g.h, ", ", g.w,
               ") is not made of whole ", merge, " x ", merge, " merge blocks");
    n += g.t * g.h * g.w;
  }
  return n;
}

std::vector<int32_t> vision_patch_coords(const std::vector<VisionGrid>& grids, int merge) {
  std::vector<int32_t> out(size_t(2 * vision_patch_count(grids, merge)));
  size_t at = 0;
  for (const VisionGrid& g : grids)
    for (int64_t f = 0; f < g.t; ++f)
      for (int64_t br = 0; br < g.h / merge; ++br)
        for (int64_t bc = 0; bc < g.w / merge; ++bc)
          for (int ir = 0; ir < merge; ++ir)
            for (int ic = 0; ic < merge; ++ic) {
              out[at++] = int32_t(br * merge + ir);
              out[at++] = int32_t(bc * merge + ic);
            }
  return out;
}

namespace {

// The two taps on one axis of `size` positions into a table side long: (floor, floor + 1) clamped, with the
// linear hat weights computed in fp32 exactly as transformers' _interpolation_axis_taps_weights does.
void axis_taps(int64_t index, int64_t size, int side, int32_t tap[2], float weight[2]) {
  const float src = float(index * int64_t(side - 1)) / float(std::max<int64_t>(size - 1, 1));
  const float fl = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    const int64_t raw = int64_t(fl) + o;
    tap[o] = int32_t(std::clamp<int64_t>(raw, 0, side - 1));
    const float distance = std::fabs((src - fl) - float(o));
    weight[o] = std::max(1.0f - distance, 0.0f);
  }
}

}  // namespace

VisionPosTaps vision_pos_taps(const std::vector<VisionGrid>& grids, int merge, int side) {
  TERN_CHECK(side > 0, "vision: the position table has no rows");
  const std::vector<int32_t> coords = vision_patch_coords(grids, merge);
  const size_t n = coords.size() / 2;
  VisionPosTaps out;
  out.index.resize(4 * n);
  out.weight.resize(4 * n);
  size_t patch = 0;
  for (const VisionGrid& g : grids)
    for (int64_t i = 0; i < g.t * g.h * g.w; ++i, ++patch) {
      int32_t rt[2], ct[2];
      float rw[2], cw[2];
      axis_taps(coords[2 * patch], g.h, side, rt, rw);
      axis_taps(coords[2 * patch + 1], g.w, side, ct, cw);
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          out.index[4 * patch + size_t(2 * a + b)] = rt[a] * side + ct[b];
          out.weight[4 * patch + size_t(2 * a + b)] = rw[a] * cw[b];
        }
    }
  return out;
}

std::vector<float> vision_rope_angles(const std::vector<VisionGrid>& grids, int merge, int head_dim, double theta) {
  TERN_CHECK(head_dim > 0 && head_dim % 4 == 0, "vision: head_dim ", head_dim, " must be a multiple of 4");
  const int quarter = head_dim / 4, spatial = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(quarter));
  for (int j = 0; j < quarter; ++j) inv[size_t(j)] = rope_inv_freq(j, spatial, theta);
  const std::vector<int32_t> coords = vision_patch_coords(grids, merge);
  const size_t n = coords.size() / 2;
  std::vector<float> out(n * size_t(spatial));
  for (size_t p = 0; p < n; ++p) {
    float* a = out.data() + p * size_t(spatial);
    for (int j = 0; j < quarter; ++j) {
      a[j] = float(coords[2 * p]) * inv[size_t(j)];
      a[quarter + j] = float(coords[2 * p + 1]) * inv[size_t(j)];
    }
  }
  return out;
}

std::vector<int64_t> vision_segments(const std::vector<VisionGrid>& grids) {
  std::vector<int64_t> bounds = {0};
  for (const VisionGrid& g : grids)
    for (int64_t f = 0; f < g.t; ++f) bounds.push_back(bounds.back() + g.h * g.w);
  return bounds;
}

}  // namespace tern::cpu
