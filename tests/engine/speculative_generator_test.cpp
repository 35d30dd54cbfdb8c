// Speculative decoding in the generation loop (engine/generation_run.h with engine/speculative.h) against a scripted
// backend that can verify: every request gives, with drafts, exactly the tokens, text, events, finish and session
// position it gives without (greedy and seeded sampling; max_tokens, end ids, stop strings, the context limit,
// cancellation inside a verify step, forced tokens, the thinking budget), and drafts are accepted where the output
// repeats or follows the client's prediction.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "core/check.h"
#include "engine/generator.h"

namespace tern {
namespace {

constexpr int64_t kVocab = 40, kPadded = 64;
constexpr int32_t kEnd = 1;

class VerifySession : public Session {
 public:
  explicit VerifySession(int64_t cap) : cap_(cap) {}
  int64_t position() const override { return int64_t(tokens.size()); }
  int64_t capacity() const override { return cap_; }
  void reset() override {
    tokens.clear();
    kept_from = -1;
  }
  void rollback(int64_t position) override {
    TERN_CHECK(kept_from >= 0 && position >= kept_from && position <= this->position(), "bad rollback to ",
               position);
    tokens.resize(size_t(position));
    kept_from = -1;
  }
  std::vector<int32_t> tokens;
  int64_t kept_from = -1;

 private:
  int64_t cap_;
};

// The next token after t is next(t) = (3t + 2) % 40 with a margin, unless `noise` > 0: then the logits get a
// pseudo-random part that depends on (position, t), so sampling has real choices. end_after: from that position on,
// the end id is the favourite.
class VerifyRunner : public ModelRunner {
 public:
  explicit VerifyRunner(bool can_verify = true) : can_verify_(can_verify) {
    config_.vocab_size = kPadded;
    config_.eos_token_ids = {kEnd};
  }
  std::string backend_name() const override { return "verify-fake"; }
  const Config& config() const override { return config_; }
  int64_t vocab_real() const override { return kVocab; }
  std::unique_ptr<Session> create_session(int64_t max_context) override {
    return std::make_unique<VerifySession>(max_context);
  }
  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>& logits) override {
    auto& s = static_cast<VerifySession&>(session);
    TERN_CHECK(s.position() + int64_t(tokens.size()) <= s.capacity(), "fake: over capacity");
    s.kept_from = -1;
    logits.clear();
    for (size_t j = 0; j < tokens.size(); ++j) {
      s.tokens.push_back(tokens[j]);
      if (all_logits || j + 1 == tokens.size()) append_logits(s.position(), tokens[j], logits);
    }
    ++forward_calls;
  }
  bool supports_verify() const override { return can_verify_; }
  void forward_verify(Session& session, std::span<const int32_t> tokens, std::vector<float>& logits) override {
    auto& s = static_cast<VerifySession&>(session);
    const int64_t from = s.position();
    forward(session, tokens, true, logits);
    s.kept_from = from;
    ++verify_calls;
  }
  static int32_t next(int32_t t) { return (3 * t + 2) % int32_t(kVocab); }

  int64_t end_after = 0;
  float noise = 0.0f;
  int forward_calls = 0, verify_calls = 0;

 private:
  void append_logits(int64_t pos, int32_t t, std::vector<float>& out) const {
    const size_t at = out.size();
    out.resize(at + size_t(kPadded), 0.0f);
    float* l = out.data() + at;
    for (int64_t i = kVocab; i < kPadded; ++i) l[i] = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < kVocab && noise > 0; ++i)
      l[i] = noise * float(std::sin(0.77 * double(i + 1) * double(pos) + 0.31 * double(t)));
    const int32_t nx = end_after > 0 && pos >= end_after ? kEnd : next(t);
    l[nx] += 4.0f;
  }
  Config config_;
  bool can_verify_;
};

TokenTextSource letters() {
  return {.bytes = [](int32_t id) { return id == kEnd ? std::string("<end>") : std::string(1, char('0' + id)); },
          .is_special = [](int32_t id) { return id == kEnd; }};
}

struct Outcome {
  GenerationResult result;
  std::vector<std::tuple<int32_t, int64_t, std::string>> events;
  int64_t position = 0;
};

