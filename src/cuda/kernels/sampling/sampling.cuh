// Logit masking and token sampling on the GPU: greedy, temperature, top-k, top-p, min-p, seeded.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "model/runner.h"

namespace tern::cuda {

// logits[r, i] = -inf for i >= vocab_real, rows r < n.  logits [n, V].
void mask_padding(float* logits, int64_t n, int64_t V, int64_t vocab_real, cudaStream_t stream);

// Floats of scratch that sample_token needs (parameters, histograms, candidates; ~100 KB, the same for every V).
int64_t sample_scratch_floats(int64_t V);
// Where the sampling parameters live inside the scratch (device memory), for sample_token_device.
DeviceSampling* sample_params_slot(float* scratch, int64_t V);
// Throws tern::Error naming the bad parameter.
void sample_check(const DeviceSampling& s);

// Samples one id from logits [V] (padding already -inf; 0 < V < 2^24) into *out (device):
//   temperature 0 (or top_k 1): arg-max (lowest id on ties). Otherwise p ∝ exp((l − max)/T), restricted to the
//   top_k largest logits (0: all; ties at the k-th value are kept), then to the smallest set of largest p whose
//   mass reaches top_p (ranked by logit, ties kept), then to p >= min_p·max p; one uniform draw from (seed, step)
//   picks by inverse CDF in id order. Non-finite logits are never sampled (none finite: id 0). Masses are summed
//   exactly in fixed point (units of 2^-40 of the max p), so ids with p < 2^-41 are never drawn.
// Deterministic for a given (logits, sampling). Four kernels over ~V/2048 blocks, launched with PDL; scratch must
// be 16-byte aligned and not shared with a concurrent call.
void sample_token(const float* logits, int64_t V, const DeviceSampling& s, float* scratch, int* out, cudaStream_t stream);
// The same with the parameters already in sample_params_slot(scratch, V) on the device: no host value is read, so
// the launch can be captured in a CUDA graph and replayed with new parameters.
void sample_token_device(const float* logits, int64_t V, float* scratch, int* out, cudaStream_t stream);
// sample_token_device for `rows` rows at once (the batched step's sessions): row r samples logits [r, V] with the
// parameters and scratch at scratch + r·scratch_stride floats (each row's own, scratch_stride ≥
// sample_scratch_floats(V), a multiple of 4) into out[r]: each row's id is what sample_token_device gives it alone.
// One launch of each of the four kernels for all the rows.
void sample_tokens_device(const float* logits, int64_t V, int rows, float* scratch, int64_t scratch_stride, int* out,
                          cudaStream_t stream);

}  // namespace tern::cuda
