// One-token 4-bit matrix-vector product on the CUDA cores with integer dot products (dp4a): the T = 1 path of qmv
// (qmv.cuh), for affine4 matrices with group 64 and cols of 1024, 2048 or 4096. qmv_dp4a_batched runs it for one
// token of each of B sequences in one launch, each token's result bit for bit its one-token result.
//
// Why a second path: the tensor-core kernels (qmv_tile.cuh) stage x in shared memory and read the weights in the
// mma fragment order (8 bytes of each of 16 rows per warp load). For one token this path reads a row as 512-byte
// contiguous warp loads, keeps the activations in registers and has no shared-memory staging or block reduction.
//
// Numerics: x̂ (x, or x·norm_w for the RMSNorm, whose rsqrt(mean(x²) + eps) multiplies the output) is quantised per
// group of 64 columns to 16-bit integers v = rint(x̂·(32639/m)), m = max|x̂| of the group, σ = m/32639 (a group with
// m < 2^-100 to zeros: dp4a_tile.cuh), and v split into int8 hi and lo (v = 256·hi + lo). Σ q·v over a group is
// exact in int32 (dp4a chains), and the group adds s·σ·Σq·v + b·σ·Σv in fp32. The activations' error is at most σ/2
// per element (m/65278 of its group's largest), the weights are exact: ~2^-16 of the group maximum against ~2^-22
// for the tensor-core path's fp16 hi + lo. By default the activations are 24-bit instead
// (v = rint(x̂·(8355711/m)) = 65536·hi + 256·mid + lo, six dp4a per 8 weights, error ≤ m/16.7M): on weights at
// trained scales the 16-bit form's error moved the one-token decode's mean KL against an fp32 reference from ~1e-5
// to 1.4e-3 (TERN_QMV_DP4A_BITS=16 brings it back, for comparison).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/qmv/qmv.cuh"

namespace tern::cuda {

// Whether qmv_dp4a can take this product (T = 1, affine4 group 64, cols ∈ {1024, 2048, 4096}, aligned words).
bool qmv_dp4a_supported(const QmvArgs& a);
// y (+)= W · x̂ for one token; a as for qmv. Throws tern::Error when !qmv_dp4a_supported(a).
void qmv_dp4a(const QmvArgs& a, cudaStream_t stream);
// Rows per warp batch (2, the default, 4 or 8; always 2 for 4096 columns); for tuning runs of the workbench.
void qmv_dp4a_set_rows_per_batch(int r);
// 24-bit activations (true, the default unless TERN_QMV_DP4A_BITS=16) or 16-bit; for tests and comparisons.
void qmv_dp4a_set_wide(bool wide);
bool qmv_dp4a_wide();
// Under qmv variant 3, products with fewer rows take the tensor-core path (TERN_QMV_DP4A_MIN_ROWS, default 0).
int64_t qmv_dp4a_min_rows();

// ---- a batch of sequences, one token each (the batched decode step, issue 31) ----
constexpr int kBatchMaxTokens = 32;  // tokens (sequences) per batched call
// B tokens of B different sequences, each bit for bit what qmv_dp4a(a) gives for that token alone: x row b at
// a.x + b·a.ldx, y row b at a.y + b·a.ldy (the RMSNorm, when a.norm_w is set, per token). a.T must be 1 and
// qmv_dp4a_supported(a) true; 1 <= B <= kBatchMaxTokens; for B > 1 ldx >= cols (a multiple of 4) and ldy >= rows.
// B >= 2 runs on the integer tensor cores where qmv_dp4a_mma_supported (qmv_dp4a_mma.cuh), else on dp4a in tiles of
// 8 tokens (grid.y), each weight batch folded with every token of the tile in turn; a.l2_ahead is asked for once.
// The tensor-core form quantises the tokens once into a.xq where given (qmv_dp4a_mma.cuh says how much), else in
// every block. B = 1 is qmv_dp4a(a).
void qmv_dp4a_batched(const QmvArgs& a, int B, cudaStream_t stream);
// Whether B >= 2 may take the tensor-core form (true unless TERN_QMV_BATCHED_MMA=0); for tests and comparisons.
void qmv_dp4a_set_batched_mma(bool on);
bool qmv_dp4a_batched_mma();
// Whether the tensor-core form uses a.xq where given (true unless TERN_QMV_PREQUANT=0; the same bits either way); for
// tests and comparisons.
void qmv_dp4a_set_prequant(bool on);
bool qmv_dp4a_prequant();

}  // namespace tern::cuda
