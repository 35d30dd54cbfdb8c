// Device helpers shared by the tensor-core prefill products (qmatmul.cu: split-x bf16, qmatmul_int8.cu: integer,
// qmatmul_wgmma.cu: Hopper warpgroup MMAs): which tokens a block takes, which matrix row each of its rows reads (plain
// or SwiGLU blocks), a warp's accumulators and live token tiles, the bias term of the affine weights, and the epilogue
// that writes a warp's mma C fragments.
// Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cuda_bf16.h>

#include <cstdint>

#include "core/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda::mm {

// The block's tokens: dense mode, tokens [p0, p0 + count) of tile blockIdx.y; grouped mode, tile blockIdx.y of the
// device tile map (after pdl_wait: moe_group writes it). False when the block has no tile (grouped tiles past
// *num_tiles): the whole block returns.
__device__ __forceinline__ bool token_tile(const MatmulArgs& a, int tokens_per_block, int64_t& expert, int64_t& p0,
                                           int64_t& count) {
  expert = 0;
  if (a.tile_expert) {
    pdl_wait();
    if (int(blockIdx.y) >= *a.num_tiles) return false;
    expert = a.tile_expert[blockIdx.y];
    p0 = a.tile_start[blockIdx.y];
    count = a.tile_count[blockIdx.y];
  } else {
    p0 = int64_t(blockIdx.y) * tokens_per_block;
    count = a.tokens - p0 < tokens_per_block ? a.tokens - p0 : tokens_per_block;
  }
  return true;
}

// Host: that a grouped product's tiles (a.tile_tokens positions at most) fit blocks of block_tokens tokens. Kernels
// whose blocks read each tile's count (token_tile) take tiles of any width up to their own, so tiles built for the
// warpgroup kernel's narrower blocks (16 or 32 tokens) run correctly on 64-token blocks, only with idle tokens.
inline void check_tile_tokens(const MatmulArgs& a, int block_tokens, const char* what) {
  TERN_CHECK(a.tile_expert == nullptr || (a.tile_tokens >= 1 && a.tile_tokens <= block_tokens), what,
             ": grouped tiles of up to ", a.tile_tokens, " tokens, blocks of ", block_tokens);
}

// Block row i -> its matrix (m: a.w, or `up` for SwiGLU blocks) and row in the stacked matrix. Plain blocks: output
// row row0 + i. SwiGLU blocks (kMTiles row tiles of 16 per warp, warps stacked along rows): in each warp the first
// kMTiles/2 row tiles are gate rows, the others the same rows of up. Rows past the matrix repeat its last row (their
// outputs are dropped).
template <bool SwiGLU, int kMTiles>
__device__ __forceinline__ int64_t block_row_source(const MatmulArgs& a, const DMat& up, int64_t row0, int64_t expert,
                                                    int i, const DMat*& m) {
  int64_t r = row0 + i;
  m = &a.w;
  if constexpr (SwiGLU) {
    constexpr int kHalf = kMTiles / 2;
    const int wmi = i / (16 * kMTiles), mi = (i / 16) % kMTiles;
    r = row0 + wmi * 8 * kMTiles + (mi % kHalf) * 16 + i % 16;
    if (mi >= kHalf) m = &up;
  }
  const int64_t rows = a.w.rows;
  return expert * rows + (r < rows ? r : rows - 1);
}

// The block rows' scales (bf16, G per row, G % 8 == 0) into shared memory at dst (a shared-window address), block
// row i at i·ld bf16, by cp.async in 16-byte pieces over the block's threads; source(i, m) gives block row i's matrix
// m and stacked row (block_row_source). Launch constants: callers may copy them before pdl_wait.
template <class Source>
__device__ __forceinline__ void copy_block_scales(uint32_t dst, int rows, int ld, int G, int64_t groups_per_row,
                                                  Source&& source) {
  for (int i = threadIdx.x; i < rows * (G / 8); i += blockDim.x) {
    const int row = i / (G / 8), piece = i % (G / 8);
    const DMat* m;
    const int64_t r = source(row, m);
    cp_async_16(dst + (row * ld + piece * 8) * 2, m->scales + r * groups_per_row + piece * 8, 16);
  }
}

// A warp's mma accumulators, [MT row tiles][NT token tiles][4 C-fragment values], set to zero.
template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;
}

// How many of the warp's NT n8 token tiles (tokens wtok0 .. wtok0 + 8·NT − 1 of the block's tile) hold any of the
// tile's count tokens: 0..NT, warp-uniform.
template <int NT>
__device__ __forceinline__ int live_n8_tiles(int64_t count, int wtok0) {
  return count - wtok0 <= 0 ? 0 : (count - wtok0 >= 8 * NT ? NT : int(count - wtok0 + 7) / 8);
}

