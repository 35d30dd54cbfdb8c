// Over ~800 lines in one file: the decode MoE block's three kernels (router, gate/up, down) share the 4-bit views,
// the staged-activation sources and the host checks below. Its one-token integer kernels are in moe_dp4a.cu, the
// cluster router in moe_router_cluster.cu, the fused router + gate_up in moe_router_gate_up.cu (the router's device
// parts in moe_router_parts.cuh); moe_decode_batched (at the end) runs those three for a batch of sequences.
#include "cuda/kernels/moe/moe_decode.cuh"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/step_omit.h"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/moe/moe_router_cluster.cuh"
#include "cuda/kernels/moe/moe_router_gate_up.cuh"
#include "cuda/kernels/moe/moe_router_parts.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {

namespace {

using qtile::kTokens;
using namespace router_parts;

constexpr int kMaxExperts = 1024;  // router top-k: 32 probabilities per lane
constexpr int kMaxTopK = 32;

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// ---- 1. router ------------------------------------------------------------------------------------------------

// One stacked matrix in the 4-bit layout, with per-expert strides.
struct Q4Mat {
  const uint32_t* words;
  const uint16_t* scales;
  const uint16_t* biases;
  int64_t expert_words, expert_groups;  // per-expert strides
  __device__ const uint32_t* w(int e) const { return words + e * expert_words; }
  __device__ const uint16_t* s(int e) const { return scales + e * expert_groups; }
  __device__ const uint16_t* b(int e) const { return biases + e * expert_groups; }
};

// a or b, field by field (a reference to one of two parameter structs would send them to local memory).
__device__ __forceinline__ Q4Mat pick(bool first, const Q4Mat& a, const Q4Mat& b) {
  return Q4Mat{first ? a.words : b.words, first ? a.scales : b.scales, first ? a.biases : b.biases,
               first ? a.expert_words : b.expert_words, first ? a.expert_groups : b.expert_groups};
}

Q4Mat q4_mat(const DMat& m) {
  return Q4Mat{static_cast<const uint32_t*>(m.data), m.scales, m.biases, m.rows * m.row_words, m.rows * m.groups_per_row};
}

struct RouterParams {
  DMat router, sgate;
  const float* norm_w;
  float eps;
  const float* hidden;  // [T, D]
  int T, D, E, k;
  MoeDecodeScratch s;
  // L2 prefetch of the chosen experts' weights by the routing block (Hopper; nullptr words: off)
  Q4Mat pf_gate, pf_up, pf_down, pf_sgate, pf_sup, pf_sdown;
};

// x̂(t, c) from the staged x·norm_w and the RMSNorm factors (generic dot).
struct StagedX {
  const float* xs;
  int ld;
  const float* rinv;
  __device__ void load8(int t, int64_t c, float v[8]) const {
    const float4* p = reinterpret_cast<const float4*>(xs + t * ld + router_pad(int(c)));
    const float4 a = p[0], b = p[1];
    const float f = rinv[t];
    v[0] = a.x * f; v[1] = a.y * f; v[2] = a.z * f; v[3] = a.w * f;
    v[4] = b.x * f; v[5] = b.y * f; v[6] = b.z * f; v[7] = b.w * f;
  }
};

// Blocks of 8 warps, one warp per row of [router; shared_expert_gate] (moe_router_parts.cuh). Fast (affine8, group
// 64, D % 512 == 0): lane l reads 16 bytes of each 512-column chunk (columns 512·i + 16·l ..), all issued before
// pdl_wait(). The block stages x·norm_w and the per-token Σx² in shared memory (one pass over x, L2-resident);
// logits = rinv · (W·(x·norm_w)). The last block to finish (an atomic ticket) routes the tokens, one warp each, and
// (Hopper) asks L2 to fetch the chosen experts' weights for the next two kernels.
template <bool kFast8, int NP>
__global__ void __launch_bounds__(kRouterWarps * 32) moe_router_kernel(const RouterParams p) {
  extern __shared__ __align__(16) float rsm[];
  __shared__ float ss_part[kRouterWarps][kTokens];
  __shared__ float rinv[kTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRouterWarps + warp;
  const bool has_row = row <= p.E;
  const bool shared_row = row == p.E;
  const int ldxs = router_ldxs(p.D);
  const int nch = p.D / 512;

  RouterRow8 rw;
  if (kFast8 && has_row) router_row_load8(p.router, p.sgate, row, p.E, nch, lane, rw);
  pdl_trigger();
  pdl_wait();

  router_stage<kTokens>(p.hidden, p.norm_w, p.D, p.T, p.eps, rsm, ldxs, ss_part, rinv);
  if (blockIdx.x == 0) {  // x̂ for the expert kernels
    for (int i = threadIdx.x; i < p.T * p.D / 4; i += blockDim.x) {
      const int t = i / (p.D / 4), c = (i - t * (p.D / 4)) * 4;
      reinterpret_cast<float4*>(p.s.xhat + int64_t(t) * p.D)[c / 4] = router_xhat4(rsm, ldxs, rinv, t, c);
    }
  }

  if (has_row) {
    float acc[kTokens];
#pragma unroll
    for (int t = 0; t < kTokens; ++t) acc[t] = 0.0f;
    if constexpr (kFast8) {
      router_row_dot8<kTokens>(rw, rsm, ldxs, nch, p.T, lane, acc);
    } else {
      const int64_t rows[1] = {shared_row ? 0 : row};
      float a1[1][kTokens] = {};
      const StagedX xs{rsm, ldxs, rinv};
      qtile::generic_dot_any<1>(shared_row ? p.sgate : p.router, 0, rows, xs, p.T, a1, lane);
#pragma unroll
      for (int t = 0; t < kTokens; ++t) acc[t] = a1[0][t];
    }
    router_row_write<kTokens, kFast8>(acc, rinv, row, p.E, p.T, p.s, lane);
  }
  // Ticket: the last block sees every block's logits.
  if (!router_ticket(p.s.ticket)) return;
  [[maybe_unused]] const int my_id = router_route<NP>(p.s, p.T, p.E, p.k, warp, lane);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (warp < p.T && p.pf_gate.words) {  // every chosen expert's gate, up and down; warp 0 adds the shared expert
    for (int j = 0; j <= p.k; ++j) {
      if (j == p.k && warp != 0) break;
      const bool sh = j == p.k;
      const int ej = sh ? 0 : __shfl_sync(0xffffffffu, my_id, j);
      const Q4Mat mg = pick(sh, p.pf_sgate, p.pf_gate);
      const Q4Mat mu = pick(sh, p.pf_sup, p.pf_up);
      const Q4Mat md = pick(sh, p.pf_sdown, p.pf_down);
      qtile::prefetch_l2_range(mg.w(ej), mg.expert_words * 4, lane);
      qtile::prefetch_l2_range(mu.w(ej), mu.expert_words * 4, lane);
      qtile::prefetch_l2_range(md.w(ej), md.expert_words * 4, lane);
      if (lane < 6) {
        const Q4Mat m = pick(lane < 2, mg, pick(lane < 4, mu, md));
        const void* b = (lane & 1) ? static_cast<const void*>(m.b(ej)) : static_cast<const void*>(m.s(ej));
        qtile::prefetch_l2_range(b, m.expert_groups * 2, 0);
      }
    }
  }
#endif
}

// ---- 2. gate/up + SwiGLU ----------------------------------------------------------------------------------------

// Work: "pairs" vp = 0 (the shared expert, every token) and vp = 1 + (t·k + s) (routed slot s of token t, its token's
// column only); each pair's F rows cut into octets of 8. A tile is one octet: mma row g = gate row r + g, mma row
// g + 8 = up row r + g, so silu(gate)·up is formed from one accumulator pair. Block b owns octets
// [b·U/grid, (b+1)·U/grid), U = pairs · F/8.
struct GateUpQ4Params {
  Q4Mat gate, up, sgate, sup;
  int F, row_words, gpr, E;
  int T, k;
  MoeDecodeScratch s;
  qtile::StageLayout layout;  // rows = T, cols = D
};

struct XhatSrc {
  const float* xhat;
  int D;
  bool norm = false;
  __device__ void load8(int r, int c, float xw[8], float&) const {
    qtile::load8_f32(xhat + int64_t(r) * D + c, true, xw);
  }
};

template <int UG>
struct GateUpJob {
  int spt;
  int o0;
  qtile::FastDiv opp;  // octets per pair (F/8)
  Q4Mat gate, up, sgate, sup;
  int row_words, gpr;
  const int* ids;  // shared [T·k]
  int T, k, F;
  int g, tig;
  const uint4* xs;
  int row_u4;
  const float4* ktab;
  float* h;

  __device__ int pair_of(int j) const { return opp.div(o0 + j); }
  __device__ bool known(int j, int) const { return pair_of(j) == 0; }
  __device__ int group(int q) const { return UG * q; }
  __device__ qtile::StepRows rows(int j, int) const {
    const int o = o0 + j, vp = opp.div(o), r = (o - vp * opp.d) * 8 + g;
    const int e = vp == 0 ? 0 : ids[vp - 1];
    const Q4Mat mg = pick(vp == 0, sgate, gate), mu = pick(vp == 0, sup, up);
    qtile::StepRows rr;
    rr.wa = mg.w(e) + r * row_words;
    rr.wb = mu.w(e) + r * row_words;
    const Q4Mat ms = pick(tig & 1, mu, mg);
    rr.sb = (tig < 2 ? ms.s(e) : ms.b(e)) + r * gpr;
    return rr;
  }
  __device__ qtile::StepB b(int j, int) const {
    const int vp = pair_of(j);
    qtile::StepB B;
    if (vp == 0) {
      B.brow = g < T ? xs + g * row_u4 : nullptr;
      B.k0 = 2 * tig < T ? ktab + (2 * tig) * gpr : nullptr;
      B.k1 = 2 * tig + 1 < T ? ktab + (2 * tig + 1) * gpr : nullptr;
    } else {
      const int t = (vp - 1) / k;
      B.brow = g == t ? xs + t * row_u4 : nullptr;
      B.k0 = 2 * tig == t ? ktab + t * gpr : nullptr;
      B.k1 = 2 * tig + 1 == t ? ktab + t * gpr : nullptr;
    }
    return B;
  }
  __device__ void store(int j, int m, int t, float v0, float v1) const {
    const int o = o0 + j, vp = opp.div(o), r = (o - vp * opp.d) * 8 + m;
    int slot;
    if (vp == 0) {
      if (t >= T) return;
      slot = k;
    } else {
      const int pr = vp - 1, tok = pr / k;
      if (t != tok) return;
      slot = pr - tok * k;
    }
    h[(int64_t(t) * (k + 1) + slot) * F + r] = silu_f(v0) * v1;
  }
};

// The q4 kernels' ring of a block's steps [lo, hi) (P: GateUpQ4Params or DownQ4Params): the shared expert's steps
// in flight before the wait, then the routed ids (clamped to 0..E−1) into ids_s (shared [T·k]) and the routed steps.
template <int D, int UG, class P, class Job>
__device__ __forceinline__ void fill_ring_q4(qtile::Ring<D, UG>& ring, const P& p, const Job& job, int* ids_s, int lo,
                                             int hi, int tig) {
  qtile::ring_fill(ring, job, lo, hi, true, tig);  // the shared expert's steps: known before the wait
  pdl_trigger();
  pdl_wait();
  for (int i = threadIdx.x; i < p.T * p.k; i += blockDim.x) {
    const int e = p.s.ids[i];
    ids_s[i] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  qtile::ring_fill(ring, job, lo, hi, false, tig);
}

template <int D, int UG>
__global__ void __launch_bounds__(qtile::kThreads, qtile::min_blocks(D, UG))
    moe_gate_up_q4_kernel(const GateUpQ4Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int ids_s[kTokens * kMaxTopK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const qtile::StageSmem S = qtile::carve_stage(smem, p.layout);
  const int opp = p.F / 8, U = (p.T * p.k + 1) * opp;
  const int o0 = int(int64_t(blockIdx.x) * U / gridDim.x), o1 = int(int64_t(blockIdx.x + 1) * U / gridDim.x);
  GateUpJob<UG> job;
  job.spt = p.gpr / UG;
  job.o0 = o0;
  job.opp = qtile::FastDiv::make(opp);
  job.gate = p.gate;
  job.up = p.up;
  job.sgate = p.sgate;
  job.sup = p.sup;
  job.row_words = p.row_words;
  job.gpr = p.gpr;
  job.ids = ids_s;
  job.T = p.T;
  job.k = p.k;
  job.F = p.F;
  job.g = g;
  job.tig = tig;
  job.xs = S.xs;
  job.row_u4 = p.layout.row_u4();
  job.ktab = S.ktab;
  job.h = p.s.h;
  const int steps = (o1 - o0) * job.spt;
  const int lo = qtile::range_lo(warp, steps), hi = qtile::range_lo(warp + 1, steps);

  qtile::Ring<D, UG> ring = {};
  fill_ring_q4(ring, p, job, ids_s, lo, hi, tig);
  const XhatSrc src{p.s.xhat, p.layout.cols};
  qtile::stage_activations(src, p.layout, S);
  __syncthreads();
  qtile::ring_run(ring, job, lo, hi, S.slots, warp, lane);
  __syncthreads();
  qtile::finish_cut_tiles(job, S.slots, steps, p.T);
}

// Generic: one warp per row of one pair (any format).
struct GateUpGenericParams {
  DMat gate, up, sgate, sup;
  int T, k, E;
  MoeDecodeScratch s;
};

struct PlainX {
  const float* x;
  int64_t ld;
  __device__ void load8(int t, int64_t c, float v[8]) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = x[t * ld + c + j];
  }
};

__global__ void __launch_bounds__(256) moe_gate_up_generic_kernel(const GateUpGenericParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int pair = blockIdx.y;
  const bool routed = pair < p.T * p.k;
  const int tok = routed ? pair / p.k : 0, slot = routed ? pair % p.k : p.k;
  const int64_t F = p.gate.rows, D = p.gate.cols;
  const int64_t row = int64_t(blockIdx.x) * 8 + warp;
  pdl_wait();
  pdl_trigger();
  if (row >= F) return;
  int e = 0;
  if (routed) {
    e = p.s.ids[pair];
    e = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  const DMat& gm = routed ? p.gate : p.sgate;
  const DMat& um = routed ? p.up : p.sup;
  const int n = routed ? 1 : p.T;
  const PlainX xs{p.s.xhat + int64_t(tok) * D, D};
  const int64_t rows[1] = {row};
  float ga[1][kTokens] = {}, ua[1][kTokens] = {};
  qtile::generic_dot_any<1>(gm, e, rows, xs, n, ga, lane);
  qtile::generic_dot_any<1>(um, e, rows, xs, n, ua, lane);
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    if (i >= n) break;
    const float gv = warp_sum(ga[0][i]), uv = warp_sum(ua[0][i]);
    if (lane == 0) p.s.h[(int64_t(tok + i) * (p.k + 1) + slot) * F + row] = silu_f(gv) * uv;
  }
}

// ---- 3. down + weighted sum + residual --------------------------------------------------------------------------

// Block b owns output rows [b·D/grid, (b+1)·D/grid) in 16-row tiles; a tile's steps run over the segments seg = 0
// (the shared expert, every token's column, coefficient shared_gate[t]) and seg = 1 + (t·k + s) (routed slot s of
// token t, its column only, coefficient w[t, s]), F/64/kUG steps each. The coefficients are folded into the staged
// activations: staged row t·(k+1) + s holds h[t, s]·coef (s = k: the shared expert).
struct DownQ4Params {
  Q4Mat down, sdown;
  int D, row_words, gpr, E;
  int T, k;
  float* hidden;
  MoeDecodeScratch s;
  qtile::StageLayout layout;  // rows = T·(k+1), cols = F
};

struct DownSrc {
  const float* h;
  const float* w;
  const float* shared_gate;
  int k, F;
  bool norm = false;
  __device__ void load8(int r, int c, float xw[8], float&) const {
    const int t = r / (k + 1), s = r - t * (k + 1);
    const float coef = s < k ? w[t * k + s] : shared_gate[t];
    qtile::load8_f32(h + int64_t(r) * F + c, true, xw);
#pragma unroll
    for (int j = 0; j < 8; ++j) xw[j] *= coef;
  }
};

template <int UG>
struct DownJob {
  int spt;
  qtile::FastDiv sps;  // steps per segment
  int r0, r1;
  Q4Mat down, sdown;
  int row_words, gpr;
  const int* ids;  // shared [T·k]
  int T, k, D;
  int g, tig;
  const uint4* xs;
  int row_u4;
  const float4* ktab;
  float* hidden;

  __device__ bool known(int, int q) const { return q < sps.d; }
  __device__ int group(int q) const { return UG * (q - sps.div(q) * sps.d); }
  __device__ qtile::StepRows rows(int j, int q) const {
    const int seg = sps.div(q);
    const int e = seg == 0 ? 0 : ids[seg - 1];
    const Q4Mat m = pick(seg == 0, sdown, down);
    const int ra = r0 + 16 * j + g, rb = ra + 8, end = min(r0 + 16 * j + 16, r1);
    const int rs = (tig & 1) ? rb : ra;
    qtile::StepRows rr;
    rr.wa = ra < end ? m.w(e) + ra * row_words : nullptr;
    rr.wb = rb < end ? m.w(e) + rb * row_words : nullptr;
    rr.sb = rs < end ? (tig < 2 ? m.s(e) : m.b(e)) + rs * gpr : nullptr;
    return rr;
  }
  __device__ qtile::StepB b(int, int q) const {
    const int seg = sps.div(q);
    qtile::StepB B;
    if (seg == 0) {
      B.brow = g < T ? xs + (g * (k + 1) + k) * row_u4 : nullptr;
      B.k0 = 2 * tig < T ? ktab + ((2 * tig) * (k + 1) + k) * gpr : nullptr;
      B.k1 = 2 * tig + 1 < T ? ktab + ((2 * tig + 1) * (k + 1) + k) * gpr : nullptr;
    } else {
      const int pr = seg - 1, t = pr / k, rr = pr + t;  // staged row t·(k+1) + s = pr + t
      B.brow = g == t ? xs + rr * row_u4 : nullptr;
      B.k0 = 2 * tig == t ? ktab + rr * gpr : nullptr;
      B.k1 = 2 * tig + 1 == t ? ktab + rr * gpr : nullptr;
    }
    return B;
  }
  __device__ void store(int j, int m, int t, float v0, float v1) const {
    if (t >= T) return;
    const int ra = r0 + 16 * j + m, rb = ra + 8, end = min(r0 + 16 * j + 16, r1);
    float* dst = hidden + int64_t(t) * D;
    if (ra < end) dst[ra] += v0;
    if (rb < end) dst[rb] += v1;
  }
};

template <int D, int UG>
__global__ void __launch_bounds__(qtile::kThreads, qtile::min_blocks(D, UG)) moe_down_q4_kernel(const DownQ4Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int ids_s[kTokens * kMaxTopK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const qtile::StageSmem S = qtile::carve_stage(smem, p.layout);
  const int r0 = int(int64_t(blockIdx.x) * p.D / gridDim.x), r1 = int(int64_t(blockIdx.x + 1) * p.D / gridDim.x);
  const int tiles = (r1 - r0 + 15) / 16;
  DownJob<UG> job;
  job.sps = qtile::FastDiv::make(p.gpr / UG);
  job.spt = (p.T * p.k + 1) * job.sps.d;
  job.r0 = r0;
  job.r1 = r1;
  job.down = p.down;
  job.sdown = p.sdown;
  job.row_words = p.row_words;
  job.gpr = p.gpr;
  job.ids = ids_s;
  job.T = p.T;
  job.k = p.k;
  job.D = p.D;
  job.g = g;
  job.tig = tig;
  job.xs = S.xs;
  job.row_u4 = p.layout.row_u4();
  job.ktab = S.ktab;
  job.hidden = p.hidden;
  const int steps = tiles * job.spt;
  const int lo = qtile::range_lo(warp, steps), hi = qtile::range_lo(warp + 1, steps);

  qtile::Ring<D, UG> ring = {};
  fill_ring_q4(ring, p, job, ids_s, lo, hi, tig);
  const DownSrc src{p.s.h, p.s.w, p.s.shared_gate, p.k, p.layout.cols};
  qtile::stage_activations(src, p.layout, S);
  __syncthreads();
  qtile::ring_run(ring, job, lo, hi, S.slots, warp, lane);
  __syncthreads();
  qtile::finish_cut_tiles(job, S.slots, steps, p.T);
}

// Generic: one warp per output row; per token the routed slots in slot order, then the shared expert.
struct DownGenericParams {
  DMat down, sdown;
  int T, k, E;
  float* hidden;
  MoeDecodeScratch s;
};

__global__ void __launch_bounds__(256) moe_down_generic_kernel(const DownGenericParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t D = p.down.rows, F = p.down.cols;
  const int64_t row = int64_t(blockIdx.x) * 8 + warp;
  pdl_wait();
  pdl_trigger();
  if (row >= D) return;
  const int64_t rows[1] = {row};
  float total[kTokens] = {};
  for (int t = 0; t < p.T; ++t)
    for (int s = 0; s < p.k; ++s) {
      int e = p.s.ids[t * p.k + s];
      e = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
      float acc[1][kTokens] = {};
      const PlainX xs{p.s.h + (int64_t(t) * (p.k + 1) + s) * F, F};
      qtile::generic_dot_any<1>(p.down, e, rows, xs, 1, acc, lane);
      const float v = warp_sum(acc[0][0]);
#pragma unroll
      for (int i = 0; i < kTokens; ++i)
        if (i == t) total[i] += p.s.w[t * p.k + s] * v;
    }
  float acc[1][kTokens] = {};
  const PlainX xs{p.s.h + int64_t(p.k) * F, (p.k + 1) * F};
  qtile::generic_dot_any<1>(p.sdown, 0, rows, xs, p.T, acc, lane);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= p.T) break;
    const float v = warp_sum(acc[0][t]);
    if (lane == 0) p.hidden[t * D + row] += total[t] + p.s.shared_gate[t] * v;
  }
}

// ---- host side --------------------------------------------------------------------------------------------------

int64_t align_up(int64_t b) { return (b + 255) & ~int64_t(255); }

void check_shapes(const MoeDecodeWeights& w, int T) {
  TERN_CHECK(T >= 1 && T <= kQmvMaxTokens, "moe_decode: T = ", T, " outside 1..", kQmvMaxTokens);
  const int64_t E = w.router.rows, D = w.router.cols, F = w.expert_gate.rows;
  TERN_CHECK(E >= 1 && E <= kMaxExperts && w.top_k >= 1 && w.top_k <= std::min<int64_t>(kMaxTopK, E),
             "moe_decode: top-", w.top_k, " of ", E, " experts");
  TERN_CHECK(w.norm_w && !w.shared_expert_gate.empty() && w.shared_expert_gate.cols == D,
             "moe_decode: missing norm or shared-expert gate");
  TERN_CHECK(w.expert_gate.experts == E && w.expert_up.experts == E && w.expert_down.experts == E,
             "moe_decode: expert matrices do not have ", E, " experts");
  TERN_CHECK(w.expert_gate.cols == D && w.expert_up.rows == F && w.expert_up.cols == D && w.expert_down.rows == D &&
                 w.expert_down.cols == F,
             "moe_decode: expert shapes do not fit D = ", D, ", F = ", F);
  TERN_CHECK(w.shared_gate.rows == F && w.shared_gate.cols == D && w.shared_up.rows == F && w.shared_up.cols == D &&
                 w.shared_down.rows == D && w.shared_down.cols == F,
             "moe_decode: the shared expert's intermediate size must equal the experts' (", F, ")");
  TERN_CHECK(D % 8 == 0 && F % 8 == 0, "moe_decode: D and F must be multiples of 8");
}

// What every router launch needs: the shapes, the input and the scratch.
void check_router_inputs(const MoeDecodeWeights& w, const float* hidden, int T, const MoeDecodeScratch& s) {
  check_shapes(w, T);
  TERN_CHECK(hidden && s.xhat && s.ticket, "moe_router_decode: null hidden or scratch");
  TERN_CHECK((reinterpret_cast<uintptr_t>(hidden) & 15) == 0 && (reinterpret_cast<uintptr_t>(w.norm_w) & 15) == 0,
             "moe_router_decode: hidden and norm_w must be 16-byte aligned");
}

// Variant 1 (4 groups per step, 8-byte scale/bias loads; also under qmv's variants 2 and 3, which change only qmv):
// every matrix's scale and bias bases 8-byte aligned (the per-expert and per-row offsets are, as gpr % 4 == 0).
bool wide_ok(const qtile::Tuning& tu, int gpr, std::initializer_list<const DMat*> ms) {
  if (tu.variant == 0 || gpr % 4 != 0) return false;
  for (const DMat* m : ms)
    if (((reinterpret_cast<uintptr_t>(m->scales) | reinterpret_cast<uintptr_t>(m->biases)) & 7) != 0) return false;
  return true;
}

bool same_layout(const DMat& a, const DMat& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols && a.group_size == b.group_size &&
         a.row_words == b.row_words && a.groups_per_row == b.groups_per_row;
}

// TERN_MOE_DOWN_EARLY=0: the integer down kernel reads the routing after pdl_wait even after the integer gate_up.
bool early_routing_enabled() {
  static const bool on = !env_is("TERN_MOE_DOWN_EARLY", "0");
  return on;
}

bool& prefetch_flag() {
  static bool on = [] {
    const char* e = std::getenv("TERN_MOE_PREFETCH");  // off unless TERN_MOE_PREFETCH=1 (2x slower decode on H200)
    return e && e[0] == '1' && sm90_features();
  }();
  return on;
}

// One token under qmv variant 3 takes the one-token kernels where they fit: the cluster router (unless the routing
// block is to prefetch the experts, which only the multi-block router does; moe_router_cluster_fits), the integer
// gate_up and down (moe_gate_up_dp4a_fits, moe_down_dp4a_fits). The one-token dispatch and
// moe_decode_batched_supported both ask these.
bool integer_kernels_wanted() { return qtile::tuning().variant == 3; }
bool cluster_router_wanted() { return integer_kernels_wanted() && !prefetch_flag(); }

// One token where launches cannot overlap (no programmatic dependent launch: the portable path, GPUs before sm_90):
// the router and the integer gate_up as one kernel (moe_router_gate_up.cuh), unless TERN_MOE_FUSED_ROUTER=0 (read
// once). Hopper keeps its cluster router and PDL.
bool fused_router_wanted() {
  static const bool on = !env_is("TERN_MOE_FUSED_ROUTER", "0");
  return on && !sm90_features() && integer_kernels_wanted() && !prefetch_flag();
}

// 16-byte aligned base pointers and per-expert strides (bulk prefetch ranges).
bool prefetchable(const DMat& m) {
  return (((reinterpret_cast<uintptr_t>(m.data) | reinterpret_cast<uintptr_t>(m.scales) |
            reinterpret_cast<uintptr_t>(m.biases)) & 15) == 0) &&
         (m.rows * m.row_words * 4) % 16 == 0 && (m.rows * m.groups_per_row * 2) % 16 == 0;
}

template <bool kFast8>
void launch_router(const RouterParams& p, int smem, cudaStream_t stream) {
  const unsigned grid = blocks_for(p.E + 1, kRouterWarps);
  if (p.E <= 32 * 8) {
    auto kernel = moe_router_kernel<kFast8, 8>;
    if (smem > 48 * 1024) qtile::allow_dynamic_smem(reinterpret_cast<const void*>(kernel));
    launch_pdl("moe_router_decode", kernel, dim3(grid), dim3(kRouterWarps * 32), size_t(smem), stream, p);
  } else {
    auto kernel = moe_router_kernel<kFast8, kMaxExperts / 32>;
    if (smem > 48 * 1024) qtile::allow_dynamic_smem(reinterpret_cast<const void*>(kernel));
    launch_pdl("moe_router_decode", kernel, dim3(grid), dim3(kRouterWarps * 32), size_t(smem), stream, p);
  }
}

// The scratch's x_lanes: T tokens' ceil(D / 1024) slices.
int64_t x_lanes_bytes(int T, int64_t D) { return int64_t(T) * ((D + 1023) / 1024) * kMoeXLaneSliceBytes; }

}  // namespace

size_t moe_decode_scratch_bytes(int T, int64_t D, int E, int k, int64_t F) {
  const int64_t b = align_up(T * D * 4) + align_up(int64_t(T) * E * 4) + align_up(T * 4) + align_up(int64_t(T) * k * 4) +
                    align_up(int64_t(T) * k * 4) + align_up(T * 4) + align_up(T * (k + 1) * F * 4) + align_up(2 * 4) +
                    align_up(T * 4) + align_up(x_lanes_bytes(T, D));
  return size_t(b);
}

MoeDecodeScratch moe_decode_scratch_view(void* base, int T, int64_t D, int E, int k, int64_t F) {
  TERN_CHECK((reinterpret_cast<uintptr_t>(base) & 255) == 0, "moe_decode scratch must be 256-byte aligned");
  unsigned char* p = static_cast<unsigned char*>(base);
  auto take = [&](int64_t bytes) {
    void* r = p;
    p += align_up(bytes);
    return r;
  };
  MoeDecodeScratch s;
  s.xhat = static_cast<float*>(take(T * D * 4));
  s.router_logits = static_cast<float*>(take(int64_t(T) * E * 4));
  s.shared_logit = static_cast<float*>(take(T * 4));
  s.ids = static_cast<int*>(take(int64_t(T) * k * 4));
  s.w = static_cast<float*>(take(int64_t(T) * k * 4));
  s.shared_gate = static_cast<float*>(take(T * 4));
  s.h = static_cast<float*>(take(T * (k + 1) * F * 4));
  s.ticket = static_cast<unsigned*>(take(2 * 4));
  s.epoch = s.ticket + 1;
  s.down_tickets = static_cast<unsigned*>(take(T * 4));
  s.down_tickets_count = T;
  s.x_lanes = static_cast<uint4*>(take(x_lanes_bytes(T, D)));  // last: the other tables keep their places
  return s;
}

void moe_decode_scratch_init(const MoeDecodeScratch& s, cudaStream_t stream) {
  TERN_CUDA(cudaMemsetAsync(s.ticket, 0, 2 * sizeof(unsigned), stream));  // the ticket and the epoch after it
  TERN_CUDA(cudaMemsetAsync(s.down_tickets, 0, size_t(s.down_tickets_count) * sizeof(unsigned), stream));
}

void moe_decode_scratch_stand_in_routing(const MoeDecodeScratch& s, int T, int E, int k, cudaStream_t stream) {
  const std::vector<int> ids = step_omit_routing(T, E, k);
  const std::vector<float> w(size_t(T) * size_t(k), 1.0f / float(k)), gate(size_t(T), 0.5f);
  TERN_CUDA(cudaMemcpyAsync(s.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, stream));
  TERN_CUDA(cudaMemcpyAsync(s.w, w.data(), w.size() * 4, cudaMemcpyHostToDevice, stream));
  TERN_CUDA(cudaMemcpyAsync(s.shared_gate, gate.data(), gate.size() * 4, cudaMemcpyHostToDevice, stream));
  TERN_CUDA(cudaStreamSynchronize(stream));  // the host vectors go out of scope
}

void moe_decode_set_l2_prefetch(bool on) { prefetch_flag() = on; }

void moe_router_decode(const MoeDecodeWeights& w, const float* hidden, int T, const MoeDecodeScratch& s,
                       cudaStream_t stream) {
  check_router_inputs(w, hidden, T, s);
  if (T == 1 && cluster_router_wanted() && moe_router_cluster(w, hidden, T, s, stream)) return;
  RouterParams p{};
  p.router = w.router;
  p.sgate = w.shared_expert_gate;
  p.norm_w = w.norm_w;
  p.eps = w.eps;
  p.hidden = hidden;
  p.T = T;
  p.D = int(w.router.cols);
  p.E = int(w.router.rows);
  p.k = w.top_k;
  p.s = s;
  const bool fast = router_fast8(w.router) && router_fast8(w.shared_expert_gate) &&
                    w.shared_expert_gate.cols == w.router.cols;
  const bool q4 = qtile::q4_fast_ok(w.expert_gate) && qtile::q4_fast_ok(w.expert_up) &&
                  qtile::q4_fast_ok(w.expert_down);
  // Only while the experts of the step fit comfortably in L2 (T = 1 at the model's shapes: 9 × 1.77 MB); beyond,
  // prefetched lines would be evicted before use and read twice.
  const auto ebytes = [](const DMat& m) { return double(m.rows) * double(m.row_words * 4 + m.groups_per_row * 4); };
  const double pf_bytes = double(T * w.top_k + 1) * (ebytes(w.expert_gate) + ebytes(w.expert_up) + ebytes(w.expert_down));
  if (prefetch_flag() && q4 && pf_bytes <= 24e6 && prefetchable(w.expert_gate) && prefetchable(w.expert_up) &&
      prefetchable(w.expert_down) && prefetchable(w.shared_gate) && prefetchable(w.shared_up) &&
      prefetchable(w.shared_down)) {
    p.pf_gate = q4_mat(w.expert_gate);
    p.pf_up = q4_mat(w.expert_up);
    p.pf_down = q4_mat(w.expert_down);
    p.pf_sgate = q4_mat(w.shared_gate);
    p.pf_sup = q4_mat(w.shared_up);
    p.pf_sdown = q4_mat(w.shared_down);
  }
  const int smem = T * router_ldxs(p.D) * 4;
  TERN_CHECK(smem <= qtile::max_dynamic_smem() - 1024, "moe_router_decode: D = ", p.D, ", T = ", T, " too large");
  if (fast)
    launch_router<true>(p, smem, stream);
  else
    launch_router<false>(p, smem, stream);
}

template <int D, int UG>
void launch_gate_up_depth(const GateUpQ4Params& p, int64_t work_blocks, int smem, cudaStream_t stream) {
  auto kernel = moe_gate_up_q4_kernel<D, UG>;
  const void* k = reinterpret_cast<const void*>(kernel);
  qtile::allow_dynamic_smem(k);
  const int grid = qtile::persistent_grid(k, smem, work_blocks);
  launch_pdl("moe_gate_up_decode", kernel, dim3(unsigned(grid)), dim3(qtile::kThreads), size_t(smem), stream, p);
}

bool moe_gate_up_decode(const MoeDecodeWeights& w, int T, const MoeDecodeScratch& s, cudaStream_t stream) {
  check_shapes(w, T);
  if (T == 1 && integer_kernels_wanted() && moe_gate_up_dp4a(w, s, stream)) return true;
  const int k = w.top_k, pairs = T * k + 1;
  const int64_t F = w.expert_gate.rows, D = w.expert_gate.cols;
  const bool fast = qtile::q4_fast_ok(w.expert_gate) && same_layout(w.expert_gate, w.expert_up) &&
                    same_layout(w.expert_gate, w.shared_gate) && same_layout(w.expert_gate, w.shared_up) &&
                    qtile::q4_fast_ok(w.expert_up) && qtile::q4_fast_ok(w.shared_gate) &&
                    qtile::q4_fast_ok(w.shared_up) && F % 8 == 0;
  if (fast) {
    GateUpQ4Params p;
    p.gate = q4_mat(w.expert_gate);
    p.up = q4_mat(w.expert_up);
    p.sgate = q4_mat(w.shared_gate);
    p.sup = q4_mat(w.shared_up);
    p.F = int(F);
    p.row_words = int(w.expert_gate.row_words);
    p.gpr = int(w.expert_gate.groups_per_row);
    p.E = int(w.expert_gate.experts);
    p.T = T;
    p.k = k;
    p.s = s;
    p.layout.rows = T;
    p.layout.cols = int(D);
    const int smem = p.layout.bytes();
    if (smem <= qtile::max_dynamic_smem() - 2048) {
      const int64_t octets = int64_t(pairs) * (F / 8);
      const qtile::Tuning tu = qtile::tuning();
      if (wide_ok(tu, p.gpr, {&w.expert_gate, &w.expert_up, &w.shared_gate, &w.shared_up})) {
        switch (tu.depth) {
          case 4: launch_gate_up_depth<2, 4>(p, octets, smem, stream); break;
          case 8: launch_gate_up_depth<4, 4>(p, octets, smem, stream); break;
          default: launch_gate_up_depth<3, 4>(p, octets, smem, stream); break;
        }
        return false;
      }
      switch (tu.depth) {
        case 4: launch_gate_up_depth<4, 2>(p, octets, smem, stream); break;
        case 8: launch_gate_up_depth<8, 2>(p, octets, smem, stream); break;
        default: launch_gate_up_depth<6, 2>(p, octets, smem, stream); break;
      }
      return false;
    }
  }
  GateUpGenericParams p{w.expert_gate, w.expert_up, w.shared_gate, w.shared_up, T, k, int(w.expert_gate.experts), s};
  launch_pdl("moe_gate_up_decode", moe_gate_up_generic_kernel, dim3(blocks_for(F, 8), unsigned(pairs)), dim3(256), 0,
             stream, p);
  return false;
}

template <int D, int UG>
void launch_down_depth(const DownQ4Params& p, int64_t work_blocks, int smem, cudaStream_t stream) {
  auto kernel = moe_down_q4_kernel<D, UG>;
  const void* k = reinterpret_cast<const void*>(kernel);
  qtile::allow_dynamic_smem(k);
  const int grid = qtile::persistent_grid(k, smem, work_blocks);
  launch_pdl("moe_down_decode", kernel, dim3(unsigned(grid)), dim3(qtile::kThreads), size_t(smem), stream, p);
}

void moe_down_decode(const MoeDecodeWeights& w, float* hidden, int T, const MoeDecodeScratch& s, cudaStream_t stream,
                     bool after_integer_gate_up) {
  check_shapes(w, T);
  TERN_CHECK(hidden, "moe_down_decode: null hidden");
  if (T == 1 && integer_kernels_wanted() &&
      moe_down_dp4a(w, hidden, s, after_integer_gate_up && early_routing_enabled(), stream))
    return;
  const int k = w.top_k;
  const int64_t F = w.expert_down.cols, D = w.expert_down.rows;
  const bool fast = qtile::q4_fast_ok(w.expert_down) && qtile::q4_fast_ok(w.shared_down) &&
                    same_layout(w.expert_down, w.shared_down);
  if (fast) {
    DownQ4Params p;
    p.down = q4_mat(w.expert_down);
    p.sdown = q4_mat(w.shared_down);
    p.D = int(D);
    p.row_words = int(w.expert_down.row_words);
    p.gpr = int(w.expert_down.groups_per_row);
    p.E = int(w.expert_down.experts);
    p.T = T;
    p.k = k;
    p.hidden = hidden;
    p.s = s;
    p.layout.rows = T * (k + 1);
    p.layout.cols = int(F);
    const int smem = p.layout.bytes();
    if (smem <= qtile::max_dynamic_smem() - 2048) {
      const int64_t tiles = (D + 15) / 16;
      const qtile::Tuning tu = qtile::tuning();
      if (wide_ok(tu, p.gpr, {&w.expert_down, &w.shared_down})) {
        switch (tu.depth) {
          case 4: launch_down_depth<2, 4>(p, tiles, smem, stream); break;
          case 8: launch_down_depth<4, 4>(p, tiles, smem, stream); break;
          default: launch_down_depth<3, 4>(p, tiles, smem, stream); break;
        }
        return;
      }
      switch (tu.depth) {
        case 4: launch_down_depth<4, 2>(p, tiles, smem, stream); break;
        case 8: launch_down_depth<8, 2>(p, tiles, smem, stream); break;
        default: launch_down_depth<6, 2>(p, tiles, smem, stream); break;
      }
      return;
    }
  }
  DownGenericParams p{w.expert_down, w.shared_down, T, k, int(w.expert_down.experts), hidden, s};
  launch_pdl("moe_down_decode", moe_down_generic_kernel, dim3(blocks_for(D, 8)), dim3(256), 0, stream, p);
}

bool moe_decode_fuses_router(const MoeDecodeWeights& w, int T) {
  return T == 1 && fused_router_wanted() && moe_router_gate_up_fits(w);
}

bool moe_router_gate_up_decode(const MoeDecodeWeights& w, const float* hidden, int T, const MoeDecodeScratch& s,
                               cudaStream_t stream) {
  check_router_inputs(w, hidden, T, s);
  return moe_decode_fuses_router(w, T) && moe_router_gate_up_dp4a(w, hidden, s, stream);
}

void moe_decode(const MoeDecodeWeights& w, float* hidden, int T, const MoeDecodeScratch& s, cudaStream_t stream) {
  // TERN_STEP_OMIT (step_omit.h) may leave parts out: where the router and gate_up are one kernel, leaving out one
  // of them runs the other's own kernel; without an integer gate_up before it, the down kernel reads the routing
  // only after its wait.
  const bool router = !step_omits(StepPart::router), gate_up = !step_omits(StepPart::gate_up);
  const bool down = !step_omits(StepPart::down);
  if (router && gate_up && moe_router_gate_up_decode(w, hidden, T, s, stream)) {
    // the fused kernel, like the integer gate_up, ends the routing
    if (down) moe_down_decode(w, hidden, T, s, stream, true);
    return;
  }
  if (router) moe_router_decode(w, hidden, T, s, stream);
  const bool integer_gate_up = gate_up && moe_gate_up_decode(w, T, s, stream);
  if (down) moe_down_decode(w, hidden, T, s, stream, integer_gate_up);
}

// Where clusters are missing (before sm_90, the portable path), the ticket router routes the batch in launches of
// up to kQmvMaxTokens tokens; each token's logits and choice are the same whatever the launch's other tokens.
bool ticket_router_takes_batches(const MoeDecodeWeights& w) {
  return !sm90_features() && integer_kernels_wanted() && !prefetch_flag() &&
         kQmvMaxTokens * router_ldxs(int(w.router.cols)) * 4 <= qtile::max_dynamic_smem() - 1024;
}

bool moe_decode_batched_supported(const MoeDecodeWeights& w) {
  const bool router = (cluster_router_wanted() && moe_router_cluster_fits(w)) || ticket_router_takes_batches(w);
  return router && integer_kernels_wanted() && moe_gate_up_dp4a_fits(w) && moe_down_dp4a_fits(w);
}

// B tokens' routing: B router clusters in one launch, or the ticket router over chunks of the batch. With x_lanes
// the clusters also write the scratch's x_lanes for the grouped gate_up, and x_lanes_written says so (the ticket
// router does not write them).
bool route_batch(const MoeDecodeWeights& w, const float* hidden, int B, const MoeDecodeScratch& s,
                 cudaStream_t stream, bool x_lanes, bool& x_lanes_written) {
  x_lanes_written = false;
  if (cluster_router_wanted() && moe_router_cluster(w, hidden, 1, s, stream, B, x_lanes)) {
    x_lanes_written = x_lanes;
    return true;
  }
  if (!ticket_router_takes_batches(w)) return false;
  const int64_t D = w.router.cols, E = w.router.rows, k = w.top_k;
  for (int b0 = 0; b0 < B; b0 += kQmvMaxTokens) {
    MoeDecodeScratch c = s;  // the chunk's rows of every [token, ...] scratch table
    c.xhat += b0 * D;
    c.router_logits += b0 * E;
    c.shared_logit += b0;
    c.ids += b0 * k;
    c.w += b0 * k;
    c.shared_gate += b0;
    moe_router_decode(w, hidden + b0 * D, std::min(kQmvMaxTokens, B - b0), c, stream);
  }
  return true;
}

// The one-token step's three launches (moe_decode at T = 1 under variant 3) with B tokens each: B router clusters,
// then gate_up and down with grid.y = token. The down kernel reads the routing early under the one-token step's
// condition: the launch before it is the integer gate_up, whose blocks trigger only after their pdl_wait, i.e. once
// all B routings are complete.
bool moe_decode_batched(const MoeDecodeWeights& w, float* hidden, int B, const MoeDecodeScratch& s,
                        cudaStream_t stream, const MoeTablesOut& next) {
  TERN_CHECK(B >= 1 && B <= kBatchMaxTokens, "moe_decode_batched: B = ", B, " outside 1..", kBatchMaxTokens);
  check_shapes(w, 1);
  TERN_CHECK(moe_decode_batched_supported(w),
             "moe_decode_batched: the one-token cluster router and integer expert kernels do not take these weights "
             "(qmv variant ", qtile::tuning().variant, ", L2 prefetch ", prefetch_flag() ? "on" : "off", ")");
  // The launches' remaining conditions, checked before the first so that a refusal launches nothing.
  const auto aligned = [](const void* p) { return p && (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  TERN_CHECK(aligned(hidden) && aligned(s.xhat) && aligned(s.h),
             "moe_decode_batched: hidden and the scratch's x̂ and h must be 16-byte aligned");
  // The grouped gate_up (opt-in) reads x̂ quantised by the router: asked for where the gate_up would take it.
  const bool x_lanes = moe_gate_up_wants_x_lanes(w, B) && aligned(s.x_lanes) && w.router.cols % 1024 == 0;
  bool x_lanes_written = false;
  // TERN_STEP_OMIT (step_omit.h) may leave parts out; without the gate_up before it, the down kernel reads the
  // routing only after its wait.
  const bool router = !step_omits(StepPart::router), gate_up = !step_omits(StepPart::gate_up);
  const bool down = !step_omits(StepPart::down);
  // The next product's tables from the down kernel: where the rows are whole groups of 64 and the tickets cover B.
  const bool tables = next.tables && w.router.cols % 64 == 0 && s.down_tickets && s.down_tickets_count >= B;
  TERN_CHECK(!tables || (reinterpret_cast<uintptr_t>(next.tables) & 15) == 0,
             "moe_decode_batched: the tables must be 16-byte aligned");
  const MoeTablesOut out = tables ? next : MoeTablesOut{};
  const bool launched = (!router || route_batch(w, hidden, B, s, stream, x_lanes, x_lanes_written)) &&
                        (!gate_up || moe_gate_up_dp4a(w, s, stream, B, x_lanes_written)) &&
                        (!down || moe_down_dp4a(w, hidden, s, gate_up && early_routing_enabled(), stream, B, out));
  TERN_INTERNAL_CHECK(launched, "moe_decode_batched: a kernel refused after the checks");
  return tables && down;
}

}  // namespace tern::cuda
