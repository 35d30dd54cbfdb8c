#include "server/engine_loop.h"

#include <cstdio>
#include <exception>

#include "core/check.h"

namespace tern::server {

EngineLoop::EngineLoop(Generator& generator, int64_t context, size_t max_queue, Metrics& metrics)
    : generator_(generator), context_(context), metrics_(metrics), queue_(max_queue) {
  session_ = generator_.runner().create_session(context_);
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  stopping_ = true;
  queue_.close();
  if (thread_.joinable()) thread_.join();
}

bool EngineLoop::submit(const std::shared_ptr<GenerationTask>& task) {
  std::lock_guard lock(accounting_mutex_);
  if (!queue_.push(task)) {
    metrics_.on_queue_rejected();
    return false;
  }
  metrics_.on_queue_accepted();
  return true;
}

bool EngineLoop::withdraw(const std::shared_ptr<GenerationTask>& task) {
  std::lock_guard lock(accounting_mutex_);
  if (!queue_.remove(task)) return false;
  metrics_.on_queue_dropped();
  return true;
}

void EngineLoop::run() {
  while (std::shared_ptr<GenerationTask> task = queue_.pop()) {
    {
      std::lock_guard lock(accounting_mutex_);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - task->enqueued).count();
      metrics_.on_task_started(waited);
    }
    if (stopping_) {
      metrics_.on_task_finished(TaskOutcome::failed, 0, 0, 0, 0, 0);
      ApiError e = api_error_internal("the server is shutting down");
      e.status = 503;
      task->events.push(EngineEvent::of_error(e));
      continue;
    }
    run_task(*task);
  }
}

void EngineLoop::run_task(GenerationTask& task) {
  EngineEvent done;
  TaskOutcome outcome = TaskOutcome::failed;
  GenerationResult result;
  try {
    task.request.cancel = &task.cancel;
    session_->reset();  // no prefix reuse yet: every request runs its whole prompt
    result = generator_.generate(*session_, task.request, [&task](const TokenEvent& e) {
      if (task.cancel.load(std::memory_order_relaxed)) return false;
      if (task.client_gone && task.client_gone()) {
        task.cancel.store(true);
        return false;
      }
      task.events.push(EngineEvent::of_token(e));
      return true;
    });
    outcome = result.finish == FinishReason::cancelled ? TaskOutcome::cancelled : TaskOutcome::completed;
    done = EngineEvent::of_done(result);
  } catch (const Error& e) {
    done = EngineEvent::of_error(api_error_invalid("", strip_error_location(e.what())));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tern serve: internal error in request %s: %s\n", task.id.c_str(), e.what());
    done = EngineEvent::of_error(api_error_internal(std::string("internal error: ") + e.what()));
  }
  if (outcome == TaskOutcome::failed) {
    try {
      session_->reset();
    } catch (...) {
    }
  }
  metrics_.on_task_finished(outcome, result.prompt_tokens, result.cached_tokens, result.completion_tokens,
                            result.prefill_s, result.decode_s);
  task.events.push(std::move(done));
}

}  // namespace tern::server
