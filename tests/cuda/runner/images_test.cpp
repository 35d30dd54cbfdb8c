// Images in the CUDA forward (ModelRunner::forward_images; docs/architecture.md, "Images in the language model")
// against the CPU runner on the same random weights (Qwen3.6's widths, 4 layers) and the same made-up image rows (the
// encoder is encode_image's and is not run here): a prompt with two images of different grids, cut by the chunk seam
// inside the second image, and fed in calls that put image tokens through the decode plan too; then the steps after
// the images, where text sits at cache position + rope_delta (one token per call, the decode graph, the batched
// step, the verify step); snapshots keep the delta; text-only calls are forward() bit for bit; refused calls consume
// nothing.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "../cuda_test_util.h"
#include "cpu/cpu_runner.h"
#include "cuda/runner/cuda_runner.h"
#include "fidelity_util.h"
#include "engine/demo_vision.h"
#include "model/vision_weights.h"
#include "random_model.h"

namespace tern::cuda::test {
namespace {

constexpr int64_t kVocab = 4096;

// random_model's language model with a small random vision tower (the demo's widths: the runners build their
// encoder from it; these tests feed made-up image rows, so only its merge size (2) matters here).
std::shared_ptr<const ModelWeights> model_with_vision(uint64_t seed, RandomModel& rm) {
  random_model(seed, 4, kVocab, rm);
  VisionConfig vc;
  vc.depth = 2;
  vc.hidden_size = 64;
  vc.intermediate_size = 128;
  vc.num_heads = 4;
  vc.num_position_embeddings = 64;
  vc.out_hidden_size = rm.w->config.hidden_size;
  rm.w->config.vision = vc;
  rm.w->vision = demo_vision_build(vc, seed ^ 0x5eedu);
  return rm.w;
}

struct ImagePrompt {
  std::vector<ImageEmbeddings> images;  // two of different grids
  std::vector<int32_t> tokens;          // text, start, image 0's run, end, text, start, image 1's run, end, text
  std::vector<int64_t> offsets;         // where each image's run starts
};

// Grids (1, 4, 6) and (1, 8, 12): runs of 6 and 24 tokens at 6 and 18 of 47; rows of rms ~1, as the embedding's.
ImagePrompt make_prompt(std::mt19937_64& rng, int64_t D, int64_t real) {
  ImagePrompt p;
  const MropeGrid grids[2] = {{1, 4, 6}, {1, 8, 12}};
  auto text = [&](int n) {
    for (int i = 0; i < n; ++i) p.tokens.push_back(int32_t(rng() % uint64_t(real)));
  };
  text(5);
  for (const MropeGrid& g : grids) {
    ImageEmbeddings im;
    im.grid = g;
    im.tokens = g.t * g.h * g.w / 4;
    im.values = random_floats(rng, size_t(im.tokens * D), -1.7f, 1.7f);
    text(1);  // <|vision_start|>: any id (only the rows of the image's tokens replace the table's)
    p.offsets.push_back(int64_t(p.tokens.size()));
    p.tokens.insert(p.tokens.end(), size_t(im.tokens), 1);
    p.images.push_back(std::move(im));
    text(1);  // <|vision_end|>
    text(4);
  }
  return p;
}

// The spans of the prompt's tokens [from, to).
std::vector<ImageSpan> spans(const ImagePrompt& p, int64_t from, int64_t to) {
  std::vector<ImageSpan> out;
  for (size_t i = 0; i < p.images.size(); ++i)
    if (std::optional<ImageSpan> s = image_span_within(p.offsets[i], p.images[i].tokens, from, to)) {
      s->image = &p.images[i];
      out.push_back(*s);
    }
  return out;
}

// Every position's logits, the prompt fed in calls that end at `cuts` (and at its end).
std::vector<float> run_in_calls(ModelRunner& r, Session& s, const ImagePrompt& p, std::vector<int64_t> cuts) {
  cuts.push_back(int64_t(p.tokens.size()));
  std::vector<float> all, part;
  int64_t from = 0;
  for (int64_t to : cuts) {
    if (to <= from) continue;
    r.forward_images(s, std::span(p.tokens).subspan(size_t(from), size_t(to - from)), spans(p, from, to), true, part);
    all.insert(all.end(), part.begin(), part.end());
    from = to;
  }
  return all;
}

// Held as runner_test.cpp holds the exact prefill plan to the CPU runner (and the decode plan to the prefill plan).
void expect_matches_cpu(const std::vector<float>& ref, const std::vector<float>& got, const std::vector<int32_t>& tokens,
                        int64_t V, int64_t real, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const Fidelity f = compare_logits(ref, got, tokens, V, real);
  std::printf("[%s] ppl %.5f vs %.5f, KL %.3g, top-1 %.3f, max |dlogit| %.4g\n", what, f.ppl, f.ppl_ref, f.kl, f.top1,
              f.max_abs);
  EXPECT_LT(std::fabs(f.ppl / f.ppl_ref - 1.0), 1e-3) << what;
  EXPECT_LE(f.kl, 1e-4) << what;
}

int32_t argmax(const std::vector<float>& logits, int64_t real) {
  return int32_t(std::max_element(logits.begin(), logits.begin() + real) - logits.begin());
}

TEST(CudaImages, MatchCpuRunnerAcrossChunksAndPlans) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaImages");
  RandomModel rm;
  auto weights = model_with_vision(seed, rm);
  const int64_t V = weights->config.vocab_size, real = weights->vocab_real, D = weights->config.hidden_size;
  std::mt19937_64 rng(seed ^ 0x1a9e);
  const ImagePrompt p = make_prompt(rng, D, real);
  const int64_t n = int64_t(p.tokens.size());
  auto cpu = cpu_runner_create(weights);
  // Chunks of 32 tokens: the seam cuts image 1 (tokens 18..41).
  auto gpu = cuda_runner_create(weights, {.max_chunk = 32, .progress = false, .exact_prefill = true});
  EXPECT_EQ(gpu->images_unavailable(), "");
  auto cs = cpu->create_session(256);
  const std::vector<float> ref = run_in_calls(*cpu, *cs, p, {});
  ASSERT_NE(cs->rope_delta(), 0);

