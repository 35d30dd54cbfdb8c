// Each `tern` subcommand lives in its own cmd_<name>.cpp and registers itself on the CLI11 app here.
#pragma once

#include <CLI/CLI.hpp>

namespace tern::cli {

// Adds the subcommand and its callback to `app`. The callback throws tern::Error on bad input.
void command_serve(CLI::App& app);
void command_run(CLI::App& app);
void command_generate(CLI::App& app);
void command_bench(CLI::App& app);
void command_eval(CLI::App& app);
void command_inspect(CLI::App& app);
void command_quantize(CLI::App& app);
void command_extract_mtp(CLI::App& app);
void command_logits(CLI::App& app);
void command_tokenize(CLI::App& app);
void command_detokenize(CLI::App& app);
void command_template(CLI::App& app);

// For a subcommand whose issue has not landed: it says so plainly and exits with status 2.
void command_not_built(CLI::App& app, const char* name, const char* what);

// The backends compiled into this binary, e.g. "cpu, cuda".
const char* compiled_backends();

}  // namespace tern::cli
