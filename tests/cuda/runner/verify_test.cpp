// Speculative decoding on the CUDA backend (issue 32): forward_verify runs a session's last token and its drafts as
// one step whose row j is bit for bit the logits of feeding the tokens one forward call at a time, and
// Session::rollback returns the session to any position of the verify exactly (the tokens after it then give the
// logits of a run that never went past it). On a model at trained scales with a 4,096-token vocabulary, so that any
// difference in a logit shows.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "../cuda_test_util.h"
#include "cuda/runner/cuda_runner.h"
#include "random_model.h"

namespace tern::cuda::test {
namespace {

// Logits of feeding `tokens` one forward call at a time: [tokens.size(), V].
std::vector<float> one_at_a_time(ModelRunner& r, Session& s, std::span<const int32_t> tokens) {
  std::vector<float> rows, one;
  for (int32_t t : tokens) {
    r.forward(s, std::span(&t, 1), false, one);
    rows.insert(rows.end(), one.begin(), one.end());
  }
  return rows;
}

TEST(CudaVerify, RowsEqualOneTokenStepsAndRollbackIsExact) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaVerify.Rows");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 8, V, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  ASSERT_TRUE(gpu->supports_verify());
  const int64_t max_t = gpu->max_verify_tokens();
  ASSERT_GE(max_t, 2);
  std::mt19937_64 rng(seed ^ 0xfeed);
  // Prompt lengths that put the verify's rows at the edges of the attention kernel's 64-key tiles (slot j reads rows
  // that slots before it write in the same step).
  for (const int64_t prompt_len : {1, 63, 127, 200}) {
    const auto prompt = random_tokens(rng, prompt_len, weights->vocab_real);
    const auto tokens = random_tokens(rng, max_t, weights->vocab_real);
    const auto after = random_tokens(rng, 3, weights->vocab_real);
    std::vector<float> prompt_logits;
    auto ref = gpu->create_session(4096);
    gpu->forward(*ref, prompt, false, prompt_logits);
    const std::vector<float> want = one_at_a_time(*gpu, *ref, tokens);
    for (int64_t T = 1; T <= max_t; ++T) {
      auto s = gpu->create_session(4096);
      gpu->forward(*s, prompt, false, prompt_logits);
      std::vector<float> got;
      gpu->forward_verify(*s, std::span(tokens).first(size_t(T)), got);
      EXPECT_TRUE(same_bits(got, std::vector<float>(want.begin(), want.begin() + T * V)))
          << "prompt " << prompt_len << ", " << T << " tokens";
      EXPECT_EQ(s->position(), prompt_len + T);
    }
    // Rollback to every position of a full verify, then three more tokens: the logits of a session that fed only
    // the kept tokens one at a time.
    for (int64_t keep = 0; keep <= max_t; ++keep) {
      auto s = gpu->create_session(4096);
      gpu->forward(*s, prompt, false, prompt_logits);
      std::vector<float> got;
      gpu->forward_verify(*s, tokens, got);
      s->rollback(prompt_len + keep);
      EXPECT_EQ(s->position(), prompt_len + keep);
      const std::vector<float> next = one_at_a_time(*gpu, *s, after);
      auto plain = gpu->create_session(4096);
      gpu->forward(*plain, prompt, false, prompt_logits);
      one_at_a_time(*gpu, *plain, std::span(tokens).first(size_t(keep)));
      EXPECT_TRUE(same_bits(next, one_at_a_time(*gpu, *plain, after)))
          << "prompt " << prompt_len << ", rolled back to " << keep << " of " << max_t << " tokens";
      // Verify again from there (the kept buffers are reused) and roll back to the start.
      gpu->forward_verify(*s, std::span(tokens).first(2), got);
      s->rollback(prompt_len + keep + 3);
      EXPECT_EQ(s->position(), prompt_len + keep + 3);
    }
  }
}

// The rows sampled on the device (forward_verify_sample) are the ids forward_sample gives one step at a time, with
// the step index of each row: greedy and seeded sampling alike, so drafts never change a seeded request's output.
// A forward call of 2..64 tokens (a short prompt, a turn after prefix reuse) runs as verify steps without kept
// states (CudaRunner::run_short_call): every row, and the session it leaves, bit for bit what feeding the tokens one
// at a time gives; greedy forward_sample picks the last row's argmax.
TEST(CudaVerify, ShortCallsAreOneTokenStepsBitForBit) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaVerify.ShortCalls");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 8, V, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  ASSERT_TRUE(gpu->supports_verify());
  std::mt19937_64 rng(seed ^ 0x5407);
  const auto prompt = random_tokens(rng, 100, weights->vocab_real);  // the prefill plan first
  const auto after = random_tokens(rng, 2, weights->vocab_real);
  for (const int64_t n : {2, 7, 8, 9, 28, 33, 64}) {
    const auto tokens = random_tokens(rng, n, weights->vocab_real);
    std::vector<float> prompt_logits, got, last;
    auto ref = gpu->create_session(4096);
    gpu->forward(*ref, prompt, false, prompt_logits);
    const std::vector<float> want = one_at_a_time(*gpu, *ref, tokens);
    const std::vector<float> want_after = one_at_a_time(*gpu, *ref, after);

    auto s = gpu->create_session(4096);
    gpu->forward(*s, prompt, false, prompt_logits);
    gpu->forward(*s, tokens, /*all_logits=*/true, got);
    EXPECT_TRUE(same_bits(got, want)) << n << " tokens, every row";
    EXPECT_EQ(s->position(), 100 + n);
    EXPECT_TRUE(same_bits(one_at_a_time(*gpu, *s, after), want_after)) << n << " tokens, then two more";

    auto t = gpu->create_session(4096);
    gpu->forward(*t, prompt, false, prompt_logits);
    gpu->forward(*t, tokens, /*all_logits=*/false, last);
    EXPECT_TRUE(same_bits(last, std::vector<float>(want.end() - V, want.end()))) << n << " tokens, the last row";

    auto u = gpu->create_session(4096);
    gpu->forward(*u, prompt, false, prompt_logits);
    DeviceSampling greedy;
    greedy.temperature = 0.0f;
    const std::optional<int32_t> id = gpu->forward_sample(*u, tokens, greedy);
    ASSERT_TRUE(id.has_value());
    const auto top = std::max_element(want.end() - V, want.begin() + (n - 1) * V + weights->vocab_real);
    EXPECT_EQ(*id, int32_t(top - (want.end() - V))) << n << " tokens, greedy";
  }
}

