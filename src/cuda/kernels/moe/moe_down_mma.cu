// The batched decode step's MoE down + weighted sum + residual (hidden[t] += Σ_{s<8} w[t][s]·(Wd[e_s]·h[t][s]) +
// shared_gate[t]·(Wd_shared·h[t][8])) on the integer tensor cores, one token per block: see moe_down_mma.cuh.
// F = 512 columns (kSeg = 9 segments: 8 routed experts, then the shared one), D rows a multiple of 16, k = 8.
//
// What must match. The one-token kernel (moe_down_dp4a_kernel; moe_down_ring_kernel is the same per token) gives
// output row r of token t as follows: lane l of a warp owns columns [16·l, 16·l + 16) (words 2l, 2l + 1) of each
// segment's 512; its leaf is
//   leaf_l = 0; for s = 0..8: leaf_l = fmaf(scale·sig_s, float(dh·256 + dl), leaf_l); leaf_l = fmaf(bias, sx_s, leaf_l)
// with dh, dl the exact Σ q·hi, Σ q·lo over the lane's 16 columns (h[t][s] quantised per group of 64 to 16 bits,
// quantize_block), scale, bias the bf16 pair of row r's group l/4 in segment s's matrix, sig_s = coef_s·σ (σ = m/32639
// of the activations' group, coef_s the routing weight w[t][s] or, for s = 8, the shared gate), sx_s = sig_s·float(Σv
// of the lane's 16 columns) (down_lane_coefficients); then warp_sum (xor butterfly 16, 8, 4, 2, 1) and lane 0 writes
// hidden[r] = hid + sum. Here every value is made the same way: the integers dh, dl by mma.sync m16n8k32 (u8 weight
// nibbles × s8 activation bytes, exact; the accumulators started at the bits of 1.5·2^23, |Σ| ≤ 16·15·128 < 2^22, so
// each reads as the float 1.5·2^23 + Σ exactly), dot = fmaf(dh, 256, dl) (|dh·256 + dl| ≤ 16·15·32639 < 2^24: exact,
// as float(int) is), sig_s and sx_s by the prep kernel with the same operations in the same order on the same
// quantize_word outputs, the leaf's chain in segment order in one thread, and the leaves summed by warp_sum itself
// with leaf l in lane l. So each hidden row is bit for bit the token's one-token value.
//
// Work split. Launch 1 (moe_down_mma_prep_kernel, B blocks of 576 threads): block t quantises token t's 9 rows of h
// once (thread = word, quantize_word as quantize_block does it) into the scratch's tables: xq [B][9·64] uint4 {even hi,
// odd hi, even lo, odd lo} per word, ss [B][9][32] float2 {sig_s, sx_s} per lane position. Launch 2
// (moe_down_mma_kernel, grid (D/16, B), 256 threads): block (x, t) takes rows [16x, 16x + 16) of token t. Its 9
// segments' 16-row tiles (16 rows × 16 half-groups of 32 columns, 16-byte chunks swizzled: half-group j of row r at
// slot j ^ (r & 7); and the rows' scales and biases) are copied by cp.async, one commit group per segment (the shared
// expert's copies are issued first, before the routing is known, and travel in segment 0's group), so that segment s
// is multiplied while the later ones land; the token's tables (11.5 KB, all of it used by the block's warps) follow
// with segment 0 (routing not known early) or after all nine (early routing: the weights were issued before
// pdl_wait, while gate_up finished). 55 KB of shared memory: four blocks an SM. Warp w owns half-groups X = w and Y = w + 8 (lane positions 2X, 2X + 1,
// 2Y, 2Y + 1) of every segment: per segment one ldmatrix_x4 (X rows 0-7, 8-15, Y rows 0-7, 8-15) and two MMAs into
// the same accumulators, and each thread keeps two leaves (rows g, g + 8 of one position) across the 9 segments. The
// 512 leaves go to shared memory [16 rows][32 positions]; warp w then sums rows 2w, 2w + 1 with warp_sum (leaf l in
// lane l) and lane 0 writes hidden.
//
// Fragments (m16n8k32, thread g = lane/4, c = lane%4): A holds (row g, k 4c..4c+3), (row g+8, same), (row g,
// k 16+4c..), (row g+8, same): word c of the half-group's row, its even nibbles (w & 0x0F0F0F0F) at k 4c.., the odd
// ones ((w >> 4) & 0x0F0F0F0F) at k 16+4c... So k-blocks c = 0, 1 (k 0..7, 16..23) are the 16 columns of words 0, 1
// (lane position 2j of half-group j: "part A") and c = 2, 3 those of words 2, 3 (position 2j + 1, "part B"). B holds
// (k 4c.., n g), (k 16+4c.., n g); its 8 columns are used as: n = 0: X's hi bytes on part A's k (zero on part B's),
// n = 1: X's lo bytes on part A, n = 2: X hi on part B, n = 3: X lo on part B; n = 4..7 the same for Y. The MMA of X
// has zeros in columns 4..7 and that of Y zeros in 0..3, so with both added into one accumulator D holds (row g, n 2c),
// (row g, n 2c + 1), (row g + 8, n 2c), (row g + 8, n 2c + 1) = dh, dl of rows g, g + 8 for position
// 2·(c < 2 ? X : Y) + (c & 1): thread (g, c) supplies word c's {even, odd} hi (or lo, g odd) pair of half-group
// (g < 4 ? X : Y) where c / 2 == (g / 2) % 2, else zeros.
#include "cuda/kernels/moe/moe_down_mma.cuh"

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/moe/moe_dp4a_parts.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {

using moe_parts::kDownCols;  // F = 512
using moe_parts::kSeg;       // 9
using moe_parts::kTopK;      // 8
using moe_parts::pick;
using moe_parts::Q4;

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 16;                 // output rows of a block
constexpr int kWords = kDownCols / 8;     // 64 words of a segment row
constexpr int kHG = kDownCols / 32;       // 16 half-groups of a segment row
constexpr int kGroups = kDownCols / 64;   // 8 groups of 64
constexpr int kPos = 32;                  // lane positions of the one-token kernel
constexpr int kTokWords = kSeg * kWords;  // 576 words of a token's h (one prep thread each)
constexpr uint32_t kMagicBits = 0x4B400000u;  // 1.5·2^23
constexpr float kMagic = 12582912.0f;

// Shared memory of the product's block, bytes from the start: per segment a stage of its 16-row tile.
constexpr int kStageWords = kRows * kHG * 16;              // 4096: [16 rows][16 half-groups] of 16 B, swizzled
constexpr int kStageScales = kStageWords;                  // bf16 [16 rows][8 groups]
constexpr int kStageBiases = kStageScales + kRows * kGroups * 2;
constexpr int kStage = kStageBiases + kRows * kGroups * 2;  // 4608
constexpr int kTabXq = kSeg * kStage;                      // the token's xq: uint4 [576 words]
constexpr int kTabSs = kTabXq + kTokWords * 16;            // the token's ss: float2 [9 segments][32 positions]
constexpr int kLeafStride = kPos + 1;                      // floats per row of the leaves (padded)
constexpr int kLeaves = kTabSs + kSeg * kPos * 8;          // float [16 rows][kLeafStride]
constexpr int kBytes = kLeaves + kRows * kLeafStride * 4;  // 55,104: four blocks an SM on Hopper
constexpr int kChunks = kRows * kHG + 2 * kRows;           // 16-byte copies of a stage: 256 words, 16 + 16 scales/biases
constexpr int kTabChunks = (kTokWords * 16 + kSeg * kPos * 8) / 16;  // 720: the token's tables
static_assert(kStage % 16 == 0 && kTabXq % 16 == 0 && kTabSs % 16 == 0 && kLeaves % 16 == 0, "16-byte aligned");
static_assert(kGroups * 2 == 16, "a row's scales are one 16-byte chunk");
static_assert(kChunks <= 2 * kThreads, "two copies a thread per stage at most");
static_assert(kWarps * 2 == kHG, "warp w owns half-groups w and w + 8");

struct MmaDownParams {
  Q4 down, sdown;
  int D = 0, row_words = 0, gpr = 0, E = 0, B = 0;
  const int* ids = nullptr;            // [B][8]
  const float* w = nullptr;            // [B][8] routing weights
  const float* shared_gate = nullptr;  // [B]
  const float* h = nullptr;            // [B][9][512]
  float* hidden = nullptr;             // [B][D]
  bool early_routing = false;          // ids complete before this launch: read them before pdl_wait
  // The scratch (MoeDecodeScratch::mma_down) for B tokens: see tables_of.
  uint4* xq = nullptr;   // [B][576] {even hi, odd hi, even lo, odd lo} per word of h
  float2* ss = nullptr;  // [B][9][32] {sig_s, sx_s} per lane position
};

int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

int64_t tables_bytes(int B) { return align256(int64_t(B) * kTokWords * 16) + align256(int64_t(B) * kSeg * kPos * 8); }

void tables_of(void* base, int B, MmaDownParams& p) {
  uint8_t* at = static_cast<uint8_t*>(base);
  p.xq = reinterpret_cast<uint4*>(at);
  at += align256(int64_t(B) * kTokWords * 16);
  p.ss = reinterpret_cast<float2*>(at);
}

// Block t: token t's tables (thread = word of its 9 rows of h; the 8 words of a group of 64 are 8 consecutive lanes,
// as quantize_block has them). sig_s = coef_s·σ and sx_s = sig_s·float(Σv of the position's two words), as
// down_lane_coefficients makes them from quantize_block's xsig (m / kQMax) and xsum.
__global__ void __launch_bounds__(kTokWords) moe_down_mma_prep_kernel(const MmaDownParams p) {
  pdl_wait();  // h comes from gate_up, the routing from the router; the previous layer's product may read the tables
  // The product may start now: it issues its weight copies and waits in its pdl_wait for this grid to complete.
  pdl_trigger();
  const int t = int(blockIdx.x), word = int(threadIdx.x), s = word / kWords;
  const float4* x = reinterpret_cast<const float4*>(p.h + int64_t(t) * kSeg * kDownCols);
  const float4 a = x[2 * word], b = x[2 * word + 1];
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  int sumv = 0;
  float m = 0.0f;
  const uint4 q = dp4a::quantize_word(v, sumv, m);
  p.xq[int64_t(t) * kTokWords + word] = q;
  const int sum2 = sumv + __shfl_xor_sync(0xffffffffu, sumv, 1);  // the position's two words (integers: exact)
  if ((word & 1) == 0) {
    const float sigma = m / dp4a::qmax<false>();  // quantize_block's xsig
    const float coef = s < kTopK ? p.w[t * kTopK + s] : p.shared_gate[t];
    const float sig = coef * sigma;
    p.ss[(int64_t(t) * kSeg + s) * kPos + (word % kWords) / 2] = make_float2(sig, sig * float(sum2));
  }
}

// Issues segment s's copies for rows [row0, row0 + 16): matrix M's expert e (16-byte chunks; thread t takes chunks t
// and t + 256).
__device__ __forceinline__ void issue_segment(const MmaDownParams& p, uint8_t* smem, int s, const Q4& M, int64_t e,
                                              int row0) {
  uint8_t* st = smem + s * kStage;
#pragma unroll
  for (int i = int(threadIdx.x); i < kChunks; i += kThreads) {
    if (i < kRows * kHG) {
      const int r = i / kHG, j = i % kHG;
      const uint32_t* src = M.words + e * M.expert_words + int64_t(row0 + r) * p.row_words + j * 4;
      cp_async_16(smem_addr(st + (r * kHG + (j ^ (r & 7))) * 16), src, 16u);
    } else {
      const int r = (i - kRows * kHG) % kRows;
      const bool bias = i - kRows * kHG >= kRows;
      const uint16_t* src = (bias ? M.biases : M.scales) + e * M.expert_groups + int64_t(row0 + r) * p.gpr;
      cp_async_16(smem_addr(st + (bias ? kStageBiases : kStageScales) + r * 16), src, 16u);
    }
  }
}

// Copies token t's tables (written by the prep kernel: after pdl_wait) to kTabXq, kTabSs (contiguous, as in the
// scratch: xq then ss).
__device__ __forceinline__ void issue_tables(const MmaDownParams& p, uint8_t* smem, int t) {
  const uint8_t* xq = reinterpret_cast<const uint8_t*>(p.xq + int64_t(t) * kTokWords);
  const uint8_t* ss = reinterpret_cast<const uint8_t*>(p.ss + int64_t(t) * kSeg * kPos);
#pragma unroll
  for (int i = int(threadIdx.x); i < kTabChunks; i += kThreads) {
    const int b = i * 16;
    cp_async_16(smem_addr(smem + kTabXq + b), b < kTokWords * 16 ? xq + b : ss + (b - kTokWords * 16), 16u);
  }
}

// d = magic + a · b, and d += a · b (u8 × s8 -> s32), m16n8k32.
__device__ __forceinline__ void mma_from_magic(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kMagicBits));
}
__device__ __forceinline__ void mma_add(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float unmagic(int d) { return __int_as_float(d) - kMagic; }

// The bf16 at byte offset `at` of shared memory as a float (scale_of / bias_of of the packed pair).
__device__ __forceinline__ float bf16_at(const uint8_t* at) {
  return __uint_as_float(uint32_t(*reinterpret_cast<const uint16_t*>(at)) << 16);
}

// Waits, in every thread, for segment s's copies and the tables (see the kernel's commit groups).
template <int S>
__device__ __forceinline__ void wait_segment(bool early) {
  if (early) {
    if (S == 0) cp_async_wait<0>();  // the tables are the last group
  } else {
    cp_async_wait<kSeg - 1 - S>();
  }
}

__global__ void __launch_bounds__(kThreads, 4) moe_down_mma_kernel(const MmaDownParams p) {
  extern __shared__ __align__(16) uint8_t smem[];  // kBytes
  __shared__ int ids_s[kTopK];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = int(blockIdx.x) * kRows, t = int(blockIdx.y);
  // Commit groups. Routing known early: 0 .. 7 the weights of segments 0 .. 7 (the shared expert's, issued first,
  // in group 0), 8 the tables (after pdl_wait): segment 0 waits for all. Otherwise: 0 the shared expert's weights,
  // the tables and segment 0's weights, 1 .. 7 segments 1 .. 7, 8 empty: segment s waits for groups 0 .. s.
  const bool early = p.early_routing;
  issue_segment(p, smem, kTopK, p.sdown, 0, row0);  // the shared expert's tile needs no routing
  if (!early) pdl_wait();
  if (int(threadIdx.x) < kTopK) {
    const int e = __ldcg(p.ids + t * kTopK + threadIdx.x);  // L2: written by another kernel
    ids_s[threadIdx.x] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  if (!early) issue_tables(p, smem, t);
#pragma unroll 1
  for (int s = 0; s < kTopK; ++s) {
    issue_segment(p, smem, s, p.down, ids_s[s], row0);
    cp_async_commit();
  }
  if (early) {
    pdl_wait();  // the tables come from the prep kernel (after gate_up), hidden from before
    issue_tables(p, smem, t);
  }
  cp_async_commit();
  pdl_trigger();

  // This thread's B fragments: word c of half-group hb's {even, odd} hi (g even) or lo (g odd) pair where part c / 2
  // is column g's part ((g / 2) % 2), zeros elsewhere; its leaves' position pos.
  const int X = warp, Y = warp + kWarps;
  const int hb = g < 4 ? X : Y;
  const bool live = (c >> 1) == ((g >> 1) & 1);
  const int pos = 2 * (c < 2 ? X : Y) + (c & 1);
  const uint2* xq = reinterpret_cast<const uint2*>(smem + kTabXq);
  const float2* ss = reinterpret_cast<const float2*>(smem + kTabSs);
  // The residual of rows row0 + 2·warp + i (lane 0 of each warp; an earlier kernel writes it).
  float hid[2] = {0.0f, 0.0f};
  if (lane == 0) {
    hid[0] = __ldcg(p.hidden + int64_t(t) * p.D + row0 + 2 * warp);
    hid[1] = __ldcg(p.hidden + int64_t(t) * p.D + row0 + 2 * warp + 1);
  }

  // ldmatrix: lane L gives row (L & 7) + 8·((L >> 3) & 1) of half-group X (L < 16) or Y (L >= 16)
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1), hl = lane < 16 ? X : Y;
  const uint32_t lm = uint32_t((mrow * kHG + (hl ^ (mrow & 7))) * 16);
  const int grp = (pos >> 2) * 2;  // byte offset of the position's group (pos / 4) in a row's bf16s
  float leaf[2] = {0.0f, 0.0f};    // rows g, g + 8 at position pos
#pragma unroll 1
  for (int s = 0; s < kSeg; ++s) {
    switch (s) {  // segment s's copies (and the tables) have landed, in every thread's
      case 0: wait_segment<0>(early); break;
      case 1: wait_segment<1>(early); break;
      case 2: wait_segment<2>(early); break;
      case 3: wait_segment<3>(early); break;
      case 4: wait_segment<4>(early); break;
      case 5: wait_segment<5>(early); break;
      case 6: wait_segment<6>(early); break;
      case 7: wait_segment<7>(early); break;
      default: wait_segment<8>(early); break;
    }
    __syncthreads();
    const uint2 xb = live ? xq[2 * (s * kWords + 4 * hb + c) + (g & 1)] : make_uint2(0u, 0u);
    const float2 cs = ss[s * kPos + pos];  // {sig_s, sx_s}
    const uint8_t* st = smem + s * kStage;
    uint32_t wr[4];  // X rows g, g + 8; Y rows g, g + 8: word c each
    ldmatrix_x4(wr, smem_addr(st) + lm);
    const uint32_t ax[4] = {wr[0] & 0x0F0F0F0Fu, wr[1] & 0x0F0F0F0Fu, (wr[0] >> 4) & 0x0F0F0F0Fu,
                            (wr[1] >> 4) & 0x0F0F0F0Fu};
    const uint32_t ay[4] = {wr[2] & 0x0F0F0F0Fu, wr[3] & 0x0F0F0F0Fu, (wr[2] >> 4) & 0x0F0F0F0Fu,
                            (wr[3] >> 4) & 0x0F0F0F0Fu};
    int d[4];
    mma_from_magic(d, ax, g < 4 ? xb.x : 0u, g < 4 ? xb.y : 0u);
    mma_add(d, ay, g < 4 ? 0u : xb.x, g < 4 ? 0u : xb.y);
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // rows g, g + 8
      const int r = g + 8 * i;
      const float scale = bf16_at(st + kStageScales + r * 16 + grp);
      const float bias = bf16_at(st + kStageBiases + r * 16 + grp);
      // moe_down_dp4a_kernel: fmaf(scale·sig, float(dh·256 + dl), acc), then fmaf(bias, sig·Σv, acc)
      const float dot = fmaf(unmagic(d[2 * i]), 256.0f, unmagic(d[2 * i + 1]));
      leaf[i] = fmaf(scale * cs.x, dot, leaf[i]);
      leaf[i] = fmaf(bias, cs.y, leaf[i]);
    }
  }
  float* leaves = reinterpret_cast<float*>(smem + kLeaves);  // [16 rows][kLeafStride]: leaf of (row, position)
  leaves[g * kLeafStride + pos] = leaf[0];
  leaves[(g + 8) * kLeafStride + pos] = leaf[1];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 2 * warp + i;
    const float acc = warp_sum(leaves[r * kLeafStride + lane]);  // lane l: position l, as in the one-token kernel
    if (lane == 0) p.hidden[int64_t(t) * p.D + row0 + r] = hid[i] + acc;
  }
}

