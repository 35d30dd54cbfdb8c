// The engine loop's answers to a generation that fails: a fault of the device or of the engine (tern::InternalError,
// as a CUDA error or a broken invariant throws, or any other exception) is a 500 internal_error, printed on stderr
// with its source location; a request the generator refuses is a 400. The loop serves the next request afterwards.
// Its scheduler: parallel requests each get exactly the answer they get alone, batched in one step; a long prompt
// is read in chunks between the running requests' tokens; a cancelled request frees its slot; the sessions are
// allocated at start (or start-up refuses).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <stdexcept>
#include <string>

#include "../../engine/eval_fake_runner.h"
#include "core/check.h"
#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
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

// Records each step's batch (the tokens of each entry) and runs it as the base class does.
class RecordingRunner : public tern::testing::FakeRunner {
 public:
  explicit RecordingRunner(bool device_sampling = false) : FakeRunner(kVocab, kVocabReal, device_sampling) {}
  void forward_batch(std::span<BatchEntry> batch) override {
    {
      std::unique_lock lock(gate_mutex);
      gate.wait(lock, [&] { return !held; });
    }
    {
      std::lock_guard lock(mutex);
      std::vector<std::pair<const Session*, int64_t>> step;
      for (const BatchEntry& e : batch) step.emplace_back(e.session, int64_t(e.tokens.size()));
      steps.push_back(std::move(step));
    }
    if (step_delay.count() > 0) std::this_thread::sleep_for(step_delay);
    ModelRunner::forward_batch(batch);
  }
  std::unique_ptr<Session> create_session(int64_t max_context) override {
    if (max_sessions >= 0 && sessions_created >= max_sessions)
      throw InternalError("CUDA error in create_session: cudaErrorMemoryAllocation (out of memory)");
    return FakeRunner::create_session(max_context);
  }
  int64_t session_bytes(int64_t max_context) const override { return bytes_per_token * max_context; }
  int64_t free_memory_bytes() const override { return free_bytes; }
  int64_t bytes_per_token = 0, free_bytes = -1;  // the memory the planner sees (0 / -1: unknown)
  std::mutex mutex;
  std::vector<std::vector<std::pair<const Session*, int64_t>>> steps;
  std::chrono::milliseconds step_delay{0};
  int64_t max_sessions = -1;
  // While held, every step waits: a test queues its requests first, so that which of them share a step does not
  // depend on how fast the engine thread runs beside the test's.
  void hold() {
    std::lock_guard lock(gate_mutex);
    held = true;
  }
  void release() {
    {
      std::lock_guard lock(gate_mutex);
      held = false;
    }
    gate.notify_all();
  }

 private:
  std::mutex gate_mutex;
  std::condition_variable gate;
  bool held = false;
};

std::shared_ptr<GenerationTask> submit(EngineLoop& loop, GenerationRequest r, const std::string& id) {
  auto task = std::make_shared<GenerationTask>();
  task->id = id;
  task->request = std::move(r);
  EXPECT_TRUE(loop.submit(task));
  return task;
}

// Waits for the task's end; the token events it saw before are appended to `tokens`.
EngineEvent wait_end(GenerationTask& task, std::vector<TokenEvent>* tokens = nullptr) {
  for (;;) {
    std::optional<EngineEvent> e = task.events.pop(std::chrono::seconds(30));
    if (!e) {
      ADD_FAILURE() << "no end event within 30 s";
      return {};
    }
    if (e->kind != EngineEvent::Kind::token) return *e;
    if (tokens) tokens->push_back(e->token);
  }
}

GenerationRequest sampled(std::vector<int32_t> prompt, int64_t max_tokens, uint64_t seed) {
  GenerationRequest r = request(std::move(prompt), max_tokens);
  r.sampling.temperature = 0.9f;
  r.sampling.top_k = 20;
  r.sampling.seed = seed;
  return r;
}

