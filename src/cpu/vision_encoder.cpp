#include "cpu/vision_encoder.h"

#include <cmath>

#include "core/check.h"
#include "core/thread_pool.h"
#include "cpu/ops_attention.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_matmul.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"

namespace tern::cpu {
namespace {

constexpr float kLayerNormEps = 1e-6f;  // every LayerNorm of the vision tower

// y[n, W.rows] = x[n, W.cols] · Wᵀ + bias
void linear(const Matrix& W, const std::vector<float>& bias, const float* x, int64_t n, float* y) {
  matmul(W, x, n, y);
  const int64_t r = W.rows;
  thread_pool_global().parallel_for(n, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) add_inplace(y + t * r, bias.data(), r);
  });
}

void layer_norm_rows(const float* x, const std::vector<float>& w, const std::vector<float>& b, int64_t n, int64_t d,
                     float* y) {
  thread_pool_global().parallel_for(n, 16, [&](int64_t t0, int64_t t1) {
    layer_norm(x + t0 * d, w.data(), b.data(), t1 - t0, d, kLayerNormEps, y + t0 * d);
  });
}

template <typename F>
void apply(float* x, int64_t n, F f) {
  thread_pool_global().parallel_for(n, 1 << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] = f(x[i]);
  });
}

// x [N, Dv] += one block.
void vision_block(const VisionWeights& w, const VisionBlockWeights& b, const std::vector<float>& angles,
                  const std::vector<int64_t>& segments, int64_t N, float* x) {
  const VisionConfig& c = w.config;
  const int64_t Dv = c.hidden_size, Iv = c.intermediate_size;
  const int H = c.num_heads, dh = c.head_dim();
  std::vector<float> h(size_t(N * Dv)), qkv(size_t(N * 3 * Dv));
  layer_norm_rows(x, b.norm1_weight, b.norm1_bias, N, Dv, h.data());
  linear(b.qkv, b.qkv_bias, h.data(), N, qkv.data());  // [N, 3, H, dh]
  std::vector<float> q(size_t(N * Dv)), k(size_t(N * Dv)), v(size_t(N * Dv));
  for (int64_t t = 0; t < N; ++t) {
    const float* row = qkv.data() + t * 3 * Dv;
    std::copy(row, row + Dv, q.data() + t * Dv);
    std::copy(row + Dv, row + 2 * Dv, k.data() + t * Dv);
    std::copy(row + 2 * Dv, row + 3 * Dv, v.data() + t * Dv);
  }
  rope_apply_angles(q.data(), N, H, dh, dh, angles.data());
  rope_apply_angles(k.data(), N, H, dh, dh, angles.data());
  SegmentAttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.N = N;
  a.H = H;
  a.dh = dh;
  a.bounds = segments.data();
  a.segments = int64_t(segments.size()) - 1;
  a.scale = 1.0f / std::sqrt(float(dh));
  a.out = h.data();
  attention_segments(a);
  linear(b.proj, b.proj_bias, h.data(), N, q.data());
  add_inplace(x, q.data(), N * Dv);

  layer_norm_rows(x, b.norm2_weight, b.norm2_bias, N, Dv, h.data());
  std::vector<float> mid(size_t(N * Iv));
  linear(b.fc1, b.fc1_bias, h.data(), N, mid.data());
  if (c.hidden_act == "gelu") apply(mid.data(), N * Iv, gelu_erf);
  else apply(mid.data(), N * Iv, gelu_tanh);
  linear(b.fc2, b.fc2_bias, mid.data(), N, h.data());
  add_inplace(x, h.data(), N * Dv);
}

}  // namespace

std::vector<float> vision_encode(const VisionWeights& w, const float* pixel_values, int64_t rows, int64_t cols,
                                 const std::vector<VisionGrid>& grids) {
  const VisionConfig& c = w.config;
  const int M = c.spatial_merge_size;
  const int64_t Dv = c.hidden_size, Dm = c.merged_dim();
  const int64_t N = vision_patch_count(grids, M);
  TERN_CHECK(cols == c.patch_dim(), "vision: pixel_values rows hold ", cols, " values, the encoder takes ",
             c.patch_dim(), " (", c.in_channels, " x ", c.temporal_patch_size, " x ", c.patch_size, " x ",
             c.patch_size, ")");
  TERN_CHECK(rows == N, "vision: pixel_values has ", rows, " rows but the grids hold ", N, " patches");

  // Patch embedding and the resampled learned positions.
  std::vector<float> x(size_t(N * Dv));
  linear(w.patch_embed, w.patch_embed_bias, pixel_values, N, x.data());
  const VisionPosTaps taps = vision_pos_taps(grids, M, c.grid_per_side());
  thread_pool_global().parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(static_cast<size_t>(Dv));
    std::vector<float> sum(static_cast<size_t>(Dv));
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int k = 0; k < 4; ++k) {
        const int32_t idx = taps.index[size_t(4 * t + k)];
        TERN_CHECK(idx >= 0 && idx < w.pos_embed.rows, "vision: position tap ", idx, " outside the table");
        matrix_row_to_f32(w.pos_embed, idx, row.data());
        const float wt = taps.weight[size_t(4 * t + k)];
        for (int64_t d = 0; d < Dv; ++d) sum[size_t(d)] += row[size_t(d)] * wt;
      }
      add_inplace(x.data() + t * Dv, sum.data(), Dv);
    }
  });

  const std::vector<float> angles = vision_rope_angles(grids, M, c.head_dim(), c.rope_theta);
  const std::vector<int64_t> segments = vision_segments(grids);
  for (const VisionBlockWeights& b : w.blocks) vision_block(w, b, angles, segments, N, x.data());

  // Merger: LN per patch, M² consecutive patches (one merge block) as one row, two projections.
  layer_norm_rows(x.data(), w.merger_norm_weight, w.merger_norm_bias, N, Dv, x.data());
  const int64_t tokens = N / (int64_t(M) * M);
  std::vector<float> mid(size_t(tokens * Dm));
  linear(w.merger_fc1, w.merger_fc1_bias, x.data(), tokens, mid.data());
  apply(mid.data(), tokens * Dm, gelu_erf);
  std::vector<float> out(size_t(tokens * c.out_hidden_size));
  linear(w.merger_fc2, w.merger_fc2_bias, mid.data(), tokens, out.data());
  return out;
}

}  // namespace tern::cpu
