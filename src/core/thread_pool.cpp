#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>

namespace tern {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(std::unique_lock<std::mutex>& lock) {
  // Called and returns with `lock` (on mutex_) held; releases it while a chunk runs.
  while (job_ && next_chunk_ < chunks_) {
    const int64_t c = next_chunk_++;
    const auto* fn = job_;
    const int64_t begin = c * job_grain_, end = std::min(job_n_, begin + job_grain_);
    lock.unlock();
    std::exception_ptr err;
    try {
      (*fn)(begin, end);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    if (++chunks_done_ == chunks_) done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t seen = generation_;
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    run_chunks(lock);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || workers_.empty()) {
    for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  next_chunk_ = 0;
  chunks_ = chunks;
  chunks_done_ = 0;
  error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  run_chunks(lock);
  done_.wait(lock, [&] { return chunks_done_ == chunks_; });
  job_ = nullptr;
  std::exception_ptr err = error_;
  error_ = nullptr;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

ThreadPool& thread_pool_global() {
  static ThreadPool pool([] {
    const char* env = std::getenv("TERN_THREADS");
    return env ? std::atoi(env) : 0;
  }());
  return pool;
}

}  // namespace tern
