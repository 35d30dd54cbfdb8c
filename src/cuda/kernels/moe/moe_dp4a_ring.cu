// The batched (B >= 2) forms of the one-token MoE expert kernels of moe_dp4a.cu, with each warp's weight rows
// streamed through a ring of shared-memory stages (cp.async, kStages − 1 rows ahead) instead of one row ahead in
// registers. In a batched step a warp takes many rows in turn (at 8 tokens: ~8 output rows of down, ~18 batches of
// gate_up per warp), and one row in flight per warp left both kernels waiting on memory (docs/benchmarks.md).
//
// Every value is made as in the one-token kernels: the same lane owns the same columns of a row, the same activations
// (quantised by the same quantize_block), the same fold (dot_row / the segment loop) and the same warp_sum, so each
// token's h and hidden are bit for bit its one-token result. Only where a lane's weights wait differs.
//
// Which gate_up form runs (gate_up_mode, TERN_MOE_RING_GATE_UP): the ring form below (default), or the form grouped
// by expert across the batch's tokens (moe_dp4a_grouped.cu: each expert row read once per group of up to 8 tokens,
// not once per token; the same stage layout and the same bits), which falls back to the ring form where it does not
// apply (24-bit activations, the default: moe_dp4a_wide(); no x̂ quantised by the router in the scratch, E > 256,
// D = 4096).
//
// A stage holds one row's bytes in the order of its 16-byte chunks; lane l copies chunks c = l + 32·j, j = 0, 1, ...:
//   gate_up (S slices of 1024 columns): gate words [S·512 B], up words [S·512 B], then the gate's scales, its biases,
//            the up's scales, its biases [2S chunks each]: 72·S chunks. So j < S: gate words 4·l + 128·j of the row
//            (16 B each), S <= j < 2S: the same of up, j = 2S (lanes l < 8S): scale/bias chunk l, i.e. array l / 2S
//            (gate scales, gate biases, up scales, up biases) at group 8·(l mod 2S);
//   down:    the 9 segments' words [9][256 B] (8 routed experts, then the shared one), their scales [9][16 B], their
//            biases [9][16 B]: 162 chunks. So j < 4: words of segment 2j + l / 16, bytes 16·(l mod 16); j = 4: words of
//            the shared expert (l < 16), scales of segment l − 16 (16 <= l < 25), biases of segment l − 25 (l >= 25);
//            j = 5 (l < 2): biases of segment 7 + l.
//
// The down kernel keeps its per-row work besides the dot products small: each lane makes, once, the source of its up
// to 6 chunks at row 0 and their row strides (DownChunks), so that row r's chunk j is base[j] + r·stride[j]; the
// activations' shared-memory slots of a lane are one address per word of its two and an offset per segment (against
// per-chunk addresses made per row from the routing: 8 / 16 streams +0.1% / +1.2%, docs/benchmarks.md). The same
// treatment of gate_up (the slot pairs' bases in shared memory, batches stepped without a division, Σgate and Σup in
// one butterfly) was 5% slower at 8 and 16 streams, though 34% fewer instructions a row, and is not kept.
//
// The gate_up ring takes each token's routed experts in ascending expert id, not in routing order (by default;
// TERN_MOE_GATE_UP_BY_ID=0 for routing order): every token's warps walk their experts over the kernel's time in the
// same order, so two tokens routed to one expert read it at about the same time and the second read finds it in L2.
// In routing order the same expert sat at any slot of each token, and at 16 streams the kernel read ~23% more from
// DRAM than the distinct experts hold (Nsight: L2 hit 30%); in ascending id 16 streams ran 1.6% faster, 4 and 8 as
// fast (H100, docs/benchmarks.md, thirty-eighth session). Each h row is still written to its routing slot, and every
// value is made as before: only when a row is read changes.
//
// By default (TERN_MOE_RING_ROWS=1 for one row a step; 1.2 / 1.7 / 2.0% faster at 8 / 16 / 32 streams than one,
// docs/benchmarks.md; tests: moe_ring_set_rows) each warp takes two of its rows a step in both kernels
// (gate_up's batch and batch + warps, down's row and row + warps): one wait for both stages, and their sums reduced
// together by a transposed butterfly (warp_sum_halves / warp_sum_quarters in warp_reduce.cuh), each sum bit for bit
// warp_sum's; down's two rows also share their activation reads. Each step issues the two rows that refill the stages
// read the step before, so the ring is full while a step waits, as in the one-row forms.
#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/moe/moe_dp4a_parts.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda::moe_parts {
namespace {

template <int S>
constexpr int gate_up_stages() { return S <= 2 ? 4 : 3; }
template <int S>
constexpr int gate_up_stage_bytes() { return 1152 * S; }
constexpr int kDownStages = 4;
constexpr int kDownStageBytes = kSeg * 256 + 2 * kSeg * 16;  // 2592
constexpr int kDownChunks = kDownStageBytes / 16;            // 162

// ---- gate_up + SwiGLU ---------------------------------------------------------------------------------------------

// Each warp takes batches first, first + warps, ... of its token (batch b: slot pair b / F, intermediate row b mod F;
// pair 0 the shared expert), stepped without a division (GateUpPos), the expert's offset from the routing in shared
// memory (ids_s) in 32 bits, and h's slot without a division. With 16-bit activations at S <= 2 it keeps 64 registers
// (__launch_bounds__ minimum 4 blocks): what an SM has left beside one block of the cluster router that precedes
// gate_up under PDL (512 threads of 96 registers). With 24-bit ones (the default) the lanes' lo bytes take 16 more
// at S = 2 (80: ring_min_blocks), so a block no longer fits beside a router block; at 64 registers that form spills.
// An earlier form made each chunk's address from the batch index with a division per row (1.3% / 2.3% / 3.2% slower
// at 8 / 16 / 32 streams, docs/benchmarks.md); another kept the slot pairs' bases in shared memory, read per row, and
// summed Σgate and Σup in one butterfly (5% slower).

// Batch pair·F + i of one token.
struct GateUpPos {
  int pair, i;
};

// Copies batch (pair, i)'s chunks (of this lane) into the stage at dst (pair > k: nothing): issue_gate_up_row.
template <int S>
__device__ __forceinline__ void issue_gate_up(const GateUpParams& p, const int* ids, GateUpPos b, int lane,
                                              uint32_t dst) {
  if (b.pair > p.k) return;
  const bool sh = b.pair == 0;
  issue_gate_up_row<S>(p, sh, sh ? 0u : uint32_t(ids[b.pair - 1]), b.i, lane, dst);
}

// The ring slot after / before slot s of kStages.
template <int kStages>
__device__ __forceinline__ int next_slot(int s) { return s + 1 == kStages ? 0 : s + 1; }
template <int kStages>
__device__ __forceinline__ int prev_slot(int s) { return s == 0 ? kStages - 1 : s - 1; }

// x̂'s quantised words, their sums and scales in shared memory while the block makes them: S·2624 bytes, and with
// 24 bits the words' lo bytes after them (S·1024 more).
template <int S, bool kWide>
constexpr int gate_up_x_bytes() { return S * 128 * 16 + S * 128 * 4 + S * 16 * 4 + (kWide ? S * 128 * 8 : 0); }

// With kXInRing (the default; TERN_MOE_GATE_UP_X_IN_RING=0 for the form before) the ring of stages is
// [kStages][kWarps][kStageBytes], a warp's slot s at s·kWarps·kStageBytes + warp·kStageBytes, and the last slot of
// every warp, which the prologue leaves empty (it fills slots 0 .. kStages − kRows − 1), holds x̂'s quantised words
// until every lane has its own in registers (gate_up_lane_x). The block's static shared memory is then the routing
// alone: at S = 2 a block takes 73.8 KB and 3 fit an SM, where x̂ in static memory beside the ring ([kWarps][kStages]
// [kStageBytes], 79 KB a block, 81 KB with 24-bit activations) let 2 fit. Only where the bytes sit changes, not a
// value. kRows: the warp's batches taken two a step (the default; see the pair loop below) or one
// (TERN_MOE_RING_ROWS=1).
// kWide: x̂ at 24 bits, its lo bytes in registers too (16 more at S = 2, so 3 blocks' registers an SM, as their
// shared memory allows; ring_min_blocks).
template <int S, bool kWide>
constexpr int ring_min_blocks() { return S == 1 ? 4 : S == 2 ? (kWide ? 3 : 4) : 1; }
template <int S, int kRows, bool kXInRing, bool kWide>
__global__ void __launch_bounds__(kThreads, ring_min_blocks<S, kWide>())
    moe_gate_up_ring_kernel(const GateUpParams p) {
  constexpr int kStages = gate_up_stages<S>(), kStageBytes = gate_up_stage_bytes<S>();
  constexpr int kSlotStride = kXInRing ? kWarps * kStageBytes : kStageBytes;  // from a warp's slot s to s + 1
  static_assert(gate_up_x_bytes<S, kWide>() <= kWarps * kStageBytes, "x̂ must fit one slot of every warp");
  extern __shared__ __align__(16) uint8_t ring[];  // [kStages][kWarps][kStageBytes] (kXInRing), else [kWarps][kStages]
  __shared__ int ids_s[kTopK];   // the routed experts in the order the warps take them (pair q + 1: ids_s[q])
  __shared__ int slot_s[kTopK];  // pair q + 1's routing slot (h's and the down's order)
  __shared__ int routed_s[kTopK];  // the routing's clamped ids, slot by slot
  constexpr int kStaticX = kXInRing ? 1 : S * 128;  // x̂ in static memory only in the form before
  __shared__ uint4 xs_static[kStaticX];
  __shared__ __align__(16) int xsum_static[kStaticX];
  __shared__ float xsig_static[kXInRing ? 1 : S * 16];
  __shared__ uint2 xs_lo_static[kXInRing || !kWide ? 1 : S * 128];
  // In the ring: at the last slot of every warp, which no copy of the prologue touches (it issues kStages − kRows).
  uint8_t* const x_area = ring + (kStages - 1) * kWarps * kStageBytes;
  uint4* const xs = kXInRing ? reinterpret_cast<uint4*>(x_area) : xs_static;
  int* const xsum = kXInRing ? reinterpret_cast<int*>(x_area + S * 128 * 16) : xsum_static;
  float* const xsig = kXInRing ? reinterpret_cast<float*>(x_area + S * 128 * 20) : xsig_static;
  uint2* const xs_lo = kXInRing ? reinterpret_cast<uint2*>(x_area + S * 2624) : xs_lo_static;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = int(gridDim.x) * kWarps, batches = (p.k + 1) * p.F;  // of this token
  const int first = int(blockIdx.x) * kWarps + warp;
  const int token = int(blockIdx.y);
  const int* ids = p.ids + token * p.k;
  const float* xhat = p.xhat + int64_t(token) * (S * 1024);
  float* h = p.h + int64_t(token) * (p.k + 1) * p.F;
  uint8_t* my_ring = ring + warp * (kXInRing ? kStageBytes : kStages * kStageBytes);
  const uint32_t ring_addr = smem_addr(my_ring);
  // The issue position steps by warps = step_pairs·F + step_i (step_i < F).
  const int step_pairs = warps / p.F, step_i = warps - step_pairs * p.F;
  GateUpPos ahead{first / p.F, first - (first / p.F) * p.F};
  const auto advance = [&](GateUpPos& b) {
    b.i += step_i;
    b.pair += step_pairs;
    if (b.i >= p.F) {
      b.i -= p.F;
      ++b.pair;
    }
  };
  // The batches the loop's first step does not issue, kStages − kRows of them: those of the shared expert (pair 0,
  // which needs no routing) before pdl_wait, while the router still runs (by default; TERN_MOE_RING_SHARED_EARLY=0
  // issues them all after it); the routed ones after it. Only when a copy is issued changes.
  int s = 0;
  if (p.shared_early)
    for (; s < kStages - kRows && ahead.pair == 0; ++s) {
      issue_gate_up<S>(p, ids_s, ahead, lane, ring_addr + uint32_t(s * kSlotStride));
      cp_async_commit();
      advance(ahead);
    }
  pdl_wait();  // the routing and x̂ come from the router kernel
  if (int(threadIdx.x) < p.k) {
    const int e = ids[threadIdx.x];
    routed_s[threadIdx.x] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  if (int(threadIdx.x) < p.k) {
    // Slot t's place in the walk: its rank by id (ties by slot), or t itself in routing order.
    const int t = int(threadIdx.x), e = routed_s[t];
    int rank = t;
    if (p.by_expert_id) {
      rank = 0;
      for (int u = 0; u < p.k; ++u) rank += routed_s[u] < e || (routed_s[u] == e && u < t);
    }
    ids_s[rank] = e;
    slot_s[rank] = t;
  }
  __syncthreads();
  for (; s < kStages - kRows; ++s) {
    issue_gate_up<S>(p, ids_s, ahead, lane, ring_addr + uint32_t(s * kSlotStride));
    cp_async_commit();
    advance(ahead);
  }
  if (p.down_ahead) prefetch_down(p, ids_s);
  float unused_ss = 0.0f;
  dp4a::quantize_block<dp4a::quantize_passes(S * 128, kThreads), kWide>(xhat, nullptr, S * 128, xs, xsum, xsig,
                                                                         unused_ss, xs_lo);
  __syncthreads();
  pdl_trigger();  // after pdl_wait in every block: moe_down's early routing read stays safe (moe_dp4a.cuh)
  GateUpX<S, kWide> x;
  gate_up_lane_x<S, kWide>(xs, xs_lo, xsum, xsig, lane, x);
  if constexpr (kXInRing) __syncthreads();  // every lane has its x̂: the last slots may be refilled
  // Batch b is slot pair b / F, row b mod F: h's slot k (the shared expert) for pair 0, routing slot
  // slot_s[pair − 1] after it. The position of the warp's next batch to read, stepped as `ahead` is.
  const auto h_index = [&](GateUpPos b) { return (b.pair == 0 ? p.k : slot_s[b.pair - 1]) * p.F + b.i; };
  GateUpPos at{first / p.F, first - (first / p.F) * p.F};
  if constexpr (kRows == 2) {
    // Two batches a step, the warp's n-th and (n + 1)-th (batch and batch + warps) in ring slots n and n + 1 (mod
    // kStages). Each step first issues batches n + kStages − 2 and n + kStages − 1 into the slots of n − 2 and n − 1
    // (read the step before), so that, as above, the ring is full while the step waits. The four sums Σgate, Σup of
    // both batches go through one transposed butterfly (warp_sum_quarters: 6 shuffles for the four, bit for bit
    // warp_sum's) and one shuffle more brings each batch's Σup beside its Σgate: lane 0 writes batch's h, lane 16
    // batch + warps's. Past the end (an odd count of batches) the second batch is neither issued (issue_gate_up:
    // pair > k), read nor written, its sums 0 in the butterfly that all lanes take part in.
    int rd = 0;  // batch n's slot
    for (int batch = first; batch < batches; batch += 2 * warps) {
      const int batch1 = batch + warps, rd1 = next_slot<kStages>(rd);
      GateUpPos at1 = at;
      advance(at1);
      const int wr = prev_slot<kStages>(rd), wr0 = prev_slot<kStages>(wr);
      issue_gate_up<S>(p, ids_s, ahead, lane, ring_addr + uint32_t(wr0 * kSlotStride));
      cp_async_commit();
      advance(ahead);
      issue_gate_up<S>(p, ids_s, ahead, lane, ring_addr + uint32_t(wr * kSlotStride));
      cp_async_commit();
      advance(ahead);
      cp_async_wait<kStages - 2>();
      __syncwarp();  // every lane's chunks of both batches have landed
      uint4 gv[S], uv[S];
      uint32_t gsb[S], usb[S];
      read_gate_up_stage<S>(my_ring + rd * kSlotStride, lane, gv, uv, gsb, usb);
      const float g0 = dot_row<S, kWide>(gv, gsb, x), u0 = dot_row<S, kWide>(uv, usb, x);
      float g1 = 0.0f, u1 = 0.0f;
      if (batch1 < batches) {
        read_gate_up_stage<S>(my_ring + rd1 * kSlotStride, lane, gv, uv, gsb, usb);
        g1 = dot_row<S, kWide>(gv, gsb, x);
        u1 = dot_row<S, kWide>(uv, usb, x);
      }
      __syncwarp();  // both stages are read: the next step refills them
      // Lanes 0..7: Σg0, 8..15: Σu0, 16..23: Σg1, 24..31: Σu1; then lane 0 gets Σu0 and lane 16 Σu1.
      const float sum = warp_sum_quarters(g0, u0, g1, u1, lane);
      const float up = __shfl_xor_sync(0xffffffffu, sum, 8);
      const int b = lane < 16 ? batch : batch1;
      if ((lane & 15) == 0 && b < batches) h[h_index(lane < 16 ? at : at1)] = silu_f(sum) * up;
      rd = next_slot<kStages>(rd1);
      at = at1;
      advance(at);
    }
  } else {
    for (int it = 0;; ++it) {
      const int batch = first + it * warps;
      if (batch >= batches) break;
      const int slot_ahead = (it + kStages - 1) % kStages;  // kStages a constant: no division
      issue_gate_up<S>(p, ids_s, ahead, lane, ring_addr + uint32_t(slot_ahead * kSlotStride));
      cp_async_commit();
      advance(ahead);
      cp_async_wait<kStages - 1>();
      __syncwarp();  // every lane's chunks of this batch have landed
      const uint8_t* st = my_ring + (it % kStages) * kSlotStride;
      uint4 gv[S], uv[S];
      uint32_t gsb[S], usb[S];
      read_gate_up_stage<S>(st, lane, gv, uv, gsb, usb);
      __syncwarp();  // the stage is read: the next iteration may refill it
      const float g = warp_sum(dot_row<S, kWide>(gv, gsb, x));
      const float u = warp_sum(dot_row<S, kWide>(uv, usb, x));
      if (lane == 0) h[h_index(at)] = silu_f(g) * u;
      advance(at);
    }
  }
  cp_async_wait<0>();
}

// ---- down + weighted sum + residual ---------------------------------------------------------------------------------

constexpr int kDownRuns = (kDownChunks + 31) / 32;  // 6: a lane's chunks per row

// A lane's chunks c = lane + 32·j (j < kDownRuns, c < 162) of output row r come from base[j] + r·stride[j] (bytes):
// words (c < 144: segment c / 16, bytes 16·(c mod 16) of its row; stride row_words·4) or the scales (kind 1) or biases
// (kind 2) of segment (c − 144) mod 9 (stride gpr·2). Made once per block, after the routing is read.
struct DownChunks {
  const char* base[kDownRuns];
  uint32_t stride[kDownRuns];
};

__device__ __forceinline__ void down_lane_chunks(const DownParams& p, const int* ids, int lane, DownChunks& out) {
#pragma unroll
  for (int j = 0; j < kDownRuns; ++j) {
    const int c = lane + 32 * j;
    int s, piece, kind;  // kind 0: words, 1: scales, 2: biases (the stage's chunk order above)
    if (c < kSeg * 16) {
      s = c / 16, piece = c % 16, kind = 0;
    } else {
      const int d = c - kSeg * 16;
      kind = 1 + d / kSeg, s = d % kSeg, piece = 0;
    }
    if (c >= kDownChunks) s = 0, kind = 0;  // unused (issue_down copies nothing); a valid address all the same
    const bool sh = s == kTopK;
    const Q4 M = pick(sh, p.sdown, p.down);
    const int64_t e = sh ? 0 : ids[s];
    out.base[j] = kind == 0 ? reinterpret_cast<const char*>(M.words + e * M.expert_words + piece * 4)
                            : reinterpret_cast<const char*>((kind == 1 ? M.scales : M.biases) + e * M.expert_groups);
    out.stride[j] = kind == 0 ? uint32_t(p.row_words) * 4u : uint32_t(p.gpr) * 2u;
  }
}

// Copies output row r's chunks (of this lane, ch) into the stage whose lane-l chunk 0 is at dst (stage + 16·lane);
// r past the end: nothing.
__device__ __forceinline__ void issue_down(const DownChunks& ch, int r, int D, int lane, uint32_t dst) {
  if (r >= D) return;
#pragma unroll
  for (int j = 0; j < kDownRuns; ++j)
    if (lane + 32 * j < kDownChunks)
      cp_async_16(dst + uint32_t(512 * j), ch.base[j] + uint64_t(uint32_t(r)) * ch.stride[j], 16u);
}

// What lane `lane` reads of a landed stage st: its words (uint2) of each segment and the segment's packed scale (low
// half) and bias (high half).
__device__ __forceinline__ void read_down_stage(const uint8_t* st, int lane, uint2 (&w)[kSeg], uint32_t (&sb)[kSeg]) {
  const uint2* wv = reinterpret_cast<const uint2*>(st);
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + kSeg * 256);
  const uint16_t* bi = sc + kSeg * 8;
#pragma unroll
  for (int s = 0; s < kSeg; ++s) {
    w[s] = wv[s * 32 + lane];
    sb[s] = uint32_t(sc[s * 8 + lane / 4]) | (uint32_t(bi[s * 8 + lane / 4]) << 16);
  }
}

// The lane's partial of rows r < R of the N read (w, sb): per segment its two words against the activations x_lane
// (read once for all the rows; wide: and their lo bytes, lo_lane), accumulated in segment order, each row's chain the
// one-token kernel's.
template <int R, int N, bool kWide>
__device__ __forceinline__ void down_dots(const uint2 (&w)[N][kSeg], const uint32_t (&sb)[N][kSeg],
                                          const uint4* const (&x_lane)[2], const uint2* const (&lo_lane)[2],
                                          const float (&sig)[kSeg], const float (&sx)[kSeg], float (&acc)[N]) {
  static_assert(R <= N);
#pragma unroll
  for (int s = 0; s < kSeg; ++s) {
    const uint4 x0 = x_lane[0][s * 64], x1 = x_lane[1][s * 64];
    const uint2 l0 = kWide ? lo_lane[0][s * 64] : make_uint2(0u, 0u);
    const uint2 l1 = kWide ? lo_lane[1][s * 64] : make_uint2(0u, 0u);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float dot = down_dot<kWide>(w[r][s], x0, x1, l0, l1);
      acc[r] = fmaf(dp4a::scale_of(sb[r][s]) * sig[s], dot, acc[r]);
      acc[r] = fmaf(dp4a::bias_of(sb[r][s]), sx[s], acc[r]);
    }
  }
}

