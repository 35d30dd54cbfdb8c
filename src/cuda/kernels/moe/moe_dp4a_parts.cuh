// Parts shared by the MoE decode block's integer expert kernels: the one-token kernels (moe_dp4a.cu), their batched
// ring forms (moe_dp4a_ring.cu), the grouped gate_up (moe_dp4a_grouped.cu) and the fused router + gate_up kernel
// (moe_router_gate_up.cu). Included by those .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/qmv/dp4a_tables.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda::moe_parts {

using qtile::kThreads;  // blocks of 8 warps, as qtile::balanced_grid sizes them
using qtile::kWarps;
constexpr int kTopK = 8;           // the down kernel's segments: 8 routed + the shared expert
constexpr int kSeg = kTopK + 1;
constexpr int kDownCols = 512;     // F: 32 lanes × 16 columns

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// A stacked 4-bit matrix: words, scales, biases and per-expert strides (in words and groups).
struct Q4 {
  const uint32_t* words;
  const uint16_t* scales;
  const uint16_t* biases;
  int64_t expert_words, expert_groups;
};

// a or b, field by field (a reference to one of two kernel-parameter structs would send them to local memory).
__device__ __forceinline__ Q4 pick(bool first, const Q4& a, const Q4& b) {
  return Q4{first ? a.words : b.words, first ? a.scales : b.scales, first ? a.biases : b.biases,
            first ? a.expert_words : b.expert_words, first ? a.expert_groups : b.expert_groups};
}

inline Q4 q4_of(const DMat& m) {
  return Q4{static_cast<const uint32_t*>(m.data), m.scales, m.biases, m.rows * m.row_words, m.rows * m.groups_per_row};
}

// ---- gate_up + SwiGLU ---------------------------------------------------------------------------------------------

struct GateUpParams {
  Q4 gate, up, sgate, sup;
  int F, row_words, gpr, E, k;
  const int* ids;      // [B][k]
  const float* xhat;   // [B][D]
  float* h;            // [B][k + 1][F]
  // L2 prefetch (MoeDecodeWeights::prefetch_down): the down kernel's matrices (down_rows rows of down_row_words words,
  // down_gpr groups) of the k chosen experts and the shared expert.
  bool down_ahead = false;
  Q4 down, sdown;
  int down_rows = 0, down_row_words = 0, down_gpr = 0;
  // The ring form (moe_dp4a_ring.cu): its first shared-expert batches copied before pdl_wait (set by gate_up_ring).
  bool shared_early = false;
  // The ring form: each token's routed experts taken in ascending id instead of routing order (set by gate_up_ring).
  bool by_expert_id = false;
  bool wide = false;  // x̂ at 24 bits (moe_dp4a_wide(), set by gate_up_params)
};

// L2 prefetch of the down matrices of n experts, spread over the threads of the grid's blocks along x (grid_thread:
// blockIdx.x) in pieces of L2Ranges::kPiece bytes: per segment s < n its words, then scales, then biases; segment
// shared_seg is the shared expert, every other one the routed expert ids[s].
__device__ inline void prefetch_down_experts(const GateUpParams& p, const int* ids, int n, int shared_seg) {
  const int64_t wbytes = int64_t(p.down_rows) * p.down_row_words * 4, gbytes = int64_t(p.down_rows) * p.down_gpr * 2;
  const int64_t wp = (wbytes + L2Ranges::kPiece - 1) / L2Ranges::kPiece;
  const int64_t gp = (gbytes + L2Ranges::kPiece - 1) / L2Ranges::kPiece;
  const int64_t per_seg = wp + 2 * gp;
  for (int64_t t = grid_thread(); t < n * per_seg; t += grid_threads()) {
    const int seg = int(t / per_seg);
    int64_t k = t - int64_t(seg) * per_seg;
    const bool sh = seg == shared_seg;
    const Q4 M = pick(sh, p.sdown, p.down);
    const int64_t e = sh ? 0 : ids[seg];
    const char* base;
    int64_t bytes;
    if (k < wp) {
      base = reinterpret_cast<const char*>(M.words + e * M.expert_words);
      bytes = wbytes;
    } else {
      k -= wp;
      const bool sc = k < gp;
      if (!sc) k -= gp;
      base = reinterpret_cast<const char*>((sc ? M.scales : M.biases) + e * M.expert_groups);
      bytes = gbytes;
    }
    const int64_t off = k * L2Ranges::kPiece;
    l2_prefetch_bulk(base + off, uint32_t(bytes - off < L2Ranges::kPiece ? bytes - off : L2Ranges::kPiece));
  }
}

