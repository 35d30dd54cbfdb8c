// Prefill products on the integer tensor cores: see qmatmul_int8.cuh.
//
// Swap-AB, as the bf16 kernel of qmatmul.cu: weight rows are the MMA's M side, tokens its N side. A block computes
// kRows weight rows × kTokens tokens, one quantisation group (64 k) per pipeline step; each step's weight bytes and
// quantised x travel global -> shared by cp.async, kStages deep, one barrier a step; the block's scales and the
// tokens' σ are copied once, at the start, into padded tables.
//
// The k order inside an MMA is free as long as A and B agree. m16n8k32 (u8 × s8): thread (g = lane/4, t = lane%4)
// holds A = (row g, k-slots 4t..4t+3), (row g+8, same), (row g, slots 16+4t..), (row g+8, same) and
// B = (slots 4t.., token g), (slots 16+4t.., token g). Slots 4t..4t+3 of k-step j (j = 0, 1 in a group) take the even
// columns 0,2,4,6 of the group's 8-column word 4j + t, slots 16+4t.. its odd columns: for a 4-bit word w that is
// w & 0x0F0F0F0F and (w >> 4) & 0x0F0F0F0F, for 8-bit bytes a byte permutation of the word pair, and for x exactly
// the {even, odd} int8x4 pairs that matmul_quantize_x stores (hi in .x .y, lo in .z .w of each word's uint4).
//
// Per (row tile, token tile) and group: th = M + Σq·hi and tl = M + Σq·lo in s32 (M = 0x4B400000, the bits of
// 1.5·2^23: |Σ| < 2^22, so each reads as the float 1.5·2^23 + Σ exactly, without the slow int -> float convert),
// then σ·v = 256σ·(th − M) + σ·(tl − M) and acc += s·σ·v in fp32 (4 fp32 instructions per output and group).
// The bias term Σ_g b_g·β_g (β = σ·Σv of the token's group) is one more small product after the main loop, on the
// bf16 tensor cores: b is bf16 already (exact), β enters as three bf16 terms (24 significant bits).
// Every block shape sums each output in the same order (groups in order), so results do not depend on the shape.
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/qmatmul/matmul_tile.cuh"
#include "cuda/kernels/qmatmul/x_forms.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {
namespace i8 {

constexpr int kStepK = 64;                   // k per pipeline step: one quantisation group
constexpr uint32_t kMagicBits = 0x4B400000u;  // 1.5·2^23
constexpr float kMagic = 12582912.0f;

template <int MTiles, int NTiles, int WarpsM, int WarpsN, int MinBlocks, int Stages>
struct Shape {
  static constexpr int kMTiles = MTiles, kNTiles = NTiles, kWarpsM = WarpsM, kMinBlocks = MinBlocks;
  static constexpr int kStages = Stages;
  static constexpr int kRows = 16 * MTiles * WarpsM;   // weight rows per block
  static constexpr int kTokens = 8 * NTiles * WarpsN;  // tokens per block
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
};

// Shared memory: kStages pipeline stages, each weight bytes [kRows][Bits·8] (16-byte chunks swizzled by row) and x
// words [kTokens][8] uint4 (swizzled by token); then, copied once, the block rows' scales [kRows][G + 8] bf16 and the
// tokens' σ [kTokens][G + 4] fp32 (G = cols/64 groups; the pads keep rows 16-byte aligned and the reads of a warp,
// rows g / tokens 2t, 2t + 1, on distinct banks).
template <class S, int Bits>
struct Plan {
  static constexpr int kRowBytes = Bits * 8;  // one group of one weight row
  static constexpr int kChunks = kRowBytes / 16;
  static constexpr int kWBytes = S::kRows * kRowBytes;
  static constexpr int kXBytes = S::kTokens * 128;
  static constexpr int kSlotBytes = kWBytes + kXBytes;
  static constexpr int kWCopies = S::kRows * kChunks / S::kThreads;  // 16-byte weight copies per thread and step
  static constexpr int kXCopies = S::kTokens * 8 / S::kThreads;      // 16-byte x copies per thread and step
  static_assert(S::kRows * kChunks % S::kThreads == 0 && S::kTokens * 8 % S::kThreads == 0, "even copies");
  static_assert(kSlotBytes % 16 == 0, "16-byte aligned stages");
  static constexpr int ld_scales(int G) { return G + 8; }  // bf16
  static constexpr int ld_sigma(int G) { return G + 4; }   // fp32
  static constexpr size_t smem(int G) {
    return size_t(S::kStages) * kSlotBytes + size_t(S::kRows) * ld_scales(G) * 2 + size_t(S::kTokens) * ld_sigma(G) * 4;
  }
};

// Position of 16-byte chunk c of weight row r in a stage (4-bit: 2 chunks a row, 8-bit: 4), swizzled so that the A
// loads of a warp (rows g, g + 8 of a row tile) are free of bank conflicts.
template <int Bits>
__device__ __forceinline__ int wchunk(int r, int c) {
  if constexpr (Bits == 4) {
    return r * 2 + (c ^ ((r >> 2) & 1));
  } else {
    return r * 4 + (c ^ (((r >> 1) & 1) << 1));
  }
}
// Position of word w (0..7) of token n in a stage's x tile.
__device__ __forceinline__ int xword(int n, int w) { return n * 8 + (w ^ ((n & 1) << 2)); }

// d += a · b, m16n8k32, u8 × s8 -> s32.
__device__ __forceinline__ void mma_u8s8(int d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a · b + (c, c, c, c): a fresh sum that starts at c (one register for the four accumulators, no moves).
__device__ __forceinline__ void mma_u8s8_from(int d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, uint32_t c) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// The even and odd columns (0,2,4,6 / 1,3,5,7) of an 8-column piece of a weight row as u8x4: 4-bit, one word; 8-bit,
// two words (columns 0-3, 4-7).
__device__ __forceinline__ void even_odd4(uint32_t w, uint32_t& ev, uint32_t& od) {
  ev = w & 0x0F0F0F0Fu;
  od = (w >> 4) & 0x0F0F0F0Fu;
}
__device__ __forceinline__ void even_odd8(uint2 w, uint32_t& ev, uint32_t& od) {
  ev = __byte_perm(w.x, w.y, 0x6420);
  od = __byte_perm(w.x, w.y, 0x7531);
}

// SwiGLU: `up` has a.w's shape; in each warp the first kMTiles/2 row tiles are gate rows, the others the same rows of
// up, and the epilogue writes silu(gate) · up for kRows/2 output rows.
template <class S, int Bits, bool SwiGLU>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks) matmul_int8_kernel(MatmulArgs a, DMat up) {
  static_assert(!SwiGLU || S::kMTiles % 2 == 0, "SwiGLU pairs gate and up row tiles");
  using P = Plan<S, Bits>;
  constexpr int kStages = S::kStages;
  constexpr int MT = S::kMTiles, NT = S::kNTiles;
  constexpr int kOutRows = SwiGLU ? S::kRows / 2 : S::kRows;
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
  const unsigned char* wsrc[P::kWCopies];
#pragma unroll
  for (int c = 0; c < P::kWCopies; ++c) {
    const int i = tid + c * S::kThreads;
    const DMat* m;
    const int64_t r = source(i / P::kChunks, m);
    wsrc[c] = static_cast<const unsigned char*>(m->data) + r * a.w.row_words * 4 + (i % P::kChunks) * 16;
  }
  const int G = int(a.w.cols / kStepK);
  const uint32_t smem0 = smem_addr(smem);
  const int scales_at = kStages * P::kSlotBytes, sigma_at = scales_at + S::kRows * P::ld_scales(G) * 2;
  // The block rows' scales, once; launch constants, so before any wait.
  mm::copy_block_scales(smem0 + scales_at, S::kRows, P::ld_scales(G), G, a.w.groups_per_row, source);
  auto stage = [&](int step) { return (step % kStages) * P::kSlotBytes; };
  auto issue_weights = [&](int step) {
    const uint32_t st = smem0 + stage(step);
#pragma unroll
    for (int c = 0; c < P::kWCopies; ++c) {
      const int i = tid + c * S::kThreads;
      cp_async_16(st + wchunk<Bits>(i / P::kChunks, i % P::kChunks) * 16, wsrc[c] + step * P::kRowBytes, 16);
    }
  };

  const int steps = int(a.w.cols / kStepK);
  // Weights are launch constants: in dense mode the pipeline starts filling before waiting on the previous kernel.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < steps) issue_weights(s);
  if (!grouped) pdl_wait();

  // x: thread copies word tid % 8 of tokens tid / 8 + m · kThreads / 8 each step; the tokens' σ are copied once
  // below. Tokens past the tile read nothing (zero-filled: they add nothing and their outputs are dropped).
  const unsigned char* const xq = static_cast<const unsigned char*>(a.x_q16);
  const int64_t xrow_bytes = matmul_q16_row_bytes(a.w.cols);
  auto x_row = [&](int n) { return a.gather ? int64_t(a.gather[p0 + n]) : p0 + n; };
  // The x rows of this thread's copies as 32-bit row numbers (registers are scarce; addresses formed at each copy).
  int xrow[P::kXCopies];
#pragma unroll
  for (int m = 0; m < P::kXCopies; ++m) {
    const int n = tid / 8 + m * (S::kThreads / 8);
    xrow[m] = n < count ? int(x_row(n)) : 0;
  }
  const int64_t sigma_off = int64_t(G) * 128, beta_off = sigma_off + int64_t(G) * 4;  // in a quantised x row
  // The tokens' σ, once (16-byte pieces of G·4 bytes a token; zeros past the tile).
  for (int i = tid; i < S::kTokens * (G / 4); i += S::kThreads) {
    const int n = i / (G / 4), piece = i % (G / 4);
    const unsigned char* src = n < count ? xq + x_row(n) * xrow_bytes + sigma_off + piece * 16 : xq;
    cp_async_16(smem0 + sigma_at + (n * P::ld_sigma(G) + piece * 4) * 4, src, n < count ? 16 : 0);
  }
  auto issue_x = [&](int step) {
    const uint32_t st = smem0 + stage(step) + P::kWBytes;
#pragma unroll
    for (int m = 0; m < P::kXCopies; ++m) {
      const int n = tid / 8 + m * (S::kThreads / 8);
      cp_async_16(st + xword(n, tid % 8) * 16, xq + xrow[m] * xrow_bytes + (tid % 8) * 16 + step * 128,
                         n < count ? 16 : 0);
    }
  };
  // Commit groups: group s (s < kStages − 1) holds x(s) (group 0 also the prologue's weights, scales and σ); the
  // group committed in step s holds W and x of step s + kStages − 1 (empty past the end: the counts stay uniform).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue_x(s);
    cp_async_commit();
  }

