#include "cpu/ops_conv1d.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "cpu/ops_elementwise.h"

namespace tern::cpu {

void conv1d_causal_silu(const Conv1dArgs& a) {
  TERN_CHECK(a.Ck >= 1 && a.C > 0 && a.T >= 0, "conv1d: bad shape T=", a.T, " C=", a.C, " Ck=", a.Ck);
  TERN_CHECK(a.x && a.w && a.y && (a.Ck == 1 || a.state), "conv1d: null pointer");
  if (a.T == 0) return;
  const int64_t C = a.C, T = a.T;
  const int H = a.Ck - 1;  // history length
  // Parallel over channel blocks: each channel is independent.
  thread_pool_global().parallel_for(C, 256, [&](int64_t c0, int64_t c1) {
    std::vector<float> hist(static_cast<size_t>(H + T));
    for (int64_t c = c0; c < c1; ++c) {
      // hist = [state rows (oldest first), x[0..T)] for this channel.
      for (int j = 0; j < H; ++j) hist[size_t(j)] = a.state[j * C + c];
      for (int64_t t = 0; t < T; ++t) hist[size_t(H + t)] = a.x[t * C + c];
      const float* w = a.w + c * a.Ck;
      for (int64_t t = 0; t < T; ++t) {
        float u = 0.0f;
        for (int j = 0; j < a.Ck; ++j) u += w[j] * hist[size_t(t + j)];
        a.y[t * C + c] = silu(u);
      }
      for (int j = 0; j < H; ++j) a.state[j * C + c] = hist[size_t(T + j)];
    }
  });
}

}  // namespace tern::cpu
