// Speculative decoding with drafts from the MTP head (engine/draft_mtp.h) on the CPU backend, with the demo model's
// architecture and its head (random weights):
//   - the drafter's head cache after verify steps and rollbacks at every draft position gives, at each step, the very
//     drafts and logits (bit for bit) that a fresh session fed the same tokens without drafts gives;
//   - greedy output with MTP drafts (alone, beside a corrupted prediction, and under auto) equals greedy output
//     without, token for token;
//   - on a model whose head knows the next token (both reduced to the token's own embedding), MTP drafts are
//     accepted: the drafts are aligned with the positions they guess;
//   - a session whose head cache has a gap turns the head off for that sequence (the n-gram drafts instead), and a
//     model without the head is refused by mtp and resolved to ngram by auto, with the reason in words.
#include <gtest/gtest.h>

#include <random>

#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/draft_mtp.h"
#include "engine/generator.h"
#include "test_seed.h"

namespace tern {
namespace {

constexpr int64_t kVocab = 512;

std::shared_ptr<const ModelWeights> demo_weights(bool mtp = true) {
  DemoModelOptions o;
  o.vocab_real = kVocab;
  o.eos_json = "[500]";
  o.mtp = mtp;
  return demo_model_build(o);
}

TokenTextSource id_text() {
  return {.bytes = [](int32_t id) { return "<" + std::to_string(id) + ">"; }, .is_special = {}};
}

GenerationResult generate(ModelRunner& runner, SpeculativeMode mode, const GenerationRequest& req,
                          int64_t capacity = 512) {
  GeneratorOptions o;
  o.speculative.mode = mode;
  o.speculative.max_drafts = 6;
  Generator gen(runner, id_text(), o);
  auto s = runner.create_session(capacity);
  return gen.generate(*s, req);
}

// A greedy request of max_tokens after a random prompt of min_len + [0, spread) tokens.
GenerationRequest random_greedy(std::mt19937_64& rng, int64_t max_tokens, bool ignore_eos, size_t min_len,
                                size_t spread) {
  GenerationRequest req;
  req.sampling.temperature = 0.0f;
  req.max_tokens = max_tokens;
  req.ignore_eos = ignore_eos;
  for (size_t j = 0, n = min_len + rng() % spread; j < n; ++j) req.prompt.push_back(int32_t(rng() % kVocab));
  return req;
}

struct Drafts {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

// The drafts at position p of `seq` from a fresh session: seq[0, p) in one forward, the head fed, then k drafts
// after seq[p].
Drafts fresh_drafts(ModelRunner& runner, const std::vector<int32_t>& seq, int64_t p, int64_t k) {
  auto s = runner.create_session(int64_t(seq.size()) + 16);
  std::vector<float> logits;
  const std::span<const int32_t> prefix(seq.data(), size_t(p));
  runner.forward(*s, prefix, false, logits);
  MtpDrafter d(runner, *s, prefix);
  d.catch_up();
  d.append(seq[size_t(p)]);
  Drafts out;
  out.tokens = d.draft(k);
  out.logits.assign(d.last_logits().begin(), d.last_logits().end());
  return out;
}

TEST(MtpDrafter, TheHeadCacheAfterRollbacksEqualsAFreshRun) {
  // The recurrent Gated DeltaNet in every call: a token's hidden is then the same bit for bit however the tokens
  // are grouped into calls, so the fresh run can read its prefix in one call.
  auto runner = cpu_runner_create(demo_weights(), CpuRunnerOptions{.gdn_chunked = false});
  ASSERT_TRUE(runner->supports_mtp());
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> seq(70);
  for (auto& t : seq) t = int32_t(rng() % kVocab);

  auto s = runner->create_session(int64_t(seq.size()) + 16);
  std::vector<float> logits;
  const int64_t p0 = 3 + int64_t(rng() % 6);
  runner->forward(*s, std::span<const int32_t>(seq.data(), size_t(p0)), false, logits);
  MtpDrafter d(*runner, *s, std::span<const int32_t>(seq.data(), size_t(p0)));
  d.catch_up();
  d.append(seq[size_t(p0)]);
  int checked = 0, rollbacks = 0;
  while (s->position() + 8 < int64_t(seq.size())) {
    const int64_t p = s->position();
    // This step's drafts: from the head (checked against a fresh run), or none (a plain step or another source's
    // drafts: the head is only fed).
    if (rng() % 3 != 0) {
      const int64_t k = 1 + int64_t(rng() % 5);
      const std::vector<int32_t> got = d.draft(k);
      const Drafts want = fresh_drafts(*runner, seq, p, k);
      ASSERT_EQ(got, want.tokens) << "position " << p;
      ASSERT_EQ(std::vector<float>(d.last_logits().begin(), d.last_logits().end()), want.logits) << "position " << p;
      ++checked;
    } else {
      EXPECT_TRUE(d.draft(0).empty());
    }
    // The step: one token, or a verify of up to 6 whose first j + 1 are kept (the session rolled back there).
    const int64_t T = 1 + int64_t(rng() % 6);
    const std::span<const int32_t> step(seq.data() + p, size_t(T));
    int64_t keep = p + 1;
    if (T == 1) {
      runner->forward(*s, step, false, logits);
    } else {
      runner->forward_verify(*s, step, logits);
      keep = p + 1 + int64_t(rng() % size_t(T));
      if (keep < s->position()) {
        s->rollback(keep);
        ++rollbacks;
      }
    }
    for (int64_t t = p + 1; t <= keep; ++t) d.append(seq[size_t(t)]);
    ASSERT_TRUE(d.usable()) << "position " << s->position();
  }
  d.catch_up();  // up to (h_{P-1}, the next token)
  EXPECT_EQ(runner->mtp_rows(*s), s->position()) << "every known pair fed, no draft row left";
  EXPECT_GT(checked, 5);
  EXPECT_GT(rollbacks, 2);
}

TEST(MtpDrafter, AHeadCacheWithAGapTurnsTheHeadOff) {
  auto runner = cpu_runner_create(demo_weights());
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 9, 77, 12, 3};
  auto a = runner->create_session(64), b = runner->create_session(64);
  std::vector<float> logits;
  runner->forward(*a, prompt, false, logits);
  auto snap = a->snapshot();
  b->copy_kv_prefix(*a, int64_t(prompt.size()));  // b's head cache is empty, its sequence is not
  b->restore(*snap);
  runner->forward(*b, std::vector<int32_t>{1}, false, logits);
  std::vector<int32_t> seq = prompt;
  seq.push_back(1);
  MtpDrafter d(*runner, *b, seq);
  d.append(2);
  EXPECT_TRUE(d.draft(3).empty());
  EXPECT_FALSE(d.usable());
  EXPECT_EQ(runner->mtp_rows(*b), 0);

