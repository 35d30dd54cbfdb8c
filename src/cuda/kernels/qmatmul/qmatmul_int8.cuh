// Prefill products on the integer tensor cores: y (+)= x · Wᵀ for MLX affine 4-bit and 8-bit weights (group 64),
// many tokens, dense or grouped by expert (the MatmulArgs of qmatmul.cuh, with x_q16 set).
//
// x is quantised once per product input by matmul_quantize_x, as the one-token integer path does (dp4a_tile.cuh):
// per token and group of 64 columns m = max|x|, v = rint(x·32639/m) (16 bits; v = 0 when m < 2^-100), σ = m/32639
// truncated to 22 significant bits, and v = 256·hi + lo with hi, lo int8. The kernel multiplies the weights'
// integers q (0..15 or 0..255, as u8) with hi and with lo on mma.sync m16n8k32 (u8 × s8, s32 accumulators: exact),
// and folds every group in fp32:
//   y += s·σ·(256·Σq·hi + Σq·lo) + b·(σ·Σv).
// So the result equals the fp32 product of the weights and x' = σ·v up to fp32 summation; x' is within
// m/65278 of x per element. Four int8 MMAs per 64 k against the eight bf16 MMAs of the split-x kernel (qmatmul.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/qmatmul/qmatmul.cuh"

namespace tern::cuda {

// One token's quantised x: per group of 64 columns 8 × 16 bytes (per 8-column word {even hi, odd hi, even lo, odd lo}:
// int8x4 of its columns 0,2,4,6 / 1,3,5,7, the layout of dp4a::quantize_word), then σ of every group (fp32), then
// σ·Σv of every group (fp32).
constexpr int64_t matmul_q16_row_bytes(int64_t cols) { return (cols / 64) * 136; }
constexpr int64_t matmul_q16_bytes(int64_t rows, int64_t cols) { return rows * matmul_q16_row_bytes(cols); }

// x [rows, cols] fp32 (row stride ldx) -> out (matmul_q16_bytes(rows, cols), row i at i · matmul_q16_row_bytes).
// cols a multiple of 128, ldx a multiple of 4, x and out 16-byte aligned. Launched with PDL; one pass over x.
// residual (optional, out's layout): the rest r = x − σ·v quantised the same way (|r| ≤ ~σ/2, so its own rounding is
// ~m/4·10⁹). Two products, one on out and one accumulating on residual, then take x to fp32's precision (the
// prefill router's exact form, issue 29).
void matmul_quantize_x(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out, cudaStream_t stream,
                       void* residual = nullptr);

// Whether the integer kernel takes w: affine 4-bit or 8-bit, group 64, cols a multiple of 512, 16-byte aligned words
// and scales, 4-byte aligned biases.
bool matmul_int8_takes(const DMat& w);

// matmul / matmul_swiglu (qmatmul.cuh) from a.x_q16 (x quantised by matmul_quantize_x for a.x_q16_cols == w.cols
// columns, indexed by the same row numbers as x; a.x is not read). Throws tern::Error when the kernel cannot take
// the product. matmul() and matmul_swiglu() call these when x_q16 is set.
// Block shapes (the workbench compares them; `automatic`, the 64x64 one, is what matmul() runs): weight rows ×
// tokens per block. 64x64: 4 warps with tiles of 32 rows × 32 tokens, ≤ 168 registers, 3 blocks per SM; 128x64:
// 4 warps of 64 × 32, ≤ 255 registers, 2 blocks per SM; 128x128: 8 warps of 64 × 32, one block per SM (dense
// products only; grouped ones run 64x64). On the H200 the three are within 5% of each other at the model's shapes
// (docs/benchmarks.md); others measured (warps of 64 × 16 or 32 × 32 at ≤ 128 registers, 256 × 64 blocks) were slower.
enum class Int8Tile { automatic, b64x64, b128x64, b128x128 };
// Whether the block shape `tile` (automatic: the default one) fits this device's shared memory per block for a
// matrix of `cols` columns and `bits` (4 or 8). For tests that name shapes.
bool matmul_int8_tile_fits(Int8Tile tile, int64_t cols, int bits);
void matmul_int8(const MatmulArgs& a, cudaStream_t stream, Int8Tile tile = Int8Tile::automatic);
void matmul_int8_swiglu(const MatmulArgs& gate, const DMat& up, cudaStream_t stream,
                        Int8Tile tile = Int8Tile::automatic);

}  // namespace tern::cuda
