// tern bench: prefill and decode tok/s from 256 to 128K tokens, with achieved GB/s and TFLOP/s against the
// ceilings, time to first token and peak memory (src/engine/bench_run.h holds the method).
//
//   tern bench --synthetic --device cuda --lengths 256,4K,128K --json bench.json --plot bench.svg
//   tern bench --demo --lengths 256,512          (CPU, the built-in demo model)
//   tern bench -m DIR                            (a real checkpoint)
//   tern bench --synthetic --device cuda --prefix-reuse   (turn 2 of a 16K conversation, with and without reuse:
//                                                          src/engine/bench_prefix.h)
//   tern bench --synthetic --device cuda --lengths 4K --concurrency 1,2,4,8,16,32
//                                                         (N streams decoding at once, one forward_batch per step:
//                                                          src/engine/bench_run.h)
//   tern bench --demo --speculative                       (verify and draft costs, tok/s at set draft acceptance:
//                                                          src/engine/bench_speculative.h)
//   tern bench --demo --speculative --plot spec.svg       (with it, --plot draws the verify cost against k and the
//                                                          speed-up against acceptance instead of tok/s by length)
//   tern bench --synthetic --device cuda --image 1024     (also the vision encoder's time for a 1024 x 1024 image,
//                                                          on a random tower of Qwen3.6's widths; a checkpoint with
//                                                          a vision tower prints it by default on CUDA)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <vector>
#include <string>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "cli/memory_flags.h"
#include "cli/model_flags.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "cpu/cpu_runner.h"
#include "engine/bench_roofline.h"
#include "engine/bench_prefix.h"
#include "engine/bench_run.h"
#include "engine/demo_model.h"
#include "engine/demo_random.h"
#ifndef TERN_GPU_ONLY
#include "engine/bench_speculative.h"
#include "engine/model_source.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"
#endif
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/image_input.h"
#include "model/runner.h"

#ifdef TERN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runner/cuda_runner.h"
#endif

namespace tern::cli {

namespace {

struct BenchArgs {
  std::string model_dir;
  bool synthetic = false, demo = false;
  std::string device = "auto";
  std::string dtype = "auto";
  std::string kv_dtype = "f16";  // --kv-dtype
  std::string lengths = "256,512,1K,2K,4K,8K,16K,32K,64K,128K";
  bool lengths_given = false;  // --lengths on the command line (else the default, cut to the model's context)
  int repeats = 3, warmup = 1, decode_steps = 32;
  bool decode_steps_given = false;
  int64_t prefill_chunk = 0;
  uint64_t seed = 1;
  double peak_gb_s = -1, peak_tflop_s = -1;  // -1: the H200 figures of targets.md on CUDA, none on the CPU
  std::string json_path, plot_path;
  bool quiet = false;
  bool prefix_reuse = false;
  std::string prefix_context = "16K";
  int64_t prefix_reply = 256, prefix_next = 256, snapshot_every = 4096;
  std::string json_schema;  // constrained decode steps (not in the GPU-only build)
  std::string concurrency;  // --concurrency 1,2,4: stream counts
  bool concurrency_given = false;  // else the table by length
  int64_t gpu_memory = 0;          // --gpu-memory in bytes (0: the GPU's free memory)
  bool speculative = false;        // --speculative: the speculative decoding benchmark instead of the table
  int draft_max = 0;               // 0: the backend's most (max_verify_tokens() − 1), at most 8
  std::string draft_counts, acceptance;  // "" : the defaults
  int image = -1;  // --image SIZE: time encode_image on a SIZE x SIZE image; 0 off; -1 the default (print_image_encode)
};

#ifndef TERN_GPU_ONLY
// The decode steps of tern bench --json-schema: greedy tokens under the schema's grammar, the mask computed on the
// host while the device runs each step's forward. A finished document starts a new one, so every step is
// constrained.
class SchemaBenchMask final : public BenchMask {
 public:
  SchemaBenchMask(grammar::GrammarPtr g, std::shared_ptr<const grammar::TokenVocabulary> v)
      : grammar_(std::move(g)), vocab_(std::move(v)), matcher_(grammar_, vocab_), mask_(size_t(vocab_->mask_words())) {}
  std::span<const uint32_t> fill() override {
    matcher_.fill_mask(mask_);
    return mask_;
  }
  void accept(int32_t id) override {
    TERN_CHECK(matcher_.accept(id), "bench: the device sampled token ", id, ", which the mask did not allow");
    if (matcher_.done()) matcher_ = grammar::Matcher(grammar_, vocab_);
  }

