// Eval metrics: log-softmax over the real vocabulary, perplexity, KL(ref || tern), top-1 agreement, each checked
// against sums written out independently here; eval_run over a fake runner; the token-file reader.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/check.h"
#include "core/npy.h"
#include "eval_fake_runner.h"
#include "test_seed.h"
#include "engine/eval_metrics.h"
#include "engine/eval_run.h"

namespace tern {
namespace {

using testing::fresh_seed;

std::vector<float> random_row(std::mt19937_64& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> r(static_cast<size_t>(n));
  for (auto& v : r) v = d(rng);
  return r;
}

// Independent long-double log-softmax of the first n values.
std::vector<long double> ref_log_softmax(const std::vector<float>& row, int64_t n) {
  long double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp((long double)row[size_t(i)]);
  std::vector<long double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = (long double)row[size_t(i)] - std::log(s);
  return out;
}

TEST(EvalMetrics, LogSoftmaxIgnoresPaddingAndMatchesDefinition) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t V = 300, real = 277;
  auto row = random_row(rng, V, 4.0f);
  for (int64_t i = real; i < V; ++i) row[size_t(i)] = 1e30f;  // padding must not count (no overflow either)
  std::vector<double> out(static_cast<size_t>(real));
  log_softmax_masked(row, real, out);
  const auto want = ref_log_softmax(row, real);
  for (int64_t i = 0; i < real; ++i) EXPECT_NEAR(out[size_t(i)], double(want[size_t(i)]), 1e-12) << i;
  // Padding set to +inf or NaN is ignored too; inside the real vocabulary NaN is an error naming the id.
  row[size_t(real)] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NO_THROW(log_softmax_masked(row, real, out));
  row[5] = std::numeric_limits<float>::quiet_NaN();
  try {
    log_softmax_masked(row, real, out);
    FAIL() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(log_softmax_masked(std::span<const float>(row.data(), 10), real, out), Error);
}

TEST(EvalMetrics, ArgmaxSkipsPadding) {
  std::vector<float> row = {0.1f, 2.0f, 2.0f, -1.0f, 9.0f};
  EXPECT_EQ(argmax_masked(row, 4), 1);  // first of the tie; id 4 is padding
  EXPECT_EQ(argmax_masked(row, 5), 4);
}

TEST(EvalMetrics, IdenticalRowsGiveZeroKlAndFullAgreement) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t V = 64, real = 60, n = 20;
  EvalAccumulator acc(real);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(real - 1));
  double nll = 0;
  for (int64_t p = 0; p < n; ++p) {
    auto row = random_row(rng, V, 2.0f);
    const int32_t next = p + 1 < n ? tok(rng) : -1;
    if (next >= 0) nll -= double(ref_log_softmax(row, real)[size_t(next)]);
    acc.add(row, row, next);
  }
  const EvalSummary s = acc.summary();
  EXPECT_EQ(s.positions, n);
  EXPECT_EQ(s.predictions, n - 1);
  EXPECT_TRUE(s.has_reference);
  EXPECT_NEAR(s.kl_mean, 0.0, 1e-14);
  EXPECT_DOUBLE_EQ(s.top1_agreement, 1.0);
  EXPECT_NEAR(s.nll_mean, nll / double(n - 1), 1e-12);
  EXPECT_NEAR(s.perplexity, std::exp(nll / double(n - 1)), 1e-9 * s.perplexity);
  EXPECT_DOUBLE_EQ(s.perplexity, s.reference_perplexity);
  EXPECT_DOUBLE_EQ(s.perplexity_rel_diff, 0.0);
}

