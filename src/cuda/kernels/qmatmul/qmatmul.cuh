// Matrix-vector and matrix-matrix products y = x · Wᵀ with W in any DMat format (f32, bf16, MLX affine 4/8-bit),
// dequantised in registers (never materialised). fp32 activations, fp32 accumulation (or, on the tensor cores, a
// split of x and exact weights that keep fp32-level accuracy).
#pragma once

#include <cuda_runtime.h>

#include "cuda/weights/device_weights.cuh"

namespace tern::cuda {

// Batch-1 product over `slots` independent (expert, input, output) triples:
//   y[s] (+)= W[ids[s]] · x[s]        x[s] = x + s*x_stride (x_stride 0: one shared input), y[s] = y + s*y_stride.
// ids may be a device array (routing stays on the GPU); nullptr means expert 0 for every slot.
struct GemvArgs {
  DMat w;
  const float* x = nullptr;   // [slots or 1, cols]
  int64_t x_stride = 0;
  float* y = nullptr;         // [slots, rows]
  int64_t y_stride = 0;
  const int* ids = nullptr;   // [slots] expert per slot (device)
  int slots = 1;
  bool accumulate = false;    // y += instead of y =
};
void gemv(const GemvArgs& a, cudaStream_t stream);

constexpr int kMatmulTileTokens = 64;  // tokens per tile (grouped tiles hold at most this many)

// Tiled product over many tokens. Dense mode: x [tokens, cols] (row stride ldx) -> y [tokens, rows] (ldy).
// Grouped mode (tile_expert set): tile t multiplies expert tile_expert[t] with the x rows gather[p] for the sorted
// positions p in [tile_start[t], tile_start[t] + tile_count[t]) and writes y rows p. Tiles >= *num_tiles exit, so
// the grid (max_tiles) is fixed on the host while the routing is known only on the device.
//
// 4-bit weights (group 64, cols a multiple of 128, x 16-byte aligned with ldx a multiple of 4) run on the tensor
// cores (mma.sync m16n8k16, bf16 operands, fp32 accumulation) at near-fp32 accuracy: the weights enter as the exact
// integers q − 8 and each group's scale and bias are applied in fp32 (w·x = s·Σ(q−8)·x + (b + 8s)·Σx), and x enters
// as two bf16 terms x ≈ hi + lo (hi = bf16(x), lo = bf16(x − hi): 16 significant bits, relative error ≤ 2^-16), so
// results differ from the fp32 CPU product by ~3e-6 of its rms. Every other case (8-bit, bf16, f32, odd shapes)
// takes the fp32 SIMT kernel.
struct MatmulArgs {
  DMat w;
  const float* x = nullptr;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t tokens = 0;              // dense mode
  bool accumulate = false;
  const int* tile_expert = nullptr;  // grouped mode, [max_tiles]
  const int* tile_start = nullptr;
  const int* tile_count = nullptr;
  const int* num_tiles = nullptr;    // [1]
  int max_tiles = 0;
  // Grouped mode: the most positions a tile holds (moe_group's `tile`, 1 .. kMatmulTileTokens; checked). The Hopper
  // warpgroup kernel runs blocks of the narrowest of 16, 32 and 64 tokens that holds them; the other kernels' blocks
  // hold 64 tokens whatever it is (they read each tile's count).
  int tile_tokens = kMatmulTileTokens;
  const int* gather = nullptr;       // [positions] x row of each sorted position (nullptr: identity)
  // Optional, read by the 4-bit tensor-core kernel only: x already split by matmul_prepare_x, indexed by the same
  // row numbers as x (x_prep row i is x row i; gather indexes both), prepared for x_prep_cols columns, which must be
  // w.cols (checked). The kernel then copies it instead of splitting x in every block (same bytes, no conversion);
  // results are bit-identical. x must still be set (the fallback reads it).
  const void* x_prep = nullptr;
  int64_t x_prep_cols = 0;
  // x_prep holds matmul_prepare_x_f16x2's layout (qmatmul_wgmma.cuh: fp16 hi + lo with a per-token scale, 22
  // significant bits) instead of bf16 hi + lo: only the Hopper warpgroup kernel reads it (MatmulTile::wgmma; the
  // mma.sync kernel refuses it, the others do not read x_prep).
  bool x_prep_f16 = false;
  // Optional: x quantised to 16 bits by matmul_quantize_x (qmatmul_int8.cuh) for x_q16_cols == w.cols columns, same
  // row numbers as x. When set, matmul and matmul_swiglu run the integer tensor-core kernel (matmul_int8), which
  // must take the matrix (matmul_int8_takes), and ignore `tile`.
  const void* x_q16 = nullptr;
  int64_t x_q16_cols = 0;
  // Optional: x as fp16 with a per-token scale by matmul_prepare_x_f16 (qmatmul_wgmma.cuh) for x_f16_cols == w.cols
  // columns, same row numbers as x. When set, matmul and matmul_swiglu run the Hopper warpgroup kernel
  // (matmul_wgmma), which must take the matrix (matmul_wgmma_available, matmul_wgmma_takes), and ignore `tile`.
  // Checked before x_q16.
  const void* x_f16 = nullptr;
  int64_t x_f16_cols = 0;
};

// Block shape of the product: `automatic` picks by format and shape; the others force one kernel (tests and the
// workbench compare them). tcRxT: the tensor-core kernel with R weight rows × T tokens per block, warp tiles of 64
// rows × 32 tokens, except tc256x64w: 8 warps of 32 rows × 64 tokens (every warp on all the tile's tokens). A forced
// tensor-core shape falls back to simt where the tensor-core kernel cannot take the matrix. tc_bf16: the previous
// kernel (x and s·q + b rounded to bf16, ~2.5e-3 of the rms off fp32; its own automatic block shape; never reads
// x_prep), kept for speed and accuracy comparisons only.
// wgmma: the Hopper warpgroup kernel on x_prep (qmatmul_wgmma.cuh, WgmmaX::split, or split_f16 with x_prep_f16; it
// must take the product).
enum class MatmulTile { automatic, simt, tc128x64, tc256x64, tc128x128, tc256x64w, tc_bf16, wgmma };
void matmul(const MatmulArgs& a, cudaStream_t stream, MatmulTile tile = MatmulTile::automatic);
// Whether `tile` (with or without a prepared x) fits this device's shared memory per block; automatic and simt always
// do (automatic chooses among the shapes that fit), wgmma where matmul_wgmma_available(). For tests that name shapes.
bool matmul_tile_fits(MatmulTile tile, bool prepared_x);

// The split x of matmul_prepare_x: row i at byte i · matmul_prepared_row_bytes(cols) of the buffer (16-byte aligned).
// A row holds, per group of 64 columns, 128 bytes of hi then 128 bytes of lo (bf16, each 8-column chunk stored as the
// pairs (0,4) (1,5) (2,6) (3,7)), then the fp32 sums Σ(hi + lo) of its groups (padded to 16 bytes).
constexpr int64_t matmul_prepared_row_bytes(int64_t cols) { return cols * 4 + ((cols / 16 + 15) / 16) * 16; }
constexpr int64_t matmul_prepared_bytes(int64_t rows, int64_t cols) { return rows * matmul_prepared_row_bytes(cols); }

// x [rows, cols] fp32 (row stride ldx) -> out (matmul_prepared_bytes(rows, cols) bytes, 16-byte aligned). cols a
// multiple of 64, ldx a multiple of 4, x 16-byte aligned. Launched with PDL; one pass over x.
void matmul_prepare_x(const float* x, int64_t ldx, int64_t rows, int64_t cols, void* out, cudaStream_t stream);

// SwiGLU of two products in one pass over x: y (+)= silu(x · Gᵀ) ⊙ (x · Uᵀ), G = gate.w and U = `up` (same shape),
// everything else (dense or grouped, gather, strides, accumulate) as matmul(gate). Tensor cores only: 4-bit
// matrices that matmul would run on them (matmul_swiglu_supported); throws tern::Error otherwise. `simt` means
// automatic here; tc_bf16 runs the previous bf16-operand kernel.
bool matmul_swiglu_supported(const MatmulArgs& gate, const DMat& up);
void matmul_swiglu(const MatmulArgs& gate, const DMat& up, cudaStream_t stream,
                   MatmulTile tile = MatmulTile::automatic);

}  // namespace tern::cuda