  // One call (two prefill chunks), and calls of 20, 6 (the decode plan, image 1's tokens 2..7) and 21 tokens.
  std::vector<std::unique_ptr<Session>> whole;  // sessions after the whole prompt in one call
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{}, std::vector<int64_t>{20, 26}}) {
    auto gs = gpu->create_session(256);
    const std::vector<float> got = run_in_calls(*gpu, *gs, p, cuts);
    EXPECT_EQ(gs->position(), n);
    EXPECT_EQ(gs->rope_delta(), cs->rope_delta());
    expect_matches_cpu(ref, got, p.tokens, V, real, cuts.empty() ? "images, one call" : "images, calls 20 + 6 + 21");
  }
  for (int i = 0; i < 3; ++i) {
    whole.push_back(gpu->create_session(256));
    run_in_calls(*gpu, *whole.back(), p, {});
  }

  // After the images: text at cache position + delta, one token per call (the decode plan) against the CPU.
  const std::vector<int32_t> next = random_tokens(rng, 6, real);
  std::vector<float> want, steps, one;
  auto cs_next = cpu->create_session(256);
  run_in_calls(*cpu, *cs_next, p, {});
  cpu->forward(*cs_next, next, true, want);
  for (int32_t t : next) {
    gpu->forward(*whole[0], std::span(&t, 1), false, one);
    steps.insert(steps.end(), one.begin(), one.end());
  }
  expect_matches_cpu(want, steps, next, V, real, "one token per call after the images");

  // The verify step: row j bit for bit the one-token steps.
  if (gpu->supports_verify()) {
    const int64_t T = std::min<int64_t>(gpu->max_verify_tokens(), int64_t(next.size()));
    std::vector<float> rows;
    gpu->forward_verify(*whole[1], std::span(next).first(size_t(T)), rows);
    EXPECT_TRUE(same_bits(rows, std::vector<float>(steps.begin(), steps.begin() + T * V))) << "verify after images";
  }

  // forward_sample (its first step eager, then the session's decode graph) and forward_batch (beside a text-only
  // session at delta 0) against the CPU's greedy choice: the same id, or one whose CPU logit is within 1e-3 of the
  // top's (a near-tie the two backends' rounding may break either way).
  auto cpu_text = cpu->create_session(256);
  auto gpu_text = gpu->create_session(256);
  const std::vector<int32_t> text_prompt = random_tokens(rng, 30, real);
  std::vector<float> text_logits;
  cpu->forward(*cpu_text, text_prompt, false, text_logits);
  gpu->forward(*gpu_text, text_prompt, false, text_logits);
  auto cs_sample = cpu->create_session(256);
  run_in_calls(*cpu, *cs_sample, p, {});
  auto expect_cpu_choice = [&](int32_t id, const std::vector<float>& cpu_logits, const char* what, int step) {
    const int32_t best = argmax(cpu_logits, real);
    EXPECT_TRUE(id == best || cpu_logits[size_t(id)] >= cpu_logits[size_t(best)] - 1e-3f)
        << what << " step " << step << ": " << id << " against the CPU's " << best;
  };
  int32_t in_image = next[0], in_text = text_prompt.back();
  const int64_t batched_before = cuda_runner_batched_steps(*gpu);
  for (int step = 0; step < 6; ++step) {
    std::vector<float> cpu_image_logits, cpu_text_logits;
    cpu->forward(*cs_sample, std::span(&in_image, 1), false, cpu_image_logits);
    if (step < 3) {  // alone
      const auto id = gpu->forward_sample(*whole[2], std::span(&in_image, 1), DeviceSampling{});
      ASSERT_TRUE(id.has_value());
      expect_cpu_choice(*id, cpu_image_logits, "forward_sample after images", step);
    } else {  // batched beside the text-only session
      cpu->forward(*cpu_text, std::span(&in_text, 1), false, cpu_text_logits);
      const DeviceSampling greedy{};
      BatchEntry a, b;
      a.session = whole[2].get();
      a.tokens = std::span(&in_image, 1);
      a.sampling = &greedy;
      b.session = gpu_text.get();
      b.tokens = std::span(&in_text, 1);
      b.sampling = &greedy;
      std::vector<BatchEntry> batch = {a, b};
      gpu->forward_batch(batch);
      ASSERT_FALSE(batch[0].error);
      ASSERT_FALSE(batch[1].error);
      ASSERT_TRUE(batch[0].sampled.has_value() && batch[1].sampled.has_value());
      expect_cpu_choice(*batch[0].sampled, cpu_image_logits, "batched step after images", step);
      expect_cpu_choice(*batch[1].sampled, cpu_text_logits, "batched step, text-only session", step);
      in_text = argmax(cpu_text_logits, real);
    }
    in_image = argmax(cpu_image_logits, real);
  }
  if (gpu->supports_verify()) {  // the batched kernels apply (batch_max() >= 2)
    EXPECT_GT(cuda_runner_batched_steps(*gpu), batched_before) << "no batched step ran";
  }
  EXPECT_EQ(whole[2]->rope_delta(), cs->rope_delta());
}

