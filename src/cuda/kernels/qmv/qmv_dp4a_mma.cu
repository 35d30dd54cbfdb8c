// The batched integer product on the integer tensor cores: see qmv_dp4a_mma.cuh.
//
// What must match. qmv_dp4a (one token) gives each output row as follows: lanes 2m, 2m + 1 of a warp own positions
// 2m, 2m + 1 of every 1024-column slice j (half-groups 32·j + 2m, + 1: group G = 16·j + m, 64 columns); the leaf of
// group position m is
//   leaf_m = Σ_j in slice order [ fmaf(s·σ, dot, ·) then fmaf(b, σ·Σv, ·) ],
//   dot = fmaf(dh, 65536, fmaf(dm, 256, dl)),
// with dh, dm, dl the exact Σ q·hi, Σ q·mid, Σ q·lo over the group and Σv its Σ of the activations, and the warp adds
// the 16 leaves as a pairwise tree in group order (warp_sum_groups: (0+1), (2+3), ..., then pairs of pairs). Every
// value here is made the same way: the integers by mma.sync m16n8k32 (u8 weights × s8 activations, exact; the group's
// second half-group accumulates onto its first's), dot from the same integers with the same roundings, the leaves in
// slice order, the tree in group order.
//
// Work split. A block of 8 warps takes tiles of 16 weight rows × 8 tokens (blockIdx.y: tokens 8·y ..); warp w owns
// positions [4w, 4w + 4) of every slice (group positions 2w, 2w + 1), folds its 2 leaves as l0 + l1 per output, and the
// block adds the 8 warps' subtrees as ((P0 + P1) + (P2 + P3)) + ((P4 + P5) + (P6 + P7)): the tree of the 16 leaves.
// The tokens are quantised (as qmv_dp4a quantises its one token, the same 256 threads and order, so the RMSNorm's Σx²
// and rsqrt are the same too) into the MMA's B-fragment tables (Layout's xf, xl, sx, sig, rinv per tile of 8 tokens)
// either once per product, when the caller gives scratch (QmvArgs::xq): qmv_dp4a_prequant_kernel, one block per
// token slot of every token tile (grid ⌈B/8⌉·8; slots past B write zeros), writes each tile's tables to global memory
// in the shared-memory layout (it lets the product launch right after its own pdl_wait), and every block of the
// product copies its tile's tables in with cp.async right after its pdl_wait(), beside the weight stages in flight;
// or, without scratch (or TERN_QMV_PREQUANT=0), by every block for its own tile in its prologue (the same code, so
// the same bits); or, with QmvArgs::xq_written, by the kernel before the product from the values it has just made
// (producer tables, dp4a_tables.cuh: the same word quantiser), and no pre-quantising kernel runs.
// The row tiles stream through a cp.async pipeline of Layout::kStages stages (weights, scales, biases), the first
// ones issued before pdl_wait().
//
// Split form (the default where it runs, TERN_QMV_MMA_SPLIT=0 turns it off; 4096 columns, with scratch, sm_90
// binaries only):
// Layout<4> takes ~223 KB, one block an SM, each copying its tile's full tables (~102 KB) and waiting on them and on
// one weight tile. qmv_dp4a_mma_split_kernel gives each row tile to a cluster of 2 blocks: rank r copies only
// positions [16r, 16r + 16) of every slice (SplitLayout: half the tables, half the weight half-groups and scales,
// strided runs of 16-byte cp.async chunks; 96 KB, 2 stages: two blocks an SM), its warp w folds positions 16r + 2w,
// 16r + 2w + 1, one group (its leaf Q_w), the block ((Q0 + Q1) + (Q2 + Q3)) + ((Q4 + Q5) + (Q6 + Q7)) = the full
// kernel's (P0 + P1) + (P2 + P3) (rank 0) or (P4 + P5) + (P6 + P7) (rank 1), since P_v = l0 + l1 = Q_{2v} +
// Q_{2v+1}; after a cluster barrier rank 0 reads rank 1's 8 subtrees through distributed shared memory and adds
// left + right, the tree's top add: the same bits. The scratch's layout and the pre-quantising kernel are unchanged.
//
// Fragments (m16n8k32, thread g = lane/4, c = lane%4): A holds (row g, k 4c..4c+3), (row g+8, same), (row g,
// k 16+4c..), (row g+8, same); B (k 4c.., token g), (k 16+4c.., token g). Slots 4c.. of a half-group take the even
// columns of its word c, slots 16+4c.. the odd ones: for the weights w & 0x0F0F0F0F and (w >> 4) & 0x0F0F0F0F of the
// word that ldmatrix hands thread (g, c) (row g, bytes 4c..4c+3 of the 16-byte half-group), for the activations the
// {even, odd} int8x4 pairs of word 4·hg + c as dp4a_tile.cuh makes them. The accumulators start at 0x4B400000 (the
// bits of 1.5·2^23; over a group |Σ| ≤ 64·15·128 < 2^22), so each reads as the float 1.5·2^23 + Σ exactly.
#include "cuda/kernels/qmv/qmv_dp4a_mma.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/step_omit.h"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmv/dp4a_tables.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace cg = cooperative_groups;
namespace {

constexpr int kThreads = 256;  // 8 warps: the one-token kernel's block, so the RMSNorm's Σx² is summed alike
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 16;
constexpr int kTileTokens = dp4a::kTileTokens;
constexpr int kPositionsPerWarp = 32 / kWarps;  // 4
constexpr uint32_t kMagicBits = 0x4B400000u;  // 1.5·2^23
constexpr float kMagic = 12582912.0f;

struct MmaParams {
  const uint4* w;          // [rows][HG] half-groups of 16 bytes
  const uint16_t* scales;  // bf16 [rows][HG / 2]
  const uint16_t* biases;
  int rows = 0;
  const float* x;       // [B][ldx]
  const float* norm_w;  // [cols] or nullptr
  float eps = 1e-6f;
  float* y;  // [B][ldy]
  int64_t ldx = 0, ldy = 0;
  int B = 0;
  bool accumulate = false;
  L2Ranges ahead;
  // [⌈B/8⌉][Layout<S>::kTableBytes]: each token tile's tables, quantised once per product (null: per block)
  uint8_t* xq = nullptr;
  bool xq_written = false;  // the kernel before wrote them (QmvArgs::xq_written): no pre-quantising kernel
};

// A token tile's activation tables over HG half-groups, in bytes from their start (dp4a_tables.cuh): the layout the
// pre-quantising kernel and the producers write into the scratch (HG = 32·S, every position) and the blocks copy
// into shared memory as is (the split form: HG = 16·S, its block's positions).
template <int HG>
struct TileTables {
  static constexpr dp4a::TableOffsets kO = dp4a::table_offsets(HG);
  static constexpr int kXF = kO.xf;      // uint4 [HG][8 tokens][4]: hi, mid pairs
  static constexpr int kXL = kO.xl;      // uint2 [HG][8][4]: lo pairs
  static constexpr int kSX = kO.sx;      // float [HG / 2][8]: σ·Σv of the group
  static constexpr int kSig = kO.sig;    // float [HG / 2][8]: σ of the group
  static constexpr int kRinv = kO.rinv;  // float [8]: the norm's rsqrt per token (or 1)
  static constexpr int kTableBytes = kO.bytes;
};

// Shared memory of a block for S slices (HG = 32·S half-groups of a row), in bytes from the start.
template <int S>
struct Layout : TileTables<32 * S> {
  // Pipeline stages: 2 up to 2048 columns (96 KB a block: two blocks an SM on Hopper), 3 for 4096 (one block).
  static constexpr int kStages = S <= 2 ? 2 : 3;
  static constexpr int kHG = 32 * S;
  static constexpr int kSbStride = kHG + 16;  // bytes per row of a stage's scales (bf16 [HG / 2], padded)
  // Bytes [0, kTableBytes) are a token tile's tables (TileTables): what qmv_dp4a_prequant_kernel writes per tile,
  // byte for byte.
  static constexpr int kTableBytes = TileTables<32 * S>::kTableBytes;
  static constexpr int kRed = kTableBytes;                           // float [8 tokens][8 warps]: Σx² per warp
  static constexpr int kPart = kRed + kTileTokens * kWarps * 4;      // float [2][8 warps][16 rows · 8 tokens]
  static constexpr int kStage0 = kPart + 2 * kWarps * kTileRows * kTileTokens * 4;
  static constexpr int kStageW = kTileRows * kHG * 16;               // weights [16][HG] of 16 bytes, swizzled
  static constexpr int kStageBytes = kStageW + 2 * kTileRows * kSbStride;  // + scales, biases [16][stride]
  static constexpr int kBytes = kStage0 + kStages * kStageBytes;
  static_assert(kStage0 % 16 == 0 && kStageBytes % 16 == 0, "16-byte aligned stages");
  static_assert(kTableBytes % 16 == 0, "16-byte chunks of tables (cp.async), 16-byte aligned tiles of them");
};

// The split form's shared memory (qmv_dp4a_mma_split_kernel): Layout's pieces for the block's 16 positions of every
// slice only. Local half-group lh = 16·j + q (q in [0, 16)) is the row's half-group 32·j + 16·rank + q, local group
// lh / 2 = 8·j + q / 2 its group 16·j + 8·rank + q / 2. No Σx² rows (the tables come from the pre-quantising kernel);
// 2 stages, 96 KB a block for 4096 columns: two blocks an SM.
template <int S>
struct SplitLayout : TileTables<16 * S> {
  static constexpr int kStages = 2;
  static constexpr int kHG = 16 * S;                                 // local half-groups of a row
  static constexpr int kSbStride = kHG + 16;                         // bytes per row of a stage's scales (bf16 [HG/2])
  static constexpr int kTableBytes = TileTables<16 * S>::kTableBytes;
  static constexpr int kPart = kTableBytes;                          // float [2][8 warps][16 rows · 8 tokens]
  static constexpr int kStage0 = kPart + 2 * kWarps * kTileRows * kTileTokens * 4;
  static constexpr int kStageW = kTileRows * kHG * 16;               // weights [16][HG] of 16 bytes, swizzled
  static constexpr int kStageBytes = kStageW + 2 * kTileRows * kSbStride;  // + scales, biases [16][stride]
  static constexpr int kBytes = kStage0 + kStages * kStageBytes;
  static_assert(kStage0 % 16 == 0 && kStageBytes % 16 == 0 && kTableBytes % 16 == 0, "16-byte aligned pieces");
};

// Issues the cp.async copies of row tile `tile` into stage `slot` (rows past the end read nothing: zeros).
template <int S>
__device__ __forceinline__ void issue_tile(const MmaParams& p, uint8_t* smem, int tile, int slot) {
  using L = Layout<S>;
  uint8_t* st = smem + L::kStage0 + slot * L::kStageBytes;
  const int row0 = tile * kTileRows;
  constexpr int kWChunks = kTileRows * L::kHG;
#pragma unroll
  for (int i = int(threadIdx.x); i < kWChunks; i += kThreads) {
    const int r = i / L::kHG, h = i % L::kHG, row = row0 + r;
    const bool in = row < p.rows;
    const uint4* src = p.w + int64_t(in ? row : 0) * L::kHG + h;
    cp_async_16(smem_addr(st + (r * L::kHG + (h ^ (r & 7))) * 16), src, in ? 16u : 0u);
  }
  constexpr int kSbChunks = L::kHG / 16;  // 16-byte chunks of one row's scales (HG / 2 bf16)
  for (int i = int(threadIdx.x); i < 2 * kTileRows * kSbChunks; i += kThreads) {
    const int which = i / (kTileRows * kSbChunks), r = (i / kSbChunks) % kTileRows, ch = i % kSbChunks;
    const int row = row0 + r;
    const bool in = row < p.rows;
    const uint16_t* base = which ? p.biases : p.scales;
    const uint16_t* src = base + int64_t(in ? row : 0) * (L::kHG / 2) + ch * 8;
    uint8_t* dst = st + L::kStageW + which * kTileRows * L::kSbStride + r * L::kSbStride + ch * 16;
    cp_async_16(smem_addr(dst), src, in ? 16u : 0u);
  }
}

// Tokens a block quantises per group of loads in its prologue (the path without scratch): 64 registers of x in flight.
template <int S>
constexpr int kPrologueGroup = dp4a::quantize_passes(Layout<S>::kHG * 4, kThreads) == 1 ? kTileTokens : kTileTokens / 2;

// Quantises tokens [first, end) of the tile at t0 (nt of its 8 tokens present) into the B-fragment tables at `tables`
// (shared or global memory, Layout<S>'s offsets), each word as qmv_dp4a's quantize_block does it (thread t takes words
// t, t + 256, ...; Σx² per thread in that order, then per warp into red [8 tokens][8 warps]), tokens past nt as
// zeros. The loads of kGroup tokens are issued together (one L2 round trip per group, not per token). A token's
// tables do not depend on the range or the group: every block that quantises it writes the same bits.
template <int S, int kGroup>
__device__ __forceinline__ void quantize_tokens(const MmaParams& p, uint8_t* tables, float* red, int t0, int first,
                                                int end, int nt) {
  using L = Layout<S>;
  constexpr int kWords = L::kHG * 4;
  constexpr int kPasses = dp4a::quantize_passes(kWords, kThreads);
  uint4* xf = reinterpret_cast<uint4*>(tables + L::kXF);
  uint2* xl = reinterpret_cast<uint2*>(tables + L::kXL);
  float* sx = reinterpret_cast<float*>(tables + L::kSX);
  float* sig = reinterpret_cast<float*>(tables + L::kSig);
  constexpr dp4a::TableOffsets o = L::kO;
  const int lane = int(threadIdx.x) & 31;
  float4 n0[kPasses], n1[kPasses];  // the norm's weights, the same for every token
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int word = int(threadIdx.x) + pass * kThreads;
    n0[pass] = n1[pass] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (p.norm_w && word < kWords) {
      n0[pass] = reinterpret_cast<const float4*>(p.norm_w)[2 * word];
      n1[pass] = reinterpret_cast<const float4*>(p.norm_w)[2 * word + 1];
    }
  }
  // Tokens past nt (a tile that is not full): zeros, so that their MMA columns add nothing (their outputs are never
  // written); not quantised.
  const int zero0 = max(first, nt), zeros = end - zero0, live_end = min(end, nt);
  for (int i = int(threadIdx.x); i < L::kHG * zeros * 4; i += kThreads) {
    const int hg = i / (zeros * 4), t = zero0 + (i / 4) % zeros, c = i % 4;
    xf[(hg * kTileTokens + t) * 4 + c] = make_uint4(0u, 0u, 0u, 0u);
    xl[(hg * kTileTokens + t) * 4 + c] = make_uint2(0u, 0u);
    if (c == 0 && (hg & 1) == 0) sx[(hg / 2) * kTileTokens + t] = sig[(hg / 2) * kTileTokens + t] = 0.0f;
  }
#pragma unroll 1
  for (int tg = first; tg < live_end; tg += kGroup) {
    float4 a[kGroup][kPasses], b[kGroup][kPasses];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const bool live = tg + u < live_end;  // uniform over the block
      const float* x = p.x + int64_t(t0 + tg + u) * p.ldx;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int word = int(threadIdx.x) + pass * kThreads;
        a[u][pass] = b[u][pass] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (live && word < kWords) {
          a[u][pass] = reinterpret_cast<const float4*>(x)[2 * word];
          b[u][pass] = reinterpret_cast<const float4*>(x)[2 * word + 1];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int t = tg + u;
      if (t >= live_end) break;  // uniform over the block
      float ss = 0.0f;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int word = int(threadIdx.x) + pass * kThreads;
        if (pass * kThreads >= kWords) break;  // uniform: whole warps stay together
        const bool has = word < kWords;
        float v[8] = {a[u][pass].x, a[u][pass].y, a[u][pass].z, a[u][pass].w,
                      b[u][pass].x, b[u][pass].y, b[u][pass].z, b[u][pass].w};
        if (has && p.norm_w) {
          const float n[8] = {n0[pass].x, n0[pass].y, n0[pass].z, n0[pass].w,
                              n1[pass].x, n1[pass].y, n1[pass].z, n1[pass].w};
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            ss += v[e] * v[e];
            v[e] *= n[e];
          }
        }
        dp4a::table_word(tables, o, word, t, v, has);
      }
      if (p.norm_w) {
        ss = warp_sum(ss);
        if (lane == 0) red[t * kWarps + (threadIdx.x >> 5)] = ss;
      }
    }
  }
}

