// The staging planner of the weight upload: every byte of every copy travels once, in order, within the buffer's
// capacity and alignment; threads filling disjoint ranges of a buffer write what a single fill would.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/staging_plan.h"
#include "core/thread_pool.h"

namespace tern {
namespace {

// A source buffer, a destination buffer and copies between them (destinations as offsets from dst_base).
struct Scenario {
  std::vector<uint8_t> src, dst;
  std::vector<HostCopy> copies;
  uintptr_t dst_base() const { return reinterpret_cast<uintptr_t>(dst.data()); }
};

// Copies of random sizes (some empty, some larger than `capacity`) from shuffled places in src to consecutive
// places in dst, with gaps on both sides so that no two copies merge by accident.
Scenario random_scenario(uint64_t seed, size_t capacity, int copies) {
  std::mt19937_64 rng(seed);
  Scenario s;
  std::vector<size_t> sizes;
  for (int i = 0; i < copies; ++i) {
    const int kind = int(rng() % 4);
    sizes.push_back(kind == 0 ? 0 : kind == 1 ? 1 + rng() % 17 : kind == 2 ? 1 + rng() % capacity
                                                                            : capacity + rng() % (3 * capacity));
  }
  const size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t(0)) + 8 * size_t(copies) + 8;
  s.src.resize(total);
  s.dst.assign(total, 0);
  for (uint8_t& b : s.src) b = uint8_t(rng());
  std::vector<size_t> src_at(sizes.size());
  size_t at = 3;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src_at[i] = at;
    at += sizes[i] + 1 + rng() % 7;
  }
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::shuffle(order.begin(), order.end(), rng);
  size_t dst_at = 5;
  for (size_t i : order) {
    s.copies.push_back(HostCopy{s.src.data() + src_at[i], s.dst_base() + dst_at, sizes[i]});
    dst_at += sizes[i] + 1 + rng() % 5;
  }
  return s;
}

// What the upload does, on the host: fill each chunk's buffer (by `threads` in ranges of `grain` bytes), then
// copy each piece from the buffer to its destination. The buffer starts poisoned for every chunk.
void run_plan(const std::vector<StagingChunk>& chunks, size_t capacity, int threads, int64_t grain) {
  ThreadPool pool(threads);
  std::vector<uint8_t> staging(capacity);
  for (const StagingChunk& c : chunks) {
    std::fill(staging.begin(), staging.end(), uint8_t(0xa5));
    pool.parallel_for(int64_t(c.extent), grain, [&](int64_t b, int64_t e) {
      staging_fill(c, staging.data(), size_t(b), size_t(e));
    });
    for (const StagedPiece& p : c.pieces)
      std::memcpy(reinterpret_cast<uint8_t*>(p.dst), staging.data() + p.offset, p.bytes);
  }
}

TEST(StagingPlan, EveryByteArrivesOnce) {
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    const size_t capacity = 1000 + seed * 333;
    Scenario s = random_scenario(seed, capacity, 60);
    const std::vector<StagingChunk> chunks = staging_plan(s.copies, capacity, 64);
    run_plan(chunks, capacity, 3, 97);
    // Each destination byte written is its source byte; bytes outside every copy stay 0.
    std::vector<uint8_t> want(s.dst.size(), 0);
    for (const HostCopy& c : s.copies)
      std::memcpy(want.data() + (c.dst - s.dst_base()), c.src, c.bytes);
    ASSERT_EQ(s.dst, want) << "seed " << seed;
  }
}

TEST(StagingPlan, PiecesCoverTheCopiesInOrder) {
  const size_t capacity = 4096;
  Scenario s = random_scenario(7, capacity, 80);
  const std::vector<StagingChunk> chunks = staging_plan(s.copies, capacity, 256);
  // Concatenated over chunks, the pieces are the non-empty copies, in order, each cut into consecutive parts.
  size_t copy = 0, done = 0, total = 0;
  for (const StagingChunk& c : chunks) {
    ASSERT_FALSE(c.pieces.empty());
    ASSERT_LE(c.extent, capacity);
    size_t payload = 0, end = 0;
    for (const StagedPiece& p : c.pieces) {
      while (copy < s.copies.size() && s.copies[copy].bytes == 0) ++copy;
      ASSERT_LT(copy, s.copies.size());
      const HostCopy& h = s.copies[copy];
      EXPECT_EQ(p.src, h.src + done);
      EXPECT_EQ(p.dst, h.dst + done);
      EXPECT_GT(p.bytes, 0u);
      EXPECT_EQ(p.offset % 256, 0u);
      EXPECT_GE(p.offset, end);  // no overlap, increasing offsets
      end = p.offset + p.bytes;
      payload += p.bytes;
      done += p.bytes;
      if (done == h.bytes) {
        ++copy;
        done = 0;
      }
    }
    EXPECT_EQ(c.extent, end);
    EXPECT_EQ(c.payload, payload);
    total += payload;
  }
  size_t want = 0;
  for (const HostCopy& h : s.copies) want += h.bytes;
  EXPECT_EQ(total, want);
  EXPECT_EQ(done, 0u);
}