 private:
  grammar::GrammarPtr grammar_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  grammar::Matcher matcher_;
  std::vector<uint32_t> mask_;
};

// --json-schema FILE: the mask factory over the model folder's tokenizer (the demo tokenizer for --synthetic and
// --demo, whose ids fit the model's rows).
std::function<std::unique_ptr<BenchMask>()> schema_mask_factory(const BenchArgs& a, int64_t vocab_rows) {
  std::ifstream f(a.json_schema, std::ios::binary);
  TERN_USAGE_CHECK(f.good(), "--json-schema: cannot open ", a.json_schema);
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(f, nullptr, /*allow_exceptions=*/false);
  TERN_USAGE_CHECK(!schema.is_discarded(), "--json-schema ", a.json_schema, " is not valid JSON");
  grammar::GrammarPtr g;
  try {
    g = grammar::compile_json_schema(schema);
  } catch (const grammar::SchemaError& e) {
    TERN_USAGE_CHECK(false, "--json-schema ", a.json_schema, ": ", e.what());
  }
  const std::shared_ptr<const Tokenizer> tok =
      a.model_dir.empty() ? demo_tokenizer() : std::make_shared<const Tokenizer>(Tokenizer::from_model_dir(a.model_dir));
  std::vector<int32_t> end_ids;
  for (const char* t : {"<|im_end|>", "<|endoftext|>"})
    if (const std::optional<int32_t> id = tok->token_id(t)) end_ids.push_back(*id);
  auto vocab = grammar::TokenVocabulary::from_tokenizer(*tok, vocab_rows, end_ids);
  return [g, vocab] { return std::make_unique<SchemaBenchMask>(g, vocab); };
}
#endif

std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) name = line.substr(colon + 2);
      break;
    }
  return name + ", " + std::to_string(thread_pool_global().size()) + " threads";
}

// "40 layers, 256 experts top-8, affine4/affine8, 19.51 GB of weights" (bytes from the roofline: shapes only).
std::string weights_description(const ModelWeights& w, const Roofline& roofline) {
  std::string formats;
  auto add = [&](const Matrix& m) {
    const std::string f = weight_format_name(m.format);
    if (m.rows > 0 && formats.find(f) == std::string::npos) formats += (formats.empty() ? "" : "/") + f;
  };
  add(w.embed);
  add(w.lm_head);
  for (const LayerWeights& l : w.layers)
    for (const Matrix* m : {&l.in_proj_qkv, &l.q_proj, &l.router, &l.expert_gate, &l.shared_gate})
      add(*m);
  char buf[200];
  std::snprintf(buf, sizeof buf, "%d layers, %lld experts top-%d, %s, %.2f GB of weights", w.config.num_hidden_layers,
                (long long)w.config.num_experts, w.config.num_experts_per_tok, formats.c_str(),
                roofline.total_weight_bytes * 1e-9);
  return buf;
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary);
  TERN_CHECK(out.good(), "cannot write the ", what, " file ", path);
  out << text;
  out.close();
  TERN_CHECK(out.good(), "writing the ", what, " file ", path, " failed");
}

// The lengths to run: those given, each of which must fit the model's positions with its decode steps (else a
// usage error); or the default ones that fit (with --concurrency, the longest of them up to 4K).
std::vector<int64_t> lengths_to_run(const BenchArgs& a, int64_t max_positions) {
  std::vector<int64_t> lengths;
  try {
    lengths = bench_parse_lengths(a.lengths);
  } catch (const Error& e) {
    throw CLI::ValidationError(e.what());
  }
  std::vector<int64_t> fitting;
  for (int64_t length : lengths) {
    if (length + a.decode_steps <= max_positions) fitting.push_back(length);
    else
      TERN_USAGE_CHECK(!a.lengths_given, "--lengths ", bench_length_label(length), " with ", a.decode_steps,
                       " decode steps exceeds the model's ", max_positions, " positions");
  }
  TERN_USAGE_CHECK(!fitting.empty(), "no benchmark length fits the model's ", max_positions, " positions with ",
                   a.decode_steps, " decode steps; give --lengths");
  if (!a.lengths_given && a.concurrency_given) {
    int64_t chosen = fitting.front();
    for (int64_t length : fitting)
      if (length <= 4096) chosen = std::max(chosen, length);
    fitting.assign(1, chosen);
  }
  return fitting;
}

