// A fixed pool of worker threads for data-parallel loops. Work is split into contiguous ranges whose boundaries
// depend only on n and the grain, never on the thread count, so results are identical for any number of threads
// as long as each range's work is independent (no cross-range reductions in floating point).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tern {

class ThreadPool {
 public:
  // threads = 0: std::thread::hardware_concurrency().
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }  // workers plus the calling thread

  // Calls fn(begin, end) over [0, n) in chunks of `grain` items (the last may be shorter). Blocks until all
  // chunks are done. The calling thread works too. An exception thrown by fn is rethrown here (the first one).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_chunks(std::unique_lock<std::mutex>& lock);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  int64_t next_chunk_ = 0, chunks_ = 0, chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex call_mutex_;  // one parallel_for at a time
};

// The process-wide pool (sized by TERN_THREADS or the hardware). Created on first use.
ThreadPool& thread_pool_global();

}  // namespace tern