// The token's down matrices: the k chosen experts (ids, clamped) and the shared expert (segment k), over the token's
// blocks.
__device__ inline void prefetch_down(const GateUpParams& p, const int* ids) {
  prefetch_down_experts(p, ids, p.k + 1, p.k);
}

// The experts' activations (dp4a_tile.cuh): 16-bit, or 24-bit in the wide form (kWide: every kernel's template
// parameter, from moe_dp4a_wide() when the launch is recorded: GateUpParams::wide, DownParams::wide).
//
// Σ q·v of a lane's columns from its partial sums: dh·256 + dl (16-bit, exact), or (dh·256 + dm)·256 + dl (wide:
// dm·256 + dl exact in fp32 below 2^24, as it is over at most 32 columns, then one rounding; qmv_dp4a's wide form has
// the same expression over 64 columns, where the inner sum may round too).
template <bool kWide>
__device__ __forceinline__ float lane_dot(int dh, int dm, int dl) {
  if constexpr (kWide) return fmaf(float(dh), 65536.0f, fmaf(float(dm), 256.0f, float(dl)));
  return float(dh * 256 + dl);
}

// A lane's activations in the gate_up kernels (gate_up_lane_x): its columns [1024·j + 32·lane, +32) of each slice j.
template <int S, bool kWide>
struct GateUpX {
  uint4 q[S][4];               // words 4·lane + k: {even hi, odd hi, even lo, odd lo} (wide: mid in place of lo)
  uint2 lo[kWide ? S : 1][4];  // wide: the words' {even lo, odd lo}
  float sig[S], sx[S];         // σ of the lane's group; σ·Σv over its 32 columns
};

template <int S, bool kWide>
__device__ __forceinline__ float dot_row(const uint4 (&w)[S], const uint32_t (&sb)[S], const GateUpX<S, kWide>& x) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < S; ++j) {
    int dh = 0, dm = 0, dl = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t wk = k == 0 ? w[j].x : k == 1 ? w[j].y : k == 2 ? w[j].z : w[j].w;
      if constexpr (kWide) {
        dp4a::dot_word_wide(wk, x.q[j][k], x.lo[j][k], dh, dm, dl);
      } else {
        dp4a::dot_word(wk, x.q[j][k], dh, dl);
      }
    }
    acc = fmaf(dp4a::scale_of(sb[j]) * x.sig[j], lane_dot<kWide>(dh, dm, dl), acc);
    acc = fmaf(dp4a::bias_of(sb[j]), x.sx[j], acc);
  }
  return acc;
}

