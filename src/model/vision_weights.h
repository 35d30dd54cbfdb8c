// The vision encoder's weights in the internal layout (transformers' Qwen3_5MoeVisionModel): matrices [out, in] as
// stored (BF16 or F32; F16 widened to F32; never quantised), biases and LayerNorm parameters as fp32.
//
//   patch_embed  Conv3d(C -> Dv, kernel = stride = (Tp, P, P)) as a matrix [Dv, C*Tp*P*P], columns in the order of
//                a pixel_values row (c, t, y, x): HF's [Dv, C, Tp, P, P] read flat; mlx-vlm's channels-last
//                [Dv, Tp, P, P, C] permuted at load.
//   pos_embed    [side*side, Dv] learned positions on a side x side grid (resampled to each image's grid).
//   blocks       pre-norm: x += proj(attn(LN1(x))); x += fc2(act(fc1(LN2(x)))); qkv rows are [q | k | v], each
//                head-major (head h, dim d at h*dh + d).
//   merger       LN(x) per patch, M*M consecutive patches concatenated, fc2(GELU(fc1(.))) into the LM width.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace tern {

struct VisionBlockWeights {
  std::vector<float> norm1_weight, norm1_bias;   // [Dv] LayerNorm before attention (eps 1e-6)
  std::vector<float> norm2_weight, norm2_bias;   // [Dv] LayerNorm before the MLP
  Matrix qkv;                                    // [3*Dv, Dv]
  std::vector<float> qkv_bias;                   // [3*Dv]
  Matrix proj;                                   // [Dv, Dv]
  std::vector<float> proj_bias;                  // [Dv]
  Matrix fc1;                                    // [Iv, Dv]
  std::vector<float> fc1_bias;                   // [Iv]
  Matrix fc2;                                    // [Dv, Iv]
  std::vector<float> fc2_bias;                   // [Dv]
};

struct VisionWeights {
  VisionConfig config;
  Matrix patch_embed;                            // [Dv, C*Tp*P*P]
  std::vector<float> patch_embed_bias;           // [Dv]
  Matrix pos_embed;                              // [num_position_embeddings, Dv]
  std::vector<VisionBlockWeights> blocks;        // [depth]
  std::vector<float> merger_norm_weight, merger_norm_bias;  // [Dv]
  Matrix merger_fc1;                             // [M*M*Dv, M*M*Dv]
  std::vector<float> merger_fc1_bias;            // [M*M*Dv]
  Matrix merger_fc2;                             // [out_hidden_size, M*M*Dv]
  std::vector<float> merger_fc2_bias;            // [out_hidden_size]
  std::string source_layout;                     // "hf" (model.visual.*) or "mlx" (vision_tower.*)
  std::vector<std::shared_ptr<WeightStorage>> storage;  // mapped files and load-time copies

  // Every matrix with its checkpoint-relative name (blocks.3.qkv ...), for inspect and tests.
  std::vector<std::pair<std::string, const Matrix*>> all_matrices() const;
  int64_t total_bytes() const;  // matrices and fp32 vectors
};

}  // namespace tern