bool& enabled_flag() {
  static bool on = !env_is("TERN_MOE_MMA_DOWN", "0");
  return on;
}

bool rows_aligned(const DMat& m) {
  const auto al = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return al(m.data) && al(m.scales) && al(m.biases) && (m.groups_per_row * 2) % 16 == 0 && (m.row_words * 4) % 16 == 0;
}

}  // namespace

size_t moe_down_mma_scratch_bytes(int T, int64_t F, int k) {
  const int B = std::min(T, kBatchMaxTokens);
  if (B < 2 || F != kDownCols || k != kTopK) return 0;
  return size_t(tables_bytes(B));
}

bool moe_down_mma_enabled() { return enabled_flag(); }
void moe_down_mma_set_enabled(bool on) { enabled_flag() = on; }

bool moe_down_mma_supported(const MoeDecodeWeights& w, const MoeDecodeScratch& s, int B) {
  const DMat& d = w.expert_down;
  if (!moe_down_mma_enabled() || B < 2 || B > kBatchMaxTokens || !moe_down_dp4a_fits(w)) return false;
  if (d.rows % kRows != 0 || d.row_words != kWords || d.groups_per_row != kGroups || d.experts < 1) return false;
  if (!rows_aligned(d) || !rows_aligned(w.shared_down)) return false;
  const auto al = [](const void* q) { return q && (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  if (!al(s.mma_down) || !al(s.h) || !s.ids || !s.w || !s.shared_gate) return false;
  return s.mma_down_bytes >= size_t(tables_bytes(B)) && kBytes <= qtile::max_dynamic_smem();
}

bool moe_down_mma(const MoeDecodeWeights& w, float* hidden, const MoeDecodeScratch& s, bool early_routing,
                  cudaStream_t stream, int B) {
  if (!moe_down_mma_supported(w, s, B)) return false;
  TERN_CHECK(hidden != nullptr, "moe_down_mma: hidden is null");
  const DMat& d = w.expert_down;
  MmaDownParams p;
  p.down = moe_parts::q4_of(d);
  p.sdown = moe_parts::q4_of(w.shared_down);
  p.D = int(d.rows);
  p.row_words = int(d.row_words);
  p.gpr = int(d.groups_per_row);
  p.E = int(d.experts);
  p.B = B;
  p.ids = s.ids;
  p.w = s.w;
  p.shared_gate = s.shared_gate;
  p.h = s.h;
  p.hidden = hidden;
  p.early_routing = early_routing;
  tables_of(s.mma_down, B, p);
  TERN_CHECK(p.row_words == kWords && p.gpr == kGroups && p.D % kRows == 0,
             "moe_down_mma: unexpected layout (", p.D, " rows, ", p.row_words, " words, ", p.gpr, " groups)");
  launch_pdl("moe_down_mma_prep", moe_down_mma_prep_kernel, dim3(unsigned(B)), dim3(kTokWords), 0, stream, p);
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(moe_down_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
    attribute_set = true;
  }
  launch_pdl("moe_down_mma", moe_down_mma_kernel, dim3(unsigned(p.D / kRows), unsigned(B)), dim3(kThreads),
             size_t(kBytes), stream, p);
  return true;
}

}  // namespace tern::cuda
