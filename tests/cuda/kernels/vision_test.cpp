// The vision encoder's CUDA kernels (src/cuda/kernels/vision) against their CPU twins, on fresh random inputs with
// outputs poisoned (NaN) beforehand:
//   vision_gemm             a plain double-precision loop over the same bf16 inputs (fp32 accumulation on the GPU:
//                           error ~1e-6 of Σ|x·w|; a bf16 output adds its rounding, 2^-9 relative)
//   vision_attn_prepare     cpu::rope_apply_angles, then bf16 rounding (one bf16 step apart at most: cos/sin and
//                           fused multiply-adds may differ in the last fp32 bit)
//   vision_attention        cpu::attention_segments over the same bf16 q, k, v (the GPU rounds the softmax weights
//                           to bf16: error at most 2^-9·max|v| per output, and the output's own rounding)
//   vision_layernorm        cpu::layer_norm, then bf16 rounding
//   vision_add_positions    a float-exact loop
#include <cmath>
#include <random>
#include <vector>

#include "../cuda_test_util.h"
#include "cpu/ops_attention.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"
#include "cpu/ops_vision.h"
#include "cuda/kernels/vision/vision_attention.cuh"
#include "cuda/kernels/vision/vision_embed.cuh"
#include "cuda/kernels/vision/vision_gemm.cuh"
#include "cuda/kernels/vision/vision_layernorm.cuh"

namespace tern::cuda::test {
namespace {

// Random values already on the bf16 grid, and their bits.
struct Bf16Values {
  std::vector<float> f;
  std::vector<uint16_t> bits;
};
Bf16Values random_bf16(std::mt19937_64& rng, size_t n, float lo, float hi) {
  Bf16Values v;
  v.f = random_floats(rng, n, lo, hi);
  v.bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    v.bits[i] = float_to_bf16(v.f[i]);
    v.f[i] = bf16_to_float(v.bits[i]);
  }
  return v;
}

std::vector<float> bits_to_floats(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_float(b[i]);
  return f;
}

float act_ref(float v, VisionAct act) {
  if (act == VisionAct::gelu_tanh) return cpu::gelu_tanh(v);
  if (act == VisionAct::gelu_erf) return cpu::gelu_erf(v);
  return v;
}

struct GemmCase {
  int64_t M, N, K;
  VisionAct act;
  bool accumulate;
};

void check_gemm(std::mt19937_64& rng, const GemmCase& gc) {
  const int64_t M = gc.M, N = gc.N, K = gc.K;
  const float a = 1.0f / std::sqrt(float(K));
  const Bf16Values x = random_bf16(rng, size_t(M * K), -2.0f, 2.0f), w = random_bf16(rng, size_t(N * K), -a, a);
  const std::vector<float> bias = random_floats(rng, size_t(N), -0.5f, 0.5f);
  const std::vector<float> y0 = random_floats(rng, size_t(M * N), -1.0f, 1.0f);
  DeviceBuf<uint16_t> dx(x.bits), dw(w.bits), dy16(size_t(M * N));
  DeviceBuf<float> dbias(bias), dy(size_t(M * N));
  if (gc.accumulate) TERN_CUDA(cudaMemcpy(dy.p, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
  vision_gemm({.x = dx.p, .w = dw.p, .bias = dbias.p, .M = M, .N = N, .K = K, .act = gc.act, .y_f32 = dy.p,
               .accumulate = gc.accumulate, .y_bf16 = dy16.p},
              nullptr);
  const std::vector<float> got = dy.host(), got16 = bits_to_floats(dy16.host());

  size_t bad = 0, bad16 = 0;
  std::string first;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(x.f[size_t(m * K + k)]) * double(w.f[size_t(n * K + k)]);
        dot += p;
        mag += std::fabs(p);
      }
      const float v = act_ref(float(dot + bias[size_t(n)]), gc.act);
      const size_t i = size_t(m * N + n);
      const double tol = 1e-5 * (mag + std::fabs(bias[size_t(n)])) + 1e-6;
      const double want = gc.accumulate ? double(v) + y0[i] : double(v);
      if (!(std::fabs(got[i] - want) <= tol + 1e-6 * std::fabs(want))) {
        if (bad++ == 0)
          first = "f32 at (" + std::to_string(m) + ", " + std::to_string(n) + "): got " + std::to_string(got[i]) +
                  ", want " + std::to_string(want);
      }
      // The bf16 output is bf16(v) (+ the accumulated value when accumulating: bf16 of the f32 output).
      if (!(std::fabs(got16[i] - want) <= tol + std::ldexp(std::fabs(want), -8) + 1e-6)) {
        if (bad16++ == 0)
          first += " bf16 at (" + std::to_string(m) + ", " + std::to_string(n) + "): got " + std::to_string(got16[i]) +
                   ", want " + std::to_string(want);
      }
    }
  EXPECT_EQ(bad, 0u) << "gemm [" << M << ", " << K << "] x [" << N << ", " << K << "]ᵀ act " << int(gc.act)
                     << " accumulate " << gc.accumulate << ": " << first;
  EXPECT_EQ(bad16, 0u) << "gemm bf16 output [" << M << ", " << N << "]: " << first;
}

TEST(VisionKernels, GemmMatchesPlainLoop) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("vision gemm"));
  const GemmCase cases[] = {
      {1, 2, 8, VisionAct::none, false},            // smallest: one row, one column pair, one short K chunk
      {130, 258, 72, VisionAct::gelu_tanh, false},  // edges in M and N, K tail inside the first tile
      {129, 200, 1536, VisionAct::gelu_erf, true},  // the patch embedding's K, accumulate
      {257, 1152, 4304, VisionAct::none, true},     // the blocks' fc2: K = 4304 ends half-way into a tile
      {64, 4608, 1152, VisionAct::gelu_erf, false}, // the merger's widths (N over a tile row of blocks)
  };
  for (const GemmCase& gc : cases) check_gemm(rng, gc);
}