// Writes a warp's outputs: acc[mi][ni] are the C fragments (c0, c1 = row g, tokens 2t, 2t + 1; c2, c3 = row g + 8)
// of output rows wrow0 + 16·mi and tokens wtok0 + 8·ni of the block's tile (SwiGLU: silu(gate tile mi) · up tile
// mi + kMTiles/2). Rows past the matrix and tokens past the tile are dropped; y (+)= as a.accumulate says.
// LoadFirst (the warpgroup kernel's): with a.accumulate a row tile's old values are all loaded before its first store.
// Loads and stores interleaved (y + v, store, the next load) are one memory round trip per output, since the compiler
// cannot tell that a store does not alias the next load: 64 round trips a thread in the warpgroup kernel's 2 x 8-tile
// warp, 2 this way (docs/benchmarks.md, fifty-fourth session). The other kernels keep the interleaved form: their
// register budgets (ptxas: spills in the mma.sync kernels' wide shapes) leave no room for a tile's old values.
template <bool SwiGLU, int kMTiles, int kNTiles, bool LoadFirst = false>
__device__ __forceinline__ void store_warp_tile(const MatmulArgs& a, const float (&acc)[kMTiles][kNTiles][4],
                                                int64_t wrow0, int wtok0, int g, int t, int64_t p0, int64_t count) {
  constexpr int kOutTiles = SwiGLU ? kMTiles / 2 : kMTiles;
  auto out = [&](int mi, int ni, int c, float*& yp) {  // the output of fragment (mi, ni, c): false past the tile
    const int64_t r = wrow0 + 16 * mi + g + (c / 2) * 8;
    const int n = wtok0 + 8 * ni + 2 * t + c % 2;
    yp = a.y + (p0 + n) * a.ldy + r;
    return r < a.w.rows && n < count;
  };
  auto value = [&](int mi, int ni, int c) {
    float v = acc[mi][ni][c];
    if constexpr (SwiGLU) v = v / (1.0f + expf(-v)) * acc[mi + kOutTiles][ni][c];
    return v;
  };
  if (LoadFirst && a.accumulate) {
#pragma unroll
    for (int mi = 0; mi < kOutTiles; ++mi) {  // a row tile at a time: 4·kNTiles registers for the old values
      float old[kNTiles][4];
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float* yp;
          old[ni][c] = out(mi, ni, c, yp) ? *yp : 0.0f;
        }
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float* yp;
          if (out(mi, ni, c, yp)) *yp = old[ni][c] + value(mi, ni, c);
        }
    }
    return;
  }
#pragma unroll
  for (int mi = 0; mi < kOutTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t r = wrow0 + 16 * mi + g + (c / 2) * 8;
        const int n = wtok0 + 8 * ni + 2 * t + c % 2;
        if (r < a.w.rows && n < count) {
          float v = acc[mi][ni][c];
          if constexpr (SwiGLU) v = v / (1.0f + expf(-v)) * acc[mi + kOutTiles][ni][c];
          float* yp = a.y + (p0 + n) * a.ldy + r;
          *yp = a.accumulate ? *yp + v : v;
        }
      }
    }
  }
}

// Two fp32 values -> three bf16x2 terms (hi, mid, lo; each pair in one register, the first value in the low half)
// whose sum is each value to 24 significant bits.
__device__ __forceinline__ void split3_bf16x2(float a, float b, uint32_t out[3]) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    out[i] = *reinterpret_cast<const uint32_t*>(&h);
    a -= __low2float(h);
    b -= __high2float(h);
  }
}

// The bias term of affine weights, acc += Σ_g b[r][g]·β[n][g] (β: the token's per-group sum of the x the products
// saw, scaled as they were), over k-steps of 16 groups on the bf16 tensor cores (m16n8k16: A = the rows' biases, exact
// in bf16; B = β in three bf16 terms, 24 significant bits). brow[mi][h]: the biases (bf16 [G]) of row g + 8h of the
// warp's row tile mi; beta[ni]: β (fp32 [G]) of token 8·ni + g of its token tiles, nullptr past the tile. Thread
// (g, t) takes groups 2t, 2t + 1 (+8) of each k-step. Groups past the row (G not a multiple of 16) are 0.
template <int MT, int NT>
__device__ __forceinline__ void add_bias_term(float (&acc)[MT][NT][4], const uint32_t* const (&brow)[MT][2],
                                              const float* const (&beta)[NT], int G, int t) {
  for (int kb = 0; kb < G; kb += 16) {
    auto bias_word = [&](const uint32_t* row, int k) { return k < G ? row[k / 2] : 0u; };  // groups k, k + 1
    uint32_t bb[NT][2][3];  // [ni][k-slot half][term]
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = kb + 2 * t + 8 * h;
        float2 b = make_float2(0.f, 0.f);
        if (beta[ni] && k < G) b = *reinterpret_cast<const float2*>(beta[ni] + k);
        split3_bf16x2(b.x, b.y, bb[ni][h]);
      }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      const uint32_t af[4] = {bias_word(brow[mi][0], kb + 2 * t), bias_word(brow[mi][1], kb + 2 * t),
                              bias_word(brow[mi][0], kb + 2 * t + 8), bias_word(brow[mi][1], kb + 2 * t + 8)};
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int term = 0; term < 3; ++term) mma_bf16_16816(acc[mi][ni], af, bb[ni][0][term], bb[ni][1][term]);
    }
  }
}

// f(in, r, w, v) for every 8-column word w of every row r of x (fp32 [rows, cols], row stride ld, cols % 64 == 0,
// 16-byte aligned rows), v its 8 values: one thread per word, in a warp-uniform loop so that f may shuffle (the 8
// words of a group of 64 lie in 8 consecutive lanes, all in or all out). Lanes past the end get in = false, r = w = 0
// and zeros. The x-preparation kernels of both tensor-core prefill products.
template <class F>
__device__ __forceinline__ void for_each_x_word(const float* x, int64_t ld, int64_t rows, int64_t cols, F&& f) {
  const int64_t words = cols / 8, n = rows * words;
  const int lane = threadIdx.x % 32;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x + (threadIdx.x - lane); base < n;
       base += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = base + lane;
    const bool in = i < n;
    const int64_t r = in ? i / words : 0, w = in ? i % words : 0;
    float v[8] = {};
    if (in) {
      const float4* src = reinterpret_cast<const float4*>(x + r * ld + w * 8);
      const float4 p = src[0], q = src[1];
      v[0] = p.x; v[1] = p.y; v[2] = p.z; v[3] = p.w; v[4] = q.x; v[5] = q.y; v[6] = q.z; v[7] = q.w;
    }
    f(in, r, w, v);
  }
}

}  // namespace tern::cuda::mm
