// One-token 4-bit matrix-vector product with integer dot products: see qmv_dp4a.cuh.
//
// Work split: lane l of a warp owns columns [1024·j + 32·l, +32) of every row, j < S = cols/1024: one uint4 of
// weights (4 words, 32 nibbles) per slice and row, and the matching activations in registers (per word the even
// and odd columns' hi and lo bytes: 4 int8x4 registers). Lanes 2m and 2m + 1 thus own the two halves of group
// 16·j + m (64 columns, one scale and bias). A warp streams batches of R consecutive rows (R even), batches
// interleaved over every warp of the grid; the next batch's weights, scales and biases are loaded before the current
// batch is reduced (two batches in flight per warp).
//
// The fold, per group: each lane makes the exact integer sums of its half-group for the rows 2k and 2k + 1 of a
// batch, hands the pair's other lane the row that lane folds and takes the partner's for its own (lane 2m + p folds
// row 2k + p), so each group's sums are made once, in integers, and one fp32 fold per group and row follows:
//   leaf = Σ_j in slice order [ fmaf(s·σ, dot, ·) then fmaf(b, σ·Σv, ·) ],
//   dot = fmaf(float(dh), 65536, fmaf(float(dm), 256, float(dl)))   (24-bit activations; 16-bit: float(dh·256 + dl)),
// with dh, dm, dl the group's Σ q·hi, Σ q·mid, Σ q·lo and Σv its Σ of the quantised activations. The warp then adds
// the 16 groups' leaves of each row as a pairwise tree in group order (warp_sum_groups: shuffles 2, 4, 8, 16, which
// leave row 2k's sum in the even lanes and row 2k + 1's in the odd ones): the order qmv_dp4a_mma.cu reproduces. Lanes
// 0 and 1 write. Against a fold per half-group (the form before), half the fp32 work per row, and about the same
// instruction count: the pair's exchange (3 shuffles per slice and row pair) costs what the fold and the tree save.
//
// Batched (qmv_dp4a_batched): tiles of up to 8 tokens (grid.y). Every block quantises its tile's tokens into shared
// memory as the one-token kernel quantises its one, and each warp folds every batch of weight rows it loads with each
// token in turn through the same lane_dots and warp_sum_groups: a token's rows come out bit for bit as alone (nothing
// in a row's arithmetic depends on the grid or on the other tokens), and the weights are read once per tile.
//
// Word w (nibbles n0..n7 LSB first, columns 8w..8w+7): w & 0x0F0F0F0F holds the even columns' nibbles as bytes,
// (w >> 4) & 0x0F0F0F0F the odd ones'; each meets the matching int8x4 of hi and of lo in one dp4a.
#include "cuda/kernels/qmv/qmv_dp4a.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstdint>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_dp4a_mma.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {

using qtile::kThreads;  // blocks of 8 warps, as qtile::balanced_grid sizes them
using qtile::kWarps;

struct Dp4aParams {
  const uint4* w;         // [rows][row_u4]
  const uint16_t* scales; // bf16 [rows][gpr]
  const uint16_t* biases;
  int rows = 0, row_u4 = 0, gpr = 0;
  const float* x;         // [B][ldx]: token b's [cols] at x + b·ldx
  const float* norm_w;    // [cols] or nullptr
  float eps = 1e-6f;
  float* y;               // [B][ldy]: token b's [rows] at y + b·ldy
  int64_t ldx = 0, ldy = 0;  // the tokens' strides in floats (unused for one token: blockIdx.y = 0)
  bool accumulate = false;
  L2Ranges ahead;         // asked of L2 for later kernels, before pdl_wait, spread over the grid
};

// The weights of rows [row0, row0 + R) that this lane reads, and the scales and biases (bf16 bits) of the rows it
// folds, 2k + (lane & 1) (zeros past the last row).
template <int S, int R>
struct Batch {
  uint4 w[R][S];
  uint32_t scale[R / 2][S], bias[R / 2][S];
};

