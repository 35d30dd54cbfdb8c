#include "cli/commands.h"

namespace tern::cli {

void command_template(CLI::App& app) { command_not_built(app, "template", "Render a chat request through the model's chat template"); }

}  // namespace tern::cli
