#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace tern {

Progress::Progress(std::string label, int64_t total_bytes, bool enabled)
    : label_(std::move(label)), total_(std::max<int64_t>(total_bytes, 0)), enabled_(enabled) {
  tty_ = ::isatty(STDERR_FILENO) == 1;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  if (enabled_ && !finished_) finish();
}

void Progress::add(int64_t bytes) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = std::min(total_, done_ + bytes);
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ >= std::chrono::milliseconds(100)) {
      last_draw_ = now;
      draw(false);
    }
  } else {
    const int decile = total_ > 0 ? int(done_ * 10 / total_) : 10;
    if (decile != last_decile_ && decile < 10) {
      last_decile_ = decile;
      draw(false);
    }
  }
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  done_ = total_;
  draw(true);
}

void Progress::draw(bool final_line) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double gb = 1e9;
  const double rate = seconds > 0 ? double(done_) / gb / seconds : 0.0;
  const int percent = total_ > 0 ? int(done_ * 100 / total_) : 100;
  if (tty_) {
    char bar[31];
    const int filled = percent * 30 / 100;
    for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '.';
    bar[30] = 0;
    std::fprintf(stderr, "\r%s %7.2f/%.2f GB [%s] %3d%% %6.2f GB/s%s", label_.c_str(), double(done_) / gb,
                 double(total_) / gb, bar, percent, rate, final_line ? "\n" : "");
  } else if (final_line) {
    std::fprintf(stderr, "%s: %.2f GB in %.1f s (%.2f GB/s)\n", label_.c_str(), double(total_) / gb, seconds, rate);
  } else {
    std::fprintf(stderr, "%s: %.2f/%.2f GB (%d%%), %.2f GB/s\n", label_.c_str(), double(done_) / gb,
                 double(total_) / gb, percent, rate);
  }
  std::fflush(stderr);
}

}  // namespace tern
