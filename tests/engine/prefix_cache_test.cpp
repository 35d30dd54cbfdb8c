// Multi-turn prefix reuse on the CPU backend: Session::snapshot/restore/copy_kv_prefix give exactly the logits of
// an uninterrupted run (also after a trip to host memory), and PrefixCache resumes conversations (mid-prompt
// snapshots, end of request, forks, interleaved conversations, budgets) with exactly the tokens and
// log-probabilities of a run without the cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "core/check.h"
#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/generator.h"
#include "engine/prefix_cache.h"

namespace tern {
namespace {

constexpr int64_t kVocab = 512;

uint64_t fresh_seed(const char* what) {
  uint64_t s = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  if (const char* env = std::getenv("TERN_TEST_SEED")) s = std::strtoull(env, nullptr, 10);
  std::printf("[seed] %s: TERN_TEST_SEED=%llu\n", what, (unsigned long long)s);
  return s;
}

std::shared_ptr<const ModelWeights> model(uint64_t seed) {
  DemoModelOptions o;
  o.vocab_real = kVocab;
  o.seed = seed;
  return demo_model_build(o);
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n) {
  std::vector<int32_t> t(size_t(n), 0);
  for (auto& x : t) x = int32_t(rng() % uint64_t(kVocab));
  return t;
}

// Runs `tokens` in one forward call; returns every position's logits.
std::vector<float> run(ModelRunner& r, Session& s, std::span<const int32_t> tokens) {
  std::vector<float> logits;
  r.forward(s, tokens, true, logits);
  return logits;
}

void expect_same(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << what << ": logit " << i;  // bit for bit
}

// Resume == from scratch, for both Gated DeltaNet forms (chunked prefill and recurrent), a mid-prompt snapshot,
// a snapshot moved to host memory and back, restored straight from host memory, and restored into a second
// session after copying the KV prefix.
void check_session_snapshots(bool chunked) {
  const uint64_t seed = fresh_seed("session snapshots");
  auto runner = cpu_runner_create(model(seed), CpuRunnerOptions{.gdn_chunked = chunked});
  std::mt19937_64 rng(seed ^ 0x51);
  const std::vector<int32_t> prompt = random_tokens(rng, 70), other = random_tokens(rng, 90);
  const std::span<const int32_t> head = std::span(prompt).first(37), tail = std::span(prompt).subspan(37);

  // From scratch: the head then the tail, in a fresh session.
  auto fresh = runner->create_session(256);
  run(*runner, *fresh, head);
  const std::vector<float> want = run(*runner, *fresh, tail);

  // Snapshot after the head (mid-prompt), run something else over it, restore, run the tail.
  auto s = runner->create_session(256);
  run(*runner, *s, head);
  std::unique_ptr<StateSnapshot> snap = s->snapshot();
  EXPECT_EQ(snap->position(), 37);
  EXPECT_GT(snap->bytes(), 0u);
  EXPECT_FALSE(snap->on_host());
  run(*runner, *s, tail);  // the tail once: KV rows 37.. hold it
  run(*runner, *s, other); // then other tokens: the Gated DeltaNet state is far from the snapshot's
  s->restore(*snap);
  EXPECT_EQ(s->position(), 37);
  expect_same(run(*runner, *s, tail), want, "resume after other tokens");

  // A session that ran different tokens after the head, longer than the tail (KV rows beyond are stale).
  s->restore(*snap);
  run(*runner, *s, other);
  s->restore(*snap);
  expect_same(run(*runner, *s, tail), want, "resume over stale KV rows");

  // To host memory and back; and straight from host memory.
  snap->to_host();
  EXPECT_TRUE(snap->on_host());
  s->restore(*snap);
  expect_same(run(*runner, *s, tail), want, "resume from host memory");
  snap->to_device();
  EXPECT_FALSE(snap->on_host());
  run(*runner, *s, other);
  s->restore(*snap);
  expect_same(run(*runner, *s, tail), want, "resume after host and back");

  // Into a second session: copy the KV prefix, restore the state.
  auto t = runner->create_session(256);
  run(*runner, *t, other);
  t->copy_kv_prefix(*s, 37);
  t->restore(*snap);
  expect_same(run(*runner, *t, tail), want, "resume in another session");

  // A snapshot of another runner is refused.
  auto runner2 = cpu_runner_create(model(seed), CpuRunnerOptions{.gdn_chunked = chunked});
  auto u = runner2->create_session(256);
  EXPECT_THROW(u->restore(*snap), Error);
}

TEST(PrefixCacheSession, ResumeEqualsScratchChunked) { check_session_snapshots(true); }
TEST(PrefixCacheSession, ResumeEqualsScratchRecurrent) { check_session_snapshots(false); }

// ---- PrefixCache through the Generator ----
// With the recurrent Gated DeltaNet every op computes a token's values in the same order whether it comes in a
// prefill or alone (tests/cpu/runner_test.cpp), so a resumed conversation must give bit-identical log-probabilities
// to a run from scratch, whatever the chunking.

struct Turn {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int64_t cached = 0;
};

struct Harness {
  std::shared_ptr<const ModelWeights> weights;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Generator> gen;
  std::unique_ptr<PrefixCache> cache;

