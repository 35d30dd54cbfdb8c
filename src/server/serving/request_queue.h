// What a handler hands to the engine loop (a GenerationTask), the channel that carries the engine's events back
// to the handler's thread, and the bounded FIFO the tasks wait in.
//
//   handler thread:  parse + validate -> tokenize -> queue.push(task) (503 when full) -> read task->events
//   engine thread:   queue.pop() -> a GenerationRun among the running ones -> task->events.push(token..., done)
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/generator.h"
#include "server/http/errors.h"

namespace tern::server {

// One message from the engine to the handler.
struct EngineEvent {
  enum class Kind { token, done, error };
  Kind kind = Kind::token;
  TokenEvent token;            // kind token
  GenerationResult result;     // kind done
  ApiError error;              // kind error

  static EngineEvent of_token(const TokenEvent& token);
  static EngineEvent of_done(GenerationResult result);
  static EngineEvent of_error(ApiError error);
};

// A single-producer, single-consumer channel (the engine pushes, the handler's thread pops). Unbounded: one
// entry per generated token at most, so its size is bounded by max_tokens.
class EventChannel {
 public:
  void push(EngineEvent event);
  // Waits up to `timeout` for the next event; nullopt on timeout.
  std::optional<EngineEvent> pop(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<EngineEvent> events_;
};

struct GenerationTask {
  std::string id;                              // the response id, also in the request log
  GenerationRequest request;                   // request.cancel is pointed at `cancel` by the engine loop
  std::atomic<bool> cancel{false};             // set by the handler thread when the client went away
  std::function<bool()> client_gone;           // polled by the engine once per token (may be empty)
  EventChannel events;
  std::chrono::steady_clock::time_point enqueued{};
};

// FIFO of tasks waiting for the engine, holding at most `max_waiting` (the running tasks are not counted).
class RequestQueue {
 public:
  explicit RequestQueue(size_t max_waiting) : max_waiting_(max_waiting) {}

  // False when `max_waiting` tasks already wait (the caller answers 503) or the queue is closed.
  bool push(std::shared_ptr<GenerationTask> task);
  // Blocks until a task arrives; nullptr once closed and empty.
  std::shared_ptr<GenerationTask> pop();
  // The next task if one waits, else nullptr (never blocks).
  std::shared_ptr<GenerationTask> try_pop();
  // Takes a task out before it runs (its client went away). False when it already left the queue.
  bool remove(const std::shared_ptr<GenerationTask>& task);
  // Wakes pop(); later pushes fail. Waiting tasks stay to be drained by pop().
  void close();

  size_t waiting() const;
  bool closed() const;
  size_t max_waiting() const { return max_waiting_; }

 private:
  const size_t max_waiting_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<GenerationTask>> tasks_;
  bool closed_ = false;
};

}  // namespace tern::server
