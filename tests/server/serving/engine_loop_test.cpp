// The engine loop's answers to a generation that fails: a fault of the device or of the engine (tern::InternalError,
// as a CUDA error or a broken invariant throws, or any other exception) is a 500 internal_error, printed on stderr
// with its source location; a request the generator refuses is a 400. The loop serves the next request afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "../../engine/eval_fake_runner.h"
#include "core/check.h"
#include "server/serving/engine_loop.h"

namespace tern::server {
namespace {

constexpr int64_t kVocab = 64, kVocabReal = 40;

// A backend that fails on a chosen forward call (the prefill is call 1), with what the CUDA check path throws.
class FailingRunner : public tern::testing::FakeRunner {
 public:
  enum class Fault { none, internal, other, bad_sample };
  FailingRunner() : FakeRunner(kVocab, kVocabReal, /*device_sampling=*/true) {}

  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>& logits) override {
    if (++calls == fail_on_call) {
      if (fault == Fault::internal)  // as check_cuda words it, with the location fail_at adds
        throw InternalError("CUDA error in attention: cudaErrorIllegalAddress (an illegal memory access was "
                            "encountered) [src/cuda/attention.cu:321]");
      if (fault == Fault::other) throw std::runtime_error("something unexpected");
    }
    FakeRunner::forward(session, tokens, all_logits, logits);
  }
  std::optional<int32_t> forward_sample(Session& session, std::span<const int32_t> tokens,
                                        const DeviceSampling& sampling) override {
    const std::optional<int32_t> id = FakeRunner::forward_sample(session, tokens, sampling);
    if (fault == Fault::bad_sample) return int32_t(kVocab + 7);  // a device sampler gone wrong
    return id;
  }

  Fault fault = Fault::none;
  int fail_on_call = 2;  // the first decode step
  int calls = 0;
};

TokenTextSource letters() {
  return {.bytes = [](int32_t id) { return std::string(1, char('A' + id % 26)); }, .is_special = {}};
}

GenerationRequest request(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  return r;
}

// Submits the request and returns the task's last event (done or error).
EngineEvent run(EngineLoop& loop, GenerationRequest r) {
  auto task = std::make_shared<GenerationTask>();
  task->id = "chatcmpl-test";
  task->request = std::move(r);
  task->enqueued = std::chrono::steady_clock::now();
  EXPECT_TRUE(loop.submit(task));
  for (;;) {
    std::optional<EngineEvent> e = task->events.pop(std::chrono::seconds(30));
    if (!e) {
      ADD_FAILURE() << "no end event within 30 s";
      return {};
    }
    if (e->kind != EngineEvent::Kind::token) return *e;
  }
}

struct LoopFixture {
  FailingRunner runner;
  Generator generator{runner, letters()};
  Metrics metrics;
  EngineLoop loop{generator, 64, 4, metrics};
};

void expect_internal(const EngineEvent& e, const std::string& says) {
  ASSERT_EQ(e.kind, EngineEvent::Kind::error);
  EXPECT_EQ(e.error.status, 500);
  EXPECT_EQ(e.error.type, "server_error");
  EXPECT_EQ(e.error.code, "internal_error");
  EXPECT_NE(e.error.message.find(says), std::string::npos) << e.error.message;
  EXPECT_EQ(e.error.message.find("[src/"), std::string::npos) << "the client's message has no source location";
}

TEST(EngineLoop, DeviceFaultIs500AndLogged) {
  LoopFixture f;
  f.runner.fault = FailingRunner::Fault::internal;
  ::testing::internal::CaptureStderr();
  const EngineEvent e = run(f.loop, request({3, 4, 5}, 8));
  const std::string log = ::testing::internal::GetCapturedStderr();
  expect_internal(e, "illegal memory access");
  EXPECT_NE(log.find("internal error in request chatcmpl-test"), std::string::npos) << log;
  EXPECT_NE(log.find("[src/cuda/attention.cu:321]"), std::string::npos) << "the log keeps the location: " << log;
  // The next request runs (its session state was dropped).
  f.runner.fault = FailingRunner::Fault::none;
  const EngineEvent next = run(f.loop, request({3, 4, 5}, 4));
  ASSERT_EQ(next.kind, EngineEvent::Kind::done) << next.error.message;
  EXPECT_EQ(next.result.completion_tokens, 4);
}

TEST(EngineLoop, BrokenEngineInvariantIs500) {
  LoopFixture f;
  f.runner.fault = FailingRunner::Fault::bad_sample;  // the generator's check of the device's sample fails
  ::testing::internal::CaptureStderr();
  const EngineEvent e = run(f.loop, request({3, 4}, 8));
  const std::string log = ::testing::internal::GetCapturedStderr();
  expect_internal(e, "the backend sampled token 71, outside the vocabulary");
  EXPECT_NE(log.find("internal error in request"), std::string::npos) << log;
}

TEST(EngineLoop, UnexpectedExceptionIs500) {
  LoopFixture f;
  f.runner.fault = FailingRunner::Fault::other;
  ::testing::internal::CaptureStderr();
  const EngineEvent e = run(f.loop, request({3, 4}, 8));
  ::testing::internal::GetCapturedStderr();
  expect_internal(e, "something unexpected");
}

TEST(EngineLoop, RefusedRequestIs400) {
  LoopFixture f;
  ::testing::internal::CaptureStderr();
  const EngineEvent outside = run(f.loop, request({3, int32_t(kVocabReal) + 2}, 8));
  const EngineEvent negative = run(f.loop, request({3, 4}, -2));
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (const EngineEvent* e : {&outside, &negative}) {
    ASSERT_EQ(e->kind, EngineEvent::Kind::error);
    EXPECT_EQ(e->error.status, 400);
    EXPECT_EQ(e->error.type, "invalid_request_error");
    EXPECT_EQ(e->error.message.find("[src/"), std::string::npos) << e->error.message;
  }
  EXPECT_NE(outside.error.message.find("prompt token 42 is outside the vocabulary"), std::string::npos)
      << outside.error.message;
  EXPECT_NE(negative.error.message.find("max_tokens must be >= 0"), std::string::npos) << negative.error.message;
  EXPECT_EQ(log.find("internal error"), std::string::npos) << "a client's mistake is not logged as a fault: " << log;
}

}  // namespace
}  // namespace tern::server
