// The generation loop against a scripted fake backend: end ids, stop strings, max_tokens, the context limit,
// cancellation, forced tokens, the thinking budget, session reuse, token counts and log-probabilities.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <utility>

#include "core/check.h"
#include "engine/generator.h"

namespace tern {
namespace {

constexpr int64_t kVocab = 40, kPadded = 64;
constexpr int32_t kEnd = 1;

class FakeSnapshot : public StateSnapshot {
 public:
  explicit FakeSnapshot(int64_t position) : position_(position) {}
  int64_t position() const override { return position_; }
  size_t bytes() const override { return 0; }
  bool on_host() const override { return false; }
  void to_host() override {}
  void to_device() override {}

 private:
  int64_t position_;
};

class FakeSession : public Session {
 public:
  explicit FakeSession(int64_t cap) : cap_(cap) {}
  int64_t position() const override { return int64_t(tokens.size()); }
  int64_t capacity() const override { return cap_; }
  void reset() override { tokens.clear(); }
  // Session::keep_state_at: the runner's forward keeps a FakeSnapshot at the position when its call holds it.
  void keep_state_at(int64_t position) override { keep_at = position; }
  std::unique_ptr<StateSnapshot> take_kept_snapshot() override { return std::move(kept); }
  std::vector<int32_t> tokens;
  int64_t keep_at = -1;
  std::unique_ptr<StateSnapshot> kept;

 private:
  int64_t cap_;
};

// Next token after t is next(t) = (3 * t + 2) % kVocab, the clear favourite; token 0 is never predicted after a
// non-zero token. script_end: after that many fed tokens, the end id is the favourite.
class FakeRunner : public ModelRunner {
 public:
  FakeRunner() {
    config_.vocab_size = kPadded;
    config_.eos_token_ids = {kEnd};
  }
  std::string backend_name() const override { return "fake"; }
  const Config& config() const override { return config_; }
  int64_t vocab_real() const override { return kVocab; }
  std::unique_ptr<Session> create_session(int64_t max_context) override {
    return std::make_unique<FakeSession>(max_context);
  }
  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>& logits) override {
    auto& s = static_cast<FakeSession&>(session);
    TERN_CHECK(s.position() + int64_t(tokens.size()) <= s.capacity(), "fake: over capacity");
    const int64_t keep_at = std::exchange(s.keep_at, -1);
    s.kept.reset();
    if (keep_at > s.position() && keep_at < s.position() + int64_t(tokens.size()))
      s.kept = std::make_unique<FakeSnapshot>(keep_at);
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
    forward_calls++;
    call_sizes.push_back(int64_t(tokens.size()));
    fed += int64_t(tokens.size());
    logits.assign(size_t(kPadded), 0.0f);
    for (int64_t i = kVocab; i < kPadded; ++i) logits[size_t(i)] = -std::numeric_limits<float>::infinity();
    const int32_t t = tokens.back();
    const int32_t next = end_after > 0 && s.position() >= end_after ? kEnd : (3 * t + 2) % int32_t(kVocab);
    logits[size_t(next)] = 8.0f;
  }
  static int32_t next(int32_t t) { return (3 * t + 2) % int32_t(kVocab); }
  int64_t preferred_prefill_chunk() const override { return preferred_chunk; }
  bool keeps_state_inside(int64_t tokens) const override { return tokens >= 2 && tokens <= keeps_inside_up_to; }

  Config config_;
  int64_t preferred_chunk = 2048;
  int64_t keeps_inside_up_to = 0;   // calls of 2 to this many tokens keep a state inside (0: none)
  std::vector<int64_t> call_sizes;  // tokens of every forward call
  int64_t end_after = 0;
  int forward_calls = 0;
  int64_t fed = 0;
};

// Token t prints as one ASCII character ('0' + t), except the end id (special, "<end>").
TokenTextSource letters() {
  return {.bytes = [](int32_t id) { return id == kEnd ? std::string("<end>") : std::string(1, char('0' + id)); },
          .is_special = [](int32_t id) { return id == kEnd; }};
}

GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  return r;
}

std::string letters_of(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += char('0' + id);
  return s;
}