// Session::keep_state_at inside a short call (the prefix cache's checkpoint without cutting the call): the call's
// logits are those of the same tokens cut at the position, and the kept snapshot, restored into another session, is
// the state there: what follows gives the bits a session cut there gives. Positions inside the first step, at a
// step boundary (32) and in the last step; calls of one step and of two.
TEST(CudaVerify, StateKeptInsideAShortCallIsTheCutOnes) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaVerify.KeptInside");
  const TrainedRunner t(seed);
  const std::shared_ptr<const ModelWeights>& weights = t.weights;
  ModelRunner* const gpu = t.gpu.get();
  if (!gpu->keeps_state_inside(2)) GTEST_SKIP() << "no kept states inside a call here (TERN_GDN_PORTABLE_SPLIT=0?)";
  EXPECT_TRUE(gpu->keeps_state_inside(64));
  EXPECT_FALSE(gpu->keeps_state_inside(1));
  EXPECT_FALSE(gpu->keeps_state_inside(65)) << "the prefill plan's calls";
  std::mt19937_64 rng(seed ^ 0x4b1);
  const auto prompt = random_tokens(rng, 100, weights->vocab_real);
  const auto after = random_tokens(rng, 3, weights->vocab_real);
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{7, 3}, {28, 27}, {40, 34}, {40, 32}, {64, 1}}) {
    SCOPED_TRACE(testing::Message() << n << " tokens kept at " << k << " (seed " << seed << ")");
    const auto tokens = random_tokens(rng, n, weights->vocab_real);
    std::vector<float> unused, want, got;
    auto cut = gpu->create_session(4096);
    gpu->forward(*cut, prompt, false, unused);
    gpu->forward(*cut, std::span(tokens).first(size_t(k)), false, unused);
    const std::unique_ptr<StateSnapshot> cut_snap = cut->snapshot();
    gpu->forward(*cut, std::span(tokens).subspan(size_t(k)), false, want);

    auto s = gpu->create_session(4096);
    gpu->forward(*s, prompt, false, unused);
    s->keep_state_at(100 + k);
    gpu->forward(*s, tokens, false, got);
    EXPECT_TRUE(same_bits(got, want)) << "the call's last row";
    EXPECT_EQ(s->position(), 100 + n);
    std::unique_ptr<StateSnapshot> kept = s->take_kept_snapshot();
    ASSERT_TRUE(kept);
    EXPECT_FALSE(s->take_kept_snapshot()) << "handed over once";
    EXPECT_EQ(kept->position(), 100 + k);
    EXPECT_EQ(kept->bytes(), cut_snap->bytes());

    for (const bool to_host : {false, true}) {
      if (to_host) kept->to_host();
      auto r = gpu->create_session(4096);
      r->copy_kv_prefix(*s, 100 + k);
      r->restore(*kept);
      cut->restore(*cut_snap);
      EXPECT_TRUE(same_bits(one_at_a_time(*gpu, *r, after), one_at_a_time(*gpu, *cut, after)))
          << "continued from the kept snapshot (host " << to_host << ")";
    }
    // The session itself goes on as the cut one did.
    std::vector<float> a, b;
    gpu->forward(*s, after, true, a);
    auto ref = gpu->create_session(4096);
    gpu->forward(*ref, prompt, false, unused);
    gpu->forward(*ref, tokens, false, unused);
    gpu->forward(*ref, after, true, b);
    EXPECT_TRUE(same_bits(a, b)) << "the keeping session afterwards";
  }
  // A later forward drops an unclaimed one; a call that does not hold the position, or a long one, keeps none.
  auto s = gpu->create_session(4096);
  std::vector<float> unused;
  s->keep_state_at(5);
  gpu->forward(*s, std::span(prompt).first(10), false, unused);
  gpu->forward(*s, after, false, unused);
  EXPECT_FALSE(s->take_kept_snapshot());
  s->keep_state_at(50);
  gpu->forward(*s, after, false, unused);
  EXPECT_FALSE(s->take_kept_snapshot());
  s->reset();
  s->keep_state_at(50);
  gpu->forward(*s, prompt, false, unused);  // 100 tokens: the prefill plan
  EXPECT_FALSE(s->take_kept_snapshot());
  EXPECT_THROW(s->keep_state_at(100), Error) << "not past the position";
}