// The factor of a token's outputs: rms_factor of qmv_dp4a.cu (its 8 warps' Σx² in order) with the norm, else 1.
template <int S>
__device__ __forceinline__ float token_rinv(const MmaParams& p, const float* red_of_token) {
  static_assert(kWarps == 8, "dp4a::table_rinv sums 8 warps' parts");
  return p.norm_w ? dp4a::table_rinv(red_of_token, Layout<S>::kHG * 32, p.eps) : 1.0f;
}

// The tables of every token tile, once per product: block b takes token slot b % 8 of tile b / 8 (a slot past B
// writes its zeros) and writes bytes of p.xq + (b / 8)·kTableBytes, in the layout the product's blocks copy into
// shared memory as is.
template <int S>
__global__ void __launch_bounds__(kThreads) qmv_dp4a_prequant_kernel(const MmaParams p) {
  using L = Layout<S>;
  __shared__ float red[kTileTokens * kWarps];  // row u only
  const int tile = int(blockIdx.x) / kTileTokens, u = int(blockIdx.x) % kTileTokens;
  const int t0 = tile * kTileTokens, nt = min(kTileTokens, p.B - t0);
  uint8_t* tables = p.xq + int64_t(tile) * L::kTableBytes;
  pdl_wait();  // x is an earlier kernel's output, and the previous product may still read the scratch
  // The product may start now: its blocks issue their first weight stages while this grid quantises, and wait in
  // their pdl_wait for it to complete (its writes included) before they copy the tables.
  pdl_trigger();
  quantize_tokens<S, 1>(p, tables, red, t0, u, u + 1, nt);
  if (u < nt) {  // uniform over the block
    __syncthreads();  // red is written
    if (threadIdx.x == 0) reinterpret_cast<float*>(tables + L::kRinv)[u] = token_rinv<S>(p, red + u * kWarps);
  } else if (threadIdx.x == 0) {
    reinterpret_cast<float*>(tables + L::kRinv)[u] = 0.0f;  // never read: its outputs are not written
  }
}

