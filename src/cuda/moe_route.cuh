// The one-token router's pieces (moe_decode.cu's router, the cluster router, the fused MoE block): 8-bit row dots and
// top-k routing of one token by one warp. Included by .cu files only.
#pragma once

#include <cstdint>

#include "cuda/device_weights.cuh"
#include "cuda/launch.cuh"
#include "cuda/qmv_tile.cuh"
#include "cuda/warp_reduce.cuh"

namespace tern::cuda {

// The 16 bytes of 8-bit weights q[0..15] (columns c..c+15 of one group) as exact floats (byte → 2^23 + q → q).
__device__ __forceinline__ void router_unpack16(const uint4& w, float qf[16]) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int j = 0; j < 16; ++j)
    qf[j] = __uint_as_float(__byte_perm(wv[j / 4], 0x4B000000u, 0x7440u | uint32_t(j & 3))) - 8388608.0f;
}

// Σ x over one lane's 16 columns (x in registers), in the order router_dot16 sums them.
__device__ __forceinline__ float router_sum16(const float x[16]) {
  float sx = 0.0f;
#pragma unroll
  for (int v = 0; v < 4; ++v) sx += (x[4 * v] + x[4 * v + 1]) + (x[4 * v + 2] + x[4 * v + 3]);
  return sx;
}

// acc += s·Σ q·x + b·sx over 16 columns with x in registers and sx = router_sum16(x).
__device__ __forceinline__ float router_dot16_regs(const float qf[16], const float x[16], float sx, float s, float b,
                                                   float acc) {
  float dq = 0.0f;
#pragma unroll
  for (int v = 0; v < 4; ++v)
    dq = fmaf(qf[4 * v], x[4 * v],
              fmaf(qf[4 * v + 1], x[4 * v + 1], fmaf(qf[4 * v + 2], x[4 * v + 2], fmaf(qf[4 * v + 3], x[4 * v + 3], dq))));
  return fmaf(s, dq, fmaf(b, sx, acc));
}

// acc += s·Σ q·x + b·Σ x over 16 columns, x: 16 floats (16-byte aligned) — one lane's slice of an 8-bit router row.
__device__ __forceinline__ float router_dot16(const float qf[16], const float* x, float s, float b, float acc) {
  float xv[16];
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const float4 f = reinterpret_cast<const float4*>(x)[v];
    xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
  }
  return router_dot16_regs(qf, xv, router_sum16(xv), s, b, acc);
}

// ---- one warp's rows of [router; shared-expert gate] (8-bit, group 64, D = 512·NCH) for one token -------------------
// Row i of the warp is row0 + step·i (rows past E skipped; row E is the shared-expert gate); lane l holds 16 bytes of
// each 512-column chunk c (columns 512·c + 16·l ..), loaded before pdl_wait, and reads x·norm_w from a shared array
// padded to 20 floats per 16-column slice (router_padded: the 8 lanes of a quarter-warp hit distinct bank quads).
constexpr int kRouterSlicePad = 20;
__device__ __forceinline__ int router_padded(int c4) { return (c4 / 4) * kRouterSlicePad + (c4 % 4) * 4; }

// The whole block: xs (router_padded) = hidden·norm_w over D columns; returns 1/rms(hidden) (ss_part: a shared float
// per warp, rinv_s: a shared float). Calls pdl_trigger once hidden is read: call it right after pdl_wait.
__device__ __forceinline__ float router_stage_x(const float* hidden, const float* norm_w, int D, float eps, float* xs,
                                                float* ss_part, float& rinv_s) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31, warps = int(blockDim.x) / 32;
  float ss = 0.0f;
  for (int c4 = int(threadIdx.x); c4 < D / 4; c4 += int(blockDim.x)) {
    const float4 x = reinterpret_cast<const float4*>(hidden)[c4];
    const float4 nw = reinterpret_cast<const float4*>(norm_w)[c4];
    ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
    *reinterpret_cast<float4*>(xs + router_padded(c4)) = make_float4(x.x * nw.x, x.y * nw.y, x.z * nw.z, x.w * nw.w);
  }
  ss = warp_sum(ss);
  if (lane == 0) ss_part[warp] = ss;
  __syncthreads();
  pdl_trigger();  // the inputs are read
  if (threadIdx.x == 0) {
    float v = 0.0f;
    for (int w = 0; w < warps; ++w) v += ss_part[w];
    rinv_s = 1.0f / sqrtf(v / float(D) + eps);
  }
  __syncthreads();
  return rinv_s;
}

