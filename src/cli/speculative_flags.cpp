#include "cli/speculative_flags.h"

#include <cstdio>

namespace tern::cli {

void speculative_flags_add(CLI::App* sub, SpeculativeFlags& f) {
  sub->add_option("--speculative", f.mode,
                  "Speculative decoding: off, ngram (drafts from the conversation and a request's `prediction`, "
                  "verified exactly: the output is the same, only faster) or auto (the best drafter the backend "
                  "can verify)")
      ->check(CLI::IsMember({"off", "ngram", "auto"}))
      ->capture_default_str();
  sub->add_option("--draft-max", f.draft_max, "Drafts verified per step at most (each sequence adapts below it)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
}

SpeculativeOptions speculative_flags_options(const SpeculativeFlags& f, const ModelRunner& runner, bool quiet) {
  SpeculativeOptions o;
  o.mode = parse_speculative_mode(f.mode).value_or(SpeculativeMode::off);
  o.max_drafts = f.draft_max;
  if (o.mode != SpeculativeMode::off && !runner.supports_verify()) {
    if (!quiet && o.mode != SpeculativeMode::auto_)
      std::fprintf(stderr, "tern: the %s backend cannot verify drafts yet: --speculative %s is off\n",
                   runner.backend_name().c_str(), f.mode.c_str());
    o.mode = SpeculativeMode::off;
  }
  return o;
}

}  // namespace tern::cli
