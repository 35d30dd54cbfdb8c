// The eval report (tern eval --report): top-2 margins, the per-position records of the accumulator, the near-tie
// classification, KL quantiles and the worst 1% share, and the JSON and text files. Rows are built so that known
// positions flip with known margins; the report must find exactly those.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "eval_fake_runner.h"
#include "test_seed.h"
#include "engine/eval_metrics.h"
#include "engine/eval_report.h"
#include "engine/eval_run.h"

namespace tern {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using testing::fresh_seed;

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Independent KL(q || p) of two logit rows, in long double.
double kl_of(const std::vector<float>& q, const std::vector<float>& p) {
  long double sq = 0, sp = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    sq += std::exp((long double)q[i]);
    sp += std::exp((long double)p[i]);
  }
  long double kl = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    const long double lq = q[i] - std::log(sq), lp = p[i] - std::log(sp);
    kl += std::exp(lq) * (lq - lp);
  }
  return double(kl);
}

TEST(EvalReport, Top2MarginIsTheGapToTheRunnerUp) {
  const std::vector<float> row = {0.5f, 3.0f, 2.25f, 3.0f, 9.0f};
  Top2 t = top2_masked(row, 4);  // id 4 is padding
  EXPECT_EQ(t.best, 1);          // the first of the tie, as argmax_masked
  EXPECT_EQ(t.margin, 0.0);
  t = top2_masked(row, 5);
  EXPECT_EQ(t.best, 4);
  EXPECT_DOUBLE_EQ(t.margin, 6.0);
  t = top2_masked(row, 3);
  EXPECT_EQ(t.best, 1);
  EXPECT_DOUBLE_EQ(t.margin, 0.75);
  EXPECT_EQ(top2_masked(std::vector<float>{-kInf, 2.0f}, 2).margin, std::numeric_limits<double>::infinity());
  EXPECT_EQ(top2_masked(std::vector<float>{1.0f}, 1).margin, std::numeric_limits<double>::infinity());
  EXPECT_THROW(top2_masked(row, 6), Error);
}

// tern and the reference agree except at three positions: at kTie the reference prefers tern's runner-up by
// 0.05 nats (a near-tie at the default margin 0.1), at kFar another token by 1.5 nats (a real difference); at kDeep
// the reference's top two are 0.02 nats apart but it rates tern's top-1 3 nats below them (a real difference too).
TEST(EvalReport, FindsExactlyTheFlippedPositionsWithTheirMargins) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t V = 40, real = 37, n = 50, kTie = 11, kFar = 29, kDeep = 40;
  std::normal_distribution<float> d(0.0f, 1.0f);
  EvalAccumulator acc(real);
  std::vector<std::vector<float>> terns, refs;
  for (int64_t p = 0; p < n; ++p) {
    std::vector<float> t(size_t(V), kInf);  // padding: never counted
    for (int64_t i = 0; i < real; ++i) t[size_t(i)] = d(rng);
    t[size_t(p % real)] = 8.0f;  // tern's top-1: p % real, 2 nats or more above the rest
    t[size_t((p + 5) % real)] = 6.0f;  // its runner-up, by exactly 2 nats
    std::vector<float> r = t;
    for (int64_t i = 0; i < real; ++i) r[size_t(i)] += 0.01f * d(rng);  // a small disagreement everywhere
    r[size_t(p % real)] = 8.0f;
    r[size_t((p + 5) % real)] = 6.0f;
    if (p == kTie) r[size_t((p + 5) % real)] = 8.05f;
    if (p == kFar) r[size_t((p + 9) % real)] = 9.5f;
    if (p == kDeep) {
      r[size_t(p % real)] = 5.0f;
      r[size_t((p + 9) % real)] = 8.02f;
      r[size_t((p + 13) % real)] = 8.0f;
    }
    acc.add(t, r, p + 1 < n ? 0 : -1);
    t.resize(size_t(real));
    r.resize(size_t(real));
    terns.push_back(t);
    refs.push_back(r);
  }
  const auto& pos = acc.positions();
  ASSERT_EQ(int64_t(pos.size()), n);
  for (int64_t p = 0; p < n; ++p) {
    const EvalPosition& e = pos[size_t(p)];
    EXPECT_EQ(e.position, p);
    EXPECT_NEAR(e.kl, kl_of(refs[size_t(p)], terns[size_t(p)]), 1e-12) << p;
    EXPECT_EQ(e.tern_top1, p % real);
    EXPECT_DOUBLE_EQ(e.tern_margin, 2.0);
    const int64_t want_ref = p == kTie ? (p + 5) % real : (p == kFar || p == kDeep) ? (p + 9) % real : p % real;
    EXPECT_EQ(e.reference_top1, want_ref) << p;
  }
  EXPECT_NEAR(pos[kTie].reference_margin, 0.05, 1e-6);
  EXPECT_NEAR(pos[kTie].reference_gap, 0.05, 1e-6);  // tern chose the reference's runner-up
  EXPECT_NEAR(pos[kFar].reference_margin, 1.5, 1e-6);
  EXPECT_NEAR(pos[kFar].reference_gap, 1.5, 1e-6);
  EXPECT_NEAR(pos[kDeep].reference_margin, 0.02, 1e-6);
  EXPECT_NEAR(pos[kDeep].reference_gap, 3.02, 1e-6);
  EXPECT_EQ(pos[3].reference_gap, 0.0);
  EXPECT_NEAR(pos[3].reference_margin, 2.0, 1e-9);

  const EvalReportSummary r = eval_report_summarize(pos, kDefaultTieMargin);
  EXPECT_EQ(r.positions, n);
  EXPECT_EQ(r.top1_differences, 3);
  EXPECT_EQ(r.near_ties, 1);
  EXPECT_EQ(r.beyond_tie_margin, 2);
  EXPECT_EQ(top1_agreement(pos[kTie], kDefaultTieMargin), Top1Agreement::near_tie);
  EXPECT_EQ(top1_agreement(pos[kFar], kDefaultTieMargin), Top1Agreement::differs);
  EXPECT_EQ(top1_agreement(pos[kDeep], kDefaultTieMargin), Top1Agreement::differs);
  EXPECT_EQ(top1_agreement(pos[0], kDefaultTieMargin), Top1Agreement::same);
  // A tie margin of 0.04 makes every difference real; 2 makes kTie and kFar near-ties; 4 all three.
  EXPECT_EQ(eval_report_summarize(pos, 0.04).near_ties, 0);
  EXPECT_EQ(eval_report_summarize(pos, 2.0).near_ties, 2);
  EXPECT_EQ(eval_report_summarize(pos, 4.0).near_ties, 3);
  EXPECT_DOUBLE_EQ(acc.summary().top1_agreement, double(n - 3) / double(n));
  EXPECT_DOUBLE_EQ(r.kl_max, acc.summary().kl_max);
}

