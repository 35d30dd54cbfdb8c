// Sampler: greedy and its edge cases, padded ids, penalties, logit bias, seeds, log-probabilities, and the sampled
// distribution compared with the definition (temperature -> top-k -> top-p -> min-p) over many draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "core/check.h"
#include "engine/sampler.h"

namespace tern {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint64_t fresh_seed() {
  const uint64_t s = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(s));
  return s;
}

SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  Sampler s(greedy_params(), 5);
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, TopKOneAndTemperatureZeroAreGreedy) {
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> base(1000);
  for (float& x : base) x = nd(rng);
  const int32_t want = int32_t(std::max_element(base.begin(), base.end()) - base.begin());
  SamplingParams k1;
  k1.top_k = 1;
  k1.temperature = 1.5f;
  SamplingParams t0 = greedy_params();
  for (const SamplingParams& p : {k1, t0}) {
    Sampler s(p, 1000);
    for (int i = 0; i < 20; ++i) {
      auto l = base;
      EXPECT_EQ(s.sample(l), want);
    }
  }
}

TEST(Sampler, TinyTopPKeepsOnlyTheTopToken) {
  std::vector<float> base = {1.0f, 1.2f, 0.9f, 1.19f, -3.0f};
  SamplingParams p;
  p.top_p = 1e-6f;
  p.seed = fresh_seed();
  Sampler s(p, 5);
  for (int i = 0; i < 200; ++i) {
    auto l = base;
    EXPECT_EQ(s.sample(l), 1);
  }
}

TEST(Sampler, OneFiniteLogitIsAlwaysChosen) {
  const int64_t V = 4096;
  std::vector<float> base(V, -kInf);
  base[1234] = -50.0f;
  for (SamplingParams p : {SamplingParams{}, greedy_params()}) {
    p.seed = fresh_seed();
    p.top_k = 40;
    p.min_p = 0.5f;
    p.top_p = 0.3f;
    Sampler s(p, V);
    for (int i = 0; i < 50; ++i) {
      auto l = base;
      EXPECT_EQ(s.sample(l), 1234);
    }
  }
  SamplingParams plain;
  Sampler s(plain, V);
  auto l = base;
  EXPECT_EQ(s.sample(l), 1234);
}

TEST(Sampler, NoFiniteLogitIsAnError) {
  std::vector<float> l(16, -kInf);
  l[3] = std::numeric_limits<float>::quiet_NaN();
  Sampler s(SamplingParams{}, 16);
  EXPECT_THROW(s.sample(l), Error);
}

TEST(Sampler, PaddedIdsAreNeverSampled) {
  // Padding [100, 128) carries huge logits; the sampler must look only at [0, 100).
  std::vector<float> base(128, 0.0f);
  for (int i = 100; i < 128; ++i) base[size_t(i)] = 1000.0f;
  base[7] = 0.5f;
  SamplingParams p;
  p.seed = fresh_seed();
  p.top_logprobs = 20;
  Sampler s(p, 100);
  for (int i = 0; i < 500; ++i) {
    auto l = base;
    SampleInfo info;
    const int32_t id = s.sample(l, &info);
    ASSERT_LT(id, 100);
    for (const TokenLogprob& t : info.top) ASSERT_LT(t.id, 100);
  }
  Sampler g(greedy_params(), 100);
  auto l = base;
  EXPECT_EQ(g.sample(l), 7);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> base(5000);
  for (float& x : base) x = nd(rng);
  auto run = [&](uint64_t sd) {
    SamplingParams p;
    p.seed = sd;
    p.top_p = 0.9f;
    Sampler s(p, 5000);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = base;
      out.push_back(s.sample(l));
    }
    return out;
  };
  EXPECT_EQ(run(seed), run(seed));
  EXPECT_NE(run(seed), run(seed + 1));
}

TEST(Sampler, RepetitionPenaltyCoversPromptAndSignOfTheLogit) {
  SamplingParams p = greedy_params();
  p.repetition_penalty = 1.1f;
  const int32_t prompt[] = {0, 2};
  Sampler s(p, 4, prompt);
  std::vector<float> l = {2.0f, 1.9f, -1.0f, -1.05f};  // 2.0 / 1.1 = 1.82 < 1.9
  EXPECT_EQ(s.sample(l), 1);
  EXPECT_FLOAT_EQ(l[2], -1.1f);                          // negative logits are multiplied
  std::vector<float> m = {-5.0f, -5.0f, -1.0f, -1.05f};  // -1 * 1.1 = -1.1 < -1.05
  EXPECT_EQ(s.sample(m), 3);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  SamplingParams p = greedy_params();
  p.presence_penalty = 0.2f;
  Sampler s(p, 2);
  std::vector<float> l = {2.0f, 1.9f};
  EXPECT_EQ(s.sample(l), 0);
  s.accept(0);
  l = {2.0f, 1.9f};
  EXPECT_EQ(s.sample(l), 1);

  SamplingParams f = greedy_params();
  f.frequency_penalty = 0.06f;
  Sampler t(f, 2);
  t.accept(0);
  l = {2.0f, 1.9f};
  EXPECT_EQ(t.sample(l), 0);  // 2 - 0.06 = 1.94
  t.accept(0);
  l = {2.0f, 1.9f};
  EXPECT_EQ(t.sample(l), 1);  // 2 - 0.12 = 1.88
}