// On a GPU, the lengths to run against its memory (engine/memory_plan.h): each length with its decode steps in one
// sequence, and with --concurrency N sequences of the length at once; verify_bytes: the states a verify step keeps
// (--speculative). The default lengths are cut to what fits; a length or stream count given that does not fit is
// refused with the numbers. Returns the longest context one sequence gets.
int64_t lengths_fit_memory(const BenchArgs& a, const ModelRunner& runner, const GpuMemory& gpu,
                           std::vector<int64_t>& lengths, const std::vector<int>& concurrency,
                           int64_t verify_bytes = 0) {
  MemoryPlanInput ask;
  ask.parallel = 1;
  ask.kv_dtype = kv_dtype_parse(a.kv_dtype);
  ask.verify_bytes = verify_bytes;
  ask.context_flag = "";  // bench takes prompt lengths, not a context
  ask.parallel_flag = "--concurrency";
  const MemoryPlanInput one = memory_plan_measure(runner, gpu, ask);
  const int64_t longest = memory_plan(one).context;
  if (!a.lengths_given) std::erase_if(lengths, [&](int64_t length) { return length + a.decode_steps > longest; });
  TERN_CHECK(!lengths.empty(), "no benchmark length with ", a.decode_steps, " decode steps fits the GPU memory (",
             token_count_text(longest), " tokens)");
  MemoryPlanInput each = one;  // throws, with the numbers, for a --lengths or --concurrency beyond memory
  each.context = std::min(one.max_context, *std::max_element(lengths.begin(), lengths.end()) + a.decode_steps);
  for (int n : concurrency.empty() ? std::vector<int>{1} : concurrency) {
    each.parallel = n;
    memory_plan(each);
  }
  return longest;
}

std::string device_description(const std::string& device) {
#ifdef TERN_HAVE_CUDA
  if (device == "cuda") return cuda_device_name();
#endif
  return cpu_description();
}

