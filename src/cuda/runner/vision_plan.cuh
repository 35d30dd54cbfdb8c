// The vision encoder on the GPU (CudaRunner::encode_image): cpu/vision_encoder.h's computation, kernel for kernel
// (src/cuda/kernels/vision), on one image at a time.
//
//   x   = bf16(pixels) · patch_embedᵀ + b  (+ the learned positions resampled to the grid)       [N, Dv] fp32
//   per block:  x += proj(attn(rope2d(qkv(LN1(x)))))     attention within each frame, flash style
//               x += fc2(act(fc1(LN2(x))))               act in fc1's epilogue
//   out = fc2(GELU(fc1(LN(x) viewed [N/M², M²·Dv])))                                            [N/M², out] fp32
//
// Numerics: matrices in bf16 (BF16 as stored; F32 ones — the demo's — rounded to bf16 at upload; never quantised),
// vectors (biases, norms) and the position table in fp32. The residual stream x, every accumulator, the norms'
// statistics and the softmax are fp32; the inputs of the products (the norms' outputs, q, k, v, the softmax weights,
// the attention output, fc1's activations) are rounded to bf16, as the tensor cores take them.
//
// Scratch: ~39 KB per patch at Qwen3.6's widths (1024² pixels: 4,096 patches, ~160 MB; the processor's largest
// default image, 16.7 M pixels, 65,536 patches: ~2.6 GB). The commands that plan memory reserve it for the largest
// image their processor makes (reserve(), CudaRunner::reserve_image_memory, before the plan is measured;
// --image-max-pixels lowers it); otherwise it is sized to the largest image encoded so far. Kept (grown, never
// shrunk), so that images allocate nothing. The position taps and rotary angles are computed on the host
// (cpu/ops_vision.h, the CPU encoder's own) and uploaded with the pixels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/common/cuda_common.cuh"
#include "model/config.h"
#include "model/image_input.h"

namespace tern {
struct VisionWeights;
}

namespace tern::cuda {

class VisionPlan {
 public:
  // Uploads `w` once (the host copy is not read afterwards). Throws tern::Error for shapes that do not match its
  // config or that the kernels cannot take (matrix columns not a multiple of 8, head dims over 128).
  VisionPlan(const VisionWeights& w, cudaStream_t stream);
  // Random weights of `config`'s widths generated on the device (speed runs: tern bench --synthetic --image).
  VisionPlan(const VisionConfig& config, uint64_t seed, cudaStream_t stream);
  VisionPlan(const VisionPlan&) = delete;
  VisionPlan& operator=(const VisionPlan&) = delete;

  // The embeddings of the image's <|image_pad|> tokens, [grid.t·grid.h·grid.w / M², out_hidden_size] on the host.
  // Throws tern::Error when the pixels do not match their grid (the CPU encoder's checks). Synchronous.
  ImageEmbeddings encode(const ImagePixels& pixels);

  // The scratch for images of up to `patches` patches, allocated now (kept; encode grows it only for a larger image).
  void reserve(int64_t patches) { ensure_scratch(patches); }
  // The bytes of that scratch (reserve's allocation), without allocating it.
  int64_t scratch_bytes_for(int64_t patches) const;

  const VisionConfig& config() const { return c_; }
  int64_t weight_bytes() const { return int64_t(weights_.capacity()); }
  int64_t scratch_bytes() const { return int64_t(scratch_.capacity()); }

 private:
  struct Block {
    const float *norm1_w = nullptr, *norm1_b = nullptr, *norm2_w = nullptr, *norm2_b = nullptr;
    const uint16_t* qkv = nullptr;   // [3·Dv, Dv] bf16
    const float* qkv_b = nullptr;    // [3·Dv]
    const uint16_t* proj = nullptr;  // [Dv, Dv]
    const float* proj_b = nullptr;
    const uint16_t* fc1 = nullptr;   // [Iv, Dv]
    const float* fc1_b = nullptr;
    const uint16_t* fc2 = nullptr;   // [Dv, Iv]
    const float* fc2_b = nullptr;
  };

  void check_config() const;
  void layout_weights();              // the arena sized and carved for c_'s tensors
  void ensure_scratch(int64_t N);     // room for an image of N patches
  struct ScratchSizes {
    size_t part[11];                  // x, h, qkv, q, k, v, mid, out, angles, tap index, tap weight (bytes)
    size_t total;                     // each rounded up to the arena's alignment
  };
  ScratchSizes scratch_sizes(int64_t N) const;
  void run_block(const Block& b, int64_t N, int64_t frame_len);

  VisionConfig c_;
  cudaStream_t stream_;
  int64_t table_rows_ = 0;            // the position table's rows
  DeviceArena weights_;
  const uint16_t* patch_embed_ = nullptr;  // [Dv, C·Tp·P·P]
  const float* patch_embed_b_ = nullptr;   // [Dv]
  const float* pos_table_ = nullptr;       // [table_rows_, Dv] fp32
  std::vector<Block> blocks_;
  const float *merger_norm_w_ = nullptr, *merger_norm_b_ = nullptr;  // [Dv]
  const uint16_t* merger_fc1_ = nullptr;   // [Dm, Dm]
  const float* merger_fc1_b_ = nullptr;
  const uint16_t* merger_fc2_ = nullptr;   // [out, Dm]
  const float* merger_fc2_b_ = nullptr;

  // Scratch for scratch_patches_ patches (ensure_scratch). Aliases: the pixels (bf16) and the merger's hidden live in
  // mid_, never alive at once.
  DeviceArena scratch_;
  int64_t scratch_patches_ = 0;
  float* x_ = nullptr;                     // [N, Dv] the residual stream
  uint16_t* h_ = nullptr;                  // [N, Dv] bf16: a norm's output, then the attention's
  float* qkv_ = nullptr;                   // [N, 3·Dv]
  uint16_t *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;  // [H, N, dhp] bf16
  uint16_t* mid_ = nullptr;                // [N, Iv] bf16 (or the pixels, or the merger's [N/M², Dm])
  float* out_ = nullptr;                   // [N/M², out]
  float* angles_ = nullptr;                // [N, dh/2]
  int32_t* tap_index_ = nullptr;           // [N, 4]
  float* tap_weight_ = nullptr;            // [N, 4]
  // Pinned host staging (grown to the largest image so far): what goes up (pixels, taps, angles), what comes back.
  PinnedHostBuffer pinned_in_, pinned_out_;
};

}  // namespace tern::cuda
