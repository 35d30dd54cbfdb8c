// Prefill products on the Hopper warpgroup tensor cores: see qmatmul_wgmma.cuh.
//
// Swap-AB, as the other prefill kernels: weight rows are the MMA's M side (A, in registers), tokens its N side (B,
// read from shared memory by the tensor cores through a matrix descriptor). A block is one warpgroup; its rows follow
// the int8 kernel's convention (warp w owns rows 16·MT·w + 16·mi + 0..15 of its MT row tiles), so wgmma tile mi is
// the rows 16·mi.. of every warp and the row mapping, bias term and epilogue of matmul_tile.cuh apply unchanged.
//
// k order. Inside a k16 step the order of k is free as long as A and B agree. The x layouts store each 8-column
// chunk c of a group as the pairs (0,4) (1,5) (2,6) (3,7); k-step i of a group takes chunks 2i (k-slots 0..7) and
// 2i + 1 (slots 8..15) as they are, so slot 8·kb + m is column 16i + 8kb + (0,4,1,5,2,6,3,7)[m]. The A fragment of
// lane (g, t): slots 2t, 2t + 1 (rows g, g + 8) and 2t + 8, 2t + 9, i.e. columns 16i + t, 16i + t + 4 of words 2i
// and 2i + 1 of the row's group: nibbles t and t + 4 of those words, one 16-bit pair each ((w >> 4t) & 0x000F000F |
// the bits of 1024.0 (fp16) or 128.0 (bf16), less that: exact).
//
// Token width. N = kTokens tokens per block and wgmma (m64nNk16): 64 for dense products and 64-token grouped tiles
// (the measured default), 32 or 16 for grouped tiles of at most that many (MatmulArgs::tile_tokens): the same code
// with N/8 n8 tiles, N/2 accumulators per thread and row tile, N/8 swizzle atoms of x per term.
//
// Shared memory (1024-byte aligned), per pipeline stage: weights [kRows][32 bytes] (16-byte chunks swizzled by row,
// as the int8 kernel), then per x term a tile [N tokens][128 bytes] (one group); then, once, the block rows'
// scales and the tile's x rows (the epilogue's). The x tiles are in the 128-byte-swizzle K-major layout (chunk c of
// token n at 16·(c ^ n % 8); k-step i's descriptor starts 32·i bytes in, 8-token groups 1024 bytes apart, whatever
// N); the no-swizzle layout measured 1.2–1.5x slower (docs/benchmarks.md). cp.async fills the stages kAhead steps
// ahead, one barrier a step.
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/kernels/qmatmul/matmul_tile.cuh"
#include "cuda/kernels/qmatmul/x_forms.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {
namespace wg {

constexpr int kStepK = 64;       // k per pipeline step: one quantisation group
constexpr int kWideTokens = 64;  // N of dense products and of grouped tiles of up to 64 tokens
constexpr int kThreads = 128;    // one warpgroup
static_assert(kWideTokens >= kMatmulTileTokens, "grouped tiles must fit one block");

// F16: x's terms are fp16 with a per-token scale σ (one term, or hi + lo), else bf16 (hi + lo). Defer: the next
// k-step's barrier, copies and first A fragments while a step's second row tile's MMAs run (the kernel's main loop).
template <int MT, int Terms, int Stages, int MinBlocks, int Tokens, bool F16 = Terms == 1, bool Defer = false>
struct Shape {
  static constexpr int kMTiles = MT, kTerms = Terms, kStages = Stages, kMinBlocks = MinBlocks;
  static constexpr bool kF16 = F16, kDefer = Defer;
  // The terms' order into a group's accumulator: the smallest first (lo before hi) where the form was written after
  // the finding that this sums the small terms before the full-size one and does not round each again at full size
  // (the tensor cores' accumulation does not round to nearest); bf16 hi + lo keeps hi first (its outputs' bits
  // unchanged).
  static constexpr bool kSmallFirst = Terms == 2 && F16;
  static constexpr int kTokens = Tokens;                  // N: tokens per block and wgmma
  static constexpr int kRows = 64 * MT;                   // weight rows per block
  static constexpr int kWBytes = kRows * 32;              // 4-bit: 32 bytes per row and group
  static constexpr int kXBytes = kTokens * 128 * Terms;   // 16-bit: 128 bytes per token, group and term
  static constexpr int kSlotBytes = kWBytes + kXBytes;
  static constexpr int kWCopies = kRows * 2 / kThreads;   // 16-byte weight copies per thread and step
  static constexpr int kXCopies = kTokens * 8 * Terms / kThreads;
  // Steps whose copies are in flight ahead of the one computed: Stages − 1, or Stages − 2 when the next step's
  // copies are issued while a step's MMAs still read its stage (Defer): the stage refilled then is step s − 1's, whose
  // MMAs every thread waited for before that barrier.
  static constexpr int kAhead = Defer ? Stages - 2 : Stages - 1;
  static constexpr int ld_scales(int G) { return G + 8; }  // bf16
  // + 1024: the stages start at the first 1024-byte boundary of the dynamic shared memory. After the scales: the
  // tile's x rows (int [kTokens]).
  static constexpr size_t smem(int G) {
    return 1024 + size_t(kStages) * kSlotBytes + size_t(kRows) * ld_scales(G) * 2 + size_t(kTokens) * 4;
  }
  static_assert(Tokens == 16 || Tokens == 32 || Tokens == 64, "the wgmma forms below: N = 16, 32 or 64");
  static_assert(kRows * 2 % kThreads == 0 && kTokens * 8 * Terms % kThreads == 0, "even copies");
  static_assert(kAhead >= 1, "at least one step's copies ahead");
  // Every x tile (stage, term) on a 1024-byte boundary: the 128-byte swizzle's pattern is of address bits 4..9, and
  // its 8-token atoms are 1024 bytes.
  static_assert(kWBytes % 1024 == 0 && kXBytes % 1024 == 0, "x tiles 1024-byte aligned");
};

// Position of 16-byte chunk c (0, 1) of weight row r in a stage: the A loads of a warp (rows g, g + 8, all 8 g at
// once) fall on distinct banks.
__device__ __forceinline__ int wchunk(int r, int c) { return r * 2 + (c ^ ((r >> 2) & 1)); }
// Byte offset, in a stage's x area of N-token tiles, of 16-byte chunk c (0 .. 8·Terms − 1) of token n's group: term
// c / 8's tile, row n, chunk c % 8 (k-step (c % 8) / 2, k half c % 2) at the 128-byte swizzle's place.
template <int N>
__device__ __forceinline__ int xchunk(int n, int c) {
  return (c >> 3) * (N * 128) + n * 128 + (((c & 7) ^ (n & 7)) << 4);
}
// The descriptor of term h, k-step i of the x tiles (N tokens each) at shared address xs: start address >> 4 in bits
// 0..13, the leading byte offset (bits 16..29; unused by swizzled K-major tiles: 1) and the stride between 8-token
// groups (bits 32..45, 1024 bytes, >> 4; the same for every N: an m64nNk16 reads N/8 such groups), the swizzle mode
// in bits 62..63 (1: 128 bytes).
template <int N>
__device__ __forceinline__ uint64_t x_descriptor(uint32_t xs, int h, int i) {
  return wgmma::sw128_desc(xs + h * (N * 128) + i * 32, 16, 1024);
}

// The 16-bit pair (nibble t, nibble t + 4) of an 8-nibble word as fp16x2 (F16) or bf16x2, exact: (w >> 4t) &
// 0x000F000F | the bits of 1024.0 (or 128.0), less 1024 (128).
template <bool F16>
__device__ __forceinline__ uint32_t nibble_pair(uint32_t w, int t) {
  if constexpr (F16) {
    const uint32_t v = lop3_and_or(w >> (4 * t), 0x000F000Fu, 0x64006400u);
    __half2 h = *reinterpret_cast<const __half2*>(&v);
    h = __hsub2(h, __floats2half2_rn(1024.0f, 1024.0f));
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const uint32_t v = lop3_and_or(w >> (4 * t), 0x000F000Fu, 0x43004300u);
    __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v);
    b = __hsub2(b, __floats2bfloat162_rn(128.0f, 128.0f));
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

template <class S, bool SwiGLU>
__global__ void __launch_bounds__(kThreads, S::kMinBlocks)
    matmul_wgmma_kernel(MatmulArgs a, DMat up, const void* xsrc, int64_t xrow_bytes, int64_t sums_off) {
  static_assert(!SwiGLU || S::kMTiles % 2 == 0, "SwiGLU pairs gate and up row tiles");
  constexpr int kStages = S::kStages, MT = S::kMTiles, Terms = S::kTerms, N = S::kTokens, NT = N / 8;
  constexpr int kAhead = S::kAhead;
  constexpr bool kF16 = S::kF16;  // fp16 terms with a per-token scale, else bf16 hi + lo
  constexpr int kOutRows = SwiGLU ? S::kRows / 2 : S::kRows;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = int64_t(blockIdx.x) * kOutRows;
  const bool grouped = a.tile_expert != nullptr;

  int64_t expert, p0, count;
  if (!mm::token_tile(a, N, expert, p0, count)) return;
  auto source = [&](int i, const DMat*& m) { return mm::block_row_source<SwiGLU, MT>(a, up, row0, expert, i, m); };
  const unsigned char* wsrc[S::kWCopies];
#pragma unroll
  for (int c = 0; c < S::kWCopies; ++c) {
    const int i = tid + c * kThreads;
    const DMat* m;
    const int64_t r = source(i / 2, m);
    wsrc[c] = static_cast<const unsigned char*>(m->data) + r * a.w.row_words * 4 + (i % 2) * 16;
  }
  const int G = int(a.w.cols / kStepK);
  const uint32_t smem0 = smem_addr(smem);
  const int scales_at = kStages * S::kSlotBytes;
  // The block rows' scales, once (launch constants; G % 8 == 0: matmul_wgmma_takes).
  mm::copy_block_scales(smem0 + scales_at, S::kRows, S::ld_scales(G), G, a.w.groups_per_row, source);
  auto stage = [&](int step) { return (step % kStages) * S::kSlotBytes; };
  auto issue_weights = [&](int step) {
    const uint32_t st = smem0 + stage(step);
#pragma unroll
    for (int c = 0; c < S::kWCopies; ++c) {
      const int i = tid + c * kThreads;
      cp_async_16(st + wchunk(i / 2, i % 2) * 16, wsrc[c] + step * 32, 16);
    }
  };
  const int steps = G;
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (s < steps) issue_weights(s);
  if (!grouped) pdl_wait();

  // x: copy q = tid + m·128 is chunk q % (8·Terms) of token q / (8·Terms); tokens past the tile read nothing
  // (zero-filled: they add nothing and their outputs are dropped).
  const unsigned char* const xq = static_cast<const unsigned char*>(xsrc);
  auto x_row = [&](int n) { return a.gather ? int64_t(a.gather[p0 + n]) : p0 + n; };
  constexpr int kChunksPerToken = 8 * Terms;
  int xrow[S::kXCopies];
  // The tile's x rows for the epilogue (after the scales), from the copies' own (the thread of each token's chunk 0):
  // the bias term and σ then read no gather entry, one dependent round trip a token before.
  int* const xrow_s = reinterpret_cast<int*>(smem + scales_at + S::kRows * S::ld_scales(G) * 2);
#pragma unroll
  for (int m = 0; m < S::kXCopies; ++m) {
    const int q = tid + m * kThreads, n = q / kChunksPerToken;
    xrow[m] = n < count ? int(x_row(n)) : 0;
    if (q % kChunksPerToken == 0) xrow_s[n] = xrow[m];
  }
  auto issue_x = [&](int step) {
    const uint32_t st = smem0 + stage(step) + S::kWBytes;
#pragma unroll
    for (int m = 0; m < S::kXCopies; ++m) {
      const int q = tid + m * kThreads, n = q / kChunksPerToken, c = q % kChunksPerToken;
      cp_async_16(st + xchunk<N>(n, c), xq + xrow[m] * xrow_bytes + int64_t(step) * (128 * Terms) + c * 16,
                         n < count ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < steps) issue_x(s);
    cp_async_commit();
  }

  float acc[MT][NT][4];
  mm::zero_acc(acc);
  float part[MT][N / 2];  // one group's sums of each row tile (the wgmma accumulators)
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int c = 0; c < N / 2; ++c) part[mi][c] = 0.0f;

  const int wrow = warp * 16 * MT + g;  // this thread's first row inside the block (then +8, +16, ...)
  uint32_t af[MT][4][4];  // [row tile][k-step][fragment]
  // Row tile mi's A fragments of k-step `step`: its weights' integers from the stage, as 16-bit pairs.
  auto load_a = [&](int step, int mi) {
    const int r0 = wrow + 16 * mi, r1 = r0 + 8;
    const uint4* w = reinterpret_cast<const uint4*>(smem + stage(step));
    const uint4 a0 = w[wchunk(r0, 0)], a1 = w[wchunk(r0, 1)], b0 = w[wchunk(r1, 0)], b1 = w[wchunk(r1, 1)];
    const uint32_t ra[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const uint32_t rb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      af[mi][i][0] = nibble_pair<kF16>(ra[2 * i], t);
      af[mi][i][1] = nibble_pair<kF16>(rb[2 * i], t);
      af[mi][i][2] = nibble_pair<kF16>(ra[2 * i + 1], t);
      af[mi][i][3] = nibble_pair<kF16>(rb[2 * i + 1], t);
    }
  };
  // Row tile mi's MMAs of k-step `step` into part[mi], one commit group; the terms in the order of S::kSmallFirst
  // (stored hi, then lo).
  auto issue_mmas = [&](int step, int mi) {
    const uint32_t xs = smem0 + stage(step) + S::kWBytes;
    wgmma::fence();
#pragma unroll
    for (int h = 0; h < Terms; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        wgmma::mma_rs<kF16>(part[mi], af[mi][i], x_descriptor<N>(xs, S::kSmallFirst ? Terms - 1 - h : h, i),
                            h + i > 0 ? 1 : 0);
    wgmma::commit();
  };
  // Folds row tile mi's group sums of k-step `step` (its MMAs waited for) with its rows' scales.
  auto fold = [&](int step, int mi) {
    wgmma::fence_regs(part[mi]);
#pragma unroll
    for (int i = 0; i < 4; ++i) wgmma::fence_regs(af[mi][i]);
    const uint16_t* ss = reinterpret_cast<const uint16_t*>(smem + scales_at) + step;  // column `step`
    const int r0 = wrow + 16 * mi, r1 = r0 + 8;
    const float s0 = __uint_as_float(uint32_t(ss[r0 * S::ld_scales(G)]) << 16);
    const float s1 = __uint_as_float(uint32_t(ss[r1 * S::ld_scales(G)]) << 16);
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = fmaf(c < 2 ? s0 : s1, part[mi][4 * ni + c], acc[mi][ni][c]);
  };
  // Waits for step `step`'s copies, then issues those of step + kAhead.
  auto begin_step = [&](int step) {
    cp_async_wait<kAhead - 1>();  // this thread's copies of step `step` have landed
    wgmma::fence_proxy_async();   // ... and are visible to the tensor cores' reads
    __syncthreads();              // everyone's have; the stage refilled next is free (its MMAs completed)
    if (step + kAhead < steps) {
      issue_weights(step + kAhead);
      issue_x(step + kAhead);
    }
    cp_async_commit();
  };
  if constexpr (S::kDefer) {
    // The next step's barrier, copies and first A fragments while the second row tile's MMAs run; every MMA retired
    // by the end of each step (ptxas serialises the MMAs when groups stay pending across the loop's back edge).
    static_assert(MT == 2, "the deferred form pairs two row tiles");
    begin_step(0);
    load_a(0, 0);
    for (int step = 0; step < steps; ++step) {
      issue_mmas(step, 0);
      load_a(step, 1);
      issue_mmas(step, 1);
      wgmma::wait<1>();
      fold(step, 0);
      if (step + 1 < steps) {
        begin_step(step + 1);
        load_a(step + 1, 0);
      }
      wgmma::wait<0>();
      fold(step, 1);
    }
  } else {
    for (int step = 0; step < steps; ++step) {
      begin_step(step);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        load_a(step, mi);
        issue_mmas(step, mi);
      }
      // Fold each row tile's group sums with its rows' scales as its MMAs complete.
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        if (mi == 0 && MT == 2) {
          wgmma::wait<1>();
        } else {
          wgmma::wait<0>();
        }
        fold(step, mi);
      }
    }
  }
  pdl_trigger();

  // The bias term: acc += Σ_g b[r][g]·Σx[n][g] (the sums of the x the MMAs saw, after the layout's groups); then,
  // for the fp16 forms, the token's scale σ (after the sums), loaded before the bias term's own loads so that its
  // round trip overlaps theirs.
  float sigma[NT][2];
  if constexpr (kF16) {
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * ni + 2 * t + e;
        sigma[ni][e] = n < count ? reinterpret_cast<const float*>(xq + xrow_s[n] * xrow_bytes + sums_off)[G] : 0.0f;
      }
  }
  {
    const uint32_t* brow[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const DMat* m;
        const int64_t r = source(warp * 16 * MT + 16 * mi + g + 8 * h, m);
        brow[mi][h] = reinterpret_cast<const uint32_t*>(m->biases + r * a.w.groups_per_row);
      }
    const float* beta[NT];
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
      const int n = 8 * ni + g;
      beta[ni] = n < count ? reinterpret_cast<const float*>(xq + xrow_s[n] * xrow_bytes + sums_off) : nullptr;
    }
    mm::add_bias_term(acc, brow, beta, G, t);
  }
  if constexpr (kF16) {
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mi][ni][c] *= sigma[ni][c % 2];
  }
  mm::store_warp_tile<SwiGLU, MT, NT, /*LoadFirst=*/true>(a, acc, row0 + warp * 16 * (SwiGLU ? MT / 2 : MT), 0, g, t,
                                                          p0, count);
}

