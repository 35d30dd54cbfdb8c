// The MoE router and the integer gate_up for one token in one kernel: what moe_decode runs as steps 1 and 2
// (moe_decode.cuh) where launches cannot overlap (the portable path, GPUs before sm_90: no programmatic dependent
// launch, ~2.4 µs of idle GPU per kernel boundary). A persistent grid, every block resident at once:
//   1. each block stages x·norm_w and the RMSNorm factor as the multi-block router does (moe_router_parts.cuh); the
//      grid's warps share the E + 1 rows of [router; shared_expert_gate]; block 0 writes x̂ to the scratch;
//   2. an atomic ticket: the last block to arrive routes (top-k ids, weights, shared gate), sets the ticket back to
//      zero and publishes the routing by advancing the scratch's epoch (a release store);
//   3. each block quantises x̂ from its own staging (the same bits as the scratch's x̂) and runs the shared expert's
//      rows of gate_up, which need no routing, then waits for the epoch (an acquire load) and runs the routed rows,
//      the gate_up kernel's loop (moe_dp4a_parts.cuh).
// x̂, the logits, ids, weights, shared gate and h are bit for bit those of the router kernel followed by the integer
// gate_up kernel. The blocks trigger the next launch (PDL, where on) only once they have seen the routing, so the
// down kernel after it may read the routing early (moe_down_dp4a's early_routing).
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/moe/moe_decode.cuh"

namespace tern::cuda {

// Whether the kernel takes these weights: the integer gate_up's (moe_gate_up_dp4a_fits: D of 1024, 2048 or 4096,
// top_k = 8), the router and shared gate in the router's fast 8-bit form over the same D, E <= 256, norm_w 16-byte
// aligned.
bool moe_router_gate_up_fits(const MoeDecodeWeights& w);
// The most blocks that can be resident at once on this device (occupancy × SMs): the largest grid the kernel may run,
// for the kernel of the current activation width (moe_dp4a_wide(); a launch checks its grid against its own kernel).
int moe_router_gate_up_max_blocks(const MoeDecodeWeights& w);
// Runs the kernel for one token (hidden [D]) and returns true when it fits (moe_router_gate_up_fits, hidden and the
// scratch's x̂ and h 16-byte aligned); false: nothing was launched. blocks: the grid (0: qtile::balanced_grid over
// the (k + 1)·F gate_up batches, as the gate_up kernel sizes its own; a test may ask for any 1 ..
// moe_router_gate_up_max_blocks, more is refused). Runs on any device: moe_decode chooses it only where
// moe_decode_fuses_router.
bool moe_router_gate_up_dp4a(const MoeDecodeWeights& w, const float* hidden, const MoeDecodeScratch& s,
                             cudaStream_t stream, int blocks = 0);

}  // namespace tern::cuda
