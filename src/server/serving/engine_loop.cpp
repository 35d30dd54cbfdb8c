#include "server/serving/engine_loop.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <vector>

#include "core/check.h"

namespace tern::server {

namespace {
// A fault of ours while running `task`: printed on stderr (with the source location), answered as a 500.
ApiError internal_fault(const GenerationTask& task, const std::string& what) {
  std::fprintf(stderr, "tern serve: internal error in request %s: %s\n", task.id.c_str(), what.c_str());
  return api_error_internal("internal error: " + strip_error_location(what));
}

// The error event for an exception of a task's run.
EngineEvent error_event(const GenerationTask& task, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const InternalError& e) {  // the device or the engine failed, not the request: 500, logged
    return EngineEvent::of_error(internal_fault(task, e.what()));
  } catch (const Error& e) {  // the request's fault (a prompt token outside the vocabulary, ...): 400
    return EngineEvent::of_error(api_error_invalid("", strip_error_location(e.what())));
  } catch (const std::exception& e) {
    return EngineEvent::of_error(internal_fault(task, e.what()));
  }
}
}  // namespace

EngineLoop::EngineLoop(Generator& generator, int64_t context, size_t max_queue, Metrics& metrics,
                       PrefixCacheOptions cache, SchedulerOptions scheduler)
    : generator_(generator), context_(context), metrics_(metrics), scheduler_(scheduler), queue_(max_queue) {
  TERN_CHECK(scheduler_.parallel >= 0, "--parallel must be at least 1, got ", scheduler_.parallel);
  TERN_CHECK(scheduler_.step_tokens >= 1, "--step-tokens must be at least 1, got ", scheduler_.step_tokens);
  plan_memory();
  cache_ = std::make_unique<PrefixCache>(generator_.runner(), context_, cache);
  try {
    cache_->reserve(scheduler_.parallel);
  } catch (const std::exception& e) {
    TERN_FAIL(scheduler_.parallel, " sequences of ", context_, " tokens (--parallel ", scheduler_.parallel,
               ", --ctx-size ", context_, ") do not fit: ", strip_error_location(e.what()),
               "; use a smaller --parallel or --ctx-size");
  }
  metrics_.on_prefix_cache(cache_->stats(), cache_->active());
  thread_ = std::thread([this] { run(); });
}

// The sessions' memory against what is free: --parallel left to the server (0) becomes the default or what fits; an
// explicit --parallel that does not fit is refused with the numbers.
void EngineLoop::plan_memory() {
  ModelRunner& runner = generator_.runner();
  const std::optional<int64_t> fits = sessions_that_fit(runner, context_);
  const int64_t fit = fits.value_or(SchedulerOptions::kDefaultParallel);
  const auto gb = [](int64_t b) { return detail::concat(double(int64_t(double(b) / 1e7)) / 100.0, " GB"); };
  int& parallel = scheduler_.parallel;
  if (parallel == 0) parallel = int(std::clamp<int64_t>(fit, 1, SchedulerOptions::kDefaultParallel));
  if (!fits || parallel <= fit) return;
  const int64_t per = runner.session_bytes(context_), free = runner.free_memory_bytes();
  const int64_t tokens_fit = per > 0 ? context_ * free / (per * parallel) : 0;
  TERN_FAIL(parallel, " sequences of ", context_, " tokens need ", gb(per * parallel), " (", gb(per),
             " each) but ", gb(free), " is free: ", fit > 0 ? detail::concat("--parallel ", fit, " fits, or ") : "",
             "--ctx-size ", tokens_fit, " fits ", parallel, " sequences");
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
  for (;;) {
    // Admission in arrival order while a sequence is free; with nothing running, wait for a task.
    while (int(running_.size()) < scheduler_.parallel && admit(/*wait=*/running_.empty())) {
    }
    if (running_.empty()) {
      if (queue_.closed() && queue_.waiting() == 0) return;
      continue;
    }
    // Every sequence busy: the tasks still waiting learn their place (those that asked; only when it changed).
    if (int(running_.size()) >= scheduler_.parallel) queue_.report_positions();
    step();
  }
}

bool EngineLoop::admit(bool wait) {
  std::shared_ptr<GenerationTask> task = wait ? queue_.pop() : queue_.try_pop();
  if (!task) return false;
  {
    std::lock_guard lock(accounting_mutex_);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - task->enqueued).count();
    metrics_.on_task_started(waited);
  }
  if (stopping_) {
    metrics_.on_task_finished(TaskOutcome::failed, 0, 0, 0, 0, 0);
    task->events.push(EngineEvent::of_error(api_error_shutting_down("The server is shutting down.")));
    return true;
  }
  start(task);
  return true;
}

void EngineLoop::start(const std::shared_ptr<GenerationTask>& task) {
  auto r = std::make_unique<Running>();
  r->task = task;
  GenerationTask& t = *task;
  try {
    t.request.cancel = &t.cancel;
    const PrefixCache::Lease lease = cache_->begin(t.request.prompt, t.request.images);
    r->session = lease.session;
    if (cache_->active()) {
      t.request.checkpoint_every = cache_->options().snapshot_every;
      t.request.on_checkpoint = [this, &t](Session& s) { cache_->checkpoint(s, t.request.prompt, t.request.images); };
      t.request.on_kept_checkpoint = [this, &t](Session& s) {
        cache_->checkpoint_kept(s, t.request.prompt, t.request.images);
      };
    } else {
      t.request.checkpoint_at.clear();  // no snapshots: the prefill's chunks as without the cache
    }
    // Progress at each prompt chunk the scheduler runs (a step's chunk: --step-tokens while others decode).
    if (t.report_progress) {
      t.request.on_prompt_progress = [&t](const PromptProgress& p) {
        t.events.push(EngineEvent::of_prompt_progress(p));
      };
    }
    r->run = std::make_unique<GenerationRun>(generator_, *r->session, t.request, [&t](const TokenEvent& e) {
      if (t.cancel.load(std::memory_order_relaxed)) return false;
      if (t.client_gone && t.client_gone()) {
        t.cancel.store(true);
        return false;
      }
      t.events.push(EngineEvent::of_token(e));
      return true;
    });
  } catch (...) {
    fail(*r, std::current_exception());
    return;
  }
  running_.push_back(std::move(r));
}