TEST(Sampler, LogitBiasBansAndBoosts) {
  SamplingParams p = greedy_params();
  p.logit_bias = {{0, -kInf}, {2, 5.0f}};
  Sampler s(p, 3);
  std::vector<float> l = {9.0f, 1.0f, 4.5f};
  EXPECT_EQ(s.sample(l), 2);
  SamplingParams ban;
  ban.seed = fresh_seed();
  ban.logit_bias = {{0, -kInf}};
  Sampler b(ban, 3);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> x = {9.0f, 1.0f, 1.0f};
    EXPECT_NE(b.sample(x), 0);
  }
}

TEST(Sampler, InvalidParametersAreNamed) {
  auto bad = [](auto edit, const char* name) {
    SamplingParams p;
    edit(p);
    try {
      Sampler s(p, 10);
      ADD_FAILURE() << "no error for " << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  bad([](SamplingParams& p) { p.temperature = std::nanf(""); }, "temperature");
  bad([](SamplingParams& p) { p.temperature = -1.0f; }, "temperature");
  bad([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  bad([](SamplingParams& p) { p.min_p = 1.5f; }, "min_p");
  bad([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  bad([](SamplingParams& p) { p.top_logprobs = 21; }, "top_logprobs");
  bad([](SamplingParams& p) { p.logit_bias[10] = 1.0f; }, "logit_bias");
  bad([](SamplingParams& p) { p.logit_bias[1] = kInf; }, "logit_bias");
}

// log_softmax in double, the definition.
std::vector<double> log_softmax(const std::vector<float>& l) {
  const double m = *std::max_element(l.begin(), l.end());
  double z = 0.0;
  for (float x : l) z += std::exp(double(x) - m);
  std::vector<double> out;
  for (float x : l) out.push_back(double(x) - m - std::log(z));
  return out;
}

TEST(Sampler, LogProbabilitiesAreTheSamplersDistribution) {
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> base(300);
  for (float& x : base) x = nd(rng);
  for (float temperature : {0.0f, 0.7f, 2.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_logprobs = 5;
    p.seed = 1;
    Sampler s(p, 300);
    auto l = base;
    SampleInfo info;
    const int32_t id = s.sample(l, &info);
    std::vector<float> scaled = base;
    if (temperature > 0)
      for (float& x : scaled) x /= temperature;
    const auto ls = log_softmax(scaled);
    EXPECT_NEAR(info.logprob, ls[size_t(id)], 1e-4);
    ASSERT_EQ(info.top.size(), 5u);
    std::vector<int32_t> order(300);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return base[size_t(a)] > base[size_t(b)]; });
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(info.top[i].id, order[i]);
      EXPECT_NEAR(info.top[i].logprob, ls[size_t(order[i])], 1e-4);
    }
  }
}

// The distribution the definition gives: softmax(l / T), keep the top_k, keep the smallest prefix whose share of the
// top-k mass reaches top_p, drop p < min_p * p_max, renormalise.
std::vector<double> expected_distribution(const std::vector<float>& l, const SamplingParams& p) {
  const size_t n = l.size();
  std::vector<double> prob(n);
  const double m = *std::max_element(l.begin(), l.end());
  for (size_t i = 0; i < n; ++i) prob[i] = std::exp((double(l[i]) - m) / p.temperature);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] > prob[b]; });
  size_t keep = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), n) : n;
  double mass = 0.0;
  for (size_t i = 0; i < keep; ++i) mass += prob[order[i]];
  double acc = 0.0;
  size_t kp = keep;
  for (size_t i = 0; i < keep; ++i) {
    if (acc >= p.top_p * mass) {
      kp = i;
      break;
    }
    acc += prob[order[i]];
  }
  keep = std::max<size_t>(kp, 1);
  size_t km = 1;
  while (km < keep && prob[order[km]] >= p.min_p * prob[order[0]]) ++km;
  keep = km;
  std::vector<double> out(n, 0.0);
  double z = 0.0;
  for (size_t i = 0; i < keep; ++i) z += prob[order[i]];
  for (size_t i = 0; i < keep; ++i) out[order[i]] = prob[order[i]] / z;
  return out;
}