TEST(EngineLoopScheduler, ParallelRequestsGetTheAnswersTheyGetAlone) {
  for (bool device_sampling : {false, true}) {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 8; ++i) {
      std::vector<int32_t> prompt;
      for (int j = 0; j <= 3 * i; ++j) prompt.push_back(int32_t((7 * i + 3 * j + 2) % kVocabReal));
      requests.push_back(i % 2 ? sampled(prompt, 5 + 3 * i, 1000 + uint64_t(i)) : request(prompt, 5 + 3 * i));
    }
    // Alone, one after another, on a runner of their own.
    std::vector<GenerationResult> alone;
    {
      tern::testing::FakeRunner runner(kVocab, kVocabReal, device_sampling);
      Generator gen(runner, letters());
      for (const GenerationRequest& r : requests) {
        auto session = runner.create_session(128);
        alone.push_back(gen.generate(*session, r));
      }
    }
    RecordingRunner runner(device_sampling);
    Generator generator(runner, letters());
    Metrics metrics;
    EngineLoop loop(generator, 128, 16, metrics, {}, SchedulerOptions{.parallel = 4, .step_tokens = 5});
    std::vector<std::shared_ptr<GenerationTask>> tasks;
    runner.hold();  // all eight queued before the first step runs (else a fast engine thread finishes one alone)
    for (size_t i = 0; i < requests.size(); ++i) tasks.push_back(submit(loop, requests[i], "t" + std::to_string(i)));
    runner.release();
    for (size_t i = 0; i < tasks.size(); ++i) {
      std::vector<TokenEvent> events;
      const EngineEvent e = wait_end(*tasks[i], &events);
      ASSERT_EQ(e.kind, EngineEvent::Kind::done) << e.error.message;
      EXPECT_EQ(e.result.tokens, alone[i].tokens) << "request " << i << ", device sampling " << device_sampling;
      EXPECT_EQ(e.result.text, alone[i].text) << i;
      EXPECT_EQ(e.result.finish, alone[i].finish) << i;
      EXPECT_EQ(int64_t(events.size()), e.result.completion_tokens) << i;
    }
    std::lock_guard lock(runner.mutex);
    size_t widest = 0;
    for (const auto& step : runner.steps) widest = std::max(widest, step.size());
    EXPECT_EQ(widest, 4u) << "up to --parallel requests share a step";
    EXPECT_NE(metrics.render_prometheus().find("tern_engine_batch_size_bucket{le=\"4\"}"), std::string::npos);
  }
}

TEST(EngineLoopScheduler, LongPromptIsReadBetweenTheTokensOfRunningRequests) {
  RecordingRunner runner;
  runner.step_delay = std::chrono::milliseconds(2);
  Generator generator(runner, letters());
  Metrics metrics;
  EngineLoop loop(generator, 256, 16, metrics, {}, SchedulerOptions{.parallel = 2, .step_tokens = 8});
  auto a = submit(loop, request({3, 4, 5}, 60), "a");
  std::optional<EngineEvent> first = a->events.pop(std::chrono::seconds(30));
  ASSERT_TRUE(first && first->kind == EngineEvent::Kind::token);  // a decodes now
  std::vector<int32_t> long_prompt(100);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = int32_t((5 * i + 1) % kVocabReal);
  auto b = submit(loop, request(long_prompt, 3), "b");
  const EngineEvent eb = wait_end(*b);
  const EngineEvent ea = wait_end(*a);
  ASSERT_EQ(ea.kind, EngineEvent::Kind::done);
  ASSERT_EQ(eb.kind, EngineEvent::Kind::done);
  EXPECT_EQ(ea.result.completion_tokens, 60);
  // Every step that read b's prompt while a decoded carried a's token too, and at most 8 prompt tokens.
  std::lock_guard lock(runner.mutex);
  int prompt_steps = 0;
  for (const auto& step : runner.steps) {
    if (step.size() != 2) continue;
    int64_t most = 0;
    for (const auto& [session, n] : step) most = std::max(most, n);
    if (most > 1) {
      ++prompt_steps;
      EXPECT_LE(most, 8);
    }
  }
  EXPECT_GE(prompt_steps, 100 / 8) << "b's prompt was read in chunks beside a's tokens";
}

// What a task that asked for progress saw, in order: its queued places, its prompt reports, its tokens, its end.
struct ProgressSeen {
  std::vector<int64_t> queued_ahead;
  std::vector<PromptProgress> prompt;
  int64_t tokens = 0;
  bool progress_after_token = false, queued_after_prompt = false;
  EngineEvent end;
};