  float acc[MT][NT][4];
  mm::zero_acc(acc);

  const int wrow = wm * 16 * MT + g;  // this thread's first row inside the block (then +8, +16, ...)
  const int wtok0 = wn * 8 * NT;      // the warp's first token inside the block
  const int live = mm::live_n8_tiles<NT>(count, wtok0);  // short grouped tiles skip the empty ones

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();  // this thread's copies of step `step` have landed
    __syncthreads();                      // everyone's have; step − 1's stage is free
    if (step + kStages - 1 < steps) {
      issue_weights(step + kStages - 1);
      issue_x(step + kStages - 1);
    }
    cp_async_commit();

    auto compute = [&](auto full) {
      constexpr bool kFull = decltype(full)::value;
      const unsigned char* st = smem + stage(step);
      const uint4* xs = reinterpret_cast<const uint4*>(st + P::kWBytes);
      const uint16_t* ss = reinterpret_cast<const uint16_t*>(smem + scales_at) + step;  // column `step`
      const float* qs = reinterpret_cast<const float*>(smem + sigma_at) + step;

      // B fragments of both k-steps and σ of tokens 2t, 2t + 1, for every n8 tile of the warp.
      uint4 bx[NT][2];
      float2 q[NT];
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        const int n = wtok0 + 8 * ni + g;
        if (kFull || ni < live) {
#pragma unroll
          for (int j = 0; j < 2; ++j) bx[ni][j] = xs[xword(n, 4 * j + t)];
          const int n0 = wtok0 + 8 * ni + 2 * t;
          q[ni] = make_float2(qs[n0 * P::ld_sigma(G)], qs[(n0 + 1) * P::ld_sigma(G)]);
        } else {
          bx[ni][0] = bx[ni][1] = make_uint4(0u, 0u, 0u, 0u);
          q[ni] = make_float2(0.f, 0.f);
        }
      }
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const int r0 = wrow + 16 * mi, r1 = r0 + 8;
        uint32_t af[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int piece = 4 * j + t;  // the 8-column piece of the group
          if constexpr (Bits == 4) {
            const uint32_t* w = reinterpret_cast<const uint32_t*>(st);
            const uint32_t w0 = w[wchunk<4>(r0, piece / 4) * 4 + piece % 4];
            const uint32_t w1 = w[wchunk<4>(r1, piece / 4) * 4 + piece % 4];
            even_odd4(w0, af[j][0], af[j][2]);
            even_odd4(w1, af[j][1], af[j][3]);
          } else {
            const uint2* w = reinterpret_cast<const uint2*>(st);
            const uint2 w0 = w[wchunk<8>(r0, piece / 2) * 2 + piece % 2];
            const uint2 w1 = w[wchunk<8>(r1, piece / 2) * 2 + piece % 2];
            even_odd8(w0, af[j][0], af[j][2]);
            even_odd8(w1, af[j][1], af[j][3]);
          }
        }
        const float s0 = __uint_as_float(uint32_t(ss[r0 * P::ld_scales(G)]) << 16);
        const float s1 = __uint_as_float(uint32_t(ss[r1 * P::ld_scales(G)]) << 16);
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
          if (kFull || ni < live) {
            int th[4], tl[4];
            mma_u8s8_from(th, af[0], bx[ni][0].x, bx[ni][0].y, kMagicBits);
            mma_u8s8_from(tl, af[0], bx[ni][0].z, bx[ni][0].w, kMagicBits);
            mma_u8s8(th, af[1], bx[ni][1].x, bx[ni][1].y);
            mma_u8s8(tl, af[1], bx[ni][1].z, bx[ni][1].w);
            // c0, c1: row r0, tokens 2t, 2t + 1; c2, c3: row r1. σ has at most 22 significant bits, so −σ·M is
            // exact and fma(M + Σq·lo, σ, −σ·M) = σ·Σq·lo with one rounding; then + 256σ·Σq·hi, one more.
            const float sig[2] = {q[ni].x, q[ni].y};
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const float s = c < 2 ? s0 : s1, sg = sig[c % 2];
              const float lo = fmaf(__int_as_float(tl[c]), sg, -kMagic * sg);
              const float v = fmaf(__int_as_float(th[c]) - kMagic, 256.0f * sg, lo);
              acc[mi][ni][c] = fmaf(s, v, acc[mi][ni][c]);
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
  }
  pdl_trigger();