// The fp16 forms of x that prepare_x_f16_kernel writes: one term of x (matmul_prepare_x_f16) or x as fp16 hi + lo
// (matmul_prepare_x_f16x2).
enum class F16Form { value, pair };

// x (fp32 [rows, cols], row stride ld) -> the rows of matmul_prepare_x_f16 or of matmul_prepare_x_f16x2 (pair): a
// warp per row; pass 1 finds max|x|, pass 2 writes x/σ (σ = 2^(E − 15) for max|x| < 2^E: an exact scaling into
// (−2^15, 2^15)) as fp16 (pair: hi = fp16(x/σ), then lo = fp16(x/σ − hi), whose subtraction is exact), one
// 8-column word per lane and step (the 8 words of a group in 8 consecutive lanes, which add its sum by shuffles).
template <F16Form Form>
__global__ void __launch_bounds__(256) prepare_x_f16_kernel(const float* x, int64_t ld, int64_t rows, int64_t cols,
                                                            unsigned char* out) {
  constexpr bool kPair = Form == F16Form::pair;
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x % 32;
  const int64_t row_bytes = kPair ? matmul_f16x2_row_bytes(cols) : matmul_f16_row_bytes(cols);
  for (int64_t r = int64_t(blockIdx.x) * 8 + threadIdx.x / 32; r < rows; r += int64_t(gridDim.x) * 8) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * ld);
    float m = 0.0f;
    for (int64_t i = lane; i < cols / 4; i += 32) {
      const float4 v = xr[i];
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    m = warp_max(m);
    float sigma;
    const float inv = xform::f16_row_scale(m, sigma);
    unsigned char* row = out + r * row_bytes;
    for (int64_t w = lane; w < cols / 8; w += 32) {  // cols % 256 == 0: every lane takes part in every step
      const float4 p = xr[2 * w], q = xr[2 * w + 1];
      const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
      xform::store_f16_word<kPair>(row, cols, w, v, inv, true);
    }
    if (lane == 0) xform::store_f16_sigma<kPair>(row, cols, sigma);
  }
}

