// A long prompt read in pieces of layers beside running requests (GenerationRun::next_step under a prompt budget
// smaller than the runner's chunk; BatchEntry::layer_limit), on the CPU backend with the demo model's architecture:
// every request's tokens are those it gives alone, the steps' prompt work stays within the budget, and a request
// cancelled with a chunk part way leaves its session exactly as before that chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <vector>

#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/generation_run.h"
#include "engine/generator.h"
#include "test_seed.h"

namespace tern {
namespace {

constexpr int64_t kVocab = 512, kChunk = 64;

struct Demo {
  Demo() {
    DemoModelOptions o;
    o.vocab_real = kVocab;
    o.eos_json = "[500]";
    o.mtp = false;
    runner = cpu_runner_create(demo_model_build(o));
    GeneratorOptions g;
    g.prefill_chunk = kChunk;
    gen = std::make_unique<Generator>(
        *runner, TokenTextSource{.bytes = [](int32_t id) { return "<" + std::to_string(id) + ">"; }, .is_special = {}},
        g);
  }
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Generator> gen;
};

std::vector<int32_t> random_prompt(std::mt19937_64& rng, size_t n) {
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = int32_t(rng() % 480);
  return p;
}

// Runs the requests together as the server's engine loop does: one forward_batch per step; the run whose chunk is part
// way first, the others in order, prompt chunks while `budget` of prompt work is left (every prompt at once when none
// decodes), one run at most starting a chunk in pieces per step. Returns the results;
// *most_work: the largest prompt work of one step while some request decoded; *pieces: entries that ran part of a
// chunk's layers.
std::vector<GenerationResult> run_together(Demo& d, const std::vector<GenerationRequest>& requests, int64_t budget,
                                           int64_t* most_work, int* pieces) {
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::unique_ptr<GenerationRun>> runs;
  for (const GenerationRequest& r : requests) {
    sessions.push_back(d.runner->create_session(1024));
    runs.push_back(std::make_unique<GenerationRun>(*d.gen, *sessions.back(), r, nullptr));
  }
  *most_work = 0;
  *pieces = 0;
  for (int step = 0; step < 5000; ++step) {
    const bool decoding = std::any_of(runs.begin(), runs.end(), [](auto& r) { return !r->finished() && !r->prefilling(); });
    int64_t left = decoding ? budget : INT64_MAX, work = 0;
    std::vector<BatchEntry> batch;
    std::vector<GenerationRun*> owners, order;
    for (auto& run : runs)
      if (run->holds_chunk_part_way()) order.push_back(run.get());
    bool started = !order.empty();
    for (auto& run : runs)
      if (!run->holds_chunk_part_way()) order.push_back(run.get());
    for (GenerationRun* run : order) {
      if (run->finished() || (run->prefilling() && left <= 0)) continue;
      BatchEntry e;
      const bool held = run->holds_chunk_part_way();
      if (!run->next_step(e, run->prefilling() ? left : 1, !started)) continue;
      started = started || (!held && e.layer_limit > 0);
      if (run->prefilling()) {
        left -= run->step_work();
        work += run->step_work();
        if (e.layer_limit > 0) ++*pieces;
      }
      batch.push_back(e);
      owners.push_back(run);
    }
    if (batch.empty()) break;
    if (decoding) *most_work = std::max(*most_work, work);
    d.runner->forward_batch(batch);
    for (size_t i = 0; i < batch.size(); ++i) owners[i]->step_done(batch[i]);
  }
  std::vector<GenerationResult> out;
  for (auto& run : runs) {
    EXPECT_TRUE(run->finished());
    out.push_back(run->result());
  }
  return out;
}

TEST(LayerPieces, LongPromptsInPiecesBesideDecodingRequestsGiveTheTokensAlone) {
  const uint64_t seed = tern::testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Demo d;
  std::vector<GenerationRequest> requests(4);
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationRequest& r = requests[i];
    // Two short prompts that decode while two long ones (several chunks, not multiples of the chunk) are read.
    r.prompt = random_prompt(rng, i < 2 ? 3 + i : 150 + 37 * i);
    r.max_tokens = i < 2 ? 40 : 6;
    r.ignore_eos = true;
    r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    r.sampling.seed = 11 + i;
  }
  std::vector<GenerationResult> alone;
  for (const GenerationRequest& r : requests) {
    auto s = d.runner->create_session(1024);
    alone.push_back(d.gen->generate(*s, r));
  }
  for (int64_t budget : {16, 40}) {  // a quarter of the chunk's work per step (one layer of four), and 2.5 layers
    int64_t most = 0;
    int pieces = 0;
    const std::vector<GenerationResult> together = run_together(d, requests, budget, &most, &pieces);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i << ", budget " << budget;
      EXPECT_EQ(together[i].prompt_tokens, alone[i].prompt_tokens);
    }
    EXPECT_GT(pieces, 4) << "the long prompts ran in pieces of layers, budget " << budget;
    // A piece of one layer of a 64-token chunk is 16 tokens of work: the step's prompt work stays within the budget
    // but for the rounding of the last piece of a chunk.
    EXPECT_LE(most, budget + kChunk / 4) << budget;
  }
}