// d = magic + a · b (u8 × s8 -> s32), m16n8k32.
__device__ __forceinline__ void mma_from_magic(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kMagicBits));
}

// d += a · b (u8 × s8 -> s32), m16n8k32.
__device__ __forceinline__ void mma_onto(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float unmagic(int d) { return __int_as_float(d) - kMagic; }

// A fragment of the weights' word pair (rows g, g + 8; word c of a half-group): even nibbles, then odd.
__device__ __forceinline__ void weight_fragment(uint32_t w0, uint32_t w1, uint32_t (&a)[4]) {
  a[0] = w0 & 0x0F0F0F0Fu;
  a[1] = w1 & 0x0F0F0F0Fu;
  a[2] = (w0 >> 4) & 0x0F0F0F0Fu;
  a[3] = (w1 >> 4) & 0x0F0F0F0Fu;
}

// The warp's part of one row tile: its kPPW positions' kPPW / 2 group leaves, folded l0 + l1 (kPPW = 4: the full
// kernel) or l0 alone (kPPW = 2: the split kernel), for the 4 outputs of this thread: (row g, token 2c), (row g, token
// 2c + 1), (row g + 8, token 2c), (row g + 8, token 2c + 1). The block's tables and stages hold kSpan positions of
// every slice (32: all; 16: the split kernel's half), so local half-group kSpan·j + pos is slice j's position pos and
// local group (kSpan·j + pos) / 2 its group.
template <int S, class L = Layout<S>, int kPPW = kPositionsPerWarp, int kSpan = 32>
__device__ __forceinline__ void warp_tile(const uint8_t* smem, const uint8_t* st, int warp, int lane, float (&sub)[4]) {
  static_assert(kPPW * kWarps == kSpan && (kPPW == 4 || kPPW == 2), "the warps cover the block's positions");
  constexpr int kGroups = kPPW / 2;  // of the warp, per slice
  const uint4* xf = reinterpret_cast<const uint4*>(smem + L::kXF);
  const uint2* xl = reinterpret_cast<const uint2*>(smem + L::kXL);
  const float* sx = reinterpret_cast<const float*>(smem + L::kSX);
  const float* sig = reinterpret_cast<const float*>(smem + L::kSig);
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + L::kStageW);
  const uint16_t* bi = reinterpret_cast<const uint16_t*>(st + L::kStageW + kTileRows * L::kSbStride);
  const int g = lane >> 2, c = lane & 3;
  // ldmatrix: lane L gives row (L & 7) + 8·((L >> 3) & 1) of the group's first half-group X (L < 16) or its second
  // Y (L >= 16)
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1);
  const uint32_t wbase = smem_addr(st) + uint32_t(mrow * L::kHG * 16);
  float leaf[kGroups][4];
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    const int pos = warp * kPPW + 2 * gi;  // the group's first position
#pragma unroll
    for (int i = 0; i < 4; ++i) leaf[gi][i] = 0.0f;
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int hx = kSpan * j + pos, hy = hx + 1, grp = hx >> 1;
      uint32_t wr[4];
      ldmatrix_x4(wr, wbase + uint32_t(((lane < 16 ? hx : hy) ^ (mrow & 7)) * 16));
      uint32_t ax[4], ay[4];
      weight_fragment(wr[0], wr[1], ax);
      weight_fragment(wr[2], wr[3], ay);
      const uint4 xbx = xf[(hx * kTileTokens + g) * 4 + c], xby = xf[(hy * kTileTokens + g) * 4 + c];
      const uint2 xlx = xl[(hx * kTileTokens + g) * 4 + c], xly = xl[(hy * kTileTokens + g) * 4 + c];
      int dh[4], dm[4], dl[4];  // the group's sums: X's, then Y's added in the accumulators (exact: |Σ| < 2^22)
      mma_from_magic(dh, ax, xbx.x, xbx.y);
      mma_from_magic(dm, ax, xbx.z, xbx.w);
      mma_from_magic(dl, ax, xlx.x, xlx.y);
      mma_onto(dh, ay, xby.x, xby.y);
      mma_onto(dm, ay, xby.z, xby.w);
      mma_onto(dl, ay, xly.x, xly.y);
      const float2 sg = *reinterpret_cast<const float2*>(sig + grp * kTileTokens + 2 * c);
      const float2 sv = *reinterpret_cast<const float2*>(sx + grp * kTileTokens + 2 * c);
      const float s_row[2] = {__uint_as_float(uint32_t(sc[g * (L::kSbStride / 2) + grp]) << 16),
                              __uint_as_float(uint32_t(sc[(g + 8) * (L::kSbStride / 2) + grp]) << 16)};
      const float b_row[2] = {__uint_as_float(uint32_t(bi[g * (L::kSbStride / 2) + grp]) << 16),
                              __uint_as_float(uint32_t(bi[(g + 8) * (L::kSbStride / 2) + grp]) << 16)};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float s = s_row[i >> 1], b = b_row[i >> 1];
        const float sigma = (i & 1) ? sg.y : sg.x, sxv = (i & 1) ? sv.y : sv.x;
        const float dot = fmaf(unmagic(dh[i]), 65536.0f, fmaf(unmagic(dm[i]), 256.0f, unmagic(dl[i])));
        leaf[gi][i] = fmaf(s * sigma, dot, leaf[gi][i]);
        leaf[gi][i] = fmaf(b, sxv, leaf[gi][i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kGroups == 2) {
      sub[i] = leaf[0][i] + leaf[1][i];
    } else {
      sub[i] = leaf[0][i];
    }
  }
}

