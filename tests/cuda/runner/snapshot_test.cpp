// Multi-turn prefix reuse on the CUDA backend: a session resumed from a StateSnapshot (Gated DeltaNet conv +
// recurrent state and the position; the KV cache reused in place) gives the logits of an uninterrupted run: from a
// mid-prompt snapshot, after other tokens overwrote the states and KV rows, from pinned host memory, after a trip
// to host memory and back, in a second session after copy_kv_prefix, and through the decode graph
// (forward_sample). The bar: the uninterrupted run and the resumed one run the same kernels on the same inputs,
// so they agree to within the prefill-vs-decode bar of runner_test.cpp (2e-3 of max |logit|), and greedy ids agree.
#include <algorithm>
#include <cmath>

#include "../cuda_test_util.h"
#include "cpu/cpu_runner.h"
#include "cuda/runner/cuda_runner.h"
#include "engine/demo_model.h"

namespace tern::cuda::test {
namespace {

std::vector<int32_t> tokens_of(std::mt19937_64& rng, int64_t n, int64_t V) {
  std::vector<int32_t> t(size_t(n), 0);
  for (auto& x : t) x = int32_t(rng() % uint64_t(V));
  return t;
}

std::vector<float> run(ModelRunner& r, Session& s, std::span<const int32_t> tokens) {
  std::vector<float> logits;
  r.forward(s, tokens, true, logits);
  return logits;
}

// max |a - b| over the real vocabulary, against max |a|.
void expect_close(const std::vector<float>& want, const std::vector<float>& got, int64_t V, int64_t real,
                  const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (int64_t(i % size_t(V)) >= real) continue;
    worst = std::max(worst, double(std::fabs(want[i] - got[i])));
    scale = std::max(scale, double(std::fabs(want[i])));
  }
  std::printf("[%s] max |dlogit| %.3g (max |logit| %.3g)\n", what, worst, scale);
  EXPECT_LT(worst, 2e-3 * scale + 1e-4) << what;
  const int64_t rows = int64_t(want.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = want.data() + r * V;
    const float* b = got.data() + r * V;
    EXPECT_EQ(std::max_element(a, a + real) - a, std::max_element(b, b + real) - b) << what << " row " << r;
  }
}

// The demo model with random weights of `seed` and a 4,096-id vocabulary.
auto demo_weights(uint64_t seed) {
  DemoModelOptions o;
  o.seed = seed;
  o.vocab_real = 4096;
  return demo_model_build(o);
}

TEST(CudaSnapshot, ResumeEqualsFromScratch) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaSnapshot");
  auto weights = demo_weights(seed);
  const int64_t V = weights->config.vocab_size, real = weights->vocab_real;
  std::mt19937_64 rng(seed ^ 0xabc);
  // head: a prefill-plan chunk (> 8 tokens); tail: 5 tokens (decode plan); other: overwrites states and KV rows.
  const std::vector<int32_t> prompt = tokens_of(rng, 45, real), other = tokens_of(rng, 60, real);
  const std::span<const int32_t> head = std::span(prompt).first(40), tail = std::span(prompt).subspan(40);
  auto gpu = cuda_runner_create(weights, {.progress = false});

  auto fresh = gpu->create_session(256);
  run(*gpu, *fresh, head);
  const std::vector<float> want = run(*gpu, *fresh, tail);

  auto s = gpu->create_session(256);
  ASSERT_TRUE(s->can_snapshot());
  run(*gpu, *s, head);
  std::unique_ptr<StateSnapshot> snap = s->snapshot();
  EXPECT_EQ(snap->position(), 40);
  EXPECT_GT(snap->bytes(), 0u);
  EXPECT_FALSE(snap->on_host());
  run(*gpu, *s, tail);
  run(*gpu, *s, other);
  s->restore(*snap);
  EXPECT_EQ(s->position(), 40);
  expect_close(want, run(*gpu, *s, tail), V, real, "resume (device)");