// A checkpoint inside the runner's chunk ends the chunk there (the session then holds that position whole, for its
// snapshot), pieces or not; the output is the request's alone.
TEST(LayerPieces, ChunkInPiecesEndsAtACheckpoint) {
  const uint64_t seed = tern::testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Demo d;
  GenerationRequest r;
  r.prompt = random_prompt(rng, 3 * kChunk);
  r.max_tokens = 5;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  const int64_t at = kChunk + 5 + int64_t(rng() % (kChunk - 10));
  r.checkpoint_at = {at};
  std::vector<int64_t> seen;
  auto s = d.runner->create_session(1024);
  r.on_checkpoint = [&](Session& session) {
    seen.push_back(session.position());
    EXPECT_EQ(session.layers_pending(), 0);
    session.snapshot();  // refused while a chunk is part way
  };
  GenerationResult alone;
  {
    GenerationRequest plain = r;
    plain.on_checkpoint = nullptr;
    auto a = d.runner->create_session(1024);
    alone = d.gen->generate(*a, plain);
  }
  GenerationRun run(*d.gen, *s, r, nullptr);
  int pieces = 0;
  while (!run.finished()) {
    BatchEntry e;
    if (!run.next_step(e, kChunk / 4)) break;
    if (e.layer_limit > 0) ++pieces;
    d.runner->forward_batch({&e, 1});
    run.step_done(e);
  }
  // The two whole chunks go in pieces (the last piece of each is its forward call); the chunk the checkpoint cuts in
  // two may run its short halves in fewer (a half of a few tokens fits the budget whole), so it is not counted.
  EXPECT_GE(pieces, 2 * 3) << "every whole chunk in pieces";
  EXPECT_NE(std::find(seen.begin(), seen.end(), at), seen.end()) << "a checkpoint at " << at;
  EXPECT_EQ(run.result().tokens, alone.tokens);
}

TEST(LayerPieces, CancelledWithAChunkPartWayLeavesTheSessionAsBeforeIt) {
  const uint64_t seed = tern::testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Demo d;
  GenerationRequest r;
  r.prompt = random_prompt(rng, 2 * kChunk + 1 + rng() % 50);  // a second chunk of kChunk tokens
  r.max_tokens = 4;
  std::atomic<bool> cancel{false};
  r.cancel = &cancel;
  auto s = d.runner->create_session(1024);
  GenerationRun run(*d.gen, *s, r, nullptr);
  BatchEntry e;
  ASSERT_TRUE(run.next_step(e, kChunk));  // the first chunk whole (the budget covers it)
  EXPECT_EQ(e.layer_limit, 0);
  d.runner->forward_batch({&e, 1});
  run.step_done(e);
  ASSERT_EQ(s->position(), kChunk);
  const std::vector<float> states = cpu_session_gdn_states(*s);
  ASSERT_TRUE(run.next_step(e, kChunk / 2));  // the second: half its layers
  EXPECT_EQ(e.layer_limit, 2);
  EXPECT_EQ(int64_t(e.tokens.size()), kChunk);
  EXPECT_EQ(run.step_work(), kChunk / 2);
  d.runner->forward_batch({&e, 1});
  run.step_done(e);
  EXPECT_EQ(s->layers_pending(), 2);
  EXPECT_EQ(s->position(), kChunk);
  EXPECT_TRUE(run.prefilling());
  cancel = true;
  EXPECT_FALSE(run.next_step(e, kChunk));
  EXPECT_TRUE(run.finished());
  EXPECT_EQ(run.result().finish, FinishReason::cancelled);
  EXPECT_EQ(s->layers_pending(), 0);
  EXPECT_EQ(s->position(), kChunk);
  EXPECT_EQ(cpu_session_gdn_states(*s), states) << "the chunk's first layers undone";
  s->snapshot();  // an ordinary session again
}

}  // namespace
}  // namespace tern
