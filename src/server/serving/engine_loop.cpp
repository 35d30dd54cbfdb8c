#include "server/serving/engine_loop.h"

#include <cstdio>
#include <exception>
#include <vector>

#include "core/check.h"

namespace tern::server {

namespace {
// A fault of ours while running `task`: printed on stderr (with the source location), answered as a 500.
ApiError internal_fault(const GenerationTask& task, const std::string& what) {
  std::fprintf(stderr, "tern serve: internal error in request %s: %s\n", task.id.c_str(), what.c_str());
  return api_error_internal("internal error: " + strip_error_location(what));
}
}  // namespace

EngineLoop::EngineLoop(Generator& generator, int64_t context, size_t max_queue, Metrics& metrics,
                       PrefixCacheOptions cache)
    : generator_(generator), context_(context), metrics_(metrics), queue_(max_queue) {
  cache_ = std::make_unique<PrefixCache>(generator_.runner(), context_, cache);
  metrics_.on_prefix_cache(cache_->stats(), cache_->active());
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
      task->events.push(EngineEvent::of_error(api_error_shutting_down("The server is shutting down.")));
      continue;
    }
    run_task(*task);
  }
}

void EngineLoop::run_task(GenerationTask& task) {
  EngineEvent done;
  TaskOutcome outcome = TaskOutcome::failed;
  GenerationResult result;
  Session* session = nullptr;
  try {
    task.request.cancel = &task.cancel;
    const PrefixCache::Lease lease = cache_->begin(task.request.prompt);
    session = lease.session;
    if (cache_->active()) {
      task.request.checkpoint_every = cache_->options().snapshot_every;
      task.request.on_checkpoint = [this, &task](Session& s) { cache_->checkpoint(s, task.request.prompt); };
    } else {
      task.request.checkpoint_at.clear();  // no snapshots: the prefill's chunks as without the cache
    }
    result = generator_.generate(*session, task.request, [&task](const TokenEvent& e) {
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
    // What the session holds now: the prompt (or the part of it fed before a cancel), then the generated tokens
    // that were fed back (all but the last one).
    const int64_t pos = session->position(), n_prompt = int64_t(task.request.prompt.size());
    std::vector<int32_t> held(task.request.prompt.begin(), task.request.prompt.begin() + std::min(pos, n_prompt));
    for (int64_t i = 0; int64_t(held.size()) < pos && i < int64_t(result.tokens.size()); ++i)
      held.push_back(result.tokens[size_t(i)]);
    cache_->end(*session, held, int64_t(held.size()) == pos);
  } catch (const InternalError& e) {  // the device or the engine failed, not the request: 500, logged
    done = EngineEvent::of_error(internal_fault(task, e.what()));
  } catch (const Error& e) {  // the request's fault (a prompt token outside the vocabulary, ...): 400
    done = EngineEvent::of_error(api_error_invalid("", strip_error_location(e.what())));
  } catch (const std::exception& e) {
    done = EngineEvent::of_error(internal_fault(task, e.what()));
  }
  if (outcome == TaskOutcome::failed && session) {
    try {
      cache_->end(*session, {}, false);  // the session's state is unknown: forget it
    } catch (...) {
    }
  }
  task.request.on_checkpoint = nullptr;
  metrics_.on_prefix_cache(cache_->stats(), cache_->active());
  metrics_.on_task_finished(outcome, result.prompt_tokens, result.cached_tokens, result.completion_tokens,
                            result.prefill_s, result.decode_s);
  task.events.push(std::move(done));
}

}  // namespace tern::server
