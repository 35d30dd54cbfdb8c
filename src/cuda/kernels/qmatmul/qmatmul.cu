// Over ~800 lines in one file: gemv, the fp32 SIMT product and the split-x tensor-core kernel are the rungs that
// matmul and matmul_swiglu choose among (with the kernels of qmatmul_int8.cu and qmatmul_wgmma.cu), and they share
// that choice's helpers below.
#include "cuda/kernels/qmatmul/qmatmul.cuh"

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmatmul/matmul_tile.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"
#include "cuda/kernels/qmatmul/x_forms.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda {
namespace {

constexpr int kGemvWarps = 8;        // warps per block
constexpr int kGemvRowsPerWarp = 4;  // rows per warp: each x chunk read once serves 4 rows
constexpr int kGemvRowsPerBlock = kGemvWarps * kGemvRowsPerWarp;

// The warp's row sums: acc[r] (this lane's part of row row0 + r) summed over the lanes, written (or added) to
// y[slot][row0 + r] by lane r, for r < nrows.
__device__ __forceinline__ void gemv_store_rows(const GemvArgs& a, float (&acc)[kGemvRowsPerWarp], int64_t row0,
                                                int64_t nrows, int slot, int lane) {
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) acc[r] = warp_sum(acc[r]);
  if (lane < nrows) {
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < kGemvRowsPerWarp; ++r)
      if (lane == r) v = acc[r];
    float* y = a.y + slot * a.y_stride + row0 + lane;
    *y = a.accumulate ? *y + v : v;
  }
}

// A warp owns kGemvRowsPerWarp consecutive rows. Lane l reads the 4-bit words l, l+32, ... of each row (coalesced
// 128 B per warp per row) and the matching 8 activations once for all its rows. w = s·q + b, so each word adds
// s·Σx·q + b·Σx.
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_affine4_kernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.x) * kGemvRowsPerBlock + warp * kGemvRowsPerWarp;
  const int slot = blockIdx.y;
  if (row0 >= a.w.rows) return;
  const int64_t e = a.ids ? a.ids[slot] : 0;
  const float* x = a.x + slot * a.x_stride;
  const int64_t nrows = a.w.rows - row0 < kGemvRowsPerWarp ? a.w.rows - row0 : kGemvRowsPerWarp;
  const uint32_t* words[kGemvRowsPerWarp];
  const uint16_t *sc[kGemvRowsPerWarp], *bi[kGemvRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) {
    const int64_t rr = e * a.w.rows + row0 + (r < nrows ? r : 0);
    words[r] = static_cast<const uint32_t*>(a.w.data) + rr * a.w.row_words;
    sc[r] = a.w.scales + rr * a.w.groups_per_row;
    bi[r] = a.w.biases + rr * a.w.groups_per_row;
  }
  const int words_per_group = a.w.group_size / 8;
  float acc[kGemvRowsPerWarp] = {};
#pragma unroll 2
  for (int64_t w = lane; w < a.w.row_words; w += 32) {
    const float4 x0 = *reinterpret_cast<const float4*>(x + w * 8), x1 = *reinterpret_cast<const float4*>(x + w * 8 + 4);
    const float sx = x0.x + x0.y + x0.z + x0.w + x1.x + x1.y + x1.z + x1.w;
    const int64_t g = w / words_per_group;
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      const uint32_t q = words[r][w];
      const float sxq = x0.x * float(q & 15u) + x0.y * float((q >> 4) & 15u) + x0.z * float((q >> 8) & 15u) +
                        x0.w * float((q >> 12) & 15u) + x1.x * float((q >> 16) & 15u) +
                        x1.y * float((q >> 20) & 15u) + x1.z * float((q >> 24) & 15u) + x1.w * float(q >> 28);
      acc[r] += bf16_bits_to_float(sc[r][g]) * sxq + bf16_bits_to_float(bi[r][g]) * sx;
    }
  }
  gemv_store_rows(a, acc, row0, nrows, slot, lane);
}

// Other formats: lane l reads the 8-element chunks l, l+32, ... of each of the warp's rows.
template <WeightFormat F>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_generic_kernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.x) * kGemvRowsPerBlock + warp * kGemvRowsPerWarp;
  const int slot = blockIdx.y;
  if (row0 >= a.w.rows) return;
  const int64_t e = a.ids ? a.ids[slot] : 0;
  const float* x = a.x + slot * a.x_stride;
  const int64_t nrows = a.w.rows - row0 < kGemvRowsPerWarp ? a.w.rows - row0 : kGemvRowsPerWarp;
  float acc[kGemvRowsPerWarp] = {};
  for (int64_t c = int64_t(lane) * 8; c < a.w.cols; c += 256) {
    const float4 x0 = *reinterpret_cast<const float4*>(x + c), x1 = *reinterpret_cast<const float4*>(x + c + 4);
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      float wv[8];
      dmat_load8<F>(a.w, e, row0 + (r < nrows ? r : 0), c, wv);
      acc[r] += wv[0] * x0.x + wv[1] * x0.y + wv[2] * x0.z + wv[3] * x0.w + wv[4] * x1.x + wv[5] * x1.y +
                wv[6] * x1.z + wv[7] * x1.w;
    }
  }
  gemv_store_rows(a, acc, row0, nrows, slot, lane);
}

// ---- fp32 SIMT product (every format; the fallback) ----------------------------------------------------------
// 64 weight rows × 64 tokens per block, k-steps of 32; each of 256 threads owns a 4×4 output patch.
constexpr int BN = 64, BT = kMatmulTileTokens, BK = 32;