  // The bias term: acc += Σ_g b[r][g]·β[n][g], β = σ·Σv of token n's group g (mm::add_bias_term).
  {
    const uint32_t* brow[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const DMat* m;
        const int64_t r = source(wm * 16 * MT + 16 * mi + g + 8 * h, m);
        brow[mi][h] = reinterpret_cast<const uint32_t*>(m->biases + r * a.w.groups_per_row);
      }
    const float* beta[NT];  // β of token wtok0 + 8·ni + g (nullptr: past the tile)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
      const int n = wtok0 + 8 * ni + g;
      beta[ni] = n < count ? reinterpret_cast<const float*>(xq + x_row(n) * xrow_bytes + beta_off) : nullptr;
    }
    mm::add_bias_term(acc, brow, beta, G, t);
  }

  mm::store_warp_tile<SwiGLU>(a, acc, row0 + wm * 16 * (SwiGLU ? MT / 2 : MT), wtok0, g, t, p0, count);
}

// x (fp32 [rows, cols], row stride ld) -> the quantised layout, and (residual, when set) the residual x − x' quantised
// the same way. One thread per 8-column word; the 8 words of a group lie in 8 consecutive lanes (cols % 64 == 0),
// which share the group's max and add their Σv by shuffles.
__global__ void __launch_bounds__(256) quantize_x_kernel(const float* x, int64_t ld, int64_t rows, int64_t cols,
                                                         unsigned char* out, unsigned char* residual) {
  pdl_wait();
  pdl_trigger();
  const int64_t row_bytes = matmul_q16_row_bytes(cols);
  mm::for_each_x_word(x, ld, rows, cols, [&](bool in, int64_t r, int64_t w, const float (&v)[8]) {
    xform::store_q16_words(out + r * row_bytes, residual ? residual + r * row_bytes : nullptr, cols, w, v, in);
  });
}

