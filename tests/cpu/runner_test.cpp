// The CPU forward pass on hand-built random models: prefill vs token-by-token decode, chunked vs recurrent Gated
// DeltaNet, capacity and bad-input errors, masked padding ids. (Agreement with transformers is tests/py.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cpu/cpu_runner.h"
#include "core/check.h"
#include "cpu_test_util.h"

namespace tern {
namespace {

double max_abs(const std::vector<float>& v, int64_t V, int64_t vr) {
  double m = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (int64_t(i % size_t(V)) < vr) m = std::max(m, double(std::fabs(v[i])));
  return m;
}

std::vector<int32_t> random_tokens(test::Rng& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.bits() % uint32_t(vocab));
  return t;
}

void check_prefill_vs_decode(WeightFormat f, int64_t T, int64_t split) {
  test::TinyModelSpec spec;
  spec.format = f;
  spec.D = 64;
  spec.F = 64;   // affine groups of 64 along every input axis
  spec.Fs = 64;
  const uint64_t seed = test::fresh_seed("runner");
  auto model = test::make_tiny_model(spec, seed);
  auto runner = cpu_runner_create(model);
  test::Rng rng(seed ^ 0x5eed);
  const auto tokens = random_tokens(rng, T, spec.vocab_real);
  const int64_t V = spec.V;

  auto s1 = runner->create_session(T + 4);
  std::vector<float> prefill;
  runner->forward(*s1, tokens, true, prefill);
  ASSERT_EQ(prefill.size(), size_t(T * V));
  EXPECT_EQ(s1->position(), T);

  // Prefill `split` tokens, then decode the rest one at a time.
  auto s2 = runner->create_session(T + 4);
  std::vector<float> out, all;
  runner->forward(*s2, std::span(tokens).first(size_t(split)), true, out);
  all = out;
  for (int64_t t = split; t < T; ++t) {
    runner->forward(*s2, std::span(tokens).subspan(size_t(t), 1), false, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  ASSERT_EQ(all.size(), prefill.size());
  const double scale = max_abs(prefill, V, spec.vocab_real);
  for (size_t i = 0; i < all.size(); ++i) {
    if (int64_t(i % size_t(V)) >= spec.vocab_real) {
      ASSERT_TRUE(std::isinf(all[i]) && all[i] < 0) << "padding id not masked";
      ASSERT_TRUE(std::isinf(prefill[i]) && prefill[i] < 0);
      continue;
    }
    ASSERT_LE(std::fabs(all[i] - prefill[i]), 1e-4 * scale) << "position " << i / size_t(V);
  }
  // Recurrent-only runner: the same logits to 1e-4 of max|logit| (the bar; rounding grows through layers).
  auto rec = cpu_runner_create(model, CpuRunnerOptions{.gdn_chunked = false});
  auto s3 = rec->create_session(T);
  std::vector<float> r;
  rec->forward(*s3, tokens, true, r);
  for (size_t i = 0; i < r.size(); ++i) {
    if (int64_t(i % size_t(V)) < spec.vocab_real) {
      ASSERT_LE(std::fabs(r[i] - prefill[i]), 1e-4 * scale);
    }
  }
}

TEST(CpuRunner, PrefillEqualsDecodeF32) { check_prefill_vs_decode(WeightFormat::f32, 70, 3); }
TEST(CpuRunner, PrefillEqualsDecodeAffine4) { check_prefill_vs_decode(WeightFormat::affine4, 20, 1); }
TEST(CpuRunner, PrefillEqualsDecodeBf16ChunkBoundary) { check_prefill_vs_decode(WeightFormat::bf16, 65, 64); }

TEST(CpuRunner, ErrorsNotCrashes) {
  test::TinyModelSpec spec;
  auto model = test::make_tiny_model(spec, test::fresh_seed("runner errors"));
  auto runner = cpu_runner_create(model);
  auto s = runner->create_session(4);
  std::vector<float> out;
  const std::vector<int32_t> five = {1, 2, 3, 4, 5}, bad = {1, int32_t(spec.V)}, two = {1, 2};
  EXPECT_THROW(runner->forward(*s, five, false, out), Error);
  EXPECT_EQ(s->position(), 0);
  EXPECT_THROW(runner->forward(*s, bad, false, out), Error);
  EXPECT_EQ(s->position(), 0);
  EXPECT_THROW(runner->forward(*s, std::span<const int32_t>(), false, out), Error);
  runner->forward(*s, two, false, out);
  runner->forward(*s, two, false, out);
  EXPECT_EQ(s->position(), 4);
  EXPECT_THROW(runner->forward(*s, std::span(two).first(1), false, out), Error);
  EXPECT_THROW(runner->create_session(0), Error);
  // A session of another runner is refused.
  auto other = cpu_runner_create(model);
  auto s_other = other->create_session(8);
  EXPECT_THROW(runner->forward(*s_other, two, false, out), Error);
  // reset() starts over: the same tokens give the same logits.
  s->reset();
  std::vector<float> a, b;
  runner->forward(*s, two, false, a);
  auto fresh = runner->create_session(4);
  runner->forward(*fresh, two, false, b);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// Malformed weights are refused when the runner is created, naming the tensor; never an out-of-bounds read later.
TEST(CpuRunner, RejectsMalformedWeights) {
  const uint64_t seed = test::fresh_seed("malformed");
  test::TinyModelSpec spec;
  auto expect_error = [&](auto mutate, const char* needle) {
    auto model = test::make_tiny_model(spec, seed);
    mutate(*model);
    try {
      cpu_runner_create(model);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([](ModelWeights& w) { w.layers[0].conv1d.pop_back(); }, "conv1d");
  expect_error([](ModelWeights& w) { w.layers[3].q_proj = Matrix{}; }, "q_proj");
  expect_error([](ModelWeights& w) { w.layers[1].expert_down.rows -= 1; }, "expert down_proj");
  expect_error([](ModelWeights& w) { w.layers[2].A_log.clear(); }, "A_log");
  expect_error([](ModelWeights& w) { w.final_norm.resize(3); }, "final norm");
  expect_error([](ModelWeights& w) { w.layers.pop_back(); }, "layers");
}

}  // namespace
}  // namespace tern