template <WeightFormat F>
__global__ void __launch_bounds__(256) matmul_simt_kernel(MatmulArgs a) {
  __shared__ float ws[BK][BN + 4];
  __shared__ float xs[BK][BT + 4];
  __shared__ int xrow[BT];
  const int tid = threadIdx.x;
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  int64_t expert, p0, count;
  if (!mm::token_tile(a, BT, expert, p0, count)) return;  // (launched without PDL: its pdl_wait is a no-op)
  if (tid < BT) xrow[tid] = tid < count ? (a.gather ? a.gather[p0 + tid] : int(p0 + tid)) : -1;
  __syncthreads();

  const int tx = tid % 16, ty = tid / 16;
  float acc[4][4] = {};
  const int lrow = tid / 4, lc8 = (tid % 4) * 8;  // weight chunk this thread loads
  for (int64_t k0 = 0; k0 < a.w.cols; k0 += BK) {
    {
      float wv[8];
      if (n0 + lrow < a.w.rows) {
        dmat_load8<F>(a.w, expert, n0 + lrow, k0 + lc8, wv);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) ws[lc8 + j][lrow] = wv[j];
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int idx = tid + i * 256, t = idx / 8, k4 = (idx % 8) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (xrow[t] >= 0) v = *reinterpret_cast<const float4*>(a.x + int64_t(xrow[t]) * a.ldx + k0 + k4);
      xs[k4][t] = v.x;
      xs[k4 + 1][t] = v.y;
      xs[k4 + 2][t] = v.z;
      xs[k4 + 3][t] = v.w;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < BK; ++k) {
      const float4 wv = *reinterpret_cast<const float4*>(&ws[k][tx * 4]);
      const float4 xv = *reinterpret_cast<const float4*>(&xs[k][ty * 4]);
      const float wa[4] = {wv.x, wv.y, wv.z, wv.w}, xa[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += wa[i] * xa[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int t = ty * 4 + j;
    if (t >= count) continue;
    float* yr = a.y + (p0 + t) * a.ldy;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + tx * 4 + i;
      if (n < a.w.rows) yr[n] = a.accumulate ? yr[n] + acc[i][j] : acc[i][j];
    }
  }
}


// ---- 4-bit product on the tensor cores (mma.sync m16n8k16, bf16 × bf16 -> fp32) ------------------------------
//
// Swap-AB: weight rows are the MMA's M side, tokens its N side, so a grouped tile of few tokens still fills M.
// A block computes kRows weight rows × kTokens tokens, one quantisation group (64 k) per pipeline step. Each step's
// packed words, scale/bias pairs and x tile travel global -> shared together with cp.async, kStages deep, with one
// barrier per step:
//   - x prepared by matmul_prepare_x (MatmulArgs::x_prep): the copy lands in the MMA layout (hi, lo, Σx);
//   - x fp32: the fp32 tile lands in the stage; at the end of step s the thread that copied a chunk splits its
//     chunks of step s + 1 into one of two x buffers (no barrier needed: its own copies), which the next step's
//     barrier publishes; the 8 threads of a token's chunks add their Σx by shuffles.
//
// Accuracy (the "exact" kernel). A = q − 8: the nibble as the bf16 128 + q (magic number), minus 136, exact. B = hi
// and lo of x, each bf16: x' = hi + lo is exact in fp32 and within 2^-16 |x| of x (rms ~2^-18). Per group a fresh
// accumulator tmp receives, per k-step, the MMAs of hi and of lo (8 MMAs per group), so tmp = Σ(q − 8)·x' (products exact, fp32
// sums); then, in fp32, acc += s·tmp + (b + 8s)·Σx' with Σx' the fp32 sum of the same hi + lo values. That is
// Σ (s·q + b)·x' exactly up to fp32 summation: the weights are exact and x is perturbed by ≤ 2^-16 relative.
// Centring q (q − 8 instead of q) keeps tmp and the bias term small, so their fp32 roundings stay small too.
// The legacy kernel (Exact = false, MatmulTile::tc_bf16) is the previous one: A = bf16(s·q + b), B = bf16(x), MMAs
// straight into acc.
//
// Each warp owns 16·kMTiles rows × 8·kNTiles tokens: it turns its rows' nibbles into A fragments in registers, and
// each A fragment serves kNTiles × 2 MMAs (hi and lo).
//
// The k order inside an MMA is free as long as A and B agree. Thread (g = lane/4, t = lane%4) takes word 2t + h of
// the group (h = 0, 1: k = 16t + 8h .. +7) for the two MMA k-steps j = 2h, 2h + 1, and its magic-number dequant
// yields the element pairs (e, e + 4) of a word in one bf16x2 register. So the k-slots (2t, 2t+1) of k-step j hold
// the elements (2·(j%2), 2·(j%2) + 4) of word 2t + j/2, and the slots (2t+8, 2t+9) the elements (2·(j%2) + 1,
// 2·(j%2) + 5). x follows the same order: each 8-k chunk is stored as the bf16 pairs (0,4) (1,5) (2,6) (3,7) (the
// prepared layout in global memory too), so thread t's B fragments of k-steps 2h and 2h+1 are the 16 bytes of chunk
// 2t + h of its token (hi tile, and the same place of the lo tile). In shared memory chunks are XOR-swizzled by token
// (chunk c of token n lives at c ^ (n % 8)): the 16-byte loads and stores are free of bank conflicts.
//
// Every shape sums each output in the same order (groups in order; within a group the k-steps 0..3, hi before lo),
// and both x sources give the same hi, lo and Σx bits, so all shapes and both x sources give bit-identical results.
namespace tc {

constexpr int kStepK = 64;  // k per pipeline step: one quantisation group

template <int MTiles, int NTiles, int WarpsM, int WarpsN, int MinBlocks>
struct Shape {
  static constexpr int kMinBlocks = MinBlocks;  // blocks per SM the register budget must allow
  static constexpr int kMTiles = MTiles, kNTiles = NTiles, kWarpsM = WarpsM;
  static constexpr int kRows = 16 * MTiles * WarpsM;    // weight rows per block
  static constexpr int kTokens = 8 * NTiles * WarpsN;   // tokens per block
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kXChunks = kTokens * 8 / kThreads;   // 8-k x chunks each thread copies per step
  static constexpr int kWordCopies = kRows * 2 / kThreads;  // 16-byte word copies each thread issues per step
  static constexpr int kPairCopies = (kRows + kThreads - 1) / kThreads;  // 4-byte scale (and bias) pair copies
  // Weights of one step in shared memory: words [kRows][8] uint32, then scale pairs [kRows], bias pairs [kRows].
  static constexpr int kWBytes = kRows * 32 + kRows * 8;
  static_assert(kTokens * 8 % kThreads == 0 && kRows * 2 % kThreads == 0, "copies must divide evenly");
  static_assert(kThreads % 8 == 0 && kWBytes % 16 == 0, "x chunks by 8 threads per token, 16-byte aligned");
  static_assert(kTokens <= kThreads, "one thread per token copies the prepared Σx");
};

// Shared memory of a shape for one x source (XB: prepared by matmul_prepare_x; otherwise fp32, split in the block)
// and one precision (Exact: hi, lo and Σx; legacy: bf16 x only).
template <class S, bool XB, bool Exact>
struct Plan {
  static_assert(Exact || !XB, "the legacy kernel converts x itself");
  static constexpr int kStages = XB ? 4 : 3;
  static constexpr int kTileBytes = S::kTokens * kStepK * 2;  // one bf16 x tile [kTokens][8] uint4 (hi or lo)
  static constexpr int kXBytes = Exact ? 2 * kTileBytes + S::kTokens * 4 : kTileBytes;  // hi, lo, Σx [kTokens]
  static constexpr int kXSlotBytes = XB ? kXBytes : S::kTokens * kStepK * 4;            // x of one step as copied
  static constexpr int kSlotBytes = S::kWBytes + kXSlotBytes;                           // one pipeline stage
  static constexpr size_t kSmem = size_t(kStages) * kSlotBytes + (XB ? 0 : 2 * size_t(kXBytes));
  static_assert(kXBytes % 16 == 0 && kSlotBytes % 16 == 0, "16-byte aligned regions");
};

// Full 16 bytes (.cg) and 4 bytes (.ca) without zero-fill; commit, wait, the mma and lop3 are common/ptx.cuh's.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}

using xform::bf16x2_hi;
using xform::bf16x2_lo;
using xform::pack_bf16x2;
using xform::pack_chunk;
using xform::split_chunk;
using xform::sum8;

__device__ __forceinline__ uint32_t bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t nibble_magic(uint32_t v) {
  return lop3_and_or(v, 0x000f000fu, 0x43004300u);  // bf16x2 {128 + q0, 128 + q4}
}

// Nibbles 0 and 4 of `v` (bits 0-3 and 16-19) -> bf16x2 q − 8, exact (128 + q − 136).
__device__ __forceinline__ uint32_t centred_pair(uint32_t v) {
  return bf16x2_fma(nibble_magic(v), 0x3f803f80u, 0xc308c308u);
}

// Legacy: nibbles 0 and 4 -> bf16x2 s·q + b (one rounding: 128 + q − 128 is exact).
__device__ __forceinline__ uint32_t dequant_pair(uint32_t v, uint32_t s2, uint32_t b2) {
  const uint32_t q = bf16x2_fma(nibble_magic(v), 0x3f803f80u, 0xc300c300u);  // m·1 − 128
  return bf16x2_fma(q, s2, b2);
}

// d = a · b (C = 0): mma_bf16_16816 (common/ptx.cuh) with a zero accumulator, A 16×16 row-major (4 regs), B 16×8
// column-major (2 regs), D 16×8 fp32.
__device__ __forceinline__ void mma_bf16_16816_zero(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// SwiGLU: `up` has a.w's shape; the block's rows are half gate rows, half the matching up rows (in each warp the
// first kMTiles/2 row tiles are gate, the others the same rows of up), and the epilogue writes
// silu(gate) · up for kRows/2 output rows.
template <class S, bool XB, bool SwiGLU, bool Exact>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks) matmul_affine4_tc_kernel(MatmulArgs a, DMat up) {
  static_assert(!SwiGLU || S::kMTiles % 2 == 0, "SwiGLU pairs gate and up row tiles");
  using P = Plan<S, XB, Exact>;
  constexpr int kStages = P::kStages;
  constexpr int MT = S::kMTiles, NT = S::kNTiles;
  constexpr int kParts = Exact ? 2 : 1;                       // B terms: hi (and lo)
  constexpr int kOutRows = SwiGLU ? S::kRows / 2 : S::kRows;  // output rows per block
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = warp % S::kWarpsM, wn = warp / S::kWarpsM;
  const int64_t row0 = int64_t(blockIdx.x) * kOutRows;
  const bool grouped = a.tile_expert != nullptr;

  int64_t expert, p0, count;
  if (!mm::token_tile(a, S::kTokens, expert, p0, count)) return;
  // Block row i -> (matrix, row).
  auto source = [&](int i, const DMat*& m) { return mm::block_row_source<SwiGLU, MT>(a, up, row0, expert, i, m); };
  const uint32_t* wsrc[S::kWordCopies];
#pragma unroll
  for (int c = 0; c < S::kWordCopies; ++c) {
    const int i = tid + c * S::kThreads;
    const DMat* m;
    const int64_t r = source(i / 2, m);
    wsrc[c] = static_cast<const uint32_t*>(m->data) + r * a.w.row_words + (i % 2) * 4;
  }
  const uint16_t* ssrc[S::kPairCopies];
  const uint16_t* bsrc[S::kPairCopies];
#pragma unroll
  for (int c = 0; c < S::kPairCopies; ++c) {
    const int i = tid + c * S::kThreads < S::kRows ? tid + c * S::kThreads : S::kRows - 1;
    const DMat* m;
    const int64_t r = source(i, m);
    ssrc[c] = m->scales + r * a.w.groups_per_row;
    bsrc[c] = m->biases + r * a.w.groups_per_row;
  }
  auto stage = [&](int step) { return smem + (step % kStages) * P::kSlotBytes; };
  auto issue_weights = [&](int step) {
    uint32_t* words = reinterpret_cast<uint32_t*>(stage(step));
    uint32_t* spairs = words + S::kRows * 8;
    uint32_t* bpairs = spairs + S::kRows;
#pragma unroll
    for (int c = 0; c < S::kWordCopies; ++c) {
      const int i = tid + c * S::kThreads;
      cp_async16(words + (i / 2) * 8 + (i % 2) * 4, wsrc[c] + step * 8);
    }
#pragma unroll
    for (int c = 0; c < S::kPairCopies; ++c) {
      const int i = tid + c * S::kThreads;
      if (i < S::kRows) {  // the aligned pair of groups holding group `step`
        cp_async4(spairs + i, ssrc[c] + (step & ~1));
        cp_async4(bpairs + i, bsrc[c] + (step & ~1));
      }
    }
  };

  const int steps = int(a.w.cols / kStepK);
  // Weights are launch constants: in dense mode the pipeline starts filling before waiting on the previous kernel.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < steps) issue_weights(s);
  if (!grouped) pdl_wait();

  // x: thread copies chunk (tid % 8) of tokens tid / 8 + m · kThreads / 8; tokens past the tile have no source.
  // Prepared x: the chunk's hi at +0 of the group's 256 bytes (lo at +128); thread tid < count copies token tid's Σx.
  const int xchunk = tid % 8;
  const int64_t prow = matmul_prepared_row_bytes(a.w.cols);
  auto x_row = [&](int n) { return a.gather ? int64_t(a.gather[p0 + n]) : p0 + n; };
  // The source of each of this thread's chunks. Prepared x: the chunk's address in step 0 (nullptr: past the tile).
  // fp32 x: the x row (−1: past the tile), kept as a 32-bit row number (registers are scarce; the address is formed
  // at each copy).
  const unsigned char* const prep = static_cast<const unsigned char*>(a.x_prep);
  std::conditional_t<XB, const unsigned char*, int> xsrc[S::kXChunks];
#pragma unroll
  for (int m = 0; m < S::kXChunks; ++m) {
    const int n = tid / 8 + m * (S::kThreads / 8);
    if constexpr (XB) {
      xsrc[m] = n < count ? prep + x_row(n) * prow + xchunk * 16 : nullptr;
    } else {
      xsrc[m] = n < count ? int(x_row(n)) : -1;
    }
  }
  auto has_x = [&](int m) {
    if constexpr (XB) {
      return xsrc[m] != nullptr;
    } else {
      return xsrc[m] >= 0;
    }
  };
  const float* sxsrc = nullptr;
  if constexpr (XB) {
    if (tid < count) sxsrc = reinterpret_cast<const float*>(prep + x_row(tid) * prow + a.w.cols * 4);
  }
  // Position of this thread's chunk m in a bf16 x tile [kTokens][8] uint4 (swizzled).
  auto xpos = [&](int m) {
    const int n = tid / 8 + m * (S::kThreads / 8);
    return n * 8 + (xchunk ^ (n % 8));
  };
  auto issue_x = [&](int step) {
    unsigned char* xs = stage(step) + S::kWBytes;
#pragma unroll
    for (int m = 0; m < S::kXChunks; ++m) {
      if (!has_x(m)) continue;
      if constexpr (XB) {
        const unsigned char* src = xsrc[m] + step * 256;
        cp_async16(reinterpret_cast<uint4*>(xs) + xpos(m), src);
        cp_async16(reinterpret_cast<uint4*>(xs + P::kTileBytes) + xpos(m), src + 128);
      } else {  // fp32 staging [2·kXChunks][kThreads] float4: chunk m is float4s 2m and 2m+1 of column tid
        const float* src = a.x + int64_t(xsrc[m]) * a.ldx + step * kStepK + xchunk * 8;
        float4* f = reinterpret_cast<float4*>(xs);
        cp_async16(f + (2 * m) * S::kThreads + tid, src);
        cp_async16(f + (2 * m + 1) * S::kThreads + tid, src + 4);
      }
    }
    if constexpr (XB) {
      if (sxsrc) cp_async4(reinterpret_cast<float*>(xs + 2 * P::kTileBytes) + tid, sxsrc + step);
    }
  };
  if constexpr (XB) {
    // Tokens past the tile: zero chunks and sums, written once (no copy ever lands there).
    for (int s = 0; s < kStages; ++s) {
      unsigned char* xs = smem + s * P::kSlotBytes + S::kWBytes;
#pragma unroll
      for (int m = 0; m < S::kXChunks; ++m) {
        if (has_x(m)) continue;
        reinterpret_cast<uint4*>(xs)[xpos(m)] = make_uint4(0u, 0u, 0u, 0u);
        reinterpret_cast<uint4*>(xs + P::kTileBytes)[xpos(m)] = make_uint4(0u, 0u, 0u, 0u);
      }
      if (tid < S::kTokens && !sxsrc) reinterpret_cast<float*>(xs + 2 * P::kTileBytes)[tid] = 0.0f;
    }
  }
  // Commit groups: group s (s < kStages − 1) holds x(s) (group 0 also the prologue's weights); the group committed
  // in step s holds W and x of step s + kStages − 1 (empty past the end: the counts stay uniform).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue_x(s);
    cp_async_commit();
  }

  unsigned char* xbuf = smem + kStages * P::kSlotBytes;  // fp32 path: two split (or bf16) x buffers
  // fp32 path: this thread's fp32 chunks of `step` (its own copies) -> buffer step % 2; zeros past the tile. Every
  // thread calls it (the Σx shuffles).
  auto convert_x = [&](int step) {
    const float4* f = reinterpret_cast<const float4*>(stage(step) + S::kWBytes);
    unsigned char* xb = xbuf + (step % 2) * P::kXBytes;
    uint4* xh = reinterpret_cast<uint4*>(xb);
#pragma unroll
    for (int m = 0; m < S::kXChunks; ++m) {
      float4 p = make_float4(0.f, 0.f, 0.f, 0.f), q = p;
      if (has_x(m)) {
        p = f[(2 * m) * S::kThreads + tid];
        q = f[(2 * m + 1) * S::kThreads + tid];
      }
      if constexpr (Exact) {
        uint4 hi, lo;
        const float sum = sum8(split_chunk(p, q, hi, lo));
        xh[xpos(m)] = hi;
        reinterpret_cast<uint4*>(xb + P::kTileBytes)[xpos(m)] = lo;
        if (xchunk == 0) reinterpret_cast<float*>(xb + 2 * P::kTileBytes)[tid / 8 + m * (S::kThreads / 8)] = sum;
      } else {
        xh[xpos(m)] = pack_chunk(p, q);
      }
    }
  };
  if constexpr (!XB) {
    cp_async_wait<kStages - 2>();  // group 0: x(0)
    convert_x(0);
  }

  float acc[MT][NT][4];
  mm::zero_acc(acc);

  const int wrow = wm * 16 * MT + g;  // this thread's first row inside the block (then +8, +16, ...)
  const int wtok0 = wn * 8 * NT;      // the warp's first token inside the block
  const int live = mm::live_n8_tiles<NT>(count, wtok0);  // short grouped tiles skip the empty ones

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();  // this thread's copies of step `step` have landed
    __syncthreads();               // everyone's have (and the split x of the fp32 path); step − 1's stage is free
    if (step + kStages - 1 < steps) {
      issue_weights(step + kStages - 1);
      issue_x(step + kStages - 1);
    }
    cp_async_commit();

    // The step's MMAs; kFull: every n8 tile of the warp holds tokens (no per-tile tests in the hot path).
    auto compute = [&](auto full) {
      constexpr bool kFull = decltype(full)::value;
      const unsigned char* st = stage(step);
      const uint32_t* words = reinterpret_cast<const uint32_t*>(st);
      const uint32_t* spairs = words + S::kRows * 8;
      const uint32_t* bpairs = spairs + S::kRows;
      const unsigned char* xb = XB ? st + S::kWBytes : xbuf + (step % 2) * P::kXBytes;
      const uint4* xs[2] = {reinterpret_cast<const uint4*>(xb), reinterpret_cast<const uint4*>(xb + P::kTileBytes)};
      const bool odd = step & 1;  // this group is the high half of its scale/bias pair

      // A fragments of row tile mi for k-steps 2h, 2h+1: [jj][4]; rows wrow + 16·mi (+8), words 2t + h.
      auto load_a = [&](int mi, int h, uint32_t af[2][4]) {
        const int r = wrow + 16 * mi;
        const uint32_t w0 = words[r * 8 + 2 * t + h], w1 = words[(r + 8) * 8 + 2 * t + h];
        if constexpr (Exact) {
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            af[jj][0] = centred_pair(w0 >> (8 * jj));      // row g,   elements (2jj, 2jj+4)
            af[jj][1] = centred_pair(w1 >> (8 * jj));      // row g+8
            af[jj][2] = centred_pair(w0 >> (8 * jj + 4));  // row g,   elements (2jj+1, 2jj+5)
            af[jj][3] = centred_pair(w1 >> (8 * jj + 4));  // row g+8
          }
        } else {
          const uint32_t sel = odd ? 0x3232u : 0x1010u;  // bf16 of this group in both halves
          const uint32_t s0 = __byte_perm(spairs[r], 0, sel), s1 = __byte_perm(spairs[r + 8], 0, sel);
          const uint32_t b0 = __byte_perm(bpairs[r], 0, sel), b1 = __byte_perm(bpairs[r + 8], 0, sel);
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            af[jj][0] = dequant_pair(w0 >> (8 * jj), s0, b0);
            af[jj][1] = dequant_pair(w1 >> (8 * jj), s1, b1);
            af[jj][2] = dequant_pair(w0 >> (8 * jj + 4), s0, b0);
            af[jj][3] = dequant_pair(w1 >> (8 * jj + 4), s1, b1);
          }
        }
      };
      // B fragments of n8 tile ni for k-steps 2h, 2h+1: hi (and lo) chunk 2t + h of token wtok0 + 8·ni + g.
      auto load_b = [&](int ni, int h, uint4 b[kParts]) {
        const int i = (wtok0 + 8 * ni + g) * 8 + ((2 * t + h) ^ g);
#pragma unroll
        for (int p = 0; p < kParts; ++p) b[p] = xs[p][i];
      };
      // Exact: a fresh sum per group (tmp), folded into acc below; legacy: straight into acc.
      [[maybe_unused]] float tmp[Exact ? MT : 1][Exact ? NT : 1][4];
      auto target = [&](int mi, int ni) -> float* {
        if constexpr (Exact) {
          return tmp[mi][ni];
        } else {
          return acc[mi][ni];
        }
      };
      // The MMAs of k-step 2h + jj, term p, on (mi, ni). Per output the order is (h, jj, p) lexicographic.
      auto mma = [&](int mi, int ni, int h, int jj, int p, const uint32_t af[4], const uint4& b) {
        const uint32_t b0 = jj ? b.z : b.x, b1 = jj ? b.w : b.y;
        if (Exact && h == 0 && jj == 0 && p == 0) {
          mma_bf16_16816_zero(target(mi, ni), af, b0, b1);
        } else {
          mma_bf16_16816(target(mi, ni), af, b0, b1);
        }
      };

#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (NT * 4 * kParts + 8 <= MT * 8 + 4 * kParts) {
          // B fragments of all the warp's tokens held, A one row tile at a time.
          uint4 bf[NT][kParts];
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) {
            if (kFull || ni < live) {
              load_b(ni, h, bf[ni]);
            } else {
#pragma unroll
              for (int p = 0; p < kParts; ++p) bf[ni][p] = make_uint4(0u, 0u, 0u, 0u);
            }
          }
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            uint32_t af[2][4];
            load_a(mi, h, af);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj)