TEST(VisionKernels, GemmRejectsShapesItCannotTake) {
  TERN_REQUIRE_GPU();
  DeviceBuf<uint16_t> buf(1024);
  DeviceBuf<float> y(1024);
  EXPECT_THROW(vision_gemm({.x = buf.p, .w = buf.p, .M = 4, .N = 4, .K = 12, .y_f32 = y.p}, nullptr), Error);
  EXPECT_THROW(vision_gemm({.x = buf.p, .w = buf.p, .M = 4, .N = 3, .K = 16, .y_f32 = y.p}, nullptr), Error);
  EXPECT_THROW(vision_gemm({.x = buf.p, .w = buf.p, .M = 4, .N = 4, .K = 16}, nullptr), Error);
}

struct AttnCase {
  int H, dh;
  int64_t frames, L;
};

TEST(VisionKernels, AttentionMatchesCpuTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("vision attention"));
  const AttnCase cases[] = {
      {2, 72, 1, 300},   // Qwen3.6's head dim (padded to 80), a partial last key tile
      {2, 72, 3, 100},   // three frames: attention stays inside each
      {4, 16, 1, 60},    // the demo's heads, one partial tile
      {1, 128, 2, 64},   // the largest head dim, whole tiles
      {3, 64, 1, 4},     // one merge block
      {2, 40, 1, 130},   // head dim padded 40 -> 48
  };
  for (const AttnCase& ac : cases) {
    const int H = ac.H, dh = ac.dh, dhp = vision_attn_padded_dim(dh);
    const int64_t N = ac.frames * ac.L, D = int64_t(H) * dh;
    const VisionAttnDims d{.N = N, .frame_len = ac.L, .H = H, .dh = dh};
    const std::vector<float> qkv = random_floats(rng, size_t(N * 3 * D), -2.0f, 2.0f);
    const std::vector<float> angles = random_floats(rng, size_t(N * dh / 2), -40.0f, 40.0f);
    DeviceBuf<float> dqkv(qkv), dangles(angles);
    const size_t heads = size_t(H * N * dhp);
    DeviceBuf<uint16_t> dq(heads), dk(heads), dv(heads), dout(size_t(N * D));
    vision_attn_prepare(dqkv.p, dangles.p, d, dq.p, dk.p, dv.p, nullptr);
    vision_attention(dq.p, dk.p, dv.p, d, 1.0f / std::sqrt(float(dh)), dout.p, nullptr);
    const std::vector<uint16_t> gq = dq.host(), gk = dk.host(), gv = dv.host();

    // The CPU twin of the prepare step: split, rotate, round to bf16.
    std::vector<float> q(size_t(N * D)), k(size_t(N * D)), v(size_t(N * D));
    for (int64_t t = 0; t < N; ++t)
      for (int64_t i = 0; i < D; ++i) {
        q[size_t(t * D + i)] = qkv[size_t(t * 3 * D + i)];
        k[size_t(t * D + i)] = qkv[size_t(t * 3 * D + D + i)];
        v[size_t(t * D + i)] = qkv[size_t(t * 3 * D + 2 * D + i)];
      }
    cpu::rope_apply_angles(q.data(), N, H, dh, dh, angles.data());
    cpu::rope_apply_angles(k.data(), N, H, dh, dh, angles.data());
    // The GPU's q, k, v in the CPU layout [N, H·dh] (what the attention twin reads), checked on the way.
    std::vector<float> q16(q.size()), k16(k.size()), v16(v.size());
    size_t bad = 0;
    for (int h = 0; h < H; ++h)
      for (int64_t t = 0; t < N; ++t)
        for (int e = 0; e < dhp; ++e) {
          const size_t g = size_t((int64_t(h) * N + t) * dhp + e);
          if (e >= dh) {
            bad += gq[g] != 0 || gk[g] != 0 || gv[g] != 0;  // the padding is +0.0 exactly
            continue;
          }
          const size_t c = size_t(t * D + int64_t(h) * dh + e);
          q16[c] = bf16_to_float(gq[g]);
          k16[c] = bf16_to_float(gk[g]);
          v16[c] = bf16_to_float(gv[g]);
          auto near = [](float got, float want) {
            return std::fabs(got - round_bf16(want)) <= std::ldexp(std::fabs(want), -7) + 1e-5f;
          };
          bad += !near(q16[c], q[c]) || !near(k16[c], k[c]) || v16[c] != round_bf16(v[c]);
        }
    EXPECT_EQ(bad, 0u) << "vision_attn_prepare H " << H << " dh " << dh << ": elements off by more than a bf16 step";

    const std::vector<int64_t> bounds = [&] {
      std::vector<int64_t> b;
      for (int64_t f = 0; f <= ac.frames; ++f) b.push_back(f * ac.L);
      return b;
    }();
    std::vector<float> ref(size_t(N * D));
    cpu::attention_segments({.q = q16.data(), .k = k16.data(), .v = v16.data(), .N = N, .H = H, .dh = dh,
                             .bounds = bounds.data(), .segments = ac.frames, .scale = 1.0f / std::sqrt(float(dh)),
                             .out = ref.data()});
    expect_close(bits_to_floats(dout.host()), ref, 2.0f * 2.0f / 512.0f, 1.0f / 256.0f,
                 "vision_attention H " + std::to_string(H) + " dh " + std::to_string(dh) + " frames " +
                     std::to_string(ac.frames) + " of " + std::to_string(ac.L));
  }
}

