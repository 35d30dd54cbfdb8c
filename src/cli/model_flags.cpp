#include "cli/model_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "cli/backend_select.h"
#include "cli/memory_flags.h"
#include "cli/speculative_flags.h"
#include "core/check.h"
#include "engine/bench_roofline.h"
#include "text/tokenizer.h"

namespace tern::cli {

void model_flags_add(CLI::App* sub, ModelFlags& f) {
  sub->add_option("-m,--model", f.model_dir, "Model folder (HF or MLX checkpoint); without it, the demo model");
  sub->add_flag("--demo", f.demo, "The built-in demo model (small, RANDOM weights; the default without -m)");
  sub->add_flag("--synthetic", f.synthetic,
                "Qwen3.6-35B-A3B at full size with RANDOM weights generated on the GPU, with the demo's tokenizer "
                "and template: speed checks without a download (CUDA only)");
  sub->add_option("--device", f.device, "auto, cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  sub->add_option("--dtype", f.dtype, "Weights: auto (MLX as stored, BF16 -> 4-bit), q4, bf16 or stored (as in the files)")
      ->check(CLI::IsMember({"auto", "q4", "bf16", "stored"}))
      ->capture_default_str();
  sub->add_option("--draft-weights", f.draft_weights,
                  "A safetensors file of the MTP draft head (tern extract-mtp -m HF_DIR -o FILE), for a model folder "
                  "without it (MLX conversions drop it)");
  sub->add_option("--name", f.name,
                  "The model's id (default: ORG/NAME for a Hugging Face cache snapshot or a folder that records its "
                  "repo id, else the folder's name)");
  sub->add_option("-c,--ctx-size", f.ctx_size,
                  "Context size in tokens per sequence (default: on a GPU the longest its memory holds, up to the "
                  "model's positions; on the CPU 32768; tern generate: what the prompt and -n need)")
      ->check(CLI::NonNegativeNumber);
  gpu_memory_flag_add(sub, f.gpu_memory);
  kv_dtype_flag_add(sub, f.kv_dtype);
}

void model_flags_add_images(CLI::App* sub, ModelFlags& f) {
  f.images = true;
  sub->add_option("--image-max-pixels", f.image_max_pixels,
                  "Images are resized to at most this many pixels (default: the model's processor, 16,777,216 for "
                  "Qwen3.6); on a GPU the vision encoder's memory for the largest image is set aside at start "
                  "(~39 KB per 256 pixels), so a smaller value leaves more for the context")
      ->check(CLI::Range(int64_t(1024), int64_t(1) << 28));
}

namespace {
ModelSourceOptions source_options(const ModelFlags& f) {
  ModelSourceOptions o;
  o.model_dir = f.model_dir;
  o.demo = f.demo;
  o.synthetic = f.synthetic;
  o.name = f.name;
  return o;
}
}  // namespace

ModelSource model_flags_open(const ModelFlags& f, bool quiet) {
  TERN_USAGE_CHECK(f.draft_weights.empty() || !f.model_dir.empty(), "--draft-weights needs a model folder (-m DIR)");
  ModelSourceOptions o = source_options(f);
  o.load.dtype = load_dtype_parse(f.dtype);
  o.load.progress = !quiet;
  o.load.draft_weights = f.draft_weights;
  ModelSource src = model_source_open(o);
  if (!quiet) std::fprintf(stderr, "tern: %s\n", src.banner.c_str());
  return src;
}

std::string model_flags_name(const ModelFlags& f) { return model_source_name(source_options(f)); }

std::unique_ptr<ModelRunner> model_flags_runner(const ModelFlags& f, const ModelSource& src) {
  const KvDtype kv = kv_dtype_parse(f.kv_dtype);
  if (src.synthetic)  // the demo tokenizer's ids only: the rows past them have no text
    return runner_create_synthetic(src.synthetic_config, /*seed=*/1, f.device, src.tokenizer->vocab_size(), kv);
  return runner_create(src.weights, f.device, kv);
}

const Config& model_flags_config(const ModelSource& src) {
  return src.synthetic ? src.synthetic_config : src.weights->config;
}

ImageSettings model_flags_image_settings(const ModelFlags& f, const ModelSource& src, const ModelRunner& runner,
                                         int64_t planned_max_pixels) {
  ImageSettings s = image_settings(model_flags_config(src), runner.images_unavailable(), f.model_dir);
  if (f.image_max_pixels > 0) {
    const int64_t factor = int64_t(s.processor.patch_size) * s.processor.merge_size;
    TERN_USAGE_CHECK(f.image_max_pixels >= factor * factor, "--image-max-pixels ", f.image_max_pixels,
                     ": at least one image token's ", factor * factor, " pixels");
    s.processor.max_pixels = std::min(s.processor.max_pixels, f.image_max_pixels);
  }
  if (planned_max_pixels > 0) s.processor.max_pixels = std::min(s.processor.max_pixels, planned_max_pixels);
  s.processor.min_pixels = std::min(s.processor.min_pixels, s.processor.max_pixels);
  return s;
}

namespace {

// The vision encoder's memory for the largest image, set aside before the plan measures what the runner holds;
// returns that image's pixels (0: images off). Without --image-max-pixels the processor's largest image is lowered
// (halved, in whole image tokens) while its memory would be more than a quarter of what the weights leave.
int64_t reserve_image_memory(const ModelFlags& f, const ModelSource& src, ModelRunner& runner, const GpuMemory& gpu,
                             const char* who, bool quiet) {
  const ImageSettings images = model_flags_image_settings(f, src, runner);
  if (!images.unavailable.empty()) return 0;
  const int64_t patch_pixels = int64_t(images.processor.patch_size) * images.processor.patch_size;
  const int64_t token_pixels = patch_pixels * images.processor.merge_size * images.processor.merge_size;
  const int64_t processor_max = images.processor.max_pixels;
  int64_t max_pixels = processor_max;
  if (f.image_max_pixels == 0) {
    const int64_t available = gpu.cap_bytes > 0 ? std::min(gpu.cap_bytes, gpu.free_bytes) : gpu.free_bytes;
    const int64_t taken = gpu.free_bytes - runner.free_memory_bytes();  // the weights and the runner's buffers
    const int64_t left = std::max<int64_t>(0, available - taken - kMemoryPlanReserveBytes);
    while (max_pixels > token_pixels && runner.image_memory_bytes(max_pixels / patch_pixels) > left / 4)
      max_pixels = std::max(token_pixels, max_pixels / 2 / token_pixels * token_pixels);
  }
  const int64_t bytes = runner.reserve_image_memory(max_pixels / patch_pixels);
  if (!quiet && bytes > 0)
    std::fprintf(stderr, "%s: vision encoder: %s of working memory for images up to %s pixels%s\n", who,
                 memory_size_text(bytes).c_str(), token_count_text(max_pixels).c_str(),
                 max_pixels < processor_max
                     ? (" (the processor's " + token_count_text(processor_max) +
                        " would take over a quarter of the memory the weights leave; --image-max-pixels sets it)")
                           .c_str()
                     : " (--image-max-pixels lowers it)");
  return max_pixels;
}

}  // namespace

PlannedRunner model_flags_runner_planned(const ModelFlags& f, const ModelSource& src, const MemoryPlanInput& ask,
                                         const char* who, bool quiet, const SpeculativeFlags* speculative) {
  // Synthetic weights are made on the GPU (model_flags_runner says so when there is none).
  const std::string device = f.synthetic ? (cuda_available() ? "cuda" : "cpu") : device_resolve(f.device);
  const std::optional<GpuMemory> gpu = gpu_memory_before_load(device, f.gpu_memory, quiet);
  if (gpu)
    gpu_memory_check_weights(*gpu, src.synthetic ? weights_mlx4_shapes(src.synthetic_config).total_bytes()
                                                 : src.weights->total_bytes());
  PlannedRunner planned;
  planned.runner = model_flags_runner(f, src);
  if (!gpu) return planned;
  if (f.images) planned.image_max_pixels = reserve_image_memory(f, src, *planned.runner, *gpu, who, quiet);
  MemoryPlanInput in = ask;
  in.kv_dtype = kv_dtype_parse(f.kv_dtype);
  if (speculative) in.verify_bytes = speculative_flags_verify_bytes(*speculative, *planned.runner);
  planned.plan = memory_plan(memory_plan_measure(*planned.runner, *gpu, std::move(in)));
  if (!quiet) memory_plan_print(who, *planned.plan);
  return planned;
}

namespace {

// A number in [lo, hi] (or (lo, hi] when lo_open), NaN and infinities refused: the ranges of the HTTP API's
// parameters of the same names (docs/server.md), so that a flag accepts what a request accepts.
CLI::Validator number_in(double lo, double hi, bool lo_open = false) {
  const std::string range = (lo_open ? "(" : "[") + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double x = 0;
        if (!CLI::detail::lexical_cast(text, x)) return "'" + text + "' is not a number";
        const bool low = lo_open ? !(x > lo) : !(x >= lo);
        if (!std::isfinite(x) || low || !(x <= hi)) return "'" + text + "' is outside " + range;
        return "";
      },
      "NUMBER in " + range);
}

}  // namespace

