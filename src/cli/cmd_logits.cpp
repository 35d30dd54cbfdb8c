#include "cli/commands.h"

namespace tern::cli {

void command_logits(CLI::App& app) { command_not_built(app, "logits", "Write the logits of every position as .npy"); }

}  // namespace tern::cli
