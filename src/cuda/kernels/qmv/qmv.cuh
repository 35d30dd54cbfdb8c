// Decode-time matrix-vector products (a few tokens, T <= 8): y = W · x̂ for every weight format, at memory
// bandwidth. 4-bit affine weights run on the tensor cores (mma.sync m16n8k16, weight rows on M, tokens on N), the
// nibbles dequantised in registers, the group scale and bias folded as s·Σq·x + b·Σx. An optional RMSNorm of the
// input is computed in each block's prologue, so no separate norm kernel runs before a projection.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/l2_ranges.h"
#include "cuda/weights/device_weights.cuh"

namespace tern::cuda {

constexpr int kQmvMaxTokens = 8;  // tokens per call (the mma's N)

// y[t, r] (+)= Σ_c W[expert][r, c] · x̂[t, c],  t < T, r < rows
//   x̂[t, :] = x[t, :]                                        when norm_w == nullptr
//   x̂[t, :] = x[t, :] · rsqrt(mean(x[t, :]²) + eps) · norm_w   otherwise (RMSNorm, fp32)
// x fp32 [T, w.cols] (row stride ldx); y fp32 [T, w.rows] (row stride ldy); expert selects a slice of a stacked W.
// x and y must not overlap; norm_w 16-byte aligned. The first call (per kernel variant) sets the kernel's dynamic
// shared-memory limit: make it outside graph capture (a warm-up step).
// Paths: affine4 with group 64 and cols % 256 == 0 runs on the tensor cores (qmv_tile.cuh) with activations
// split into fp16 hi + lo (a power-of-two scale per token and 64-column group keeps them in range; two MMAs per A
// fragment, q exact: the products are ≈ fp32, ~2^-22 of the output's size):
// a persistent grid of one wave whose warps stream equal shares of the weights through a register ring, the first
// ring of loads issued before pdl_wait(); with the norm, x·norm_w is staged and the output multiplied by the token's
// rsqrt(mean(x²) + eps). Every other matrix takes an fp32 SIMT path (dmat_load8). TERN_QMV_DEPTH=4|6|8 and
// TERN_QMV_BPS=1|2 (ring depth, blocks per SM) are for tuning runs (qtile::set_tuning in the workbench);
// TERN_QMV_VARIANT=0|1|2|3 picks the kernels (0: 2 groups per warp step, the first kernel; 1: 4 groups, half the
// per-step overhead per weight byte, depth/2 steps in flight; 2: variant 1's steps copied by cp.async into per-warp
// shared-memory stages, 4 rows × 128 contiguous bytes per warp copy, bit-identical to 1; 3, the default: one-token
// products through the integer path of qmv_dp4a.cuh where it applies, the rest as variant 1).
struct QmvArgs {
  DMat w;
  int64_t expert = 0;
  const float* x = nullptr;
  int64_t ldx = 0;
  int T = 1;
  const float* norm_w = nullptr;  // [w.cols] or nullptr
  float eps = 1e-6f;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;        // y += (the residual add) instead of y =
  // Ranges for the kernels after this one that the kernel asks L2 for before its pdl_wait (l2_prefetch.cuh); one
  // token on the integer path (qmv_dp4a) only, other paths ignore them.
  L2Ranges l2_ahead;
  // Device scratch for the batched integer tensor-core product (qmv_dp4a_mma_batched, B >= 2 tokens; ignored by
  // every other path): xq_bytes >= qmv_dp4a_mma_scratch_bytes(B, w.cols) bytes, 16-byte aligned, into which the
  // activations are quantised once per product (unless TERN_QMV_PREQUANT=0). Null: every block quantises them.
  void* xq = nullptr;
  size_t xq_bytes = 0;
  // The tables in xq for these B tokens are already written, complete when the kernel before this product completes
  // (producer tables: qmv_dp4a_mma.cuh, qmv_dp4a_set_producer_tables): no pre-quantising kernel runs.
  bool xq_written = false;
};
void qmv(const QmvArgs& a, cudaStream_t stream);
// Whether qmv runs this product (one token) on the integer path of qmv_dp4a.cuh (variant 3 and the shape fits):
// what the batched decode step checks before it gives a product to qmv_dp4a_batched, whose tokens must come out as
// qmv gives them alone.
bool qmv_takes_dp4a(const QmvArgs& a);

// The variant of the 4-bit decode kernels (qmv, MoE gate_up and down): 0 (2 groups per warp step), 1 (4 groups),
// 2 (qmv: variant 1 through a cp.async shared-memory pipeline; MoE: variant 1) or 3, the default (one token: the
// integer paths of qmv_dp4a.cuh and moe_dp4a.cuh where they apply; everything else: variant 1);
// TERN_QMV_VARIANT sets the initial value. For tests and tuning runs; set it outside capture.
int qmv_variant();
void qmv_set_variant(int v);

}  // namespace tern::cuda