// Every row's loads are issued before any is used: predicated, not branched (see ld_weights_u4_if), and the scales
// and biases kept apart until lane_dots uses them, so that nothing waits on a load here.
template <int S, int R>
__device__ __forceinline__ void load_batch(const Dp4aParams& p, int row0, int lane, Batch<S, R>& b) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
    const bool on = row < p.rows;
    const uint4* wr = p.w + int64_t(row) * p.row_u4 + lane;
#pragma unroll
    for (int j = 0; j < S; ++j) b.w[r][j] = qtile::ld_weights_u4_if(wr + 32 * j, on);
  }
#pragma unroll
  for (int k = 0; k < R / 2; ++k) {
    const int row = row0 + 2 * k + (lane & 1);
    const bool on = row < p.rows;
    const int64_t g = int64_t(row) * p.gpr + lane / 2;
#pragma unroll
    for (int j = 0; j < S; ++j) {
      b.scale[k][j] = qtile::ld_const_u16_if(p.scales + g + 16 * j, on);
      b.bias[k][j] = qtile::ld_const_u16_if(p.biases + g + 16 * j, on);
    }
  }
}

// One token's activations as lane `lane` reads them: its columns [1024·j + 32·lane, +32) are words
// j·128 + 4·lane + k of the shared-memory arrays quantize_block wrote.
template <int S, bool kWide>
struct LaneX {
  uint4 q[S][4];               // [slice][word] {even hi, odd hi, even lo, odd lo} (wide: mid in place of lo)
  uint2 lo[kWide ? S : 1][4];  // wide: [slice][word] {even lo, odd lo}
  float sig[S], sx[S];         // σ of the lane's group, σ·Σv of the group (its 8 words, both lanes' halves)
};

template <int S, bool kWide>
__device__ __forceinline__ void load_lane_x(const uint4* xs, const uint2* xs_lo, const int* xsum, const float* xsig,
                                            int lane, LaneX<S, kWide>& x) {
#pragma unroll
  for (int j = 0; j < S; ++j) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x.q[j][k] = xs[dp4a::xs_slot(j * 128 + 4 * lane + k)];
      if constexpr (kWide) x.lo[j][k] = xs_lo[dp4a::xs_slot(j * 128 + 4 * lane + k)];
    }
    const int4 sa = *reinterpret_cast<const int4*>(xsum + j * 128 + 8 * (lane / 2));
    const int4 sb = *reinterpret_cast<const int4*>(xsum + j * 128 + 8 * (lane / 2) + 4);
    const int sumv = (sa.x + sa.y + sa.z + sa.w) + (sb.x + sb.y + sb.z + sb.w);  // integers: exact
    x.sig[j] = xsig[j * 16 + lane / 2];
    x.sx[j] = x.sig[j] * float(sumv);
  }
}

// Σ q·v of one row over the lane's 32 columns of slice j: dh, dm, dl (16-bit activations: dh, dl; dm = 0).
template <int S, int R, bool kWide>
__device__ __forceinline__ void half_group_sums(const Batch<S, R>& cur, const LaneX<S, kWide>& x, int r, int j,
                                                int& dh, int& dm, int& dl) {
  dh = 0, dm = 0, dl = 0;
  if constexpr (kWide) {
    dp4a::dot_word_wide(cur.w[r][j].x, x.q[j][0], x.lo[j][0], dh, dm, dl);
    dp4a::dot_word_wide(cur.w[r][j].y, x.q[j][1], x.lo[j][1], dh, dm, dl);
    dp4a::dot_word_wide(cur.w[r][j].z, x.q[j][2], x.lo[j][2], dh, dm, dl);
    dp4a::dot_word_wide(cur.w[r][j].w, x.q[j][3], x.lo[j][3], dh, dm, dl);
  } else {
    dp4a::dot_word(cur.w[r][j].x, x.q[j][0], dh, dl);
    dp4a::dot_word(cur.w[r][j].y, x.q[j][1], dh, dl);
    dp4a::dot_word(cur.w[r][j].z, x.q[j][2], dh, dl);
    dp4a::dot_word(cur.w[r][j].w, x.q[j][3], dh, dl);
  }
}

