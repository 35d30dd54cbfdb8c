#include "cuda/kernels/conv1d/conv1d.cuh"

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"

namespace tern::cuda {
namespace {

constexpr int kMaxTaps = 8;
constexpr int kTokenTile = 32;  // tokens per thread: grid (channel groups, ⌈T/32⌉)
constexpr int kThreads = 128;

// Thread (channel group, token tile): kVec consecutive channels c.. over tokens t0..t0+31, window in registers.
// The window before t0 comes from x (t0 > 0) or from the state (tile 0). Only tile 0's thread touches the state of
// its channels: it reads the old state first and writes the new one last, so no other thread races with it.
//   x [T, ldx], out [T, C], w [C, Ck], state [Ck-1, C].  kTaps ≥ Ck (taps unrolled, guarded by Ck).
// kNorm (kVec = 4, heads of 128 channels: a warp's 32 × 4 channels are one head): the outputs of channels below
// k_end are L2-normalised per head and token, those below q_end also scaled by q_scale.
template <int kVec, int kTaps, bool kNorm = false>
__global__ void __launch_bounds__(kThreads) conv1d_silu_kernel(const float* x, int64_t ldx, int64_t T, int64_t C,
                                                               int Ck, const float* w, float* state, float* out,
                                                               int64_t q_end, int64_t k_end, float q_scale) {
  static_assert(!kNorm || kVec == 4, "the fused norm needs a warp per 128-channel head");
  const int64_t c = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  const int64_t t0 = int64_t(blockIdx.y) * kTokenTile;
  const int64_t t1 = T < t0 + kTokenTile ? T : t0 + kTokenTile;
  const bool active = c < C;
  float wc[kVec][kTaps], win[kVec][kTaps];
#pragma unroll
  for (int v = 0; v < kVec; ++v)
#pragma unroll
    for (int j = 0; j < kTaps; ++j) {
      wc[v][j] = active && j < Ck ? w[(c + v) * Ck + j] : 0.0f;  // weights: launch constants, before pdl_wait
      win[v][j] = 0.0f;
    }
  pdl_wait();
  pdl_trigger();
  if (!active) return;
  auto load = [&](const float* p, float (&dst)[kVec]) {
    if constexpr (kVec == 4) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      dst[0] = q.x;
      dst[1] = q.y;
      dst[2] = q.z;
      dst[3] = q.w;
    } else {
      dst[0] = *p;
    }
  };
  // history: token t0 − (Ck−1) + j for j < Ck−1 (negative tokens are state rows)
#pragma unroll
  for (int j = 0; j + 1 < kTaps; ++j) {
    if (j >= Ck - 1) continue;
    const int64_t tt = t0 - (Ck - 1) + j;
    float v[kVec];
    load(tt >= 0 ? x + tt * ldx + c : state + (tt + Ck - 1) * C + c, v);
#pragma unroll
    for (int q = 0; q < kVec; ++q) win[q][j] = v[q];
  }
#pragma unroll 4
  for (int64_t t = t0; t < t1; ++t) {
    float xv[kVec], y[kVec];
    load(x + t * ldx + c, xv);
#pragma unroll
    for (int q = 0; q < kVec; ++q) {
      float u = 0.0f;
#pragma unroll
      for (int j = 0; j < kTaps; ++j) {
        if (j == Ck - 1) win[q][j] = xv[q];
        if (j < Ck) u += wc[q][j] * win[q][j];
      }
      y[q] = u / (1.0f + expf(-u));
#pragma unroll
      for (int j = 0; j + 1 < kTaps; ++j)
        if (j < Ck - 1) win[q][j] = win[q][j + 1];
    }
    if constexpr (kNorm) {
      if (c < k_end) {  // uniform over the warp (heads are warp-aligned)
        float ss = 0.0f;
#pragma unroll
        for (int q = 0; q < kVec; ++q) ss += y[q] * y[q];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        float inv = rsqrtf(ss + 1e-6f);
        if (c < q_end) inv *= q_scale;
#pragma unroll
        for (int q = 0; q < kVec; ++q) y[q] *= inv;
      }
    }
    if constexpr (kVec == 4)
      *reinterpret_cast<float4*>(out + t * C + c) = make_float4(y[0], y[1], y[2], y[3]);
    else
      out[t * C + c] = y[0];
  }
  if (blockIdx.y != 0) return;
  // new state row j = input T − (Ck−1) + j (a state row when negative); all read before any write
  float ns[kTaps][kVec];
#pragma unroll
  for (int j = 0; j + 1 < kTaps; ++j) {
    if (j >= Ck - 1) continue;
    const int64_t tt = T - (Ck - 1) + j;
    load(tt >= 0 ? x + tt * ldx + c : state + (tt + Ck - 1) * C + c, ns[j]);
  }
#pragma unroll
  for (int j = 0; j + 1 < kTaps; ++j) {
    if (j >= Ck - 1) continue;
    if constexpr (kVec == 4)
      *reinterpret_cast<float4*>(state + j * C + c) = make_float4(ns[j][0], ns[j][1], ns[j][2], ns[j][3]);
    else
      state[j * C + c] = ns[j][0];
  }
}

}  // namespace

