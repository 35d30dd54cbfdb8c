#include "cli/speculative_flags.h"

#include <algorithm>
#include <cstdio>

namespace tern::cli {

void speculative_flags_add(CLI::App* sub, SpeculativeFlags& f) {
  sub->add_option("--speculative", f.mode,
                  "Speculative decoding: off, ngram (drafts from the conversation and a request's `prediction`, "
                  "verified exactly: the output is the same, only faster), mtp (drafts from the model's MTP head, "
                  "and the `prediction`) or auto (mtp where the model has the head, else ngram; off where the "
                  "backend cannot verify)")
      ->check(CLI::IsMember({"off", "ngram", "mtp", "auto"}))
      ->capture_default_str();
  sub->add_option("--draft-max", f.draft_max, "Drafts verified per step at most (each sequence adapts below it)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
}

SpeculativeOptions speculative_flags_options(const SpeculativeFlags& f, const ModelRunner& runner, bool quiet) {
  SpeculativeOptions o;
  o.mode = parse_speculative_mode(f.mode).value_or(SpeculativeMode::off);
  o.max_drafts = f.draft_max;
  const std::string why = speculative_unavailable(o.mode, runner);
  if (!why.empty() && !quiet) std::fprintf(stderr, "tern: %s\n", why.c_str());
  o.mode = speculative_effective_mode(o.mode, runner);
  return o;
}

int64_t speculative_flags_verify_bytes(const SpeculativeFlags& f, const ModelRunner& runner) {
  const SpeculativeOptions o = speculative_flags_options(f, runner, /*quiet=*/true);  // the command says why, once
  if (o.mode == SpeculativeMode::off || o.max_drafts <= 0) return 0;
  const int64_t tokens = std::min<int64_t>(int64_t(o.max_drafts) + 1, runner.max_verify_tokens());
  return runner.verify_state_bytes(int(tokens));
}

}  // namespace tern::cli
