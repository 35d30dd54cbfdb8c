// Images in the CPU forward (ModelRunner::encode_image / forward_images), on the demo model with its small vision
// encoder: a prompt with two images gives the same logits in one call, cut into chunks anywhere (inside images too)
// and token by token; the session's M-RoPE delta is transformers' (mrope_positions) and snapshots keep it; text-only
// calls are bit for bit plain forward(); bad spans and pixels are errors that consume nothing; a model without a
// vision encoder refuses images with its reason. tests/py/test_image_prompt.py holds the numbers to transformers.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/check.h"
#include "cpu/cpu_runner.h"
#include "cpu_test_util.h"
#include "engine/demo_model.h"
#include "engine/demo_vision.h"
#include "model/mrope.h"

namespace tern {
namespace {

struct Fixture {
  std::unique_ptr<ModelRunner> runner;
  std::vector<ImageEmbeddings> images;  // two of different sizes
  std::vector<int32_t> tokens;          // text, <|vision_start|>, image 0's run, <|vision_end|>, text, image 1, text
  std::vector<int64_t> offsets;         // where each image's run starts
};

ImagePixels random_pixels(std::mt19937_64& rng, MropeGrid grid, int64_t patch_dim) {
  ImagePixels p;
  p.grid = grid;
  p.patch_dim = patch_dim;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p.values.resize(size_t(grid.t * grid.h * grid.w * patch_dim));
  for (float& v : p.values) v = u(rng);
  return p;
}

Fixture make_fixture(uint64_t seed) {
  static const std::shared_ptr<const ModelWeights> weights = demo_model_build();  // the demo: vision on
  Fixture f;
  f.runner = cpu_runner_create(weights);
  std::mt19937_64 rng(seed);
  const int64_t patch_dim = weights->vision->config.patch_dim();
  const MropeGrid grids[2] = {{1, 2 * int64_t(1 + rng() % 5), 2 * int64_t(1 + rng() % 5)}, {1, 4, 6}};
  auto text = [&](int n) {
    for (int i = 0; i < n; ++i) f.tokens.push_back(int32_t(rng() % 150000));
  };
  text(5);
  for (const MropeGrid& g : grids) {
    f.images.push_back(f.runner->encode_image(random_pixels(rng, g, patch_dim)));
    f.tokens.push_back(kDemoVisionStartId);
    f.offsets.push_back(int64_t(f.tokens.size()));
    f.tokens.insert(f.tokens.end(), size_t(f.images.back().tokens), kDemoImageTokenId);
    f.tokens.push_back(kDemoVisionEndId);
    text(4);
  }
  return f;
}

// The spans of the tokens [from, to).
std::vector<ImageSpan> spans(const Fixture& f, int64_t from, int64_t to) {
  std::vector<ImageSpan> out;
  for (size_t i = 0; i < f.images.size(); ++i)
    if (std::optional<ImageSpan> s = image_span_within(f.offsets[i], f.images[i].tokens, from, to)) {
      s->image = &f.images[i];
      out.push_back(*s);
    }
  return out;
}

// Every position's logits, the prompt fed in calls that end at `cuts` (and at its end).
std::vector<float> run_in_calls(const Fixture& f, Session& s, std::vector<int64_t> cuts) {
  cuts.push_back(int64_t(f.tokens.size()));
  std::vector<float> all, part;
  int64_t from = 0;
  for (int64_t to : cuts) {
    if (to <= from) continue;
    f.runner->forward_images(s, std::span(f.tokens).subspan(size_t(from), size_t(to - from)), spans(f, from, to), true,
                             part);
    all.insert(all.end(), part.begin(), part.end());
    from = to;
  }
  return all;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double top = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) continue;
    top = std::max(top, double(std::fabs(a[i])));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  }
  return diff / top;
}

TEST(CpuImages, ChunksAnywhereEqualOneCall) {
  const Fixture f = make_fixture(test::fresh_seed("images in chunks"));
  const int64_t n = int64_t(f.tokens.size());
  auto whole = f.runner->create_session(256);
  const std::vector<float> want = run_in_calls(f, *whole, {});
  MropeInput in;
  in.tokens = f.tokens;
  in.image_token_id = kDemoImageTokenId;
  for (const ImageEmbeddings& im : f.images) in.images.push_back(im.grid);
  EXPECT_EQ(whole->rope_delta(), mrope_positions(in).delta);
  EXPECT_NE(whole->rope_delta(), 0);

  // Cuts inside the first image, between the images, inside the second; then one token at a time.
  const std::vector<std::vector<int64_t>> plans = {
      {f.offsets[0] + 1}, {f.offsets[0] + f.images[0].tokens / 2, f.offsets[1] - 2}, {f.offsets[1] + 3, n - 2}};
  for (const auto& cuts : plans) {
    auto s = f.runner->create_session(256);
    const std::vector<float> got = run_in_calls(f, *s, cuts);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(max_rel_diff(want, got), 1e-4) << "cut at " << cuts[0];
    EXPECT_EQ(s->rope_delta(), whole->rope_delta());
  }
  std::vector<int64_t> every;
  for (int64_t t = 1; t < n; ++t) every.push_back(t);
  auto s = f.runner->create_session(256);
  EXPECT_LE(max_rel_diff(want, run_in_calls(f, *s, every)), 1e-4) << "one token at a time";
}

