// Allowed-token masks on the GPU (constrained decoding): the device twin of tern::apply_token_mask
// (src/engine/token_mask.h). Runs after the LM head and before the sampler kernels
// (src/cuda/kernels/sampling/sampling.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// logits[i] = -inf for every i in [0, V) whose bit (i % 32) of mask[i / 32] is clear, ids past the mask's `words`
// included. mask: [words] uint32 in device memory. A plain launch (no PDL): it starts after every earlier kernel
// of the stream, and the sampler's PDL kernels wait for it in their pdl_wait().
void token_mask_apply(float* logits, int64_t V, const uint32_t* mask, int64_t words, cudaStream_t stream);

}  // namespace tern::cuda