// Blocks of 128 rows × N tokens, x in Terms terms (1: fp16, 2: bf16 or (F16) fp16 hi + lo). Blocks per SM the
// registers must allow: 2 at N = 64 (the measured default); 3 at N = 32 and 4 at N = 16 (≤ 168 and ≤ 128
// registers; unmeasured guesses: short chunks run many small blocks; shared memory allows as many at the model's
// widths).
constexpr int min_blocks(int tokens) { return tokens == 64 ? 2 : tokens == 32 ? 3 : 4; }
template <int Terms, int Tokens, bool F16 = Terms == 1>
using Block = Shape</*MT=*/2, Terms, /*Stages=*/4, min_blocks(Tokens), Tokens, F16>;
using Plain1 = Block<1, kWideTokens>;  // 128 rows × 64 tokens, x in one fp16 term
using Plain2 = Block<2, kWideTokens>;  // the same, x as bf16 hi + lo (Block<2, N, true>: as fp16 hi + lo)
// The same with the next step's barrier, copies and first A fragments during a step's second row tile's MMAs (4
// stages, two steps ahead): the 64-token blocks of x as bf16 hi + lo by default (WgmmaBlock).
template <int Terms, bool F16 = Terms == 1>
using WideDeferred = Shape</*MT=*/2, Terms, /*Stages=*/4, min_blocks(kWideTokens), kWideTokens, F16, true>;