#pragma unroll
              for (int p = 0; p < kParts; ++p)
#pragma unroll
                for (int ni = 0; ni < NT; ++ni)
                  if (kFull || ni < live) mma(mi, ni, h, jj, p, af[jj], bf[ni][p]);
          }
        } else {
          // A fragments of all the warp's rows held, B one token tile at a time.
          uint32_t af[MT][2][4];
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) load_a(mi, h, af[mi]);
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) {
            if (kFull || ni < live) {
              uint4 b[kParts];
              load_b(ni, h, b);
#pragma unroll
              for (int jj = 0; jj < 2; ++jj)
#pragma unroll
                for (int p = 0; p < kParts; ++p)
#pragma unroll
                  for (int mi = 0; mi < MT; ++mi) mma(mi, ni, h, jj, p, af[mi][jj], b[p]);
            }
          }
        }
      }

      if constexpr (Exact) {
        // acc += s·tmp + (b + 8s)·Σx', rows g and g+8 of each row tile, tokens 2t and 2t+1 of each n8 tile.
        const float* sx = reinterpret_cast<const float*>(xb + 2 * P::kTileBytes);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          const int r = wrow + 16 * mi;
          const uint32_t sp0 = spairs[r], sp1 = spairs[r + 8], bp0 = bpairs[r], bp1 = bpairs[r + 8];
          const float s0 = odd ? bf16x2_hi(sp0) : bf16x2_lo(sp0), s1 = odd ? bf16x2_hi(sp1) : bf16x2_lo(sp1);
          const float c0 = fmaf(8.0f, s0, odd ? bf16x2_hi(bp0) : bf16x2_lo(bp0));
          const float c1 = fmaf(8.0f, s1, odd ? bf16x2_hi(bp1) : bf16x2_lo(bp1));
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) {
            if (kFull || ni < live) {
              const float2 v = *reinterpret_cast<const float2*>(sx + wtok0 + 8 * ni + 2 * t);
              float* d = acc[mi][ni];
              const float* e = tmp[mi][ni];
              d[0] = fmaf(s0, e[0], fmaf(c0, v.x, d[0]));
              d[1] = fmaf(s0, e[1], fmaf(c0, v.y, d[1]));
              d[2] = fmaf(s1, e[2], fmaf(c1, v.x, d[2]));
              d[3] = fmaf(s1, e[3], fmaf(c1, v.y, d[3]));
            }
          }
        }
      }
    };
    if (live == NT) {
      compute(std::true_type{});
    } else if (live > 0) {
      compute(std::false_type{});
    }

    if constexpr (!XB) {
      if (step + 1 < steps) {
        cp_async_wait<kStages - 2>();  // this thread's copies of step + 1 have landed
        convert_x(step + 1);           // into the buffer last read in step − 1, before this step's barrier
      }
    }
  }
  pdl_trigger();

  mm::store_warp_tile<SwiGLU>(a, acc, row0 + wm * 16 * (SwiGLU ? MT / 2 : MT), wtok0, g, t, p0, count);
}