// The lane's part of rows [row0, row0 + R): acc[k] = row 2k + (lane & 1)'s leaf of the lane's group,
// Σ_j s·σ·dot + b·σ·Σv over the S slices in slice order (see the top). The one arithmetic of every token, alone or in
// a batch (the warp then adds the groups with warp_sum_groups). All 32 lanes call (the pair's shuffles).
template <int S, int R, bool kWide>
__device__ __forceinline__ void lane_dots(const Batch<S, R>& cur, const LaneX<S, kWide>& x, int lane,
                                          float (&acc)[R / 2]) {
  static_assert(R % 2 == 0, "rows in pairs: each lane of a pair folds one");
  const bool odd = lane & 1;
#pragma unroll
  for (int k = 0; k < R / 2; ++k) {
    acc[k] = 0.0f;
#pragma unroll
    for (int j = 0; j < S; ++j) {
      int h0, m0, l0, h1, m1, l1;  // rows 2k, 2k + 1 over the lane's half-group
      half_group_sums<S, R, kWide>(cur, x, 2 * k, j, h0, m0, l0);
      half_group_sums<S, R, kWide>(cur, x, 2 * k + 1, j, h1, m1, l1);
      // The group's sums of this lane's row: its own half plus the partner's (lane ^ 1), which sends the row it
      // does not fold.
      const int dh = (odd ? h1 : h0) + __shfl_xor_sync(0xffffffffu, odd ? h0 : h1, 1);
      const int dl = (odd ? l1 : l0) + __shfl_xor_sync(0xffffffffu, odd ? l0 : l1, 1);
      float dot;  // Σ q·v over the group's 64 columns
      if constexpr (kWide) {
        const int dm = (odd ? m1 : m0) + __shfl_xor_sync(0xffffffffu, odd ? m0 : m1, 1);
        dot = fmaf(float(dh), 65536.0f, fmaf(float(dm), 256.0f, float(dl)));  // |dh|, |dm|, |dl| < 2^22: exact floats
      } else {
        dot = float(dh * 256 + dl);
      }
      const float s = bf16_bits_to_float(uint16_t(cur.scale[k][j])), b = bf16_bits_to_float(uint16_t(cur.bias[k][j]));
      acc[k] = fmaf(s * x.sig[j], dot, acc[k]);
      acc[k] = fmaf(b, x.sx[j], acc[k]);
    }
  }
}

// The RMSNorm factor from the warps' Σx² (red[kWarps]), summed in warp order.
__device__ __forceinline__ float rms_factor(const float* red, int cols, float eps) {
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += red[w];
  return rsqrtf(t / float(cols) + eps);
}

