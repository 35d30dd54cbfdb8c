// The batched decode step's MoE gate_up + SwiGLU on the integer tensor cores, grouped by expert across the batch:
// see moe_gate_up_mma.cu. Each token's h is bit for bit its one-token result (moe_gate_up_dp4a at B = 1).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels/moe/moe_decode.cuh"

namespace tern::cuda {

// Bytes of MoeDecodeScratch::mma for a scratch of T tokens (its per-token activation tables for min(T,
// kBatchMaxTokens) tokens and the table of work items); 0 when T < 2 or D != 2048 (the kernel does not apply).
size_t moe_gate_up_mma_scratch_bytes(int T, int64_t D, int E, int k);

// Whether B >= 2 tokens take the MMA gate_up (TERN_MOE_MMA not 0, read once; moe_mma_set_enabled overrides), and
// the setter for tests.
bool moe_mma_enabled();
void moe_mma_set_enabled(bool on);

// Whether moe_gate_up_mma runs for these weights, scratch and B: enabled, 2 <= B <= kBatchMaxTokens, the one-token
// integer kernels' shapes (moe_gate_up_dp4a_fits) with D = 2048, F a multiple of 16, top_k = 8, E <= 1024, the
// matrices' rows 16-byte aligned, s.mma holding moe_gate_up_mma_scratch_bytes(B, ...) bytes (16-byte aligned).
bool moe_gate_up_mma_supported(const MoeDecodeWeights& w, const MoeDecodeScratch& s, int B);
// h [B][k + 1][F] of the scratch from its ids [B][k] and x̂ [B][D], as moe_gate_up_dp4a(w, s, stream, B) writes it;
// false (nothing launched) when !moe_gate_up_mma_supported. Like the integer gate_up, every block of its launches
// calls pdl_trigger only after its pdl_wait, so moe_down_dp4a's early routing read after it stays valid.
bool moe_gate_up_mma(const MoeDecodeWeights& w, const MoeDecodeScratch& s, cudaStream_t stream, int B);

}  // namespace tern::cuda