// x (fp32 [rows, cols], row stride ld) -> the prepared layout (matmul_prepared_row_bytes per row): per group of 64
// columns the hi chunks then the lo chunks, then the groups' Σx'. One thread per 8-column chunk; the 8 chunks of a
// group lie in 8 consecutive lanes (cols % 64 == 0), which add their sums as the kernel's blocks do.
__global__ void __launch_bounds__(256) prepare_x_kernel(const float* x, int64_t ld, int64_t rows, int64_t cols,
                                                        unsigned char* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t prow = matmul_prepared_row_bytes(cols);
  mm::for_each_x_word(x, ld, rows, cols, [&](bool in, int64_t r, int64_t c, const float (&v)[8]) {
    xform::store_split_word(out + r * prow, cols, c, v, in);
  });
}

//                           MTiles NTiles WarpsM WarpsN MinBlocks
using Shape128x64 = Shape<4, 4, 2, 2, 2>;   // 128 threads, warp tile 64 rows × 32 tokens
using Shape256x64 = Shape<4, 4, 4, 2, 1>;   // 256 threads, warp tile 64 × 32
using Shape128x128 = Shape<4, 4, 2, 4, 1>;  // 256 threads, warp tile 64 × 32
using Shape256x64w = Shape<2, 8, 8, 1, 1>;  // 256 threads, warp tile 32 × 64
// The legacy kernel's shapes (bf16 operands: no tmp, so 64 × 64 warp tiles fit).
using Legacy128x64 = Shape<2, 8, 4, 1, 3>;
using Legacy256x64 = Shape<4, 8, 4, 1, 2>;
using Legacy128x128 = Shape<4, 8, 2, 2, 2>;
using Legacy256x128 = Shape<4, 8, 4, 2, 1>;
static_assert(Shape128x64::kTokens >= kMatmulTileTokens && Shape256x64::kTokens >= kMatmulTileTokens &&
                  Shape128x128::kTokens >= kMatmulTileTokens && Shape256x64w::kTokens >= kMatmulTileTokens &&
                  Legacy256x64::kTokens >= kMatmulTileTokens,
              "grouped tiles must fit one block");

