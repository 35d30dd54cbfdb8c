// The MoE decode block's expert kernels for one token through integer dot products (dp4a_tile.cuh), the T = 1 path of
// moe_gate_up_decode and moe_down_decode (moe_decode.cuh) under qmv variant 3:
//   gate_up: h[s] = silu(Wg[e_s]·x̂) ⊙ (Wu[e_s]·x̂) for the k routed slots and the shared expert (slot k); a warp batch
//            is one intermediate row i of one slot (its gate row and up row), batches interleaved over the grid;
//   down:    hidden += Σ_{s<k} w[s]·(Wd[e_s]·h[s]) + shared_gate·(Wd_shared·h[k]); a warp batch is one output row,
//            all k + 1 segments summed by the warp in a fixed order (deterministic, no atomics).
// Each block quantises the activations once (x̂ for gate_up; the k + 1 rows of h for down, whose routing coefficient
// multiplies the group's σ) into shared memory, at 24 bits per group of 64 columns by default (moe_dp4a_wide below);
// the gate_up lanes keep their columns in registers, the down lanes read theirs from shared memory.
// Batched (B > 1, the batched decode step's moe_decode_batched): one token of each of B sequences in one launch, grid
// (blocks, B), blockIdx.y = the token: token b's blocks do exactly the one-token work on the scratch's rows b (ids,
// w, shared gate, x̂, h) and hidden row b, so each token's result is bit for bit its one-token result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/moe/moe_decode.cuh"

namespace tern::cuda {

// Whether the kernels take these weights (4-bit group-64 experts of the same layout; gate_up: D of 1024, 2048 or 4096
// columns and top_k = 8; down: F = 512 and top_k = 8).
bool moe_gate_up_dp4a_fits(const MoeDecodeWeights& w);
bool moe_down_dp4a_fits(const MoeDecodeWeights& w);
// Run the kernel for B tokens and return true when it fits (and the scratch's x̂ / h are 16-byte aligned); false:
// nothing was launched. hidden [B, D]; the scratch's rows b hold token b's routing, x̂ and h.
// The gate_up kernel calls pdl_trigger only after its pdl_wait (in every block, every token), so the kernel after it
// starts only once the routing kernel before it has completed: down with early_routing (the launch right after this
// gate_up kernel, same step, same B; or right after the fused router + gate_up of moe_router_gate_up.cuh, whose blocks
// trigger only once they have seen the routing) reads the routing and issues its first weight loads before its own
// pdl_wait.
// With w.prefetch_down each token's gate_up blocks ask L2 for that token's down matrices.
// x_lanes_written: the router before this launch wrote the scratch's x_lanes (moe_router_cluster with x_lanes), which
// the grouped gate_up form needs; without them B >= 2 takes the ring form even in the grouped mode.
bool moe_gate_up_dp4a(const MoeDecodeWeights& w, const MoeDecodeScratch& s, cudaStream_t stream, int B = 1,
                      bool x_lanes_written = false);
// tables: the next product's activation tables from the finished rows (moe_decode_batched's MoeTablesOut; B >= 1,
// s.down_tickets for B tokens): both forms write them.
bool moe_down_dp4a(const MoeDecodeWeights& w, float* hidden, const MoeDecodeScratch& s, bool early_routing,
                   cudaStream_t stream, int B = 1, const MoeTablesOut& tables = {});

// The gate_up form of B >= 2 tokens (the ring forms of moe_dp4a_ring.cu, unless TERN_MOE_RING=0): the ring form (the
// default) or the one grouped by expert across the batch (TERN_MOE_RING_GATE_UP=grouped: moe_dp4a_grouped.cu; where
// it does not apply, the ring form runs). The variable is
// read once; tests change the mode with moe_ring_gate_up_set_mode (outside graph capture: a launch records the form).
constexpr int kMoeRingGateUpRing = 0, kMoeRingGateUpGrouped = 1;
void moe_ring_gate_up_set_mode(int mode);
int moe_ring_gate_up_mode();
// Rows a warp of the ring forms (gate_up's ring form and down) takes a step: 2 (the default: pairs of rows, their
// sums reduced by one transposed butterfly; the same bits) or 1, TERN_MOE_RING_ROWS=1, read once; tests change it
// with moe_ring_set_rows (outside graph capture).
void moe_ring_set_rows(int rows);
int moe_ring_rows();
// Whether moe_gate_up_dp4a for B tokens of these weights would take the grouped form given the router's x_lanes, so
// that the router is asked to write them (the grouped mode, B >= 2, the rings on, D of 1024 or 2048, E <= 256, the
// 16-bit activations: moe_dp4a_wide() false).
bool moe_gate_up_wants_x_lanes(const MoeDecodeWeights& w, int B);
// Launches of the grouped form in this process so far (tests: that it ran).
int64_t moe_gate_up_grouped_launches();

// The experts' activations (x̂ for gate_up, the rows of h for down) at 24 bits per group of 64 columns (the default:
// dp4a_tile.cuh's wide form, six dp4a a word, as the dense one-token products take theirs) or at 16 (four dp4a;
// TERN_MOE_DP4A_BITS=16, read once). Every form takes the setting: the one-token kernels, the ring forms and the fused
// router + gate_up, so a token's result stays the same bits in any batch; the grouped gate_up takes only 16 bits (with
// 24 the ring form runs in its place). On weights at trained scales the 16-bit inputs of gate_up and down together
// flip near-tied expert choices downstream (docs/benchmarks.md, forty-first session). Tests change it with
// moe_dp4a_set_wide (outside graph capture: a launch records the form).
void moe_dp4a_set_wide(bool wide);
bool moe_dp4a_wide();

}  // namespace tern::cuda