TEST(Generator, GreedyFollowsTheModelUntilMaxTokens) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  std::vector<TokenEvent> events;
  auto r = gen.generate(*session, greedy_request({5, 6}, 6), [&](const TokenEvent& e) {
    events.push_back(e);
    return true;
  });
  std::vector<int32_t> want;
  for (int32_t t = 6; want.size() < 6;) want.push_back(t = FakeRunner::next(t));
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.finish, FinishReason::length);
  EXPECT_EQ(r.prompt_tokens, 2);
  EXPECT_EQ(r.completion_tokens, 6);
  EXPECT_EQ(r.text, letters_of(want));
  ASSERT_EQ(events.size(), 6u);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].id, want[i]);
    EXPECT_EQ(events[i].index, int64_t(i));
  }
  // The session holds the prompt and every generated token but the last.
  EXPECT_EQ(session->position(), 2 + 6 - 1);
  EXPECT_GE(r.prefill_s, 0.0);
  EXPECT_GE(r.decode_s, 0.0);
}

// The prompt goes to the runner in calls of its preferred chunk unless the options set one; checkpoints split a call
// where they fall (and are taken there).
TEST(Generator, PrefillCallsFollowTheRunnersChunkAndTheCheckpoints) {
  std::vector<int32_t> prompt(23);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(2 + i % 30);
  {
    FakeRunner runner;
    runner.preferred_chunk = 10;
    Generator gen(runner, letters());
    auto session = runner.create_session(100);
    gen.generate(*session, greedy_request(prompt, 1));
    EXPECT_EQ(runner.call_sizes, (std::vector<int64_t>{10, 10, 3}));
  }
  {
    FakeRunner runner;
    runner.preferred_chunk = 10;
    GeneratorOptions opts;
    opts.prefill_chunk = 8;
    Generator gen(runner, letters(), opts);
    auto session = runner.create_session(100);
    GenerationRequest r = greedy_request(prompt, 1);
    r.checkpoint_every = 12;
    std::vector<int64_t> taken;
    r.on_checkpoint = [&](const Session& s) { taken.push_back(s.position()); };
    gen.generate(*session, r);
    EXPECT_EQ(runner.call_sizes, (std::vector<int64_t>{8, 4, 8, 3}));
    EXPECT_EQ(taken, (std::vector<int64_t>{12, 23}));
  }
  {
    FakeRunner runner;
    runner.preferred_chunk = 64;  // the whole prompt in one call
    Generator gen(runner, letters());
    auto session = runner.create_session(100);
    gen.generate(*session, greedy_request(prompt, 1));
    EXPECT_EQ(runner.call_sizes, (std::vector<int64_t>{23}));
  }
}

// GenerationRequest::checkpoint_at with on_kept_checkpoint: a checkpoint inside a call the runner can keep it in
// does not cut the call (the session keeps the state there, taken after the call); a second one inside still does;
// where the runner cannot keep one in a call of that size, or nothing takes it, the calls are cut as before.
TEST(Generator, CheckpointsKeptInsideACallDoNotCutIt) {
  std::vector<int32_t> prompt(23);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(2 + i % 30);
  struct Run {
    std::vector<int64_t> calls, checkpoints, kept;
    GenerationResult result;
  };
  auto run = [&](int64_t keeps_up_to, bool take_kept) {
    FakeRunner runner;
    runner.preferred_chunk = 10;
    runner.keeps_inside_up_to = keeps_up_to;
    Generator gen(runner, letters());
    auto session = runner.create_session(100);
    GenerationRequest r = greedy_request(prompt, 3);
    r.checkpoint_at = {17, 15, 40};  // in any order; past the prompt: ignored
    Run out;
    r.on_checkpoint = [&](Session& s) { out.checkpoints.push_back(s.position()); };
    if (take_kept) {
      r.on_kept_checkpoint = [&](Session& s) {
        std::unique_ptr<StateSnapshot> snap = s.take_kept_snapshot();
        EXPECT_TRUE(snap) << "a kept checkpoint without a snapshot";
        if (snap) out.kept.push_back(snap->position());
        EXPECT_EQ(s.position(), 17) << "taken right after its call";
      };
    }
    out.result = gen.generate(*session, r);
    out.calls = runner.call_sizes;
    return out;
  };
  const Run kept = run(10, true);
  EXPECT_EQ(kept.calls, (std::vector<int64_t>{10, 7, 6, 1, 1}));  // 15 kept inside [10, 17); 17 cuts
  EXPECT_EQ(kept.kept, (std::vector<int64_t>{15}));
  EXPECT_EQ(kept.checkpoints, (std::vector<int64_t>{17, 23}));
  for (const Run& cut : {run(10, false), run(4, true), run(0, true)}) {
    EXPECT_EQ(cut.calls, (std::vector<int64_t>{10, 5, 2, 6, 1, 1}));
    EXPECT_TRUE(cut.kept.empty());
    EXPECT_EQ(cut.checkpoints, (std::vector<int64_t>{15, 17, 23}));
    EXPECT_EQ(cut.result.tokens, kept.result.tokens);
  }
}

