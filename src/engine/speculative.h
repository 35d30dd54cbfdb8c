// Speculative decoding's choices per sequence: where drafts come from (draft_ngram.h, draft_mtp.h) and how many to
// verify each step. A GenerationRun (generation_run.h) asks a SequenceDrafter for drafts before each decode
// step, verifies them with its next token as one multi-token forward (ModelRunner::forward_verify), accepts what
// the model would have produced anyway and rolls the session back (Session::rollback); the output is exactly what
// decoding without drafts gives.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/draft_mtp.h"
#include "engine/draft_ngram.h"
#include "model/runner.h"

namespace tern {

// --speculative.
enum class SpeculativeMode {
  off,    // no drafts (a request's `prediction` is ignored)
  ngram,  // drafts from the conversation (and the request's prediction)
  mtp,    // drafts from the model's MTP head (and the request's prediction)
  auto_,  // the best the model and backend have: mtp where the runner has the head, else ngram
};
const char* speculative_mode_name(SpeculativeMode m);                    // "off", "ngram", "mtp", "auto"
std::optional<SpeculativeMode> parse_speculative_mode(std::string_view s);  // nullopt when unknown

struct SpeculativeOptions {
  SpeculativeMode mode = SpeculativeMode::off;
  int max_drafts = 8;         // drafts per step at most (the step verifies max_drafts + 1 tokens)
  int64_t ngram_min_match = 2;
};

// The drafts `mode` gives on `runner`: off where the runner cannot verify drafts or (mtp) has no MTP head; auto
// resolved to mtp or ngram. Never auto.
SpeculativeMode speculative_effective_mode(SpeculativeMode mode, const ModelRunner& runner);
// Why `mode` gives no drafts on `runner` (one line for stderr, naming the mode), or "" when it gives them or was
// never asked for (off, auto).
std::string speculative_unavailable(SpeculativeMode mode, const ModelRunner& runner);

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

// A sequence's source of drafts as GenerationRun drives it: SequenceDrafter, or a benchmark's controlled drafter
// (bench_speculative.h).
class Drafter {
 public:
  virtual ~Drafter() = default;
  // An emitted token (in order).
  virtual void append(int32_t token) = 0;
  // Before each decode step: up to `limit` drafts (limit may be 0: none can help, the step still comes) for the
  // tokens after the one the step feeds (the last appended); empty: a plain step.
  virtual std::vector<int32_t> draft(int64_t limit) = 0;
  // The outcome of the drafts draft() returned last (accepted: how many matched the model's tokens).
  virtual void record(int drafted, int accepted) = 0;
  // After each forward of a prompt chunk, and once when the generation ends (the MTP head is fed there).
  virtual void after_prompt_chunk() {}
  virtual void finish() {}
};

// One sequence's drafts: the sources a mode enables over its conversation, and the policy.
class SequenceDrafter final : public Drafter {
 public:
  // mode: speculative_effective_mode's (ngram or mtp); prompt: the conversation so far; prediction: the client's
  // expected output, tokenised (may be empty). mtp: the head's drafter over the sequence's session (mode mtp).
  SequenceDrafter(const SpeculativeOptions& options, SpeculativeMode mode, std::span<const int32_t> prompt,
                  std::vector<int32_t> prediction, std::unique_ptr<MtpDrafter> mtp = nullptr);
  void append(int32_t token) override;
  // Up to min(limit, the policy's choice) drafts for the next step: the prediction's while the output follows it,
  // else the MTP head's (mode mtp) or the conversation's n-gram match (mode ngram, or the head unusable for this
  // sequence).
  std::vector<int32_t> draft(int64_t limit) override;
  void record(int drafted, int accepted) override { policy_.record(drafted, accepted); }
  void after_prompt_chunk() override;
  void finish() override;

 private:
  DraftPolicy policy_;
  std::optional<NgramDrafter> ngram_;
  std::optional<PredictionDrafter> prediction_;
  std::unique_ptr<MtpDrafter> mtp_;
};

}  // namespace tern
