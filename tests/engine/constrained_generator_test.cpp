// Constrained decoding in the generation loop (engine/generator.h with a grammar from src/grammar): over a small
// JSON-ish vocabulary and a runner whose logits are a fixed pseudo-random function, every output is valid for the
// schema and ends with an end id, greedy and sampled, on the host sampler and on a device sampling path that
// honours DeviceSampling::mask (both give the same greedy tokens); the log-probabilities report only allowed ids;
// max_tokens too small for the schema gives `length` with the output so far; a start marker leaves the tokens
// before it free; a forced token the grammar refuses is an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "engine/generator.h"
#include "engine/token_mask.h"
#include "engine/generation_run.h"
#include "grammar/grammar.h"

namespace tern {
namespace {

using nlohmann::json;

// Id 0 is the end id (no bytes); then JSON pieces, multi-byte ones, free-text tokens, and every lowercase letter
// and digit alone (like a byte-level BPE, any text can be spelled).
std::vector<std::string> make_tokens() {
  std::vector<std::string> t = {"",     "{",     "}",        "[",     "]",     ",",   ":",   "\"",       "name",
                                "age",  "-",     "true",     "false", "null",  " ",   "\"a\"", "{\"",       "\":",
                                "hello", "</think>", "\n",  "tags",  "\"name\"", "\"age\"", "\"tags\"", "ok", "."};
  for (char c = 'a'; c <= 'z'; ++c) t.push_back(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) t.push_back(std::string(1, c));
  return t;
}
const std::vector<std::string> kTokens = make_tokens();
constexpr int32_t kEnd = 0;

int32_t token_of(const std::string& s) {
  return int32_t(std::find(kTokens.begin(), kTokens.end(), s) - kTokens.begin());
}

class TestSession : public Session {
 public:
  explicit TestSession(int64_t capacity) : capacity_(capacity) {}
  int64_t position() const override { return position_; }
  int64_t capacity() const override { return capacity_; }
  void reset() override { position_ = 0; }
  void rollback(int64_t position) override {  // the logits depend only on (position, last token): nothing else to undo
    TERN_CHECK(kept_from_ >= 0 && position >= kept_from_ && position <= position_, "bad rollback");
    position_ = position;
    kept_from_ = -1;
  }
  int64_t position_ = 0, capacity_, kept_from_ = -1;
};

// Logits: a fixed pseudo-random function of (position, last token, id), plus `boost` at scripted positions.
// forward_sample (when enabled) runs the forward, then asks the mask source, applies the mask and takes the
// arg-max, as the CUDA runner does on the device.
class ScriptedRunner : public ModelRunner {
 public:
  ScriptedRunner(int64_t vocab, bool device) : device_(device) { config_.vocab_size = vocab; }
  std::string backend_name() const override { return "scripted"; }
  const Config& config() const override { return config_; }
  int64_t vocab_real() const override { return config_.vocab_size; }
  std::unique_ptr<Session> create_session(int64_t max_context) override {
    return std::make_unique<TestSession>(max_context);
  }
  void forward(Session& session, std::span<const int32_t> tokens, bool, std::vector<float>& logits) override {
    auto& s = static_cast<TestSession&>(session);
    s.position_ += int64_t(tokens.size());
    const int64_t pos = s.position_;
    logits.assign(size_t(config_.vocab_size), 0.0f);
    for (int64_t v = 0; v < config_.vocab_size; ++v)
      logits[size_t(v)] = 2.0f * float(std::sin(0.91 * double(v + 1) * double(pos) + 0.37 * double(tokens.back())));
    logits[kEnd] -= 3.0f;  // the end id is unlikely: the constraint has to bring it
    if (auto it = boost.find(pos); it != boost.end()) logits[size_t(it->second)] += 100.0f;
  }
  std::optional<int32_t> forward_sample(Session& session, std::span<const int32_t> tokens,
                                        const DeviceSampling& sampling) override {
    if (!device_) return std::nullopt;
    std::vector<float> l;
    forward(session, tokens, false, l);
    if (sampling.mask) {
      ++masked_steps;
      const auto m = sampling.mask->fill();
      if (!m.empty()) apply_token_mask(l, m);
    }
    ++device_steps;
    return int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  }
  // Speculative decoding: each token's logits as if it came alone; every verify forward recorded (its start
  // position and tokens).
  bool supports_verify() const override { return verify; }
  void forward_verify(Session& session, std::span<const int32_t> tokens, std::vector<float>& logits) override {
    auto& s = static_cast<TestSession&>(session);
    verified.emplace_back(s.position_, std::vector<int32_t>(tokens.begin(), tokens.end()));
    const int64_t from = s.position_;
    logits.clear();
    std::vector<float> row;
    for (size_t j = 0; j < tokens.size(); ++j) {
      forward(session, tokens.subspan(j, 1), false, row);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    s.kept_from_ = from;
  }
  bool verify = false;
  std::vector<std::pair<int64_t, std::vector<int32_t>>> verified;
  std::map<int64_t, int32_t> boost;  // position after the forward -> id pushed to the top
  int masked_steps = 0, device_steps = 0;

 private:
  Config config_;
  bool device_;
};

struct Fixture {
  explicit Fixture(bool device = false, SpeculativeOptions spec = {}) : runner(int64_t(kTokens.size()), device) {
    runner.verify = spec.mode != SpeculativeMode::off;
    GeneratorOptions o;
    o.speculative = spec;
    o.vocabulary = grammar::TokenVocabulary::from_tokens(kTokens, {kEnd});
    o.extra_end_ids = {kEnd};
    gen = std::make_unique<Generator>(
        runner, TokenTextSource{.bytes = [](int32_t id) { return kTokens[size_t(id)]; }, .is_special = {}}, o);
    session = runner.create_session(512);
  }
  GenerationResult run(GenerationRequest r) {
    if (r.prompt.empty()) r.prompt = {token_of("x"), token_of("hello")};
    return gen->generate(*session, r);
  }
  ScriptedRunner runner;
  std::unique_ptr<Generator> gen;
  std::unique_ptr<Session> session;
};

const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {"name": {"type": "string", "maxLength": 6},
                 "age": {"type": "integer"},
                 "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
  "required": ["name", "age"],
  "additionalProperties": false
})");

// The schema above, checked by hand on a parsed value.
void expect_valid(const std::string& text) {
  const json v = json::parse(text, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << "not JSON: " << text;
  ASSERT_TRUE(v.is_object()) << text;
  ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << text;
  EXPECT_LE(v["name"].get<std::string>().size(), 6u) << text;
  ASSERT_TRUE(v.contains("age") && v["age"].is_number_integer()) << text;
  for (const auto& [k, val] : v.items()) {
    EXPECT_TRUE(k == "name" || k == "age" || k == "tags") << text;
    if (k == "tags") {
      ASSERT_TRUE(val.is_array()) << text;
      EXPECT_LE(val.size(), 3u) << text;
      for (const json& t : val) EXPECT_TRUE(t == "a" || t == "b") << text;
    }
  }
}

TEST(ConstrainedGenerator, GreedyAndSampledOutputsAreValid) {
  Fixture f;
  const auto g = grammar::compile_json_schema(kSchema);
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r;
    r.grammar = g;
    r.max_tokens = 200;
    r.sampling.temperature = i == 0 ? 0.0f : 1.0f;
    r.sampling.seed = uint64_t(1000 + i);
    r.prompt = {token_of("x"), int32_t(1 + i % 20)};
    const GenerationResult res = f.run(r);
    ASSERT_EQ(res.finish, FinishReason::stop) << res.text;
    EXPECT_EQ(res.tokens.back(), kEnd);
    EXPECT_EQ(res.stop_id, kEnd);
    expect_valid(res.text);
  }
}

TEST(ConstrainedGenerator, LogprobsListOnlyAllowedIds) {
  Fixture f;
  const auto g = grammar::compile_json_schema(kSchema);
  const auto vocab = f.gen->vocabulary();
  GenerationRequest r;
  r.grammar = g;
  r.max_tokens = 200;
  r.sampling.temperature = 0.9f;
  r.sampling.seed = 7;
  r.sampling.top_logprobs = 20;
  r.sampling.logit_bias[token_of("hello")] = 50.0f;  // never allowed by the schema: the mask comes after the bias
  // Replays the grammar alongside to know each step's allowed set.
  grammar::Matcher m(g, vocab);
  std::vector<uint32_t> mask(size_t(vocab->mask_words()));
  int events = 0;
  const GenerationResult res = f.gen->generate(*f.session, [&] {
    r.prompt = {token_of("x")};
    return r;
  }(), [&](const TokenEvent& e) {
    if (e.id < 0) return true;
    std::fill(mask.begin(), mask.end(), 0u);
    m.fill_mask(mask);
    EXPECT_TRUE(token_mask_allows(mask, e.id)) << "token " << e.id;
    EXPECT_TRUE(e.has_logprobs);
    EXPECT_TRUE(std::isfinite(e.logprob));
    for (const TokenLogprob& t : e.top_logprobs) EXPECT_TRUE(token_mask_allows(mask, t.id)) << "alternative " << t.id;
    EXPECT_TRUE(m.accept(e.id));
    ++events;
    return true;
  });
  ASSERT_EQ(res.finish, FinishReason::stop);
  EXPECT_GT(events, 3);
  expect_valid(res.text);
}

TEST(ConstrainedGenerator, DeviceSamplingGetsTheMaskAndMatchesTheHostPath) {
  const auto g = grammar::compile_json_schema(kSchema);
  GenerationRequest r;
  r.grammar = g;
  r.max_tokens = 200;
  r.sampling.temperature = 0.0f;
  Fixture host(false), device(true);
  const GenerationResult a = host.run(r), b = device.run(r);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  expect_valid(b.text);
  // Every output token drawn on the device, the first (from the prompt's last chunk) too, each with the mask.
  EXPECT_EQ(device.runner.device_steps, int(b.tokens.size()));
  EXPECT_EQ(device.runner.masked_steps, device.runner.device_steps);
}

// The first token comes from the prompt's last forward call drawn on the device where the request allows it (no
// logits copied, no pass of the host's sampler), and where it does not (log-probabilities, penalties, forced
// tokens), every token is the host's; the tokens are the same either way (greedy).
TEST(ConstrainedGenerator, TheFirstTokenIsDrawnOnTheDeviceToo) {
  GenerationRequest r;
  r.max_tokens = 6;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  Fixture host(false), device(true);
  const GenerationResult a = host.run(r), b = device.run(r);
  ASSERT_EQ(b.tokens.size(), 6u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(device.runner.device_steps, 6);
  GenerationRequest lp = r;
  lp.sampling.top_logprobs = 2;
  Fixture device_lp(true);
  EXPECT_EQ(device_lp.run(lp).tokens, a.tokens);
  EXPECT_EQ(device_lp.runner.device_steps, 0);
  GenerationRequest pen = r;
  pen.sampling.repetition_penalty = 1.0001f;
  Fixture device_pen(true);
  device_pen.run(pen);
  EXPECT_EQ(device_pen.runner.device_steps, 0);
}

TEST(ConstrainedGenerator, MaxTokensTooSmallGivesLengthWithAPrefix) {
  Fixture f;
  GenerationRequest r;
  r.grammar = grammar::compile_json_schema(kSchema);
  r.max_tokens = 3;  // "{\"name\"" at least needs more
  r.sampling.temperature = 0.0f;
  const GenerationResult res = f.run(r);
  EXPECT_EQ(res.finish, FinishReason::length);
  EXPECT_EQ(res.tokens.size(), 3u);
  const size_t start = res.text.find_first_not_of(" \t\n");  // the grammar allows a little leading whitespace
  if (start != std::string::npos) {
    EXPECT_EQ(res.text[start], '{') << res.text;
  }
  EXPECT_TRUE(json::parse(res.text, nullptr, false).is_discarded()) << res.text;  // unfinished, as far as it got
}

TEST(ConstrainedGenerator, ConstraintStartsAfterTheMarker) {
  for (bool device : {false, true}) {
    Fixture f(device);
    // Free tokens first ("hello", "x", ".", then "</think>"), pushed by the runner; then the schema.
    f.runner.boost = {{2, token_of("hello")}, {3, token_of("x")}, {4, token_of(".")}, {5, token_of("</think>")}};
    GenerationRequest r;
    r.grammar = grammar::compile_json_schema(kSchema);
    r.grammar_start_after = "</think>";
    r.max_tokens = 200;
    r.sampling.temperature = 0.0f;
    const GenerationResult res = f.run(r);
    ASSERT_EQ(res.finish, FinishReason::stop) << res.text;
    const std::string head = "hellox.</think>";
    ASSERT_EQ(res.text.substr(0, head.size()), head) << res.text;
    expect_valid(res.text.substr(head.size()));
  }
}

// The model ends inside its reasoning ("hello", then the end id) while the constrained answer is still due: the
// marker's tokens take the end id's place and the schema's answer follows; without them (grammar_start_tokens
// empty) the end id ends the output as before.
TEST(ConstrainedGenerator, EndIdBeforeTheMarkerBecomesTheMarker) {
  for (bool device : {false, true}) {
    for (bool with_marker_tokens : {true, false}) {
      Fixture f(device);
      f.runner.boost = {{2, token_of("hello")}, {3, kEnd}};
      GenerationRequest r;
      r.grammar = grammar::compile_json_schema(kSchema);
      r.grammar_start_after = "</think>";
      if (with_marker_tokens) r.grammar_start_tokens = {token_of("</think>")};
      r.max_tokens = 200;
      r.sampling.temperature = 0.0f;
      const GenerationResult res = f.run(r);
      ASSERT_EQ(res.finish, FinishReason::stop) << res.text;
      if (!with_marker_tokens) {
        EXPECT_EQ(res.text, "hello");
        EXPECT_EQ(res.tokens.back(), kEnd);
        continue;
      }
      const std::string head = "hello</think>";
      ASSERT_EQ(res.text.substr(0, head.size()), head) << res.text;
      expect_valid(res.text.substr(head.size()));
    }
  }
}

TEST(ConstrainedGenerator, EndIdStopsEvenWithIgnoreEos) {
  Fixture f;
  GenerationRequest r;
  r.grammar = grammar::compile_json_object();
  r.max_tokens = 200;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  const GenerationResult res = f.run(r);
  ASSERT_EQ(res.finish, FinishReason::stop);
  EXPECT_EQ(res.tokens.back(), kEnd);
  const json v = json::parse(res.text, nullptr, false);
  EXPECT_TRUE(v.is_object()) << res.text;
}

TEST(ConstrainedGenerator, ForcedTokenOutsideTheGrammarIsAnError) {
  Fixture f;
  GenerationRequest r;
  r.grammar = grammar::compile_json_object();
  r.forced_tokens = {token_of("hello")};
  EXPECT_THROW(f.run(r), Error);
}

// Constrained and free requests in one batch (the server's scheduler: one forward_batch per step over several
// GenerationRuns): each output is what the request gives alone, with the host sampler and with the device's.
TEST(ConstrainedGenerator, BatchedWithFreeRequestsGivesTheOutputsAlone) {
  for (bool device : {false, true}) {
    const auto g = grammar::compile_json_schema(kSchema);
    std::vector<GenerationRequest> requests(4);
    for (size_t i = 0; i < requests.size(); ++i) {
      GenerationRequest& r = requests[i];
      if (i % 2 == 0) r.grammar = g;
      r.max_tokens = 60;
      r.sampling.temperature = i < 2 ? 0.0f : 1.0f;
      r.sampling.seed = uint64_t(77 + i);
      r.prompt = {token_of("x"), int32_t(3 + i)};
    }
    std::vector<GenerationResult> alone;
    for (const GenerationRequest& r : requests) {
      Fixture f(device);
      alone.push_back(f.run(r));
    }
    Fixture f(device);
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<std::unique_ptr<GenerationRun>> runs;
    for (const GenerationRequest& r : requests) {
      sessions.push_back(f.runner.create_session(512));
      runs.push_back(std::make_unique<GenerationRun>(*f.gen, *sessions.back(), r, nullptr));
    }
    for (int step = 0; step < 1000; ++step) {
      std::vector<BatchEntry> batch;
      std::vector<GenerationRun*> owners;
      for (auto& run : runs) {
        BatchEntry e;
        if (!run->finished() && run->next_step(e, 64)) {
          batch.push_back(e);
          owners.push_back(run.get());
        }
      }
      if (batch.empty()) break;
      f.runner.forward_batch(batch);
      for (size_t i = 0; i < batch.size(); ++i) owners[i]->step_done(batch[i]);
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      ASSERT_TRUE(runs[i]->finished());
      const GenerationResult& r = runs[i]->result();
      EXPECT_GE(r.tokens.size(), 3u) << i;
      EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i << ", device " << device;
      EXPECT_EQ(r.text, alone[i].text) << i;
      if (requests[i].grammar && r.finish == FinishReason::stop) expect_valid(r.text);
    }
  }
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// Drafts under a grammar: the output is the same with drafts as without (greedy and seeded sampling; drafts from
// the n-gram index and a prediction that goes wrong), and a drafted token the grammar refuses where it would be fed
// is never verified (the drafts are cut before it).
TEST(ConstrainedGenerator, DraftsGiveTheSameOutputAndStopBeforeARefusedToken) {
  const auto g = grammar::compile_json_schema(kSchema);
  int64_t accepted = 0;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.grammar = g;
    r.max_tokens = 200;
    r.sampling.temperature = i < 4 ? 0.0f : 1.0f;
    r.sampling.seed = uint64_t(500 + i);
    r.prompt = {token_of("x"), int32_t(1 + i % 20)};
    Fixture plain;
    const GenerationResult a = plain.run(r);
    ASSERT_EQ(a.finish, FinishReason::stop) << a.text;
    ASSERT_GE(a.tokens.size(), 6u);

    // The prediction: the plain output with token k replaced by one the grammar refuses there.
    const size_t k = a.tokens.size() / 2;
    grammar::Matcher m(g, plain.gen->vocabulary());
    for (size_t j = 0; j < k; ++j) ASSERT_TRUE(m.accept(a.tokens[j]));
    int32_t refused = -1;
    for (int32_t id = 1; id < int32_t(kTokens.size()) && refused < 0; ++id) {
      grammar::Matcher probe = m.clone();
      if (!probe.accept(id)) refused = id;
    }
    ASSERT_GE(refused, 0);
    r.prediction = a.tokens;
    r.prediction[k] = refused;

    SpeculativeOptions spec;
    spec.mode = SpeculativeMode::ngram;
    Fixture drafted(false, spec);
    const GenerationResult b = drafted.run(r);
    EXPECT_EQ(a.tokens, b.tokens) << i;
    EXPECT_EQ(a.text, b.text) << i;
    EXPECT_GT(b.draft_tokens, 0) << i;
    accepted += b.accepted_draft_tokens;
    const int64_t at = int64_t(r.prompt.size()) + int64_t(k);  // where the refused token would be fed
    for (const auto& [pos, tokens] : drafted.runner.verified)
      for (size_t j = 0; j < tokens.size(); ++j)
        EXPECT_FALSE(pos + int64_t(j) == at && tokens[j] == refused) << "a refused draft was verified (" << i << ")";
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace tern
