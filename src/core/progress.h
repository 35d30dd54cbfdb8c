// A byte-count progress bar for loading: "loading  1.23/4.56 GB  [#####.....]  27%  2.1 GB/s" redrawn in place on a
// terminal, or a plain log line every ~10% (and at the end) when stderr is not a terminal. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace tern {

class Progress {
 public:
  // total_bytes: the work; enabled = false makes every call a no-op.
  Progress(std::string label, int64_t total_bytes, bool enabled = true);
  ~Progress();  // finishes the line if finish() was not called
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(int64_t bytes);  // bytes done since the last call
  void finish();            // final line with the total time and rate

  int64_t done() const { return done_; }

 private:
  void draw(bool final_line);

  std::string label_;
  int64_t total_ = 0, done_ = 0;
  bool enabled_ = true, tty_ = false, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mutex_;
};

}  // namespace tern
