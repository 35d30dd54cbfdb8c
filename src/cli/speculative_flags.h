// --speculative and --draft-max (serve, run, generate): speculative decoding's drafts (engine/speculative.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/speculative.h"
#include "model/runner.h"

namespace tern::cli {

struct SpeculativeFlags {
  std::string mode = "off";
  int draft_max = 8;
};
void speculative_flags_add(CLI::App* sub, SpeculativeFlags& f);
// The options for `runner`, the mode resolved (speculative_effective_mode: auto to mtp or ngram); prints one line
// on stderr (unless quiet) when drafts were asked for that the runner cannot give (the backend cannot verify them,
// or mtp without the model's MTP head): then they are off.
SpeculativeOptions speculative_flags_options(const SpeculativeFlags& f, const ModelRunner& runner, bool quiet = false);

}  // namespace tern::cli
