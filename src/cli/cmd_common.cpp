#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"

namespace tern::cli {

void command_not_built(CLI::App& app, const char* name, const char* what) {
  auto* sub = app.add_subcommand(name, std::string(what) + " (not built yet)");
  sub->allow_extras();
  sub->callback([name] {
    std::fprintf(stderr, "tern %s: not built yet in this version of tern.\n", name);
    std::exit(2);
  });
}

const char* compiled_backends() {
#ifdef TERN_HAVE_CUDA
  return "cpu, cuda";
#else
  return "cpu";
#endif
}

}  // namespace tern::cli