TEST(CudaImages, TextOnlyCallsAreForwardBitForBit) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaImages.TextOnly");
  RandomModel rm;
  auto weights = model_with_vision(seed, rm);
  std::mt19937_64 rng(seed ^ 0x7e47);
  const std::vector<int32_t> prompt = random_tokens(rng, 40, weights->vocab_real);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  auto a = gpu->create_session(128), b = gpu->create_session(128);
  std::vector<float> la, lb;
  gpu->forward(*a, prompt, true, la);  // the prefill plan
  gpu->forward_images(*b, prompt, {}, true, lb);
  EXPECT_TRUE(same_bits(la, lb)) << "prefill";
  for (int i = 0; i < 3; ++i) {  // the decode plan
    const std::span<const int32_t> one = std::span(prompt).subspan(size_t(i), 1);
    gpu->forward(*a, one, false, la);
    gpu->forward_images(*b, one, {}, false, lb);
    EXPECT_TRUE(same_bits(la, lb)) << "decode step " << i;
  }
  EXPECT_EQ(b->rope_delta(), 0);
}

TEST(CudaImages, SnapshotsKeepTheDelta) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaImages.Snapshots");
  RandomModel rm;
  auto weights = model_with_vision(seed, rm);
  std::mt19937_64 rng(seed ^ 0x5a9);
  const ImagePrompt p = make_prompt(rng, weights->config.hidden_size, weights->vocab_real);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  auto s = gpu->create_session(256);
  run_in_calls(*gpu, *s, p, {});
  const int64_t delta = s->rope_delta();
  ASSERT_NE(delta, 0);
  const std::vector<int32_t> next = random_tokens(rng, 3, weights->vocab_real);
  std::vector<float> want, got, scratch;
  auto snap = s->snapshot();
  gpu->forward(*s, next, true, want);
  // Another image after the snapshot moves the delta; restoring brings it back, from the device and from the host.
  const std::vector<int32_t> run(size_t(p.images[1].tokens), 1);
  const ImageSpan again{.image = &p.images[1], .at = 0, .first = 0, .count = p.images[1].tokens};
  for (const bool host : {false, true}) {
    s->restore(*snap);
    EXPECT_EQ(s->rope_delta(), delta);
    gpu->forward_images(*s, run, std::span(&again, 1), true, scratch);
    EXPECT_NE(s->rope_delta(), delta);
    if (host) snap->to_host();
    s->restore(*snap);
    EXPECT_EQ(s->rope_delta(), delta);
    gpu->forward(*s, next, true, got);
    EXPECT_TRUE(same_bits(got, want)) << (host ? "restored from the host" : "restored from the device");
  }
  s->reset();
  EXPECT_EQ(s->rope_delta(), 0);
}