// The batched gate_up forms' stage (moe_dp4a_ring.cu's layout, 1152·S bytes): gate words [S·512 B], up words
// [S·512 B], then the gate's scales, its biases, the up's scales, its biases [2S chunks of 16 B each].
//
// Copies row i of expert e's gate and up (sh: the shared expert's; e then 0) into the stage at dst (this lane's
// chunks: word chunk 32j + lane of each matrix, scale/bias chunk lane). Offsets in 32 bits: e·expert_words +
// i·row_words + 4·lane + 128·j < experts·rows·row_words < 2^31 words (q4_dp4a_ok), the groups an eighth of that; the
// four matrices have one shape (moe_gate_up_dp4a_fits: same_shape), so G's strides serve U.
template <int S>
__device__ __forceinline__ void issue_gate_up_row(const GateUpParams& p, bool sh, uint32_t e, int i, int lane,
                                                  uint32_t dst) {
  dst += uint32_t(16 * lane);
  const Q4 G = pick(sh, p.sgate, p.gate), U = pick(sh, p.sup, p.up);
  const uint32_t wo = e * uint32_t(G.expert_words) + uint32_t(i) * uint32_t(p.row_words) + uint32_t(4 * lane);
  const uint32_t* g = G.words + wo;
  const uint32_t* u = U.words + wo;
#pragma unroll
  for (int j = 0; j < S; ++j) cp_async_16(dst + uint32_t(512 * j), g + 128 * j, 16u);
#pragma unroll
  for (int j = 0; j < S; ++j) cp_async_16(dst + uint32_t(512 * (S + j)), u + 128 * j, 16u);
  if (lane < 8 * S) {  // chunk `lane` of the 8S scale/bias chunks: array lane / 2S at group 8·(lane mod 2S)
    const int which = lane / (2 * S), piece = lane - which * (2 * S);
    const Q4 M = pick(which < 2, G, U);
    const uint16_t* base = (which & 1) ? M.biases : M.scales;
    const uint32_t go = e * uint32_t(G.expert_groups) + uint32_t(i) * uint32_t(p.gpr) + uint32_t(8 * piece);
    cp_async_16(dst + uint32_t(1024 * S), base + go, 16u);
  }
}

// What lane `lane` reads of a landed stage st: its uint4 of gate and up words per slice j and the group's packed
// scale (low half) and bias (high half).
template <int S>
__device__ __forceinline__ void read_gate_up_stage(const uint8_t* st, int lane, uint4 (&gv)[S], uint4 (&uv)[S],
                                                   uint32_t (&gsb)[S], uint32_t (&usb)[S]) {
  const uint4* gw = reinterpret_cast<const uint4*>(st);
  const uint4* uw = gw + 32 * S;
  const uint16_t* gsc = reinterpret_cast<const uint16_t*>(st + 1024 * S);
  const uint16_t* gbi = gsc + 16 * S;
  const uint16_t* usc = gbi + 16 * S;
  const uint16_t* ubi = usc + 16 * S;
#pragma unroll
  for (int j = 0; j < S; ++j) {
    gv[j] = gw[32 * j + lane];
    uv[j] = uw[32 * j + lane];
    const int g = 16 * j + lane / 2;
    gsb[j] = uint32_t(gsc[g]) | (uint32_t(gbi[g]) << 16);
    usb[j] = uint32_t(usc[g]) | (uint32_t(ubi[g]) << 16);
  }
}

// What a lane reads of one gate_up batch (one intermediate row of one slot: its gate row and its up row): a uint4 of
// words per 1024-column slice j and the group's bf16 scale and bias, kept apart (packed where used: packed as they
// were loaded, the next batch's would be waited for before the current batch's dot products).
template <int S>
struct GateUpBatch {
  uint4 g[S], u[S];
  uint32_t g_scale[S], g_bias[S], u_scale[S], u_bias[S];
  // Each slice's packed scale (low half) and bias (high half), as dot_row takes them: the gate row's, the up row's.
  __device__ __forceinline__ void gate_sb(uint32_t (&out)[S]) const {
#pragma unroll
    for (int j = 0; j < S; ++j) out[j] = g_scale[j] | (g_bias[j] << 16);
  }
  __device__ __forceinline__ void up_sb(uint32_t (&out)[S]) const {
#pragma unroll
    for (int j = 0; j < S; ++j) out[j] = u_scale[j] | (u_bias[j] << 16);
  }
};

