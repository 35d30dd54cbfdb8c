// The batched decode step's MoE down + weighted sum + residual on the integer tensor cores, per token: see
// moe_down_mma.cu. Each token's hidden row is bit for bit its one-token result (moe_down_dp4a at B = 1).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels/moe/moe_decode.cuh"

namespace tern::cuda {

// Bytes of MoeDecodeScratch::mma_down for a scratch of T tokens (each token's h quantised once, in the MMA's
// fragment order, for min(T, kBatchMaxTokens) tokens); 0 when T < 2, F != 512 or k != 8 (the kernel does not apply).
size_t moe_down_mma_scratch_bytes(int T, int64_t F, int k);

// Whether B >= 2 tokens take the MMA down (TERN_MOE_MMA_DOWN not 0, read once; moe_down_mma_set_enabled overrides),
// and the setter for tests.
bool moe_down_mma_enabled();
void moe_down_mma_set_enabled(bool on);

// Whether moe_down_mma runs for these weights, scratch and B: enabled, 2 <= B <= kBatchMaxTokens, the one-token
// integer down kernel's shapes (moe_down_dp4a_fits: F = 512, top_k = 8) with D a multiple of 16, the matrices' rows
// 16-byte aligned, s.mma_down holding moe_down_mma_scratch_bytes(B, ...) bytes (16-byte aligned).
bool moe_down_mma_supported(const MoeDecodeWeights& w, const MoeDecodeScratch& s, int B);
// hidden [B][D] += each token's down sum from the scratch's ids, w, shared_gate [B] rows and h [B][k + 1][F], as
// moe_down_dp4a(w, hidden, s, early_routing, stream, B) leaves it; false (nothing launched) when
// !moe_down_mma_supported. early_routing: as moe_down_dp4a's (moe_dp4a.cuh): the routing is complete when this
// launch starts, so the product kernel reads it and issues its weight copies before its pdl_wait.
bool moe_down_mma(const MoeDecodeWeights& w, float* hidden, const MoeDecodeScratch& s, bool early_routing,
                  cudaStream_t stream, int B);

}  // namespace tern::cuda