TEST(CudaImages, RefusedCallsConsumeNothing) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaImages.Refused");
  RandomModel rm;
  auto weights = model_with_vision(seed, rm);
  auto without = std::make_shared<ModelWeights>(*weights);  // the same language model (its matrices shared)
  without->vision.reset();
  without->config.vision.reset();
  auto text_only = cuda_runner_create(without, {.progress = false});
  EXPECT_FALSE(text_only->images_unavailable().empty());
  auto gpu = cuda_runner_create(weights, {.progress = false});
  EXPECT_EQ(gpu->images_unavailable(), "");
  std::mt19937_64 rng(seed);
  const ImagePrompt p = make_prompt(rng, weights->config.hidden_size, weights->vocab_real);
  const int64_t n0 = p.offsets[0] + p.images[0].tokens;  // text and the first image
  const std::span<const int32_t> head = std::span(p.tokens).first(size_t(n0));
  std::vector<ImageSpan> good = spans(p, 0, n0);
  ASSERT_EQ(good.size(), 1u);
  std::vector<float> logits;
  auto t = text_only->create_session(64);
  EXPECT_THROW(text_only->forward_images(*t, head, good, true, logits), Error);
  EXPECT_EQ(t->position(), 0);
  auto s = gpu->create_session(64);
  ImageSpan past = good[0];
  past.at += 1;  // runs past the call's end
  EXPECT_THROW(gpu->forward_images(*s, head, std::span(&past, 1), true, logits), Error);
  EXPECT_EQ(s->position(), 0);
  EXPECT_EQ(s->rope_delta(), 0);
  gpu->forward_images(*s, head, good, true, logits);  // still usable
  EXPECT_EQ(s->position(), n0);
  EXPECT_NE(s->rope_delta(), 0);
}

}  // namespace
}  // namespace tern::cuda::test
