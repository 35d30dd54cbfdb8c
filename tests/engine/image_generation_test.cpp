// Images through the engine, on the demo model with its vision encoder (CPU, recurrent Gated DeltaNet, so every
// chunking gives the same values bit for bit): a request's images are encoded when the prefill reaches them and give
// the same tokens and log-probabilities whatever the prefill's chunks; the prefix cache keys images by content (the
// same image resumes past it, another image of the same size does not); the helpers that make prompts with images
// (engine/image_prompt.h, engine/prompt_image.h) check what they are given.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "core/check.h"
#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/demo_vision.h"
#include "engine/generator.h"
#include "engine/image_prompt.h"
#include "engine/prefix_cache.h"
#include "engine/prompt_image.h"

namespace tern {
namespace {

uint64_t fresh_seed(const char* what) {
  uint64_t s = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  if (const char* env = std::getenv("TERN_TEST_SEED")) s = std::strtoull(env, nullptr, 10);
  std::printf("[seed] %s: TERN_TEST_SEED=%llu\n", what, (unsigned long long)s);
  return s;
}

std::shared_ptr<const ImagePixels> random_pixels(std::mt19937_64& rng, MropeGrid grid) {
  auto p = std::make_shared<ImagePixels>();
  p->grid = grid;
  p->patch_dim = 1536;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p->values.resize(size_t(grid.t * grid.h * grid.w * p->patch_dim));
  for (float& v : p->values) v = u(rng);
  return p;
}

// A prompt of text around the images' runs (as the chat template lays them out), and its PromptImages.
struct ImagePrompt {
  std::vector<int32_t> tokens;
  std::vector<PromptImage> images;
};

ImagePrompt make_prompt(std::mt19937_64& rng, const std::vector<std::shared_ptr<const ImagePixels>>& pixels) {
  ImagePrompt p;
  auto text = [&](int n) {
    for (int i = 0; i < n; ++i) p.tokens.push_back(int32_t(rng() % 150000));
  };
  text(6);
  for (const auto& px : pixels) {
    p.tokens.push_back(kDemoVisionStartId);
    p.images.push_back(prompt_image_make(px, int64_t(p.tokens.size()), 2));
    p.tokens.insert(p.tokens.end(), size_t(p.images.back().tokens), kDemoImageTokenId);
    p.tokens.push_back(kDemoVisionEndId);
    text(5);
  }
  return p;
}

struct Turn {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int64_t cached = 0;
};

struct Harness {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Generator> gen;
  std::unique_ptr<PrefixCache> cache;

  explicit Harness(int64_t prefill_chunk, bool cache_on = true) {
    static const std::shared_ptr<const ModelWeights> weights = demo_model_build();
    runner = cpu_runner_create(weights, CpuRunnerOptions{.gdn_chunked = false});
    GeneratorOptions o;
    o.prefill_chunk = prefill_chunk;
    gen = std::make_unique<Generator>(*runner, TokenTextSource{.bytes = [](int32_t) { return std::string("x"); }, .is_special = {}}, o);
    PrefixCacheOptions c;
    c.enabled = cache_on;
    c.snapshot_every = 16;
    cache = std::make_unique<PrefixCache>(*runner, 1024, c);
  }