#ifndef TERN_GPU_ONLY
// tern bench --speculative (engine/bench_speculative.h): the lengths (default 4K and 32K, with --demo 256 and 1K;
// the default ones cut to what the model's positions and a GPU's memory hold), the run, the tables and the JSON.
void run_speculative(BenchArgs a, ModelRunner& runner, const std::string& device, const std::string& model,
                     const std::optional<GpuMemory>& gpu) {
  // A verify of k drafts runs k + 1 tokens in one step: the backend's limit bounds k (the CUDA runner's batched
  // one-token kernels: 8 tokens).
  const int most = int(runner.max_verify_tokens()) - 1;
  TERN_USAGE_CHECK(most >= 1, "--speculative: the ", device, " backend cannot verify drafts");
  if (a.draft_max == 0) a.draft_max = std::min(8, most);
  TERN_USAGE_CHECK(a.draft_max <= most, "--draft-max: ", a.draft_max, " drafts need ", a.draft_max + 1,
                   " tokens in one verify step; the ", device, " backend verifies at most ", most + 1);
  SpecBenchOptions o;
  o.max_drafts = a.draft_max;
  o.tokens = a.decode_steps_given ? a.decode_steps : 128;
  o.repeats = a.repeats;
  o.warmup = a.warmup;
  o.seed = a.seed;
  try {
    if (!a.draft_counts.empty()) o.draft_counts = bench_parse_draft_counts(a.draft_counts, a.draft_max);
    if (!a.acceptance.empty()) o.acceptance = bench_parse_acceptance(a.acceptance);
    if (!a.lengths_given) a.lengths = a.demo ? "256,1K" : "4K,32K";
    o.lengths = bench_parse_lengths(a.lengths);
  } catch (const Error& e) {
    throw CLI::ValidationError(e.what());
  }
  for (int k : o.draft_counts)
    TERN_USAGE_CHECK(k <= a.draft_max, "--draft-counts: ", k, " is more than --draft-max ", a.draft_max);
  TERN_USAGE_CHECK(o.tokens >= 2, "--decode-steps: --speculative generates at least 2 tokens per run");
  // Each length holds its prompt, a run's tokens (or the timed plain steps) and a verify step's drafts.
  const int64_t extra = std::max<int64_t>(o.tokens + 1, o.warmup + o.repeats) + o.max_drafts + 2;
  const int64_t positions = runner.config().max_position_embeddings;
  std::erase_if(o.lengths, [&](int64_t length) {
    TERN_USAGE_CHECK(length >= 2, "--lengths: ", length, " is too short for --speculative (at least 2)");
    TERN_USAGE_CHECK(!a.lengths_given || length + extra <= positions, "--lengths ", bench_length_label(length),
                     " with ", extra, " more positions (the tokens per run and the drafts) exceeds the model's ",
                     positions);
    return length + extra > positions;
  });
  TERN_USAGE_CHECK(!o.lengths.empty(), "no default length fits the model's ", positions, " positions; give --lengths");
  if (gpu) {
    a.decode_steps = int(extra);
    // The verify table's largest step (--draft-max drafts, within the backend's limit above) keeps its states.
    lengths_fit_memory(a, runner, *gpu, o.lengths, {}, runner.verify_state_bytes(o.max_drafts + 1));
  }
  if (!a.quiet) o.log = [](const std::string& line) { std::fprintf(stderr, "bench: %s\n", line.c_str()); };
  SpecBenchReport r = bench_speculative(runner, o);
  r.version = TERN_VERSION;
  r.device = device_description(device);
  r.model = model;
  std::string lengths;
  for (int64_t length : o.lengths) lengths += (lengths.empty() ? "" : ",") + bench_length_label(length);
  std::string counts, accept;
  for (int k : o.draft_counts) counts += (counts.empty() ? "" : ",") + std::to_string(k);
  for (double p : o.acceptance) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%g", accept.empty() ? "" : ",", p);
    accept += buf;
  }
  r.command = "tern bench " +
              (a.synthetic ? std::string("--synthetic") : a.demo ? std::string("--demo") : "-m " + a.model_dir) +
              " --device " + device + " --speculative --lengths " + lengths + " --draft-max " +
              std::to_string(o.max_drafts) + " --draft-counts " + counts + " --acceptance " + accept +
              " --decode-steps " + std::to_string(o.tokens) + " --repeats " + std::to_string(o.repeats) +
              " --warmup " + std::to_string(o.warmup) + " --seed " + std::to_string(o.seed);
  std::fputs(bench_speculative_table(r).c_str(), stdout);
  std::fflush(stdout);
  if (!a.json_path.empty()) write_file(a.json_path, bench_speculative_json(r), "JSON");
  if (!a.plot_path.empty()) write_file(a.plot_path, bench_speculative_svg(r), "plot");
}
#endif