// One request through a generator with the given mode; cancel_at >= 0: the callback refuses that event's index.
Outcome run(VerifyRunner& runner, SpeculativeMode mode, const GenerationRequest& req, int64_t capacity = 200,
        int64_t cancel_at = -1) {
  GeneratorOptions o;
  o.speculative.mode = mode;
  Generator gen(runner, letters(), o);
  auto session = runner.create_session(capacity);
  Outcome r;
  r.result = gen.generate(*session, req, [&](const TokenEvent& e) {
    r.events.emplace_back(e.id, e.index, e.text);
    return e.index != cancel_at;
  });
  r.position = session->position();
  return r;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.result.tokens, b.result.tokens) << what;
  EXPECT_EQ(a.result.text, b.result.text) << what;
  EXPECT_EQ(finish_reason_name(a.result.finish), std::string(finish_reason_name(b.result.finish))) << what;
  EXPECT_EQ(a.result.stop_string, b.result.stop_string) << what;
  EXPECT_EQ(a.result.stop_id, b.result.stop_id) << what;
  EXPECT_EQ(a.result.message, b.result.message) << what;
  EXPECT_EQ(a.result.reasoning_tokens, b.result.reasoning_tokens) << what;
  EXPECT_EQ(a.events, b.events) << what;
  EXPECT_EQ(a.position, b.position) << what << ": the session holds the same tokens";
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  return r;
}

std::vector<int32_t> chain(int32_t from, size_t n) {
  std::vector<int32_t> s;
  for (int32_t t = from; s.size() < n;) s.push_back(t = VerifyRunner::next(t));
  return s;
}

TEST(SpeculativeGenerator, SameOutputWithAndWithoutDrafts) {
  struct Case {
    std::string name;
    GenerationRequest req;
    int64_t capacity = 200, cancel_at = -1, end_after = 0;
  };
  std::vector<Case> cases;
  for (int64_t m : {1, 2, 3, 7, 13, 40}) cases.push_back({"max_tokens " + std::to_string(m), greedy({5, 6}, m)});
  {
    Case c{"end id", greedy({3, 4}, 60)};
    c.end_after = 17;
    cases.push_back(c);
  }
  {
    const std::string all = [] {
      std::string s;
      for (int32_t t : chain(6, 30)) s += char('0' + t);
      return s;
    }();
    for (size_t at : {2, 5, 9, 14}) {
      Case c{"stop string at " + std::to_string(at), greedy({6}, 60)};
      c.req.stop = {all.substr(at, 3)};
      cases.push_back(c);
    }
  }
  for (int64_t cap : {9, 12, 20}) {
    Case c{"context " + std::to_string(cap), greedy({3, 4, 6}, -1)};
    c.capacity = cap;
    cases.push_back(c);
  }
  for (int64_t at : {0, 3, 6, 11}) {
    Case c{"cancel at " + std::to_string(at), greedy({3}, 50)};
    c.cancel_at = at;
    cases.push_back(c);
  }
  {
    Case c{"forced tokens", greedy({3}, 50)};
    c.req.forced_tokens = {7, 8, 7, 8, 7, 8, 7, 8, 9};
    cases.push_back(c);
  }
  {
    Case c{"thinking budget", greedy({3}, 40)};
    c.req.thinking_budget = 9;
    c.req.starts_in_reasoning = true;
    c.req.reasoning_close_tokens = {10, 11, 12};
    cases.push_back(c);
  }
  {
    Case c{"prediction", greedy({5, 6}, 30)};
    c.req.prediction = chain(6, 12);
    c.req.prediction[7] = 33;  // wrong from there on for a while
    cases.push_back(c);
  }
  int64_t accepted = 0;
  for (const Case& c : cases) {
    VerifyRunner plain, spec;
    plain.end_after = spec.end_after = c.end_after;
    const Outcome a = run(plain, SpeculativeMode::off, c.req, c.capacity, c.cancel_at);
    const Outcome b = run(spec, SpeculativeMode::ngram, c.req, c.capacity, c.cancel_at);
    expect_same(a, b, c.name);
    EXPECT_EQ(a.result.draft_tokens, 0);
    EXPECT_LE(b.result.accepted_draft_tokens, b.result.draft_tokens);
    if (b.result.completion_tokens > 8 && c.name != "forced tokens" && c.name != "thinking budget") {
      EXPECT_GT(b.result.accepted_draft_tokens, 0) << c.name << ": the chain repeats, drafts should pass";
    }
    accepted += b.result.accepted_draft_tokens;
  }
  EXPECT_GT(accepted, 0);
}

