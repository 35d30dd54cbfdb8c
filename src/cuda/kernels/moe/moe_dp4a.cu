// One-token MoE expert kernels on integer dot products: see moe_dp4a.cuh and dp4a_tile.cuh. B >= 2 tokens take the
// ring forms of moe_dp4a_ring.cu where they apply (the same arithmetic, the weights streamed through shared memory).
#include "cuda/kernels/moe/moe_dp4a.cuh"

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"
#include "cuda/kernels/moe/moe_dp4a_parts.cuh"

namespace tern::cuda {
namespace {

using namespace moe_parts;

template <int S, bool kWide>
__global__ void __launch_bounds__(kThreads) moe_gate_up_dp4a_kernel(const GateUpParams p) {
  __shared__ int ids_s[kTopK];
  __shared__ uint4 xs[S * 128];
  __shared__ uint2 xs_lo[kWide ? S * 128 : 1];
  __shared__ __align__(16) int xsum[S * 128];
  __shared__ float xsig[S * 16];
  const int lane = threadIdx.x & 31;
  const int warps = int(gridDim.x) * kWarps, batches = (p.k + 1) * p.F;  // of this token
  int batch = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5);
  const int token = int(blockIdx.y);  // of a batch (0 for one token): its routing, x̂ (D = S·1024) and h
  const int* ids = p.ids + token * p.k;
  const float* xhat = p.xhat + int64_t(token) * (S * 1024);
  float* h = p.h + int64_t(token) * (p.k + 1) * p.F;
  GateUpBatch<S> cur;  // the first batch's weights in flight while the activations are quantised
  const bool early = batch < p.F;  // a shared-expert row: known before the routing
  if (early) load_gate_up<S>(p, ids_s, batch, batches, lane, cur);
  pdl_wait();  // the routing and x̂ come from the router kernel
  if (int(threadIdx.x) < p.k) {
    const int e = ids[threadIdx.x];
    ids_s[threadIdx.x] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  if (!early) load_gate_up<S>(p, ids_s, batch, batches, lane, cur);
  if (p.down_ahead) prefetch_down(p, ids_s);
  float unused_ss = 0.0f;
  dp4a::quantize_block<dp4a::quantize_passes(S * 128, kThreads), kWide>(xhat, nullptr, S * 128, xs, xsum, xsig,
                                                                         unused_ss, xs_lo);
  __syncthreads();
  pdl_trigger();
  GateUpX<S, kWide> x;
  gate_up_lane_x<S, kWide>(xs, xs_lo, xsum, xsig, lane, x);
  gate_up_rows<S, kWide>(p, ids_s, batch, batches, warps, lane, x, cur, h);
}

// ---- down + weighted sum + residual -------------------------------------------------------------------------------

// One row's segments: each its lane's weights and its group's bf16 scale and bias, kept apart until used (packed as
// loaded, the next row's loads were waited for among the current row's dot products).
struct DownBatch {
  uint2 w[kSeg];
  uint32_t scale[kSeg], bias[kSeg];
};

// Output row r: segment s < kTopK reads routed expert ids[s], segment kTopK the shared expert; lane l its columns
// [16·l, +16) (two words). Every segment's loads are issued before any is used.
__device__ __forceinline__ void load_down(const DownParams& p, const int* ids, int r, int lane, DownBatch& out) {
  if (r < p.D) {
#pragma unroll
    for (int s = 0; s < kSeg; ++s) {
      const bool sh = s == kTopK;
      const Q4 M = pick(sh, p.sdown, p.down);
      const int64_t e = sh ? 0 : ids[s];
      const uint32_t* row = M.words + e * M.expert_words + int64_t(r) * p.row_words;
      out.w[s] = qtile::ld_weights_u2(row + 2 * lane);
      const int64_t g = e * M.expert_groups + int64_t(r) * p.gpr + lane / 4;
      out.scale[s] = qtile::ld_const_u16(M.scales + g);
      out.bias[s] = qtile::ld_const_u16(M.biases + g);
    }
  } else {
#pragma unroll
    for (int s = 0; s < kSeg; ++s) {
      out.w[s] = make_uint2(0, 0);
      out.scale[s] = out.bias[s] = 0;
    }
  }
}

template <bool kWide>
__global__ void __launch_bounds__(kThreads, 2) moe_down_dp4a_kernel(const DownParams p) {
  __shared__ int ids_s[kTopK];
  __shared__ uint4 xs[kSeg * 64];
  __shared__ uint2 xs_lo[kWide ? kSeg * 64 : 1];
  __shared__ int xsum[kSeg * 64];
  __shared__ float xsig[kSeg * 8];
  const int lane = threadIdx.x & 31;
  const int warps = int(gridDim.x) * kWarps;  // of this token
  int row = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5);
  const int token = int(blockIdx.y);  // of a batch (0 for one token): its routing, h and row of hidden
  const int* ids = p.ids + token * kTopK;
  const float* h = p.h + int64_t(token) * (kSeg * kDownCols);
  float* hidden = p.hidden + int64_t(token) * p.D;
  if (!p.early_routing) pdl_wait();
  if (int(threadIdx.x) < kTopK) {
    const int e = __ldcg(ids + threadIdx.x);  // L2: written by another kernel, maybe while this one was resident
    ids_s[threadIdx.x] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  DownBatch cur;  // the first row's weights in flight while gate_up finishes / the activations are quantised
  load_down(p, ids_s, row, lane, cur);
  if (p.early_routing) pdl_wait();  // h comes from gate_up
  // The k + 1 rows of h (512 columns, 64 words each), quantised as they are; the coefficients scale σ below.
  float unused_ss = 0.0f;
  dp4a::quantize_block<dp4a::quantize_passes(kSeg * 64, kThreads), kWide>(h, nullptr, kSeg * 64, xs, xsum, xsig,
                                                                          unused_ss, xs_lo);
  __syncthreads();
  pdl_trigger();
  float sig[kSeg], sx[kSeg];  // coefficient·σ of the lane's group, coefficient·σ·Σv of its 16 columns
  down_lane_coefficients(p, token, xsum, xsig, lane, sig, sx);
  // The residual row this lane 0 adds to, loaded a row ahead with the weights (after pdl_wait: an earlier kernel
  // writes it), so that the add does not wait a round trip per row.
  float hid = lane == 0 && row < p.D ? __ldcg(hidden + row) : 0.0f;
  for (; row < p.D; row += warps) {
    DownBatch nxt;
    load_down(p, ids_s, row + warps, lane, nxt);
    const float hid_next = lane == 0 && row + warps < p.D ? __ldcg(hidden + row + warps) : 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < kSeg; ++s) {
      // The activations stay in shared memory (xs_slot: the 8 lanes of a quarter-warp read distinct bank groups).
      const int w0 = dp4a::xs_slot(s * 64 + 2 * lane), w1 = dp4a::xs_slot(s * 64 + 2 * lane + 1);
      const uint2 l0 = kWide ? xs_lo[w0] : make_uint2(0u, 0u), l1 = kWide ? xs_lo[w1] : make_uint2(0u, 0u);
      const float dot = down_dot<kWide>(cur.w[s], xs[w0], xs[w1], l0, l1);
      acc = fmaf(bf16_bits_to_float(uint16_t(cur.scale[s])) * sig[s], dot, acc);
      acc = fmaf(bf16_bits_to_float(uint16_t(cur.bias[s])), sx[s], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) hidden[row] = hid + acc;
    hid = hid_next;
    cur = nxt;
  }
  down_tables_tail(p, token, hidden);
}

template <int S>
void launch_gate_up(const GateUpParams& p, int B, cudaStream_t stream) {
  auto kernel = p.wide ? moe_gate_up_dp4a_kernel<S, true> : moe_gate_up_dp4a_kernel<S, false>;
  const int blocks = qtile::balanced_grid(reinterpret_cast<const void*>(kernel), int64_t(p.k + 1) * p.F, B);
  launch_pdl("moe_gate_up_dp4a", kernel, dim3(unsigned(blocks), unsigned(B)), dim3(kThreads), 0, stream, p);
}

// 24-bit activations (the wide form) unless TERN_MOE_DP4A_BITS=16; moe_dp4a_set_wide changes it.
bool& wide_setting() {
  static bool wide = !env_is("TERN_MOE_DP4A_BITS", "16");
  return wide;
}

// Whether the gate_up's four matrices suit the ring forms' L2 requests (16-byte aligned rows): where they do not,
// B >= 2 takes the one-token kernel's batched launch.
bool ring_aligned(const MoeDecodeWeights& w) {
  return prefetch_aligned(w.expert_gate) && prefetch_aligned(w.expert_up) && prefetch_aligned(w.shared_gate) &&
         prefetch_aligned(w.shared_up);
}

}  // namespace

bool moe_gate_up_dp4a_fits(const MoeDecodeWeights& w) {
  const DMat& g = w.expert_gate;
  const int64_t D = g.cols;
  return (D == 1024 || D == 2048 || D == 4096) && w.top_k == kTopK && q4_dp4a_ok(g) && q4_dp4a_ok(w.expert_up) &&
         q4_dp4a_ok(w.shared_gate) && q4_dp4a_ok(w.shared_up) && same_shape(g, w.expert_up) &&
         same_shape(g, w.shared_gate) && same_shape(g, w.shared_up);
}

bool moe_down_dp4a_fits(const MoeDecodeWeights& w) {
  const DMat& d = w.expert_down;
  return d.cols == kDownCols && w.top_k == kTopK && q4_dp4a_ok(d) && q4_dp4a_ok(w.shared_down) &&
         same_shape(d, w.shared_down);
}

bool moe_gate_up_wants_x_lanes(const MoeDecodeWeights& w, int B) {
  return moe_gate_up_dp4a_fits(w) && ring_aligned(w) &&
         gate_up_wants_x_lanes(int(w.expert_gate.cols), int(w.expert_gate.experts), w.top_k, B);
}

bool moe_gate_up_dp4a(const MoeDecodeWeights& w, const MoeDecodeScratch& s, cudaStream_t stream, int B,
                      bool x_lanes_written) {
  if (B < 1 || !moe_gate_up_dp4a_fits(w) || (reinterpret_cast<uintptr_t>(s.xhat) & 15)) return false;
  const DMat& g = w.expert_gate;
  const GateUpParams p = gate_up_params(w, s);
  if (B >= 2 && ring_aligned(w) && gate_up_ring(p, int(g.cols), B, stream, x_lanes_written ? s.x_lanes : nullptr))
    return true;
  switch (g.cols) {
    case 1024: launch_gate_up<1>(p, B, stream); break;
    case 2048: launch_gate_up<2>(p, B, stream); break;
    default: launch_gate_up<4>(p, B, stream); break;
  }
  return true;
}

bool moe_down_dp4a(const MoeDecodeWeights& w, float* hidden, const MoeDecodeScratch& s, bool early_routing,
                   cudaStream_t stream, int B, const MoeTablesOut& tables) {
  if (B < 1 || !moe_down_dp4a_fits(w) || (reinterpret_cast<uintptr_t>(s.h) & 15)) return false;
  const DMat& d = w.expert_down;
  DownParams p;
  p.down = q4_of(d);
  p.sdown = q4_of(w.shared_down);
  p.D = int(d.rows);
  p.row_words = int(d.row_words);
  p.gpr = int(d.groups_per_row);
  p.E = int(d.experts);
  p.ids = s.ids;
  p.w = s.w;
  p.shared_gate = s.shared_gate;
  p.h = s.h;
  p.hidden = hidden;
  p.early_routing = early_routing;
  if (tables.tables) {
    TERN_CHECK(s.down_tickets && s.down_tickets_count >= B && p.D % 64 == 0,
               "moe_down_dp4a: tables need the scratch's tickets for B = ", B, " and D a multiple of 64 (D = ", p.D,
               ")");
    p.tables = tables.tables;
    p.tables_norm = tables.norm_w;
    p.tables_eps = tables.eps;
    p.tickets = s.down_tickets;
  }
  p.wide = moe_dp4a_wide();
  if (B >= 2 && prefetch_aligned(d) && prefetch_aligned(w.shared_down) && down_ring(p, B, stream)) return true;
  auto kernel = p.wide ? moe_down_dp4a_kernel<true> : moe_down_dp4a_kernel<false>;
  const int blocks = qtile::balanced_grid(reinterpret_cast<const void*>(kernel), p.D, B);
  launch_pdl("moe_down_dp4a", kernel, dim3(unsigned(blocks), unsigned(B)), dim3(kThreads), 0, stream, p);
  return true;
}

void moe_dp4a_set_wide(bool wide) { wide_setting() = wide; }
bool moe_dp4a_wide() { return wide_setting(); }

}  // namespace tern::cuda