// Loads batch b of one token: slot pair = b / F (0: the shared expert, whose rows need no routing), intermediate row
// i = b % F; ids the token's clamped routing. Zeros, nothing read, for b >= end.
template <int S>
__device__ __forceinline__ void load_gate_up(const GateUpParams& p, const int* ids, int b, int end, int lane,
                                             GateUpBatch<S>& out) {
  if (b >= end) {
#pragma unroll
    for (int j = 0; j < S; ++j) {
      out.g[j] = out.u[j] = make_uint4(0, 0, 0, 0);
      out.g_scale[j] = out.g_bias[j] = out.u_scale[j] = out.u_bias[j] = 0;
    }
    return;
  }
  const int pair = b / p.F, i = b - pair * p.F;
  const bool sh = pair == 0;
  const int64_t e = sh ? 0 : ids[pair - 1];
  const Q4 G = pick(sh, p.sgate, p.gate), U = pick(sh, p.sup, p.up);
  const int64_t wo = e * G.expert_words + int64_t(i) * p.row_words, go = e * G.expert_groups + int64_t(i) * p.gpr;
  const uint4* gw = reinterpret_cast<const uint4*>(G.words + wo) + lane;
  const uint4* uw = reinterpret_cast<const uint4*>(U.words + wo) + lane;
#pragma unroll
  for (int j = 0; j < S; ++j) {
    out.g[j] = qtile::ld_weights_u4(gw + 32 * j);
    out.u[j] = qtile::ld_weights_u4(uw + 32 * j);
    const int64_t g = go + 16 * j + lane / 2;
    out.g_scale[j] = qtile::ld_const_u16(G.scales + g);
    out.g_bias[j] = qtile::ld_const_u16(G.biases + g);
    out.u_scale[j] = qtile::ld_const_u16(U.scales + g);
    out.u_bias[j] = qtile::ld_const_u16(U.biases + g);
  }
}

// One warp's batches batch, batch + warps, ... below end: h[slot][i] = silu(gate·x̂)·(up·x̂) (slot k: the shared
// expert), x̂ as gate_up_lane_x leaves it (x). cur holds the first batch's weights on entry; each step loads the next
// batch's (below end) before its dot products. Returns the first of the warp's batches at or past end.
template <int S, bool kWide>
__device__ __forceinline__ int gate_up_rows(const GateUpParams& p, const int* ids, int batch, int end, int warps,
                                            int lane, const GateUpX<S, kWide>& x, GateUpBatch<S>& cur, float* h) {
  for (; batch < end; batch += warps) {
    GateUpBatch<S> nxt;
    load_gate_up<S>(p, ids, batch + warps, end, lane, nxt);
    uint32_t gsb[S], usb[S];
    cur.gate_sb(gsb);
    cur.up_sb(usb);
    const float g = warp_sum(dot_row<S, kWide>(cur.g, gsb, x));
    const float u = warp_sum(dot_row<S, kWide>(cur.u, usb, x));
    if (lane == 0) {
      const int pair = batch / p.F, i = batch - pair * p.F;
      const int slot = pair == 0 ? p.k : pair - 1;
      h[int64_t(slot) * p.F + i] = silu_f(g) * u;
    }
    cur = nxt;
  }
  return batch;
}

// ---- down + weighted sum + residual -------------------------------------------------------------------------------

struct DownParams {
  Q4 down, sdown;
  int D, row_words, gpr, E;
  const int* ids;            // [B][kTopK]
  const float* w;            // [B][kTopK] routing weights
  const float* shared_gate;  // [B]
  const float* h;            // [B][kSeg][512]
  float* hidden;             // [B][D]
  bool early_routing;        // ids complete before this launch: read them and the first weights before pdl_wait
  // The next product's activation tables (MoeTablesOut; null: none): [⌈B/8⌉][table_tile_bytes(D)], from the
  // finished rows of hidden by the last block of each token (tickets [B]: arrivals, left at zero).
  uint8_t* tables = nullptr;
  const float* tables_norm = nullptr;
  float tables_eps = 0.0f;
  unsigned* tickets = nullptr;
  bool wide = false;  // h at 24 bits (moe_dp4a_wide(), set by moe_down_dp4a)
};