// "image encode ms": the vision encoder (ModelRunner::encode_image) on a size x size image, the median of `repeats`
// runs after one untimed; then "image prefill ms": the prefill of the image's tokens alone (forward_images of its
// run), timed the same way. size must be a multiple of patch x merge (32), so that the processor keeps the square as
// it is (between 256² and 4096² pixels): the grid is then (1, size/16, size/16). The pixels are random in the
// processor's normalised range [-1, 1] (the encoder's time does not depend on them).
void print_image_encode(ModelRunner& runner, const VisionConfig& vc, int size, int repeats) {
  const int factor = vc.patch_size * vc.spatial_merge_size;
  TERN_USAGE_CHECK(size % factor == 0 && int64_t(size) * size >= 65536 && int64_t(size) * size <= 16777216,
                   "--image ", size, ": a side that is a multiple of ", factor, ", from 256 to 4096");
  ImagePixels p;
  p.grid = {1, size / vc.patch_size, size / vc.patch_size};
  p.patch_dim = vc.patch_dim();
  p.values.resize(size_t(p.grid.h * p.grid.w * p.patch_dim));
  demo::Uniform pixels(/*seed=*/1, /*tensor=*/0, /*row=*/0);
  for (float& v : p.values) v = pixels.next();
  ImageEmbeddings e = runner.encode_image(p);  // untimed: scratch, first launches
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    e = runner.encode_image(p);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double ms_encode = ms[ms.size() / 2];
  std::printf("image encode ms: %.2f for a %dx%d image (grid 1 x %lld x %lld, %lld tokens; vision tower of %d blocks, "
              "width %lld; median of %zu)\n",
              ms_encode, size, size, (long long)p.grid.h, (long long)p.grid.w, (long long)e.tokens, vc.depth,
              (long long)vc.hidden_size, ms.size());
  std::fflush(stdout);

  // The prefill of its tokens: a prompt that is exactly the image's run (its <|image_pad|> ids, the encoder's rows in
  // their place, M-RoPE positions), in a fresh session each time.
  const std::vector<int32_t> ids(size_t(e.tokens), runner.config().image_token_id);
  const ImageSpan span{.image = &e, .at = 0, .first = 0, .count = e.tokens};
  std::vector<float> logits;
  std::unique_ptr<Session> session = runner.create_session(e.tokens + 16);
  runner.forward_images(*session, ids, std::span(&span, 1), false, logits);  // untimed: first launches, plans
  ms.clear();
  for (int i = 0; i < std::max(1, repeats); ++i) {
    session->reset();
    const auto t0 = std::chrono::steady_clock::now();
    runner.forward_images(*session, ids, std::span(&span, 1), false, logits);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double prefill_ms = ms[ms.size() / 2];
  std::printf("image prefill ms: %.2f for its %lld tokens (%.0f tok/s; median of %zu); encode + prefill %.2f ms\n",
              prefill_ms, (long long)e.tokens, double(e.tokens) / (prefill_ms / 1000.0), ms.size(),
              prefill_ms + ms_encode);
  std::fflush(stdout);
}

void run_bench(BenchArgs a) {
  TERN_USAGE_CHECK(int(!a.model_dir.empty()) + int(a.synthetic) + int(a.demo) == 1,
                   "tern bench: give exactly one of -m DIR, --synthetic or --demo");
  BenchOptions o;
  if (a.concurrency_given) {
    try {
      o.concurrency = bench_parse_concurrency(a.concurrency);
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());
    }
    TERN_USAGE_CHECK(!a.prefix_reuse, "--concurrency and --prefix-reuse are two different benchmarks: give one");
    TERN_USAGE_CHECK(a.plot_path.empty(), "--plot draws the table by length (or --speculative's); it has no plot "
                     "with --concurrency");
    TERN_USAGE_CHECK(a.decode_steps >= 1, "--concurrency times decode steps: --decode-steps must be >= 1");
  }
  if (a.speculative) {
    TERN_USAGE_CHECK(!a.concurrency_given && !a.prefix_reuse && a.json_schema.empty(),
                     "--speculative is a benchmark of its own: without --concurrency, --prefix-reuse or "
                     "--json-schema");
  } else {
    TERN_USAGE_CHECK(a.draft_counts.empty() && a.acceptance.empty(), "--draft-counts and --acceptance are "
                     "--speculative's: give --speculative too");
  }
  o.repeats = a.repeats;
  o.warmup = a.warmup;
  o.decode_steps = a.decode_steps;
  o.prefill_chunk = a.prefill_chunk;
  o.seed = a.seed;

  std::string device = a.device;
#ifdef TERN_HAVE_CUDA
  if (device == "auto") device = cuda_device_count() > 0 ? "cuda" : "cpu";
#else
  if (device == "auto") device = "cpu";
  TERN_USAGE_CHECK(device != "cuda", "--device cuda: this tern was built without the CUDA backend (backends: ",
                   compiled_backends(), ")");
#endif
  TERN_USAGE_CHECK(!a.synthetic || device == "cuda",
                   "--synthetic generates full-size weights on the GPU: it needs --device cuda");
  // On a GPU the sessions are planned in its memory (engine/memory_plan.h), as tern serve plans its own.
  const std::optional<GpuMemory> gpu = gpu_memory_before_load(device, a.gpu_memory, a.quiet);
  const KvDtype kv = kv_dtype_parse(a.kv_dtype);
  if (device == "cpu") cpu_kv_dtype_check(kv);

  BenchReport report;
  std::unique_ptr<ModelRunner> runner;
  std::shared_ptr<const ModelWeights> weights;
  std::optional<std::chrono::steady_clock::time_point> load_start;
  Roofline roofline;
  if (a.synthetic) {
#ifdef TERN_HAVE_CUDA
    Config config = config_parse(R"({"model_type": "qwen3_5_moe_text"})");
    const ModelWeights shapes = weights_mlx4_shapes(config);
    roofline = roofline_from_weights(shapes);
    if (gpu) gpu_memory_check_weights(*gpu, shapes.total_bytes());
    CudaRunnerOptions ro;
    ro.kv = kv;
    if (a.image > 0) {  // a random vision tower of Qwen3.6's widths, made on the device (and the config says so,
                        // for the image prefill's M-RoPE positions)
      config.vision = VisionConfig{};
      config.vision->out_hidden_size = config.hidden_size;
      ro.synthetic_vision = config.vision;
    }
    runner = cuda_runner_create_synthetic(config, a.seed, ro);
    report.model = "synthetic Qwen3.6-35B-A3B, random weights in the MLX 4-bit layout (routing near uniform), " +
                   weights_description(shapes, roofline);
#endif
  } else {
    if (a.demo) {
      weights = demo_model_build();
      report.model = "demo model (random weights)";
    } else {
      LoadOptions lo;
      lo.dtype = load_dtype_parse(a.dtype);
      load_start = std::chrono::steady_clock::now();
      weights = std::make_shared<const ModelWeights>(model_load(a.model_dir, lo));
      report.model = a.model_dir + " (" + weights->source_layout + ")";
    }
    roofline = roofline_from_weights(*weights);
    report.model += ", " + weights_description(*weights, roofline);
    if (device == "cpu") {
      runner = cpu_runner_create(weights);
    } else {
#ifdef TERN_HAVE_CUDA
      if (gpu) gpu_memory_check_weights(*gpu, weights->total_bytes());
      runner = cuda_runner_create(weights, CudaRunnerOptions{.kv = kv});
#endif
    }
  }
  TERN_CHECK(runner != nullptr, "tern bench: no runner for device ", device);
#ifndef TERN_GPU_ONLY
  if (a.speculative) return run_speculative(a, *runner, device, report.model, gpu);
#endif
  // The vision encoder: by default on CUDA when the model has a tower (a real checkpoint), else with --image. Before
  // the memory plan below, which then sees the encoder's scratch in use.
  const std::optional<VisionConfig> vision =
      a.synthetic && a.image > 0 ? std::optional<VisionConfig>(VisionConfig{}) : runner->config().vision;
  const int image = a.image >= 0 ? a.image : (device == "cuda" && vision ? 1024 : 0);
  if (image > 0) {
    TERN_USAGE_CHECK(vision.has_value(), "--image: this model has no vision tower");
    print_image_encode(*runner, *vision, image, a.repeats);
  }

  o.lengths = lengths_to_run(a, runner->config().max_position_embeddings);
  int64_t memory_context = 0;  // on a GPU: the longest context one sequence gets in its memory
  if (gpu && !a.prefix_reuse) memory_context = lengths_fit_memory(a, *runner, *gpu, o.lengths, o.concurrency);
  if (!a.lengths_given) {  // the lengths run, as the command line to repeat them says
    a.lengths.clear();
    for (int64_t length : o.lengths) a.lengths += (a.lengths.empty() ? "" : ",") + bench_length_label(length);
    if (!a.quiet && o.concurrency.empty())
      std::fprintf(stderr, "tern bench: lengths %s (the default ones that fit the model's %lld positions with %d "
                           "decode steps%s)\n",
                   a.lengths.c_str(), (long long)runner->config().max_position_embeddings, a.decode_steps,
                   memory_context > 0
                       ? (" and the GPU memory's " + token_count_text(memory_context) + " tokens").c_str()
                       : "");
    else if (!a.quiet)
      std::fprintf(stderr, "tern bench: context %s per stream (the default with --concurrency; give --lengths for "
                           "others)\n",
                   a.lengths.c_str());
  }
  if (load_start) {  // checkpoint on disk (or page cache) to a runner ready to run
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - *load_start).count();
    std::fprintf(stderr, "tern bench: model loaded and ready on %s in %.2f s (%.2f GB of weights, %.2f GB/s)\n",
                 device.c_str(), s, double(weights->total_bytes()) / 1e9, double(weights->total_bytes()) / 1e9 / s);
  }

  if (device == "cuda") {
#ifdef TERN_HAVE_CUDA
    report.device = device_description(device);
    // The ceilings measured on the H200 of targets.md.
    o.peak_gb_s = a.peak_gb_s >= 0 ? a.peak_gb_s : 4600;
    o.peak_tflop_s = a.peak_tflop_s >= 0 ? a.peak_tflop_s : 790;
    o.memory_in_use = [] {
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return int64_t(0);
      return int64_t(total_bytes - free_bytes);
    };
#endif
  } else {
    report.device = device_description(device);
    o.peak_gb_s = a.peak_gb_s > 0 ? a.peak_gb_s : 0;
    o.peak_tflop_s = a.peak_tflop_s > 0 ? a.peak_tflop_s : 0;
  }
  if (!a.quiet) o.log = [](const std::string& line) { std::fprintf(stderr, "bench: %s\n", line.c_str()); };

  if (a.prefix_reuse) {
    PrefixBenchOptions po;
    const std::vector<int64_t> ctx = bench_parse_lengths(a.prefix_context);
    TERN_CHECK(ctx.size() == 1, "--prefix-context takes one length, got '", a.prefix_context, "'");
    po.context = ctx[0];
    po.reply = a.prefix_reply;
    po.next = a.prefix_next;
    po.snapshot_every = a.snapshot_every;
    if (a.prefill_chunk > 0) po.prefill_chunk = a.prefill_chunk;
    po.repeats = a.repeats;
    po.seed = a.seed;
    po.log = o.log;
    const PrefixBenchReport pr = bench_prefix_reuse(*runner, po);
    std::printf("tern bench --prefix-reuse on %s, %s\n", report.device.c_str(), report.model.c_str());
    std::fputs(bench_prefix_table(pr).c_str(), stdout);
    std::fflush(stdout);
    return;
  }