ProgressSeen watch(GenerationTask& task) {
  ProgressSeen seen;
  for (;;) {
    std::optional<EngineEvent> e = task.events.pop(std::chrono::seconds(30));
    if (!e) {
      ADD_FAILURE() << "no end event within 30 s";
      return seen;
    }
    switch (e->kind) {
      case EngineEvent::Kind::progress:
        if (seen.tokens > 0) seen.progress_after_token = true;
        if (e->progress.queued) {
          if (!seen.prompt.empty()) seen.queued_after_prompt = true;
          seen.queued_ahead.push_back(e->progress.queued_ahead);
        } else {
          seen.prompt.push_back(e->progress.prompt);
        }
        break;
      case EngineEvent::Kind::token:
        ++seen.tokens;
        break;
      default:
        seen.end = *e;
        return seen;
    }
  }
}

// One sequence (--parallel 1), four requests that asked for progress: each waiting one is told its place as it moves
// up (2, 1, 0), then each prompt's reading at every chunk (--step-tokens, or the generator's chunk alone) from 0 to
// the whole prompt, all before its first token.
TEST(EngineLoopScheduler, ProgressTellsThePlaceInTheQueueThenThePromptsChunks) {
  RecordingRunner runner;
  GeneratorOptions options;
  options.prefill_chunk = 8;  // a prompt read alone goes in chunks of 8
  Generator generator(runner, letters(), options);
  Metrics metrics;
  EngineLoop loop(generator, 128, 16, metrics, {}, SchedulerOptions{.parallel = 1, .step_tokens = 8});
  std::vector<std::shared_ptr<GenerationTask>> tasks;
  runner.hold();  // the first one's first step waits until all four are queued
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt(size_t(20 + 3 * i));
    for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = int32_t((3 * j + size_t(i) + 2) % kVocabReal);
    auto task = std::make_shared<GenerationTask>();
    task->id = "p" + std::to_string(i);
    task->request = request(prompt, 5);
    task->report_progress = true;
    ASSERT_TRUE(loop.submit(task));
    tasks.push_back(task);
  }
  runner.release();
  for (int i = 0; i < 4; ++i) {
    const ProgressSeen seen = watch(*tasks[size_t(i)]);
    ASSERT_EQ(seen.end.kind, EngineEvent::Kind::done) << seen.end.error.message;
    EXPECT_EQ(seen.tokens, 5);
    EXPECT_FALSE(seen.progress_after_token) << "task " << i;
    EXPECT_FALSE(seen.queued_after_prompt) << "task " << i;
    // The first ran at once; task i waited behind i - 1 others (i - 1 ahead of it in the queue, then fewer).
    std::vector<int64_t> places;
    for (int64_t ahead = i - 1; ahead >= 0; --ahead) places.push_back(ahead);
    EXPECT_EQ(seen.queued_ahead, places) << "task " << i;
    const int64_t total = 20 + 3 * i;
    ASSERT_FALSE(seen.prompt.empty());
    EXPECT_EQ(seen.prompt.front().processed, 0);
    EXPECT_EQ(seen.prompt.back().processed, total) << "the last report has the whole prompt";
    EXPECT_EQ(int64_t(seen.prompt.size()), 1 + (total + 7) / 8) << "one report as it starts, one per chunk";
    for (size_t k = 0; k < seen.prompt.size(); ++k) {
      EXPECT_EQ(seen.prompt[k].total, total);
      EXPECT_EQ(seen.prompt[k].cached, 0);
      if (k > 0) {
        EXPECT_GT(seen.prompt[k].processed, seen.prompt[k - 1].processed);
        EXPECT_LE(seen.prompt[k].processed - seen.prompt[k - 1].processed, 8);
        EXPECT_GE(seen.prompt[k].elapsed_s, seen.prompt[k - 1].elapsed_s);
      }
    }
  }
}

