#include "cli/commands.h"

namespace tern::cli {

void command_eval(CLI::App& app) { command_not_built(app, "eval", "Perplexity, KL divergence and top-1 agreement against reference logits"); }

}  // namespace tern::cli
