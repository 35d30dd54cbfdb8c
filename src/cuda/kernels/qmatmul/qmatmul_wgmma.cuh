// Prefill products on Hopper's warpgroup tensor cores (wgmma, sm_90a): y (+)= x · Wᵀ for MLX affine 4-bit weights
// (group 64), many tokens, dense or grouped by expert, plain or SwiGLU (the MatmulArgs of qmatmul.cuh).
//
// The weights enter as their exact integers q (0..15, 16-bit floats in registers, never in memory), x as 16-bit
// floats from shared memory, fp32 accumulation; each group's sum is scaled in fp32 and the bias term b·Σx is the
// small product of matmul_tile.cuh. Three inputs:
//   one term (x_f16, from matmul_prepare_x_f16): x/σ rounded to fp16, σ a power of two per token (max|x/σ| in
//     [2^14, 2^15)): 11 significant bits, relative error ≤ 2^-12 per element; the result is σ times the fp32 product
//     of the weights and fp16(x/σ), up to fp32 summation;
//   two terms (x_prep, the split of matmul_prepare_x in qmatmul.cuh): x ≈ hi + lo in bf16 (16 significant bits),
//     twice the tensor work; the result is the fp32 product of the weights and hi + lo;
//   two fp16 terms (x_prep from matmul_prepare_x_f16x2, MatmulArgs::x_prep_f16): x/σ ≈ hi + lo in fp16 with the
//     one-term form's σ (22 significant bits), the same tensor work as bf16 hi + lo;
// A block is one warpgroup (4 warps) of 128 weight rows × N tokens; per group of 64 k the warpgroup issues 4 wgmma
// m64nNk16 per term of x (4 or 8) and 64-row tile into a scratch accumulator and folds it with the rows' scales.
// N = 64, except for grouped products whose tiles hold at most 32 or 16 tokens (MatmulArgs::tile_tokens): N = 32 or
// 16, so that a short chunk's few tokens per expert do not pay for 64 tokens of tensor work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/qmatmul/qmatmul.cuh"

namespace tern::cuda {

// One token of x as fp16: per group of 64 columns 128 bytes of x/σ (each 8-column chunk stored as the pairs (0,4)
// (1,5) (2,6) (3,7), as the hi half of matmul_prepare_x), then the fp32 sums of the rounded values of every group,
// then σ (fp32), padded to 128 bytes: in a 128-byte aligned buffer (the runner's arena aligns to 256) every row, and
// so every group's 128 bytes, starts on a 128-byte line. (On 16-byte boundaries the kernel's x reads from L2 took 5
// sectors a group instead of 4: fp16 hi + lo ran 7–21% slower than bf16 hi + lo on the same tensor work, and 1–13%
// with the padding; H100, docs/benchmarks.md, 48th session.)
constexpr int64_t matmul_f16_row_bytes(int64_t cols) { return cols * 2 + ((cols / 16 + 4 + 127) / 128) * 128; }
constexpr int64_t matmul_f16_bytes(int64_t rows, int64_t cols) { return rows * matmul_f16_row_bytes(cols); }

// x [rows, cols] fp32 (row stride ldx) -> out (matmul_f16_bytes(rows, cols), row i at i · matmul_f16_row_bytes).
// cols a multiple of 256, ldx a multiple of 4, x and out 16-byte aligned. Launched with PDL; two passes over each row
// (its max, then the conversion), a warp per row.
void matmul_prepare_x_f16(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out, cudaStream_t stream);

// x as two fp16 terms: per group of 64 columns 128 bytes of hi = fp16(x/σ), then 128 of lo = fp16(x/σ − hi) (each in
// the one-term form's chunk order), then the fp32 sums of hi + lo of every group, then σ (fp32), padded to 128 bytes;
// σ as matmul_prepare_x_f16's. hi + lo holds x/σ to 22 significant bits, or to 2^-25 absolute below 2^-17 of the
// row's max (lo subnormal): the product's error against that of x itself is then at most ~2^-23 of Σ|w·x|, the size
// of the kernel's own fp32 summation error, for the cost of bf16 hi + lo. Same arguments and checks as
// matmul_prepare_x_f16.
constexpr int64_t matmul_f16x2_row_bytes(int64_t cols) { return matmul_f16_row_bytes(cols) + cols * 2; }  // + lo
constexpr int64_t matmul_f16x2_bytes(int64_t rows, int64_t cols) { return rows * matmul_f16x2_row_bytes(cols); }
static_assert(matmul_f16_row_bytes(512) % 128 == 0 && matmul_f16x2_row_bytes(2048) % 128 == 0,
              "the fp16 forms' rows on 128-byte lines");
void matmul_prepare_x_f16x2(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out,
                            cudaStream_t stream);

// Whether this device runs the kernel (an sm_90a binary on a Hopper GPU) and it takes w (affine 4-bit, group 64,
// cols a multiple of 512, 16-byte aligned words and scales, 4-byte aligned biases).
bool matmul_wgmma_available();
bool matmul_wgmma_takes(const DMat& w);

// Which x the kernel reads: a.x_f16 (one fp16 term), a.x_prep (bf16 hi + lo), a.x_prep in the layout of
// matmul_prepare_x_f16x2 (split_f16); each must be prepared for w.cols columns and indexed by the same row numbers as x
// (gather indexes it). Throws tern::Error when the kernel cannot take the product. matmul() and matmul_swiglu() call
// the one-term form when a.x_f16 is set, the two-term ones for MatmulTile::wgmma with a.x_prep (split_f16 with
// a.x_prep_f16).
enum class WgmmaX { f16, split, split_f16 };

// The main loop of the 64-token blocks (dense products, grouped tiles of more than 32 tokens): plain, each k-step's
// MMAs issued, waited for and folded in turn; deferred, the next k-step's barrier, copies and first A fragments while
// a step's second row tile's MMAs run (two steps of copies ahead instead of three); automatic (the default),
// deferred for x as bf16 hi + lo and plain for the fp16 forms (H200, T = 4096: the bf16 hi + lo products 0.2–1.9%
// faster deferred, every one-term fp16 product and 6 of 9 fp16 hi + lo ones slower, by up to 8%; docs/benchmarks.md,
// 51st session). The same sums in the same order either way: the outputs are bit for bit the same. Default from
// TERN_WGMMA_BLOCK (auto, plain, deferred); the setter is for tests.
enum class WgmmaBlock { automatic, plain, deferred };
void matmul_wgmma_set_block(WgmmaBlock b);
WgmmaBlock matmul_wgmma_block();
void matmul_wgmma(const MatmulArgs& a, cudaStream_t stream, WgmmaX x = WgmmaX::f16);
void matmul_wgmma_swiglu(const MatmulArgs& gate, const DMat& up, cudaStream_t stream, WgmmaX x = WgmmaX::f16);

}  // namespace tern::cuda