int device_attribute(cudaDeviceAttr what) {
  int dev = 0, v = 0;
  TERN_CUDA(cudaGetDevice(&dev));
  TERN_CUDA(cudaDeviceGetAttribute(&v, what, dev));
  return v;
}

int sm_count() {
  static const int n = std::max(1, device_attribute(cudaDevAttrMultiProcessorCount));
  return n;
}

// Blocks per SM of one kernel instance (0: its shared memory exceeds the device's), asked once; sets the
// shared-memory opt-in. The first call of a process happens outside a capture: the runner and the workbench warm up
// first.
template <class S, bool XB, bool SwiGLU, bool Exact>
int blocks_per_sm() {
  static const int n = [] {
    constexpr size_t kSmem = Plan<S, XB, Exact>::kSmem;
    if (kSmem > size_t(smem_optin_bytes())) return 0;
    auto kernel = matmul_affine4_tc_kernel<S, XB, SwiGLU, Exact>;
    if (kSmem > 48 * 1024)
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    int b = 0;
    TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, S::kThreads, kSmem));
    return b;
  }();
  return n;
}

template <class S, bool XB, bool SwiGLU, bool Exact>
void launch(const MatmulArgs& a, const DMat& up, cudaStream_t stream) {
  auto kernel = matmul_affine4_tc_kernel<S, XB, SwiGLU, Exact>;
  const bool fits = blocks_per_sm<S, XB, SwiGLU, Exact>() > 0;
  const size_t smem = Plan<S, XB, Exact>::kSmem;
  TERN_CHECK(fits, "matmul: block shape ", S::kRows, "x", S::kTokens, " needs ", smem,
             " bytes of shared memory, more than this device has");
  const bool grouped = a.tile_expert != nullptr;
  const int64_t tiles = grouped ? a.max_tiles : (a.tokens + S::kTokens - 1) / S::kTokens;
  TERN_CHECK(tiles <= 65535, "matmul: ", tiles, " token tiles exceed the grid limit");
  const dim3 grid(blocks_for(a.w.rows, SwiGLU ? S::kRows / 2 : S::kRows), unsigned(tiles));
  const char* what = Exact ? (SwiGLU ? "matmul_swiglu (4-bit, tensor cores)" : "matmul (4-bit, tensor cores)")
                           : (SwiGLU ? "matmul_swiglu (4-bit, tensor cores, bf16 operands)"
                                     : "matmul (4-bit, tensor cores, bf16 operands)");
  launch_pdl(what, kernel, grid, dim3(S::kThreads), smem, stream, a, up);
}

