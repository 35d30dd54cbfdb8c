// The MoE router for one token in one thread-block cluster (sm_90): the T = 1 path of moe_router_decode
// (moe_decode.cuh) under qmv variant 3. The 8 blocks of the cluster share the E + 1 rows of [router;
// shared_expert_gate] (8-bit, group 64), each block stages x·norm_w and the RMSNorm factor itself, every warp writes
// its logits straight into block 0's shared memory (distributed shared memory), and after one cluster barrier a warp
// of block 0 runs the softmax and top-k: no global ticket, fence or second pass over the logits in L2. The logits,
// x̂, ids, weights and the shared gate land in the scratch exactly as the multi-block router leaves them, with the
// same arithmetic (fp32 dot of the dequantised 8-bit weights with x·norm_w, times the factor).
// The batched decode step (moe_decode_batched) launches B such clusters in one grid, cluster b routing token b.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/moe/moe_decode.cuh"

namespace tern::cuda {

// Whether the cluster router takes these weights on this device: an sm_90 binary, E ≤ 256, top_k ≤ 32, 8-bit group-64
// router and shared gate with D = 512, 1024 or 2048, norm_w 16-byte aligned.
bool moe_router_cluster_fits(const MoeDecodeWeights& w);
// Runs the cluster router and returns true when it applies (T = 1, moe_router_cluster_fits(w), hidden 16-byte
// aligned); false: nothing was launched. B > 1: one token of each of B sequences, cluster b routing hidden row b
// (hidden + b·D) into the scratch's rows b, each bit for bit as alone. x_lanes: also write each token's quantised x̂
// into s.x_lanes (moe_decode.cuh; needs D a multiple of 1024), by block rank 1 while rank 0 routes.
bool moe_router_cluster(const MoeDecodeWeights& w, const float* hidden, int T, const MoeDecodeScratch& s,
                        cudaStream_t stream, int B = 1, bool x_lanes = false);

}  // namespace tern::cuda