// Without report_progress (every client that did not ask), a task gets only its tokens and its end.
TEST(EngineLoopScheduler, NoProgressUnlessAsked) {
  RecordingRunner runner;
  GeneratorOptions options;
  options.prefill_chunk = 4;
  Generator generator(runner, letters(), options);
  Metrics metrics;
  EngineLoop loop(generator, 128, 16, metrics, {}, SchedulerOptions{.parallel = 1, .step_tokens = 4});
  runner.hold();
  auto a = submit(loop, request(std::vector<int32_t>(30, 5), 3), "a");
  auto b = submit(loop, request(std::vector<int32_t>(30, 6), 3), "b");  // waits behind a
  runner.release();
  for (auto* t : {a.get(), b.get()}) {
    const ProgressSeen seen = watch(*t);
    ASSERT_EQ(seen.end.kind, EngineEvent::Kind::done) << seen.end.error.message;
    EXPECT_EQ(seen.tokens, 3);
    EXPECT_TRUE(seen.queued_ahead.empty());
    EXPECT_TRUE(seen.prompt.empty());
  }
}

TEST(EngineLoopScheduler, CancelledRequestFreesItsSlot) {
  RecordingRunner runner;
  runner.step_delay = std::chrono::milliseconds(1);
  Generator generator(runner, letters());
  Metrics metrics;
  EngineLoop loop(generator, 4096, 16, metrics, {}, SchedulerOptions{.parallel = 1, .step_tokens = 64});
  auto a = submit(loop, request({3, 4}, -1), "a");  // runs until the context is full unless cancelled
  auto b = submit(loop, request({5, 6}, 4), "b");   // waits for a's slot
  std::optional<EngineEvent> first = a->events.pop(std::chrono::seconds(30));
  ASSERT_TRUE(first && first->kind == EngineEvent::Kind::token);
  a->cancel = true;
  const EngineEvent ea = wait_end(*a);
  ASSERT_EQ(ea.kind, EngineEvent::Kind::done);
  EXPECT_EQ(ea.result.finish, FinishReason::cancelled);
  EXPECT_LT(ea.result.completion_tokens, 4000);
  const EngineEvent eb = wait_end(*b);
  ASSERT_EQ(eb.kind, EngineEvent::Kind::done) << eb.error.message;
  EXPECT_EQ(eb.result.completion_tokens, 4);
}

TEST(EngineLoopScheduler, SessionsAreTakenAtStart) {
  {
    RecordingRunner runner;
    Generator generator(runner, letters());
    Metrics metrics;
    EngineLoop loop(generator, 64, 4, metrics, {}, SchedulerOptions{.parallel = 3, .step_tokens = 64});
    EXPECT_EQ(runner.sessions_created, 3);
  }
  RecordingRunner runner;
  runner.max_sessions = 2;  // the third session does not fit
  Generator generator(runner, letters());
  Metrics metrics;
  try {
    EngineLoop loop(generator, 64, 4, metrics, {}, SchedulerOptions{.parallel = 3, .step_tokens = 64});
    ADD_FAILURE() << "start-up should refuse";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("3 sequences of 64 tokens"), std::string::npos) << what;
    EXPECT_NE(what.find("--parallel"), std::string::npos) << what;
    EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
  }
}

TEST(EngineLoopScheduler, MemoryPlanChoosesOrRefusesTheParallelSequences) {
  const auto loop_with = [](RecordingRunner& runner, int parallel) {
    runner.bytes_per_token = 1000000;  // 1 GB per session of 1,000 tokens
    runner.free_bytes = 2500000000;    // 2.5 GB free: two fit
    Generator generator(runner, letters());
    Metrics metrics;
    EngineLoop loop(generator, 1000, 4, metrics, {}, SchedulerOptions{.parallel = parallel, .step_tokens = 64});
    return loop.parallel();
  };
  {
    RecordingRunner runner;
    EXPECT_EQ(loop_with(runner, 0), 2) << "left to the server: what fits, at most the default";
    EXPECT_EQ(runner.sessions_created, 2);
  }
  {
    RecordingRunner runner;
    EXPECT_EQ(loop_with(runner, 2), 2);
  }
  RecordingRunner runner;
  try {
    loop_with(runner, 3);
    ADD_FAILURE() << "three sessions do not fit";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* says : {"3 sequences of 1000 tokens need 3 GB (1 GB each) but 2.5 GB is free", "--parallel 2 fits",
                             "--ctx-size 833 fits 3 sequences"})
      EXPECT_NE(what.find(says), std::string::npos) << what;
  }
  EXPECT_EQ(runner.sessions_created, 0) << "refused before any session is made";
}