// A block's 8 warp subtrees W_w of one output (pt: warp 0's, warp w's at pt + w·stride) added as the tree's upper
// levels, ((W0 + W1) + (W2 + W3)) + ((W4 + W5) + (W6 + W7)).
__device__ __forceinline__ float warps_subtree_sum(const float* pt, int stride) {
  return ((pt[0] + pt[stride]) + (pt[2 * stride] + pt[3 * stride])) +
         ((pt[4 * stride] + pt[5 * stride]) + (pt[6 * stride] + pt[7 * stride]));
}

template <int S>
__global__ void __launch_bounds__(kThreads) qmv_dp4a_mma_kernel(const MmaParams p) {
  using L = Layout<S>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int tiles = (p.rows + kTileRows - 1) / kTileRows;
  const int t0 = int(blockIdx.y) * kTileTokens, nt = min(kTileTokens, p.B - t0);
  const int first = int(blockIdx.x), step = int(gridDim.x);

  // The first stages' weights are launch constants: copied before the wait. With scratch, the stages' copies are
  // committed after the tables' (below), so that they all share group 0.
#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) {
    const int tile = first + s * step;
    if (tile < tiles) issue_tile<S>(p, smem, tile, s);
    if (!p.xq) cp_async_commit();
  }
  if (p.ahead.pieces) {
    const int64_t block = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    l2_prefetch_share(p.ahead, block * kThreads + threadIdx.x, int64_t(gridDim.x) * gridDim.y * kThreads);
  }
  pdl_wait();
  float* rinv = reinterpret_cast<float*>(smem + L::kRinv);
  if (p.xq) {
    // The tile's tables (qmv_dp4a_prequant_kernel's output, complete at pdl_wait) into bytes [0, kTableBytes):
    // in group 0 with the first stages' weights, landed at the first iteration's wait. The groups after it are
    // empty: tile `it` stays in group `it` (or 0) at the loop's waits.
    const uint8_t* src = p.xq + int64_t(blockIdx.y) * L::kTableBytes;
    for (int i = int(threadIdx.x); i < L::kTableBytes / 16; i += kThreads)
      cp_async_16(smem_addr(smem + i * 16), src + i * 16, 16u);
#pragma unroll
    for (int s = 0; s < L::kStages - 1; ++s) cp_async_commit();
    // Nothing of an earlier kernel is read after this point but the scratch, whose next writer (the next product's
    // pre-quantising kernel) waits in its pdl_wait for this grid to complete.
    pdl_trigger();
  } else {
    float* red = reinterpret_cast<float*>(smem + L::kRed);
    quantize_tokens<S, kPrologueGroup<S>>(p, smem, red, t0, 0, kTileTokens, nt);
    __syncthreads();
    pdl_trigger();  // x is read
    if (int(threadIdx.x) < kTileTokens) rinv[threadIdx.x] = token_rinv<S>(p, red + threadIdx.x * kWarps);
  }
  // (the barrier at the top of the first iteration orders the tables and rinv before their reads)

  float* part = reinterpret_cast<float*>(smem + L::kPart);
  const int g = lane >> 2, c = lane & 3;
  for (int it = 0;; ++it) {
    const int tile = first + it * step;
    if (tile >= tiles) break;
    const int ahead = first + (it + L::kStages - 1) * step;
    if (ahead < tiles) issue_tile<S>(p, smem, ahead, (it + L::kStages - 1) % L::kStages);
    cp_async_commit();
    cp_async_wait<L::kStages - 1>();
    __syncthreads();  // every thread's copies of this tile have landed

    // The reducing threads' old outputs (accumulate): loaded now, used after the tile, off the critical path.
    const int r_out = int(threadIdx.x) / kTileTokens, t_out = int(threadIdx.x) % kTileTokens;
    const int row_out = tile * kTileRows + r_out;
    const bool writes = int(threadIdx.x) < kTileRows * kTileTokens && row_out < p.rows && t_out < nt;
    float* y_out = p.y + int64_t(t0 + t_out) * p.ldy + row_out;
    const float y_old = writes && p.accumulate ? *y_out : 0.0f;

    float sub[4];
    warp_tile<S>(smem, smem + L::kStage0 + (it % L::kStages) * L::kStageBytes, warp, lane, sub);
    float* pw = part + ((it & 1) * kWarps + warp) * (kTileRows * kTileTokens);
    *reinterpret_cast<float2*>(pw + g * kTileTokens + 2 * c) = make_float2(sub[0], sub[1]);
    *reinterpret_cast<float2*>(pw + (g + 8) * kTileTokens + 2 * c) = make_float2(sub[2], sub[3]);
    __syncthreads();  // the subtrees are written; this stage may be refilled

    if (writes) {
      const float* pt = part + (it & 1) * kWarps * (kTileRows * kTileTokens) + threadIdx.x;
      constexpr int kW = kTileRows * kTileTokens;
      const float sum = warps_subtree_sum(pt, kW);
      const float v = sum * rinv[t_out];
      *y_out = p.accumulate ? y_old + v : v;
    }
  }
  cp_async_wait<0>();  // nothing left in flight at exit
}