void conv1d_silu_qknorm(const float* x, int64_t ldx, int64_t T, int64_t C, int Ck, const float* w, float* state,
                        float* out, int64_t q_channels, int64_t k_channels, int head_dim, cudaStream_t stream) {
  TERN_CHECK(Ck >= 1 && Ck <= kMaxTaps, "conv1d: kernel width ", Ck, " not in [1, ", kMaxTaps, "]");
  TERN_CHECK(T >= 0 && C >= 0 && ldx >= C, "conv1d: bad shape T=", T, " C=", C, " ldx=", ldx);
  TERN_CHECK(head_dim == 128 && q_channels % 128 == 0 && k_channels % 128 == 0 && q_channels + k_channels <= C,
             "conv1d_silu_qknorm: needs heads of 128 channels (head_dim ", head_dim, ", q ", q_channels, ", k ",
             k_channels, ", C ", C, ")");
  TERN_CHECK(C % 4 == 0 && ldx % 4 == 0 && aligned16(x) && aligned16(out) && (Ck == 1 || aligned16(state)),
             "conv1d_silu_qknorm: needs C and ldx multiples of 4 and 16-byte aligned x, out and state");
  if (C == 0 || T == 0) return;
  const dim3 block(kThreads);
  const dim3 grid(blocks_for(C / 4, kThreads), unsigned((T + kTokenTile - 1) / kTokenTile));
  const float q_scale = 1.0f / sqrtf(float(head_dim));
  const int64_t k_end = q_channels + k_channels;
  if (Ck <= 4)
    launch_pdl("conv1d_silu_qknorm", conv1d_silu_kernel<4, 4, true>, grid, block, 0, stream, x, ldx, T, C, Ck, w,
               state, out, q_channels, k_end, q_scale);
  else
    launch_pdl("conv1d_silu_qknorm", conv1d_silu_kernel<4, kMaxTaps, true>, grid, block, 0, stream, x, ldx, T, C, Ck,
               w, state, out, q_channels, k_end, q_scale);
}

void conv1d_silu(const float* x, int64_t ldx, int64_t T, int64_t C, int Ck, const float* w, float* state, float* out,
                 cudaStream_t stream) {
  TERN_CHECK(Ck >= 1 && Ck <= kMaxTaps, "conv1d: kernel width ", Ck, " not in [1, ", kMaxTaps, "]");
  TERN_CHECK(T >= 0 && C >= 0 && ldx >= C, "conv1d: bad shape T=", T, " C=", C, " ldx=", ldx);
  if (C == 0 || T == 0) return;
  const bool vec = C % 4 == 0 && ldx % 4 == 0 && aligned16(x) && aligned16(out) && (Ck == 1 || aligned16(state));
  const dim3 block(kThreads);
  const dim3 grid(blocks_for(vec ? C / 4 : C, kThreads), unsigned((T + kTokenTile - 1) / kTokenTile));
  if (vec && Ck <= 4)
    launch_pdl("conv1d_silu", conv1d_silu_kernel<4, 4>, grid, block, 0, stream, x, ldx, T, C, Ck, w, state, out,
               int64_t(0), int64_t(0), 1.0f);
  else if (vec)
    launch_pdl("conv1d_silu", conv1d_silu_kernel<4, kMaxTaps>, grid, block, 0, stream, x, ldx, T, C, Ck, w, state, out,
               int64_t(0), int64_t(0), 1.0f);
  else
    launch_pdl("conv1d_silu", conv1d_silu_kernel<1, kMaxTaps>, grid, block, 0, stream, x, ldx, T, C, Ck, w, state, out,
               int64_t(0), int64_t(0), 1.0f);
}

}  // namespace tern::cuda
