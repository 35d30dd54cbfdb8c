#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

namespace tern {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
    }
  }
}

TEST(ThreadPool, ChunksDoNotDependOnThreadCount) {
  std::vector<std::pair<int64_t, int64_t>> a, b;
  std::mutex m;
  ThreadPool one(1), four(4);
  one.parallel_for(100, 7, [&](int64_t s, int64_t e) { std::lock_guard l(m); a.emplace_back(s, e); });
  four.parallel_for(100, 7, [&](int64_t s, int64_t e) { std::lock_guard l(m); b.emplace_back(s, e); });
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(50, 1, [](int64_t b, int64_t) { if (b == 17) throw std::runtime_error("x"); }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 10, [&](int64_t b, int64_t e) { for (int64_t i = b; i < e; ++i) sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

}  // namespace tern
