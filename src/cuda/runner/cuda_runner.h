// The CUDA backend's ModelRunner: the whole forward pass on the GPU (fp32 activations, fp32 accumulation, fp32
// Gated DeltaNet state, fp16 KV cache by default, bf16 or fp8 on request), weights uploaded once, scratch buffers
// allocated once per runner, routing
// and sampling on the device. Plain C++ header: callers need no CUDA headers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "model/config.h"
#include "model/kv_dtype.h"
#include "model/runner.h"

namespace tern {

struct CudaRunnerOptions {
  int64_t max_chunk = 4096;  // tokens per forward chunk (longer inputs are processed in chunks)
  bool progress = true;      // progress bar while uploading or generating weights
  int64_t vocab_real = 0;    // synthetic weights: ids >= this are padding (the tokenizer's size); 0: every row
  // The prefill products on the split-x bf16 kernel (x as bf16 hi + lo), the path of GPUs without the warpgroup
  // kernel, even on Hopper (tests that hold the prefill plan to the CPU runner at fp32-level bounds;
  // TERN_PREFILL_WGMMA=0 does the same).
  bool exact_prefill = false;
  // Chunks of fewer tokens take the exact (bf16 hi + lo) products under the fp16 plan; -1: the default (512, or
  // TERN_PREFILL_F16_MIN_TOKENS). Tests of the fp16 products on short prompts set 0.
  int64_t f16_min_tokens = -1;
  // The prefill inputs that take x as fp16 on Hopper (a bit mask: 2 attention q|k|v, 4 the mixers' output projections,
  // 8 the MoE input, 16 the MoE down inputs); -1: the default (none, or TERN_PREFILL_F16_SITES).
  int f16_sites = -1;
  // The prefill inputs that take x as fp16 hi + lo (22 significant bits) instead of bf16 hi + lo (16) on Hopper, for
  // the same tensor work (a bit mask: 1 the GDN in_proj, 2 attention q|k|v, 4 the mixers' output projections, 8 the
  // MoE input, 16 the MoE down inputs); -1: the default (TERN_PREFILL_PAIR_SITES, else 15 with the i16 cache and
  // none with the others).
  int prefill_pair_sites = -1;
  // The KV cache's type (--kv-dtype): fp16 (the attention kernels' q and softmax weights too), bf16 (those too; also
  // TERN_KV_BF16=1 when this is f16), fp8 (e4m3 with a scale per token and KV head, half the bytes; computed in
  // fp16) or i16 (int16 with a scale per token and KV head, f16's bytes; computed in fp16 hi + lo). attention.cuh has
  // the formats.
  KvDtype kv = KvDtype::f16;
  // cuda_runner_create_synthetic: also a vision tower of these widths with random weights generated on the device, for
  // encode_image (tern bench --synthetic --image); cuda_runner_create takes the weights' own tower instead.
  std::optional<VisionConfig> synthetic_vision = std::nullopt;
};

// Uploads `weights` to GPU 0. Throws tern::Error when there is no GPU or the model does not fit.
std::unique_ptr<ModelRunner> cuda_runner_create(std::shared_ptr<const ModelWeights> weights,
                                                const CudaRunnerOptions& options = {});

// A model with full-size random weights in the MLX 4-bit layout generated on the GPU (speed and memory runs).
std::unique_ptr<ModelRunner> cuda_runner_create_synthetic(const Config& config, uint64_t seed,
                                                          const CudaRunnerOptions& options = {});

// Number of usable CUDA devices (0 without a driver or GPU) and a one-line description of device 0.
int cuda_device_count();
std::string cuda_device_name();

// Bytes the runner's weights occupy on the GPU, the vision tower's included (0 for another backend).
int64_t cuda_runner_weight_bytes(const ModelRunner& runner);

// forward_batch steps that ran several sessions through the batched kernels (not one after another) so far; 0 for
// another backend. For tests and the bench's method line.
int64_t cuda_runner_batched_steps(const ModelRunner& runner);

// The device memory of the runner's pool of verify kept-state buffers (cuda_session.cuh, KeptStateBuffers): what it
// holds (buffers in use and spare) and what is in use (taken by sessions between a verify and their next forward or
// rollback). Zeros for another backend. For tests.
struct CudaKeptStatePool {
  int64_t held_bytes = 0, in_use_bytes = 0;
};
CudaKeptStatePool cuda_runner_kept_state_pool(const ModelRunner& runner);

}  // namespace tern
