// tern quantize --in BF16_DIR --out DIR: loads a checkpoint quantised to 4-bit (MLX's algorithm; 8-bit router and
// shared_expert_gate) and writes it in the MLX layout that tern and mlx-lm both load.
// tern quantize --synthetic --out DIR: writes a full-size checkpoint of random weights in that layout (19.5 GB;
// to measure loading and speed without a download).
#include <fstream>
#include <string>
#include <unistd.h>

#include "cli/commands.h"
#include "core/check.h"
#include "engine/demo_model.h"
#include "model/checkpoint.h"
#include "model/quantize.h"

namespace tern::cli {
namespace {

void write_synthetic(const std::string& out, int layers, double shard_gb, bool progress) {
  namespace fs = std::filesystem;
  DemoModelOptions o;
  o.full_size = true;
  o.layers = layers;
  o.vocab_real = 248320;  // the real embedding rows
  o.eos_json = "[248046, 248044]";
  o.seed = 0x5717;
  o.mtp = false;  // as an MLX conversion, which drops the MTP head
  // checkpoint_write_mlx takes the config from a source folder: write one for the synthetic model.
  const fs::path src = fs::temp_directory_path() / ("tern-synthetic-" + std::to_string(getpid()));
  fs::create_directories(src);
  std::ofstream(src / "config.json") << demo_config_json(o);
  std::ofstream(src / "generation_config.json") << demo_generation_config_json(o);
  try {
    const auto weights = demo_model_build(o);
    checkpoint_write_mlx(*weights, src, out, int64_t(shard_gb * 1e9), progress);
  } catch (...) {
    fs::remove_all(src);
    throw;
  }
  fs::remove_all(src);
}

}  // namespace

void command_quantize(CLI::App& app) {
  struct Args {
    std::string in, out;
    double shard_gb = 5.0;
    bool no_progress = false, synthetic = false;
    int layers = 40;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("quantize", "Write an MLX-layout 4-bit checkpoint from a BF16 one");
  auto* in = sub->add_option("--in", args->in, "Source checkpoint directory (HF BF16, or MLX)");
  auto* synthetic = sub->add_flag("--synthetic", args->synthetic,
                                  "Instead of --in: full-size random weights (the real architecture, 19.5 GB)");
  in->excludes(synthetic);
  sub->add_option("--layers", args->layers, "With --synthetic: number of layers")->default_val(40);
  sub->add_option("--out", args->out, "Output directory (must not exist or be empty)")->required();
  sub->add_option("--shard-gb", args->shard_gb, "Largest shard in GB")->default_val(5.0);
  sub->add_flag("--no-progress", args->no_progress, "No progress bars");
  sub->callback([args] {
    if (args->synthetic) {
      TERN_CHECK(args->layers > 0 && args->layers <= 40, "--layers must be in [1, 40], got ", args->layers);
      write_synthetic(args->out, args->layers, args->shard_gb, !args->no_progress);
      return;
    }
    TERN_CHECK(!args->in.empty(), "tern quantize needs --in BF16_DIR (or --synthetic)");
    LoadOptions o;
    o.dtype = LoadOptions::Dtype::q4;
    o.progress = !args->no_progress;
    const ModelWeights w = model_load(args->in, o);
    checkpoint_write_mlx(w, args->in, args->out, int64_t(args->shard_gb * 1e9), o.progress);
  });
}

}  // namespace tern::cli