// The split form's copies of row tile `tile` into stage `slot`: the block's 16 positions of every slice (rank 0:
// half-groups 32·j + 0..15, rank 1: 32·j + 16..31) of the 16 rows, 16-byte chunks: per row S runs of 16 half-groups
// (256 bytes each) and S 16-byte runs of scales and of biases (8 bf16: the 8 groups of the 16 half-groups).
template <int S>
__device__ __forceinline__ void issue_split_tile(const MmaParams& p, uint8_t* smem, int tile, int slot, int rank) {
  using L = SplitLayout<S>;
  constexpr int kRowHG = 32 * S;  // half-groups of a row in global memory
  uint8_t* st = smem + L::kStage0 + slot * L::kStageBytes;
  const int row0 = tile * kTileRows;
  constexpr int kWChunks = kTileRows * L::kHG;  // [16 rows][16·S local half-groups]
#pragma unroll
  for (int i = int(threadIdx.x); i < kWChunks; i += kThreads) {
    const int r = i / L::kHG, lh = i % L::kHG, row = row0 + r;
    const int h = 32 * (lh / 16) + 16 * rank + lh % 16;
    const bool in = row < p.rows;
    const uint4* src = p.w + int64_t(in ? row : 0) * kRowHG + h;
    cp_async_16(smem_addr(st + (r * L::kHG + (lh ^ (r & 7))) * 16), src, in ? 16u : 0u);
  }
  // [scales, biases][16 rows][S chunks]: chunk j of a row is groups 16·j + 8·rank .. + 8
  for (int i = int(threadIdx.x); i < 2 * kTileRows * S; i += kThreads) {
    const int which = i / (kTileRows * S), r = (i / S) % kTileRows, j = i % S;
    const int row = row0 + r;
    const bool in = row < p.rows;
    const uint16_t* base = which ? p.biases : p.scales;
    const uint16_t* src = base + int64_t(in ? row : 0) * (kRowHG / 2) + 16 * j + 8 * rank;
    uint8_t* dst = st + L::kStageW + which * kTileRows * L::kSbStride + r * L::kSbStride + j * 16;
    cp_async_16(smem_addr(dst), src, in ? 16u : 0u);
  }
}

