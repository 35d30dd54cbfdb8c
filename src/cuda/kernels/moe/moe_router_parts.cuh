// Parts of the multi-block ("ticket") MoE router for up to kT tokens, shared by its kernel (moe_router_kernel in
// moe_decode.cu) and the fused router + gate_up kernel (moe_router_gate_up.cu), so that both compute x̂, the logits,
// the routing and the shared gate with the same instructions in the same order, hence the same bits. A block is
// kRouterWarps warps; it stages x·norm_w and the RMSNorm factor itself, each warp computes one row of
// [router; shared_expert_gate] at a time, and the last block to take a ticket routes. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/moe/moe_route.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda::router_parts {

constexpr int kRouterWarps = 8;      // warps per router block (one row of [router; shared gate] per warp at a time)
constexpr int kRouterMaxChunks = 8;  // fast form: D <= 8 · 512

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// x·norm_w staged in shared memory (fp32), [kT][ldxs]: 4 floats of padding after every 64 columns, so that the lanes'
// 16-column slices (64 bytes apart) fall on different banks.
__host__ __device__ constexpr int router_ldxs(int D) { return D + (D / 64 + 1) * 4; }
__device__ __forceinline__ int router_pad(int c) { return c + (c / 64) * 4; }

// The router's fast form: 8-bit weights of group 64, D a multiple of 512 up to kRouterMaxChunks · 512, 16-byte
// aligned rows.
inline bool router_fast8(const DMat& m) {
  return m.format == WeightFormat::affine8 && m.group_size == 64 && m.cols % 512 == 0 &&
         m.cols <= 512 * kRouterMaxChunks && m.row_words == m.cols / 4 &&
         (reinterpret_cast<uintptr_t>(m.data) & 15) == 0;
}

// What lane `lane` reads of one fast-form row: 16 bytes of each 512-column chunk i (columns 512·i + 16·lane ..,
// inside one group) and that group's bf16 scale and bias.
struct RouterRow8 {
  uint4 wq[kRouterMaxChunks];
  uint32_t ws[kRouterMaxChunks], wb[kRouterMaxChunks];
};

// Loads row `row` of [router; sgate] (row E: the shared-expert gate) for lane `lane`, nch = D / 512 chunks (weights:
// may be read before pdl_wait).
__device__ __forceinline__ void router_row_load8(const DMat& router, const DMat& sgate, int row, int E, int nch,
                                                 int lane, RouterRow8& r) {
  const bool shared_row = row == E;
  const int64_t mrow = shared_row ? 0 : row;
  const uint32_t* words = static_cast<const uint32_t*>(shared_row ? sgate.data : router.data) +
                          mrow * (shared_row ? sgate.row_words : router.row_words) + 4 * lane;
  const int64_t g0 = mrow * (shared_row ? sgate.groups_per_row : router.groups_per_row) + lane / 4;
  const uint16_t* sc = (shared_row ? sgate.scales : router.scales) + g0;
  const uint16_t* bi = (shared_row ? sgate.biases : router.biases) + g0;
#pragma unroll
  for (int i = 0; i < kRouterMaxChunks; ++i)
    if (i < nch) {
      r.wq[i] = qtile::ld_weights_u4(words + i * 128);
      r.ws[i] = qtile::ld_const_u16(sc + 8 * i);
      r.wb[i] = qtile::ld_const_u16(bi + 8 * i);
    }
}

