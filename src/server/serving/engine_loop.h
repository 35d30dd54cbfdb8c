// The one thread that owns the model: a scheduler that runs up to `parallel` tasks at once. Each step it admits
// waiting tasks in arrival order while a sequence is free, gives each running task its next forward (one token for
// a decoding task; a chunk of the prompt for one still prefilling, within a per-step budget of prompt tokens while
// others decode, so that a long prompt does not stall the running streams), runs them all in one
// ModelRunner::forward_batch and hands each its output (engine/generation_run.h). A task runs in the session the
// prefix cache gives it (engine/prefix_cache.h: the conversation's own session, restored to the longest snapshot its
// prompt reuses) and leaves at a token boundary: finished, cancelled (its slot is free for the next step) or failed.
// A task that asked for progress (GenerationTask::report_progress) also gets, before its first token, its place in
// the queue while it waits (each time it changes) and its prefill's counts at each chunk of its prompt.
// Handlers never touch the runner, the sessions or the generator.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/generation_run.h"
#include "engine/generator.h"
#include "engine/prefix_cache.h"
#include "server/serving/metrics.h"
#include "server/serving/request_queue.h"
#include "server/serving/server_options.h"

namespace tern::server {

class EngineLoop {
 public:
  // `generator` and `runner` must outlive the loop. context: each session's capacity in tokens. The `parallel`
  // sessions are created here (their memory is taken at start): throws tern::Error, with the memory needed and
  // free and what would fit, when they do not. scheduler.parallel 0: the default, fewer when memory is short.
  EngineLoop(Generator& generator, int64_t context, size_t max_queue, Metrics& metrics, PrefixCacheOptions cache = {},
             SchedulerOptions scheduler = {});
  ~EngineLoop();  // stops the thread after the running tasks; waiting tasks get an error event
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues the task. False when the queue is full (the caller answers 503); the task is then untouched.
  bool submit(const std::shared_ptr<GenerationTask>& task);
  // Takes a waiting task out of the queue (its client left). False when it already started or finished.
  bool withdraw(const std::shared_ptr<GenerationTask>& task);

  int64_t context() const { return context_; }
  int parallel() const { return scheduler_.parallel; }
  size_t waiting() const { return queue_.waiting(); }
  size_t max_queue() const { return queue_.max_waiting(); }

 private:
  struct Running {
    std::shared_ptr<GenerationTask> task;
    Session* session = nullptr;
    std::unique_ptr<GenerationRun> run;
  };

  void plan_memory();
  void run();
  bool admit(bool wait);   // starts the next waiting task; false when none (wait: blocks until one or the end)
  void start(const std::shared_ptr<GenerationTask>& task);
  void step();             // one forward_batch over the running tasks
  void finish(Running& r, EngineEvent done, TaskOutcome outcome);
  void fail(Running& r, std::exception_ptr error);

  Generator& generator_;
  const int64_t context_;
  Metrics& metrics_;
  SchedulerOptions scheduler_;
  RequestQueue queue_;
  std::atomic<bool> stopping_{false};
  std::mutex accounting_mutex_;  // orders queue pushes/removals with the metrics that count them
  std::unique_ptr<PrefixCache> cache_;
  std::vector<std::unique_ptr<Running>> running_;  // in arrival order
  std::vector<BatchEntry> batch_;                  // step(): this step's forwards, and whose they are
  std::vector<Running*> owners_;
  std::vector<Running*> order_;  // step()'s order of the running tasks
  std::thread thread_;
};

}  // namespace tern::server