// Copies S runs of `run` bytes from a table of the full layout (per slice 2·run bytes, the rank's run at rank·run)
// into `run`-byte runs at dst, back to back, in 16-byte cp.async chunks.
template <int S, int kRun>
__device__ __forceinline__ void copy_split_runs(uint8_t* dst, const uint8_t* src, int rank) {
  static_assert(kRun % 16 == 0, "whole 16-byte chunks");
  constexpr int kChunks = kRun / 16;
  for (int i = int(threadIdx.x); i < S * kChunks; i += kThreads) {
    const int j = i / kChunks, k = i % kChunks;
    cp_async_16(smem_addr(dst + i * 16), src + (2 * j + rank) * kRun + k * 16, 16u);
  }
}

// The split form (default; TERN_QMV_MMA_SPLIT=0 for the full kernel; S = 4 on sm_90): a cluster of 2 blocks per
// row-tile walk (blockIdx.x = 2·cluster + rank; cluster c takes row tiles c, c + gridDim.x / 2, ...). Rank r copies and
// folds positions [16r, 16r + 16) of every slice only: warp w positions 16r + 2w, 16r + 2w + 1, one group, its leaf
// Q_w, and the block's 8 subtrees ((Q0 + Q1) + (Q2 + Q3)) + ((Q4 + Q5) + (Q6 + Q7)). With the full kernel's warp v
// (positions 4v..4v + 3, two groups, P_v = l0 + l1) that is P_v = Q_{2v} + Q_{2v+1}, so rank 0's sum is (P0 + P1) +
// (P2 + P3) and rank 1's (P4 + P5) + (P6 + P7), each rounding for rounding. Rank 0 reads rank 1's partial subtrees
// through distributed shared memory after the cluster barrier and adds the two halves, left + right: the tree's top
// add, in the same operand order. Then times rinv and the accumulate as today: every output bit for bit the full
// kernel's. The tables come from the pre-quantising kernel's scratch only (p.xq set).
template <int S>
__global__ void __launch_bounds__(kThreads, 2) qmv_dp4a_mma_split_kernel(const MmaParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
  __trap();  // never launched: the host takes this form only for sm_90 binaries
#else
  using L = SplitLayout<S>;
  using F = Layout<S>;  // the scratch's layout (the full tables)
  extern __shared__ __align__(16) uint8_t smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int tiles = (p.rows + kTileRows - 1) / kTileRows;
  const int t0 = int(blockIdx.y) * kTileTokens, nt = min(kTileTokens, p.B - t0);
  const int first = int(blockIdx.x) / 2, step = int(gridDim.x) / 2;

  // The first stages' weights (launch constants) before the wait, committed with the tables below (group 0).
#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) {
    const int tile = first + s * step;
    if (tile < tiles) issue_split_tile<S>(p, smem, tile, s, rank);
  }
  if (p.ahead.pieces) {
    const int64_t block = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    l2_prefetch_share(p.ahead, block * kThreads + threadIdx.x, int64_t(gridDim.x) * gridDim.y * kThreads);
  }
  pdl_wait();
  // The rank's part of the tile's tables (complete at pdl_wait): per slice j, xf's 16 half-groups (8 KB), xl's
  // (4 KB), sx's and sig's 8 groups (256 B each), then rinv (32 B): strided runs of 16-byte chunks, 51 KB in all for
  // 4096 columns (the full kernel's copy: 102 KB).
  {
    const uint8_t* src = p.xq + int64_t(blockIdx.y) * F::kTableBytes;
    copy_split_runs<S, 16 * kTileTokens * 4 * 16>(smem + L::kXF, src + F::kXF, rank);
    copy_split_runs<S, 16 * kTileTokens * 4 * 8>(smem + L::kXL, src + F::kXL, rank);
    copy_split_runs<S, 8 * kTileTokens * 4>(smem + L::kSX, src + F::kSX, rank);
    copy_split_runs<S, 8 * kTileTokens * 4>(smem + L::kSig, src + F::kSig, rank);
    if (int(threadIdx.x) < kTileTokens * 4 / 16)
      cp_async_16(smem_addr(smem + L::kRinv + threadIdx.x * 16), src + F::kRinv + threadIdx.x * 16, 16u);
  }