TEST(CpuImages, TextOnlyCallsAreForwardBitForBit) {
  const Fixture f = make_fixture(test::fresh_seed("text only"));
  const std::vector<int32_t> text(f.tokens.begin(), f.tokens.begin() + 5);
  auto a = f.runner->create_session(64), b = f.runner->create_session(64);
  std::vector<float> la, lb;
  f.runner->forward(*a, text, true, la);
  f.runner->forward_images(*b, text, {}, true, lb);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << i;
  EXPECT_EQ(b->rope_delta(), 0);
}

TEST(CpuImages, SnapshotsKeepTheDelta) {
  const Fixture f = make_fixture(test::fresh_seed("snapshots"));
  const int64_t n = int64_t(f.tokens.size());
  auto s = f.runner->create_session(256);
  run_in_calls(f, *s, {n - 3});  // the whole prompt; the last call is text after both images
  const int64_t delta = s->rope_delta();
  const std::vector<int32_t> next = {11, 12, 13};
  std::vector<float> want, got;
  auto snap = s->snapshot();
  f.runner->forward(*s, next, true, want);
  // Another image after the snapshot moves the delta; restoring brings it back.
  s->restore(*snap);
  const std::vector<int32_t> run(size_t(f.images[1].tokens), kDemoImageTokenId);
  const ImageSpan again{.image = &f.images[1], .at = 0, .first = 0, .count = f.images[1].tokens};
  f.runner->forward_images(*s, run, std::span(&again, 1), true, got);
  EXPECT_NE(s->rope_delta(), delta);
  s->restore(*snap);
  EXPECT_EQ(s->rope_delta(), delta);
  f.runner->forward(*s, next, true, got);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
  s->reset();
  EXPECT_EQ(s->rope_delta(), 0);
}

TEST(CpuImages, BadInputIsAnErrorAndConsumesNothing) {
  Fixture f = make_fixture(test::fresh_seed("bad spans"));
  auto s = f.runner->create_session(256);
  std::vector<float> logits;
  const int64_t n0 = f.offsets[0] + f.images[0].tokens;  // text and the first image
  const std::span<const int32_t> head = std::span(f.tokens).first(size_t(n0));
  auto expect_refused = [&](std::vector<ImageSpan> bad, const char* what) {
    EXPECT_THROW(f.runner->forward_images(*s, head, bad, true, logits), Error) << what;
    EXPECT_EQ(s->position(), 0) << what;
    EXPECT_EQ(s->rope_delta(), 0) << what;
  };
  std::vector<ImageSpan> good = spans(f, 0, n0);
  ASSERT_EQ(good.size(), 1u);
  ImageSpan past = good[0];
  past.at += 1;  // runs past the call's end
  expect_refused({past}, "past the end");
  ImageSpan beyond = good[0];
  beyond.first = 1;  // past the image's tokens
  expect_refused({beyond}, "beyond the image");
  expect_refused({good[0], good[0]}, "overlapping");
  ImageEmbeddings short_rows = f.images[0];
  short_rows.values.resize(short_rows.values.size() - 1);
  ImageSpan wrong = good[0];
  wrong.image = &short_rows;
  expect_refused({wrong}, "rows of the wrong width");
  f.runner->forward_images(*s, head, good, true, logits);  // still usable
  EXPECT_EQ(s->position(), n0);

  ImagePixels pixels;
  pixels.grid = {1, 4, 4};
  pixels.patch_dim = 1536;
  pixels.values.resize(16 * 1536 - 1);
  EXPECT_THROW(f.runner->encode_image(pixels), Error);
  pixels.values.resize(16 * 1536);
  pixels.grid = {1, 3, 4};  // not whole merge blocks
  EXPECT_THROW(f.runner->encode_image(pixels), Error);
}

TEST(CpuImages, AModelWithoutAVisionEncoderRefusesImages) {
  test::TinyModelSpec spec;
  auto runner = cpu_runner_create(test::make_tiny_model(spec, 7));
  const std::string why = runner->images_unavailable();
  EXPECT_NE(why.find("no vision encoder"), std::string::npos) << why;
  ImagePixels pixels;
  pixels.grid = {1, 2, 2};
  pixels.patch_dim = 1536;
  pixels.values.resize(4 * 1536);
  try {
    runner->encode_image(pixels);
    FAIL() << "encode_image took an image";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no vision encoder"), std::string::npos) << e.what();
  }
  ImageEmbeddings im;
  im.grid = {1, 2, 2};
  im.tokens = 1;
  im.values.resize(size_t(spec.D));
  const std::vector<int32_t> tokens = {1, 2};
  const ImageSpan span{.image = &im, .at = 1, .first = 0, .count = 1};
  auto s = runner->create_session(16);
  std::vector<float> logits;
  EXPECT_THROW(runner->forward_images(*s, tokens, std::span(&span, 1), true, logits), Error);
  EXPECT_EQ(s->position(), 0);
  EXPECT_TRUE(cpu_runner_create(demo_model_build())->images_unavailable().empty());
}

}  // namespace
}  // namespace tern