WgmmaBlock block_from_env() {
  const char* e = std::getenv("TERN_WGMMA_BLOCK");
  if (e == nullptr || *e == 0) return WgmmaBlock::automatic;
  const std::string v(e);
  if (v == "auto") return WgmmaBlock::automatic;
  if (v == "plain") return WgmmaBlock::plain;
  if (v == "deferred") return WgmmaBlock::deferred;
  TERN_FAIL("TERN_WGMMA_BLOCK must be auto, plain or deferred; got '", v, "'");
}
WgmmaBlock& block_form() {
  static WgmmaBlock b = block_from_env();
  return b;
}

template <class S, bool SwiGLU>
void launch(const MatmulArgs& a, const DMat& up, const void* x, int64_t row_bytes, int64_t sums_off,
            cudaStream_t stream) {
  auto kernel = matmul_wgmma_kernel<S, SwiGLU>;
  const size_t smem = S::smem(int(a.w.cols / kStepK));
  static const int limit = qtile::allow_dynamic_smem(reinterpret_cast<const void*>(kernel));
  TERN_CHECK(smem <= size_t(limit), "matmul_wgmma: ", a.w.cols, " columns need ", smem, " bytes of shared memory, ",
             "more than the device's ", limit);
  const bool grouped = a.tile_expert != nullptr;
  const int64_t tiles = grouped ? a.max_tiles : (a.tokens + S::kTokens - 1) / S::kTokens;
  TERN_CHECK(tiles <= 65535, "matmul_wgmma: ", tiles, " token tiles exceed the grid limit");
  const dim3 grid(blocks_for(a.w.rows, SwiGLU ? S::kRows / 2 : S::kRows), unsigned(tiles));
  launch_pdl(SwiGLU ? "matmul_swiglu (wgmma)" : "matmul (wgmma)", kernel, grid, dim3(kThreads), smem, stream, a, up,
             x, row_bytes, sums_off);
}