// The down kernels' end (every thread of the block; the block's rows of hidden written): with p.tables, the last of
// the token's gridDim.x blocks to arrive quantises the token's whole row into its tables (dp4a::table_token, the
// pre-quantising kernel's arithmetic) and sets the ticket back to zero. Each block's writes are made visible
// device-wide before it arrives (__threadfence by every thread, then the block's barrier), and the last block reads
// the row through L2 after its own fence.
__device__ __forceinline__ void down_tables_tail(const DownParams& p, int token, const float* hidden) {
  if (!p.tables) return;  // uniform
  __shared__ bool last;
  __shared__ float red[8];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(p.tickets + token, 1u) == gridDim.x - 1;
    if (last) p.tickets[token] = 0u;  // every block of the token has arrived: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  uint8_t* const tile = p.tables + int64_t(token / dp4a::kTileTokens) * dp4a::table_tile_bytes(p.D);
  dp4a::table_token(tile, hidden, p.D, p.tables_norm, p.tables_eps, token % dp4a::kTileTokens, red);
}


inline bool q4_dp4a_ok(const DMat& m) {
  return m.format == WeightFormat::affine4 && m.group_size == 64 && m.row_words == m.cols / 8 &&
         m.experts * m.rows * m.row_words < (int64_t(1) << 31) && (reinterpret_cast<uintptr_t>(m.data) & 15) == 0;
}

inline bool same_shape(const DMat& a, const DMat& b) { return a.rows == b.rows && a.cols == b.cols; }

// Whether L2 prefetch pieces of m's rows are 16-byte aligned: word, scale and bias bases, rows' groups and experts.
inline bool prefetch_aligned(const DMat& m) {
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return al(m.data) && al(m.scales) && al(m.biases) && (m.groups_per_row * 2) % 16 == 0 && (m.row_words * 4) % 16 == 0;
}

// The gate_up kernels' parameters for w's experts over the scratch s (rows b: token b), down_ahead where
// w.prefetch_down and the down matrices' pieces are aligned.
inline GateUpParams gate_up_params(const MoeDecodeWeights& w, const MoeDecodeScratch& s) {
  const DMat& g = w.expert_gate;
  GateUpParams p;
  p.gate = q4_of(g);
  p.up = q4_of(w.expert_up);
  p.sgate = q4_of(w.shared_gate);
  p.sup = q4_of(w.shared_up);
  p.F = int(g.rows);
  p.row_words = int(g.row_words);
  p.gpr = int(g.groups_per_row);
  p.E = int(g.experts);
  p.k = w.top_k;
  p.ids = s.ids;
  p.xhat = s.xhat;
  p.h = s.h;
  p.down_ahead = w.prefetch_down && prefetch_aligned(w.expert_down) && prefetch_aligned(w.shared_down) &&
                 same_shape(w.expert_down, w.shared_down);
  p.down = q4_of(w.expert_down);
  p.sdown = q4_of(w.shared_down);
  p.down_rows = int(w.expert_down.rows);
  p.down_row_words = int(w.expert_down.row_words);
  p.down_gpr = int(w.expert_down.groups_per_row);
  p.wide = moe_dp4a_wide();
  return p;
}

// B tokens: grid (blocks, B), the blocks per token from qtile::balanced_grid (B = 1: the one-token grid).

// The gate_up kernels' activations as lane `lane` reads them from the block's quantize_block output (xs_lo: the wide
// form's lo bytes; unused otherwise): its columns [1024·j + 32·lane, +32), σ of its group and σ·Σv of its 32 columns,
// per slice j.
template <int S, bool kWide>
__device__ __forceinline__ void gate_up_lane_x(const uint4* xs, const uint2* xs_lo, const int* xsum, const float* xsig,
                                               int lane, GateUpX<S, kWide>& x) {
#pragma unroll
  for (int j = 0; j < S; ++j) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x.q[j][k] = xs[dp4a::xs_slot(j * 128 + 4 * lane + k)];
      if constexpr (kWide) x.lo[j][k] = xs_lo[dp4a::xs_slot(j * 128 + 4 * lane + k)];
    }
    const int4 sv = *reinterpret_cast<const int4*>(xsum + j * 128 + 4 * lane);
    const int sumv = sv.x + sv.y + sv.z + sv.w;  // |Σv| < 2^28 (wide): exact in int32
    x.sig[j] = xsig[j * 16 + lane / 2];
    x.sx[j] = x.sig[j] * float(sumv);
  }
}

