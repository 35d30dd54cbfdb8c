// The batched one-token integer product on the integer tensor cores (mma.sync m16n8k32, u8 × s8): what
// qmv_dp4a_batched runs for B >= 2 tokens when it applies. Each token's rows come out bit for bit as qmv_dp4a gives
// them for that token alone: the exact integer sums of every 64-column group come from the tensor cores instead of
// dp4a chains, and the fp32 arithmetic after them (dot rounding, scale and bias terms, the per-group leaves and the
// pairwise tree of the 16 group positions) is made in the one-token kernel's order (qmv_dp4a_mma.cu says how).
//
// Why: the dp4a form folds every loaded weight batch with each token in turn (24 dp4a per 32 columns per token, plus
// the activations re-read from shared memory per token); at 8 tokens that made the GDN in_proj 44 µs against 10 µs for
// one token (docs/benchmarks.md). Here one m16n8k32 instruction does 16 rows × 8 tokens × 32 columns.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"

namespace tern::cuda {

// Whether qmv_dp4a_mma_batched can take B tokens of this product: qmv_dp4a_supported(a), 24-bit activations (the
// default), 2 <= B <= kBatchMaxTokens, 16-byte aligned scales and biases, ldx a multiple of 4, and the block's shared
// memory within the device's limit (223 KB for 4096 columns: Hopper; Ampere's 4096-column products stay on dp4a).
bool qmv_dp4a_mma_supported(const QmvArgs& a, int B);
// Whether this device's shared memory per block holds the kernel's layout for `cols` columns (4096 columns take
// 223 KB: Hopper only; 1024 and 2048 fit 99 KB).
bool qmv_dp4a_mma_fits(int64_t cols);
// y (+)= W · x̂ for B tokens (x row b at a.x + b·a.ldx, y row b at a.y + b·a.ldy), each bit for bit qmv_dp4a's.
// With a.xq (a.xq_bytes >= qmv_dp4a_mma_scratch_bytes(B, cols), 16-byte aligned; checked) a first small kernel
// quantises the B tokens once into it and the product's blocks copy their token tile's tables from there; without it
// every block quantises its tile's tokens itself. The same bits either way.
void qmv_dp4a_mma_batched(const QmvArgs& a, int B, cudaStream_t stream);
// Bytes of QmvArgs::xq that qmv_dp4a_mma_batched needs for B tokens of `cols` columns: ⌈B/8⌉ token tiles' activation
// tables (~26 KB per tile and 1024 columns, linear in the columns); 0 for widths it never takes.
size_t qmv_dp4a_mma_scratch_bytes(int B, int64_t cols);
// The pre-quantising kernel alone (for tests of the producers' tables): B tokens of x [B][ldx] (cols 1024, 2048 or
// 4096; x·norm_w with the RMSNorm's rinv, or x and rinv = 1) into xq as qmv_dp4a_mma_batched's scratch holds them.
void qmv_dp4a_mma_quantize(const float* x, int64_t ldx, int64_t cols, const float* norm_w, float eps, int B, void* xq,
                           size_t xq_bytes, cudaStream_t stream);
// Whether the batched step has the kernels before its products write the products' tables (producer tables,
// dp4a_tables.cuh: gdn_decode_batched for out_proj, attention_batched for o_proj, moe_decode_batched for the next
// in_proj, q|k|v or LM head) instead of a pre-quantising kernel per product: the same bytes, one kernel fewer in
// the chain. On by default; TERN_QMV_PRODUCER_TABLES=0 turns it off; the setter is for tests and comparisons.
void qmv_dp4a_set_producer_tables(bool on);
bool qmv_dp4a_producer_tables();
// Whether 4096-column products with scratch (a.xq) take the split form on sm_90 binaries: each 16-row tile by a
// cluster of 2 blocks, each copying and folding 16 of every slice's 32 positions (half the tables and weights, 96 KB
// of shared memory a block: two an SM), rank 0 adding rank 1's half through distributed shared memory: the same bits.
// On by default (on the H200, +1.5% / +1.1% at 8 / 16 streams in one call and +0.4% / +0.3% in another; the whole GPU
// suite passed with it, docs/benchmarks.md); TERN_QMV_MMA_SPLIT=0 turns it off; the setter is for tests and
// comparisons.
void qmv_dp4a_mma_set_split(bool on);
bool qmv_dp4a_mma_split();
// Launches of the split form so far (host side, captures included): tests see that it ran.
uint64_t qmv_dp4a_mma_split_launches();
// Whether this device can run the split form (an sm_90 binary, its 2-block clusters resident); reads the device.
bool qmv_dp4a_mma_split_available();

}  // namespace tern::cuda
