// The vision blocks' attention (transformers' Qwen3_5MoeVisionAttention): full, non-causal attention of every patch
// over the patches of its own frame, per head, with the 2D rotary positions applied to q and k.
//
// vision_attn_prepare: qkv [N, 3, H, dh] fp32 (the qkv product's rows [q | k | v], head-major) and the rotary angles
//   [N, dh/2] (cpu::vision_rope_angles) -> q, k, v [H, N, dhp] bf16, q and k rotated (rotate-half over all dh dims:
//   x[i]·cos − x[i + dh/2]·sin, x[i + dh/2]·cos + x[i]·sin, as cpu::rope_apply_angles), dims [dh, dhp) zero.
// vision_attention: out [N, H·dh] bf16 (the output projection's input) = softmax(q·kᵀ·scale)·v over the keys of the
//   query's frame (frames of frame_len consecutive patches), flash style: one block per (64 queries, head, frame),
//   key tiles of 64, scores and softmax in fp32 (online), q·kᵀ and p·v on the tensor cores (bf16 inputs, p rounded
//   to bf16, fp32 accumulators).
// dhp = vision_attn_padded_dim(dh): dh rounded up to a multiple of 16 (72 -> 80); dh a multiple of 4, at most 128.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

int vision_attn_padded_dim(int dh);

struct VisionAttnDims {
  int64_t N = 0;          // patches (all frames)
  int64_t frame_len = 0;  // patches per frame (N a multiple of it)
  int H = 0, dh = 0;
};

void vision_attn_prepare(const float* qkv, const float* angles, const VisionAttnDims& d, uint16_t* q, uint16_t* k,
                         uint16_t* v, cudaStream_t stream);

// q, k, v [H, N, dhp] bf16 (16-byte aligned) -> out [N, H·dh] bf16. scale: 1/sqrt(dh).
void vision_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, const VisionAttnDims& d, float scale,
                      uint16_t* out, cudaStream_t stream);

}  // namespace tern::cuda
