#include "cli/commands.h"

namespace tern::cli {

void command_quantize(CLI::App& app) { command_not_built(app, "quantize", "Write an MLX-layout 4-bit checkpoint from a BF16 one"); }

}  // namespace tern::cli