template <class S, bool SwiGLU>
void launch_x(const MatmulArgs& a, const DMat& up, bool xb, cudaStream_t stream) {
  if (xb) {
    launch<S, true, SwiGLU, true>(a, up, stream);
  } else {
    launch<S, false, SwiGLU, true>(a, up, stream);
  }
}

// Estimated time of a dense product with shape S: whole waves of blocks (the last wave costs a full one), each block
// costing its rows × tokens over a per-shape efficiency and sharing its SM with the other resident blocks. Exact
// kernel: warp tiles 64 × 32 load B from shared memory once per 16 MMAs (1), 32 × 64 ones once per 8 (0.85); a
// 128-token block with fp32 x copies and splits twice the x per weight row of a 64-token one (0.9). Legacy: warp
// tiles 64 × 64: 1; 32 × 64: 0.8.
template <class S, bool XB, bool SwiGLU, bool Exact>
double dense_cost(int64_t out_rows, int64_t tokens) {
  const int bps = blocks_per_sm<S, XB, SwiGLU, Exact>();
  if (bps == 0) return 1e300;
  const int64_t blocks = int64_t(blocks_for(out_rows, SwiGLU ? S::kRows / 2 : S::kRows)) *
                         ((tokens + S::kTokens - 1) / S::kTokens);
  const int64_t slots = int64_t(sm_count()) * bps;
  const double waves = double((blocks + slots - 1) / slots);
  double eff = S::kMTiles >= 4 ? 1.0 : 0.8;
  if constexpr (Exact) eff = (S::kMTiles >= 4 ? 1.0 : 0.85) * (S::kTokens > 64 && !XB ? 0.9 : 1.0);
  return waves * bps * double(S::kRows) * double(S::kTokens) / eff;
}