void sampling_flags_add(CLI::App* sub, SamplingFlags& f) {
  sub->add_option("-t,--temperature", f.temperature, "Sampling temperature; 0 is greedy (default: the model's)")
      ->check(number_in(0, 2));
  sub->add_option("--top-p", f.top_p, "Nucleus sampling mass in (0, 1] (default: the model's)")
      ->check(number_in(0, 1, /*lo_open=*/true));
  sub->add_option("--top-k", f.top_k, "Keep the k most likely tokens; 0 or -1 is off (default: the model's)")
      ->check(CLI::Range(-1, 1000000));
  sub->add_option("--min-p", f.min_p, "Drop tokens below min_p times the top probability (default: the model's)")
      ->check(number_in(0, 1));
  sub->add_option("--presence-penalty", f.presence, "Subtracted from the logit of every generated token, in [-2, 2]")
      ->check(number_in(-2, 2))
      ->each([&f](const std::string&) { f.presence_set = true; });
  sub->add_option("--frequency-penalty", f.frequency, "Subtracted once per occurrence in the output, in [-2, 2]")
      ->check(number_in(-2, 2))
      ->each([&f](const std::string&) { f.frequency_set = true; });
  sub->add_option("--repetition-penalty", f.repetition, "HF repetition penalty over prompt and output, in (0, 10]; 1 is off")
      ->check(number_in(0, 10, /*lo_open=*/true));
  sub->add_option("--seed", f.seed, "Random seed (>= 0): the same seed and request give the same tokens")
      ->check(CLI::NonNegativeNumber);
}

SamplingParams sampling_flags_apply(const SamplingFlags& f, SamplingParams p) {
  if (f.temperature != -1) p.temperature = float(f.temperature);
  if (f.top_p != -1) p.top_p = float(f.top_p);
  if (f.min_p != -1) p.min_p = float(f.min_p);
  if (f.top_k != -2) p.top_k = f.top_k;
  if (f.presence_set) p.presence_penalty = float(f.presence);
  if (f.frequency_set) p.frequency_penalty = float(f.frequency);
  if (f.repetition != -1) p.repetition_penalty = float(f.repetition);
  if (f.seed >= 0) p.seed = uint64_t(f.seed);
  p.validate();  // the flags were checked by their validators: a failure here comes from generation_config.json
  return p;
}

std::vector<int32_t> token_list_parse(const std::string& text, const std::string& where) {
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&] {
    if (item.empty()) return;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TERN_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "bad token id '", item, "' in ", where);
    ids.push_back(int32_t(v));
    item.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r')
      flush();
    else
      item += c;
  }
  flush();
  return ids;
}

}  // namespace tern::cli
