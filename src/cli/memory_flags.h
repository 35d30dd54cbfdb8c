// The GPU memory plan (engine/memory_plan.h) as the commands that size sessions use it (serve, run, generate, bench):
// the --gpu-memory flag, the GPU's memory read before the model loads, and the plan's input measured on the runner
// once it is made. On the CPU there is no plan: the commands keep their default context (kCpuDefaultContext).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "engine/memory_plan.h"
#include "model/runner.h"

namespace tern::cli {

// The context the commands take on the CPU when no --ctx-size is given: the CPU runner's KV cache grows with use
// (in RAM, fp32) up to it, so a long default costs nothing up front, and a long prompt on the CPU is slow anyway.
inline constexpr int64_t kCpuDefaultContext = 32768;

// --gpu-memory GB on `sub`: the value checked as it is parsed (a usage error names a bad one) and kept in bytes.
void gpu_memory_flag_add(CLI::App* sub, int64_t& cap_bytes);
// --kv-dtype f16|bf16|fp8|i16 on `sub` (model_flags_add adds it; bench and logits too).
void kv_dtype_flag_add(CLI::App* sub, std::string& kv_dtype);

struct GpuMemory {
  int64_t free_bytes = 0, total_bytes = 0;
  int64_t cap_bytes = 0;  // --gpu-memory; 0: none
};

// For a run on `device` ("cuda" or "cpu", resolved): GPU 0's free and total memory now (cudaMemGetInfo, which makes
// the CUDA context first, so that it is not counted), with the --gpu-memory cap. nullopt on the CPU (a cap is then
// ignored, with a note on stderr unless quiet). A cap above the GPU's size is a usage error.
std::optional<GpuMemory> gpu_memory_before_load(const std::string& device, int64_t cap_bytes, bool quiet = false);

// Throws tern::Error, before they are uploaded, when weights of `weights_bytes` cannot fit (memory_plan_check_weights).
void gpu_memory_check_weights(const GpuMemory& gpu, int64_t weights_bytes);

// `ask` (what the command asks: context, sequences, prefix cache, flag names, speculative decoding's verify states)
// completed with the GPU (`gpu`, read before the runner was made) and the runner: its weights, its other buffers
// (what the free memory went down by while it was made, less the weights), a session's state and KV bytes per token,
// the model's positions.
MemoryPlanInput memory_plan_measure(const ModelRunner& runner, const GpuMemory& gpu, MemoryPlanInput ask);

// The plan's lines on stderr, each after `who` ("tern serve").
void memory_plan_print(const char* who, const MemoryPlan& plan);

// On the CPU: the context a command takes (ctx_size when given, else kCpuDefaultContext up to the model's
// positions), said on stderr after `who` unless quiet.
int64_t cpu_context(const char* who, int64_t ctx_size, int64_t max_context, bool quiet = false);

}  // namespace tern::cli
