// Backend choice for every command (--device cuda|cpu|auto): the one place that knows which backends exist.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "core/check.h"
#include "model/kv_dtype.h"
#include "model/runner.h"

namespace tern {

// True when this binary has the CUDA backend and a CUDA GPU is visible.
bool cuda_available();

// "auto" -> "cuda" when cuda_available(), else "cpu"; "cuda" and "cpu" are returned as given after checking that
// they can be honoured. Throws tern::Error with a clear message otherwise (e.g. cuda asked for without a GPU, or
// a binary built without CUDA).
std::string device_resolve(const std::string& device);

// Brings the CUDA context up on another thread when `device` (auto or cuda) may be the GPU, so that it starts while
// the caller reads the tokenizer and the checkpoint's headers; a no-op thread for cpu or without CUDA. Errors are
// left to the caller's own first CUDA call. The thread is joined when the returned object goes.
std::jthread device_start_early(const std::string& device);

// A runner for the weights on the resolved device, its KV cache of type `kv` (--kv-dtype; the CPU backend takes only
// the default: cpu_kv_dtype_check).
std::unique_ptr<ModelRunner> runner_create(std::shared_ptr<const ModelWeights> weights, const std::string& device,
                                           KvDtype kv = KvDtype::f16);

// Full-size random weights in the MLX 4-bit layout, generated on the GPU (--synthetic); CUDA only. vocab_real > 0:
// ids from it on are padding, never sampled (the tokenizer that goes with them has fewer ids than the rows).
std::unique_ptr<ModelRunner> runner_create_synthetic(const Config& config, uint64_t seed, const std::string& device,
                                                     int64_t vocab_real = 0, KvDtype kv = KvDtype::f16);

// The CPU runner keeps its KV cache in fp32 whatever --kv-dtype says: it takes the default (f16, which on the CPU
// means its own cache) and refuses bf16, fp8 and i16 with a tern::Error that says so. Inline: the GPU-only build's tern
// bench uses it without this file's .cpp.
inline void cpu_kv_dtype_check(KvDtype kv) {
  TERN_CHECK(kv == KvDtype::f16, "--kv-dtype ", kv_dtype_name(kv),
             ": the CPU backend keeps its KV cache in fp32 and takes only the default; bf16, fp8 and i16 KV caches are "
             "the CUDA backend's (--device cuda)");
}

}  // namespace tern