// Seeded sampling draws one uniform per token whatever the step, so the very same tokens come out with drafts.
TEST(SpeculativeGenerator, SeededSamplingGivesTheSameTokens) {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    GenerationRequest req = greedy({5, 6}, 48);
    req.sampling.temperature = 0.9f;
    req.sampling.seed = seed;
    if (seed % 2) req.sampling.top_k = 5;
    if (seed % 3 == 0) req.sampling.frequency_penalty = 0.3f;  // penalties see the accepted tokens in order
    req.sampling.top_logprobs = seed % 2 ? 2 : -1;
    VerifyRunner plain, spec;
    plain.noise = spec.noise = 2.0f;
    const Outcome a = run(plain, SpeculativeMode::off, req), b = run(spec, SpeculativeMode::ngram, req);
    expect_same(a, b, "seed " + std::to_string(seed));
  }
}

// Drafts from the request's prediction alone (no n-gram match is ever long enough).
GeneratorOptions prediction_only() {
  GeneratorOptions o;
  o.speculative.mode = SpeculativeMode::ngram;
  o.speculative.ngram_min_match = 1000;
  return o;
}

TEST(SpeculativeGenerator, ThePredictionIsDraftedAndVerifiedInFewSteps) {
  GenerationRequest req = greedy({5, 6}, 40);
  req.prediction = chain(6, 40);
  VerifyRunner spec;
  Generator gen(spec, letters(), prediction_only());
  auto session = spec.create_session(200);
  const GenerationResult r = gen.generate(*session, req);
  EXPECT_EQ(r.tokens, chain(6, 40));
  EXPECT_EQ(r.accepted_draft_tokens, r.draft_tokens) << "a right prediction is accepted whole";
  EXPECT_GE(r.accepted_draft_tokens, 30);
  EXPECT_LT(spec.forward_calls, 12) << "a prefill and a few verify steps";
  EXPECT_EQ(session->position(), 2 + 40 - 1);
}

// Under ignore_eos an end id ends nothing, so drafts go on past it: 13 -> 1 (the end id) -> 5 -> 17 -> 13 ...
TEST(SpeculativeGenerator, UnderIgnoreEosDraftsGoPastAnEndId) {
  GenerationRequest req = greedy({13}, 40);
  req.ignore_eos = true;
  req.prediction = chain(13, 40);
  VerifyRunner spec;
  Generator gen(spec, letters(), prediction_only());
  auto session = spec.create_session(200);
  const GenerationResult r = gen.generate(*session, req);
  EXPECT_EQ(r.tokens, chain(13, 40));
  EXPECT_EQ(r.accepted_draft_tokens, r.draft_tokens);
  // The prefill, then 5, 7, 9, 9 and 9 tokens a step (4 drafts, then 2 more after each full acceptance, up to 8);
  // cut at each end id, a step would hold 5 at most.
  EXPECT_EQ(spec.forward_calls, 6);
}

TEST(SpeculativeGenerator, OffOrABackendWithoutVerifyRunsPlainSteps) {
  GenerationRequest req = greedy({5, 6}, 20);
  req.prediction = chain(6, 20);
  VerifyRunner no_verify(/*can_verify=*/false), off;
  const Outcome a = run(no_verify, SpeculativeMode::ngram, req), b = run(off, SpeculativeMode::off, req);
  expect_same(a, b, "no verify");
  EXPECT_EQ(no_verify.verify_calls, 0);
  EXPECT_EQ(off.verify_calls, 0);
  EXPECT_EQ(a.result.draft_tokens, 0);
}

}  // namespace
}  // namespace tern