TEST(CudaVerify, SampledRowsEqualOneTokenSampling) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaVerify.Sampled");
  RandomModel rm;
  auto weights = random_model(seed, 8, 4096, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  std::mt19937_64 rng(seed ^ 0xabc);
  const int64_t T = gpu->max_verify_tokens();
  for (const float temperature : {0.0f, 0.8f}) {
    const auto prompt = random_tokens(rng, 40, weights->vocab_real);
    const auto tokens = random_tokens(rng, T, weights->vocab_real);
    const DeviceSampling base{.temperature = temperature, .top_p = 0.95f, .seed = seed + 7, .step = 11};
    auto alone = gpu->create_session(256);
    std::vector<float> unused;
    gpu->forward(*alone, prompt, false, unused);
    std::vector<int32_t> want;
    for (int64_t j = 0; j < T; ++j) {
      DeviceSampling p = base;
      p.step = base.step + uint64_t(j);
      want.push_back(*gpu->forward_sample(*alone, std::span(&tokens[size_t(j)], 1), p));
    }
    auto s = gpu->create_session(256);
    gpu->forward(*s, prompt, false, unused);
    std::vector<int32_t> got;
    ASSERT_TRUE(gpu->forward_verify_sample(*s, tokens, base, got));
    EXPECT_EQ(got, want) << "temperature " << temperature;
    s->rollback(40 + 2);  // the kept states serve the sampled path too
    EXPECT_EQ(s->position(), 42);
  }
}

