// tern bench --speculative (engine/bench_speculative.h): the expected tokens per step, the flag parsers, the options
// refused, and a small run on the demo model without its MTP head (no draft-cost figures, the published rows computed
// from the verify cost alone, no output changed). The run with the head, through the CLI, is
// tests/py/test_bench_eval.py.
#include <gtest/gtest.h>

#include "core/check.h"
#include "cpu/cpu_runner.h"
#include "engine/bench_speculative.h"
#include "engine/demo_model.h"
#include "eval_fake_runner.h"

namespace tern {
namespace {

std::unique_ptr<ModelRunner> demo_runner(bool mtp) {
  DemoModelOptions o;
  o.vocab_real = 256;
  o.eos_json = "[255]";
  o.mtp = mtp;
  return cpu_runner_create(demo_model_build(o));
}

TEST(BenchSpeculative, TokensPerStep) {
  EXPECT_DOUBLE_EQ(spec_tokens_per_step(0.0, 4), 1.0);
  EXPECT_DOUBLE_EQ(spec_tokens_per_step(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(spec_tokens_per_step(0.5, 2), 1.75);  // 1 + 0.5 + 0.25
  EXPECT_NEAR(spec_tokens_per_step(0.8, 3), 1 + 0.8 + 0.64 + 0.512, 1e-12);
}

TEST(BenchSpeculative, ParsesItsFlags) {
  EXPECT_EQ(bench_parse_acceptance("0.5, 0.7,1,0"), (std::vector<double>{0.5, 0.7, 1.0, 0.0}));
  EXPECT_EQ(bench_parse_draft_counts("3,5", 8), (std::vector<int>{3, 5}));
  for (const char* bad : {"", "0.5,", "1.5", "-0.1", "x", "0.5x", "nan"})
    EXPECT_THROW(bench_parse_acceptance(bad), Error) << bad;
  for (const char* bad : {"", "0", "9", "3,", "-1", "2.5", "a"}) EXPECT_THROW(bench_parse_draft_counts(bad, 8), Error) << bad;
}

TEST(BenchSpeculative, RefusesBadOptionsAndRunnersThatCannotVerify) {
  auto runner = demo_runner(false);
  SpecBenchOptions o;
  o.lengths = {8};
  auto refused = [&](SpecBenchOptions bad, const char* fragment) {
    try {
      bench_speculative(*runner, bad);
      ADD_FAILURE() << "accepted; expected an error about " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  SpecBenchOptions b = o;
  b.draft_counts = {9};
  refused(b, "--draft-counts");
  b = o;
  b.acceptance = {1.2};
  refused(b, "--acceptance");
  b = o;
  b.lengths = {1};
  refused(b, "length 1");
  b = o;
  b.lengths = {runner->config().max_position_embeddings};
  refused(b, "positions");
  b = o;
  b.lengths.clear();
  refused(b, "no lengths");
  b = o;
  b.tokens = 1;
  refused(b, "tokens per run");

  testing::FakeRunner plain(16, 8, false);  // no verify
  EXPECT_THROW(
      {
        try {
          bench_speculative(plain, o);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("cannot verify drafts"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

TEST(BenchSpeculative, ADemoModelWithoutTheHead) {
  auto runner = demo_runner(false);
  SpecBenchOptions o;
  o.lengths = {8};
  o.max_drafts = 4;
  o.draft_counts = {4};
  o.acceptance = {1.0, 0.0};
  o.tokens = 11;
  o.repeats = 1;
  o.warmup = 0;
  const SpecBenchReport r = bench_speculative(*runner, o);
  EXPECT_FALSE(r.mtp);
  EXPECT_EQ(r.mismatches, 0);
  EXPECT_EQ(r.runs, 3);
  ASSERT_EQ(r.points.size(), 1u);
  const SpecBenchPoint& p = r.points[0];
  ASSERT_EQ(p.verify.size(), 5u);
  for (const SpecVerifyRow& v : p.verify) {
    EXPECT_TRUE(v.mtp_ms.empty());
    EXPECT_GT(v.ms_median, 0);
    // The rollback timed inside each verify's time: one per timed run, a part of it.
    ASSERT_EQ(v.rollback_ms.size(), v.ms.size());
    for (size_t i = 0; i < v.ms.size(); ++i) {
      EXPECT_GE(v.rollback_ms[i], 0);
      EXPECT_LE(v.rollback_ms[i], v.ms[i]);
    }
    EXPECT_DOUBLE_EQ(v.rollback_ms_median, v.rollback_ms[0]);  // one run
  }
  ASSERT_EQ(p.end_to_end.size(), 3u);
  EXPECT_EQ(p.end_to_end[1].accepted, p.end_to_end[1].drafted);
  EXPECT_EQ(p.end_to_end[1].decode_steps, 2) << "10 tokens after the first, 5 a step";
  EXPECT_EQ(p.end_to_end[2].accepted, 0);
  EXPECT_EQ(p.end_to_end[2].decode_steps, 10);
  ASSERT_EQ(p.published.size(), 6u);  // 3 and 4 drafts, three acceptances
  for (const SpecPublishedRow& q : p.published) {
    EXPECT_FALSE(q.draft_cost);
    EXPECT_DOUBLE_EQ(q.cost_ratio, p.verify[size_t(q.drafts)].ms_median / p.plain_ms_median);
  }
  const std::string table = bench_speculative_table(r);
  EXPECT_NE(table.find("no MTP head"), std::string::npos) << table;
  EXPECT_NE(table.find("| context | drafts | verify ms | rollback ms | x plain step |"), std::string::npos) << table;
  EXPECT_NE(table.find("0 of 3 runs"), std::string::npos) << table;
}

}  // namespace
}  // namespace tern
