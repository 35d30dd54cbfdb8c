// The CPU forward pass on hand-built random models: prefill vs token-by-token decode, chunked vs recurrent Gated
// DeltaNet, capacity and bad-input errors, masked padding ids. (Agreement with transformers is tests/py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
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

std::vector<float> run_split(ModelRunner& runner, const std::vector<int32_t>& tokens, int64_t split) {
  auto s = runner.create_session(int64_t(tokens.size()) + 4);
  std::vector<float> out, all;
  runner.forward(*s, std::span(tokens).first(size_t(split)), true, out);
  all = out;
  for (size_t t = size_t(split); t < tokens.size(); ++t) {
    runner.forward(*s, std::span(tokens).subspan(t, 1), false, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  EXPECT_EQ(s->position(), int64_t(tokens.size()));
  return all;
}

void check_prefill_vs_decode(WeightFormat f, int64_t T, int64_t split) {
  test::TinyModelSpec spec;
  spec.format = f;
  spec.D = 64;
  spec.F = 64;   // affine groups of 64 along every input axis
  spec.Fs = 64;
  const uint64_t seed = test::fresh_seed("runner");
  auto model = test::make_tiny_model(spec, seed);
  test::Rng rng(seed ^ 0x5eed);
  const auto tokens = random_tokens(rng, T, spec.vocab_real);
  const int64_t V = spec.V;

  // With the recurrent Gated DeltaNet, every op computes a token's values in the same order whether the token comes
  // in a prefill or alone: prefill + decode equals one prefill bit for bit.
  auto rec = cpu_runner_create(model, CpuRunnerOptions{.gdn_chunked = false});
  const std::vector<float> full = run_split(*rec, tokens, T), split_rec = run_split(*rec, tokens, split);
  ASSERT_EQ(full.size(), size_t(T * V));
  for (size_t i = 0; i < full.size(); ++i) {
    if (int64_t(i % size_t(V)) >= spec.vocab_real) {
      ASSERT_TRUE(std::isinf(full[i]) && full[i] < 0) << "padding id not masked";
      ASSERT_TRUE(std::isinf(split_rec[i]) && split_rec[i] < 0);
      continue;
    }
    ASSERT_EQ(full[i], split_rec[i]) << "position " << i / size_t(V);
  }
  // The chunked prefill (the default) agrees to rounding, alone and continued by decode. Bound 1e-3 of max|logit|:
  // these hand-built models use 2-of-8 routing, where a near-tie between experts can turn a rounding difference
  // into a different choice (the tests against transformers hold 1e-4 on checkpoints with clearly random routers).
  auto chunked = cpu_runner_create(model);
  const double scale = max_abs(full, V, spec.vocab_real);
  for (int64_t cut : {T, split}) {
    const std::vector<float> got = run_split(*chunked, tokens, cut);
    for (size_t i = 0; i < got.size(); ++i) {
      if (int64_t(i % size_t(V)) < spec.vocab_real) {
        ASSERT_LE(std::fabs(got[i] - full[i]), 1e-3 * scale) << "prefill " << cut << " position " << i / size_t(V);
      }
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

namespace tern {
namespace {

// A batched step over several sessions (ModelRunner::forward_batch): each entry's logits are bit for bit those of
// the same tokens run alone, whatever the other entries hold (prompts of other lengths, single decode tokens), and
// an entry that fails (over its session's capacity) fails alone.
TEST(CpuRunner, BatchedStepEqualsEachSequenceAlone) {
  test::TinyModelSpec spec;
  spec.format = WeightFormat::affine4;
  spec.D = 64;
  spec.F = 64;
  spec.Fs = 64;
  const uint64_t seed = test::fresh_seed("batched step");
  auto model = test::make_tiny_model(spec, seed);
  test::Rng rng(seed ^ 0xba7c);
  auto runner = cpu_runner_create(model);
  const int64_t lengths[] = {1, 7, 70, 3};
  std::vector<std::vector<int32_t>> prompts, nexts;
  for (int64_t n : lengths) {
    prompts.push_back(random_tokens(rng, n, spec.vocab_real));
    nexts.push_back(random_tokens(rng, 1, spec.vocab_real));
  }
  // Alone: the prompt (all logits), then one more token.
  std::vector<std::vector<float>> alone_prompt, alone_next;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = runner->create_session(128);
    std::vector<float> a, b;
    runner->forward(*s, prompts[i], true, a);
    runner->forward(*s, nexts[i], false, b);
    alone_prompt.push_back(a);
    alone_next.push_back(b);
  }
  // Together: every prompt in one step, then every next token in one step; a fifth entry over its capacity.
  std::vector<std::unique_ptr<Session>> sessions;
  for (size_t i = 0; i < prompts.size(); ++i) sessions.push_back(runner->create_session(128));
  auto small = runner->create_session(2);
  const std::vector<int32_t> too_long = {1, 2, 3};
  std::vector<std::vector<float>> out(prompts.size() + 1);
  const auto entry = [](Session* s, std::span<const int32_t> tokens, bool all, std::vector<float>* logits) {
    BatchEntry e;
    e.session = s;
    e.tokens = tokens;
    e.all_logits = all;
    e.logits = logits;
    return e;
  };
  std::vector<BatchEntry> batch;
  for (size_t i = 0; i < prompts.size(); ++i)
    batch.push_back(entry(sessions[i].get(), prompts[i], true, &out[i]));
  batch.insert(batch.begin() + 2, entry(small.get(), too_long, false, &out.back()));
  runner->forward_batch(batch);
  EXPECT_TRUE(batch[2].error) << "the over-long entry fails";
  EXPECT_EQ(small->position(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const BatchEntry& e = batch[i < 2 ? i : i + 1];
    EXPECT_FALSE(e.error);
    EXPECT_EQ(out[i], alone_prompt[i]) << "prompt " << i << " (seed " << seed << ")";
  }
  batch.clear();
  for (size_t i = prompts.size(); i-- > 0;)  // another order
    batch.push_back(entry(sessions[i].get(), nexts[i], false, &out[i]));
  runner->forward_batch(batch);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out[i], alone_next[i]) << "next token " << i;
}

// Speculative decoding's verify forward: k+1 tokens in one call give, row by row, the logits of feeding them one at
// a time (bit for bit, after a chunked prefill as the engine runs it), and rolling back to any position inside the
// call leaves the Gated DeltaNet states and every later logit exactly as a run that stopped there.
void check_verify_and_rollback(WeightFormat f) {
  test::TinyModelSpec spec;
  spec.format = f;
  spec.D = 64;
  spec.F = 64;
  spec.Fs = 64;
  const uint64_t seed = test::fresh_seed("verify rollback");
  auto model = test::make_tiny_model(spec, seed);
  test::Rng rng(seed ^ 0x7e51f);
  auto runner = cpu_runner_create(model);  // chunked prefill, as served
  ASSERT_TRUE(runner->supports_verify());
  const int64_t V = spec.V, T = 6;
  const auto prompt = random_tokens(rng, 21, spec.vocab_real);
  const auto drafts = random_tokens(rng, T, spec.vocab_real);  // the sampled id and 5 drafts
  const auto after = random_tokens(rng, 3, spec.vocab_real);   // what follows a rollback (a correction, more)
  const int64_t p0 = int64_t(prompt.size());

  // One token at a time: each row's logits and the states after each token.
  std::vector<float> one_logits, out;
  std::vector<std::vector<float>> states;
  {
    auto s = runner->create_session(64);
    runner->forward(*s, prompt, false, out);
    states.push_back(cpu_session_gdn_states(*s));
    for (int64_t j = 0; j < T; ++j) {
      runner->forward(*s, std::span(drafts).subspan(size_t(j), 1), false, out);
      one_logits.insert(one_logits.end(), out.begin(), out.end());
      states.push_back(cpu_session_gdn_states(*s));
    }
  }
  for (int64_t r = 0; r <= T; ++r) {
    auto s = runner->create_session(64);
    runner->forward(*s, prompt, false, out);
    BatchEntry e;
    e.session = s.get();
    e.tokens = drafts;
    e.keep_states = true;
    e.logits = &out;
    runner->forward_batch(std::span(&e, 1));
    ASSERT_FALSE(e.error);
    ASSERT_EQ(out.size(), size_t(T * V));
    for (size_t i = 0; i < out.size(); ++i) {
      if (std::isinf(one_logits[i])) continue;  // padding ids
      ASSERT_EQ(out[i], one_logits[i]) << "verify row " << i / size_t(V) << " (seed " << seed << ")";
    }
    EXPECT_EQ(s->position(), p0 + T);
    s->rollback(p0 + r);
    EXPECT_EQ(s->position(), p0 + r);
    ASSERT_EQ(cpu_session_gdn_states(*s), states[size_t(r)]) << "states after rollback to " << r;
    EXPECT_THROW(s->rollback(p0 + r), Error) << "the kept states are used up";

    // What follows equals a run that fed drafts[0..r) and then `after`, one token at a time.
    auto ref = runner->create_session(64);
    std::vector<float> ref_out;
    runner->forward(*ref, prompt, false, ref_out);
    for (int64_t j = 0; j < r; ++j) runner->forward(*ref, std::span(drafts).subspan(size_t(j), 1), false, ref_out);
    for (size_t j = 0; j < after.size(); ++j) {
      runner->forward(*ref, std::span(after).subspan(j, 1), false, ref_out);
      runner->forward(*s, std::span(after).subspan(j, 1), false, out);
      ASSERT_EQ(out, ref_out) << "token " << j << " after rollback to " << r;
    }
    EXPECT_EQ(cpu_session_gdn_states(*s), cpu_session_gdn_states(*ref));
  }
}

TEST(CpuRunner, VerifyRowsEqualOneTokenAtATimeAndRollbackIsExactF32) {
  check_verify_and_rollback(WeightFormat::f32);
}
TEST(CpuRunner, VerifyRowsEqualOneTokenAtATimeAndRollbackIsExactAffine4) {
  check_verify_and_rollback(WeightFormat::affine4);
}

TEST(CpuRunner, RollbackNeedsAVerifyForward) {
  test::TinyModelSpec spec;
  auto model = test::make_tiny_model(spec, 7);
  auto runner = cpu_runner_create(model);
  auto s = runner->create_session(32);
  std::vector<float> out;
  const std::vector<int32_t> t = {1, 2, 3};
  EXPECT_THROW(s->rollback(0), Error);
  runner->forward_verify(*s, t, out);
  EXPECT_THROW(s->rollback(4), Error) << "past the forward";
  runner->forward(*s, std::span(t).first(1), false, out);
  EXPECT_THROW(s->rollback(2), Error) << "a plain forward drops the kept states";
  runner->forward_verify(*s, t, out);
  EXPECT_THROW(s->rollback(3), Error) << "before the forward";
  s->reset();
  EXPECT_THROW(s->rollback(0), Error) << "reset drops them";
}

// Session::keep_state_at: one forward call that keeps the states at a position inside it gives what two calls cut
// there give, bit for bit: the last token's logits, the states at the end, and (the kept snapshot) the states at the
// cut, also restored into another session and continued. With the chunked Gated DeltaNet too (it runs the two
// pieces as the two calls would), and with the MTP head's input kept at the position before.
void check_keep_state_inside(bool chunked, bool mtp) {
  test::TinyModelSpec spec;
  spec.mtp = mtp;
  const uint64_t seed = test::fresh_seed("keep_inside");
  auto model = test::make_tiny_model(spec, seed);
  auto runner = cpu_runner_create(model, CpuRunnerOptions{.gdn_chunked = chunked});
  ASSERT_TRUE(runner->keeps_state_inside(2));
  test::Rng rng(seed ^ 0x4b);
  const int64_t n = 23 + int64_t(rng.bits() % 20), at = 1 + int64_t(rng.bits() % uint32_t(n - 1));
  const auto tokens = random_tokens(rng, n, spec.vocab_real);
  const std::vector<int32_t> after = random_tokens(rng, 3, spec.vocab_real);
  SCOPED_TRACE(testing::Message() << "seed " << seed << ", " << n << " tokens, kept at " << at);

  std::vector<float> split_out, kept_out, out;
  auto split = runner->create_session(64);
  runner->forward(*split, std::span(tokens).first(size_t(at)), false, out);
  const std::vector<float> states_at = cpu_session_gdn_states(*split);
  const std::unique_ptr<StateSnapshot> split_snap = split->snapshot();
  runner->forward(*split, std::span(tokens).subspan(size_t(at)), false, split_out);

  auto s = runner->create_session(64);
  EXPECT_THROW(s->keep_state_at(0), Error) << "not past the position";
  s->keep_state_at(at);
  runner->forward(*s, tokens, false, kept_out);
  EXPECT_EQ(s->position(), n);
  ASSERT_EQ(kept_out, split_out);
  EXPECT_EQ(cpu_session_gdn_states(*s), cpu_session_gdn_states(*split));
  std::unique_ptr<StateSnapshot> kept = s->take_kept_snapshot();
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->position(), at);
  EXPECT_EQ(kept->bytes(), split_snap->bytes());
  EXPECT_FALSE(s->take_kept_snapshot()) << "handed over once";

  // Restored elsewhere (its KV rows copied in) and continued: as the split session restored to its own snapshot.
  for (bool to_host : {false, true}) {
    if (to_host) kept->to_host();
    auto r = runner->create_session(64);
    r->copy_kv_prefix(*s, at);
    r->restore(*kept);
    EXPECT_EQ(r->position(), at);
    ASSERT_EQ(cpu_session_gdn_states(*r), states_at);
    split->restore(*split_snap);
    std::vector<float> a, b;
    runner->forward(*r, after, true, a);
    runner->forward(*split, after, true, b);
    ASSERT_EQ(a, b) << "continued after the kept snapshot (host " << to_host << ")";
  }

  // Any later forward drops an unclaimed one; a call that does not hold the position keeps none.
  s->reset();
  s->keep_state_at(at);
  runner->forward(*s, tokens, false, out);
  runner->forward(*s, after, false, out);
  EXPECT_FALSE(s->take_kept_snapshot());
  s->reset();
  s->keep_state_at(n + 5);
  runner->forward(*s, tokens, false, out);
  EXPECT_FALSE(s->take_kept_snapshot());
}

TEST(CpuRunner, KeepStateInsideEqualsTwoCallsCutThere) {
  check_keep_state_inside(/*chunked=*/true, /*mtp=*/false);
  check_keep_state_inside(/*chunked=*/false, /*mtp=*/true);
}

// ModelRunner::forward_layers: a chunk run in pieces of layers, with another session's forward between the pieces,
// then finished by a forward call, gives that call's logits and states bit for bit as one call over the chunk; the
// next token too. Through forward_batch's layer_limit as the engine drives it.
void check_chunk_in_pieces(bool chunked, bool mtp) {
  test::TinyModelSpec spec;
  spec.layers = 8;
  spec.mtp = mtp;
  const uint64_t seed = test::fresh_seed("layer_pieces");
  auto model = test::make_tiny_model(spec, seed);
  auto runner = cpu_runner_create(model, CpuRunnerOptions{.gdn_chunked = chunked});
  test::Rng rng(seed ^ 0x9e);
  const int64_t n0 = 1 + int64_t(rng.bits() % 9), n = 20 + int64_t(rng.bits() % 30);
  const auto before = random_tokens(rng, n0, spec.vocab_real), chunk = random_tokens(rng, n, spec.vocab_real);
  const std::vector<int32_t> next = random_tokens(rng, 1, spec.vocab_real), other = random_tokens(rng, 7, spec.vocab_real);
  SCOPED_TRACE(testing::Message() << "seed " << seed << ", chunk of " << n << " after " << n0);

  std::vector<float> whole, whole_next, out;
  auto one = runner->create_session(128);
  runner->forward(*one, before, false, out);
  runner->forward(*one, chunk, true, whole);
  const std::vector<float> states = cpu_session_gdn_states(*one);
  runner->forward(*one, next, false, whole_next);

  auto s = runner->create_session(128), bystander = runner->create_session(128);
  runner->forward(*s, before, false, out);
  ASSERT_TRUE(runner->runs_layers_apart(*s, n));
  EXPECT_EQ(s->layers_pending(), 0);
  std::vector<float> pieces;
  BatchEntry e;
  e.session = s.get();
  e.tokens = chunk;
  e.logits = &pieces;
  e.layer_limit = 3;
  runner->forward_batch({&e, 1});
  ASSERT_FALSE(e.error);
  EXPECT_EQ(e.layers_left, 5);
  EXPECT_EQ(s->layers_pending(), 5);
  EXPECT_EQ(s->position(), n0) << "the chunk is not consumed yet";
  EXPECT_TRUE(pieces.empty()) << "nothing written by a piece";
  runner->forward(*bystander, other, false, out);  // another session's step between the pieces
  runner->forward_layers(*s, chunk, 1);
  EXPECT_EQ(s->layers_pending(), 4);
  e.layer_limit = 4;  // reaches the last layer: the chunk's forward call
  e.all_logits = true;
  runner->forward_batch({&e, 1});
  ASSERT_FALSE(e.error);
  EXPECT_EQ(e.layers_left, 0);
  EXPECT_EQ(s->layers_pending(), 0);
  EXPECT_EQ(s->position(), n0 + n);
  ASSERT_EQ(pieces, whole);
  EXPECT_EQ(cpu_session_gdn_states(*s), states);
  runner->forward(*s, next, false, out);
  EXPECT_EQ(out, whole_next);
  if (mtp) {
    int64_t p0 = 0, q0 = 0;
    const std::span<const float> a = runner->mtp_hidden(*s, &p0), b = runner->mtp_hidden(*one, &q0);
    EXPECT_EQ(p0, q0);
    EXPECT_TRUE(std::ranges::equal(a, b)) << "the MTP head's input";
  }
}

TEST(CpuRunner, ChunkInPiecesOfLayersEqualsOneCall) {
  check_chunk_in_pieces(/*chunked=*/true, /*mtp=*/false);
  check_chunk_in_pieces(/*chunked=*/false, /*mtp=*/true);
}

// A chunk part way: dropped, the session is as before it (states, position) and the chunk then runs as if never
// started; other tokens, a snapshot, a rollback or a piece reaching the last layer are refused; reset drops it.
TEST(CpuRunner, ChunkPartWayIsDroppedExactlyAndGuarded) {
  test::TinyModelSpec spec;
  const uint64_t seed = test::fresh_seed("layer_pieces_drop");
  auto model = test::make_tiny_model(spec, seed);
  auto runner = cpu_runner_create(model);
  test::Rng rng(seed);
  const auto before = random_tokens(rng, 5, spec.vocab_real), chunk = random_tokens(rng, 12, spec.vocab_real);
  std::vector<float> expected, out;
  auto ref = runner->create_session(64);
  runner->forward(*ref, before, false, out);
  runner->forward(*ref, chunk, false, expected);

  auto s = runner->create_session(64);
  runner->forward(*s, before, false, out);
  const std::vector<float> states = cpu_session_gdn_states(*s);
  runner->forward_layers(*s, chunk, 2);
  EXPECT_NE(cpu_session_gdn_states(*s), states) << "the first layers ran";
  EXPECT_THROW(runner->forward(*s, before, false, out), Error) << "other tokens";
  EXPECT_THROW(s->snapshot(), Error);
  EXPECT_THROW(s->rollback(5), Error);
  EXPECT_THROW(runner->forward_layers(*s, chunk, 2), Error) << "would reach the last layer";
  EXPECT_THROW(runner->forward_layers(*s, before, 1), Error) << "another chunk";
  s->drop_pending_layers();
  EXPECT_EQ(s->layers_pending(), 0);
  EXPECT_EQ(s->position(), 5);
  EXPECT_EQ(cpu_session_gdn_states(*s), states);
  runner->forward(*s, chunk, false, out);
  EXPECT_EQ(out, expected);

  runner->forward_layers(*s, chunk, 1);
  s->reset();
  EXPECT_EQ(s->layers_pending(), 0);
  runner->forward(*s, before, false, out);  // an ordinary forward again
  EXPECT_EQ(s->position(), 5);
  EXPECT_THROW(runner->forward_layers(*s, chunk, 0), Error);
  EXPECT_THROW(runner->forward_layers(*s, chunk, 4), Error) << "all the layers: that is a forward call";
}

}  // namespace
}  // namespace tern
