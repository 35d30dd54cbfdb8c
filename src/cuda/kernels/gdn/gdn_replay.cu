// gdn_state_replay (gdn.cuh): a verify's rollback of the Gated DeltaNet recurrent states from their replay form, the
// state before the verify's first token and each token's update values, in one launch over the layers.
#include <algorithm>
#include <climits>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/gdn/gdn.cuh"

namespace tern::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWordsPerThread = 4;                                   // float4 words, all loaded before any update
constexpr int kBlockWords = kThreads * kWordsPerThread;              // 1024 words (16 KB) of one layer's state

// One launch's parameters, by value (the parameter space: 1 KB of entries).
struct ReplayParams {
  GdnReplay entry[kGdnReplayMaxEntries];
  GdnDims d;  // the layers' shape (d.T unused)
  int tokens = 0;
};
static_assert(sizeof(ReplayParams) <= 4096, "gdn_state_replay's parameters must fit the 4 KB kernel parameter space");

// grid [blocks per layer, entries] x block [kThreads]: block (b, e) takes words [b·1024, (b + 1)·1024) of entry e's
// state (thread i words b·1024 + i + j·256, j < 4: each warp's loads and stores cover 512 consecutive bytes). Word w
// is row w / dk4 (v-head row / dv, key head v-head / ratio), key dims 4·(w % dk4)..+3 (a layer's slot offsets fit
// an int: gdn_state_replay checks). Each element runs gdn_decode's
// update token by token: s = fmaf(g, s, k̂[i]·δ[row]) with the product rounded (__fmul_rn), so the bits are the
// verify's. The kept state is not read again: its loads evict first.
__global__ void __launch_bounds__(kThreads) gdn_replay_kernel(const __grid_constant__ ReplayParams p) {
  const GdnReplay& e = p.entry[blockIdx.y];
  const GdnReplayLayout layout = GdnReplayLayout::of(p.d);
  const int dk4 = p.d.dk / 4, ratio = p.d.Hv / p.d.Hk;  // float4 words per state row; v-heads per key head
  const int64_t state_floats = int64_t(p.d.Hv) * p.d.dv * p.d.dk, words = state_floats / 4;
  const float4* kept = reinterpret_cast<const float4*>(e.kept);
  float4* state = reinterpret_cast<float4*>(e.state);
  float4 s[kWordsPerThread];
  int64_t w[kWordsPerThread];
  int row[kWordsPerThread], k_at[kWordsPerThread], g_at[kWordsPerThread];  // the word's δ, k̂ and g in a token's slot
#pragma unroll
  for (int j = 0; j < kWordsPerThread; ++j) {
    w[j] = int64_t(blockIdx.x) * kBlockWords + threadIdx.x + j * kThreads;
    const bool in = w[j] < words;
    if (in) s[j] = __ldcs(kept + w[j]);
    row[j] = in ? int(w[j] / dk4) : 0;
    const int h = row[j] / p.d.dv, col = in ? int(w[j] % dk4) * 4 : 0;
    k_at[j] = int(layout.k_at) + (h / ratio) * p.d.dk + col;
    g_at[j] = int(layout.g_at) + h;
    row[j] += int(layout.delta_at);
  }
  for (int t = 0; t < p.tokens; ++t) {
    const float* slot = e.kept + state_floats + int64_t(t) * layout.floats;
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      if (w[j] >= words) continue;
      const float g = slot[g_at[j]], delta = slot[row[j]];
      const float4 k = *reinterpret_cast<const float4*>(slot + k_at[j]);
      s[j].x = fmaf(g, s[j].x, __fmul_rn(k.x, delta));
      s[j].y = fmaf(g, s[j].y, __fmul_rn(k.y, delta));
      s[j].z = fmaf(g, s[j].z, __fmul_rn(k.z, delta));
      s[j].w = fmaf(g, s[j].w, __fmul_rn(k.w, delta));
    }
  }
#pragma unroll
  for (int j = 0; j < kWordsPerThread; ++j)
    if (w[j] < words) state[w[j]] = s[j];
}

}  // namespace

void gdn_state_replay(const GdnReplay* entries, int count, const GdnDims& d, int tokens, cudaStream_t stream) {
  TERN_CHECK(count >= 0 && (count == 0 || entries), "gdn_state_replay: ", count, " entries");
  TERN_CHECK(gdn_decode_supported(d), "gdn_state_replay: needs dk = dv = 128 and Hv = 2·Hk (got dk ", d.dk, ", dv ",
             d.dv, ", Hk ", d.Hk, ", Hv ", d.Hv, ")");
  TERN_CHECK(tokens >= 0 && tokens <= kGdnDecodeMaxTokens, "gdn_state_replay: ", tokens, " tokens (0..",
             kGdnDecodeMaxTokens, ")");
  ReplayParams p;
  p.d = d;
  p.tokens = tokens;
  const int64_t state_floats = int64_t(d.Hv) * d.dv * d.dk;
  TERN_CHECK(GdnReplayLayout::of(d).floats <= INT32_MAX && state_floats / (d.dk / 4) <= INT32_MAX,
             "gdn_state_replay: ", d.Hv, " v-heads");
  const int64_t blocks = (state_floats / 4 + kBlockWords - 1) / kBlockWords;
  for (int at = 0; at < count; at += kGdnReplayMaxEntries) {
    const int n = std::min(count - at, kGdnReplayMaxEntries);
    for (int i = 0; i < n; ++i) {
      const GdnReplay& e = entries[at + i];
      TERN_INTERNAL_CHECK(e.state && e.kept && aligned16(e.state) && aligned16(e.kept),
                          "gdn_state_replay: entry ", at + i, " null or not 16-byte aligned");
      p.entry[i] = e;
    }
    gdn_replay_kernel<<<dim3(unsigned(blocks), unsigned(n)), kThreads, 0, stream>>>(p);
    TERN_CUDA_LAUNCHED("gdn_state_replay");
  }
}

}  // namespace tern::cuda