  // Through a generation on such a session: the same output as without drafts (the n-gram drafts instead).
  GenerationRequest req;
  req.prompt = prompt;
  req.prompt.insert(req.prompt.end(), prompt.begin(), prompt.end());  // repetitive: the n-gram has something
  req.sampling.temperature = 0.0f;
  req.max_tokens = 24;
  GeneratorOptions o;
  o.speculative.mode = SpeculativeMode::mtp;
  Generator gen(*runner, id_text(), o);
  auto c = runner->create_session(64);
  c->copy_kv_prefix(*a, int64_t(prompt.size()));
  c->restore(*snap);  // holds the prompt's first half; its head cache does not
  const GenerationResult r = gen.generate(*c, req);
  EXPECT_EQ(r.cached_tokens, int64_t(prompt.size()));
  EXPECT_EQ(r.tokens, generate(*runner, SpeculativeMode::off, req).tokens);
}

TEST(SpeculativeMtp, GreedyOutputIsTheSameWithMtpDrafts) {
  auto runner = cpu_runner_create(demo_weights());
  std::mt19937_64 rng(testing::fresh_seed());
  int64_t mtp_drafted = 0, accepted = 0;
  for (int i = 0; i < 10; ++i) {
    GenerationRequest req = random_greedy(rng, 32, /*ignore_eos=*/i % 2 == 0, 3, 40);
    const GenerationResult a = generate(*runner, SpeculativeMode::off, req);
    const GenerationResult b = generate(*runner, SpeculativeMode::mtp, req);
    const GenerationResult c = generate(*runner, SpeculativeMode::auto_, req);
    ASSERT_EQ(a.tokens, b.tokens) << "prompt " << i;
    ASSERT_EQ(a.tokens, c.tokens) << "prompt " << i << " (auto)";
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(finish_reason_name(a.finish), std::string(finish_reason_name(b.finish)));
    EXPECT_EQ(b.draft_tokens, c.draft_tokens) << "auto is mtp on a model with the head";
    mtp_drafted += b.draft_tokens;
    // A prediction with a wrong token every few places: its drafts while it matches, the head's between.
    req.prediction = a.tokens;
    for (size_t j = 0; j < req.prediction.size(); j += 2 + rng() % 9) req.prediction[j] = int32_t(rng() % kVocab);
    const GenerationResult d = generate(*runner, SpeculativeMode::mtp, req);
    ASSERT_EQ(a.tokens, d.tokens) << "prompt " << i << " with a prediction";
    accepted += b.accepted_draft_tokens + d.accepted_draft_tokens;
  }
  EXPECT_GT(mtp_drafted, 0) << "the head drafted nothing";
  EXPECT_GT(accepted, 0) << "no draft was accepted: the comparison proves little";
}

// Storage for the f32 matrices a test puts into a model.
struct F32Storage : WeightStorage {
  std::vector<std::vector<float>> buffers;
  Matrix add(int64_t experts, int64_t rows, int64_t cols, std::vector<float> values) {
    buffers.push_back(std::move(values));
    Matrix m;
    m.format = WeightFormat::f32;
    m.experts = experts;
    m.rows = rows;
    m.cols = cols;
    m.data = buffers.back().data();
    return m;
  }
  Matrix zeros(const Matrix& like) {
    return add(like.experts, like.rows, like.cols, std::vector<float>(size_t(like.experts * like.rows * like.cols)));
  }
};

// The demo model with every mixer's and MoE block's output zeroed: a token's hidden is its own embedding, normed,
// so the next token depends on the current one only; and a head that reads only the embedding of its token
// (fc = [I | 0]) through the same norm: it predicts exactly what the model will say after that token.
std::shared_ptr<const ModelWeights> head_that_knows_the_model() {
  auto w = std::make_shared<ModelWeights>(*demo_weights());
  auto st = std::make_shared<F32Storage>();
  const int64_t D = w->config.hidden_size;
  auto silence = [&](LayerWeights& l) {
    for (Matrix* m : {&l.out_proj, &l.o_proj, &l.expert_down, &l.shared_down})
      if (!m->empty()) *m = st->zeros(*m);
  };
  for (LayerWeights& l : w->layers) silence(l);
  MtpWeights& m = *w->mtp;
  silence(m.layer);
  std::vector<float> fc(size_t(D * 2 * D), 0.0f);
  for (int64_t i = 0; i < D; ++i) fc[size_t(i * 2 * D + i)] = 1.0f;
  m.fc = st->add(1, D, 2 * D, std::move(fc));
  m.pre_fc_norm_embedding.assign(size_t(D), 1.0f);
  m.norm = w->final_norm;
  w->storage.push_back(st);
  return w;
}

// The MTP head follows the prompt's last chunk after its first token is out, not before: the time to first token is
// the model's alone. With a one-chunk prompt, the head's cache is still empty when the first token's event comes, the
// prompt's pairs are in it by the second, and the output is the one without drafts.
TEST(SpeculativeMtp, TheHeadFollowsThePromptAfterTheFirstToken) {
  auto runner = cpu_runner_create(demo_weights());
  std::mt19937_64 rng(tern::testing::fresh_seed());
  const GenerationRequest req = random_greedy(rng, 6, true, 20, 20);
  const GenerationResult plain = generate(*runner, SpeculativeMode::off, req);
  GeneratorOptions o;
  o.speculative.mode = SpeculativeMode::mtp;
  o.speculative.max_drafts = 4;
  Generator gen(*runner, id_text(), o);
  auto s = runner->create_session(512);
  std::vector<int64_t> rows;  // the head's cache rows at each token's event
  const GenerationResult r = gen.generate(*s, req, [&](const TokenEvent&) {
    rows.push_back(runner->mtp_rows(*s));
    return true;
  });
  EXPECT_EQ(r.tokens, plain.tokens);
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[0], 0) << "the head ran over the prompt before the first token";
  EXPECT_GE(rows[1], int64_t(req.prompt.size()) - 1) << "the head follows the prompt";
}

TEST(SpeculativeMtp, DraftsOfAHeadThatKnowsTheModelAreAccepted) {
  auto runner = cpu_runner_create(head_that_knows_the_model());
  std::mt19937_64 rng(testing::fresh_seed());
  int64_t drafted = 0, accepted = 0;
  for (int i = 0; i < 4; ++i) {
    const GenerationRequest req = random_greedy(rng, 40, /*ignore_eos=*/true, 2, 10);
    const GenerationResult a = generate(*runner, SpeculativeMode::off, req);
    const GenerationResult b = generate(*runner, SpeculativeMode::mtp, req);
    ASSERT_EQ(a.tokens, b.tokens) << "prompt " << i;
    EXPECT_LT(b.verify_steps, 20) << "40 tokens in few steps";
    drafted += b.draft_tokens;
    accepted += b.accepted_draft_tokens;
  }
  std::printf("MTP drafts: %lld accepted of %lld\n", (long long)accepted, (long long)drafted);
  EXPECT_GT(drafted, 40);
  EXPECT_GE(double(accepted), 0.9 * double(drafted));
}

TEST(SpeculativeMtp, AModelWithoutTheHead) {
  auto runner = cpu_runner_create(demo_weights(/*mtp=*/false));
  EXPECT_FALSE(runner->supports_mtp());
  EXPECT_EQ(speculative_effective_mode(SpeculativeMode::mtp, *runner), SpeculativeMode::off);
  EXPECT_EQ(speculative_effective_mode(SpeculativeMode::auto_, *runner), SpeculativeMode::ngram);
  EXPECT_EQ(speculative_effective_mode(SpeculativeMode::ngram, *runner), SpeculativeMode::ngram);
  const std::string why = speculative_unavailable(SpeculativeMode::mtp, *runner);
  EXPECT_NE(why.find("no MTP draft head"), std::string::npos) << why;
  EXPECT_NE(why.find("--speculative mtp"), std::string::npos) << why;
  EXPECT_EQ(speculative_unavailable(SpeculativeMode::auto_, *runner), "");
  EXPECT_EQ(speculative_unavailable(SpeculativeMode::ngram, *runner), "");

  auto with_head = cpu_runner_create(demo_weights());
  EXPECT_EQ(speculative_effective_mode(SpeculativeMode::auto_, *with_head), SpeculativeMode::mtp);
  EXPECT_EQ(speculative_unavailable(SpeculativeMode::mtp, *with_head), "");

  // mtp without the head: plain steps, the same output.
  GenerationRequest req;
  req.prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  req.sampling.temperature = 0.0f;
  req.max_tokens = 16;
  const GenerationResult a = generate(*runner, SpeculativeMode::off, req);
  const GenerationResult b = generate(*runner, SpeculativeMode::mtp, req);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.draft_tokens, 0);
}

}  // namespace
}  // namespace tern
