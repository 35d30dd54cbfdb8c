// Matrix-vector and matrix-matrix products y = x · Wᵀ with W in any DMat format (f32, bf16, MLX affine 4/8-bit),
// dequantised in registers (never materialised). fp32 activations, fp32 accumulation.
#pragma once

#include <cuda_runtime.h>

#include "cuda/device_weights.cuh"

namespace tern::cuda {

// Batch-1 product over `slots` independent (expert, input, output) triples:
//   y[s] (+)= W[ids[s]] · x[s]        x[s] = x + s*x_stride (x_stride 0: one shared input), y[s] = y + s*y_stride.
// ids may be a device array (routing stays on the GPU); nullptr means expert 0 for every slot.
struct GemvArgs {
  DMat w;
  const float* x = nullptr;   // [slots or 1, cols]
  int64_t x_stride = 0;
  float* y = nullptr;         // [slots, rows]
  int64_t y_stride = 0;
  const int* ids = nullptr;   // [slots] expert per slot (device)
  int slots = 1;
  bool accumulate = false;    // y += instead of y =
};
void gemv(const GemvArgs& a, cudaStream_t stream);

// Tiled product over many tokens. Dense mode: x [tokens, cols] (row stride ldx) -> y [tokens, rows] (ldy).
// Grouped mode (tile_expert set): tile t multiplies expert tile_expert[t] with the x rows gather[p] for the sorted
// positions p in [tile_start[t], tile_start[t] + tile_count[t]) and writes y rows p. Tiles >= *num_tiles exit, so
// the grid (max_tiles) is fixed on the host while the routing is known only on the device.
struct MatmulArgs {
  DMat w;
  const float* x = nullptr;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t tokens = 0;              // dense mode
  bool accumulate = false;
  const int* tile_expert = nullptr;  // grouped mode, [max_tiles]
  const int* tile_start = nullptr;
  const int* tile_count = nullptr;
  const int* num_tiles = nullptr;    // [1]
  int max_tiles = 0;
  const int* gather = nullptr;       // [positions] x row of each sorted position (nullptr: identity)
};
constexpr int kMatmulTileTokens = 64;  // tokens per tile (grouped tiles hold at most this many)
void matmul(const MatmulArgs& a, cudaStream_t stream);

}  // namespace tern::cuda
