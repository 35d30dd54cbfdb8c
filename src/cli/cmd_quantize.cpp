// tern quantize --in BF16_DIR --out DIR: loads a checkpoint quantised to 4-bit (MLX's algorithm; 8-bit router and
// shared_expert_gate) and writes it in the MLX layout that tern and mlx-lm both load.
#include <string>

#include "cli/commands.h"
#include "model/checkpoint.h"
#include "model/quantize.h"

namespace tern::cli {

void command_quantize(CLI::App& app) {
  struct Args {
    std::string in, out;
    double shard_gb = 5.0;
    bool no_progress = false;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("quantize", "Write an MLX-layout 4-bit checkpoint from a BF16 one");
  sub->add_option("--in", args->in, "Source checkpoint directory (HF BF16, or MLX)")->required();
  sub->add_option("--out", args->out, "Output directory (must not exist or be empty)")->required();
  sub->add_option("--shard-gb", args->shard_gb, "Largest shard in GB")->default_val(5.0);
  sub->add_flag("--no-progress", args->no_progress, "No progress bars");
  sub->callback([args] {
    LoadOptions o;
    o.dtype = LoadOptions::Dtype::q4;
    o.progress = !args->no_progress;
    const ModelWeights w = model_load(args->in, o);
    checkpoint_write_mlx(w, args->in, args->out, int64_t(args->shard_gb * 1e9), o.progress);
  });
}

}  // namespace tern::cli