//                          MTiles NTiles WarpsM WarpsN MinBlocks Stages
using Shape64x64 = Shape<2, 4, 2, 2, 3, 4>;    // 128 threads, warp tiles 32 rows × 32 tokens, ≤ 168 registers
using Shape128x64 = Shape<4, 4, 2, 2, 2, 4>;   // 128 threads, warp tiles 64 × 32, ≤ 255 registers
using Shape128x128 = Shape<4, 4, 2, 4, 1, 4>;  // 256 threads, dense only (grouped tiles hold ≤ 64 tokens)
static_assert(Shape64x64::kTokens >= kMatmulTileTokens && Shape128x64::kTokens >= kMatmulTileTokens,
              "grouped tiles must fit one block");

template <class S, int Bits, bool SwiGLU>
void launch(const MatmulArgs& a, const DMat& up, cudaStream_t stream) {
  auto kernel = matmul_int8_kernel<S, Bits, SwiGLU>;
  const size_t smem = Plan<S, Bits>::smem(int(a.w.cols / kStepK));
  // The shared-memory opt-in, once (before any graph capture: runners warm up first).
  static const int limit = qtile::allow_dynamic_smem(reinterpret_cast<const void*>(kernel));
  TERN_CHECK(smem <= size_t(limit), "matmul_int8: ", a.w.cols, " columns need ", smem, " bytes of shared memory, more ",
             "than the device's ", limit);
  const bool grouped = a.tile_expert != nullptr;
  const int64_t tiles = grouped ? a.max_tiles : (a.tokens + S::kTokens - 1) / S::kTokens;
  TERN_CHECK(tiles <= 65535, "matmul_int8: ", tiles, " token tiles exceed the grid limit");
  const dim3 grid(blocks_for(a.w.rows, SwiGLU ? S::kRows / 2 : S::kRows), unsigned(tiles));
  launch_pdl(SwiGLU ? "matmul_swiglu (int8 tensor cores)" : "matmul (int8 tensor cores)", kernel, grid,
             dim3(S::kThreads), smem, stream, a, up);
}