TEST(Sampler, DistributionMatchesTheDefinition) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  const int draws = 20000;
  for (int trial = 0; trial < 12; ++trial) {
    const size_t n = 12;
    std::vector<float> base(n);
    for (float& x : base) x = nd(rng);
    SamplingParams p;
    p.seed = rng();
    p.temperature = 0.4f + 1.2f * ud(rng);
    p.top_k = trial % 3 == 0 ? 0 : int(1 + rng() % n);
    p.top_p = trial % 2 == 0 ? 1.0f : 0.3f + 0.7f * ud(rng);
    p.min_p = trial % 4 == 1 ? 0.2f * ud(rng) : 0.0f;
    const auto want = expected_distribution(base, p);
    Sampler s(p, int64_t(n));
    std::vector<int> counts(n, 0);
    for (int i = 0; i < draws; ++i) {
      auto l = base;
      ++counts[size_t(s.sample(l))];
    }
    for (size_t i = 0; i < n; ++i) {
      const double f = double(counts[i]) / draws;
      // Five standard deviations of a binomial frequency, plus slack for rounding at the top-p/min-p boundaries.
      const double tol = 5.0 * std::sqrt(want[i] * (1 - want[i]) / draws) + 1e-3;
      EXPECT_NEAR(f, want[i], tol) << "trial " << trial << " id " << i << " T=" << p.temperature << " top_k="
                                   << p.top_k << " top_p=" << p.top_p << " min_p=" << p.min_p;
    }
  }
}

// top_k candidates in one pass (a heap of the k best so far): ties at the k-th value go to the lower ids, as a full
// sort by (value desc, id asc) gives them; every candidate is drawn at its share.
TEST(Sampler, TopKTiesGoToTheLowerIds) {
  const uint64_t seed = fresh_seed();
  std::vector<float> base(50, 1.0f);
  base[40] = 2.0f;  // the best, then 49 tied at 1.0
  SamplingParams p;
  p.seed = seed;
  p.top_k = 4;
  Sampler s(p, 50);
  std::vector<int> counts(50, 0);
  for (int i = 0; i < 4000; ++i) {
    auto l = base;
    ++counts[size_t(s.sample(l))];
  }
  for (int id = 0; id < 50; ++id) {
    if (id == 40 || id < 3)
      EXPECT_GT(counts[size_t(id)], 0) << id << " (seed " << seed << ")";
    else
      EXPECT_EQ(counts[size_t(id)], 0) << id << " is not among the top 4 (seed " << seed << ")";
  }
  EXPECT_GT(counts[40], counts[0]);  // e/(e + 3) of the draws against 1/(e + 3)
}

TEST(Sampler, FullVocabularyIsFastAndStaysInTheNucleus) {
  const int64_t V = 248320, real = 248077;
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> base(static_cast<size_t>(V));
  for (float& x : base) x = nd(rng);
  for (int64_t i = real; i < V; ++i) base[size_t(i)] = 100.0f;
  SamplingParams p;  // Qwen's defaults
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.seed = rng();
  SamplingParams k20 = p;
  k20.top_k = 20;
  for (const SamplingParams& q : {p, k20}) {
    Sampler s(q, real);
    const auto top = sampler_top_n(base, real, q.top_k > 0 ? 20 : real);
    std::vector<int32_t> allowed(top.begin(), top.end());
    if (q.top_k <= 0) {  // the nucleus: the shortest prefix reaching 95% of the mass
      const auto ls = log_softmax(std::vector<float>(base.begin(), base.begin() + real));
      double acc = 0.0;
      size_t i = 0;
      while (i < top.size() && acc < 0.95) acc += std::exp(ls[size_t(top[i++])]);
      allowed.resize(i);
    }
    std::sort(allowed.begin(), allowed.end());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) {
      auto l = base;
      const int32_t id = s.sample(l);
      EXPECT_TRUE(std::binary_search(allowed.begin(), allowed.end(), id)) << id;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 20;
    std::printf("top_k=%d: %.2f ms per draw over %lld ids\n", q.top_k, ms, static_cast<long long>(V));
    EXPECT_LT(ms, 1000.0);  // a smoke bound: CI machines are shared and slow
  }
}

TEST(Sampler, DefaultsComeFromGenerationConfig) {
  Config c;
  c.gen_temperature = 0.6;
  c.gen_top_p = 0.95;
  c.gen_top_k = 20;
  const SamplingParams p = sampling_defaults(c);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.min_p, 0.0f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.0f);
}

}  // namespace
}  // namespace tern