TEST(StagingPlan, PacksSmallCopiesAndSplitsBigOnes) {
  std::vector<uint8_t> src(10000);
  const uintptr_t d = 1 << 20;
  // Three small copies share the first buffer; the big one fills the rest of it and spills into two more.
  const std::vector<HostCopy> copies = {{src.data(), d, 10}, {src.data() + 100, d + 100, 20},
                                        {src.data() + 200, d + 200, 30}, {src.data() + 1000, d + 1000, 2500}};
  const std::vector<StagingChunk> chunks = staging_plan(copies, 1024, 128);
  ASSERT_EQ(chunks.size(), 3u);
  ASSERT_EQ(chunks[0].pieces.size(), 4u);
  EXPECT_EQ(chunks[0].pieces[1].offset, 128u);
  EXPECT_EQ(chunks[0].pieces[2].offset, 256u);
  EXPECT_EQ(chunks[0].pieces[3].offset, 384u);
  EXPECT_EQ(chunks[0].pieces[3].bytes, 1024u - 384u);
  EXPECT_EQ(chunks[0].extent, 1024u);
  ASSERT_EQ(chunks[1].pieces.size(), 1u);
  EXPECT_EQ(chunks[1].pieces[0].bytes, 1024u);
  EXPECT_EQ(chunks[1].pieces[0].src, src.data() + 1000 + 640);
  ASSERT_EQ(chunks[2].pieces.size(), 1u);
  EXPECT_EQ(chunks[2].pieces[0].bytes, 2500u - 640u - 1024u);
  EXPECT_EQ(chunks[2].payload, 2500u - 640u - 1024u);
}

TEST(StagingPlan, NothingToCopyPlansNoChunk) {
  EXPECT_TRUE(staging_plan({}, 64).empty());
  std::vector<uint8_t> src(8);
  EXPECT_TRUE(staging_plan({{src.data(), 0, 0}}, 64).empty());
}

TEST(StagingPlan, RejectsBadSizes) {
  EXPECT_THROW(staging_plan({}, 0), Error);
  EXPECT_THROW(staging_plan({}, 64, 48), Error);
}

TEST(HostCopies, MergeJoinsCopiesThatContinueOnBothSides) {
  std::vector<uint8_t> src(100);
  const uint8_t* s = src.data();
  const std::vector<HostCopy> copies = {{s, 1000, 10},      {s + 10, 1010, 5},  // continue: merge
                                        {s + 15, 1015, 0},                      // empty: dropped
                                        {s + 15, 2000, 5},                      // destination jumps
                                        {s + 40, 2005, 5},                      // source jumps
                                        {s + 45, 2010, 5}};                     // continue: merge
  const std::vector<HostCopy> m = host_copies_merge(copies);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].src, s);
  EXPECT_EQ(m[0].bytes, 15u);
  EXPECT_EQ(m[1].dst, 2000u);
  EXPECT_EQ(m[1].bytes, 5u);
  EXPECT_EQ(m[2].src, s + 40);
  EXPECT_EQ(m[2].bytes, 10u);
}

TEST(HostCopies, SortBySourceKeepsEqualSourcesInOrder) {
  std::vector<uint8_t> src(100);
  const uint8_t* s = src.data();
  std::vector<HostCopy> copies = {{s + 50, 1, 1}, {s + 10, 2, 1}, {s + 50, 3, 1}, {s, 4, 1}};
  host_copies_sort_by_source(copies);
  std::vector<uintptr_t> dst;
  for (const HostCopy& c : copies) dst.push_back(c.dst);
  EXPECT_EQ(dst, (std::vector<uintptr_t>{4, 2, 1, 3}));
}

TEST(StagingPlan, PrefetchOfHeapAndEmptyChunksIsHarmless) {
  std::vector<uint8_t> src(5000, 1);
  const std::vector<StagingChunk> chunks = staging_plan({{src.data() + 1, 0, 4000}}, 1024);
  for (const StagingChunk& c : chunks) staging_prefetch(c);
  staging_prefetch(StagingChunk{});
}

}  // namespace
}  // namespace tern