TEST(VisionKernels, LayerNormMatchesCpuTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("vision layernorm"));
  for (const int64_t D : {int64_t(64), int64_t(1152), int64_t(4608)}) {
    const int64_t M = 37;
    const std::vector<float> x = random_floats(rng, size_t(M * D), 1.0f, 5.0f);  // mean far from 0
    const std::vector<float> w = random_floats(rng, size_t(D), 0.5f, 1.5f), b = random_floats(rng, size_t(D), -1, 1);
    DeviceBuf<float> dx(x), dw(w), db(b);
    DeviceBuf<uint16_t> dy(size_t(M * D));
    vision_layernorm(dx.p, dw.p, db.p, 1e-6f, M, D, dy.p, nullptr);
    std::vector<float> ref(x.size());
    cpu::layer_norm(x.data(), w.data(), b.data(), M, D, 1e-6f, ref.data());
    for (float& r : ref) r = round_bf16(r);
    expect_close(bits_to_floats(dy.host()), ref, 1e-4f, 1.0f / 128.0f, "vision_layernorm D " + std::to_string(D));
  }
}

TEST(VisionKernels, AddPositionsMatchesLoop) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("vision embed"));
  // Positions: a 6 x 10 grid resampled from an 8 x 8 table, the CPU encoder's taps.
  const int side = 8;
  const int64_t Dv = 96;
  const std::vector<cpu::VisionGrid> grids = {{1, 6, 10}};
  const cpu::VisionPosTaps taps = cpu::vision_pos_taps(grids, 2, side);
  const int64_t N = 60;
  const std::vector<float> table = random_floats(rng, size_t(side * side * Dv), -1.0f, 1.0f);
  const std::vector<float> x0 = random_floats(rng, size_t(N * Dv), -1.0f, 1.0f);
  DeviceBuf<float> dxx(x0), dtable(table), dweight(taps.weight);
  DeviceBuf<int32_t> dindex(taps.index);
  vision_add_positions(dxx.p, dtable.p, dindex.p, dweight.p, N, Dv, nullptr);
  std::vector<float> ref = x0;
  for (int64_t t = 0; t < N; ++t)
    for (int64_t d = 0; d < Dv; ++d) {
      float sum = 0.0f;
      for (int j = 0; j < 4; ++j)
        sum += table[size_t(taps.index[size_t(4 * t + j)] * Dv + d)] * taps.weight[size_t(4 * t + j)];
      ref[size_t(t * Dv + d)] += sum;
    }
  expect_close(dxx.host(), ref, 1e-6f, 1e-6f, "vision_add_positions");
}

}  // namespace
}  // namespace tern::cuda::test