template <int R, int NCH>
struct RouterRows {
  uint4 wq[R][NCH];
  uint32_t wsb[R][NCH];  // bf16 scale (low half), bias (high half)
};

template <int R, int NCH>
__device__ __forceinline__ void router_load_rows(const DMat& router, const DMat& sgate, int E, int row0, int step,
                                                 int lane, RouterRows<R, NCH>& out) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int row = row0 + step * i;
    if (row > E) continue;
    const bool sh = row == E;
    const DMat& m = sh ? sgate : router;
    const int64_t mrow = sh ? 0 : row;
    const uint32_t* words = static_cast<const uint32_t*>(m.data) + mrow * m.row_words + 4 * lane;
    const int64_t g0 = mrow * m.groups_per_row + lane / 4;
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      out.wq[i][c] = qtile::ld_weights_u4(words + c * 128);
      out.wsb[i][c] = qtile::ld_const_u16(m.scales + g0 + 8 * c) | (qtile::ld_const_u16(m.biases + g0 + 8 * c) << 16);
    }
  }
}

// acc[i] = Σ_g s_g·Σ q·xw + b_g·Σ xw of row i (the lane's part; warp_sum gives the logit before the RMSNorm factor),
// each slice of xs read once for the warp's rows.
template <int R, int NCH>
__device__ __forceinline__ void router_dot_rows(const RouterRows<R, NCH>& w, const float* xs, int E, int row0, int step,
                                                int lane, float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int c = 0; c < NCH; ++c) {
    float xv[16];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 f = *reinterpret_cast<const float4*>(xs + (c * 32 + lane) * kRouterSlicePad + 4 * v);
      xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
    }
    const float sx = router_sum16(xv);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (row0 + step * i > E) continue;
      float qf[16];
      router_unpack16(w.wq[i][c], qf);
      acc[i] = router_dot16_regs(qf, xv, sx, __uint_as_float(w.wsb[i][c] << 16),
                                 __uint_as_float(w.wsb[i][c] & 0xffff0000u), acc[i]);
    }
  }
}

// One warp per token: p = softmax(logits) (fp32), the k largest (ties: lower index) in descending order, weights
// renormalised over them — cpu::moe_route. Lane l holds experts l·NP .. l·NP + NP − 1; each of the k rounds is a warp
// arg-max (redux.sync on the probability bits, then on the index among the equal ones). Returns (in lane j < k) the
// j-th choice. kGlobal: logits in global memory written by other blocks of this kernel (read through L2); else
// shared memory.
template <int NP, bool kGlobal>
__device__ void route_token(const float* logits, int E, int k, int* ids, float* w, int lane, int& my_id) {
  float p[NP];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int e = lane * NP + i;
    p[i] = e < E ? (kGlobal ? __ldcg(logits + e) : logits[e]) : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    p[i] = lane * NP + i < E ? expf(p[i] - mx) : 0.0f;
    sum += p[i];
  }
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  uint32_t key[NP];  // probability bits + 1 (monotonic for p >= 0); 0: no expert or taken
#pragma unroll
  for (int i = 0; i < NP; ++i) key[i] = lane * NP + i < E ? __float_as_uint(p[i] * inv) + 1u : 0u;
  float top = 0.0f, my_p = 0.0f;
  my_id = 0;
  for (int j = 0; j < k; ++j) {
    uint32_t bk = 0u;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < NP; ++i)
      if (key[i] > bk) {
        bk = key[i];
        bi = lane * NP + i;
      }
    const uint32_t m = __reduce_max_sync(0xffffffffu, bk);
    const int win = __reduce_min_sync(0xffffffffu, bk == m ? bi : 0x7fffffff);
    const float pv = __uint_as_float(m - 1u);
    top += pv;
    if (lane == j) {
      my_p = pv;
      my_id = win;
    }
#pragma unroll
    for (int i = 0; i < NP; ++i)
      if (lane * NP + i == win) key[i] = 0u;
  }
  if (lane < k) {
    ids[lane] = my_id;
    w[lane] = my_p / top;
  }
}

}  // namespace tern::cuda