template <int S, int R, bool kWide>
__global__ void __launch_bounds__(kThreads) qmv_dp4a_kernel(const Dp4aParams p) {
  const int lane = threadIdx.x & 31;
  const int warps = int(gridDim.x) * kWarps;
  const int batches = (p.rows + R - 1) / R;
  int batch = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5);

  Batch<S, R> cur;
  load_batch<S, R>(p, batch * R, lane, cur);  // weights are launch constants: read before the wait
  if (p.ahead.pieces) l2_prefetch_share(p.ahead, grid_thread(), grid_threads());
  // The `if (p.ahead.pieces)` branch keeps load_batch's loads ahead of the wait: without it ptxas moves the wait
  // above the predicated loads (checked in the SASS), and the weights are no longer read while the kernel before runs.
  pdl_wait();

  // Activations, once per block: thread t quantises words t, t + 256, ... (8 columns each) of x̂ = x (·norm_w) per
  // group of 64 (8 consecutive threads), and leaves per word {even hi, odd hi, even lo, odd lo} and Σv, per group σ.
  __shared__ uint4 xs[S * 128];
  __shared__ uint2 xs_lo[kWide ? S * 128 : 1];  // the wide activations' lo bytes (dp4a_tile.cuh)
  __shared__ __align__(16) int xsum[S * 128];
  __shared__ float xsig[S * 16];
  __shared__ float red[kWarps];
  float ss = 0.0f;  // Σ x² (RMSNorm)
  dp4a::quantize_block<dp4a::quantize_passes(S * 128, kThreads), kWide>(p.x, p.norm_w, S * 128, xs, xsum, xsig, ss,
                                                                        xs_lo);
  if (p.norm_w) {
    ss = warp_sum(ss);
    if (lane == 0) red[threadIdx.x >> 5] = ss;
  }
  __syncthreads();
  pdl_trigger();  // the inputs are read: the next kernel's blocks may start loading their weights
  const float rinv = p.norm_w ? rms_factor(red, S * 1024, p.eps) : 1.0f;
  LaneX<S, kWide> x;  // in registers for the whole kernel
  load_lane_x<S, kWide>(xs, xs_lo, xsum, xsig, lane, x);

  for (; batch < batches; batch += warps) {
    Batch<S, R> nxt;
    load_batch<S, R>(p, (batch + warps) * R, lane, nxt);  // rows past the end load nothing
    // With accumulate, the outputs' old values are loaded before the dots, all of them before the first store: a
    // store may alias the next load, so load, add and store row by row would be one round trip a row.
    float old[R / 2];
#pragma unroll
    for (int k = 0; k < R / 2; ++k) {
      const int row = batch * R + 2 * k + lane;  // lanes 0 and 1: rows 2k, 2k + 1
      old[k] = p.accumulate && lane < 2 && row < p.rows ? p.y[row] : 0.0f;
    }
    float acc[R / 2];
    lane_dots<S, R, kWide>(cur, x, lane, acc);
#pragma unroll
    for (int k = 0; k < R / 2; ++k) {
      const float v = warp_sum_groups(acc[k]) * rinv;
      const int row = batch * R + 2 * k + lane;
      if (lane < 2 && row < p.rows) p.y[row] = p.accumulate ? old[k] + v : v;
    }
    cur = nxt;
  }
}

// ---- batched: up to kTileTokens tokens per block (kSmallTileTokens where 8 tokens' activations do not fit the
// device's shared memory: 4096 columns in 24 bits need 117 KB, above sm_86/89/120's 99 KB) ----
constexpr int kTileTokens = 8, kSmallTileTokens = 4;
constexpr int kGroupTokens = 4;  // tokens whose warp sums run together (qmv_dp4a_tile_kernel)

// One token's quantised activations in the batched kernel's dynamic shared memory (16-byte aligned parts).
template <int S, bool kWide>
struct TokenX {
  uint4 xs[S * 128];
  uint2 xs_lo[kWide ? S * 128 : 2];
  int xsum[S * 128];
  float xsig[S * 16];
  float red[kWarps];
  float rinv;
  float pad[3];
};

template <int S, bool kWide, int TT>
constexpr int tile_smem_bytes() { return int(sizeof(TokenX<S, kWide>)) * TT; }