// The block width of a product: 64 tokens for dense products, the narrowest of 16, 32 and 64 that holds a grouped
// product's tiles (a.tile_tokens positions at most).
int block_tokens(const MatmulArgs& a) {
  if (a.tile_expert == nullptr) return kWideTokens;
  TERN_CHECK(a.tile_tokens >= 1 && a.tile_tokens <= kWideTokens, "matmul_wgmma: grouped tiles of up to ",
             a.tile_tokens, " tokens (the blocks take 1 to ", kWideTokens, ")");
  return a.tile_tokens <= 16 ? 16 : a.tile_tokens <= 32 ? 32 : kWideTokens;
}

template <int Terms, bool SwiGLU, bool F16 = Terms == 1>
void launch_width(int tokens, const MatmulArgs& a, const DMat& up, const void* x, int64_t row_bytes,
                  int64_t sums_off, cudaStream_t stream) {
  switch (tokens) {
    case 16: launch<Block<Terms, 16, F16>, SwiGLU>(a, up, x, row_bytes, sums_off, stream); return;
    case 32: launch<Block<Terms, 32, F16>, SwiGLU>(a, up, x, row_bytes, sums_off, stream); return;
    default: break;
  }
  const WgmmaBlock form = block_form();
  if (form == WgmmaBlock::deferred || (form == WgmmaBlock::automatic && !F16))
    return launch<WideDeferred<Terms, F16>, SwiGLU>(a, up, x, row_bytes, sums_off, stream);
  launch<Block<Terms, kWideTokens, F16>, SwiGLU>(a, up, x, row_bytes, sums_off, stream);
}

