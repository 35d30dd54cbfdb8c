// Workbench cases for the GPU sampler (src/cuda/kernels/sampling/sampling.cu): one token from V = 248,320 logits,
// uniform random in [-5, 5) (a flat distribution: top-p 0.9 alone keeps ~57,000 ids). One copy of the logits, kept in
// L2 across runs as in decode (the LM head has just written them); bytes count one read of the logits.
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "bench/workbench.h"
#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/sampling/sampling.cuh"

namespace tern::bench {
namespace {

constexpr int64_t kVocab = 248320;

void add_sampling_case(CaseList& cases, const std::string& what, const DeviceSampling& sampling) {
  struct Buffers {
    float* logits = nullptr;   // [kVocab], owned by the workbench
    float* scratch = nullptr;  // [sample_scratch_floats]
    int* out = nullptr;        // [1]
  };
  auto b = std::make_shared<Buffers>();
  Case c;
  c.group = "decode";
  c.name = "sample " + what + " V=248320";
  c.bytes = double(kVocab) * 4;
  c.setup = [b, sampling] {
    b->logits = bench_alloc_random_floats(size_t(kVocab), -5.0f, 5.0f, 0x5a3b1e);
    TERN_CUDA(cudaMalloc(&b->scratch, size_t(cuda::sample_scratch_floats(kVocab)) * 4));
    TERN_CUDA(cudaMalloc(&b->out, sizeof(int)));
    TERN_CUDA(cudaMemcpy(cuda::sample_params_slot(b->scratch, kVocab), &sampling, sizeof(DeviceSampling),
                         cudaMemcpyHostToDevice));
    TERN_CUDA(cudaDeviceSynchronize());
  };
  c.run = [b](cudaStream_t stream, int) { cuda::sample_token_device(b->logits, kVocab, b->scratch, b->out, stream); };
  c.teardown = [b] {
    cudaFree(b->scratch);
    cudaFree(b->out);
    b->scratch = nullptr;
    b->out = nullptr;
  };
  cases.push_back(std::move(c));
}

}  // namespace

TERN_BENCH_CASES(sampling) {
  add_sampling_case(cases, "greedy", DeviceSampling{});
  add_sampling_case(cases, "top-k 20 top-p 0.95 T 0.7",
                    DeviceSampling{.temperature = 0.7f, .top_k = 20, .top_p = 0.95f, .seed = 1234});
  add_sampling_case(cases, "top-p 0.9 T 1", DeviceSampling{.temperature = 1.0f, .top_p = 0.9f, .seed = 1234});
  add_sampling_case(cases, "min-p 0.05 T 1", DeviceSampling{.temperature = 1.0f, .min_p = 0.05f, .seed = 1234});
}

}  // namespace tern::bench
