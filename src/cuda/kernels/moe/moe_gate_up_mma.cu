// The batched decode step's MoE gate_up + SwiGLU (h[t][slot][i] = silu(Wg[e]·x̂_t)_i · (Wu[e]·x̂_t)_i) on the integer
// tensor cores, grouped by expert across the batch: see moe_gate_up_mma.cuh. D = 2048 (S = 2 slices of 1024 columns,
// HG = 64 half-groups of 32 columns a row), F rows a multiple of 16, k = 8.
//
// What must match. The one-token kernel (moe_gate_up_dp4a_kernel, moe_dp4a_parts.cuh's dot_row and warp_sum) gives
// each of a row's two dot products as follows: lane l of a warp owns half-group 32·j + l of slice j (one uint4 of 4
// weight words); its leaf is
//   leaf_l = Σ_j in slice order [ fmaf(s·σ, float(dh·256 + dl), ·) then fmaf(b, σ·Σv, ·) ],
// dh, dl the exact Σ q·hi, Σ q·lo over the half-group (16-bit activations as int8 hi and lo, quantize_block), s, b
// the weights' bf16 scale and bias of the group of 64, σ = m/32639 of the activations' group, Σv the half-group's
// integer sum; then warp_sum, the xor butterfly 16, 8, 4, 2, 1, whose lane-0 value is
//   a_l = l_l + l_{l+16} (l < 16), b_l = a_l + a_{l+8} (l < 8), c_l = b_l + b_{l+4}, d_l = c_l + c_{l+2}, d_0 + d_1,
// i.e. with P_w = (l_w + l_{w+16}) + (l_{w+8} + l_{w+24}) (w < 8): ((P0 + P4) + (P2 + P6)) + ((P1 + P5) + (P3 + P7)).
// Here: the integers dh, dl by mma.sync m16n8k32 (u8 weight nibbles × s8 activation bytes, exact; accumulators
// started at the bits of 1.5·2^23 so each reads as the float 1.5·2^23 + Σ exactly), dot = fmaf(dh, 256, dl) (one
// rounding of the exact integer, as float(int)), the leaves in slice order with the same fmaf's, warp w of the block
// owns positions w, w + 8, w + 16, w + 24 and folds them as P_w above, and the block adds the 8 warps' P_w in the
// butterfly's order. σ, Σv and the int8 bytes come from the same quantize_word over the same 64 values, σ·Σv with the
// same two roundings; silu_f is the one-token kernel's. So every h is bit for bit the token's one-token value.
//
// Work split. Launch 1 (moe_gate_up_mma_prep_kernel, B + 1 blocks): block t < B quantises token t's x̂ once into the
// scratch's tables (xq [B][256 words] uint4 {even hi, odd hi, even lo, odd lo}, sx [B][64] σ·Σv per half-group,
// sig [B][32] σ per group); block B builds the work table from the B·k routing ids: entries 0 .. ⌈B/8⌉ − 1 are the
// shared expert (all B tokens, 8 a tile, slot k), then each routed expert in increasing id, its (token, slot) pairs
// in increasing token·k + slot (a token listing an expert twice gives two columns: both slots are written, as the
// one-token kernel writes them), 8 a tile. Launch 2 (moe_gate_up_mma_kernel, grid (F/16, capacity), 256 threads):
// block (x, y) takes entry y (nothing past the table's count) and rows [16x, 16x + 16) of its expert's gate and up:
// the two 16-row weight tiles (ldmatrix of swizzled 16-byte half-groups) and the entry's ≤ 8 tokens' tables (columns
// past its count zero-filled: they add nothing to the other columns and are not written) by cp.async, 4 MMAs per
// half-group (gate hi, lo; up hi, lo), the leaves, the fold above through shared memory, h written for the entry's
// columns. The shared expert's entries copy their weights before pdl_wait (they do not depend on the routing); every
// block calls pdl_trigger right after its pdl_wait, before anything else (moe_down's early routing read).
//
// Fragments (m16n8k32, thread g = lane/4, c = lane%4): A holds (row g, k 4c..4c+3), (row g+8, same), (row g,
// k 16+4c..), (row g+8, same); B (k 4c.., token g), (k 16+4c.., token g). Slots 4c.. of a half-group take the even
// columns of its word c, slots 16+4c.. the odd ones: for the weights w & 0x0F0F0F0F and (w >> 4) & 0x0F0F0F0F of the
// word ldmatrix hands thread (g, c), for the activations the word's {even hi, odd hi} (or {even lo, odd lo}) bytes.
// D: (row g, token 2c), (row g, token 2c + 1), (row g + 8, token 2c), (row g + 8, token 2c + 1).
#include "cuda/kernels/moe/moe_gate_up_mma.cuh"

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/moe/moe_dp4a_parts.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {

using moe_parts::pick;
using moe_parts::Q4;

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kD = 2048;
constexpr int kWords = kD / 8;     // 256 words of a row (one per prep thread)
constexpr int kHG = kD / 32;       // 64 half-groups
constexpr int kGroups = kD / 64;   // 32 groups of 64
constexpr int kRows = 16;          // rows of a tile (of the gate and of the up matrix)
constexpr int kCols = 8;           // (token, slot) columns of an entry
constexpr int kTopK = 8;
constexpr int kMaxExperts = 1024;  // the work-table builder's shared counts
constexpr int kEntryInts = 32;     // [0] expert (−1: shared), [1] columns, [8 + c] token, [16 + c] h row t·(k+1)+slot
constexpr uint32_t kMagicBits = 0x4B400000u;  // 1.5·2^23
constexpr float kMagic = 12582912.0f;

// Shared memory of the product's block, bytes from the start.
constexpr int kWG = 0;                                  // gate words [16 rows][64 half-groups] of 16 B, swizzled
constexpr int kWU = kWG + kRows * kHG * 16;             // up words, the same
constexpr int kSbStride = kGroups * 2 + 16;             // bytes per row of bf16 scales [32] (padded: no conflicts)
constexpr int kSB = kWU + kRows * kHG * 16;             // [4: gate scales, gate biases, up scales, up biases][16][stride]
constexpr int kXF = kSB + 4 * kRows * kSbStride;        // uint4 [64 hg][8 columns][4 words]
constexpr int kSxStride = kHG + 4;                      // floats per column of sx (padded: no conflicts)
constexpr int kSX = kXF + kHG * kCols * 4 * 16;         // float [8 columns][kSxStride]: σ·Σv per half-group
constexpr int kSigStride = kGroups + 4;
constexpr int kSig = kSX + kCols * kSxStride * 4;       // float [8 columns][kSigStride]: σ per group
constexpr int kBytes = kSig + kCols * kSigStride * 4;   // 73,984: three blocks an SM on Hopper
constexpr int kPart = 0;  // float [8 warps][2: gate, up][16 rows][8 columns], over the gate words once they are read
static_assert(kSB % 16 == 0 && kXF % 16 == 0 && kSX % 16 == 0 && kSig % 16 == 0, "16-byte aligned regions");
static_assert((kSxStride * 4) % 16 == 0 && (kSigStride * 4) % 16 == 0 && kSbStride % 16 == 0, "16-byte rows");
static_assert(kWarps * 2 * kRows * kCols * 4 <= kWU, "the partial sums fit over the gate words");

struct MmaParams {
  Q4 gate, up, sgate, sup;
  int F = 0, row_words = 0, gpr = 0, E = 0, k = 0, B = 0;
  const int* ids = nullptr;    // [B][k]
  const float* xhat = nullptr; // [B][D]
  float* h = nullptr;          // [B][k + 1][F]
  // The scratch (MoeDecodeScratch::mma) for B tokens: see tables_of.
  int* n_entries = nullptr;  // [1]
  uint4* xq = nullptr;       // [B][256]
  float* sx = nullptr;       // [B][64]
  float* sig = nullptr;      // [B][32]
  int* entries = nullptr;    // [capacity][kEntryInts]
  int shared_tiles = 0;      // ⌈B / 8⌉
};

// Work items (entries) at most: the shared expert's ⌈B/8⌉ tiles, and Σ_u ⌈n_u/8⌉ ≤ (B·k + 7·U)/8 over the U ≤
// min(E, B·k) routed experts present (Σ n_u = B·k).
int64_t entry_capacity(int B, int k, int E) {
  const int64_t pairs = int64_t(B) * k;
  return (pairs + 7 * std::min<int64_t>(E, pairs)) / 8 + (B + kCols - 1) / kCols;
}

int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

// The scratch carved for B tokens (every region grows with B: a scratch for T >= B tokens holds it).
int64_t tables_bytes(int B, int k, int E) {
  return 256 + align256(int64_t(B) * kWords * 16) + align256(int64_t(B) * kHG * 4) +
         align256(int64_t(B) * kGroups * 4) + align256(entry_capacity(B, k, E) * kEntryInts * 4);
}

void tables_of(void* base, int B, int k, int E, MmaParams& p) {
  uint8_t* at = static_cast<uint8_t*>(base);
  p.n_entries = reinterpret_cast<int*>(at);
  at += 256;
  p.xq = reinterpret_cast<uint4*>(at);
  at += align256(int64_t(B) * kWords * 16);
  p.sx = reinterpret_cast<float*>(at);
  at += align256(int64_t(B) * kHG * 4);
  p.sig = reinterpret_cast<float*>(at);
  at += align256(int64_t(B) * kGroups * 4);
  p.entries = reinterpret_cast<int*>(at);
}

__device__ __forceinline__ int clamp_expert(int e, int E) { return e < 0 ? 0 : (e >= E ? E - 1 : e); }

// Token t's tables, as quantize_block makes the one-token kernel's (thread = word; the 8 words of a group of 64 are 8
// consecutive lanes; no norm scale).
__device__ __forceinline__ void quantize_token(const MmaParams& p, int t) {
  const int word = int(threadIdx.x);
  const float4* x = reinterpret_cast<const float4*>(p.xhat + int64_t(t) * kD);
  const float4 a = x[2 * word], b = x[2 * word + 1];
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  int sumv = 0;
  float m = 0.0f;
  const uint4 q = dp4a::quantize_word(v, sumv, m);
  p.xq[int64_t(t) * kWords + word] = q;
  // Σv of the half-group: its 4 words are 4 consecutive lanes (integer sums: any order is exact)
  sumv += __shfl_xor_sync(0xffffffffu, sumv, 1);
  sumv += __shfl_xor_sync(0xffffffffu, sumv, 2);
  const float sigma = m / dp4a::kQMax;  // xsig of quantize_block
  if ((word & 3) == 0) p.sx[int64_t(t) * kHG + word / 4] = sigma * float(sumv);  // gate_up_lane_x's σ·Σv
  if ((word & 7) == 0) p.sig[int64_t(t) * kGroups + word / 8] = sigma;
}

// The work table (one block): see the file comment.
__device__ __forceinline__ void build_entries(const MmaParams& p) {
  __shared__ int counts[kMaxExperts];     // pairs per expert, then the running ranks
  __shared__ int tile_base[kMaxExperts];  // the expert's first routed entry (after the shared ones)
  __shared__ int ids_s[kBatchMaxTokens * kTopK];
  const int pairs = p.B * p.k, lane = int(threadIdx.x) & 31;
  for (int i = int(threadIdx.x); i < p.E; i += kThreads) counts[i] = 0;
  for (int i = int(threadIdx.x); i < pairs; i += kThreads) ids_s[i] = clamp_expert(__ldcg(p.ids + i), p.E);
  __syncthreads();
  for (int i = int(threadIdx.x); i < pairs; i += kThreads) atomicAdd(&counts[ids_s[i]], 1);  // integers: exact
  for (int y = int(threadIdx.x); y < p.shared_tiles; y += kThreads) {
    int* ent = p.entries + int64_t(y) * kEntryInts;
    const int n = min(kCols, p.B - kCols * y);
    ent[0] = -1;
    ent[1] = n;
    for (int c = 0; c < n; ++c) {
      const int t = kCols * y + c;
      ent[8 + c] = t;
      ent[16 + c] = t * (p.k + 1) + p.k;
    }
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  // Warp 0: the experts' tiles in increasing id (an inclusive scan per 32 experts), then each pair's rank within its
  // expert in increasing pair index (the lanes of a chunk holding one expert found by __match_any_sync).
  int base = 0;
  for (int e0 = 0; e0 < p.E; e0 += 32) {
    const int e = e0 + lane;
    const int cnt = e < p.E ? counts[e] : 0, tiles = (cnt + kCols - 1) / kCols;
    int incl = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int excl = base + incl - tiles;
    if (e < p.E) {
      tile_base[e] = excl;
      counts[e] = 0;
    }
    for (int ti = 0; ti < tiles; ++ti) {
      int* ent = p.entries + int64_t(p.shared_tiles + excl + ti) * kEntryInts;
      ent[0] = e;
      ent[1] = min(kCols, cnt - kCols * ti);
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) *p.n_entries = p.shared_tiles + base;
  __syncwarp();
  for (int i0 = 0; i0 < pairs; i0 += 32) {
    const int i = i0 + lane;
    const bool live = i < pairs;
    const int e = live ? ids_s[i] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    if (live) {
      const int rank = counts[e] + __popc(same & ((1u << lane) - 1u));
      int* ent = p.entries + int64_t(p.shared_tiles + tile_base[e] + rank / kCols) * kEntryInts;
      const int t = i / p.k, slot = i - t * p.k;
      ent[8 + rank % kCols] = t;
      ent[16 + rank % kCols] = t * (p.k + 1) + slot;
    }
    __syncwarp();
    if (live && (same >> lane) == 1u) counts[e] += __popc(same);  // the expert's last lane of the chunk
    __syncwarp();
  }
}

// Blocks 0 .. B − 1: token blockIdx.x's tables; block B: the work table.
__global__ void __launch_bounds__(kThreads) moe_gate_up_mma_prep_kernel(const MmaParams p) {
  pdl_wait();  // the routing and x̂ come from the router; the previous layer's product may still read the scratch
  // The product may start now: its shared-expert blocks copy their weights while this grid works, and wait in their
  // pdl_wait for it to complete (its writes included).
  pdl_trigger();
  if (int(blockIdx.x) < p.B)
    quantize_token(p, int(blockIdx.x));
  else
    build_entries(p);
}

// Copies rows [row0, row0 + 16) of expert `expert`'s (−1: the shared expert's) gate and up words (swizzled: half-group
// h of row r at slot h ^ (r & 7)), scales and biases.
__device__ __forceinline__ void issue_weights(const MmaParams& p, uint8_t* smem, int expert, int row0) {
  const bool sh = expert < 0;
  const int64_t e = sh ? 0 : expert;
  const Q4 G = pick(sh, p.sgate, p.gate), U = pick(sh, p.sup, p.up);
#pragma unroll
  for (int i = int(threadIdx.x); i < 2 * kRows * kHG; i += kThreads) {
    const int which = i / (kRows * kHG), r = (i / kHG) % kRows, hh = i % kHG;
    const Q4 M = pick(which == 0, G, U);
    const uint32_t* src = M.words + e * M.expert_words + int64_t(row0 + r) * p.row_words + hh * 4;
    cp_async_16(smem_addr(smem + (which ? kWU : kWG) + (r * kHG + (hh ^ (r & 7))) * 16), src, 16u);
  }
  constexpr int kSbChunks = kGroups * 2 / 16;  // 16-byte chunks of a row's scales
  for (int i = int(threadIdx.x); i < 4 * kRows * kSbChunks; i += kThreads) {
    const int m = i / (kRows * kSbChunks), r = (i / kSbChunks) % kRows, ch = i % kSbChunks;
    const Q4 M = pick(m < 2, G, U);
    const uint16_t* src = ((m & 1) ? M.biases : M.scales) + e * M.expert_groups + int64_t(row0 + r) * p.gpr + ch * 8;
    cp_async_16(smem_addr(smem + kSB + (m * kRows + r) * kSbStride + ch * 16), src, 16u);
  }
}

// Copies the entry's columns' tables (columns c >= n: zeros, nothing read).
__device__ __forceinline__ void issue_tables(const MmaParams& p, uint8_t* smem, const int* tok, int n) {
#pragma unroll
  for (int i = int(threadIdx.x); i < kHG * kCols * 4; i += kThreads) {  // i = (hg·8 + col)·4 + c
    const int hg = i / (kCols * 4), col = (i / 4) % kCols, c = i % 4;
    const bool in = col < n;
    const uint4* src = p.xq + int64_t(in ? tok[col] : 0) * kWords + hg * 4 + c;
    cp_async_16(smem_addr(smem + kXF + i * 16), src, in ? 16u : 0u);
  }
  constexpr int kSxChunks = kHG / 4, kSigChunks = kGroups / 4;
  for (int i = int(threadIdx.x); i < kCols * (kSxChunks + kSigChunks); i += kThreads) {
    const bool is_sx = i < kCols * kSxChunks;
    const int j = is_sx ? i : i - kCols * kSxChunks, chunks = is_sx ? kSxChunks : kSigChunks;
    const int col = j / chunks, ch = j % chunks;
    const bool in = col < n;
    const int64_t t = in ? tok[col] : 0;
    const float* src = is_sx ? p.sx + t * kHG + ch * 4 : p.sig + t * kGroups + ch * 4;
    uint8_t* dst = is_sx ? smem + kSX + (col * kSxStride + ch * 4) * 4 : smem + kSig + (col * kSigStride + ch * 4) * 4;
    cp_async_16(smem_addr(dst), src, in ? 16u : 0u);
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

__device__ __forceinline__ float unmagic(int d) { return __int_as_float(d) - kMagic; }

__device__ __forceinline__ float bf16_at(const uint8_t* smem, int m, int r, int grp) {
  return __uint_as_float(uint32_t(*reinterpret_cast<const uint16_t*>(smem + kSB + (m * kRows + r) * kSbStride +
                                                                     grp * 2))
                         << 16);
}

// Warp `warp`'s subtrees P_warp of the tile (see the file comment) for this thread's 4 outputs (row g, col 2c),
// (row g, col 2c + 1), (row g + 8, col 2c), (row g + 8, col 2c + 1), of the gate (sg) and the up (su) matrix.
__device__ __forceinline__ void warp_tile(const uint8_t* smem, int warp, int lane, float (&sg)[4], float (&su)[4]) {
  const uint4* xf = reinterpret_cast<const uint4*>(smem + kXF);
  const float* sx = reinterpret_cast<const float*>(smem + kSX);
  const float* sig = reinterpret_cast<const float*>(smem + kSig);
  const int g = lane >> 2, c = lane & 3;
  // ldmatrix: lane L gives row (L & 7) + 8·((L >> 3) & 1) of half-group X (L < 16) or Y (L >= 16)
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1);
  const uint32_t gbase = smem_addr(smem + kWG) + uint32_t(mrow * kHG * 16);
  const uint32_t ubase = smem_addr(smem + kWU) + uint32_t(mrow * kHG * 16);
  float lg[4][4], lu[4][4];  // [position w + 8·pi][output]
#pragma unroll
  for (int pi = 0; pi < 4; ++pi) {
    const int pos = warp + 8 * pi;
    // Half-groups X = pos (slice 0) and Y = pos + 32 (slice 1): lane pos's two half-groups in the one-token kernel.
    const int hx = pos, hy = pos + 32, hl = lane < 16 ? hx : hy;
    uint32_t wg[4], wu[4];
    ldmatrix_x4(wg, gbase + uint32_t((hl ^ (mrow & 7)) * 16));
    ldmatrix_x4(wu, ubase + uint32_t((hl ^ (mrow & 7)) * 16));
#pragma unroll
    for (int i = 0; i < 4; ++i) lg[pi][i] = lu[pi][i] = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // the slices in order
      const int hg = j ? hy : hx, grp = hg >> 1;
      const uint4 xb = xf[(hg * kCols + g) * 4 + c];  // word c of column g: {even hi, odd hi, even lo, odd lo}
      const float sigma[2] = {sig[(2 * c) * kSigStride + grp], sig[(2 * c + 1) * kSigStride + grp]};
      const float sxv[2] = {sx[(2 * c) * kSxStride + hg], sx[(2 * c + 1) * kSxStride + hg]};
#pragma unroll
      for (int m = 0; m < 2; ++m) {  // gate, up
        const uint32_t w0 = m ? wu[2 * j] : wg[2 * j], w1 = m ? wu[2 * j + 1] : wg[2 * j + 1];  // rows g, g + 8
        const uint32_t a[4] = {w0 & 0x0F0F0F0Fu, w1 & 0x0F0F0F0Fu, (w0 >> 4) & 0x0F0F0F0Fu, (w1 >> 4) & 0x0F0F0F0Fu};
        int dh[4], dl[4];
        mma_from_magic(dh, a, xb.x, xb.y);
        mma_from_magic(dl, a, xb.z, xb.w);
        const float s_row[2] = {bf16_at(smem, 2 * m, g, grp), bf16_at(smem, 2 * m, g + 8, grp)};
        const float b_row[2] = {bf16_at(smem, 2 * m + 1, g, grp), bf16_at(smem, 2 * m + 1, g + 8, grp)};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // dot_row: fmaf(scale·σ, float(dh·256 + dl), acc), then fmaf(bias, σ·Σv, acc)
          const float dot = fmaf(unmagic(dh[i]), 256.0f, unmagic(dl[i]));
          float& leaf = m ? lu[pi][i] : lg[pi][i];
          leaf = fmaf(s_row[i >> 1] * sigma[i & 1], dot, leaf);
          leaf = fmaf(b_row[i >> 1], sxv[i & 1], leaf);
        }
      }
    }
  }
  // warp_sum's first two levels over positions w, w + 16 (bit 4), then w + 8, w + 24 (bit 3)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sg[i] = (lg[0][i] + lg[2][i]) + (lg[1][i] + lg[3][i]);
    su[i] = (lu[0][i] + lu[2][i]) + (lu[1][i] + lu[3][i]);
  }
}

// warp_sum's last three levels over the 8 warps' subtrees (stride `stride` floats apart).
__device__ __forceinline__ float tree8(const float* pt, int stride) {
  return ((pt[0] + pt[4 * stride]) + (pt[2 * stride] + pt[6 * stride])) +
         ((pt[1 * stride] + pt[5 * stride]) + (pt[3 * stride] + pt[7 * stride]));
}

__global__ void __launch_bounds__(kThreads, 3) moe_gate_up_mma_kernel(const MmaParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int ent[kEntryInts];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int row0 = int(blockIdx.x) * kRows, y = int(blockIdx.y);
  const bool shared_entry = y < p.shared_tiles;  // the shared expert: weights known before the routing
  if (shared_entry) issue_weights(p, smem, -1, row0);
  pdl_wait();  // the work table and the tables come from the prep kernel (after the router)
  pdl_trigger();  // after pdl_wait in every block: moe_down's early routing read stays safe (moe_dp4a.cuh)
  const int entries = __ldcg(p.n_entries);
  if (y >= entries) {  // uniform over the block
    cp_async_wait<0>();
    return;
  }
  if (int(threadIdx.x) < kEntryInts) ent[threadIdx.x] = __ldcg(p.entries + int64_t(y) * kEntryInts + threadIdx.x);
  __syncthreads();
  const int n = ent[1];
  if (!shared_entry) issue_weights(p, smem, ent[0], row0);
  issue_tables(p, smem, ent + 8, n);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // every thread's copies have landed

  float sg[4], su[4];
  warp_tile(smem, warp, lane, sg, su);
  __syncthreads();  // the gate words are read: the partial sums go over them
  float* part = reinterpret_cast<float*>(smem + kPart);  // [warp][gate, up][16 rows][8 columns]
  constexpr int kTile = kRows * kCols;
  {
    const int g = lane >> 2, c = lane & 3;
    float* pg = part + (warp * 2) * kTile;
    float* pu = pg + kTile;
    *reinterpret_cast<float2*>(pg + g * kCols + 2 * c) = make_float2(sg[0], sg[1]);
    *reinterpret_cast<float2*>(pg + (g + 8) * kCols + 2 * c) = make_float2(sg[2], sg[3]);
    *reinterpret_cast<float2*>(pu + g * kCols + 2 * c) = make_float2(su[0], su[1]);
    *reinterpret_cast<float2*>(pu + (g + 8) * kCols + 2 * c) = make_float2(su[2], su[3]);
  }
  __syncthreads();
  const int r = int(threadIdx.x) / kCols, col = int(threadIdx.x) % kCols;
  if (int(threadIdx.x) < kTile && col < n) {
    const float gv = tree8(part + threadIdx.x, 2 * kTile);
    const float uv = tree8(part + kTile + threadIdx.x, 2 * kTile);
    p.h[int64_t(ent[16 + col]) * p.F + row0 + r] = moe_parts::silu_f(gv) * uv;
  }
}

bool& enabled_flag() {
  static bool on = !env_is("TERN_MOE_MMA", "0");
  return on;
}

bool rows_aligned(const DMat& m) {
  const auto al = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return al(m.data) && al(m.scales) && al(m.biases) && (m.groups_per_row * 2) % 16 == 0 && (m.row_words * 4) % 16 == 0;
}

}  // namespace

