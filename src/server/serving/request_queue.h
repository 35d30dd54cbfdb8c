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

// Where a task stands before its first token, for a client that asked (GenerationTask::report_progress): waiting
// in the queue behind others, or its prompt being read.
struct TaskProgress {
  bool queued = false;         // waiting for a free sequence (all --parallel ones run other requests)
  int64_t queued_ahead = 0;    // queued: tasks waiting before it in the queue (0: it starts next)
  PromptProgress prompt;       // the prefill's counts (engine/generator.h); queued: only the total
};

// One message from the engine to the handler.
struct EngineEvent {
  enum class Kind { token, done, error, progress };
  Kind kind = Kind::token;
  TokenEvent token;            // kind token
  GenerationResult result;     // kind done
  ApiError error;              // kind error
  TaskProgress progress;       // kind progress (only to a task that asked for it; before its first token)

  static EngineEvent of_token(const TokenEvent& token);
  static EngineEvent of_done(GenerationResult result);
  static EngineEvent of_error(ApiError error);
  static EngineEvent of_queued(int64_t ahead, int64_t prompt_tokens);
  static EngineEvent of_prompt_progress(const PromptProgress& prompt);
};

// A single-producer, single-consumer channel (the engine pushes, the handler's thread pops). Unbounded: one
// entry per generated token at most, so its size is bounded by max_tokens (and, with progress, one per change of
// the task's place in the queue and one per chunk of its prompt).
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
  // Progress events before the first token (the client asked: return_progress): its place while it waits in the
  // queue (RequestQueue::report_positions), then the prompt's prefill at each chunk (the engine loop).
  bool report_progress = false;
  int64_t reported_ahead = -1;  // the place last reported (-1: none yet); the queue's, under its mutex
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
  // Each waiting task that asked for progress and whose place changed since it was last told (or was never told)
  // gets a queued event with the number of tasks before it. The engine loop calls this when it cannot start them
  // (every sequence busy); cheap when nothing changed since the last call.
  void report_positions();

  size_t waiting() const;
  bool closed() const;
  size_t max_waiting() const { return max_waiting_; }

 private:
  const size_t max_waiting_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<GenerationTask>> tasks_;
  bool closed_ = false;
  bool moved_ = false;  // tasks came or left since report_positions last ran
};

}  // namespace tern::server
