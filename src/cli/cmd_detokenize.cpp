#include "cli/commands.h"

namespace tern::cli {

void command_detokenize(CLI::App& app) { command_not_built(app, "detokenize", "Token ids to text"); }

}  // namespace tern::cli