// Tokens [TT·blockIdx.y, +TT) ∩ [0, B) of a batch (TT: kTileTokens or kSmallTileTokens): each warp loads a batch of
// weight rows once and folds it with every token of the tile in turn (load_lane_x from shared memory, then the
// one-token lane_dots and warp_sum_groups), so that the weights are read once per tile instead of once per token and
// every token's rows come out bit for bit as qmv_dp4a_kernel gives them alone.
template <int S, int R, bool kWide, int TT>
__global__ void __launch_bounds__(kThreads) qmv_dp4a_tile_kernel(const Dp4aParams p, int B) {
  static_assert(TT % kGroupTokens == 0, "whole token groups");
  extern __shared__ __align__(16) uint8_t tile_smem[];
  TokenX<S, kWide>* tok = reinterpret_cast<TokenX<S, kWide>*>(tile_smem);
  const int lane = threadIdx.x & 31;
  const int warps = int(gridDim.x) * kWarps;  // of this tile
  const int batches = (p.rows + R - 1) / R;
  const int t0 = int(blockIdx.y) * TT, nt = min(TT, B - t0);
  int batch = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5);

  Batch<S, R> cur;
  load_batch<S, R>(p, batch * R, lane, cur);
  if (p.ahead.pieces) {  // each piece once, spread over the blocks of every tile (x fastest)
    const int64_t block = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    l2_prefetch_share(p.ahead, block * kThreads + threadIdx.x, int64_t(gridDim.x) * gridDim.y * kThreads);
  }
  pdl_wait();
  for (int t = 0; t < nt; ++t) {
    TokenX<S, kWide>& tx = tok[t];
    float ss = 0.0f;
    dp4a::quantize_block<dp4a::quantize_passes(S * 128, kThreads), kWide>(
        p.x + int64_t(t0 + t) * p.ldx, p.norm_w, S * 128, tx.xs, tx.xsum, tx.xsig, ss, tx.xs_lo);
    if (p.norm_w) {
      ss = warp_sum(ss);
      if (lane == 0) tx.red[threadIdx.x >> 5] = ss;
    }
  }
  __syncthreads();
  pdl_trigger();
  if (int(threadIdx.x) < nt) tok[threadIdx.x].rinv = p.norm_w ? rms_factor(tok[threadIdx.x].red, S * 1024, p.eps) : 1.0f;
  __syncthreads();

  for (; batch < batches; batch += warps) {
    Batch<S, R> nxt;
    load_batch<S, R>(p, (batch + warps) * R, lane, nxt);
    // Tokens in groups of kGroupTokens: the group's dots first, then its kGroupTokens·R warp sums together, so that
    // their shuffle chains overlap instead of one token's waiting on the last's (each value's sum is unchanged).
#pragma unroll 1
    for (int t = 0; t < nt; t += kGroupTokens) {
      float acc[kGroupTokens][R / 2];
#pragma unroll
      for (int g = 0; g < kGroupTokens; ++g) {
        if (t + g < nt) {  // uniform over the block
          LaneX<S, kWide> x;
          const TokenX<S, kWide>& tx = tok[t + g];
          load_lane_x<S, kWide>(tx.xs, tx.xs_lo, tx.xsum, tx.xsig, lane, x);
          lane_dots<S, R, kWide>(cur, x, lane, acc[g]);
        } else {
#pragma unroll
          for (int k = 0; k < R / 2; ++k) acc[g][k] = 0.0f;
        }
      }
#pragma unroll
      for (int g = 0; g < kGroupTokens; ++g)
#pragma unroll
        for (int k = 0; k < R / 2; ++k) acc[g][k] = warp_sum_groups(acc[g][k]);
#pragma unroll
      for (int g = 0; g < kGroupTokens; ++g) {
        if (t + g >= nt) break;
        float* y = p.y + int64_t(t0 + t + g) * p.ldy;
        const float rinv = tok[t + g].rinv;
#pragma unroll
        for (int k = 0; k < R / 2; ++k) {
          const float v = acc[g][k] * rinv;
          const int row = batch * R + 2 * k + lane;  // lanes 0 and 1: rows 2k, 2k + 1
          if (lane < 2 && row < p.rows) y[row] = p.accumulate ? y[row] + v : v;
        }
      }
    }
    cur = nxt;
  }
}

// 24-bit activations (dp4a_tile.cuh's wide form) unless TERN_QMV_DP4A_BITS=16.
bool& wide_setting() {
  static bool wide = !env_is("TERN_QMV_DP4A_BITS", "16");
  return wide;
}