// Σ q·v of a lane's 16 columns of one down segment: its two words w against the activation words x0, x1 (wide: and
// their lo bytes l0, l1; unused otherwise).
template <bool kWide>
__device__ __forceinline__ float down_dot(uint2 w, const uint4& x0, const uint4& x1, const uint2& l0, const uint2& l1) {
  int dh = 0, dm = 0, dl = 0;
  if constexpr (kWide) {
    dp4a::dot_word_wide(w.x, x0, l0, dh, dm, dl);
    dp4a::dot_word_wide(w.y, x1, l1, dh, dm, dl);
  } else {
    dp4a::dot_word(w.x, x0, dh, dl);
    dp4a::dot_word(w.y, x1, dh, dl);
  }
  return lane_dot<kWide>(dh, dm, dl);
}

// The down kernels' per-segment factors for lane `lane` (columns [16·lane, +16) of each of the k + 1 rows of h):
// coefficient·σ of its group and coefficient·σ·Σv of its 16 columns, the coefficient the routing weight (or the
// shared expert's gate) of token `token`.
__device__ __forceinline__ void down_lane_coefficients(const DownParams& p, int token, const int* xsum,
                                                       const float* xsig, int lane, float (&sig)[kSeg],
                                                       float (&sx)[kSeg]) {
#pragma unroll
  for (int s = 0; s < kSeg; ++s) {
    const float coef = s < kTopK ? p.w[token * kTopK + s] : p.shared_gate[token];
    sig[s] = coef * xsig[s * 8 + lane / 4];
    sx[s] = sig[s] * float(xsum[s * 64 + 2 * lane] + xsum[s * 64 + 2 * lane + 1]);
  }
}

// The batched ring forms (moe_dp4a_ring.cu), for B >= 2 tokens: false when they do not apply (nothing launched).
// x_lanes: the router's per-lane activations (MoeDecodeScratch::x_lanes) when it wrote them, else null; the grouped
// gate_up (TERN_MOE_RING_GATE_UP=grouped) needs them, and without them the ring form runs.
bool gate_up_ring(const GateUpParams& p, int cols, int B, cudaStream_t stream, const uint4* x_lanes = nullptr);
bool down_ring(const DownParams& p, int B, cudaStream_t stream);
// Whether B >= 2 takes the ring forms (true unless TERN_MOE_RING=0).
bool ring_enabled();
// Whether the gate_up form grouped by expert across the batch (moe_dp4a_grouped.cu) takes these shapes: B >= 2, cols
// 1024 or 2048, 1 <= E <= 256, top_k 8, and the 16-bit activations (!wide: the router's x_lanes hold those; with 24
// bits the ring form runs). The one place that decides it (gate_up_grouped and gate_up_wants_x_lanes ask).
bool gate_up_grouped_takes(int cols, int E, int k, int B, bool wide);
// The grouped form: false when it does not apply (gate_up_grouped_takes, x_lanes null or misaligned, the shared
// memory too small; nothing launched).
bool gate_up_grouped(const GateUpParams& p, const uint4* x_lanes, int cols, int B, cudaStream_t stream);
// Launches of the grouped form so far (tests: that it ran).
int64_t gate_up_grouped_launches();
// Whether gate_up_ring would take the grouped form for these shapes given x_lanes: the rings on, the grouped mode,
// gate_up_grouped_takes at moe_dp4a_wide() (moe_gate_up_wants_x_lanes).
bool gate_up_wants_x_lanes(int cols, int E, int k, int B);

}  // namespace tern::cuda::moe_parts