// kRows: the warp's output rows taken two a step (the default; see the pair loop) or one (TERN_MOE_RING_ROWS=1).
template <int kRows, bool kWide>
__global__ void __launch_bounds__(kThreads, 2) moe_down_ring_kernel(const DownParams p) {
  extern __shared__ __align__(16) uint8_t ring[];  // [kWarps][kDownStages][kDownStageBytes]
  __shared__ int ids_s[kTopK];
  __shared__ uint4 xs[kSeg * 64];
  __shared__ uint2 xs_lo[kWide ? kSeg * 64 : 1];
  __shared__ int xsum[kSeg * 64];
  __shared__ float xsig[kSeg * 8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = int(gridDim.x) * kWarps;  // of this token
  const int first = int(blockIdx.x) * kWarps + warp;
  const int token = int(blockIdx.y);
  const int* ids = p.ids + token * kTopK;
  const float* h = p.h + int64_t(token) * (kSeg * kDownCols);
  float* hidden = p.hidden + int64_t(token) * p.D;
  const uint8_t* my_ring = ring + warp * kDownStages * kDownStageBytes;
  const uint32_t lane_addr = smem_addr(my_ring) + uint32_t(16 * lane);  // the lane's chunk 0 of stage 0
  if (!p.early_routing) pdl_wait();
  if (int(threadIdx.x) < kTopK) {
    const int e = __ldcg(ids + threadIdx.x);  // L2: written by another kernel, maybe while this one was resident
    ids_s[threadIdx.x] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  DownChunks ch;
  down_lane_chunks(p, ids_s, lane, ch);
  // The first rows' weights in flight while gate_up finishes / the activations are quantised.
#pragma unroll
  for (int s = 0; s < kDownStages - kRows; ++s) {  // the rows the loop's first step does not issue
    issue_down(ch, first + s * warps, p.D, lane, lane_addr + uint32_t(s * kDownStageBytes));
    cp_async_commit();
  }
  if (p.early_routing) pdl_wait();  // h comes from gate_up
  float unused_ss = 0.0f;
  dp4a::quantize_block<dp4a::quantize_passes(kSeg * 64, kThreads), kWide>(h, nullptr, kSeg * 64, xs, xsum, xsig,
                                                                          unused_ss, xs_lo);
  __syncthreads();
  pdl_trigger();
  float sig[kSeg], sx[kSeg];  // coefficient·σ of the lane's group, coefficient·σ·Σv of its 16 columns
  down_lane_coefficients(p, token, xsum, xsig, lane, sig, sx);
  // The lanes that write output rows: lane 0 the warp's row, and with pairs lane 16 the second one (row + own).
  const bool writer = kRows == 2 ? (lane & 15) == 0 : lane == 0;
  const int own = kRows == 2 && lane >= 16 ? warps : 0;
  // The residual row a writer adds to, a step ahead (after pdl_wait: an earlier kernel writes it).
  float hid = writer && first + own < p.D ? __ldcg(hidden + first + own) : 0.0f;
  // The lane's activation words 2·lane + e of segment s: xs[xs_slot(64·s + 2·lane + e)] = x_lane[e][64·s] (xs_slot
  // permutes within runs of 64 words), one address per e and an offset per s.
  const uint4* x_lane[2] = {xs + dp4a::xs_slot(2 * lane), xs + dp4a::xs_slot(2 * lane + 1)};
  const uint2* lo_lane[2] = {xs_lo + (kWide ? dp4a::xs_slot(2 * lane) : 0),
                             xs_lo + (kWide ? dp4a::xs_slot(2 * lane + 1) : 0)};  // wide: the same for the lo bytes
  // The stage after / before the one at byte offset b in the warp's ring.
  const auto next_stage = [](uint32_t b) {
    return b + kDownStageBytes == kDownStages * kDownStageBytes ? 0u : b + kDownStageBytes;
  };
  const auto prev_stage = [](uint32_t b) { return b == 0 ? (kDownStages - 1) * kDownStageBytes : b - kDownStageBytes; };
  if constexpr (kRows == 2) {
    // Two output rows a step, the warp's n-th and (n + 1)-th (row and row + warps) in stages n and n + 1 (mod
    // kDownStages). Each step first issues rows n + 2 and n + 3 into the stages of n − 2 and n − 1 (read the step
    // before), so that, as above, the ring is full while the step waits. Both rows' dot products share the
    // activation reads; their sums go through one transposed butterfly (warp_sum_halves: 5 shuffles for the two, bit
    // for bit warp_sum's), and lane 0 writes row, lane 16 row + warps, each with its own residual. Past the end (an
    // odd count of rows) the second row is neither issued, read, computed nor written; its sum 0 in the butterfly
    // that all lanes take part in.
    uint32_t rd = 0;  // byte offset of row n's stage
    for (int row = first; row < p.D; row += 2 * warps) {
      const bool two = row + warps < p.D;
      const uint32_t rd1 = next_stage(rd), wr = prev_stage(rd), wr0 = prev_stage(wr);
      issue_down(ch, row + (kDownStages - 2) * warps, p.D, lane, lane_addr + wr0);
      cp_async_commit();
      issue_down(ch, row + (kDownStages - 1) * warps, p.D, lane, lane_addr + wr);
      cp_async_commit();
      const int next_own = row + 2 * warps + own;
      const float hid_next = writer && next_own < p.D ? __ldcg(hidden + next_own) : 0.0f;
      cp_async_wait<kDownStages - 2>();
      __syncwarp();  // every lane's chunks of both rows have landed
      uint2 w[2][kSeg];
      uint32_t sb[2][kSeg];
      read_down_stage(my_ring + rd, lane, w[0], sb[0]);
      if (two) read_down_stage(my_ring + rd1, lane, w[1], sb[1]);
      __syncwarp();  // both stages are read: the next step refills them
      float acc[2] = {0.0f, 0.0f};
      if (two) {
        down_dots<2, 2, kWide>(w, sb, x_lane, lo_lane, sig, sx, acc);
      } else {
        down_dots<1, 2, kWide>(w, sb, x_lane, lo_lane, sig, sx, acc);
      }
      const float sum = warp_sum_halves(acc[0], acc[1], lane);  // lanes 0..15: row's, 16..31: row + warps's
      if (writer && row + own < p.D) hidden[row + own] = hid + sum;
      hid = hid_next;
      rd = next_stage(rd1);
    }
  } else {
    // Byte offsets in the warp's ring of the stage read (rd) and of the one refilled (wr, read one iteration before).
    uint32_t rd = 0, wr = (kDownStages - 1) * kDownStageBytes;
    for (int row = first; row < p.D; row += warps) {
      issue_down(ch, row + (kDownStages - 1) * warps, p.D, lane, lane_addr + wr);
      cp_async_commit();
      const float hid_next = lane == 0 && row + warps < p.D ? __ldcg(hidden + row + warps) : 0.0f;
      cp_async_wait<kDownStages - 1>();
      __syncwarp();  // every lane's chunks of this row have landed
      uint2 w[kSeg];
      uint32_t sb[kSeg];
      read_down_stage(my_ring + rd, lane, w, sb);
      __syncwarp();  // the stage is read: the next iteration may refill it
      float acc = 0.0f;
#pragma unroll
      for (int s = 0; s < kSeg; ++s) {
        const uint2 l0 = kWide ? lo_lane[0][s * 64] : make_uint2(0u, 0u);
        const uint2 l1 = kWide ? lo_lane[1][s * 64] : make_uint2(0u, 0u);
        const float dot = down_dot<kWide>(w[s], x_lane[0][s * 64], x_lane[1][s * 64], l0, l1);
        acc = fmaf(dp4a::scale_of(sb[s]) * sig[s], dot, acc);
        acc = fmaf(dp4a::bias_of(sb[s]), sx[s], acc);
      }
      acc = warp_sum(acc);
      if (lane == 0) hidden[row] = hid + acc;
      hid = hid_next;
      wr = rd;
      rd = next_stage(rd);
    }
  }
  cp_async_wait<0>();
  down_tables_tail(p, token, hidden);
}

// Blocks per token of a grid (blocks, B) whose blocks are all resident: the wave shared by the tokens, at most
// enough for `work` warps per token.
int ring_blocks(const void* kernel, int smem, int64_t work, int B) {
  const int wave = std::max(1, qtile::blocks_fit(kernel, smem)) * qtile::sm_count();
  return int(std::clamp<int64_t>(wave / B, 1, (work + kWarps - 1) / kWarps));
}

// Which gate_up form B >= 2 takes: the ring form (default) or the grouped one (moe_dp4a_grouped.cu);
// TERN_MOE_RING_GATE_UP=grouped, read once, for A/B measurements; tests set it with moe_ring_gate_up_set_mode.
int& gate_up_mode() {
  static int mode = env_is("TERN_MOE_RING_GATE_UP", "grouped") ? kMoeRingGateUpGrouped : kMoeRingGateUpRing;
  return mode;
}

// Rows a warp takes a step in the ring forms: 2 (default: gate_up's batches and down's output rows in pairs, their
// sums in one transposed butterfly) or 1; TERN_MOE_RING_ROWS=1, read once; tests set it with moe_ring_set_rows.
int& ring_rows() {
  static int rows = env_is("TERN_MOE_RING_ROWS", "1") ? 1 : 2;
  return rows;
}

// Whether the gate_up ring keeps x̂ in its last slots (the kernel's kXInRing; TERN_MOE_GATE_UP_X_IN_RING=0: not).
bool gate_up_x_in_ring() {
  static const bool on = !env_is("TERN_MOE_GATE_UP_X_IN_RING", "0");
  return on;
}

// Whether the gate_up ring copies its first shared-expert batches before pdl_wait (default;
// TERN_MOE_RING_SHARED_EARLY=0: after it, the form before). Measured alone within the noise (H200,
// docs/benchmarks.md, thirty-fifth session: ±1.3% at 1 to 16 streams); on in the defaults whose speculative figures
// were measured together.
bool gate_up_shared_early() {
  static const bool on = !env_is("TERN_MOE_RING_SHARED_EARLY", "0");
  return on;
}

// Whether the gate_up ring takes each token's routed experts in ascending id (default; TERN_MOE_GATE_UP_BY_ID=0:
// in routing order, the form before). The same values either way.
bool gate_up_by_expert_id() {
  static const bool on = !env_is("TERN_MOE_GATE_UP_BY_ID", "0");
  return on;
}

// False (nothing launched) when the ring does not fit the device's shared memory.
template <int S, int kRows, bool kXInRing, bool kWide>
bool launch_gate_up_ring(GateUpParams p, int B, cudaStream_t stream) {
  auto kernel = moe_gate_up_ring_kernel<S, kRows, kXInRing, kWide>;
  constexpr int smem = kWarps * gate_up_stages<S>() * gate_up_stage_bytes<S>();
  if (smem > qtile::max_dynamic_smem()) return false;
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // The largest shared-memory carveout, so that as many blocks fit as the shared memory allows (ring_blocks).
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   int(cudaSharedmemCarveoutMaxShared)));
    attribute_set = true;
  }
  p.shared_early = gate_up_shared_early();
  p.by_expert_id = gate_up_by_expert_id();
  const int blocks = ring_blocks(reinterpret_cast<const void*>(kernel), smem, int64_t(p.k + 1) * p.F, B);
  launch_pdl(kRows == 2 ? "moe_gate_up_ring_pairs" : "moe_gate_up_ring", kernel, dim3(unsigned(blocks), unsigned(B)),
             dim3(kThreads), size_t(smem), stream, p);
  return true;
}