template <bool SwiGLU>
void run(const MatmulArgs& a, const DMat& up, WgmmaX xk, cudaStream_t stream) {
  TERN_CHECK(matmul_wgmma_available(), "matmul_wgmma: needs a Hopper GPU (sm_90a binary)");
  TERN_CHECK(matmul_wgmma_takes(a.w), "matmul_wgmma: needs 4-bit affine weights of group 64 with cols a multiple of ",
             "512 and aligned arrays; got ", a.w.rows, "x", a.w.cols);
  const bool one = xk == WgmmaX::f16, pair = xk == WgmmaX::split_f16;
  TERN_CHECK(one || a.x_prep_f16 == pair, "matmul_wgmma: x_prep is ", a.x_prep_f16 ? "fp16" : "bf16",
             " hi + lo (MatmulArgs::x_prep_f16) but the product was asked for the other");
  const void* x = one ? a.x_f16 : a.x_prep;
  const int64_t xcols = one ? a.x_f16_cols : a.x_prep_cols;
  TERN_CHECK(x != nullptr && xcols == a.w.cols && reinterpret_cast<uintptr_t>(x) % 16 == 0, "matmul_wgmma: ",
             one ? "x_f16" : "x_prep", " must be x prepared for the matrix's ", a.w.cols, " columns (got ", xcols,
             "), 16-byte aligned");
  if (SwiGLU) {
    TERN_CHECK(up.format == a.w.format && up.rows == a.w.rows && up.cols == a.w.cols && up.experts == a.w.experts &&
                   matmul_wgmma_takes(up),
               "matmul_wgmma_swiglu: needs two 4-bit matrices of one shape; got ", a.w.rows, "x", a.w.cols, " and ",
               up.rows, "x", up.cols);
  }
  const bool grouped = a.tile_expert != nullptr;
  const int tokens = block_tokens(a);
  if (a.w.rows == 0 || (grouped ? a.max_tiles <= 0 : a.tokens <= 0)) return;
  if (one) {
    launch_width<1, SwiGLU>(tokens, a, up, x, matmul_f16_row_bytes(a.w.cols), a.w.cols * 2, stream);  // sums, then σ
  } else if (pair) {  // sums, then σ
    launch_width<2, SwiGLU, true>(tokens, a, up, x, matmul_f16x2_row_bytes(a.w.cols), a.w.cols * 4, stream);
  } else {
    launch_width<2, SwiGLU>(tokens, a, up, x, matmul_prepared_row_bytes(a.w.cols), a.w.cols * 4, stream);
  }
}

}  // namespace wg
}  // namespace

