#include "cli/commands.h"

namespace tern::cli {

void command_tokenize(CLI::App& app) { command_not_built(app, "tokenize", "Text to token ids"); }

}  // namespace tern::cli
