// The MTP draft head on the CPU runner, on hand-built random models: pairs fed at once or one by one, draft rows
// rewritten by the true pairs, snapshots, the hidden states after a rollback, and errors. (Agreement with the PyTorch reference is tests/py/test_mtp.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "cpu/cpu_runner.h"
#include "cpu_test_util.h"

namespace tern {
namespace {

struct MtpFixture {
  test::TinyModelSpec spec;
  std::shared_ptr<ModelWeights> model;
  std::unique_ptr<ModelRunner> runner;
  std::vector<int32_t> tokens;
  explicit MtpFixture(WeightFormat f = WeightFormat::f32, int64_t T = 12) {
    spec.format = f;
    spec.F = 64;
    spec.Fs = 64;
    spec.mtp = true;
    const uint64_t seed = test::fresh_seed("mtp");
    model = test::make_tiny_model(spec, seed);
    // The recurrent Gated DeltaNet: a token's hidden is the same bit for bit in a prefill or alone.
    runner = cpu_runner_create(model, CpuRunnerOptions{.gdn_chunked = false});
    test::Rng rng(seed ^ 0x3e7);
    for (int64_t i = 0; i < T; ++i) tokens.push_back(int32_t(rng.bits() % uint32_t(spec.vocab_real)));
  }
  int64_t D() const { return spec.D; }