size_t moe_gate_up_mma_scratch_bytes(int T, int64_t D, int E, int k) {
  const int B = std::min(T, kBatchMaxTokens);
  if (B < 2 || D != kD || E < 1 || k < 1) return 0;
  return size_t(tables_bytes(B, k, E));
}

bool moe_mma_enabled() { return enabled_flag(); }
void moe_mma_set_enabled(bool on) { enabled_flag() = on; }

bool moe_gate_up_mma_supported(const MoeDecodeWeights& w, const MoeDecodeScratch& s, int B) {
  const DMat& g = w.expert_gate;
  if (!moe_mma_enabled() || B < 2 || B > kBatchMaxTokens || !moe_gate_up_dp4a_fits(w)) return false;
  if (g.cols != kD || g.rows % kRows != 0 || w.top_k != kTopK || g.experts < 1 || g.experts > kMaxExperts)
    return false;
  if (!rows_aligned(g) || !rows_aligned(w.expert_up) || !rows_aligned(w.shared_gate) || !rows_aligned(w.shared_up))
    return false;
  const auto al = [](const void* q) { return q && (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  if (!al(s.mma) || !al(s.xhat) || !s.h || !s.ids) return false;
  if (s.mma_bytes < size_t(tables_bytes(B, w.top_k, int(g.experts)))) return false;
  return kBytes <= qtile::max_dynamic_smem();
}

bool moe_gate_up_mma(const MoeDecodeWeights& w, const MoeDecodeScratch& s, cudaStream_t stream, int B) {
  if (!moe_gate_up_mma_supported(w, s, B)) return false;
  const DMat& g = w.expert_gate;
  MmaParams p;
  p.gate = moe_parts::q4_of(g);
  p.up = moe_parts::q4_of(w.expert_up);
  p.sgate = moe_parts::q4_of(w.shared_gate);
  p.sup = moe_parts::q4_of(w.shared_up);
  p.F = int(g.rows);
  p.row_words = int(g.row_words);
  p.gpr = int(g.groups_per_row);
  p.E = int(g.experts);
  p.k = w.top_k;
  p.B = B;
  p.ids = s.ids;
  p.xhat = s.xhat;
  p.h = s.h;
  tables_of(s.mma, B, p.k, p.E, p);
  p.shared_tiles = (B + kCols - 1) / kCols;
  const int64_t capacity = entry_capacity(B, p.k, p.E);
  TERN_CHECK(p.row_words == kWords && p.gpr == kGroups && capacity <= 65535,
             "moe_gate_up_mma: unexpected row layout (", p.row_words, " words, ", p.gpr, " groups) or ", capacity,
             " entries");
  launch_pdl("moe_gate_up_mma_prep", moe_gate_up_mma_prep_kernel, dim3(unsigned(B + 1)), dim3(kThreads), 0, stream,
             p);
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(moe_gate_up_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
    attribute_set = true;
  }
  launch_pdl("moe_gate_up_mma", moe_gate_up_mma_kernel, dim3(unsigned(p.F / kRows), unsigned(capacity)),
             dim3(kThreads), size_t(kBytes), stream, p);
  return true;
}

}  // namespace tern::cuda
