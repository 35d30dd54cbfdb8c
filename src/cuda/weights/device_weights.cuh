// The model's weights in GPU memory, in the layout the kernels read. Quantised matrices stay in the MLX affine
// layout (uint32 words, LSB-first, bf16 scales/biases per group along the input axis), densely packed per expert;
// no dequantised copy of any quantised weight exists on the GPU. Everything lives in one DeviceArena.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/common/cuda_common.cuh"
#include "model/weights.h"

namespace tern::cuda {

// A (possibly stacked) matrix on the device. Plain old data: passed by value to kernels.
struct DMat {
  WeightFormat format = WeightFormat::f32;
  int64_t experts = 1;
  int64_t rows = 0;            // out
  int64_t cols = 0;            // in
  int group_size = 64;
  const void* data = nullptr;  // f32 / bf16 elements or uint32 words, [experts][rows][row_words]
  const uint16_t* scales = nullptr;  // bf16 [experts][rows][groups_per_row] (affine only)
  const uint16_t* biases = nullptr;
  int64_t row_words = 0;       // storage units per row
  int64_t groups_per_row = 0;
  bool empty() const { return data == nullptr; }
};

// Rows [row0, row0 + rows) of a plain (one-expert) DMat, sharing its memory.
DMat dmat_rows(const DMat& m, int64_t row0, int64_t rows);

struct DeviceLayer {
  LayerType type = LayerType::linear_attention;
  // Matrices that read the same input, stored back to back so that one product serves them all (empty when their
  // formats differ): in_proj_all = [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a] (GDN), attn_qkv = [q_proj; k_proj;
  // v_proj] (attention). The separate matrices below are then row views of these.
  DMat in_proj_all, attn_qkv;
  const float* input_norm = nullptr;      // [D]
  const float* post_attn_norm = nullptr;  // [D]
  // Gated DeltaNet
  DMat in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  const float* conv1d = nullptr;   // [C, Ck]
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* gdn_norm = nullptr; // [dv]
  // gated attention
  DMat q_proj, k_proj, v_proj, o_proj;
  const float* q_norm = nullptr;   // [dh]
  const float* k_norm = nullptr;   // [dh]
  // MoE
  DMat router, expert_gate, expert_up, expert_down, shared_gate, shared_up, shared_down, shared_expert_gate;
};

struct DeviceWeights {
  Config config;
  int64_t vocab_real = 0;
  DMat embed, lm_head;
  const float* final_norm = nullptr;  // [D]
  std::vector<DeviceLayer> layers;
  DeviceArena arena;
  int64_t bytes = 0;  // bytes of weights on the device
};

// Uploads every weight once through pinned staging buffers (staged_upload.cuh: the host memory read by several
// threads while earlier buffers travel, one sync at the end; a progress line of the bytes read per second on stderr
// when `progress`).
// Throws tern::Error for shapes the kernels cannot take (cols not a multiple of 32, odd group sizes).
std::unique_ptr<DeviceWeights> device_weights_upload(const ModelWeights& w, bool progress);

// Full-size random weights in the MLX 4-bit layout (router and shared-expert gate 8-bit), generated directly on
// the GPU from `seed`: for measuring speed and memory without a checkpoint. Norms are 1, weights ~ N(0, 0.02)-like.
std::unique_ptr<DeviceWeights> device_weights_synthetic(const Config& config, uint64_t seed, bool progress);

}  // namespace tern::cuda
