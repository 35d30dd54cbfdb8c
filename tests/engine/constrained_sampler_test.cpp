// Allowed-token masks in the host sampler (constrained decoding): masked ids are never chosen, greedy or sampled
// (top-k, top-p, min-p, penalties, logit_bias pushing a masked id up), their log-probability is -inf and the
// reported distribution is renormalised over the allowed ids; and the mask's host twin (apply_token_mask).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "core/check.h"
#include "engine/sampler.h"
#include "engine/token_mask.h"

namespace tern {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint64_t fresh_seed(const char* what) {
  const uint64_t s = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("[seed] %s: %llu\n", what, (unsigned long long)s);
  return s;
}

std::vector<float> random_logits(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(n));
  for (auto& x : l) x = d(rng);
  return l;
}

// A mask allowing `count` distinct random ids of [0, n).
std::vector<uint32_t> random_mask(std::mt19937_64& rng, int64_t n, int count, std::vector<int32_t>* ids = nullptr) {
  std::vector<uint32_t> m(size_t((n + 31) / 32), 0u);
  std::uniform_int_distribution<int32_t> id(0, int32_t(n - 1));
  for (int k = 0; k < count;) {
    const int32_t i = id(rng);
    if (token_mask_allows(m, i)) continue;
    m[size_t(i / 32)] |= 1u << (i % 32);
    if (ids) ids->push_back(i);
    ++k;
  }
  return m;
}

TEST(ConstrainedSampler, MaskTwinSetsExactlyTheClearBitsToMinusInf) {
  std::mt19937_64 rng(fresh_seed("ConstrainedSampler.Twin"));
  for (int64_t n : {1, 31, 32, 33, 1000, 4099}) {
    auto logits = random_logits(rng, n);
    logits[0] = kInf;  // non-finite values stay where allowed
    const auto mask = random_mask(rng, n, int(std::max<int64_t>(1, n / 3)));
    // A mask one word short: the ids past it are masked too.
    const std::span<const uint32_t> shorter = std::span(mask).first(mask.size() - (n > 32 ? 1 : 0));
    for (std::span<const uint32_t> m : {std::span<const uint32_t>(mask), shorter}) {
      auto got = logits;
      apply_token_mask(got, m);
      for (int64_t i = 0; i < n; ++i) {
        const float want = token_mask_allows(m, i) ? logits[size_t(i)] : -kInf;
        EXPECT_EQ(got[size_t(i)], want) << i;
      }
      int64_t allowed = 0;
      for (int64_t i = 0; i < n; ++i) allowed += token_mask_allows(m, i);
      EXPECT_EQ(token_mask_count(m, n), allowed);
    }
  }
}

TEST(ConstrainedSampler, MaskedIdsAreNeverChosen) {
  const uint64_t seed = fresh_seed("ConstrainedSampler.Never");
  std::mt19937_64 rng(seed);
  const int64_t V = 3000, Vreal = 2990;
  struct Mode {
    float temperature, top_p, min_p;
    int top_k;
  } modes[] = {{0.0f, 1.0f, 0.0f, 0}, {1.0f, 1.0f, 0.0f, 0}, {0.7f, 0.9f, 0.0f, 0}, {1.3f, 1.0f, 0.0f, 40},
               {1.0f, 0.5f, 0.05f, 20}, {2.0f, 1.0f, 0.2f, 0}};
  for (const Mode& mode : modes) {
    for (int allowed_count : {1, 2, 7, 500}) {
      std::vector<int32_t> allowed_ids;
      const auto mask = random_mask(rng, Vreal, allowed_count, &allowed_ids);
      SamplingParams p;
      p.temperature = mode.temperature;
      p.top_p = mode.top_p;
      p.min_p = mode.min_p;
      p.top_k = mode.top_k;
      p.seed = seed;
      p.presence_penalty = 0.5f;
      p.repetition_penalty = 1.1f;
      // logit_bias pushes a masked id to the top: the mask comes after it and still wins.
      int32_t masked = 0;
      while (token_mask_allows(mask, masked)) ++masked;
      p.logit_bias[masked] = 100.0f;
      Sampler s(p, Vreal);
      for (int draw = 0; draw < 200; ++draw) {
        auto logits = random_logits(rng, V);
        const auto original = logits;
        const int32_t id = s.sample(logits, nullptr, mask);
        ASSERT_TRUE(token_mask_allows(mask, id)) << "id " << id << " is masked (T " << mode.temperature << ")";
        s.accept(id);
        if (p.greedy() && draw == 0) {  // greedy: the arg-max of the allowed (penalty-free first step) logits
          int32_t best = allowed_ids[0];
          for (int32_t a : allowed_ids)
            if (original[size_t(a)] > original[size_t(best)] || (original[size_t(a)] == original[size_t(best)] && a < best))
              best = a;
          EXPECT_EQ(id, best);
        }
      }
    }
  }
}

TEST(ConstrainedSampler, LogprobsOfMaskedIdsAreMinusInfinity) {
  const uint64_t seed = fresh_seed("ConstrainedSampler.Logprobs");
  std::mt19937_64 rng(seed);
  const int64_t V = 512;
  for (float temperature : {0.0f, 0.8f}) {
    std::vector<int32_t> allowed_ids;
    const auto mask = random_mask(rng, V, 9, &allowed_ids);
    SamplingParams p;
    p.temperature = temperature;
    p.seed = seed;
    p.top_logprobs = 20;  // more than the allowed ids: only allowed ones may be listed
    Sampler s(p, V);
    auto logits = random_logits(rng, V);
    const auto original = logits;
    SampleInfo info;
    const int32_t id = s.sample(logits, &info, mask);
    ASSERT_TRUE(token_mask_allows(mask, id));
    EXPECT_EQ(info.top.size(), allowed_ids.size());
    double mass = 0.0;
    for (const TokenLogprob& t : info.top) {
      EXPECT_TRUE(token_mask_allows(mask, t.id)) << t.id;
      mass += std::exp(double(t.logprob));
    }
    EXPECT_NEAR(mass, 1.0, 1e-5);  // renormalised over the allowed ids
    for (int32_t i = 0; i < V; ++i)
      if (!token_mask_allows(mask, i)) {
        ASSERT_EQ(s.last_logprob(logits, i), -kInf) << i;
      }
    // The chosen id's log-probability (at temperature 1 when greedy) from the allowed logits only.
    const float t = temperature > 0 ? temperature : 1.0f;
    double z = 0.0, mx = -1e30;
    for (int32_t a : allowed_ids) mx = std::max(mx, double(original[size_t(a)]) / t);
    for (int32_t a : allowed_ids) z += std::exp(double(original[size_t(a)]) / t - mx);
    EXPECT_NEAR(info.logprob, double(original[size_t(id)]) / t - mx - std::log(z), 1e-4);
  }
}

TEST(ConstrainedSampler, NoAllowedFiniteIdIsAnError) {
  SamplingParams p;
  p.temperature = 0.0f;
  std::vector<uint32_t> mask(2, 0u);
  mask[0] = 1u << 3;
  p.logit_bias[3] = -kInf;  // the one allowed id is banned
  Sampler s(p, 64);
  std::vector<float> logits(64, 1.0f);
  try {
    s.sample(logits, nullptr, mask);
    FAIL() << "sampling with no allowed finite logit must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("constraint"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tern
