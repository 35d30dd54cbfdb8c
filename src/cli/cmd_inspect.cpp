#include "cli/commands.h"

namespace tern::cli {

void command_inspect(CLI::App& app) { command_not_built(app, "inspect", "Describe a checkpoint"); }

}  // namespace tern::cli
