// Sparse MoE plumbing on the GPU (model.md §2.6): router softmax/top-k/renormalise, grouping of (token, slot)
// pairs by expert with a tile map for the grouped matmul (no host synchronisation), SwiGLU, and the weighted
// deterministic combine with the shared expert and the residual.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/qmatmul/qmatmul.cuh"

namespace tern::cuda {

// Per token: p = softmax(logits[t]) over E (fp32); the k largest (ties: lower index) -> ids[t, :], and weights
// w[t, j] = p_j / Σ_top p. logits [T, E]; ids [T, k] int; w [T, k] fp32. E <= 1024, k <= 32.
void moe_route(const float* logits, int64_t T, int E, int k, int* ids, float* w, cudaStream_t stream);

// Scratch for moe_group (device ints), and the grid bound of the grouped matmul for T tokens: both hold the tiles of
// any width moe_group takes (16 or more).
int64_t moe_group_ints(int64_t T, int E, int k);
int moe_max_tiles(int64_t T, int E, int k);

struct MoeGroups {
  int* sorted_token = nullptr;  // [T·k] token of each sorted position
  int* pos_of = nullptr;        // [T·k] sorted position of pair (t, j) = t·k + j
  int* tile_expert = nullptr;   // [max_tiles]
  int* tile_start = nullptr;
  int* tile_count = nullptr;
  int* num_tiles = nullptr;     // [1]
};
// Carves a MoeGroups out of `scratch` (moe_group_ints ints).
MoeGroups moe_groups_view(int* scratch, int64_t T, int E, int k);
// Sorts the T·k pairs by expert (counting sort on the device) and builds tiles of at most `tile` positions.
void moe_group(const int* ids, int64_t T, int E, int k, int tile, const MoeGroups& g, cudaStream_t stream);
// Grouped mode of a (qmatmul.cuh) over g's tile map, built by moe_group with tiles of at most tile_tokens positions,
// with the grid max_tiles (moe_max_tiles); gather is left to the caller (g.sorted_token for inputs indexed by token,
// none for inputs already in sorted order).
inline void set_tiles(MatmulArgs& a, const MoeGroups& g, int max_tiles, int tile_tokens = kMatmulTileTokens) {
  a.tile_expert = g.tile_expert;
  a.tile_start = g.tile_start;
  a.tile_count = g.tile_count;
  a.num_tiles = g.num_tiles;
  a.max_tiles = max_tiles;
  a.tile_tokens = tile_tokens;
}

// h[i] = silu(gate[i]) · up[i] for i < n.  h may equal gate.
void swiglu(const float* gate, const float* up, int64_t n, float* h, cudaStream_t stream);

// hidden[t, :] += Σ_j w[t, j] · y[pos(t, j), :] + sigmoid(shared_logit[t]) · shared[t, :]
// pos(t, j) = pos_of[t·k + j], or t·k + j when pos_of is null. y [T·k, D]; shared [T, D]; shared_logit [T].
void moe_combine(float* hidden, const float* y, const int* pos_of, const float* w, const float* shared,
                 const float* shared_logit, int64_t T, int64_t D, int k, cudaStream_t stream);

}  // namespace tern::cuda