TEST(Generator, EndIdStopsAndIsNotShown) {
  FakeRunner runner;
  runner.end_after = 5;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  auto r = gen.generate(*session, greedy_request({2, 3}, 50));
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(r.stop_id, kEnd);
  ASSERT_EQ(r.tokens.size(), 4u);  // 3 normal tokens fed at positions 3..5, then the end id
  EXPECT_EQ(r.tokens.back(), kEnd);
  EXPECT_EQ(r.text.find("<end>"), std::string::npos);
  EXPECT_EQ(r.completion_tokens, 4);

  GenerationRequest ig = greedy_request({2, 3}, 6);
  ig.ignore_eos = true;
  session->reset();
  auto r2 = gen.generate(*session, ig);
  EXPECT_EQ(r2.finish, FinishReason::length);
  EXPECT_EQ(r2.tokens.size(), 6u);
  EXPECT_EQ(r2.text.find("<end>"), std::string::npos);  // special: skipped
  ig.skip_special_tokens = false;
  session->reset();
  auto r3 = gen.generate(*session, ig);
  EXPECT_NE(r3.text.find("<end>"), std::string::npos);
}

TEST(Generator, StopStringAcrossTokensNeverReachesTheStream) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  // Greedy from 6 cycles through 20, 22, 28, 6.
  std::vector<int32_t> seq;
  for (int32_t t = 6; seq.size() < 8;) seq.push_back(t = FakeRunner::next(t));
  const std::string all = letters_of(seq);
  GenerationRequest req = greedy_request({6}, 30);
  req.stop = {all.substr(2, 3)};
  std::string streamed;
  auto r = gen.generate(*session, req, [&](const TokenEvent& e) {
    streamed += e.text;
    return true;
  });
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(r.stop_string, req.stop[0]);
  EXPECT_EQ(streamed, all.substr(0, 2));
  EXPECT_EQ(r.text, streamed);
  EXPECT_EQ(r.tokens.size(), 5u);
}

TEST(Generator, ContextLimitEndsWithAClearMessage) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(10);
  auto r = gen.generate(*session, greedy_request({3, 4, 6}, -1));
  EXPECT_EQ(r.finish, FinishReason::context);
  EXPECT_NE(r.message.find("10"), std::string::npos) << r.message;
  EXPECT_EQ(session->position(), 10);
  EXPECT_EQ(r.completion_tokens, 8);

  auto small = runner.create_session(2);
  try {
    gen.generate(*small, greedy_request({3, 4, 5}, 4));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2"), std::string::npos) << e.what();
  }
}

TEST(Generator, CallbackAndFlagCancelWithinOneStep) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  int seen = 0;
  auto r = gen.generate(*session, greedy_request({3}, 50), [&](const TokenEvent&) { return ++seen < 3; });
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(r.completion_tokens, 3);

  std::atomic<bool> flag{false};
  GenerationRequest req = greedy_request({3}, 50);
  req.cancel = &flag;
  session->reset();
  int calls = 0;
  auto r2 = gen.generate(*session, req, [&](const TokenEvent&) {
    if (++calls == 4) flag = true;
    return true;
  });
  EXPECT_EQ(r2.finish, FinishReason::cancelled);
  EXPECT_EQ(r2.completion_tokens, 4);
}

TEST(Generator, ForcedTokensReplaceTheSampledOnes) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  GenerationRequest req = greedy_request({3}, 50);
  req.forced_tokens = {7, 8, 9};
  req.sampling.top_logprobs = 2;
  std::vector<TokenEvent> ev;
  auto r = gen.generate(*session, req, [&](const TokenEvent& e) {
    ev.push_back(e);
    return true;
  });
  EXPECT_EQ(r.tokens, req.forced_tokens);
  EXPECT_EQ(r.text, "789");
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(runner.fed, 1 + 2);  // the model ran on the prompt and the forced tokens (the last is never fed)
  ASSERT_EQ(ev.size(), 3u);
  // The model predicted next(3) = 11 after the prompt; forced 7 had a low log-probability under it.
  EXPECT_TRUE(ev[0].has_logprobs);
  EXPECT_LT(ev[0].logprob, -7.0f);
  ASSERT_EQ(ev[0].top_logprobs.size(), 2u);
  EXPECT_EQ(ev[0].top_logprobs[0].id, FakeRunner::next(3));
  EXPECT_NEAR(ev[0].top_logprobs[0].logprob, -std::log1p(39 * std::exp(-8.0)), 1e-4);  // 8 against 39 zeros

  req.forced_tokens = {7, kEnd, 9};
  session->reset();
  auto r2 = gen.generate(*session, req);
  EXPECT_EQ(r2.tokens, (std::vector<int32_t>{7, kEnd}));
  EXPECT_EQ(r2.stop_id, kEnd);
}