void EngineLoop::step() {
  std::vector<BatchEntry>& batch = batch_;
  std::vector<Running*>& owners = owners_;
  batch.clear();
  owners.clear();
  int64_t tokens = 0;
  // The prompt budget: only when some task decodes (a prompt alone runs in the runner's own chunks). A task whose chunk
  // the runner holds part way takes it first (the runner holds one such chunk at a time: it must not wait), and at most
  // one task starts a chunk in pieces per step.
  const bool decoding = std::any_of(running_.begin(), running_.end(), [](const auto& r) { return !r->run->prefilling(); });
  int64_t budget = decoding ? scheduler_.step_tokens : INT64_MAX;
  std::vector<Running*>& order = order_;  // running_ in arrival order, the holder of a chunk part way first
  order.clear();
  for (auto& rp : running_)
    if (rp->run->holds_chunk_part_way()) order.push_back(rp.get());
  bool pieces = !order.empty();
  for (auto& rp : running_)
    if (!rp->run->holds_chunk_part_way()) order.push_back(rp.get());
  for (Running* rp : order) {
    Running& r = *rp;
    const bool prefill = r.run->prefilling();
    if (prefill && budget <= 0) continue;  // waits for the next step
    BatchEntry e;
    try {
      const bool held = r.run->holds_chunk_part_way();
      if (!r.run->next_step(e, prefill ? budget : 1, !pieces)) {  // cancelled before its step
        finish(r, EngineEvent::of_done(r.run->take_result()), TaskOutcome::cancelled);
        continue;
      }
      pieces = pieces || (!held && e.layer_limit > 0);
    } catch (...) {
      fail(r, std::current_exception());
      continue;
    }
    const int64_t work = prefill ? r.run->step_work() : int64_t(e.tokens.size());  // a piece of a chunk: its share
    if (prefill) budget -= work;
    tokens += work;
    batch.push_back(e);
    owners.push_back(&r);
  }
  if (!batch.empty()) {
    generator_.runner().forward_batch(batch);
    const int64_t part_way = std::count_if(batch.begin(), batch.end(), [](const BatchEntry& e) { return e.layers_left > 0; });
    metrics_.on_step(int64_t(batch.size()), tokens, part_way);
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Running& r = *owners[i];
    try {
      r.run->step_done(batch[i]);
    } catch (...) {
      fail(r, std::current_exception());
      continue;
    }
    if (!r.run->finished()) continue;
    GenerationResult result = r.run->take_result();
    const TaskOutcome outcome = result.finish == FinishReason::cancelled ? TaskOutcome::cancelled : TaskOutcome::completed;
    finish(r, EngineEvent::of_done(std::move(result)), outcome);
  }
  std::erase_if(running_, [](const auto& r) { return r->task == nullptr; });
}

// The task leaves: the session back to the cache with what it holds (failed: forgotten, its state unknown), the
// metrics, the last event.
void EngineLoop::finish(Running& r, EngineEvent done, TaskOutcome outcome) {
  GenerationTask& task = *r.task;
  const GenerationResult result = done.result;  // a copy: `done` may become an error below
  if (r.session && outcome == TaskOutcome::failed) {
    try {
      cache_->end(*r.session, {}, false);
    } catch (...) {
    }
  } else if (r.session) {
    try {
      // What the session holds now: the prompt (or the part of it fed before a cancel), then the generated tokens
      // that were fed back (all but the last one).
      const int64_t pos = r.session->position(), n_prompt = int64_t(task.request.prompt.size());
      std::vector<int32_t> held(task.request.prompt.begin(), task.request.prompt.begin() + std::min(pos, n_prompt));
      for (int64_t i = 0; int64_t(held.size()) < pos && i < int64_t(result.tokens.size()); ++i)
        held.push_back(result.tokens[size_t(i)]);
      cache_->end(*r.session, held, int64_t(held.size()) == pos, task.request.images);
    } catch (const std::exception& e) {
      done = EngineEvent::of_error(internal_fault(task, e.what()));
      outcome = TaskOutcome::failed;
    }
  }
  task.request.on_checkpoint = nullptr;
  task.request.on_kept_checkpoint = nullptr;
  task.request.on_prompt_progress = nullptr;
  metrics_.on_prefix_cache(cache_->stats(), cache_->active());
  metrics_.on_task_finished(outcome, result.prompt_tokens, result.cached_tokens, result.completion_tokens,
                            result.prefill_s, result.decode_s);
  metrics_.on_drafts(result.draft_tokens, result.accepted_draft_tokens, result.verify_steps);
  task.events.push(std::move(done));
  r.run.reset();
  r.session = nullptr;
  r.task = nullptr;  // erased from running_ by step()
}

void EngineLoop::fail(Running& r, std::exception_ptr error) {
  finish(r, error_event(*r.task, error), TaskOutcome::failed);
}

}  // namespace tern::server
