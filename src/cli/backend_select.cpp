#include "cli/backend_select.h"

#include "core/check.h"
#include "cpu/cpu_runner.h"
#ifdef TERN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runner/cuda_runner.h"
#endif

namespace tern {

bool cuda_available() {
#ifdef TERN_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::jthread device_start_early(const std::string& device) {
#ifdef TERN_HAVE_CUDA
  if (device == "auto" || device.empty() || device == "cuda")
    return std::jthread([] {
      int n = 0;
      if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) cudaFree(nullptr);  // creates the primary context
      cudaGetLastError();  // this thread's error state, cleared
    });
#endif
  return {};
}

std::string device_resolve(const std::string& device) {
  if (device == "auto" || device.empty()) return cuda_available() ? "cuda" : "cpu";
  if (device == "cpu") return "cpu";
  if (device == "cuda") {
#ifdef TERN_HAVE_CUDA
    TERN_CHECK(cuda_available(), "--device cuda: no CUDA GPU is visible to this process (check the driver, "
                                 "nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device cpu");
    return "cuda";
#else
    TERN_FAIL("--device cuda: this tern binary was built without the CUDA backend (backends: cpu); rebuild on a "
              "machine with nvcc, or use --device cpu");
#endif
  }
  TERN_FAIL("--device must be auto, cuda or cpu, got '", device, "'");
}

std::unique_ptr<ModelRunner> runner_create(std::shared_ptr<const ModelWeights> weights, const std::string& device,
                                           KvDtype kv) {
  const std::string d = device_resolve(device);
#ifdef TERN_HAVE_CUDA
  if (d == "cuda") return cuda_runner_create(std::move(weights), CudaRunnerOptions{.kv = kv});
#endif
  cpu_kv_dtype_check(kv);
  return cpu_runner_create(std::move(weights));
}

std::unique_ptr<ModelRunner> runner_create_synthetic(const Config& config, uint64_t seed, const std::string& device,
                                                     int64_t vocab_real, KvDtype kv) {
  TERN_CHECK(device == "auto" || device == "cuda",
             "--synthetic generates full-size weights on the GPU: it needs --device cuda (or auto), not ", device);
#ifdef TERN_HAVE_CUDA
  TERN_CHECK(cuda_available(), "--synthetic generates full-size weights on the GPU, and no CUDA GPU is visible to this "
                               "process (check the driver, nvidia-smi and CUDA_VISIBLE_DEVICES)");
  CudaRunnerOptions options;
  options.vocab_real = vocab_real;
  options.kv = kv;
  return cuda_runner_create_synthetic(config, seed, options);
#else
  TERN_FAIL("--synthetic generates full-size weights on the GPU: this tern was built without the CUDA backend");
#endif
}

}  // namespace tern