  Turn turn(const ImagePrompt& p, int64_t max_tokens = 5) {
    GenerationRequest req;
    req.prompt = p.tokens;
    req.images = p.images;
    req.max_tokens = max_tokens;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    req.sampling.top_logprobs = 0;
    PrefixCache::Lease lease = cache->begin(req.prompt, req.images);
    if (cache->active()) {
      req.checkpoint_every = cache->options().snapshot_every;
      req.on_checkpoint = [&](Session& s) { cache->checkpoint(s, req.prompt, req.images); };
    }
    Turn t;
    GenerationResult r = gen->generate(*lease.session, req, [&](const TokenEvent& e) {
      if (e.id >= 0) t.logprobs.push_back(e.logprob);
      return true;
    });
    t.tokens = r.tokens;
    t.cached = r.cached_tokens;
    std::vector<int32_t> held = req.prompt;
    for (size_t i = 0; int64_t(held.size()) < lease.session->position(); ++i) held.push_back(r.tokens[i]);
    cache->end(*lease.session, held, true, req.images);
    return t;
  }
};

void expect_same_turn(const Turn& got, const Turn& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i) EXPECT_EQ(got.logprobs[i], want.logprobs[i]) << what << " " << i;
}

TEST(ImageGeneration, SameOutputWhateverThePrefillChunks) {
  std::mt19937_64 rng(fresh_seed("image generation chunks"));
  const ImagePrompt p = make_prompt(rng, {random_pixels(rng, {1, 4, 6}), random_pixels(rng, {1, 6, 2})});
  const Turn want = Harness(0, false).turn(p);
  for (int64_t chunk : {1, 3, 7, 8}) expect_same_turn(Harness(chunk, false).turn(p), want, "chunk " + std::to_string(chunk));
  // And the first token is what the runner's own forward over the prompt chooses.
  Harness h(0, false);
  std::vector<ImageEmbeddings> encoded;
  for (const PromptImage& im : p.images) encoded.push_back(h.runner->encode_image(*im.pixels));
  std::vector<ImageSpan> spans;
  for (size_t i = 0; i < encoded.size(); ++i)
    spans.push_back({.image = &encoded[i], .at = p.images[i].offset, .first = 0, .count = p.images[i].tokens});
  auto s = h.runner->create_session(256);
  std::vector<float> logits;
  h.runner->forward_images(*s, p.tokens, spans, false, logits);
  const int64_t vr = h.runner->vocab_real();
  EXPECT_EQ(want.tokens[0], int32_t(std::max_element(logits.begin(), logits.begin() + vr) - logits.begin()));
}

TEST(ImageGeneration, PrefixCacheKeysImagesByContent) {
  std::mt19937_64 rng(fresh_seed("image prefix cache"));
  const auto x = random_pixels(rng, {1, 4, 4}), y = random_pixels(rng, {1, 4, 4});  // one size, two images
  std::mt19937_64 text_a(rng()), text_b = text_a;
  const ImagePrompt with_x = make_prompt(text_a, {x}), with_y = make_prompt(text_b, {y});
  ASSERT_EQ(with_x.tokens, with_y.tokens);  // the same tokens: only the pixels differ
  ASSERT_NE(with_x.images[0].hash, with_y.images[0].hash);

  Harness cached(5), scratch(5, false);
  const Turn first = cached.turn(with_x);
  EXPECT_EQ(first.cached, 0);
  // The same image again: resumes past it (the snapshot at the end of the prompt is before its last token).
  const Turn again = cached.turn(with_x);
  EXPECT_GT(again.cached, with_x.images[0].offset + with_x.images[0].tokens);
  expect_same_turn(again, scratch.turn(with_x), "the same image, resumed");
  // Another image of the same size: nothing past its first token is reused, and the output is its own.
  const Turn other = cached.turn(with_y);
  EXPECT_LE(other.cached, with_y.images[0].offset);
  expect_same_turn(other, scratch.turn(with_y), "another image");
}

TEST(ImageGeneration, RequestsWithImagesAreChecked) {
  std::mt19937_64 rng(fresh_seed("image request checks"));
  Harness h(0, false);
  ImagePrompt p = make_prompt(rng, {random_pixels(rng, {1, 2, 4})});
  auto session = h.runner->create_session(256);
  auto refused = [&](const ImagePrompt& bad, const char* what) {
    GenerationRequest req;
    req.prompt = bad.tokens;
    req.images = bad.images;
    req.max_tokens = 1;
    EXPECT_THROW(h.gen->generate(*session, req), Error) << what;
  };
  ImagePrompt shifted = p;
  shifted.images[0].offset -= 1;  // its run starts on <|vision_start|>
  refused(shifted, "offset");
  ImagePrompt longer = p;
  longer.images[0].tokens += 1;
  refused(longer, "token count");
  ImagePrompt twice = p;
  twice.images.push_back(p.images[0]);
  refused(twice, "overlapping");

  // A model without a vision encoder says so.
  DemoModelOptions o;
  o.vision = false;
  auto text_only = cpu_runner_create(demo_model_build(o));
  Generator gen(*text_only, TokenTextSource{.bytes = [](int32_t) { return std::string("x"); }, .is_special = {}});
  auto s = text_only->create_session(256);
  GenerationRequest req;
  req.prompt = p.tokens;
  req.images = p.images;
  req.max_tokens = 1;
  try {
    gen.generate(*s, req);
    FAIL() << "a model without a vision encoder took an image";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no vision encoder"), std::string::npos) << e.what();
  }
}

TEST(ImagePrompt, PadsExpandToEachImagesCount) {
  const int32_t pad = 9;
  std::vector<int32_t> prompt = {1, 8, pad, 7, 2, 8, pad, 7};
  const std::vector<int64_t> counts = {3, 1};
  EXPECT_EQ(image_pads_expand(prompt, counts, pad), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(prompt, (std::vector<int32_t>{1, 8, pad, pad, pad, 7, 2, 8, pad, 7}));
  std::vector<int32_t> one = {pad};
  EXPECT_THROW(image_pads_expand(one, counts, pad), Error);  // two images, one place for them
  std::vector<int32_t> none = {1, 2};
  EXPECT_NO_THROW(image_pads_expand(none, {}, pad));
}

TEST(ImagePrompt, HashFollowsThePixels) {
  std::mt19937_64 rng(fresh_seed("pixel hash"));
  auto a = random_pixels(rng, {1, 2, 2});
  ImagePixels b = *a;
  EXPECT_EQ(image_pixels_hash(*a), image_pixels_hash(b));
  b.values[b.values.size() / 2] += 1e-3f;
  EXPECT_NE(image_pixels_hash(*a), image_pixels_hash(b));
  ImagePixels c = *a;
  c.grid = {1, 4, 1};  // the same values on another grid
  EXPECT_NE(image_pixels_hash(*a), image_pixels_hash(c));
}

TEST(ImagePrompt, SettingsSayWhyImagesAreUnavailable) {
  const auto weights = demo_model_build();
  const Config& demo = weights->config;
  EXPECT_EQ(image_settings(demo, "", "").unavailable, "");
  EXPECT_EQ(image_settings(demo, "not here", "").unavailable, "not here");  // the runner's reason first
  DemoModelOptions o;
  o.vision = false;
  EXPECT_NE(image_settings(demo_model_build(o)->config, "", "").unavailable.find("no vision encoder"),
            std::string::npos);
  EXPECT_NE(ImageSettings{}.unavailable, "");  // never available unless set up
  // A processor whose patches differ from the encoder's.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tern_image_settings_" +
                                                                               std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "preprocessor_config.json") << R"({"patch_size": 14})";
  const std::string why = image_settings(demo, "", dir).unavailable;
  std::filesystem::remove_all(dir);
  EXPECT_NE(why.find("preprocessor_config.json (patch 14"), std::string::npos) << why;
}

}  // namespace
}  // namespace tern