  snap->to_host();
  EXPECT_TRUE(snap->on_host());
  run(*gpu, *s, other);
  s->restore(*snap);
  expect_close(want, run(*gpu, *s, tail), V, real, "resume (pinned host)");
  snap->to_device();
  EXPECT_FALSE(snap->on_host());
  run(*gpu, *s, other);
  s->restore(*snap);
  expect_close(want, run(*gpu, *s, tail), V, real, "resume (host and back)");

  // A second session: copy the KV prefix, restore the states.
  auto t = gpu->create_session(256);
  run(*gpu, *t, other);
  t->copy_kv_prefix(*s, 40);
  t->restore(*snap);
  expect_close(want, run(*gpu, *t, tail), V, real, "resume in another session");

  // The decode graph (bound to the session's buffers) after a restore: greedy ids equal forward()'s arg-max
  // on the uninterrupted session, step by step.
  s->restore(*snap);
  std::vector<float> last;
  auto ref = gpu->create_session(256);
  run(*gpu, *ref, head);
  int32_t next = tail[0];
  for (int step = 0; step < 4; ++step) {
    const std::vector<int32_t> one = {next};
    gpu->forward(*ref, one, false, last);
    const int32_t want_id = int32_t(std::max_element(last.begin(), last.begin() + real) - last.begin());
    const auto got = gpu->forward_sample(*s, one, DeviceSampling{});
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, want_id) << "decode step " << step;
    next = want_id;
  }
  // Restore again after graph replays moved the position on (host and device positions both set back).
  s->restore(*snap);
  EXPECT_EQ(s->position(), 40);
  expect_close(want, run(*gpu, *s, tail), V, real, "resume after graph steps");

  // Snapshots of another runner are refused.
  auto gpu2 = cuda_runner_create(weights, {.progress = false});
  auto u = gpu2->create_session(256);
  EXPECT_THROW(u->restore(*snap), Error);
}

// Snapshot buffers are reused once a snapshot is dropped (the runner keeps a few): a snapshot in a reused buffer
// holds its own state, many snapshots at once each get their own, and a snapshot may outlive its runner.
TEST(CudaSnapshot, ReusedBuffersHoldTheirOwnStates) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaSnapshot.Reuse");
  auto weights = demo_weights(seed);
  const int64_t V = weights->config.vocab_size, real = weights->vocab_real;
  std::mt19937_64 rng(seed ^ 0xdef);
  const std::vector<int32_t> prompt = tokens_of(rng, 60, real);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  // want[i]: logits of token 10·i + 10 after the first 10·i + 10 tokens, uninterrupted.
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 5; ++i) {
    auto f = gpu->create_session(256);
    run(*gpu, *f, std::span(prompt).first(size_t(10 * i + 10)));
    want.push_back(run(*gpu, *f, std::span(prompt).subspan(size_t(10 * i + 10), 1)));
  }
  auto s = gpu->create_session(256);
  std::vector<std::unique_ptr<StateSnapshot>> snaps;
  for (int round = 0; round < 2; ++round) {  // round 1 takes its snapshots in the buffers round 0 gave back
    s->reset();
    snaps.clear();
    for (int i = 0; i < 5; ++i) {
      run(*gpu, *s, std::span(prompt).subspan(size_t(10 * i), 10));
      snaps.push_back(s->snapshot());
    }
    run(*gpu, *s, std::span(prompt).subspan(50, 10));
    for (int i = 4; i >= 0; --i) {
      s->restore(*snaps[size_t(i)]);
      ASSERT_EQ(s->position(), 10 * i + 10);
      expect_close(want[size_t(i)], run(*gpu, *s, std::span(prompt).subspan(size_t(10 * i + 10), 1)), V, real,
                   round == 0 ? "snapshot in a new buffer" : "snapshot in a reused buffer");
    }
  }
  // A snapshot that outlives its runner and session is freed without error.
  std::unique_ptr<StateSnapshot> orphan;
  {
    auto gpu2 = cuda_runner_create(weights, {.progress = false});
    auto u = gpu2->create_session(64);
    run(*gpu2, *u, std::span(prompt).first(12));
    orphan = u->snapshot();
  }
  EXPECT_EQ(orphan->position(), 12);
  orphan.reset();
  TERN_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace tern::cuda::test