// Letters, except the ids in `words`, which print as their strings (reasoning markers for the budget tests).
TokenTextSource letters_with(std::map<int32_t, std::string> words) {
  return {.bytes =
              [words](int32_t id) {
                auto it = words.find(id);
                if (it != words.end()) return it->second;
                return id == kEnd ? std::string("<end>") : std::string(1, char('0' + id));
              },
          .is_special = [](int32_t id) { return id == kEnd; }};
}

// From prompt {6} the fake model says 20, 22, 28, 6, 20, ... (never the end id); after 31: 15, 7, 23, 31, ...
GenerationRequest budget_request(int64_t budget, bool starts_in_reasoning, int64_t max_tokens) {
  GenerationRequest r = greedy_request({6}, max_tokens);
  r.thinking_budget = budget;
  r.starts_in_reasoning = starts_in_reasoning;
  r.reasoning_close_tokens = {30, 31};  // "</thi" "nk>": the marker split over two tokens
  return r;
}

TEST(Generator, ThinkingBudgetForcesTheCloseTokensOnceSpent) {
  FakeRunner runner;
  Generator gen(runner, letters_with({{30, "</thi"}, {31, "nk>"}}));
  auto session = runner.create_session(100);
  std::vector<int32_t> emitted;
  auto r = gen.generate(*session, budget_request(3, true, 8), [&](const TokenEvent& e) {
    emitted.push_back(e.id);
    return true;
  });
  // Three reasoning tokens, then the close tokens replace the model's choices; then the model goes on from them.
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{20, 22, 28, 30, 31, 15, 7, 23}));
  EXPECT_EQ(emitted, r.tokens);
  EXPECT_EQ(r.reasoning_tokens, 3);
  EXPECT_TRUE(r.reasoning_cut);
  EXPECT_EQ(r.finish, FinishReason::length);
  // The model ran on every emitted token but the last (forced ones included).
  EXPECT_EQ(runner.fed, 1 + 7);

  session->reset();  // a budget of 0: no reasoning at all
  auto r0 = gen.generate(*session, budget_request(0, true, 3));
  EXPECT_EQ(r0.tokens, (std::vector<int32_t>{30, 31, 15}));
  EXPECT_EQ(r0.reasoning_tokens, 0);
  EXPECT_TRUE(r0.reasoning_cut);
}

TEST(Generator, ThinkingBudgetLeavesReasoningThatClosesInTime) {
  FakeRunner runner;
  Generator gen(runner, letters_with({{28, "</think>"}}));  // the model closes its reasoning after 20, 22
  auto session = runner.create_session(100);
  auto r = gen.generate(*session, budget_request(3, true, 6));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{20, 22, 28, 6, 20, 22}));  // nothing forced, also later
  EXPECT_EQ(r.reasoning_tokens, 2);
  EXPECT_FALSE(r.reasoning_cut);
}

TEST(Generator, ThinkingBudgetIgnoresAThinkTagTheOutputWrites) {
  FakeRunner runner;
  // Not in reasoning at the start: 20, 22 write "<think>" (over two tokens) as text; nothing is counted or forced,
  // with any budget (an answer quoting the tag, a JSON string holding it).
  Generator gen(runner, letters_with({{20, "<th"}, {22, "ink>"}, {30, "</thi"}, {31, "nk>"}}));
  auto session = runner.create_session(100);
  for (int64_t budget : {0, 1, 2}) {
    session->reset();
    auto r = gen.generate(*session, budget_request(budget, false, 7));
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{20, 22, 28, 6, 20, 22, 28}));
    EXPECT_EQ(r.reasoning_tokens, 0);
    EXPECT_FALSE(r.reasoning_cut);
  }
}

TEST(Generator, ThinkingBudgetNeedsValidCloseTokens) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  GenerationRequest r = budget_request(3, true, 5);
  r.reasoning_close_tokens.clear();
  EXPECT_THROW(gen.generate(*session, r), Error);
  r.reasoning_close_tokens = {30, int32_t(kVocab)};
  EXPECT_THROW(gen.generate(*session, r), Error);
}

