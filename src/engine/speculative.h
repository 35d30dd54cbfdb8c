// Speculative decoding's choices per sequence: where drafts come from (draft_ngram.h; the MTP head later) and how
// many to verify each step. A GenerationRun (generation_run.h) asks a SequenceDrafter for drafts before each decode
// step, verifies them with its next token as one multi-token forward (ModelRunner::forward_verify), accepts what
// the model would have produced anyway and rolls the session back (Session::rollback); the output is exactly what
// decoding without drafts gives.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/draft_ngram.h"

namespace tern {

// --speculative. More kinds (mtp) come with their drafters.
enum class SpeculativeMode {
  off,    // no drafts (a request's `prediction` is ignored)
  ngram,  // drafts from the conversation (and the request's prediction)
  auto_,  // the best the model and backend have: now ngram where the backend can verify
};
const char* speculative_mode_name(SpeculativeMode m);                    // "off", "ngram", "auto"
std::optional<SpeculativeMode> parse_speculative_mode(std::string_view s);  // nullopt when unknown

struct SpeculativeOptions {
  SpeculativeMode mode = SpeculativeMode::off;
  int max_drafts = 8;         // drafts per step at most (the step verifies max_drafts + 1 tokens)
  int64_t ngram_min_match = 2;
};

// How many drafts to verify next, from the sequence's running acceptance: more after full acceptance, fewer after a
// rejection, none for a while when drafts rarely pass (each rejected draft is a token of work thrown away).
class DraftPolicy {
 public:
  explicit DraftPolicy(int max_drafts);
  int next() const;                      // drafts to ask for now (0: do not draft this step)
  void record(int drafted, int accepted);
  void skip_step();                      // a step without drafts (counts down a pause)
  double acceptance() const { return rate_; }

 private:
  int max_, k_;
  double rate_ = 0.6;  // running acceptance (drafts accepted / drafted), exponentially weighted
  int pause_ = 0;      // steps left without drafting
  int pauses_ = 0;     // pauses so far (each longer than the last)
};

// One sequence's drafts: the sources a mode enables over its conversation, and the policy.
class SequenceDrafter {
 public:
  // prompt: the conversation so far; prediction: the client's expected output, tokenised (may be empty).
  SequenceDrafter(const SpeculativeOptions& options, std::span<const int32_t> prompt,
                  std::vector<int32_t> prediction);
  // An emitted token (in order).
  void append(int32_t token);
  // Up to min(limit, the policy's choice) drafts for the next step: the prediction's while the output follows it,
  // else the conversation's n-gram match; empty: a plain step.
  std::vector<int32_t> draft(int64_t limit);
  // The outcome of the drafts draft() returned last (accepted: how many matched the model's tokens).
  void record(int drafted, int accepted) { policy_.record(drafted, accepted); }

 private:
  DraftPolicy policy_;
  std::optional<NgramDrafter> ngram_;
  std::optional<PredictionDrafter> prediction_;
};

}  // namespace tern