#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) cp_async_commit();
  pdl_trigger();  // as the full kernel's: nothing of an earlier kernel is read after this but the scratch
  const float* rinv = reinterpret_cast<const float*>(smem + L::kRinv);

  float* part = reinterpret_cast<float*>(smem + L::kPart);
  const int g = lane >> 2, c = lane & 3;
  for (int it = 0;; ++it) {
    const int tile = first + it * step;
    if (tile >= tiles) break;  // uniform over the cluster: both ranks walk the same tiles
    const int ahead = first + (it + L::kStages - 1) * step;
    if (ahead < tiles) issue_split_tile<S>(p, smem, ahead, (it + L::kStages - 1) % L::kStages, rank);
    cp_async_commit();
    cp_async_wait<L::kStages - 1>();
    __syncthreads();  // every thread's copies of this tile have landed

    const int r_out = int(threadIdx.x) / kTileTokens, t_out = int(threadIdx.x) % kTileTokens;
    const int row_out = tile * kTileRows + r_out;
    const bool writes = rank == 0 && int(threadIdx.x) < kTileRows * kTileTokens && row_out < p.rows && t_out < nt;
    float* y_out = p.y + int64_t(t0 + t_out) * p.ldy + row_out;
    const float y_old = writes && p.accumulate ? *y_out : 0.0f;

    float sub[4];
    warp_tile<S, L, 2, 16>(smem, smem + L::kStage0 + (it % L::kStages) * L::kStageBytes, warp, lane, sub);
    float* pw = part + ((it & 1) * kWarps + warp) * (kTileRows * kTileTokens);
    *reinterpret_cast<float2*>(pw + g * kTileTokens + 2 * c) = make_float2(sub[0], sub[1]);
    *reinterpret_cast<float2*>(pw + (g + 8) * kTileTokens + 2 * c) = make_float2(sub[2], sub[3]);
    // Both blocks' subtrees are written (release / acquire over the cluster) and this stage may be refilled. The
    // parts are double-buffered: rank 1 rewrites this parity's only at it + 2, past the next barrier, which rank 0
    // reaches after its reads here.
    cluster.sync();

    if (writes) {
      constexpr int kW = kTileRows * kTileTokens;
      float* pt = part + (it & 1) * kWarps * kW + threadIdx.x;
      const float* pr = cluster.map_shared_rank(pt, 1);  // rank 1's, the same offset
      const float left = warps_subtree_sum(pt, kW), right = warps_subtree_sum(pr, kW);
      const float sum = left + right;
      const float v = sum * rinv[t_out];
      *y_out = p.accumulate ? y_old + v : v;
    }
  }
  cp_async_wait<0>();  // nothing left in flight at exit
  cluster.sync();      // rank 1's parts stay until rank 0 has read them
#endif
}

// Host launches of the split form (for tests: it ran where expected).
uint64_t& split_launch_count() {
  static uint64_t n = 0;
  return n;
}

// The split kernel's resident 2-block clusters on this device (cudaOccupancyMaxActiveClusters: the GPCs' SMs in
// pairs), its shared-memory attributes set first; 0 where an sm_90 binary does not run or no cluster fits (a MIG or
// MPS share, another carveout): the form is then not taken. Once, at the first product that would take it (the
// runner's first batched step is eager, outside any capture).
int split_wave() {
  static const int wave = [] {
    auto kernel = qmv_dp4a_mma_split_kernel<4>;
    constexpr int smem = SplitLayout<4>::kBytes;
    if (!sm90_features() || smem > qtile::max_dynamic_smem()) return 0;
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   int(cudaSharedmemCarveoutMaxShared)));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(2u * unsigned(qtile::sm_count()));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = size_t(smem);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return std::max(n, 0);
  }();
  return wave;
}

// 4096 columns with scratch on sm_90 (unless TERN_QMV_MMA_SPLIT=0): clusters of 2 blocks
// (qmv_dp4a_mma_split_kernel), one wave of them.
void launch_split(const MmaParams& p, int token_tiles, cudaStream_t stream) {
  const int tiles = (p.rows + kTileRows - 1) / kTileRows;
  const int clusters = std::clamp(split_wave() / token_tiles, 1, tiles);
  launch_cluster_pdl("qmv_dp4a_mma (split)", qmv_dp4a_mma_split_kernel<4>,
                     dim3(unsigned(2 * clusters), unsigned(token_tiles)), dim3(kThreads), 2,
                     size_t(SplitLayout<4>::kBytes), stream, p);
  ++split_launch_count();
}

// Whether this product takes the split form: the switch, 4096 columns, scratch, and a device where its clusters fit.
bool split_applies(const MmaParams& p, int S) {
  return S == 4 && p.xq && qmv_dp4a_mma_split() && split_wave() > 0;
}

template <int S>
void launch(const MmaParams& p, cudaStream_t stream) {
  const int token_tiles = (p.B + kTileTokens - 1) / kTileTokens;
  if (p.xq && !p.xq_written && !step_omits(StepPart::prequant))
    launch_pdl("qmv_dp4a_prequant", qmv_dp4a_prequant_kernel<S>, dim3(unsigned(token_tiles * kTileTokens)),
               dim3(kThreads), 0, stream, p);
  if (split_applies(p, S)) return launch_split(p, token_tiles, stream);
  auto kernel = qmv_dp4a_mma_kernel<S>;
  constexpr int smem = Layout<S>::kBytes;
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attribute_set = true;
  }
  const int tiles = (p.rows + kTileRows - 1) / kTileRows;
  const int wave = std::max(1, qtile::blocks_fit(reinterpret_cast<const void*>(kernel), smem)) * qtile::sm_count();
  const int blocks = std::clamp(wave / token_tiles, 1, tiles);
  launch_pdl("qmv_dp4a_mma", kernel, dim3(unsigned(blocks), unsigned(token_tiles)), dim3(kThreads), size_t(smem),
             stream, p);
}