template <class Tag>
struct Option {
  Tag tile;
  double cost;
};
template <class Tag>
Tag cheapest(std::initializer_list<Option<Tag>> options) {
  Option<Tag> best = *options.begin();
  for (const Option<Tag>& o : options)
    if (o.cost < best.cost * 0.999) best = o;
  return best.tile;
}

template <bool SwiGLU, bool XB>
MatmulTile pick_dense(int64_t out_rows, int64_t tokens) {
  return cheapest<MatmulTile>({
      {MatmulTile::tc256x64, dense_cost<Shape256x64, XB, SwiGLU, true>(out_rows, tokens)},
      {MatmulTile::tc128x64, dense_cost<Shape128x64, XB, SwiGLU, true>(out_rows, tokens)},
      {MatmulTile::tc128x128, dense_cost<Shape128x128, XB, SwiGLU, true>(out_rows, tokens)},
      {MatmulTile::tc256x64w, dense_cost<Shape256x64w, XB, SwiGLU, true>(out_rows, tokens)},
  });
}

// The legacy kernel with its previous automatic choice (grouped: 256x64; dense: by cost over its four shapes).
template <bool SwiGLU>
void launch_legacy(const MatmulArgs& a, const DMat& up, cudaStream_t stream) {
  if (a.tile_expert) {
    launch<Legacy256x64, false, SwiGLU, false>(a, up, stream);
    return;
  }
  enum class L { s256x128, s256x64, s128x128, s128x64 };
  const L tile = cheapest<L>({
      {L::s256x128, dense_cost<Legacy256x128, false, SwiGLU, false>(a.w.rows, a.tokens)},
      {L::s256x64, dense_cost<Legacy256x64, false, SwiGLU, false>(a.w.rows, a.tokens)},
      {L::s128x128, dense_cost<Legacy128x128, false, SwiGLU, false>(a.w.rows, a.tokens)},
      {L::s128x64, dense_cost<Legacy128x64, false, SwiGLU, false>(a.w.rows, a.tokens)},
  });
  switch (tile) {
    case L::s256x128: launch<Legacy256x128, false, SwiGLU, false>(a, up, stream); return;
    case L::s256x64: launch<Legacy256x64, false, SwiGLU, false>(a, up, stream); return;
    case L::s128x128: launch<Legacy128x128, false, SwiGLU, false>(a, up, stream); return;
    case L::s128x64: launch<Legacy128x64, false, SwiGLU, false>(a, up, stream); return;
  }
}

// Whether the tensor-core kernel can take the product.
bool takes_matrix(const DMat& w) {
  const auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  return w.format == WeightFormat::affine4 && w.group_size == kStepK && w.cols > 0 && w.cols % 128 == 0 &&
         w.row_words == w.cols / 8 && w.groups_per_row == w.cols / 64 && aligned(w.data, 16) &&
         aligned(w.scales, 4) && aligned(w.biases, 4);
}
bool takes(const MatmulArgs& a) {
  return takes_matrix(a.w) && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.ldx % 4 == 0;
}
// Whether the prepared x is given (and then that it fits the product).
bool takes_prepared(const MatmulArgs& a) {
  if (a.x_prep == nullptr) return false;
  TERN_CHECK(!a.x_prep_f16, "matmul: x_prep in fp16 hi + lo is read by the warpgroup kernel only (MatmulTile::wgmma)");
  TERN_CHECK(a.x_prep_cols == a.w.cols && reinterpret_cast<uintptr_t>(a.x_prep) % 16 == 0,
             "matmul: x_prep was prepared for ", a.x_prep_cols, " columns (the matrix has ", a.w.cols,
             ") or is not 16-byte aligned");
  return true;
}

// Launches the block shape `tile` (automatic: chosen by the shape of the product).
template <bool SwiGLU>
void launch_tile(const MatmulArgs& a, const DMat& up, MatmulTile tile, cudaStream_t stream) {
  if (tile == MatmulTile::tc_bf16) {
    launch_legacy<SwiGLU>(a, up, stream);
    return;
  }
  const bool grouped = a.tile_expert != nullptr, xb = takes_prepared(a);
  if (tile == MatmulTile::automatic || tile == MatmulTile::simt) {
    // Grouped tiles hold at most 64 tokens: one 64-token block per tile (256 rows where they fit shared memory).
    if (grouped) {
      const bool wide = xb ? blocks_per_sm<Shape256x64, true, SwiGLU, true>() > 0
                           : blocks_per_sm<Shape256x64, false, SwiGLU, true>() > 0;
      tile = wide ? MatmulTile::tc256x64 : MatmulTile::tc128x64;
    } else {
      tile = xb ? pick_dense<SwiGLU, true>(a.w.rows, a.tokens) : pick_dense<SwiGLU, false>(a.w.rows, a.tokens);
    }
  }
  switch (tile) {
    case MatmulTile::tc256x64: launch_x<Shape256x64, SwiGLU>(a, up, xb, stream); return;
    case MatmulTile::tc128x128: launch_x<Shape128x128, SwiGLU>(a, up, xb, stream); return;
    case MatmulTile::tc256x64w: launch_x<Shape256x64w, SwiGLU>(a, up, xb, stream); return;
    default: launch_x<Shape128x64, SwiGLU>(a, up, xb, stream); return;
  }
}

}  // namespace tc

}  // namespace