TEST(EvalMetrics, PerturbedRowsMatchIndependentSums) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t V = 50, real = 50, n = 30;
  const float noise = 0.3f;  // stated perturbation of the reference: N(0, 0.3) per logit
  EvalAccumulator acc(real);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(real - 1));
  long double kl_sum = 0, kl_max = 0, nll = 0, rnll = 0;
  int64_t agree = 0;
  for (int64_t p = 0; p < n; ++p) {
    auto ref = random_row(rng, V, 2.0f);
    auto row = ref;
    auto eps = random_row(rng, V, noise);
    for (int64_t i = 0; i < V; ++i) row[size_t(i)] += eps[size_t(i)];
    const int32_t next = tok(rng);
    const auto lp = ref_log_softmax(row, real), lq = ref_log_softmax(ref, real);
    long double kl = 0;
    for (int64_t i = 0; i < real; ++i) kl += std::exp(lq[size_t(i)]) * (lq[size_t(i)] - lp[size_t(i)]);
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    nll -= lp[size_t(next)];
    rnll -= lq[size_t(next)];
    int64_t a = 0, b = 0;
    for (int64_t i = 1; i < real; ++i) {
      if (row[size_t(i)] > row[size_t(a)]) a = i;
      if (ref[size_t(i)] > ref[size_t(b)]) b = i;
    }
    agree += a == b;
    acc.add(row, ref, next);
  }
  const EvalSummary s = acc.summary();
  EXPECT_GT(s.kl_mean, 1e-4);  // the perturbation is visible
  EXPECT_NEAR(s.kl_mean, double(kl_sum / n), 1e-12);
  EXPECT_NEAR(s.kl_max, double(kl_max), 1e-12);
  EXPECT_NEAR(s.nll_mean, double(nll / n), 1e-12);
  EXPECT_NEAR(s.reference_nll_mean, double(rnll / n), 1e-12);
  EXPECT_NEAR(s.perplexity_rel_diff, std::exp(double(nll / n)) / std::exp(double(rnll / n)) - 1.0, 1e-10);
  EXPECT_DOUBLE_EQ(s.top1_agreement, double(agree) / double(n));
}

TEST(EvalMetrics, RejectsBadInput) {
  EXPECT_THROW(EvalAccumulator(0), Error);
  EvalAccumulator acc(4);
  std::vector<float> row = {0, 1, 2, 3};
  EXPECT_THROW(acc.add(row, {}, 4), Error);   // next id is padding / out of range
  EXPECT_THROW(acc.add(row, {}, -2), Error);
  acc.add(row, {}, 2);
  EXPECT_THROW(acc.add(row, row, 1), Error);  // a reference for some positions only
}

TEST(EvalRun, MatchesTheRunnersLogitsAndReference) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t V = 48, real = 41, n = 37;
  testing::FakeRunner runner(V, real, false);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(real - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = tok(rng);
  // The reference is the runner's own function, over V columns: the metrics must be exact.
  std::vector<float> ref(size_t(n * V), -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < real; ++v) ref[size_t(i * V + v)] = testing::FakeRunner::logit(i, tokens[size_t(i)], v);
  ReferenceLogits r{ref.data(), n, V};
  EvalOptions opt;
  opt.batch = 8;  // 5 forward calls, the last one short
  int64_t last_done = 0;
  opt.progress = [&](int64_t done, int64_t total) {
    last_done = done;
    EXPECT_EQ(total, n);
  };
  const EvalSummary s = eval_run(runner, tokens, &r, opt);
  EXPECT_EQ(last_done, n);
  EXPECT_EQ(runner.forward_calls, 5);
  EXPECT_EQ(s.positions, n);
  EXPECT_EQ(s.predictions, n - 1);
  EXPECT_NEAR(s.kl_mean, 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.top1_agreement, 1.0);
  double nll = 0;
  for (int64_t i = 0; i + 1 < n; ++i) {
    std::vector<float> row(static_cast<size_t>(real));
    for (int64_t v = 0; v < real; ++v) row[size_t(v)] = testing::FakeRunner::logit(i, tokens[size_t(i)], v);
    nll -= double(ref_log_softmax(row, real)[size_t(tokens[size_t(i + 1)])]);
  }
  EXPECT_NEAR(s.nll_mean, nll / double(n - 1), 1e-9);

  // A reference with only the real columns works too; a shorter one, wrong row counts and windows do not.
  std::vector<float> narrow(static_cast<size_t>(n * real));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < real; ++v) narrow[size_t(i * real + v)] = ref[size_t(i * V + v)];
  ReferenceLogits rn{narrow.data(), n, real};
  EXPECT_NEAR(eval_run(runner, tokens, &rn, opt).kl_mean, 0.0, 1e-12);
  ReferenceLogits bad_cols{narrow.data(), n, real - 1};
  EXPECT_THROW(eval_run(runner, tokens, &bad_cols, opt), Error);
  ReferenceLogits bad_rows{ref.data(), n - 1, V};
  EXPECT_THROW(eval_run(runner, tokens, &bad_rows, opt), Error);
  EvalOptions windowed = opt;
  windowed.context = 10;
  EXPECT_THROW(eval_run(runner, tokens, &r, windowed), Error);
  std::vector<int32_t> bad_tokens = tokens;
  bad_tokens[3] = int32_t(real);  // a padding id
  EXPECT_THROW(eval_run(runner, bad_tokens, nullptr, opt), Error);
}

