// The sparse MoE block for one token in one kernel (Hopper clusters; model.md §2.6), the decode plan's default at the
// model's shapes (D = 2048, F = 512, E ≤ 256, k = 8; 8-bit router and shared-expert gate, 4-bit group-64 experts).
// It computes what the three kernels of moe_decode.cuh compute, without their two kernel boundaries:
//
//   grid: n clusters of 8 blocks, n = those the device holds at once (12..16; 15 on an H200). The work is cut into
//   9 × 16 units (slot s, 32 intermediate columns); cluster c owns the units c, c + n, c + 2n, ... (9 or 10 of 144).
//   1. every cluster: x̂ = RMSNorm(hidden)·norm_w; the router logits (8-bit, [E, D]) and the shared-expert gate logit,
//      rows spread over its 8 blocks (weights loaded before pdl_wait), each logit written into all 8 blocks' shared
//      memory; each block then routes the token itself (softmax, top-k, renormalised weights: route_token);
//   2. each block: h[s, i] = silu(Wg[e_s]·x̂) ⊙ (Wu[e_s]·x̂) for its eighth of the cluster's (unit, column) pairs
//      (integer dot products, dp4a_tile.cuh), each written into all 8 blocks' shared memory;
//   3. block r: for output rows [256r, 256r + 256), the partial down product over the cluster's units,
//      Σ_units coef_s·Wd[e_s][row, unit's 32 columns]·h[s, unit's 32 columns] (coef: routing weight, or the sigmoid of
//      the shared-expert gate), written to partial[c][row];
//   4. the last of the n blocks of rank r to finish (a ticket per rank) adds Σ_c partial[c][row], summed in the fixed
//      order c = 0..n-1, to hidden[row] (deterministic, no float atomics) and resets the ticket.
//   No block waits for another cluster, so the grid needs no co-residency; n only sets the speed (16 clusters on a
//   GPU that holds 15 would run the last one as a second wave).
//
// Cluster 0's first block also writes the router outputs (x̂, logits, ids, weights, shared gate) and every cluster's
// first block its columns of h into the scratch, as the three kernels do. h is quantised per 32 columns for the down
// product (the three-kernel path: per 64), so the two paths agree to rounding, not bitwise.
#pragma once

#include <cuda_runtime.h>

#include "cuda/moe_decode.cuh"

namespace tern::cuda {

// Runs the fused kernel and returns true when T == 1, the shapes and formats are the model's and the device runs the
// sm_90 binary (clusters); false: nothing was launched. After routing, each block asks L2 for its share of the
// chosen down matrices (TERN_MOE_FUSED_PREFETCH=0: not). s needs the partial sums and
// tickets of moe_decode_scratch_view (tickets zeroed by moe_decode_scratch_init; each run leaves them at zero).
// clusters: 0, the grid of moe_block_fused_clusters(); 12..16 another (tests: every split of the units is the same
// function).
bool moe_block_fused(const MoeDecodeWeights& w, float* hidden, int T, const MoeDecodeScratch& s, cudaStream_t stream,
                     int clusters = 0);

// The kernel's grid: as many clusters of 8 as the device holds at once (cudaOccupancyMaxActiveClusters), at most 16;
// 0 when it cannot say. The block runs with 12 to 16 (an H200 holds 15).
int moe_block_fused_clusters();

// Whether moe_decode takes this kernel for one token: TERN_MOE_FUSED=1 (off by default: on the H200 the decode step
// measured 1–2.5% slower with it than with the three kernels, docs/benchmarks.md).
bool moe_block_fused_enabled();

// Whether moe_block_fused would run for T = 1 with these weights (the same checks, nothing launched).
bool moe_block_fused_fits(const MoeDecodeWeights& w);

}  // namespace tern::cuda