// B >= 2 tokens on the integer tensor cores (qmv_dp4a_mma.cuh) where they apply, unless TERN_QMV_BATCHED_MMA=0.
bool& batched_mma_setting() {
  static bool on = !env_is("TERN_QMV_BATCHED_MMA", "0");
  return on;
}

// The tensor-core form's activations quantised once per product into QmvArgs::xq where given, unless
// TERN_QMV_PREQUANT=0 (then every block quantises its tokens: the A/B comparison).
bool& prequant_setting() {
  static bool on = !env_is("TERN_QMV_PREQUANT", "0");
  return on;
}

int& rows_per_batch_setting() {
  static int r = 2;  // H200: 2 rows per batch beat 4 and 8 (GDN in_proj 7.95 / 8.45 / 10.8 µs, LM head 68 / 73 / 99)
  return r;
}

// B > 1: ⌈B / TT⌉ tiles (grid.y), the wave's blocks shared among them (each tile's blocks stream every row; the
// tiles read the same rows at about the same time, so L2 serves all but the first read).
template <int S, int R, int TT>
void launch_tiles(const Dp4aParams& p, int B, cudaStream_t stream) {
  const int64_t batches = (int64_t(p.rows) + R - 1) / R;
  const bool wide = wide_setting();
  auto kernel = wide ? qmv_dp4a_tile_kernel<S, R, true, TT> : qmv_dp4a_tile_kernel<S, R, false, TT>;
  const int smem = wide ? tile_smem_bytes<S, true, TT>() : tile_smem_bytes<S, false, TT>();
  static bool attribute_set[2] = {false, false};  // per instantiation (S, R, TT): the wide and the 16-bit kernel
  if (!attribute_set[wide]) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attribute_set[wide] = true;
  }
  const int tiles = (B + TT - 1) / TT;
  const int wave = std::max(1, qtile::blocks_fit(reinterpret_cast<const void*>(kernel), smem)) * qtile::sm_count();
  const int blocks = int(std::clamp<int64_t>(wave / tiles, 1, (batches + kWarps - 1) / kWarps));
  launch_pdl("qmv_dp4a_tile", kernel, dim3(unsigned(blocks), unsigned(tiles)), dim3(kThreads), size_t(smem), stream, p,
             B);
}

// One token: the balanced one-wave grid. B > 1: token tiles of 8, or of 4 where 8 do not fit shared memory.
template <int S, int R>
void launch(const Dp4aParams& p, int B, cudaStream_t stream) {
  const int64_t batches = (int64_t(p.rows) + R - 1) / R;
  if (B == 1) {
    auto kernel = wide_setting() ? qmv_dp4a_kernel<S, R, true> : qmv_dp4a_kernel<S, R, false>;
    const int blocks = qtile::balanced_grid(reinterpret_cast<const void*>(kernel), batches);
    launch_pdl("qmv_dp4a", kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, p);
    return;
  }
  if constexpr (tile_smem_bytes<S, true, kTileTokens>() > kPortableSmemBytes) {
    const int smem = wide_setting() ? tile_smem_bytes<S, true, kTileTokens>() : tile_smem_bytes<S, false, kTileTokens>();
    if (smem > qtile::max_dynamic_smem()) return launch_tiles<S, R, kSmallTileTokens>(p, B, stream);
  }
  launch_tiles<S, R, kTileTokens>(p, B, stream);
}

template <int S>
void launch_rows(const Dp4aParams& p, int B, cudaStream_t stream) {
  if constexpr (S <= 2) {
    if (rows_per_batch_setting() == 8) return launch<S, 8>(p, B, stream);
    if (rows_per_batch_setting() == 4) return launch<S, 4>(p, B, stream);
    launch<S, 2>(p, B, stream);
  } else {
    launch<S, 2>(p, B, stream);  // 4096 columns: 2 rows per batch (170 registers)
  }
}

