// Flags shared by the commands that load a model and generate (run, generate; serve may use them too):
// which model (-m DIR or the demo), where it runs, the context size, and sampling overrides.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/check.h"
#include "engine/image_prompt.h"
#include "engine/memory_plan.h"
#include "engine/model_source.h"
#include "engine/sampler.h"
#include "model/runner.h"

namespace tern::cli {

struct SpeculativeFlags;  // cli/speculative_flags.h

struct ModelFlags {
  std::string model_dir;    // empty: the demo model
  bool demo = false;
  bool synthetic = false;   // full-size random weights generated on the GPU (ModelSource::synthetic)
  std::string device = "auto";
  std::string dtype = "auto";
  std::string draft_weights;  // --draft-weights FILE: the MTP head (tern extract-mtp) for a folder without it
  std::string name;
  int64_t ctx_size = 0;     // 0: the command's default (on a GPU: the memory plan's)
  int64_t gpu_memory = 0;   // --gpu-memory in bytes; 0: the GPU's free memory
  std::string kv_dtype = "f16";  // --kv-dtype: the KV cache's type (model/kv_dtype.h)
  bool images = false;           // the command takes images (model_flags_add_images)
  int64_t image_max_pixels = 0;  // --image-max-pixels: images resized to at most this area; 0: the processor's
};
void model_flags_add(CLI::App* sub, ModelFlags& f);
// For the commands that take images (serve, run): --image-max-pixels, and images on in f.
void model_flags_add_images(CLI::App* sub, ModelFlags& f);
// Loads the model and prints its banner on stderr (quiet: nothing at all, no load progress either).
ModelSource model_flags_open(const ModelFlags& f, bool quiet = false);
// The name model_flags_open will give the model, without loading it (model_source_name).
std::string model_flags_name(const ModelFlags& f);
// The runner for what model_flags_open gave, on f.device (synthetic weights: generated there, CUDA only).
std::unique_ptr<ModelRunner> model_flags_runner(const ModelFlags& f, const ModelSource& src);
// The model's config, before any runner is made.
const Config& model_flags_config(const ModelSource& src);
// The model's image settings (engine/image_prompt.h) with --image-max-pixels, and the plan's cap (PlannedRunner::
// image_max_pixels; 0: none), applied: the processor's max_pixels (and min_pixels, when larger) lowered to them.
ImageSettings model_flags_image_settings(const ModelFlags& f, const ModelSource& src, const ModelRunner& runner,
                                         int64_t planned_max_pixels = 0);

// model_flags_runner with, on a GPU, the memory plan (engine/memory_plan.h) for what `ask` asks (its context,
// sequences, prefix cache and flag names; the device's and the model's sizes are measured here, --gpu-memory from
// f): the weights checked before they are uploaded, for a command that takes images (f.images) the vision encoder's
// working memory for the largest image the processor makes set aside (ModelRunner::reserve_image_memory) and so
// counted, the plan printed on stderr after `who` unless quiet. With
// `speculative` (the command's --speculative and --draft-max), the verify steps' kept states are counted per
// sequence (speculative_flags_verify_bytes). Throws tern::Error with the numbers when the plan is refused. On the CPU
// there is no plan (nullopt).
struct PlannedRunner {
  std::unique_ptr<ModelRunner> runner;
  std::optional<MemoryPlan> plan;
  // The largest image whose working memory was set aside (pixels; 0: no cap beyond the flags'). Without
  // --image-max-pixels it is the processor's, lowered when that image's memory would be more than a quarter of what
  // the weights leave (a 24 GB card keeps its context): pass it to model_flags_image_settings.
  int64_t image_max_pixels = 0;
};
PlannedRunner model_flags_runner_planned(const ModelFlags& f, const ModelSource& src, const MemoryPlanInput& ask,
                                         const char* who, bool quiet = false,
                                         const SpeculativeFlags* speculative = nullptr);

// Sampling flags; a flag not given keeps the model's default (generation_config.json).
struct SamplingFlags {
  double temperature = -1, top_p = -1, min_p = -1, presence = 0, frequency = 0, repetition = -1;
  int top_k = -2;
  int64_t seed = -1;
  bool presence_set = false, frequency_set = false;
};
// Each flag is checked as the HTTP API checks the same parameter (range, NaN): a bad value is a usage error.
void sampling_flags_add(CLI::App* sub, SamplingFlags& f);
SamplingParams sampling_flags_apply(const SamplingFlags& f, SamplingParams defaults);

// A flag value found wrong after parsing (a bad combination, a value out of the model's range): the command
// stops with status 2 and the message, as for CLI11's own usage errors (main.cpp).
#define TERN_USAGE_CHECK(cond, ...)                                                 \
  do {                                                                             \
    if (!(cond)) throw CLI::ValidationError(::tern::detail::concat(__VA_ARGS__));  \
  } while (0)

// "1,2,3" or "1 2 3" -> ids. Throws tern::Error naming `where` on a bad item.
std::vector<int32_t> token_list_parse(const std::string& text, const std::string& where);

}  // namespace tern::cli
