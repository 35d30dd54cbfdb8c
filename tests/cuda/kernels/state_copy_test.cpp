// The one-launch state copy (src/cuda/kernels/copy/state_copy.cu, Session::rollback's restore of the Gated DeltaNet
// states) against its host twin, a memcpy per entry: random bytes, entries of uneven sizes (empty ones, one of 4 MB
// over many blocks, sizes that leave a block part full), gaps between the regions that must stay untouched, lists
// longer than one launch carries, and the position written; misaligned entries are refused.
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <vector>

#include "../cuda_test_util.h"
#include "core/check.h"
#include "cuda/kernels/copy/state_copy.cuh"

namespace tern::cuda::test {
namespace {

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {  // n: a multiple of 16
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(v.data() + i, &r, 8);
  }
  return v;
}

// Copies entries of `words` 16-byte words each, from one device buffer to another, each region 1 to 3 words after
// the last (the gaps hold other bytes, which must survive), and checks the destination bit for bit against the
// host's memcpy of the same entries, and the position.
void copy_and_compare(std::mt19937_64& rng, const std::vector<int64_t>& words, bool with_pos, cudaStream_t stream) {
  std::uniform_int_distribution<int64_t> gap(1, 3);
  std::vector<size_t> src_at, dst_at;
  size_t src_bytes = 16, dst_bytes = 32;  // the buffers' first words: gaps too
  for (int64_t n : words) {
    src_at.push_back(src_bytes);
    dst_at.push_back(dst_bytes);
    src_bytes += size_t(n + gap(rng)) * 16;
    dst_bytes += size_t(n + gap(rng)) * 16;
  }
  const std::vector<uint8_t> src = random_bytes(rng, src_bytes), dst_before = random_bytes(rng, dst_bytes);
  std::vector<uint8_t> want = dst_before;  // the host twin
  for (size_t i = 0; i < words.size(); ++i)
    std::memcpy(want.data() + dst_at[i], src.data() + src_at[i], size_t(words[i]) * 16);

  uint8_t *d_src = nullptr, *d_dst = nullptr;
  int* d_pos = nullptr;
  ASSERT_EQ(cudaMalloc(&d_src, src_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_dst, dst_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_pos, 2 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_src, src.data(), src_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_dst, dst_before.data(), dst_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  const int pos_before[2] = {-7, 1234};
  ASSERT_EQ(cudaMemcpy(d_pos, pos_before, sizeof(pos_before), cudaMemcpyHostToDevice), cudaSuccess);

  std::vector<StateCopy> entries;
  for (size_t i = 0; i < words.size(); ++i)
    entries.push_back(state_copy_entry(d_dst + dst_at[i], d_src + src_at[i], size_t(words[i]) * 16));
  const int new_pos = int(rng() % 100000);
  state_copy(entries, with_pos ? d_pos : nullptr, new_pos, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  std::vector<uint8_t> got(dst_bytes);
  int pos_after[2] = {0, 0};
  ASSERT_EQ(cudaMemcpy(got.data(), d_dst, dst_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(pos_after, d_pos, sizeof(pos_after), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_src);
  cudaFree(d_dst);
  cudaFree(d_pos);
  size_t first_diff = 0;
  while (first_diff < dst_bytes && got[first_diff] == want[first_diff]) ++first_diff;
  EXPECT_EQ(first_diff, dst_bytes) << words.size() << " entries: the first byte that differs from the host's copy";
  EXPECT_EQ(pos_after[0], with_pos ? new_pos : pos_before[0]);
  EXPECT_EQ(pos_after[1], pos_before[1]);  // the int after the position (a session's d_rope_delta) untouched
}

TEST(StateCopy, KernelMatchesHostMemcpy) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("StateCopy.Kernel"));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // Uneven sizes: empty entries (first, middle, last), one word, a block's 1024 words and one either side, one large
  // entry (4 MB: 256 blocks) with a part-full last block.
  copy_and_compare(rng, {0, 1, 3, 1023, 1024, 1025, 0, 262144 + 77, 17, 0}, true, stream);
  // The model's shapes: 30 layers of conv [3, 8192] and rec [32, 128, 128] floats.
  std::vector<int64_t> model;
  for (int l = 0; l < 30; ++l) {
    model.push_back(3 * 8192 * 4 / 16);
    model.push_back(32 * 128 * 128 * 4 / 16);
  }
  copy_and_compare(rng, model, true, stream);
  // Random lists, some longer than one launch's kStateCopyMaxEntries (several launches, the position in the last).
  for (int round = 0; round < 6; ++round) {
    const int count = int(rng() % (3 * kStateCopyMaxEntries)) + 1;
    std::vector<int64_t> words;
    for (int i = 0; i < count; ++i) words.push_back(rng() % 4 == 0 ? 0 : int64_t(rng() % 5000));
    copy_and_compare(rng, words, round % 2 == 0, stream);
  }
  // No entries: the position alone.
  copy_and_compare(rng, {}, true, stream);
  copy_and_compare(rng, {0, 0}, true, stream);
  cudaStreamDestroy(stream);
}

TEST(StateCopy, RefusesMisalignedEntries) {
  alignas(16) static uint8_t a[64], b[64];  // addresses only: nothing is copied
  EXPECT_EQ(state_copy_entry(a, b, 48).n16, 3);
  EXPECT_EQ(state_copy_entry(a + 16, b + 32, 0).n16, 0);
  EXPECT_THROW(state_copy_entry(a, b, 20), InternalError);      // not whole words
  EXPECT_THROW(state_copy_entry(a + 4, b, 16), InternalError);  // dst
  EXPECT_THROW(state_copy_entry(a, b + 8, 16), InternalError);  // src
}

}  // namespace
}  // namespace tern::cuda::test