// qmv_dp4a for B tokens (checked by the callers).
void run(const QmvArgs& a, int B, cudaStream_t stream) {
  const DMat& w = a.w;
  Dp4aParams p;
  p.w = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(w.data) + a.expert * w.rows * w.row_words);
  p.scales = w.scales + a.expert * w.rows * w.groups_per_row;
  p.biases = w.biases + a.expert * w.rows * w.groups_per_row;
  p.rows = int(w.rows);
  p.row_u4 = int(w.row_words / 4);
  p.gpr = int(w.groups_per_row);
  p.x = a.x;
  p.norm_w = a.norm_w;
  p.eps = a.eps;
  p.y = a.y;
  p.ldx = a.ldx;
  p.ldy = a.ldy;
  p.accumulate = a.accumulate;
  p.ahead = a.l2_ahead;
  switch (w.cols) {
    case 1024: launch_rows<1>(p, B, stream); break;
    case 2048: launch_rows<2>(p, B, stream); break;
    default: launch_rows<4>(p, B, stream); break;
  }
}

}  // namespace

bool qmv_dp4a_supported(const QmvArgs& a) {
  const DMat& w = a.w;
  return a.T == 1 && w.format == WeightFormat::affine4 && w.group_size == 64 &&
         (w.cols == 1024 || w.cols == 2048 || w.cols == 4096) && w.row_words == w.cols / 8 &&
         w.rows * w.row_words < (int64_t(1) << 31) && (reinterpret_cast<uintptr_t>(w.data) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(a.x) & 15) == 0 && (reinterpret_cast<uintptr_t>(a.norm_w) & 15) == 0;
}

void qmv_dp4a_set_rows_per_batch(int r) { rows_per_batch_setting() = r; }
void qmv_dp4a_set_wide(bool wide) { wide_setting() = wide; }
void qmv_dp4a_set_batched_mma(bool on) { batched_mma_setting() = on; }
bool qmv_dp4a_batched_mma() { return batched_mma_setting(); }
void qmv_dp4a_set_prequant(bool on) { prequant_setting() = on; }
bool qmv_dp4a_prequant() { return prequant_setting(); }
bool qmv_dp4a_wide() { return wide_setting(); }

int64_t qmv_dp4a_min_rows() {
  static const int64_t r = [] {
    const char* e = std::getenv("TERN_QMV_DP4A_MIN_ROWS");
    return e ? std::max<int64_t>(0, std::atoll(e)) : int64_t(0);
  }();
  return r;
}

void qmv_dp4a(const QmvArgs& a, cudaStream_t stream) {
  TERN_CHECK(qmv_dp4a_supported(a), "qmv_dp4a: unsupported product [", a.w.rows, ", ", a.w.cols, "] T = ", a.T);
  run(a, 1, stream);
}

void qmv_dp4a_batched(const QmvArgs& a, int B, cudaStream_t stream) {
  TERN_CHECK(B >= 1 && B <= kBatchMaxTokens, "qmv_dp4a_batched: B = ", B, " outside 1..", kBatchMaxTokens);
  TERN_CHECK(qmv_dp4a_supported(a), "qmv_dp4a_batched: unsupported product [", a.w.rows, ", ", a.w.cols, "] T = ",
             a.T);
  // Rows of x 16-byte aligned (the quantiser's float4 loads) and rows of y apart.
  TERN_CHECK(B == 1 || (a.ldx >= a.w.cols && a.ldx % 4 == 0 && a.ldy >= a.w.rows), "qmv_dp4a_batched: ldx ", a.ldx,
             " / ldy ", a.ldy, " for the matrix [", a.w.rows, ", ", a.w.cols, "] (ldx a multiple of 4)");
  if (batched_mma_setting() && qmv_dp4a_mma_supported(a, B)) {
    if (prequant_setting() || !a.xq) return qmv_dp4a_mma_batched(a, B, stream);
    QmvArgs per_block = a;
    per_block.xq = nullptr;
    return qmv_dp4a_mma_batched(per_block, B, stream);
  }
  run(a, B, stream);
}

}  // namespace tern::cuda
