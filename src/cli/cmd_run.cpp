#include "cli/commands.h"

namespace tern::cli {

void command_run(CLI::App& app) { command_not_built(app, "run", "Chat in the terminal"); }

}  // namespace tern::cli