TEST(EvalReport, QuantilesAndTheWorstPercent) {
  std::vector<EvalPosition> pos(100);
  for (int64_t i = 0; i < 100; ++i) pos[size_t(i)] = {i, double((i * 37) % 100), 0, 0, 1, 1, 0};  // KL 0..99, shuffled
  EvalReportSummary r = eval_report_summarize(pos, 0.1);
  EXPECT_DOUBLE_EQ(r.kl_p50, 49.5);  // numpy.quantile(range(100), 0.5)
  EXPECT_NEAR(r.kl_p90, 89.1, 1e-12);
  EXPECT_NEAR(r.kl_p99, 98.01, 1e-12);
  EXPECT_EQ(r.kl_max, 99.0);
  EXPECT_EQ(r.kl_total, 4950.0);
  EXPECT_EQ(r.worst_positions, 1);
  EXPECT_DOUBLE_EQ(r.worst_kl_share, 99.0 / 4950.0);
  EXPECT_EQ(r.top1_differences, 0);
  pos.push_back({100, 1000.0, 0, 0, 1, 1, 0});  // 101 positions: the worst 1% rounds up to 2
  r = eval_report_summarize(pos, 0.1);
  EXPECT_EQ(r.worst_positions, 2);
  EXPECT_DOUBLE_EQ(r.worst_kl_share, 1099.0 / 5950.0);
  EXPECT_EQ(r.kl_p50, 50.0);
  // All KL zero: the share is 0, not NaN. One position: every quantile is its KL.
  std::vector<EvalPosition> one = {{0, 0.0, 1, 2, 0.5, 0.0, 0.0}};
  r = eval_report_summarize(one, 0.1);
  EXPECT_EQ(r.worst_kl_share, 0.0);
  EXPECT_EQ(r.kl_p99, 0.0);
  EXPECT_EQ(r.near_ties, 1);  // reference margin 0 < 0.1
  EXPECT_THROW(eval_report_summarize({}, 0.1), Error);
  EXPECT_THROW(eval_report_summarize(one, -0.1), Error);
  EXPECT_THROW(eval_report_summarize(one, std::numeric_limits<double>::quiet_NaN()), Error);
}

class EvalReportFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tern_eval_report_" + std::to_string(fresh_seed()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// A reference that is the fake runner's own logits but for one flipped position, through eval_run.
TEST_F(EvalReportFiles, EvalRunRecordsAndBothFormatsHoldTheFlip) {
  const int64_t V = 24, real = 21, n = 13, flip = 6;
  testing::FakeRunner runner(V, real, false);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 5 + 3) % real);
  std::vector<float> ref(size_t(n * V), -kInf);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < real; ++v) ref[size_t(i * V + v)] = testing::FakeRunner::logit(i, tokens[size_t(i)], v);
  std::span<const float> row(ref.data() + flip * V, size_t(V));
  const Top2 tern_top = top2_masked(row, real);
  const int64_t other = (tern_top.best + 1) % real;
  ref[size_t(flip * V + other)] = row[size_t(tern_top.best)] + 0.5f;  // the reference's top-1 by 0.5 nats
  ReferenceLogits r{ref.data(), n, V};
  std::vector<EvalPosition> pos;
  EvalOptions opt;
  opt.batch = 5;
  opt.positions = &pos;
  const EvalSummary s = eval_run(runner, tokens, &r, opt);
  ASSERT_EQ(int64_t(pos.size()), n);
  const EvalReportSummary rs = eval_report_summarize(pos, 0.75);  // 0.5 < 0.75: a near-tie
  EXPECT_EQ(rs.top1_differences, 1);
  EXPECT_EQ(rs.near_ties, 1);
  EXPECT_EQ(pos[flip].reference_top1, other);
  EXPECT_EQ(pos[flip].tern_top1, tern_top.best);
  EXPECT_NEAR(pos[flip].reference_margin, 0.5, 1e-6);
  EXPECT_DOUBLE_EQ(pos[flip].tern_margin, tern_top.margin);
  EXPECT_GT(pos[flip].kl, 0.0);

  eval_report_write(dir_ / "r.json", s, rs, pos);
  const auto j = nlohmann::json::parse(read_file(dir_ / "r.json"));
  EXPECT_EQ(j["summary"]["top1_differences"], 1);
  EXPECT_EQ(j["summary"]["near_ties"], 1);
  EXPECT_EQ(j["summary"]["beyond_tie_margin"], 0);
  EXPECT_EQ(j["summary"]["tie_margin"], 0.75);
  EXPECT_EQ(j["summary"]["positions"], n);  // the eval summary's fields are there too
  EXPECT_EQ(j["summary"]["top1_difference_positions"], nlohmann::json::array({flip}));
  ASSERT_EQ(j["positions"].size(), size_t(n));
  const auto& jp = j["positions"][flip];
  EXPECT_EQ(jp["position"], flip);
  EXPECT_EQ(jp["reference_top1"], other);
  EXPECT_EQ(jp["tern_top1"], tern_top.best);
  EXPECT_EQ(jp["top1"], "near-tie");
  EXPECT_DOUBLE_EQ(jp["reference_margin"].get<double>(), pos[flip].reference_margin);
  EXPECT_DOUBLE_EQ(jp["kl"].get<double>(), pos[flip].kl);
  EXPECT_EQ(j["positions"][0]["top1"], "same");

  eval_report_write(dir_ / "r.tsv", s, rs, pos);
  std::istringstream text(read_file(dir_ / "r.tsv"));
  std::string line;
  std::vector<std::string> rows;  // table rows: not comments, not headers
  bool summary_seen = false;
  while (std::getline(text, line)) {
    if (line.rfind("# top-1 differ     1: 1 near-ties", 0) == 0) summary_seen = true;
    if (line.empty() || line[0] == '#' || line.rfind("position\t", 0) == 0) continue;
    rows.push_back(line);
  }
  EXPECT_TRUE(summary_seen);
  ASSERT_EQ(int64_t(rows.size()), 1 + n);  // the one difference, then every position
  const std::string want = std::to_string(flip) + "\t";
  EXPECT_EQ(rows[0].rfind(want, 0), 0u) << rows[0];
  EXPECT_NE(rows[0].find("\t" + std::to_string(other) + "\t" + std::to_string(tern_top.best) + "\t0.5"),
            std::string::npos)
      << rows[0];
  EXPECT_EQ(rows[0].substr(rows[0].rfind('\t') + 1), "near-tie");
  EXPECT_EQ(rows[1 + flip], rows[0]);
}

TEST_F(EvalReportFiles, UnwritablePathsAreClearErrors) {
  std::vector<EvalPosition> pos = {{0, 0.0, 1, 1, 1.0, 1.0, 0.0}};
  const EvalReportSummary r = eval_report_summarize(pos, 0.1);
  EvalSummary s;
  EXPECT_NO_THROW(eval_report_check_path(dir_ / "ok.tsv"));
  for (const auto& bad : {dir_, dir_ / "missing" / "r.json"}) {
    try {
      eval_report_check_path(bad);
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot write the report"), std::string::npos) << e.what();
    }
    EXPECT_THROW(eval_report_write(bad, s, r, pos), Error);
  }
}

}  // namespace
}  // namespace tern
