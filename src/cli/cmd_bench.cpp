#include "cli/commands.h"

namespace tern::cli {

void command_bench(CLI::App& app) { command_not_built(app, "bench", "Prefill and decode speed table"); }

}  // namespace tern::cli
