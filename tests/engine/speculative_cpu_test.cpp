// Speculative decoding on the CPU backend with the demo model's architecture (random weights): greedy output with
// n-gram drafts equals greedy output without, token for token, over random and repetitive prompts (and drafts are
// accepted, so the comparison means something); and under temperature > 0 a verified draft keeps the target
// distribution: many draws of one step with a fixed draft against the model's own distribution (chi-square), the
// draft accepted as often as the model gives it probability.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/generator.h"
#include "test_seed.h"

namespace tern {
namespace {

constexpr int64_t kVocab = 512;

struct Demo {
  Demo() {
    DemoModelOptions o;
    o.vocab_real = kVocab;
    o.eos_json = "[500]";
    runner = cpu_runner_create(demo_model_build(o));
  }
  GenerationResult generate(SpeculativeMode mode, const GenerationRequest& req) {
    GeneratorOptions o;
    o.speculative.mode = mode;
    Generator gen(*runner, TokenTextSource{.bytes = [](int32_t id) { return "<" + std::to_string(id) + ">"; },
                                           .is_special = {}},
                  o);
    auto s = runner->create_session(512);
    return gen.generate(*s, req);
  }
  std::unique_ptr<ModelRunner> runner;
};

TEST(SpeculativeCpu, GreedyOutputIsTheSameWithDrafts) {
  Demo demo;
  ASSERT_TRUE(demo.runner->supports_verify());
  std::mt19937_64 rng(testing::fresh_seed());
  int64_t accepted = 0, drafted = 0;
  for (int i = 0; i < 12; ++i) {
    GenerationRequest req;
    req.sampling.temperature = 0.0f;
    req.max_tokens = 40;
    req.ignore_eos = i % 2 == 0;
    const size_t n = 3 + rng() % 40;
    if (i % 3 == 0) {  // repetitive: a phrase over and over
      std::vector<int32_t> phrase(2 + rng() % 6);
      for (auto& t : phrase) t = int32_t(rng() % kVocab);
      while (req.prompt.size() < n + phrase.size()) req.prompt.insert(req.prompt.end(), phrase.begin(), phrase.end());
    } else {
      for (size_t j = 0; j < n; ++j) req.prompt.push_back(int32_t(rng() % kVocab));
    }
    const GenerationResult a = demo.generate(SpeculativeMode::off, req);
    const GenerationResult b = demo.generate(SpeculativeMode::ngram, req);
    ASSERT_EQ(a.tokens, b.tokens) << "prompt " << i;
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(finish_reason_name(a.finish), std::string(finish_reason_name(b.finish)));
    // Random weights rarely repeat themselves, so n-gram drafts rarely pass: a prediction of the answer with a
    // wrong token every few places gives drafts accepted and rejected at every position of a verify step.
    req.prediction = a.tokens;
    for (size_t j = 0; j < req.prediction.size(); j += 2 + rng() % 9) req.prediction[j] = int32_t(rng() % kVocab);
    const GenerationResult c = demo.generate(SpeculativeMode::ngram, req);
    ASSERT_EQ(a.tokens, c.tokens) << "prompt " << i << " with a prediction";
    EXPECT_EQ(a.text, c.text);
    accepted += b.accepted_draft_tokens + c.accepted_draft_tokens;
    drafted += b.draft_tokens + c.draft_tokens;
    if (std::getenv("TERN_TEST_VERBOSE")) {
      for (int32_t t : b.tokens) std::printf("%d ", t);
      std::printf("\n");
    }
  }
  std::printf("drafts: %lld accepted of %lld\n", (long long)accepted, (long long)drafted);
  EXPECT_GT(accepted, 0) << "no draft was accepted: the comparison proves little";
}

// One sampled step after a fixed context, with the draft x: token 0 is forced (a spent thinking budget forces its
// close tokens) so that the prediction [t0, x] drafts x for token 1.
TEST(SpeculativeCpu, SamplingWithADraftKeepsTheTargetDistribution) {
  Demo demo;
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> prompt;
  for (int j = 0; j < 5; ++j) prompt.push_back(int32_t(rng() % kVocab));
  const int32_t t0 = int32_t(rng() % kVocab);
  const float temperature = 1.5f;
  const int top_k = 6;

  // The target: the model's logits after prompt + t0, as the sampler shapes them (temperature, top-k).
  std::vector<float> logits;
  {
    auto s = demo.runner->create_session(64);
    std::vector<int32_t> all = prompt;
    all.push_back(t0);
    demo.runner->forward(*s, all, false, logits);
  }
  const float inv_t = 1.0f / temperature;
  std::vector<std::pair<float, int32_t>> ranked;
  for (int32_t v = 0; v < kVocab; ++v) ranked.emplace_back(logits[size_t(v)] * inv_t, v);
  std::sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.first > b.first; });
  ranked.resize(size_t(top_k));
  std::vector<double> p(static_cast<size_t>(top_k));
  double z = 0;
  for (int i = 0; i < top_k; ++i) z += (p[size_t(i)] = std::exp(double(ranked[size_t(i)].first - ranked[0].first)));
  for (double& q : p) q /= z;
  const int32_t x = ranked[1].second;  // a plausible draft that is often wrong

  GenerationRequest req;
  req.prompt = prompt;
  req.sampling.temperature = temperature;
  req.sampling.top_k = top_k;
  req.max_tokens = 2;
  req.thinking_budget = 0;
  req.starts_in_reasoning = true;
  req.reasoning_close_tokens = {t0};
  req.prediction = {t0, x};
  const int trials = 2000;
  std::vector<int64_t> count(size_t(top_k), 0);
  int64_t accepted = 0, drafted = 0;
  for (int n = 0; n < trials; ++n) {
    const GenerationResult r = demo.generate(SpeculativeMode::ngram, req);
    ASSERT_EQ(r.tokens.size(), 2u);
    ASSERT_EQ(r.tokens[0], t0);
    const auto it = std::find_if(ranked.begin(), ranked.end(), [&](auto& e) { return e.second == r.tokens[1]; });
    ASSERT_NE(it, ranked.end()) << "a token outside the top-k";
    ++count[size_t(it - ranked.begin())];
    accepted += r.accepted_draft_tokens;
    drafted += r.draft_tokens;
  }
  ASSERT_EQ(drafted, trials) << "each run verified the one draft";
  double chi2 = 0;
  for (int i = 0; i < top_k; ++i) {
    const double e = trials * p[size_t(i)];
    chi2 += (double(count[size_t(i)]) - e) * (double(count[size_t(i)]) - e) / e;
    std::printf("token %d: p %.4f, drawn %lld (expected %.1f)\n", ranked[size_t(i)].second, p[size_t(i)],
                (long long)count[size_t(i)], e);
  }
  // 5 degrees of freedom: P(chi2 > 25.7) = 1e-4.
  EXPECT_LT(chi2, 25.7) << "the draws do not follow the model's distribution";
  // Accepted exactly when the draw is x: a binomial with p(x), held within 4.5 standard deviations.
  const double px = p[1], sd = std::sqrt(trials * px * (1 - px));
  EXPECT_NEAR(double(accepted), trials * px, 4.5 * sd);
  EXPECT_EQ(accepted, count[1]);
}

}  // namespace
}  // namespace tern
