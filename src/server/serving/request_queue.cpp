#include "server/serving/request_queue.h"

#include <algorithm>

namespace tern::server {

EngineEvent EngineEvent::of_token(const TokenEvent& token) {
  EngineEvent e;
  e.kind = Kind::token;
  e.token = token;
  return e;
}

EngineEvent EngineEvent::of_done(GenerationResult result) {
  EngineEvent e;
  e.kind = Kind::done;
  e.result = std::move(result);
  return e;
}

EngineEvent EngineEvent::of_error(ApiError error) {
  EngineEvent e;
  e.kind = Kind::error;
  e.error = std::move(error);
  return e;
}

EngineEvent EngineEvent::of_queued(int64_t ahead, int64_t prompt_tokens) {
  EngineEvent e;
  e.kind = Kind::progress;
  e.progress.queued = true;
  e.progress.queued_ahead = ahead;
  e.progress.prompt.total = prompt_tokens;  // nothing read yet, nothing known to be cached
  return e;
}

EngineEvent EngineEvent::of_prompt_progress(const PromptProgress& prompt) {
  EngineEvent e;
  e.kind = Kind::progress;
  e.progress.prompt = prompt;
  return e;
}

void EventChannel::push(EngineEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_one();
}

std::optional<EngineEvent> EventChannel::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

bool RequestQueue::push(std::shared_ptr<GenerationTask> task) {
  {
    std::lock_guard lock(mutex_);
    if (closed_ || tasks_.size() >= max_waiting_) return false;
    task->enqueued = std::chrono::steady_clock::now();
    tasks_.push_back(std::move(task));
    moved_ = true;
  }
  ready_.notify_one();
  return true;
}

std::shared_ptr<GenerationTask> RequestQueue::pop() {
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] { return closed_ || !tasks_.empty(); });
  if (tasks_.empty()) return nullptr;
  auto task = std::move(tasks_.front());
  tasks_.pop_front();
  moved_ = true;
  return task;
}

std::shared_ptr<GenerationTask> RequestQueue::try_pop() {
  std::lock_guard lock(mutex_);
  if (tasks_.empty()) return nullptr;
  auto task = std::move(tasks_.front());
  tasks_.pop_front();
  moved_ = true;
  return task;
}

bool RequestQueue::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

bool RequestQueue::remove(const std::shared_ptr<GenerationTask>& task) {
  std::lock_guard lock(mutex_);
  auto it = std::find(tasks_.begin(), tasks_.end(), task);
  if (it == tasks_.end()) return false;
  tasks_.erase(it);
  moved_ = true;
  return true;
}

void RequestQueue::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  ready_.notify_all();
}

void RequestQueue::report_positions() {
  std::lock_guard lock(mutex_);
  if (!moved_) return;
  moved_ = false;
  for (size_t i = 0; i < tasks_.size(); ++i) {
    GenerationTask& task = *tasks_[i];
    if (!task.report_progress || task.reported_ahead == int64_t(i)) continue;
    task.reported_ahead = int64_t(i);
    task.events.push(EngineEvent::of_queued(int64_t(i), int64_t(task.request.prompt.size())));
  }
}

size_t RequestQueue::waiting() const {
  std::lock_guard lock(mutex_);
  return tasks_.size();
}

}  // namespace tern::server
