// gdn_state_replay (src/cuda/kernels/gdn/gdn_replay.cu, the verify's rollback of the Gated DeltaNet recurrent states)
// against its host twin below: random kept states and replay values at the model's head shape, 0 to 8 tokens (0: a
// copy), more entries than one launch carries, bit for bit. (That the replay values gdn_decode keeps rebuild its
// states is CudaGdnDecode.LongStepsMatchOneTokenCallsAndCpuTwin's; the rollback of a whole model, CudaVerify's.)
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "core/check.h"
#include "cuda/kernels/gdn/gdn.cuh"

namespace tern::cuda::test {
namespace {

// The host twin: the state before token 0, then `tokens` updates s = fma(g, s, k̂·δ) per element, the product rounded
// to float before the fused multiply-add (gdn_decode's step 4).
std::vector<float> replay_host(const std::vector<float>& kept, const GdnDims& d, int tokens) {
  const GdnReplayLayout l = GdnReplayLayout::of(d);
  const int64_t n = int64_t(d.Hv) * d.dv * d.dk;
  std::vector<float> s(kept.begin(), kept.begin() + n);
  for (int t = 0; t < tokens; ++t) {
    const float* slot = kept.data() + n + int64_t(t) * l.floats;
    for (int h = 0; h < d.Hv; ++h)
      for (int j = 0; j < d.dv; ++j) {
        const int64_t row = int64_t(h) * d.dv + j;
        const float g = slot[l.g_at + h], delta = slot[l.delta_at + row];
        const float* k = slot + l.k_at + int64_t(h / (d.Hv / d.Hk)) * d.dk;
        for (int i = 0; i < d.dk; ++i) {
          const float product = k[i] * delta;
          s[size_t(row * d.dk + i)] = std::fma(g, s[size_t(row * d.dk + i)], product);
        }
      }
  }
  return s;
}

// A kept buffer of `tokens` slots: the state ~ U(-0.3, 0.3), k̂ ~ U(-0.2, 0.2), δ ~ U(-1, 1), g ~ U(0.5, 1) (a decay).
std::vector<float> random_kept(std::mt19937_64& rng, const GdnDims& d, int tokens) {
  const GdnReplayLayout l = GdnReplayLayout::of(d);
  const int64_t n = int64_t(d.Hv) * d.dv * d.dk;
  std::vector<float> kept = random_floats(rng, size_t(gdn_kept_rec_floats(d, tokens)), -0.3f, 0.3f);
  for (int t = 0; t < tokens; ++t) {
    float* slot = kept.data() + n + int64_t(t) * l.floats;
    std::uniform_real_distribution<float> k(-0.2f, 0.2f), delta(-1.0f, 1.0f), g(0.5f, 1.0f);
    for (int64_t i = l.k_at; i < l.delta_at; ++i) slot[i] = k(rng);
    for (int64_t i = l.delta_at; i < l.g_at; ++i) slot[i] = delta(rng);
    for (int h = 0; h < d.Hv; ++h) slot[l.g_at + h] = g(rng);
  }
  return kept;
}

TEST(CudaGdnReplay, LayersReplayedInOneLaunchEqualTheHostTwinBitForBit) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnReplay"));
  const GdnDims d;  // the model's heads: Hk 16, Hv 32, dk = dv = 128
  const int64_t n = int64_t(d.Hv) * d.dv * d.dk;
  EXPECT_EQ(GdnReplayLayout::of(d).floats % 4, 0);
  for (int tokens : {0, 1, 3, 8}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    // Three layers with their own kept buffers (of 8 slots: a rollback replays a prefix of them).
    std::vector<std::vector<float>> kept;
    std::vector<std::unique_ptr<DeviceBuf<float>>> dkept, dstate;
    std::vector<GdnReplay> entries;
    for (int e = 0; e < 3; ++e) {
      kept.push_back(random_kept(rng, d, 8));
      dkept.push_back(std::make_unique<DeviceBuf<float>>(kept.back()));
      dstate.push_back(std::make_unique<DeviceBuf<float>>(size_t(n)));  // poisoned
      entries.push_back(GdnReplay{dstate.back()->p, dkept.back()->p});
    }
    gdn_state_replay(entries.data(), int(entries.size()), d, tokens, nullptr);
    TERN_CUDA(cudaGetLastError());
    for (size_t e = 0; e < entries.size(); ++e) {
      const std::vector<float> got = dstate[e]->host(), want = replay_host(kept[e], d, tokens);
      EXPECT_TRUE(all_finite(got)) << "layer " << e;
      EXPECT_TRUE(same_bits(got, want)) << "layer " << e;
    }
  }
}

// More layers than one launch's parameters hold (kGdnReplayMaxEntries), on one shared kept buffer: each layer's
// state must be the host twin's.
TEST(CudaGdnReplay, MoreLayersThanOneLaunchCarries) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnReplayMany"));
  const GdnDims d;
  const int64_t n = int64_t(d.Hv) * d.dv * d.dk;
  const int count = kGdnReplayMaxEntries + 3, tokens = 2;
  const std::vector<float> kept = random_kept(rng, d, tokens);
  DeviceBuf<float> dkept(kept), dstates(size_t(count) * size_t(n));  // poisoned
  std::vector<GdnReplay> entries;
  for (int e = 0; e < count; ++e) entries.push_back(GdnReplay{dstates.p + e * n, dkept.p});
  gdn_state_replay(entries.data(), count, d, tokens, nullptr);
  TERN_CUDA(cudaGetLastError());
  const std::vector<float> got = dstates.host(), want = replay_host(kept, d, tokens);
  for (int e = 0; e < count; ++e)
    EXPECT_TRUE(same_bits(std::vector<float>(got.begin() + e * n, got.begin() + (e + 1) * n), want)) << "layer " << e;
}

TEST(CudaGdnReplay, RefusesShapesAndTokenCountsItDoesNotTake) {
  TERN_REQUIRE_GPU();
  GdnDims d;
  DeviceBuf<float> kept(size_t(gdn_kept_rec_floats(d, 1))), state(size_t(d.Hv) * d.dv * d.dk);
  const GdnReplay entry{state.p, kept.p};
  EXPECT_THROW(gdn_state_replay(&entry, 1, d, -1, nullptr), Error);
  EXPECT_THROW(gdn_state_replay(&entry, 1, d, kGdnDecodeMaxTokens + 1, nullptr), Error);
  d.dk = 64;
  EXPECT_THROW(gdn_state_replay(&entry, 1, d, 1, nullptr), Error);
}

}  // namespace
}  // namespace tern::cuda::test
