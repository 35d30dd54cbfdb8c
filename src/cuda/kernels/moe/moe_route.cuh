// Top-k routing of one token by one warp (moe_decode.cu's router and the cluster router). Included by .cu files only.
#pragma once

#include <cstdint>

#include "cuda/common/warp_reduce.cuh"

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