TEST(EvalRun, WindowsScoreOnlyTokensInsideEachWindow) {
  const int64_t V = 16, real = 16, n = 25;
  testing::FakeRunner runner(V, real, false);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7) % real);
  EvalOptions opt;
  opt.context = 10;  // windows [0,10) [10,20) [20,25): 9 + 9 + 4 predictions
  opt.batch = 4;
  const EvalSummary s = eval_run(runner, tokens, nullptr, opt);
  EXPECT_EQ(s.positions, n);
  EXPECT_EQ(s.predictions, 22);
  EXPECT_FALSE(s.has_reference);
  double nll = 0;  // each window restarts at position 0
  for (int64_t w = 0; w < n; w += 10)
    for (int64_t i = w; i + 1 < std::min(n, w + 10); ++i) {
      std::vector<float> row(static_cast<size_t>(real));
      for (int64_t v = 0; v < real; ++v) row[size_t(v)] = testing::FakeRunner::logit(i - w, tokens[size_t(i)], v);
      nll -= double(ref_log_softmax(row, real)[size_t(tokens[size_t(i + 1)])]);
    }
  EXPECT_NEAR(s.nll_mean, nll / 22.0, 1e-9);
}

TEST(EvalTokens, ReadsTextJsonAndNpy) {
  const auto dir = std::filesystem::temp_directory_path() / ("tern_eval_tokens_" + std::to_string(fresh_seed()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "a.txt") << "1 2\n3,4\t 5\n";
    std::ofstream(dir / "b.json") << "[10, 20, 30]";
    std::ofstream(dir / "bad.txt") << "1 2 x3";
    std::ofstream(dir / "neg.txt") << "1 -2";
    std::ofstream(dir / "empty.txt") << " \n";
  }
  EXPECT_EQ(eval_tokens_read(dir / "a.txt"), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(eval_tokens_read(dir / "b.json"), (std::vector<int32_t>{10, 20, 30}));
  EXPECT_THROW(eval_tokens_read(dir / "bad.txt"), Error);
  EXPECT_THROW(eval_tokens_read(dir / "neg.txt"), Error);
  EXPECT_THROW(eval_tokens_read(dir / "empty.txt"), Error);
  EXPECT_THROW(eval_tokens_read(dir / "missing.txt"), Error);
  const std::vector<int32_t> ids = {7, 8, 9, 11};
  npy_write_i32(dir / "t.npy", ids.data(), {2, 2});
  EXPECT_EQ(eval_tokens_read(dir / "t.npy"), ids);
  const float f[2] = {1, 2};
  npy_write_f32(dir / "f.npy", f, {2});
  EXPECT_THROW(eval_tokens_read(dir / "f.npy"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tern