bool matmul_wgmma_available() {
  static const bool ok = [] {
    if (gpu_path_portable()) return false;
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, wg::matmul_wgmma_kernel<wg::Plain1, false>) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    int dev = 0, major = 0, minor = 0;
    TERN_CUDA(cudaGetDevice(&dev));
    TERN_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    TERN_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return fa.binaryVersion == 90 && fa.ptxVersion == 90 && major == 9 && minor == 0;
  }();
  return ok;
}

bool matmul_wgmma_takes(const DMat& w) {
  const auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  return w.format == WeightFormat::affine4 && w.data && w.scales && w.biases && w.group_size == wg::kStepK &&
         w.cols > 0 && w.cols % 512 == 0 && w.row_words == w.cols / 8 && w.groups_per_row == w.cols / 64 &&
         aligned(w.data, 16) && aligned(w.scales, 16) && aligned(w.biases, 4);
}

namespace {
template <wg::F16Form Form>
void prepare_f16(const char* name, const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out,
                 cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  TERN_CHECK(cols % 256 == 0 && ldx % 4 == 0 && ldx >= cols && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(out) % 16 == 0,
             name, ": needs cols a multiple of 256, ldx a multiple of 4 and 16-byte aligned buffers; got cols ", cols,
             ", ldx ", ldx);
  const int64_t blocks = std::min<int64_t>((rows + 7) / 8, int64_t(qtile::sm_count()) * 8);
  launch_pdl(name, wg::prepare_x_f16_kernel<Form>, dim3(unsigned(blocks)), dim3(256), 0, stream, x, ldx, rows, cols,
             static_cast<unsigned char*>(out));
}
}  // namespace

void matmul_prepare_x_f16(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out, cudaStream_t stream) {
  prepare_f16<wg::F16Form::value>("matmul_prepare_x_f16", x, ldx, rows, cols, out, stream);
}

void matmul_prepare_x_f16x2(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out,
                            cudaStream_t stream) {
  prepare_f16<wg::F16Form::pair>("matmul_prepare_x_f16x2", x, ldx, rows, cols, out, stream);
}

void matmul_wgmma_set_block(WgmmaBlock b) { wg::block_form() = b; }
WgmmaBlock matmul_wgmma_block() { return wg::block_form(); }

void matmul_wgmma(const MatmulArgs& a, cudaStream_t stream, WgmmaX x) { wg::run<false>(a, DMat{}, x, stream); }

void matmul_wgmma_swiglu(const MatmulArgs& gate, const DMat& up, cudaStream_t stream, WgmmaX x) {
  wg::run<true>(gate, up, x, stream);
}

}  // namespace tern::cuda