// The shape `automatic` stands for (TERN_INT8_TILE=1..3 picks another, for measurements).
Int8Tile default_tile() {
  static const Int8Tile t = [] {
    const char* e = std::getenv("TERN_INT8_TILE");
    const int v = e ? std::atoi(e) : 0;
    return v >= 1 && v <= 3 ? Int8Tile(v) : Int8Tile::b64x64;
  }();
  return t;
}

template <int Bits, bool SwiGLU>
void launch_tile(const MatmulArgs& a, const DMat& up, Int8Tile tile, cudaStream_t stream) {
  if (tile == Int8Tile::automatic) tile = default_tile();
  if (tile == Int8Tile::b128x128 && a.tile_expert) tile = Int8Tile::b64x64;
  switch (tile) {
    case Int8Tile::b128x64: launch<Shape128x64, Bits, SwiGLU>(a, up, stream); return;
    case Int8Tile::b128x128: launch<Shape128x128, Bits, SwiGLU>(a, up, stream); return;
    default: launch<Shape64x64, Bits, SwiGLU>(a, up, stream); return;
  }
}

template <bool SwiGLU>
void run(const MatmulArgs& a, const DMat& up, Int8Tile tile, cudaStream_t stream) {
  TERN_CHECK(matmul_int8_takes(a.w), "matmul_int8: needs 4-bit or 8-bit affine weights of group 64 with cols a ",
             "multiple of 512 and aligned arrays; got ", a.w.rows, "x", a.w.cols);
  TERN_CHECK(a.x_q16 != nullptr && a.x_q16_cols == a.w.cols && reinterpret_cast<uintptr_t>(a.x_q16) % 16 == 0,
             "matmul_int8: x_q16 must be x quantised for the matrix's ", a.w.cols, " columns (got ", a.x_q16_cols,
             "), 16-byte aligned");
  if (SwiGLU) {
    TERN_CHECK(a.w.format == WeightFormat::affine4 && up.format == a.w.format && up.rows == a.w.rows &&
                   up.cols == a.w.cols && up.experts == a.w.experts && matmul_int8_takes(up),
               "matmul_int8_swiglu: needs two 4-bit matrices of one shape; got ", a.w.rows, "x", a.w.cols, " and ",
               up.rows, "x", up.cols);
  }
  mm::check_tile_tokens(a, kMatmulTileTokens, "matmul_int8");  // the grouped shapes hold 64 tokens
  const bool grouped = a.tile_expert != nullptr;
  if (a.w.rows == 0 || (grouped ? a.max_tiles <= 0 : a.tokens <= 0)) return;
  if (a.w.format == WeightFormat::affine8) {
    if constexpr (!SwiGLU) launch_tile<8, false>(a, up, tile, stream);
  } else {
    launch_tile<4, SwiGLU>(a, up, tile, stream);
  }
}