#ifndef TERN_GPU_ONLY
  if (!a.json_schema.empty()) o.decode_mask = schema_mask_factory(a, runner->config().vocab_size);
#endif
  BenchReport measured = bench_run(*runner, roofline, o);
  measured.version = TERN_VERSION;
  measured.device = report.device;
  measured.model = report.model;
  measured.command = "tern bench " +
                     (a.synthetic ? std::string("--synthetic") : a.demo ? std::string("--demo") : "-m " + a.model_dir) +
                     " --device " + device + " --lengths " + a.lengths + " --repeats " + std::to_string(a.repeats) +
                     " --warmup " + std::to_string(a.warmup) + " --decode-steps " + std::to_string(a.decode_steps) +
                     (a.prefill_chunk ? " --prefill-chunk " + std::to_string(a.prefill_chunk) : std::string()) +
                     (!a.concurrency_given ? std::string() : std::string(" --concurrency ").append(a.concurrency)) +
                     (a.image >= 0 ? " --image " + std::to_string(a.image) : std::string());
  if (device == "cuda") measured.memory_kind = "GPU memory in use (cudaMemGetInfo), highest sample";
  std::fputs(bench_table(measured).c_str(), stdout);
  std::fflush(stdout);
  if (!a.json_path.empty()) write_file(a.json_path, bench_json(measured), "JSON");
  if (!a.plot_path.empty()) write_file(a.plot_path, bench_svg(measured), "plot");
}

}  // namespace