template <int S>
constexpr int smem_of() { return Layout<S>::kBytes; }

int smem_for_cols(int64_t cols) {
  return cols == 1024 ? smem_of<1>() : cols == 2048 ? smem_of<2>() : smem_of<4>();
}

}  // namespace

size_t qmv_dp4a_mma_scratch_bytes(int B, int64_t cols) {
  const int per_tile = cols == 1024   ? Layout<1>::kTableBytes
                       : cols == 2048 ? Layout<2>::kTableBytes
                       : cols == 4096 ? Layout<4>::kTableBytes
                                      : 0;
  return size_t((std::max(B, 0) + kTileTokens - 1) / kTileTokens) * size_t(per_tile);
}

void qmv_dp4a_mma_quantize(const float* x, int64_t ldx, int64_t cols, const float* norm_w, float eps, int B, void* xq,
                           size_t xq_bytes, cudaStream_t stream) {
  TERN_CHECK(B >= 1 && B <= kBatchMaxTokens && (cols == 1024 || cols == 2048 || cols == 4096) && x && ldx % 4 == 0 &&
                 (reinterpret_cast<uintptr_t>(x) & 15) == 0,
             "qmv_dp4a_mma_quantize: B = ", B, ", ", cols, " columns, ldx ", ldx);
  TERN_CHECK(xq && xq_bytes >= qmv_dp4a_mma_scratch_bytes(B, cols) && (reinterpret_cast<uintptr_t>(xq) & 15) == 0,
             "qmv_dp4a_mma_quantize: scratch of ", xq_bytes, " bytes for B = ", B, " x ", cols, " columns");
  MmaParams p;
  p.x = x;
  p.ldx = ldx;
  p.norm_w = norm_w;
  p.eps = eps;
  p.B = B;
  p.xq = static_cast<uint8_t*>(xq);
  const dim3 grid(unsigned((B + kTileTokens - 1) / kTileTokens * kTileTokens));
  switch (cols) {
    case 1024: launch_pdl("qmv_dp4a_prequant", qmv_dp4a_prequant_kernel<1>, grid, dim3(kThreads), 0, stream, p); break;
    case 2048: launch_pdl("qmv_dp4a_prequant", qmv_dp4a_prequant_kernel<2>, grid, dim3(kThreads), 0, stream, p); break;
    default: launch_pdl("qmv_dp4a_prequant", qmv_dp4a_prequant_kernel<4>, grid, dim3(kThreads), 0, stream, p); break;
  }
}

bool& producer_tables_setting() {
  static bool on = !env_is("TERN_QMV_PRODUCER_TABLES", "0");
  return on;
}

void qmv_dp4a_set_producer_tables(bool on) { producer_tables_setting() = on; }
bool qmv_dp4a_producer_tables() { return producer_tables_setting(); }

bool& split_setting() {
  static bool on = !env_is("TERN_QMV_MMA_SPLIT", "0");
  return on;
}

void qmv_dp4a_mma_set_split(bool on) { split_setting() = on; }
bool qmv_dp4a_mma_split() { return split_setting(); }
uint64_t qmv_dp4a_mma_split_launches() { return split_launch_count(); }
bool qmv_dp4a_mma_split_available() { return split_wave() > 0; }

bool qmv_dp4a_mma_fits(int64_t cols) { return smem_for_cols(cols) <= qtile::max_dynamic_smem(); }

bool qmv_dp4a_mma_supported(const QmvArgs& a, int B) {
  const DMat& w = a.w;
  if (B < 2 || B > kBatchMaxTokens || !qmv_dp4a_supported(a) || !qmv_dp4a_wide()) return false;
  const uint16_t* scales = w.scales + a.expert * w.rows * w.groups_per_row;
  const uint16_t* biases = w.biases + a.expert * w.rows * w.groups_per_row;
  const bool aligned = (reinterpret_cast<uintptr_t>(scales) & 15) == 0 && (reinterpret_cast<uintptr_t>(biases) & 15) == 0;
  return aligned && a.ldx % 4 == 0 && smem_for_cols(w.cols) <= qtile::max_dynamic_smem();
}

void qmv_dp4a_mma_batched(const QmvArgs& a, int B, cudaStream_t stream) {
  TERN_CHECK(qmv_dp4a_mma_supported(a, B), "qmv_dp4a_mma_batched: unsupported product [", a.w.rows, ", ", a.w.cols,
             "] B = ", B);
  const DMat& w = a.w;
  MmaParams p;
  p.w = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(w.data) + a.expert * w.rows * w.row_words);
  p.scales = w.scales + a.expert * w.rows * w.groups_per_row;
  p.biases = w.biases + a.expert * w.rows * w.groups_per_row;
  p.rows = int(w.rows);
  p.x = a.x;
  p.norm_w = a.norm_w;
  p.eps = a.eps;
  p.y = a.y;
  p.ldx = a.ldx;
  p.ldy = a.ldy;
  p.B = B;
  p.accumulate = a.accumulate;
  p.ahead = a.l2_ahead;
  if (a.xq) {
    const size_t need = qmv_dp4a_mma_scratch_bytes(B, w.cols);
    TERN_CHECK(a.xq_bytes >= need && (reinterpret_cast<uintptr_t>(a.xq) & 15) == 0,
               "qmv_dp4a_mma_batched: activation scratch of ", a.xq_bytes, " bytes at ", a.xq, " for B = ", B, " x ",
               w.cols, " columns (", need, " bytes, 16-byte aligned, needed)");
    p.xq = static_cast<uint8_t*>(a.xq);
    p.xq_written = a.xq_written;
  }
  switch (w.cols) {
    case 1024: launch<1>(p, stream); break;
    case 2048: launch<2>(p, stream); break;
    default: launch<4>(p, stream); break;
  }
}

}  // namespace tern::cuda