template <int Bits>
size_t smem_of(Int8Tile tile, int groups) {
  switch (tile) {
    case Int8Tile::b128x64: return Plan<Shape128x64, Bits>::smem(groups);
    case Int8Tile::b128x128: return Plan<Shape128x128, Bits>::smem(groups);
    default: return Plan<Shape64x64, Bits>::smem(groups);
  }
}

}  // namespace i8
}  // namespace

bool matmul_int8_tile_fits(Int8Tile tile, int64_t cols, int bits) {
  if (tile == Int8Tile::automatic) tile = i8::default_tile();
  const int groups = int(cols / i8::kStepK);
  const size_t smem = bits == 8 ? i8::smem_of<8>(tile, groups) : i8::smem_of<4>(tile, groups);
  return smem <= size_t(qtile::max_dynamic_smem());
}

bool matmul_int8_takes(const DMat& w) {
  const auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  const int bits = w.format == WeightFormat::affine4 ? 4 : w.format == WeightFormat::affine8 ? 8 : 0;
  return bits != 0 && w.data && w.scales && w.biases && w.group_size == i8::kStepK && w.cols > 0 &&
         w.cols % 512 == 0 && w.row_words == w.cols * bits / 32 && w.groups_per_row == w.cols / 64 &&
         aligned(w.data, 16) && aligned(w.scales, 16) && aligned(w.biases, 4);
}

void matmul_quantize_x(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out, cudaStream_t stream,
                       void* residual) {
  if (rows <= 0 || cols <= 0) return;
  TERN_CHECK(cols % 128 == 0 && ldx % 4 == 0 && ldx >= cols && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(residual) % 16 == 0,
             "matmul_quantize_x: needs cols a multiple of 128, ldx a multiple of 4 and 16-byte aligned buffers; got ",
             "cols ", cols, ", ldx ", ldx);
  const int64_t words = rows * (cols / 8);
  const int64_t blocks = std::min<int64_t>((words + 255) / 256, int64_t(qtile::sm_count()) * 8);
  launch_pdl("matmul_quantize_x", i8::quantize_x_kernel, dim3(unsigned(blocks)), dim3(256), 0, stream, x, ldx, rows,
             cols, static_cast<unsigned char*>(out), static_cast<unsigned char*>(residual));
}

void matmul_int8(const MatmulArgs& a, cudaStream_t stream, Int8Tile tile) { i8::run<false>(a, DMat{}, tile, stream); }

void matmul_int8_swiglu(const MatmulArgs& gate, const DMat& up, cudaStream_t stream, Int8Tile tile) {
  i8::run<true>(gate, up, tile, stream);
}

}  // namespace tern::cuda