void command_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* sub = app.add_subcommand("bench", "Prefill and decode speed table from 256 to 128K tokens");
  sub->add_option("-m,--model", args->model_dir, "Model folder (HF BF16 or MLX)");
  sub->add_flag("--synthetic", args->synthetic, "Full-size random weights generated on the GPU (needs --device cuda)");
  sub->add_flag("--demo", args->demo, "The built-in demo model (random weights, small)");
  sub->add_option("--device", args->device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--dtype", args->dtype, "Weights of -m: auto, q4, bf16 or stored (see tern inspect)")
      ->check(CLI::IsMember({"auto", "q4", "bf16", "stored"}))
      ->capture_default_str();
  kv_dtype_flag_add(sub, args->kv_dtype);
  sub->add_option("--lengths", args->lengths,
                  "Prompt lengths, e.g. 256,4K,128K (default: those of 256 to 128K that fit the model's context "
                  "with the decode steps)")
      ->each([args](const std::string&) { args->lengths_given = true; })
      ->capture_default_str();
  sub->add_option("--repeats", args->repeats, "Timed runs per length (the median is reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--warmup", args->warmup, "Untimed runs per length before the timed ones")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  sub->add_option("--decode-steps", args->decode_steps,
                  "Decode tokens timed after each prefill (--speculative: tokens per run, default 128)")
      ->check(CLI::Range(0, 1 << 20))
      ->each([args](const std::string&) { args->decode_steps_given = true; })
      ->capture_default_str();
  sub->add_option("--prefill-chunk", args->prefill_chunk, "Prompt tokens per forward call (0: all in one)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--seed", args->seed, "Seed of the prompt tokens and of synthetic weights")->capture_default_str();
  sub->add_option("--peak-gbs", args->peak_gb_s, "Memory bandwidth ceiling in GB/s (default on CUDA: 4600, H200)");
  sub->add_option("--peak-tflops", args->peak_tflop_s, "Compute ceiling in TFLOP/s (default on CUDA: 790, H200 bf16)");
  sub->add_option("--json", args->json_path, "Write the results as JSON to this file");
  sub->add_option("--plot", args->plot_path,
                  "Write an SVG plot to this file: tok/s against length; with --speculative, the verify cost against "
                  "the draft count and the speed-up against acceptance (computed curves, measured points)");
  sub->add_flag("--prefix-reuse", args->prefix_reuse,
                "Instead of the table: time to first token of a conversation's second turn with and without "
                "multi-turn prefix reuse (--prefix-context, --prefix-reply, --prefix-next, --cache-snapshot-every; "
                "--prefill-chunk, default 4096 here)");
  sub->add_option("--prefix-context", args->prefix_context, "--prefix-reuse: turn 1's prompt length")
      ->capture_default_str();
  sub->add_option("--prefix-reply", args->prefix_reply, "--prefix-reuse: turn 1's reply tokens")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--prefix-next", args->prefix_next, "--prefix-reuse: turn 2's new tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--cache-snapshot-every", args->snapshot_every,
                  "--prefix-reuse: snapshot every N tokens of turn 1's prefill (0: only at the ends)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--concurrency", args->concurrency,
                  "Instead of the table: N streams decoding at once, e.g. 1,2,4,8,16,32 (each 1 to 256): per N, N "
                  "sessions each prefilled with the --lengths context (default here: 4K), then --decode-steps steps "
                  "of one batched forward over the N; aggregate and per-stream tok/s, inter-token latency p50/p99, "
                  "memory")
      ->each([args](const std::string&) { args->concurrency_given = true; });
  gpu_memory_flag_add(sub, args->gpu_memory);
  sub->add_flag("-q,--quiet", args->quiet, "No progress lines on stderr");
  sub->add_option("--image", args->image,
                  "Also time the vision encoder on a SIZE x SIZE image (\"image encode ms\"; SIZE a multiple of 32): "
                  "default 1024 on CUDA when the model has a vision tower, 0 turns it off; with --synthetic a random "
                  "tower of Qwen3.6's widths is made on the GPU for it")
      ->check(CLI::Range(0, 4096));
#ifndef TERN_GPU_ONLY
  sub->add_option("--json-schema", args->json_schema,
                  "Constrain the decode steps to this JSON Schema (greedy, masks on the host while the device runs)");
  sub->add_flag("--speculative", args->speculative,
                "Instead of the table: speculative decoding's costs and gains per --lengths (default 4K,32K; "
                "--demo: 256,1K): the verify cost of k = 0..--draft-max drafts against a plain step, the MTP head's "
                "draft cost, tok/s through the generation loop with drafts of a set --acceptance (--draft-counts "
                "per step; every output checked against decoding without drafts), and the speed-up the published "
                "MTP acceptance would give (computed)");
  sub->add_option("--draft-max", args->draft_max,
                  "--speculative: the largest draft count in the verify table (default: 8, or fewer where the "
                  "backend verifies fewer tokens in one step)")
      ->check(CLI::Range(1, 32));
  sub->add_option("--draft-counts", args->draft_counts, "--speculative: drafts per step end to end (default 3,5)");
  sub->add_option("--acceptance", args->acceptance,
                  "--speculative: per-draft probabilities of a right draft, end to end (default 0.5,0.7,0.8,0.9)");
#endif
  sub->callback([args] { run_bench(*args); });
}

}  // namespace tern::cli