template <int kRows, bool kWide>
void launch_down_ring(const DownParams& p, int B, cudaStream_t stream) {
  auto kernel = moe_down_ring_kernel<kRows, kWide>;
  constexpr int smem = kWarps * kDownStages * kDownStageBytes;
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attribute_set = true;
  }
  const int blocks = ring_blocks(reinterpret_cast<const void*>(kernel), smem, p.D, B);
  launch_pdl(kRows == 2 ? "moe_down_ring_pairs" : "moe_down_ring", kernel, dim3(unsigned(blocks), unsigned(B)),
             dim3(kThreads), size_t(smem), stream, p);
}

}  // namespace

bool ring_enabled() {
  static const bool on = !env_is("TERN_MOE_RING", "0");
  return on;
}

bool gate_up_ring(const GateUpParams& p, int cols, int B, cudaStream_t stream, const uint4* x_lanes) {
  if (B < 2 || !ring_enabled()) return false;
  if (gate_up_mode() == kMoeRingGateUpGrouped && gate_up_grouped(p, x_lanes, cols, B, stream)) return true;
  const auto by_rows = [&]<int S, bool kXInRing, bool kWide>() {
    return ring_rows() == 2 ? launch_gate_up_ring<S, 2, kXInRing, kWide>(p, B, stream)
                            : launch_gate_up_ring<S, 1, kXInRing, kWide>(p, B, stream);
  };
  const auto launch = [&]<int S>() {
    if (gate_up_x_in_ring())
      return p.wide ? by_rows.template operator()<S, true, true>() : by_rows.template operator()<S, true, false>();
    return p.wide ? by_rows.template operator()<S, false, true>() : by_rows.template operator()<S, false, false>();
  };
  switch (cols) {
    case 1024: return launch.template operator()<1>();
    case 2048: return launch.template operator()<2>();
    default: return launch.template operator()<4>();
  }
}

