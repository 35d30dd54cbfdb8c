// The vision encoder's position bookkeeping (cpu/ops_vision): block-major patch order, the bilinear taps of the
// learned table, rotary angles and segments, checked on hand-worked cases. The encoder as a whole is checked
// against transformers by tests/py/test_vision_encoder.py.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/check.h"
#include "cpu/ops_attention.h"
#include "cpu/ops_rope.h"
#include "cpu/ops_vision.h"

namespace tern::cpu {
namespace {

TEST(VisionOps, PatchCoordsAreBlockMajor) {
  // A 2 x 4 grid with 2 x 2 merge blocks: block (0, 0) then block (0, 1), each in raster order.
  const std::vector<int32_t> c = vision_patch_coords({{1, 2, 4}}, 2);
  const std::vector<int32_t> want = {0, 0, 0, 1, 1, 0, 1, 1, 0, 2, 0, 3, 1, 2, 1, 3};
  EXPECT_EQ(c, want);
  // Frames repeat the same coordinates.
  const std::vector<int32_t> two = vision_patch_coords({{2, 2, 2}}, 2);
  EXPECT_EQ(two, (std::vector<int32_t>{0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1}));
}

TEST(VisionOps, GridsMustHoldWholeMergeBlocks) {
  EXPECT_THROW(vision_patch_count({{1, 3, 4}}, 2), Error);
  EXPECT_THROW(vision_patch_count({{0, 2, 2}}, 2), Error);
  EXPECT_EQ(vision_patch_count({{1, 2, 4}, {3, 2, 2}}, 2), 8 + 12);
}

TEST(VisionOps, PositionTapsAlignCorners) {
  // A 2 x 2 grid on a 3 x 3 table: the corners of the image land on the corners of the table exactly.
  const VisionPosTaps t = vision_pos_taps({{1, 2, 2}}, 2, 3);
  ASSERT_EQ(t.index.size(), 16u);
  // Patch (0, 0): all weight on table entry 0.
  EXPECT_EQ(t.index[0], 0);
  EXPECT_FLOAT_EQ(t.weight[0], 1.0f);
  // Patch (1, 1): src = 2 on both axes, the floor tap is the last entry (index 8), the other tap clamped, weight 0.
  EXPECT_EQ(t.index[12], 8);
  EXPECT_FLOAT_EQ(t.weight[12], 1.0f);
  EXPECT_FLOAT_EQ(t.weight[13] + t.weight[14] + t.weight[15], 0.0f);
  // A 4-wide row on a 3-wide table: col 1 maps to src 2/3, taps 0 and 1 weighted 1/3 and 2/3.
  const VisionPosTaps r = vision_pos_taps({{1, 2, 4}}, 2, 3);
  EXPECT_EQ(r.index[4 * 1 + 0], 0);
  EXPECT_EQ(r.index[4 * 1 + 1], 1);
  EXPECT_NEAR(r.weight[4 * 1 + 0], 1.0f / 3, 1e-7);
  EXPECT_NEAR(r.weight[4 * 1 + 1], 2.0f / 3, 1e-7);
  for (size_t p = 0; p < r.weight.size() / 4; ++p)
    EXPECT_NEAR(r.weight[4 * p] + r.weight[4 * p + 1] + r.weight[4 * p + 2] + r.weight[4 * p + 3], 1.0f, 1e-6);
}

TEST(VisionOps, RopeAnglesRowsThenColumns) {
  // head_dim 8: two frequencies per axis, 1 and theta^(-1/2).
  const std::vector<float> a = vision_rope_angles({{1, 2, 4}}, 2, 8, 100.0);
  ASSERT_EQ(a.size(), 8u * 4);
  // Patch 5 is (row 0, col 3) (the second block's second patch).
  const float* p = a.data() + 5 * 4;
  EXPECT_FLOAT_EQ(p[0], 0.0f);
  EXPECT_FLOAT_EQ(p[1], 0.0f);
  EXPECT_FLOAT_EQ(p[2], 3.0f);
  EXPECT_NEAR(p[3], 0.3f, 1e-6);
}

TEST(VisionOps, SegmentsPerFrame) {
  EXPECT_EQ(vision_segments({{2, 2, 4}, {1, 4, 4}}), (std::vector<int64_t>{0, 8, 16, 32}));
}

TEST(VisionOps, AttentionStaysInsideSegments) {
  // Two one-token segments: each token attends only to itself, so the output is its own value.
  const float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1}, v[4] = {3, 4, 5, 6};
  float out[4] = {};
  const int64_t bounds[3] = {0, 1, 2};
  SegmentAttentionArgs a;
  a.q = q; a.k = k; a.v = v; a.N = 2; a.H = 1; a.dh = 2; a.bounds = bounds; a.segments = 2; a.scale = 1.0f;
  a.out = out;
  attention_segments(a);
  EXPECT_FLOAT_EQ(out[0], 3.0f);
  EXPECT_FLOAT_EQ(out[1], 4.0f);
  EXPECT_FLOAT_EQ(out[2], 5.0f);
  EXPECT_FLOAT_EQ(out[3], 6.0f);
  // One segment of both: softmax over the two scores [1, 0] for token 0.
  const int64_t one[2] = {0, 2};
  a.bounds = one;
  a.segments = 1;
  attention_segments(a);
  const double p = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(out[0], p * 3 + (1 - p) * 5, 1e-6);
}

}  // namespace
}  // namespace tern::cpu

namespace tern::cpu {
namespace {

TEST(MropeAngles, TextOnlyIsPlainRopeBitForBit) {
  // Three equal axes: the interleaved angles are pos · f_i, and rope_apply_angles equals rope_apply exactly.
  const int64_t T = 5;
  const int H = 2, dh = 16, rot = 8;
  std::vector<int64_t> p(T);
  for (int64_t t = 0; t < T; ++t) p[size_t(t)] = 7 + t;
  const int64_t* pos[3] = {p.data(), p.data(), p.data()};
  const int section[3] = {2, 1, 1};
  std::vector<float> angles(size_t(T * rot / 2));
  mrope_angles(pos, T, section, rot, 1e7, angles.data());
  std::vector<float> a(size_t(T * H * dh)), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(float(i) * 0.37f);
  b = a;
  rope_apply_angles(a.data(), T, H, dh, rot, angles.data());
  RopeArgs r;
  r.x = b.data();
  r.T = T;
  r.H = H;
  r.dh = dh;
  r.rot = rot;
  r.theta = 1e7;
  r.pos0 = 7;
  rope_apply(r);
  EXPECT_EQ(a, b);
}

TEST(MropeAngles, InterleavedAxes) {
  // rot 12: six frequencies; section [2, 2, 1]: i = 1, 4 take h; i = 2 takes w (5 is past 3·1); the rest t.
  const int64_t t_pos = 1, h_pos = 10, w_pos = 100;
  const int64_t* pos[3] = {&t_pos, &h_pos, &w_pos};
  const int section[3] = {2, 2, 1};
  float angles[6];
  mrope_angles(pos, 1, section, 12, 1.0, angles);  // theta 1: every f_i = 1
  EXPECT_EQ(std::vector<float>(angles, angles + 6), (std::vector<float>{1, 10, 100, 1, 10, 1}));
}

}  // namespace
}  // namespace tern::cpu