  // Every pair (h_t, x_{t+1}) the last forward made known, from the head's rows on: logits [pairs, V] appended.
  void feed(Session& s, std::vector<float>& all) {
    int64_t h0 = 0;
    const std::span<const float> h = runner->mtp_hidden(s, &h0);
    const int64_t from = runner->mtp_rows(s), to = s.position() - 1;
    if (to <= from) return;
    std::vector<float> logits, out;
    runner->forward_mtp(s, h.subspan(size_t((from - h0) * D()), size_t((to - from) * D())),
                        std::span(tokens).subspan(size_t(from + 1), size_t(to - from)), from, true, logits, out);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  // The main model over tokens in calls of `step` tokens, the head fed after each.
  std::vector<float> run(int64_t step) {
    auto s = runner->create_session(int64_t(tokens.size()) + 4);
    std::vector<float> main, mtp;
    for (size_t t = 0; t < tokens.size(); t += size_t(step)) {
      runner->forward(*s, std::span(tokens).subspan(t, std::min(size_t(step), tokens.size() - t)), false, main);
      feed(*s, mtp);
    }
    EXPECT_EQ(runner->mtp_rows(*s), int64_t(tokens.size()) - 1);
    return mtp;
  }
};

TEST(CpuMtp, PairsAtOnceEqualPairsOneByOne) {
  MtpFixture f;
  ASSERT_TRUE(f.runner->supports_mtp());
  const std::vector<float> once = f.run(int64_t(f.tokens.size())), each = f.run(1), threes = f.run(3);
  ASSERT_EQ(once.size(), (f.tokens.size() - 1) * size_t(f.spec.V));
  for (size_t i = 0; i < once.size(); ++i) {
    if (int64_t(i % size_t(f.spec.V)) >= f.spec.vocab_real) {
      ASSERT_TRUE(std::isinf(once[i]) && once[i] < 0) << "padding id not masked";
      continue;
    }
    ASSERT_EQ(once[i], each[i]) << "pair " << i / size_t(f.spec.V);
    ASSERT_EQ(once[i], threes[i]) << "pair " << i / size_t(f.spec.V);
  }
}

TEST(CpuMtp, DraftRowsAreRewrittenAndSnapshotsKeepThePendingPair) {
  MtpFixture f(WeightFormat::affine4);
  const int64_t T = int64_t(f.tokens.size()), V = f.spec.V, D = f.D();
  const std::vector<float> reference = f.run(T);

  auto s = f.runner->create_session(T + 8);
  std::vector<float> main, got, logits, out;
  const int64_t half = T / 2;
  f.runner->forward(*s, std::span(f.tokens).first(size_t(half)), false, main);
  f.feed(*s, got);
  auto snap = s->snapshot();
  // A draft chain of three steps past the sequence (rows half-1 .. half+1), then a detour of other tokens.
  int64_t h0 = 0;
  std::span<const float> h = f.runner->mtp_hidden(*s, &h0);
  std::vector<float> prev(h.end() - D, h.end());
  for (int j = 0; j < 3; ++j) {
    const int32_t d = int32_t((7 * j + 1) % f.spec.vocab_real);
    f.runner->forward_mtp(*s, prev, std::span(&d, 1), half - 1 + j, false, logits, out);
    prev = out;
  }
  EXPECT_EQ(f.runner->mtp_rows(*s), half + 2);
  const std::vector<int32_t> other = {1, 2, 3};
  f.runner->forward(*s, other, false, main);
  // Back to the snapshot: the head's rows are cut to position - 1, and the pending pair's hidden is there again.
  s->restore(*snap);
  EXPECT_EQ(f.runner->mtp_rows(*s), half - 1);
  h = f.runner->mtp_hidden(*s, &h0);
  EXPECT_EQ(h0, half - 1);
  EXPECT_EQ(h.size(), size_t(D));
  for (int64_t t = half; t < T; ++t) {
    f.runner->forward(*s, std::span(f.tokens).subspan(size_t(t), 1), false, main);
    f.feed(*s, got);
  }
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], reference[i]) << "pair " << i / size_t(V);
}

TEST(CpuMtp, RollbackCutsTheHiddenStatesToThePosition) {
  MtpFixture f;
  const int64_t D = f.D();
  auto s = f.runner->create_session(int64_t(f.tokens.size()) + 4);
  std::vector<float> logits;
  f.runner->forward(*s, std::span(f.tokens).first(4), false, logits);
  f.runner->forward_verify(*s, std::span(f.tokens).subspan(4, 5), logits);  // positions 4..8, after row 3
  int64_t h0 = 0;
  std::vector<float> verified(f.runner->mtp_hidden(*s, &h0).begin(), f.runner->mtp_hidden(*s, &h0).end());
  EXPECT_EQ(h0, 3);
  ASSERT_EQ(verified.size(), size_t(6 * D));
  s->rollback(6);  // tokens 4 and 5 kept
  std::span<const float> h = f.runner->mtp_hidden(*s, &h0);
  EXPECT_EQ(h0, 3);
  ASSERT_EQ(h.size(), size_t(3 * D)) << "rows 3, 4, 5: those before the position";
  EXPECT_TRUE(std::equal(h.begin(), h.end(), verified.begin()));
  // The next forward continues from there: row 5 is kept before its own.
  f.runner->forward(*s, std::span(f.tokens).subspan(6, 1), false, logits);
  h = f.runner->mtp_hidden(*s, &h0);
  EXPECT_EQ(h0, 5);
  ASSERT_EQ(h.size(), size_t(2 * D));
  EXPECT_TRUE(std::equal(h.begin(), h.begin() + D, verified.begin() + 2 * D));
}

TEST(CpuMtp, Errors) {
  MtpFixture f;
  const int64_t D = f.D();
  auto s = f.runner->create_session(8);
  std::vector<float> logits, out, h(size_t(D), 0.5f);
  const int32_t tok = 1, bad = int32_t(f.spec.V);
  EXPECT_THROW(f.runner->forward_mtp(*s, h, std::span(&tok, 1), 1, false, logits, out), Error);  // a gap
  EXPECT_THROW(f.runner->forward_mtp(*s, h, std::span(&bad, 1), 0, false, logits, out), Error);  // a bad id
  EXPECT_EQ(f.runner->mtp_rows(*s), 0);
  EXPECT_THROW(f.runner->forward_mtp(*s, std::span(h).first(size_t(D - 1)), std::span(&tok, 1), 0, false, logits, out),
               Error);
  EXPECT_THROW(f.runner->forward_mtp(*s, h, std::span(&tok, 1), 8, false, logits, out), Error);  // past capacity
  f.runner->forward_mtp(*s, h, std::span(&tok, 1), 0, false, logits, out);
  EXPECT_EQ(logits.size(), size_t(f.spec.V));
  EXPECT_EQ(f.runner->mtp_rows(*s), 1);

  test::TinyModelSpec plain;  // no head: the runner says so, and the calls are errors
  auto runner = cpu_runner_create(test::make_tiny_model(plain, 1));
  EXPECT_FALSE(runner->supports_mtp());
  EXPECT_EQ(f.runner->session_bytes(16) - runner->session_bytes(16), 2 * 16 * plain.Hkv * plain.dh * 4);  // its KV
  auto s2 = runner->create_session(4);
  EXPECT_THROW(runner->mtp_hidden(*s2, nullptr), Error);
  EXPECT_THROW(runner->forward_mtp(*s2, h, std::span(&tok, 1), 0, false, logits, out), Error);

  auto broken = test::make_tiny_model(f.spec, 2);  // a malformed head is refused up front
  broken->mtp->norm.pop_back();
  EXPECT_THROW(cpu_runner_create(broken), Error);
}

}  // namespace
}  // namespace tern
