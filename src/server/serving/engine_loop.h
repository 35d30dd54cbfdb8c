// The one thread that owns the model: it takes tasks from the FIFO queue, one at a time, and runs the generator
// in the session the prefix cache gives it (engine/prefix_cache.h: the conversation's own session, restored to
// the longest snapshot its prompt reuses). Handlers never touch the runner, the sessions or the generator.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/generator.h"
#include "engine/prefix_cache.h"
#include "server/serving/metrics.h"
#include "server/serving/request_queue.h"

namespace tern::server {

class EngineLoop {
 public:
  // `generator` and `runner` must outlive the loop. context: the session's capacity in tokens.
  EngineLoop(Generator& generator, int64_t context, size_t max_queue, Metrics& metrics,
             PrefixCacheOptions cache = {});
  ~EngineLoop();  // stops the thread after the running task; waiting tasks get an error event
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues the task. False when the queue is full (the caller answers 503); the task is then untouched.
  bool submit(const std::shared_ptr<GenerationTask>& task);
  // Takes a waiting task out of the queue (its client left). False when it already started or finished.
  bool withdraw(const std::shared_ptr<GenerationTask>& task);

  int64_t context() const { return context_; }
  size_t waiting() const { return queue_.waiting(); }
  size_t max_queue() const { return queue_.max_waiting(); }

 private:
  void run();
  void run_task(GenerationTask& task);

  Generator& generator_;
  const int64_t context_;
  Metrics& metrics_;
  RequestQueue queue_;
  std::atomic<bool> stopping_{false};
  std::mutex accounting_mutex_;  // orders queue pushes/removals with the metrics that count them
  std::unique_ptr<PrefixCache> cache_;
  std::thread thread_;
};

}  // namespace tern::server
