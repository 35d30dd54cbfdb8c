#include "cli/memory_flags.h"

#include <algorithm>
#include <cstdio>

#include "cli/model_flags.h"
#include "core/check.h"

#ifdef TERN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runner/cuda_runner.h"
#endif

namespace tern::cli {

void kv_dtype_flag_add(CLI::App* sub, std::string& kv_dtype) {
  sub->add_option("--kv-dtype", kv_dtype,
                  "The KV cache's type on the GPU: f16, bf16, fp8 (e4m3 with a scale per token and head: half the "
                  "memory, so about twice the context, at a fidelity cost: mean KL ~7e-3 against ~6e-5 with f16 on a "
                  "reference model) or i16 (16-bit integers with a scale per token and head, f16's memory, and the "
                  "attention's products in fp16 hi + lo: over 100 times nearer exact attention; on an H100 ~7% slower "
                  "prefill and ~2% slower decode at 4K, ~22% slower prefill at 32K; Hopper-class shared memory). The "
                  "CPU keeps fp32 and takes only f16")
      ->check(CLI::IsMember({"f16", "bf16", "fp8", "i16"}))
      ->capture_default_str();
}

void gpu_memory_flag_add(CLI::App* sub, int64_t& cap_bytes) {
  sub->add_option("--gpu-memory",
                  "GPU memory the model may take, in GB (or with a unit: 24GiB, 24576MiB): the context (and how many "
                  "sequences run at once) is planned in it instead of the GPU's free memory when smaller, e.g. to "
                  "leave room to other programs or to try what a 24 GB card holds (the CUDA context, made before, "
                  "is not counted). Default: the free memory")
      ->type_name("GB")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              memory_size_parse(text);
            } catch (const Error& e) {  // the message without its " [src/...]" location
              const std::string why = e.what();
              return why.substr(0, why.rfind(" [src/"));
            }
            return "";
          },
          ""))
      ->each([&cap_bytes](const std::string& text) { cap_bytes = memory_size_parse(text); });
}

std::optional<GpuMemory> gpu_memory_before_load(const std::string& device, int64_t cap_bytes, bool quiet) {
  if (device != "cuda") {
    if (cap_bytes > 0 && !quiet)
      std::fprintf(stderr, "tern: --gpu-memory %s is ignored: the model runs on the CPU\n",
                   memory_size_text(cap_bytes).c_str());
    return std::nullopt;
  }
#ifdef TERN_HAVE_CUDA
  size_t free = 0, total = 0;
  const cudaError_t e = cudaMemGetInfo(&free, &total);
  TERN_CHECK(e == cudaSuccess, "cannot read the GPU's memory: ", cudaGetErrorString(e));
  GpuMemory gpu{.free_bytes = int64_t(free), .total_bytes = int64_t(total), .cap_bytes = cap_bytes};
  TERN_USAGE_CHECK(cap_bytes <= gpu.total_bytes, "--gpu-memory ", memory_size_text(cap_bytes),
                   " is more than the GPU has: ", memory_size_text(gpu.total_bytes), " (",
                   memory_size_text(gpu.free_bytes), " free)");
  return gpu;
#else
  TERN_FAIL("--device cuda: this tern binary was built without the CUDA backend");
#endif
}

namespace {
MemoryPlanInput with_gpu(MemoryPlanInput in, const GpuMemory& gpu) {
  in.free_bytes = gpu.free_bytes;
  in.total_bytes = gpu.total_bytes;
  in.cap_bytes = gpu.cap_bytes;
  return in;
}
}  // namespace

void gpu_memory_check_weights(const GpuMemory& gpu, int64_t weights_bytes) {
  memory_plan_check_weights(weights_bytes, with_gpu(MemoryPlanInput{}, gpu));
}

MemoryPlanInput memory_plan_measure(const ModelRunner& runner, const GpuMemory& gpu, MemoryPlanInput ask) {
  MemoryPlanInput in = with_gpu(std::move(ask), gpu);
  const int64_t free_now = runner.free_memory_bytes();
  TERN_CHECK(free_now >= 0, "the ", runner.backend_name(), " runner cannot tell its free memory");
#ifdef TERN_HAVE_CUDA
  in.weights_bytes = cuda_runner_weight_bytes(runner);
#endif
  in.scratch_bytes = std::max<int64_t>(0, gpu.free_bytes - free_now - in.weights_bytes);
  // A session is its state plus its context's KV rows: two sizes give both.
  constexpr int64_t n = 4096;
  const int64_t one = runner.session_bytes(n), two = runner.session_bytes(2 * n);
  TERN_CHECK(one > 0 && two >= one, "the ", runner.backend_name(), " runner cannot tell its sessions' memory");
  in.kv_token_bytes = (two - one + n - 1) / n;
  in.state_bytes = std::max<int64_t>(0, one - n * in.kv_token_bytes);
  in.max_context = runner.config().max_position_embeddings;
  return in;
}

void memory_plan_print(const char* who, const MemoryPlan& plan) {
  const std::vector<std::string> lines = memory_plan_describe(plan);
  for (size_t i = 0; i < lines.size(); ++i)
    std::fprintf(stderr, "%s: %s%s\n", who, i == 0 ? "memory plan: " : "", lines[i].c_str());
}

int64_t cpu_context(const char* who, int64_t ctx_size, int64_t max_context, bool quiet) {
  const int64_t context = ctx_size > 0 ? ctx_size : std::min(max_context, kCpuDefaultContext);
  if (!quiet)
    std::fprintf(stderr, "%s: memory plan: none on the CPU: context %s tokens (%s)\n", who,
                 token_count_text(context).c_str(),
                 ctx_size > 0 ? "--ctx-size" : "the CPU's default: its KV cache grows with use, in RAM");
  return context;
}

}  // namespace tern::cli