// The whole block stages token t's x·norm_w (t < T <= kT; hidden [T, D], norm_w [D], both 16-byte aligned) into xs
// ([kT][ldxs], router_pad layout) and its RMSNorm factor 1 / sqrt(mean(x²) + eps) into rinv[t]: one pass over x,
// thread columns c4 = tid, tid + blockDim, ... (float4), tokens clamped so that every load is valid and all are issued
// together; Σx² summed by each thread, then its warp, then over the kRouterWarps warps in order (ss_part
// [kRouterWarps][kT] the block's partial sums). Ends with a barrier.
template <int kT>
__device__ __forceinline__ void router_stage(const float* hidden, const float* norm_w, int D, int T, float eps,
                                             float* xs, int ldxs, float (*ss_part)[kT], float* rinv) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  float ss[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) ss[t] = 0.0f;
  for (int c4 = threadIdx.x; c4 < D / 4; c4 += blockDim.x) {
    const float4 nw = reinterpret_cast<const float4*>(norm_w)[c4];
    float4 xv[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t)
      if (t < T) xv[t] = reinterpret_cast<const float4*>(hidden + int64_t(t) * D)[c4];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (t < T) {
        const float4 x = xv[t];
        ss[t] = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss[t]))));
        *reinterpret_cast<float4*>(xs + t * ldxs + router_pad(4 * c4)) =
            make_float4(x.x * nw.x, x.y * nw.y, x.z * nw.z, x.w * nw.w);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t < T) {
      const float v = warp_sum(ss[t]);
      if (lane == 0) ss_part[warp][t] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < kT) {
    float v = 0.0f;
    for (int w = 0; w < kRouterWarps; ++w) v += int(threadIdx.x) < T ? ss_part[w][threadIdx.x] : 0.0f;
    rinv[threadIdx.x] = 1.0f / sqrtf(v / float(D) + eps);
  }
  __syncthreads();
}

// x̂ of token t at columns c .. c + 3 (c % 4 == 0): the staged x·norm_w times the token's factor.
__device__ __forceinline__ float4 router_xhat4(const float* xs, int ldxs, const float* rinv, int t, int c) {
  const float4 v = *reinterpret_cast<const float4*>(xs + t * ldxs + router_pad(c));
  const float f = rinv[t];
  return make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
}

// acc[t] += lane `lane`'s part of row·(x·norm_w) of token t < T: Σ_g s_g·Σ q·xw + b_g·Σ xw over its 16-column slices.
template <int kT>
__device__ __forceinline__ void router_row_dot8(const RouterRow8& r, const float* xs, int ldxs, int nch, int T,
                                                int lane, float (&acc)[kT]) {
#pragma unroll
  for (int i = 0; i < kRouterMaxChunks; ++i) {
    if (i < nch) {
      const float sg = bf16_bits_to_float(uint16_t(r.ws[i])), bg = bf16_bits_to_float(uint16_t(r.wb[i]));
      float qf[16];
      router_unpack16(r.wq[i], qf);
      const int base = router_pad(i * 512 + 16 * lane);
#pragma unroll
      for (int t = 0; t < kT; ++t)
        if (t < T) acc[t] = router_dot16(qf, xs + t * ldxs + base, sg, bg, acc[t]);
    }
  }
}

// Token t's logit of row `row` (row E: the shared-expert gate's): the warp's sum of acc[t], times rinv[t] when
// kScale (the fast form's dot is with x·norm_w), written by lane 0 into the scratch.
template <int kT, bool kScale>
__device__ __forceinline__ void router_row_write(const float (&acc)[kT], const float* rinv, int row, int E, int T,
                                                 const MoeDecodeScratch& s, int lane) {
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t >= T) break;
    const float v = warp_sum(acc[t]) * (kScale ? rinv[t] : 1.0f);
    if (lane == 0) {
      if (row == E)
        s.shared_logit[t] = v;
      else
        s.router_logits[int64_t(t) * E + row] = v;
    }
  }
}

// The ticket, once the block's logits are written: whether this block is the grid's last to arrive (the counter
// `ticket` then holds gridDim.x), in which case every block's logits are visible to it. Block-uniform; synchronises.
__device__ __forceinline__ bool router_ticket(unsigned* ticket) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return false;
  __threadfence();
  return true;
}

// The last block's routing (after router_ticket): warp t < T routes token t (route_token over the logits in the
// scratch; lane j < k returns its j-th choice, every other thread 0), thread t < T writes token t's shared gate, and
// the ticket counter goes back to zero for the next launch (every block has taken its ticket).
template <int NP>
__device__ __forceinline__ int router_route(const MoeDecodeScratch& s, int T, int E, int k, int warp, int lane) {
  int my_id = 0;
  if (warp < T)
    route_token<NP, true>(s.router_logits + int64_t(warp) * E, E, k, s.ids + warp * k, s.w + warp * k, lane, my_id);
  if (int(threadIdx.x) < T) s.shared_gate[threadIdx.x] = sigmoid_f(__ldcg(s.shared_logit + threadIdx.x));
  if (threadIdx.x == 0) *s.ticket = 0u;
  return my_id;
}

}  // namespace tern::cuda::router_parts
