// A prompt chunk in pieces of layers on the CUDA backend (ModelRunner::forward_layers, BatchEntry::layer_limit): the
// chunk's rows parked between its pieces while other sessions run their own chunks (the prefill plan's scratch) and
// batched decode steps, then the forward call that finishes it: its logits and the tokens decoded after it are the
// whole chunk's bit for bit, and the others' outputs are what they give without the pieces. A chunk part way that is
// dropped leaves the session as before it; the runner's one part-way slot is refused to a second session meanwhile.
#include <algorithm>

#include "../cuda_test_util.h"
#include "cuda/runner/cuda_runner.h"
#include "random_model.h"

namespace tern::cuda::test {
namespace {

// ids (the session has consumed all but the last) extended greedily to n ids, one forward_sample per id.
std::vector<int32_t> greedy_to(ModelRunner& r, Session& s, std::vector<int32_t> ids, size_t n) {
  DeviceSampling greedy;
  while (ids.size() < n) {
    greedy.step = uint64_t(ids.size());
    const int32_t last = ids.back();
    ids.push_back(*r.forward_sample(s, std::span(&last, 1), greedy));
  }
  return ids;
}

int32_t argmax_last_row(const std::vector<float>& logits, int64_t V, int64_t real) {
  const float* row = logits.data() + logits.size() - size_t(V);
  return int32_t(std::max_element(row, row + real) - row);
}

TEST(CudaLayerPieces, ChunkInPiecesIsTheWholeChunkBitForBit) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaLayerPieces");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 8, V, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  const int64_t real = weights->vocab_real;
  std::mt19937_64 rng(seed ^ 0x1a7e);
  const auto before = random_tokens(rng, 37 + int64_t(rng() % 100), real);
  const auto chunk = random_tokens(rng, 300 + int64_t(rng() % 700), real);
  const auto other_prompt = random_tokens(rng, 200, real), decoder_prompt = random_tokens(rng, 20, real);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ", a chunk of " << chunk.size() << " after "
                                    << before.size());
  constexpr int kNew = 8;

  // Without pieces: the chunk in one call, then greedy tokens; the others alone.
  std::vector<float> whole, out, other_whole;
  auto one = gpu->create_session(4096);
  gpu->forward(*one, before, false, out);
  gpu->forward(*one, chunk, true, whole);
  const std::vector<int32_t> whole_ids = greedy_to(*gpu, *one, {argmax_last_row(whole, V, real)}, kNew);
  {
    auto o = gpu->create_session(1024);
    gpu->forward(*o, other_prompt, false, other_whole);
  }
  std::vector<int32_t> decoder_alone;
  {
    auto dsess = gpu->create_session(1024);
    decoder_alone = greedy_to(*gpu, *dsess, {*gpu->forward_sample(*dsess, decoder_prompt, DeviceSampling{})}, 6);
  }

  // In pieces: 3 layers, another session's prompt chunk, 2 layers, a decode step of two sessions, then the rest
  // through forward_batch (its layer_limit reaches the last layer).
  auto s = gpu->create_session(4096), other = gpu->create_session(1024);
  auto d1 = gpu->create_session(1024), d2 = gpu->create_session(1024);
  gpu->forward(*s, before, false, out);
  std::vector<int32_t> decoded;
  DeviceSampling greedy;
  decoded.push_back(*gpu->forward_sample(*d1, decoder_prompt, greedy));
  const int32_t d2_first = *gpu->forward_sample(*d2, decoder_prompt, greedy);
  ASSERT_TRUE(gpu->runs_layers_apart(*s, int64_t(chunk.size())));
  gpu->forward_layers(*s, chunk, 3);
  EXPECT_EQ(s->layers_pending(), 5);
  EXPECT_EQ(s->position(), int64_t(before.size()));
  EXPECT_FALSE(gpu->runs_layers_apart(*other, int64_t(other_prompt.size()))) << "the slot is held";
  std::vector<float> other_out;
  gpu->forward(*other, other_prompt, false, other_out);  // the prefill plan's scratch, between the pieces
  EXPECT_EQ(other_out, other_whole);
  gpu->forward_layers(*s, chunk, 2);
  {
    std::vector<DeviceSampling> params(2, greedy);
    int32_t in[2] = {decoded.back(), d2_first};
    std::vector<BatchEntry> batch(2);
    for (int j = 0; j < 2; ++j) {
      params[size_t(j)].step = 1;
      batch[size_t(j)].session = j == 0 ? d1.get() : d2.get();
      batch[size_t(j)].tokens = std::span(&in[j], 1);
      batch[size_t(j)].sampling = &params[size_t(j)];
    }
    gpu->forward_batch(batch);
    for (const BatchEntry& e : batch) ASSERT_FALSE(e.error);
    decoded.push_back(*batch[0].sampled);
    EXPECT_EQ(*batch[1].sampled, decoded.back());
  }
  std::vector<float> pieces;
  BatchEntry e;
  e.session = s.get();
  e.tokens = chunk;
  e.all_logits = true;
  e.logits = &pieces;
  e.layer_limit = 3;
  gpu->forward_batch({&e, 1});
  ASSERT_FALSE(e.error);
  EXPECT_EQ(e.layers_left, 0);
  EXPECT_EQ(s->layers_pending(), 0);
  EXPECT_EQ(s->position(), int64_t(before.size() + chunk.size()));
  ASSERT_EQ(pieces, whole) << "the chunk's logits";
  EXPECT_EQ(greedy_to(*gpu, *s, {argmax_last_row(pieces, V, real)}, kNew), whole_ids);
  decoded = greedy_to(*gpu, *d1, decoded, 6);
  EXPECT_EQ(decoded, decoder_alone) << "a decoding session beside the pieces";
  EXPECT_TRUE(gpu->runs_layers_apart(*other, int64_t(other_prompt.size()))) << "the slot is free again";
}

TEST(CudaLayerPieces, DroppedChunkLeavesTheSessionAsBefore) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaLayerPieces.Drop");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 8, V, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  std::mt19937_64 rng(seed);
  const auto before = random_tokens(rng, 90, weights->vocab_real), chunk = random_tokens(rng, 500, weights->vocab_real);
  std::vector<float> expected, out;
  auto ref = gpu->create_session(2048);
  gpu->forward(*ref, before, false, out);
  gpu->forward(*ref, chunk, false, expected);

  auto s = gpu->create_session(2048);
  gpu->forward(*s, before, false, out);
  gpu->forward_layers(*s, chunk, 4);
  EXPECT_THROW(gpu->forward(*s, before, false, out), Error) << "other tokens";
  EXPECT_THROW(s->snapshot(), Error);
  EXPECT_THROW(gpu->forward_layers(*s, chunk, 4), Error) << "would reach the last layer";
  s->drop_pending_layers();
  EXPECT_EQ(s->layers_pending(), 0);
  EXPECT_EQ(s->position(), 90);
  gpu->forward(*s, chunk, false, out);
  EXPECT_EQ(out, expected) << "the chunk after the drop: as if never started";

  // Freed by reset and by the session's end too.
  s->reset();
  gpu->forward(*s, before, false, out);
  gpu->forward_layers(*s, chunk, 1);
  s->reset();
  auto t = gpu->create_session(2048);
  EXPECT_TRUE(gpu->runs_layers_apart(*t, 500));
  gpu->forward(*t, before, false, out);
  gpu->forward_layers(*t, chunk, 1);
  t.reset();
  EXPECT_TRUE(gpu->runs_layers_apart(*s, 500));
}

}  // namespace
}  // namespace tern::cuda::test
