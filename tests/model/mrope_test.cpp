// M-RoPE positions (model/mrope): hand-worked prompts. tests/py/test_mrope.py checks random prompts against
// transformers' get_rope_index.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/check.h"
#include "model/image_input.h"
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

// A session's calls, cut anywhere (inside images too), give the whole prompt's positions and delta.
TEST(MropeChunks, CallsCutAnywhereAgreeWithTheWholePrompt) {
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> tokens;
    std::vector<ImageEmbeddings> images;
    std::vector<int64_t> offsets;
    auto text = [&] {
      for (uint64_t i = 0, n = rng() % 5; i < n; ++i) tokens.push_back(int32_t(rng() % 1000));
    };
    text();
    for (uint64_t k = 0, n = rng() % 4; k < n; ++k) {
      ImageEmbeddings im;
      im.grid = {1, 2 * int64_t(1 + rng() % 4), 2 * int64_t(1 + rng() % 4)};
      im.tokens = mrope_grid_tokens(im.grid, 2);
      offsets.push_back(int64_t(tokens.size()));
      tokens.insert(tokens.end(), size_t(im.tokens), kImage);
      images.push_back(im);
      tokens.push_back(7);  // <|vision_end|>'s place: images never touch
      text();
    }
    MropeInput in;
    in.tokens = tokens;
    for (const ImageEmbeddings& im : images) in.images.push_back(im.grid);
    const MropePositions want = mrope_positions(in);
    const int64_t n = int64_t(tokens.size());
    int64_t pos = 0, delta = 0;
    while (pos < n) {
      const int64_t to = std::min(n, pos + 1 + int64_t(rng() % 6));
      std::vector<ImageSpan> spans;
      for (size_t i = 0; i < images.size(); ++i) {
        const int64_t lo = std::max(offsets[i], pos), hi = std::min(offsets[i] + images[i].tokens, to);
        if (lo < hi) spans.push_back({.image = &images[i], .at = lo - pos, .first = lo - offsets[i], .count = hi - lo});
      }
      const ChunkPositions got = mrope_chunk_positions(pos, delta, to - pos, spans, 2);
      for (int a = 0; a < 3; ++a)
        for (int64_t t = pos; t < to; ++t)
          ASSERT_EQ(got.axes[size_t(a)][size_t(t - pos)], want.axes[size_t(a)][size_t(t)])
              << "trial " << trial << " axis " << a << " token " << t;
      delta = got.delta_after;
      pos = to;
    }
    EXPECT_EQ(delta, want.delta) << "trial " << trial;
  }
}

TEST(MropeChunks, SpansAreChecked) {
  ImageEmbeddings im;
  im.grid = {1, 2, 4};
  im.tokens = 2;
  im.values.resize(2 * 8);
  const ImageSpan ok{.image = &im, .at = 1, .first = 0, .count = 2};
  EXPECT_NO_THROW(image_spans_check(std::span(&ok, 1), 4, 8, 2));
  EXPECT_THROW(image_spans_check(std::span(&ok, 1), 2, 8, 2), Error);  // past the call
  EXPECT_THROW(image_spans_check(std::span(&ok, 1), 4, 7, 2), Error);  // rows of another width
  const ImageSpan two[2] = {ok, ok};
  EXPECT_THROW(image_spans_check(two, 8, 8, 2), Error);                // overlapping
  ImageSpan beyond = ok;
  beyond.first = 1;
  EXPECT_THROW(image_spans_check(std::span(&beyond, 1), 4, 8, 2), Error);  // past the image's tokens
  ImageEmbeddings lying = im;
  lying.tokens = 3;  // not what its grid makes
  ImageSpan bad = ok;
  bad.image = &lying;
  EXPECT_THROW(image_spans_check(std::span(&bad, 1), 4, 8, 2), Error);
}

// An image's run of 6 tokens at 10, against calls of the prompt: before it, cutting its start, inside it, cutting
// its end, after it.
TEST(MropeChunks, ImageSpanWithinACall) {
  EXPECT_FALSE(image_span_within(10, 6, 0, 10).has_value());
  EXPECT_FALSE(image_span_within(10, 6, 16, 20).has_value());
  auto expect = [](std::optional<ImageSpan> s, int64_t at, int64_t first, int64_t count) {
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->image, nullptr);
    EXPECT_EQ(s->at, at);
    EXPECT_EQ(s->first, first);
    EXPECT_EQ(s->count, count);
  };
  expect(image_span_within(10, 6, 8, 12), 2, 0, 2);
  expect(image_span_within(10, 6, 12, 14), 0, 2, 2);
  expect(image_span_within(10, 6, 14, 30), 0, 4, 2);
  expect(image_span_within(10, 6, 0, 64), 10, 0, 6);
}

}  // namespace
}  // namespace tern