  Harness(uint64_t seed, PrefixCacheOptions o) : weights(model(seed)) {
    runner = cpu_runner_create(weights, CpuRunnerOptions{.gdn_chunked = false});
    gen = std::make_unique<Generator>(*runner, TokenTextSource{.bytes = [](int32_t) { return std::string("x"); }, .is_special = {}});
    cache = std::make_unique<PrefixCache>(*runner, 512, o);
  }

  // checkpoint_at: GenerationRequest's; kept: where the runner can, snapshotted there without cutting the prompt's
  // forward call (on_kept_checkpoint). calls: the prompt's forward calls, counted.
  Turn turn(const std::vector<int32_t>& prompt, int64_t max_tokens = 6, std::vector<int64_t> checkpoint_at = {},
            bool kept = false, int* calls = nullptr) {
    GenerationRequest req;
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    req.sampling.top_logprobs = 0;
    PrefixCache::Lease lease = cache->begin(prompt);
    if (cache->active()) {
      req.checkpoint_every = cache->options().snapshot_every;
      req.checkpoint_at = checkpoint_at;
      req.on_checkpoint = [&](Session& s) { cache->checkpoint(s, prompt); };
      if (kept) req.on_kept_checkpoint = [&](Session& s) { cache->checkpoint_kept(s, prompt); };
    }
    if (calls) {
      *calls = -1;  // the first report comes before any call
      req.on_prompt_progress = [calls](const PromptProgress&) { ++*calls; };
    }
    Turn t;
    GenerationResult r = gen->generate(*lease.session, req, [&](const TokenEvent& e) {
      if (e.id >= 0) t.logprobs.push_back(e.logprob);
      return true;
    });
    EXPECT_EQ(r.cached_tokens, lease.cached);
    t.tokens = r.tokens;
    t.cached = r.cached_tokens;
    std::vector<int32_t> held = prompt;
    for (size_t i = 0; int64_t(held.size()) < lease.session->position(); ++i) held.push_back(r.tokens[i]);
    cache->end(*lease.session, held, true);
    return t;
  }
};

PrefixCacheOptions cache_options(int64_t every, int slots = 4) {
  PrefixCacheOptions o;
  o.snapshot_every = every;
  o.slots = slots;
  return o;
}

PrefixCacheOptions no_cache() {
  PrefixCacheOptions o;
  o.enabled = false;
  return o;
}

void expect_same_turn(const Turn& got, const Turn& want, const char* what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i) EXPECT_EQ(got.logprobs[i], want.logprobs[i]) << what << " " << i;
}

// The next turn of a conversation: the previous prompt, the reply, and new tokens.
std::vector<int32_t> next_prompt(const std::vector<int32_t>& prompt, const Turn& reply, std::mt19937_64& rng,
                                 int64_t n_new) {
  std::vector<int32_t> p = prompt;
  p.insert(p.end(), reply.tokens.begin(), reply.tokens.end());
  const std::vector<int32_t> more = random_tokens(rng, n_new);
  p.insert(p.end(), more.begin(), more.end());
  return p;
}

TEST(PrefixCache, SecondTurnResumesAndMatchesScratch) {
  const uint64_t seed = fresh_seed("prefix cache turns");
  std::mt19937_64 rng(seed ^ 0x77);
  Harness cached(seed, cache_options(16)), scratch(seed, no_cache());
  ASSERT_TRUE(cached.cache->active());
  ASSERT_FALSE(scratch.cache->active());
  const std::vector<int32_t> p1 = random_tokens(rng, 41);
  const Turn a1 = cached.turn(p1), b1 = scratch.turn(p1);
  EXPECT_EQ(a1.cached, 0);
  expect_same_turn(a1, b1, "turn 1");
  // Turn 2: the session held prompt + reply[0..5); its end-of-request snapshot is at 41 + 5.
  const std::vector<int32_t> p2 = next_prompt(p1, a1, rng, 13);
  const Turn a2 = cached.turn(p2), b2 = scratch.turn(p2);
  EXPECT_EQ(a2.cached, 41 + 5);
  EXPECT_EQ(b2.cached, 0);
  expect_same_turn(a2, b2, "turn 2");
  // A regenerated turn 2 (same prompt): resumes from the end-of-prompt... at most the prompt's last token - 1:
  // here the mid-prompt snapshot at 48 (every 16) is the longest before p2's end (60).
  const Turn a2b = cached.turn(p2);
  EXPECT_EQ(a2b.cached, 48);
  expect_same_turn(a2b, b2, "turn 2 again");
  // An edit in the middle of the first prompt: resumes from the snapshot at 16 (the edit is at 20).
  std::vector<int32_t> p3 = p2;
  p3[20] = (p3[20] + 1) % int32_t(kVocab);
  const Turn a3 = cached.turn(p3), b3 = scratch.turn(p3);
  EXPECT_EQ(a3.cached, 16);
  expect_same_turn(a3, b3, "edited prompt");
  const PrefixCacheStats st = cached.cache->stats();
  EXPECT_EQ(st.hits, 3);
  EXPECT_EQ(st.misses, 1);
  EXPECT_EQ(st.tokens_reused, 46 + 48 + 16);
  EXPECT_GT(st.bytes_gpu, 0);
  EXPECT_EQ(st.bytes_host, 0);
}

// The generation prompt's checkpoint (GenerationRequest::checkpoint_at, where the next turn re-renders this answer):
// kept inside the prompt's one forward call (on_kept_checkpoint) it serves the next turn as the cut one does, from the
// same position with the same result, and the prompt takes one call fewer.
TEST(PrefixCache, CheckpointKeptInsideTheCallServesTheNextTurn) {
  const uint64_t seed = fresh_seed("prefix cache kept checkpoint");
  std::mt19937_64 rng(seed ^ 0x4b);
  Harness kept(seed, cache_options(0)), cut(seed, cache_options(0)), scratch(seed, no_cache());
  const int64_t n = 30 + int64_t(rng() % 20), at = n - 1 - int64_t(rng() % 6);  // the last <|im_start|>, as in chat
  const std::vector<int32_t> p1 = random_tokens(rng, n);
  int kept_calls = 0, cut_calls = 0;
  const Turn k1 = kept.turn(p1, 6, {at}, /*kept=*/true, &kept_calls);
  const Turn c1 = cut.turn(p1, 6, {at}, /*kept=*/false, &cut_calls);
  expect_same_turn(k1, c1, "turn 1");
  expect_same_turn(k1, scratch.turn(p1), "turn 1 without the cache");
  EXPECT_EQ(kept_calls, 1) << "one forward call for the prompt";
  EXPECT_EQ(cut_calls, 2) << "cut at the checkpoint";
  EXPECT_EQ(kept.cache->stats().snapshots_taken, cut.cache->stats().snapshots_taken);
  // Turn 2 re-renders the answer after the checkpoint: the prompts part there.
  std::vector<int32_t> p2(p1.begin(), p1.begin() + at);
  const std::vector<int32_t> more = random_tokens(rng, 12);
  p2.insert(p2.end(), more.begin(), more.end());
  const Turn k2 = kept.turn(p2), c2 = cut.turn(p2);
  EXPECT_EQ(k2.cached, at);
  EXPECT_EQ(c2.cached, at);
  expect_same_turn(k2, c2, "turn 2");
  expect_same_turn(k2, scratch.turn(p2), "turn 2 without the cache");
}

TEST(PrefixCache, InterleavedConversationsBothHit) {
  const uint64_t seed = fresh_seed("prefix cache interleaved");
  std::mt19937_64 rng(seed ^ 0x99);
  Harness cached(seed, cache_options(0)), scratch(seed, no_cache());
  const std::vector<int32_t> pa = random_tokens(rng, 30), pb = random_tokens(rng, 25);
  const Turn a1 = cached.turn(pa), b1 = cached.turn(pb);
  EXPECT_EQ(a1.cached, 0);
  EXPECT_EQ(b1.cached, 0);
  const std::vector<int32_t> pa2 = next_prompt(pa, a1, rng, 9), pb2 = next_prompt(pb, b1, rng, 11);
  const Turn a2 = cached.turn(pa2), b2 = cached.turn(pb2);
  EXPECT_EQ(a2.cached, 30 + 5);
  EXPECT_EQ(b2.cached, 25 + 5);
  expect_same_turn(a2, scratch.turn(pa2), "conversation A");
  expect_same_turn(b2, scratch.turn(pb2), "conversation B");
  EXPECT_EQ(cached.cache->stats().sessions, 2);

  // One slot: B's first turn takes A's session, so A's second turn resumes nothing.
  Harness one(seed, cache_options(0, 1));
  one.turn(pa);
  one.turn(pb);
  EXPECT_EQ(one.turn(pa2).cached, 0);
}

TEST(PrefixCache, ForkKeepsTheOriginalConversation) {
  const uint64_t seed = fresh_seed("prefix cache fork");
  std::mt19937_64 rng(seed ^ 0x33);
  Harness cached(seed, cache_options(8)), scratch(seed, no_cache());
  const std::vector<int32_t> p = random_tokens(rng, 40);
  const Turn t1 = cached.turn(p);
  // A branch sharing the first 27 tokens: resumes at 24 in a second session (KV rows copied).
  std::vector<int32_t> branch(p.begin(), p.begin() + 27);
  const std::vector<int32_t> more = random_tokens(rng, 10);
  branch.insert(branch.end(), more.begin(), more.end());
  const Turn f = cached.turn(branch);
  EXPECT_EQ(f.cached, 24);
  expect_same_turn(f, scratch.turn(branch), "branch");
  EXPECT_EQ(cached.cache->stats().sessions, 2);
  // The original conversation still resumes from its end.
  const std::vector<int32_t> p2 = next_prompt(p, t1, rng, 5);
  const Turn t2 = cached.turn(p2);
  EXPECT_EQ(t2.cached, 40 + 5);
  expect_same_turn(t2, scratch.turn(p2), "original after the fork");
}

// Parallel requests (the server's --parallel): a slot in use is never given to another request, but its snapshots
// are reused by copying their KV rows into an idle slot; with every slot in use, begin() refuses.
TEST(PrefixCache, BusySlotIsNeverSharedButItsSnapshotsAre) {
  const uint64_t seed = fresh_seed("prefix cache busy");
  std::mt19937_64 rng(seed ^ 0x55);
  Harness cached(seed, cache_options(8, 2)), scratch(seed, no_cache());
  const std::vector<int32_t> p = random_tokens(rng, 40);
  const Turn t1 = cached.turn(p);
  // The conversation's next turn holds its slot (resumed at its end, 40 + 5) and is still running...
  const std::vector<int32_t> p2 = next_prompt(p, t1, rng, 5);
  const PrefixCache::Lease running = cached.cache->begin(p2);
  EXPECT_EQ(running.cached, 45);
  // ...when a branch sharing the first 27 tokens arrives: it resumes at 24 in the other session.
  std::vector<int32_t> branch(p.begin(), p.begin() + 27);
  const std::vector<int32_t> more = random_tokens(rng, 10);
  branch.insert(branch.end(), more.begin(), more.end());
  const Turn f = cached.turn(branch);
  EXPECT_EQ(f.cached, 24);
  expect_same_turn(f, scratch.turn(branch), "branch beside a running request");
  EXPECT_EQ(running.session->position(), 45) << "the running request's session was not touched";
  // Both slots in use: a third request is refused (the engine never admits more than the slots).
  const PrefixCache::Lease second = cached.cache->begin(branch);
  EXPECT_NE(second.session, running.session);
  EXPECT_THROW(cached.cache->begin(p), InternalError);
  std::vector<int32_t> held(p2.begin(), p2.begin() + 45);
  cached.cache->end(*running.session, held, true);
  held.assign(branch.begin(), branch.begin() + second.cached);
  cached.cache->end(*second.session, held, true);
  // Free again: the conversation resumes from its end.
  const Turn t2 = cached.turn(p2);
  EXPECT_EQ(t2.cached, 45);
  expect_same_turn(t2, scratch.turn(p2), "the conversation after the branch");
}

TEST(PrefixCache, SnapshotsSpillToHostAndAreDroppedOverBudget) {
  const uint64_t seed = fresh_seed("prefix cache budgets");
  std::mt19937_64 rng(seed ^ 0x44);
  PrefixCacheOptions host_only = cache_options(16);
  host_only.gpu_bytes = 0;  // every snapshot moves to host memory at once
  Harness cached(seed, host_only), scratch(seed, no_cache());
  const std::vector<int32_t> p1 = random_tokens(rng, 35);
  const Turn a1 = cached.turn(p1);
  PrefixCacheStats st = cached.cache->stats();
  EXPECT_EQ(st.bytes_gpu, 0);
  EXPECT_GT(st.bytes_host, 0);
  EXPECT_EQ(st.snapshots_to_host, st.snapshots_taken);
  const std::vector<int32_t> p2 = next_prompt(p1, a1, rng, 7);
  const Turn a2 = cached.turn(p2);
  EXPECT_EQ(a2.cached, 35 + 5);
  scratch.turn(p1);
  expect_same_turn(a2, scratch.turn(p2), "resumed from host memory");

  // A host budget of one snapshot: the older ones are dropped, the newest is kept.
  PrefixCacheOptions tight = cache_options(16);
  tight.gpu_bytes = 0;
  tight.host_bytes = int64_t(st.bytes_host / st.snapshots);
  Harness small(seed, tight);
  const Turn s1 = small.turn(p1);
  st = small.cache->stats();
  EXPECT_EQ(st.snapshots, 1);
  EXPECT_GT(st.snapshots_dropped, 0);
  EXPECT_EQ(small.turn(next_prompt(p1, s1, rng, 7)).cached, 35 + 5);

  // No memory at all: nothing is kept, nothing is reused.
  PrefixCacheOptions none = cache_options(16);
  none.gpu_bytes = none.host_bytes = 0;
  Harness zero(seed, none);
  const Turn z1 = zero.turn(p1);
  EXPECT_EQ(zero.cache->stats().snapshots, 0);
  EXPECT_EQ(zero.turn(next_prompt(p1, z1, rng, 7)).cached, 0);
}

}  // namespace
}  // namespace tern
