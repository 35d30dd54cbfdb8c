#include "cli/commands.h"

namespace tern::cli {

void command_generate(CLI::App& app) { command_not_built(app, "generate", "Generate text from a prompt"); }

}  // namespace tern::cli