bool gate_up_wants_x_lanes(int cols, int E, int k, int B) {
  return ring_enabled() && gate_up_mode() == kMoeRingGateUpGrouped &&
         gate_up_grouped_takes(cols, E, k, B, moe_dp4a_wide());
}

bool down_ring(const DownParams& p, int B, cudaStream_t stream) {
  if (B < 2 || !ring_enabled()) return false;
  if (ring_rows() == 2) {
    p.wide ? launch_down_ring<2, true>(p, B, stream) : launch_down_ring<2, false>(p, B, stream);
  } else {
    p.wide ? launch_down_ring<1, true>(p, B, stream) : launch_down_ring<1, false>(p, B, stream);
  }
  return true;
}

}  // namespace tern::cuda::moe_parts

namespace tern::cuda {

void moe_ring_gate_up_set_mode(int mode) {
  TERN_CHECK(mode == kMoeRingGateUpRing || mode == kMoeRingGateUpGrouped,
             "moe_ring_gate_up_set_mode: unknown mode ", mode);
  moe_parts::gate_up_mode() = mode;
}
int moe_ring_gate_up_mode() { return moe_parts::gate_up_mode(); }
int64_t moe_gate_up_grouped_launches() { return moe_parts::gate_up_grouped_launches(); }

void moe_ring_set_rows(int rows) {
  TERN_CHECK(rows == 1 || rows == 2, "moe_ring_set_rows: rows must be 1 or 2, not ", rows);
  moe_parts::ring_rows() = rows;
}
int moe_ring_rows() { return moe_parts::ring_rows(); }

}  // namespace tern::cuda