bool matmul_tile_fits(MatmulTile tile, bool prepared_x) {
  using namespace tc;
  const auto fits = [&](auto shape) {
    using S = decltype(shape);
    return prepared_x ? blocks_per_sm<S, true, false, true>() > 0 : blocks_per_sm<S, false, false, true>() > 0;
  };
  switch (tile) {
    case MatmulTile::automatic:
    case MatmulTile::simt: return true;
    case MatmulTile::tc128x64: return fits(Shape128x64{});
    case MatmulTile::tc256x64: return fits(Shape256x64{});
    case MatmulTile::tc128x128: return fits(Shape128x128{});
    case MatmulTile::tc256x64w: return fits(Shape256x64w{});
    case MatmulTile::tc_bf16: return blocks_per_sm<Legacy256x64, false, false, false>() > 0;  // the grouped shape
    case MatmulTile::wgmma: return matmul_wgmma_available();
  }
  return false;
}

void gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.slots <= 0 || a.w.rows == 0) return;
  const dim3 grid(blocks_for(a.w.rows, kGemvRowsPerBlock), unsigned(a.slots));
  switch (a.w.format) {
    case WeightFormat::affine4: gemv_affine4_kernel<<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
    case WeightFormat::affine8: gemv_generic_kernel<WeightFormat::affine8><<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
    case WeightFormat::bf16: gemv_generic_kernel<WeightFormat::bf16><<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
    case WeightFormat::f32: gemv_generic_kernel<WeightFormat::f32><<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
  }
  TERN_CUDA_LAUNCHED("gemv");
}

void matmul(const MatmulArgs& a, cudaStream_t stream, MatmulTile tile) {
  if (a.x_f16 || tile == MatmulTile::wgmma) {
    matmul_wgmma(a, stream, a.x_f16 ? WgmmaX::f16 : a.x_prep_f16 ? WgmmaX::split_f16 : WgmmaX::split);
    return;
  }
  if (a.x_q16) {
    matmul_int8(a, stream);
    return;
  }
  mm::check_tile_tokens(a, kMatmulTileTokens, "matmul");  // every block below holds 64 tokens or more
  const bool grouped = a.tile_expert != nullptr;
  if (a.w.rows == 0 || (grouped ? a.max_tiles <= 0 : a.tokens <= 0)) return;
  if (tile != MatmulTile::simt && tc::takes(a)) {
    tc::launch_tile<false>(a, DMat{}, tile, stream);
    return;
  }
  const unsigned gy = grouped ? unsigned(a.max_tiles) : blocks_for(a.tokens, BT);
  TERN_CHECK(gy <= 65535, "matmul: ", gy, " token tiles exceed the grid limit");
  const dim3 grid(blocks_for(a.w.rows, BN), gy);
  switch (a.w.format) {
    case WeightFormat::affine4: matmul_simt_kernel<WeightFormat::affine4><<<grid, 256, 0, stream>>>(a); break;
    case WeightFormat::affine8: matmul_simt_kernel<WeightFormat::affine8><<<grid, 256, 0, stream>>>(a); break;
    case WeightFormat::bf16: matmul_simt_kernel<WeightFormat::bf16><<<grid, 256, 0, stream>>>(a); break;
    case WeightFormat::f32: matmul_simt_kernel<WeightFormat::f32><<<grid, 256, 0, stream>>>(a); break;
  }
  TERN_CUDA_LAUNCHED("matmul");
}

void matmul_prepare_x(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  TERN_CHECK(cols % 64 == 0 && ldx % 4 == 0 && ldx >= cols && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(out) % 16 == 0,
             "matmul_prepare_x: needs cols a multiple of 64, ldx a multiple of 4 and 16-byte aligned buffers; ",
             "got cols ", cols, ", ldx ", ldx);
  const int64_t chunks = rows * (cols / 8);
  const int64_t blocks = std::min<int64_t>((chunks + 255) / 256, int64_t(tc::sm_count()) * 8);
  launch_pdl("matmul_prepare_x", tc::prepare_x_kernel, dim3(unsigned(blocks)), dim3(256), 0, stream, x, ldx, rows,
             cols, static_cast<unsigned char*>(out));
}

bool matmul_swiglu_supported(const MatmulArgs& gate, const DMat& up) {
  return tc::takes(gate) && tc::takes_matrix(up) && up.rows == gate.w.rows && up.cols == gate.w.cols &&
         up.experts == gate.w.experts;
}

void matmul_swiglu(const MatmulArgs& gate, const DMat& up, cudaStream_t stream, MatmulTile tile) {
  if (gate.x_f16 || tile == MatmulTile::wgmma) {
    const WgmmaX xk = gate.x_f16 ? WgmmaX::f16 : gate.x_prep_f16 ? WgmmaX::split_f16 : WgmmaX::split;
    matmul_wgmma_swiglu(gate, up, stream, xk);
    return;
  }
  if (gate.x_q16) {
    matmul_int8_swiglu(gate, up, stream);
    return;
  }
  mm::check_tile_tokens(gate, kMatmulTileTokens, "matmul_swiglu");  // every block below holds 64 tokens or more
  const bool grouped = gate.tile_expert != nullptr;
  if (gate.w.rows == 0 || (grouped ? gate.max_tiles <= 0 : gate.tokens <= 0)) return;
  TERN_CHECK(matmul_swiglu_supported(gate, up), "matmul_swiglu: needs two 4-bit matrices of one shape (group 64, ",
             "cols a multiple of 128) and 16-byte aligned x rows; got ", gate.w.rows, "x", gate.w.cols, " and ",
             up.rows, "x", up.cols);
  tc::launch_tile<true>(gate, up, tile, stream);
}

}  // namespace tern::cuda
