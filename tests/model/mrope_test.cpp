// M-RoPE positions (model/mrope): hand-worked prompts. tests/py/test_mrope.py checks random prompts against
// transformers' get_rope_index.
#include <gtest/gtest.h>

#include <vector>

#include "core/check.h"
#include "model/mrope.h"

namespace tern {
namespace {

constexpr int32_t kImage = 248056, kVideo = 248057;

TEST(Mrope, TextOnlyIsPlain) {
  const std::vector<int32_t> tokens = {5, 6, 7, 8};
  MropeInput in;
  in.tokens = tokens;
  const MropePositions p = mrope_positions(in);
  for (const auto& a : p.axes) EXPECT_EQ(a, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.delta, 0);
}

TEST(Mrope, ImageTakesGridPositionsAndTextResumesAfterTheLongerSide) {
  // 2 text tokens, a 4 x 6 patch grid (2 x 3 tokens after the merge), 2 text tokens.
  std::vector<int32_t> tokens = {1, 2};
  for (int i = 0; i < 6; ++i) tokens.push_back(kImage);
  tokens.push_back(3);
  tokens.push_back(4);
  MropeInput in;
  in.tokens = tokens;
  in.images = {{1, 4, 6}};
  const MropePositions p = mrope_positions(in);
  EXPECT_EQ(p.axes[0], (std::vector<int64_t>{0, 1, 2, 2, 2, 2, 2, 2, 5, 6}));
  EXPECT_EQ(p.axes[1], (std::vector<int64_t>{0, 1, 2, 2, 2, 3, 3, 3, 5, 6}));
  EXPECT_EQ(p.axes[2], (std::vector<int64_t>{0, 1, 2, 3, 4, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.delta, 7 - 10);
}

TEST(Mrope, VideoFramesAreSeparateGrids) {
  // A 2-frame video: each frame's run (1 x 1 token) is its own grid with t = 1.
  const std::vector<int32_t> tokens = {1, kVideo, 2, kVideo, 3};
  MropeInput in;
  in.tokens = tokens;
  in.videos = {{2, 2, 2}};
  const MropePositions p = mrope_positions(in);
  EXPECT_EQ(p.axes[0], (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(p.axes[1], (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Mrope, MismatchesAreRefused) {
  const std::vector<int32_t> tokens = {1, kImage, kImage, 2};
  MropeInput in;
  in.tokens = tokens;
  in.images = {{1, 2, 2}};  // one token, the run has two
  EXPECT_THROW(mrope_positions(in), Error);
  in.images = {{1, 2, 4}, {1, 2, 2}};  // a grid left over
  EXPECT_THROW(mrope_positions(in), Error);
  in.images = {{1, 3, 4}};  // not whole merge blocks
  EXPECT_THROW(mrope_positions(in), Error);
}

}  // namespace
}  // namespace tern
