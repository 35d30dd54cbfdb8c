// tern: entry point. Parses the subcommand and runs it. Exit status: 0 done; 2 a usage error (unknown flag, bad
// or missing value, a bad combination: CLI11's parse errors and TERN_USAGE_CHECK in the commands), with the
// message and a pointer to --help on stderr; 1 any other failure (tern::Error: a model that does not load, ...).
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/check.h"

int main(int argc, char** argv) {
  CLI::App app{"tern: an inference engine for Qwen3.6-35B-A3B"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and the backends compiled in");

#ifndef TERN_GPU_ONLY
  tern::cli::command_serve(app);
  tern::cli::command_run(app);
  tern::cli::command_generate(app);
#endif
  tern::cli::command_bench(app);
#ifndef TERN_GPU_ONLY  // a GPU machine's build without the text and server libraries (CMake TERN_GPU_ONLY)
  tern::cli::command_eval(app);
#endif
  tern::cli::command_inspect(app);
  tern::cli::command_quantize(app);
  tern::cli::command_extract_mtp(app);
#ifndef TERN_GPU_ONLY
  tern::cli::command_logits(app);
  tern::cli::command_tokenize(app);
  tern::cli::command_detokenize(app);
  tern::cli::command_template(app);
#endif

  try {
    app.parse(argc, argv);
    if (show_version) {
      std::printf("tern %s (backends: %s)\n", TERN_VERSION, tern::cli::compiled_backends());
      return 0;
    }
    if (app.get_subcommands().empty()) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
  } catch (const CLI::ParseError& e) {
    // --help and its kin are ParseErrors with status 0; every other one is a usage error. (CLI11's own statuses,
    // 104-120, tell its error classes apart; scripts only need "usage" as the Unix tools report it.)
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const tern::Error& e) {
    std::fprintf(stderr, "tern: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tern: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