TEST(Generator, SessionReuseFeedsOnlyTheNewPart) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  auto r1 = gen.generate(*session, greedy_request({3, 4, 6}, 3));
  ASSERT_EQ(session->position(), 5);
  // Next turn: prompt = previous prompt + previous output (all held but the last) + new tokens.
  std::vector<int32_t> prompt = {3, 4, 6};
  prompt.insert(prompt.end(), r1.tokens.begin(), r1.tokens.end());
  prompt.push_back(9);
  runner.fed = 0;
  auto r2 = gen.generate(*session, greedy_request(prompt, 2));
  EXPECT_EQ(r2.cached_tokens, 5);
  EXPECT_EQ(runner.fed, int64_t(prompt.size()) - 5 + 1);
  EXPECT_EQ(r2.tokens[0], FakeRunner::next(9));
  // A session holding more than the prompt is reset and the whole prompt runs.
  runner.fed = 0;
  auto r3 = gen.generate(*session, greedy_request({3, 4}, 1));
  EXPECT_EQ(r3.cached_tokens, 0);
  EXPECT_EQ(runner.fed, 2);
}

// on_prompt_progress: once as the prefill starts (processed == cached), then after each forward call of the prompt
// (its chunks, cut at the checkpoints), the last one at processed == total before the first token; never per token.
TEST(Generator, PromptProgressAtEachPrefillCall) {
  FakeRunner runner;
  runner.preferred_chunk = 10;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  std::vector<int32_t> prompt(23);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(2 + i % 30);
  GenerationRequest r = greedy_request(prompt, 4);
  r.checkpoint_at = {15};
  std::vector<PromptProgress> reports;
  std::vector<std::string> order;  // "p" for a report, "t" for a token
  r.on_prompt_progress = [&](const PromptProgress& p) {
    reports.push_back(p);
    order.push_back("p");
  };
  gen.generate(*session, r, [&](const TokenEvent&) {
    order.push_back("t");
    return true;
  });
  std::vector<int64_t> processed;
  for (const PromptProgress& p : reports) {
    processed.push_back(p.processed);
    EXPECT_EQ(p.total, 23);
    EXPECT_EQ(p.cached, 0);
  }
  EXPECT_EQ(processed, (std::vector<int64_t>{0, 10, 15, 23}));  // the calls: 10, 5 (to the checkpoint), 8
  for (size_t i = 1; i < reports.size(); ++i) EXPECT_GE(reports[i].elapsed_s, reports[i - 1].elapsed_s);
  EXPECT_EQ(order, (std::vector<std::string>{"p", "p", "p", "p", "t", "t", "t", "t"}));

  // A session that holds the prompt's start: counted as cached, and the reports start there.
  std::vector<int32_t> longer = prompt;
  for (int i = 0; i < 12; ++i) longer.push_back(int32_t(3 + i));
  auto held = runner.create_session(100);
  static_cast<FakeSession&>(*held).tokens = prompt;
  GenerationRequest r2 = greedy_request(longer, 1);
  reports.clear();
  r2.on_prompt_progress = [&](const PromptProgress& p) { reports.push_back(p); };
  const GenerationResult res = gen.generate(*held, r2);
  EXPECT_EQ(res.cached_tokens, 23);
  processed.clear();
  for (const PromptProgress& p : reports) {
    processed.push_back(p.processed);
    EXPECT_EQ(p.total, 35);
    EXPECT_EQ(p.cached, 23);
  }
  EXPECT_EQ(processed, (std::vector<int64_t>{23, 33, 35}));
}

TEST(Generator, BadRequestsAreErrors) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  EXPECT_THROW(gen.generate(*session, greedy_request({}, 3)), Error);
  EXPECT_THROW(gen.generate(*session, greedy_request({kVocab}, 3)), Error);  // a padded id
  GenerationRequest r = greedy_request({3}, 3);
  r.sampling.top_p = 2.0f;
  EXPECT_THROW(gen.generate(*session, r), Error);
  GenerationRequest f = greedy_request({3}, 3);
  f.forced_tokens = {-1};
  EXPECT_THROW(gen.generate(*session, f), Error);
}

TEST(Generator, SeededSamplingIsRepeatable) {
  FakeRunner runner;
  Generator gen(runner, letters());
  auto session = runner.create_session(100);
  GenerationRequest req;
  req.prompt = {3};
  req.max_tokens = 20;
  req.sampling.temperature = 8.0f;  // flat enough to wander
  req.sampling.seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(*req.sampling.seed));
  auto a = gen.generate(*session, req);
  session->reset();
  auto b = gen.generate(*session, req);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.seed, *req.sampling.seed);
}

}  // namespace
}  // namespace tern
