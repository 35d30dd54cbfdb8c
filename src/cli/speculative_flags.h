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
// The memory the verify steps of one running sequence keep under `f` on `runner` (the memory plan's verify_bytes,
// engine/memory_plan.h): the states of a verify of --draft-max + 1 tokens (at most the runner's max_verify_tokens,
// as the generation caps them); 0 when the drafts are off (as asked, or unavailable on the runner).
int64_t speculative_flags_verify_bytes(const SpeculativeFlags& f, const ModelRunner& runner);

}  // namespace tern::cli