// The CPU runner (the demo model's architecture) with the CUDA runner's rule for chunks in pieces of layers: one
// session at a time may hold a chunk part way, and runs_layers_apart says no to the others meanwhile.
class OneSlotRunner final : public ModelRunner {
 public:
  explicit OneSlotRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  std::string backend_name() const override { return inner_->backend_name(); }
  const Config& config() const override { return inner_->config(); }
  int64_t vocab_real() const override { return inner_->vocab_real(); }
  int64_t preferred_prefill_chunk() const override { return inner_->preferred_prefill_chunk(); }
  std::unique_ptr<Session> create_session(int64_t max_context) override { return inner_->create_session(max_context); }
  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>& logits) override {
    inner_->forward(session, tokens, all_logits, logits);
  }
  bool runs_layers_apart(const Session& session, int64_t tokens) const override {
    return free_for(session) && inner_->runs_layers_apart(session, tokens);
  }
  void forward_layers(Session& session, std::span<const int32_t> tokens, int layers) override {
    TERN_CHECK(free_for(session), "the one part-way chunk is another session's");
    inner_->forward_layers(session, tokens, layers);
    holder_ = &session;
    ++pieces;
  }
  int pieces = 0;

 private:
  bool free_for(const Session& session) const {
    if (holder_ && holder_->layers_pending() == 0) holder_ = nullptr;  // finished, dropped or reset since
    return holder_ == nullptr || holder_ == &session;
  }
  std::unique_ptr<ModelRunner> inner_;
  mutable const Session* holder_ = nullptr;
};

// Two long prompts arrive while a request decodes, on a runner that holds one chunk part way at a time: one of them
// reads in pieces while the other waits (or reads whole chunks), never both starting pieces in one step, and every
// request gets the tokens it gets alone.
TEST(EngineLoopScheduler, OnePromptAtATimeReadsInPiecesOnARunnerWithOneSlot) {
  DemoModelOptions o;
  o.vocab_real = 512;
  o.eos_json = "[500]";
  o.mtp = false;
  OneSlotRunner runner(cpu_runner_create(demo_model_build(o)));
  GeneratorOptions g;
  g.prefill_chunk = 64;
  Generator generator(runner, letters(), g);
  std::vector<GenerationRequest> requests = {request({3, 4, 5}, 80), request({}, 4), request({}, 4)};
  for (int i = 0; i < 150; ++i) requests[1].prompt.push_back(int32_t((7 * i + 1) % 480));
  for (int i = 0; i < 200; ++i) requests[2].prompt.push_back(int32_t((11 * i + 5) % 480));
  for (GenerationRequest& r : requests) r.ignore_eos = true;
  std::vector<GenerationResult> alone;
  for (const GenerationRequest& r : requests) {
    auto session = runner.create_session(1024);
    alone.push_back(generator.generate(*session, r));
  }
  ASSERT_EQ(runner.pieces, 0);
  Metrics metrics;
  EngineLoop loop(generator, 1024, 16, metrics, {}, SchedulerOptions{.parallel = 3, .step_tokens = 16});
  auto a = submit(loop, requests[0], "a");
  std::optional<EngineEvent> first = a->events.pop(std::chrono::seconds(30));
  ASSERT_TRUE(first && first->kind == EngineEvent::Kind::token);  // a decodes now
  auto b = submit(loop, requests[1], "b"), c = submit(loop, requests[2], "c");
  const EngineEvent eb = wait_end(*b), ec = wait_end(*c), ea = wait_end(*a);
  ASSERT_EQ(eb.kind, EngineEvent::Kind::done) << eb.error.message;
  ASSERT_EQ(ec.kind, EngineEvent::Kind::done) << ec.error.message;
  ASSERT_EQ(ea.kind, EngineEvent::Kind::done) << ea.error.message;
  EXPECT_EQ(eb.result.tokens, alone[1].tokens);
  EXPECT_EQ(ec.result.tokens, alone[2].tokens);
  EXPECT_EQ(ea.result.tokens, alone[0].tokens);
  EXPECT_GT(runner.pieces, 4) << "the long prompts were read in pieces";
}

}  // namespace
}  // namespace tern::server
