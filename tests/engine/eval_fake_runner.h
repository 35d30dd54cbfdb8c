// A ModelRunner for the bench and eval tests: logits are a fixed function of (position, token), so a test can
// compute them independently. Padding ids (>= vocab_real) get -inf, as the interface says.
#pragma once

#include <cmath>
#include <limits>

#include "core/check.h"
#include "model/runner.h"

namespace tern::testing {

class FakeSession : public Session {
 public:
  explicit FakeSession(int64_t capacity) : capacity_(capacity) {}
  int64_t position() const override { return position_; }
  int64_t capacity() const override { return capacity_; }
  void reset() override { position_ = 0; }
  int64_t position_ = 0;
  int64_t capacity_;
};

class FakeRunner : public ModelRunner {
 public:
  FakeRunner(int64_t vocab, int64_t vocab_real, bool device_sampling)
      : vocab_real_(vocab_real), device_sampling_(device_sampling) {
    config_.vocab_size = vocab;
  }
  static float logit(int64_t position, int32_t token, int64_t id) {
    return 3.0f * float(std::sin(0.37 * double(id) * double(position + 1) + 0.11 * double(token)));
  }
  std::string backend_name() const override { return "fake"; }
  const Config& config() const override { return config_; }
  int64_t vocab_real() const override { return vocab_real_; }
  std::unique_ptr<Session> create_session(int64_t max_context) override {
    ++sessions_created;
    return std::make_unique<FakeSession>(max_context);
  }
  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>& logits) override {
    auto& s = static_cast<FakeSession&>(session);
    TERN_CHECK(s.position_ + int64_t(tokens.size()) <= s.capacity_, "fake session full");
    const int64_t V = config_.vocab_size, rows = all_logits ? int64_t(tokens.size()) : 1;
    logits.assign(size_t(rows * V), -std::numeric_limits<float>::infinity());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = all_logits ? r : int64_t(tokens.size()) - 1;
      for (int64_t v = 0; v < vocab_real_; ++v) logits[size_t(r * V + v)] = logit(s.position_ + i, tokens[i], v);
    }
    s.position_ += int64_t(tokens.size());
    forward_tokens += int64_t(tokens.size());
    ++forward_calls;
  }
  std::optional<int32_t> forward_sample(Session& session, std::span<const int32_t> tokens,
                                        const DeviceSampling& sampling) override {
    if (!device_sampling_) return std::nullopt;
    std::vector<float> l;
    forward(session, tokens, false, l);
    ++sample_calls;
    return int32_t(1);
  }

  Config config_;
  int64_t vocab_real_;
  bool device_sampling_;
  int64_t forward_tokens = 0, forward_calls = 0, sample_calls = 0, sessions_created = 0;
};

}  // namespace tern::testing
