// The vision encoder on the CPU (transformers' Qwen3_5MoeVisionModel, fp32 math on the stored weights): the
// embeddings the language model receives for the image tokens, in the order of the <|image_pad|> tokens.
//
//   x   = pixel_values · patch_embedᵀ + b                          [N, Dv]   (Conv3d with kernel = stride)
//   x  += Σ_4 taps w · pos_embed[index]                            bilinear resample of the learned grid
//   per block:  x += proj(attn(rope2d(qkv(LN1(x)))))                full attention within each frame
//               x += fc2(act(fc1(LN2(x))))                          act: gelu_pytorch_tanh
//   out = fc2(GELU(fc1(LN(x) viewed [N/M², M²·Dv])))               [N/M², out_hidden_size]
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/ops_vision.h"
#include "model/vision_weights.h"

namespace tern::cpu {

// pixel_values [N, C·Tp·P·P] (src/vision's image_processor output, all images concatenated) and one grid per image.
// Returns [N / M², out_hidden_size]. Throws tern::Error when the rows do not match the grids.
std::vector<float> vision_encode(const VisionWeights& w, const float* pixel_values, int64_t rows, int64_t cols,
                                 const std::vector<VisionGrid>& grids);

}  // namespace tern::cpu