// The states a verify keeps live in a buffer of the runner's pool sized for that verify's tokens, taken when the
// verify starts and given back by the rollback (after it copied), the next forward, or the session's end: a verify
// of 3 tokens then one of 5 leave the pool holding one 5-token buffer, not 8 tokens per session, and the results stay
// bit for bit those of one token at a time.
TEST(CudaVerify, KeptStatesTakeAPoolBufferOfTheVerifysSize) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaVerify.KeptPool");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 8, V, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  ASSERT_GE(gpu->max_verify_tokens(), 5);
  const int64_t three = gpu->verify_state_bytes(3), five = gpu->verify_state_bytes(5);
  ASSERT_GT(three, 0);
  ASSERT_GT(five, three);
  EXPECT_EQ(cuda_runner_kept_state_pool(*gpu).held_bytes, 0);
  std::mt19937_64 rng(seed ^ 0x600d);
  const int64_t prompt_len = 50;
  const auto prompt = random_tokens(rng, prompt_len, weights->vocab_real);
  const auto tokens = random_tokens(rng, 8, weights->vocab_real);
  const auto after = random_tokens(rng, 2, weights->vocab_real);
  std::vector<float> unused;
  // The reference: the prompt, tokens [0, 1), after, tokens [3, 8) one at a time (the path of the verifies below).
  auto ref = gpu->create_session(256);
  gpu->forward(*ref, prompt, false, unused);
  const std::vector<float> want3 = one_at_a_time(*gpu, *ref, std::span(tokens).first(3));
  auto plain = gpu->create_session(256);
  gpu->forward(*plain, prompt, false, unused);
  one_at_a_time(*gpu, *plain, std::span(tokens).first(1));
  const std::vector<float> want_after = one_at_a_time(*gpu, *plain, after);
  const std::vector<float> want5 = one_at_a_time(*gpu, *plain, std::span(tokens).subspan(3, 5));

  auto s = gpu->create_session(256);
  gpu->forward(*s, prompt, false, unused);
  std::vector<float> got;
  gpu->forward_verify(*s, std::span(tokens).first(3), got);
  EXPECT_TRUE(same_bits(got, want3));
  EXPECT_EQ(cuda_runner_kept_state_pool(*gpu).in_use_bytes, three);  // exactly 3 tokens' room
  s->rollback(prompt_len + 1);
  EXPECT_EQ(cuda_runner_kept_state_pool(*gpu).in_use_bytes, 0);     // given back once it copied
  EXPECT_TRUE(same_bits(one_at_a_time(*gpu, *s, after), want_after));
  gpu->forward_verify(*s, std::span(tokens).subspan(3, 5), got);
  EXPECT_TRUE(same_bits(got, want5));
  EXPECT_EQ(cuda_runner_kept_state_pool(*gpu).in_use_bytes, five);
  s->rollback(prompt_len + 3 + 2);
  EXPECT_EQ(s->position(), prompt_len + 5);
  // The 3-token buffer was freed for the 5-token one: the pool holds what one session needs.
  CudaKeptStatePool pool = cuda_runner_kept_state_pool(*gpu);
  EXPECT_EQ(pool.in_use_bytes, 0);
  EXPECT_LE(pool.held_bytes, five);

  // Another session's verify reuses the spare; a forward after a verify, and a session's end, give back too.
  auto other = gpu->create_session(256);
  gpu->forward(*other, prompt, false, unused);
  gpu->forward_verify(*other, std::span(tokens).first(4), got);
  EXPECT_LE(cuda_runner_kept_state_pool(*gpu).held_bytes, five);
  gpu->forward(*other, std::span(after).first(1), false, unused);
  EXPECT_EQ(cuda_runner_kept_state_pool(*gpu).in_use_bytes, 0);
  gpu->forward_verify(*other, std::span(tokens).first(5), got);
  other.reset();
  pool = cuda_runner_kept_state_pool(*gpu);
  EXPECT_EQ(pool.in_use_bytes, 0);
  EXPECT_LE(pool.held_bytes, five);
}

TEST(CudaVerify, RollbackNeedsTheLastForwardToBeAVerify) {
  TERN_REQUIRE_GPU();
  RandomModel rm;
  auto weights = random_model(fresh_seed("CudaVerify.Rollback"), 4, 4096, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  auto s = gpu->create_session(256);
  std::vector<float> logits;
  EXPECT_THROW(s->rollback(0), Error);  // nothing kept yet
  gpu->forward(*s, std::vector<int32_t>{1, 2, 3}, false, logits);
  gpu->forward_verify(*s, std::vector<int32_t>{4, 5, 6}, logits);
  EXPECT_THROW(s->rollback(2), Error);  // before the verify's first position
  EXPECT_THROW(s->rollback(7), Error);  // past its last
  gpu->forward(*s, std::vector<int32_t>{7}, false, logits);
  EXPECT_THROW(s->rollback(4), Error);  // a forward since the verify dropped the kept states
  EXPECT_EQ(s->position(), 7);
  // Too many tokens for one verify, and a full session: errors that consume nothing.
  const std::vector<int32_t> many(size_t(gpu->max_verify_tokens() + 1), 1);
  EXPECT_THROW(gpu->forward_verify(*s, many, logits), Error);
  EXPECT_EQ(s->position(), 7);
  auto small = gpu->create_session(4);
  gpu->forward(*small, std::vector<int32_t>{1, 2, 3}, false, logits);
  EXPECT_THROW(gpu->forward_verify(*small, std::vector<int32_t>{1, 2}, logits), Error);
  EXPECT_EQ(small->position(), 3);
}

}  // namespace
}  // namespace tern::cuda::test
