#include "cli/commands.h"

namespace tern::cli {

void command_serve(CLI::App& app) { command_not_built(app, "serve", "Serve the OpenAI-compatible HTTP API"); }

}  // namespace tern::cli
