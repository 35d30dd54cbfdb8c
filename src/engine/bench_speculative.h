// tern bench --speculative: what speculative decoding costs and gains on a runner (issue 32, item 6). Random weights
// cannot show real acceptance, so the drafts' quality is set and everything else is the real thing. Runner-agnostic:
// any runner that supports_verify() (the MTP rows need supports_mtp()).
//
// Method, per context length L (one session; L random prompt tokens from `seed`):
//   plain step:  one-token forwards at L, L + 1, ... as the generation's decode steps run them (forward_sample,
//                greedy on the device, where the runner has it; else forward with the last logits);
//   verify cost: for k = 0..max_drafts, k + 1 tokens through forward_verify_sample (the rows' ids sampled on the
//                device, as the generation's verify steps run where the runner can; else forward_verify, the logits
//                to the host), then Session::rollback to L, timed together on the host; as ms and as a ratio to the
//                plain step; the rollback's own time beside it (it returns once its copies are done);
//   draft cost:  (runners with the MTP head, fed over the prompt) MtpDrafter::draft(k) at L for k = 1..max_drafts:
//                the pair (h_{L-1}, x_L) and k - 1 chained steps of the head;
//   end to end:  `tokens` tokens generated greedily through GenerationRun (the engine's loop: its verify steps,
//                rollbacks and checks), each run from the prompt's first L - 1 tokens restored from a snapshot
//                (prefilled again where the runner has none). First without drafts: the reference continuation,
//                and the plain tok/s. Then per draft count k and acceptance a: a controlled drafter proposes the
//                reference's next k tokens (at most), each replaced by another token with probability 1 - a
//                (seeded per run). Every run's output is compared with the reference: any mismatch is a bug.
//                tok/s = (tokens - 1) / decode time (GenerationResult::decode_tok_s);
//   computed:    (not measured) the speed-up of a per-draft acceptance p with k drafts, from the measured costs:
//                expected tokens per step E = (1 - p^(k+1)) / (1 - p) (drafts kept up to the first wrong one, plus
//                the step's own token), step cost verify(k) + draft(k) (draft(k) only where measured), speed-up
//                E x plain / step cost. Beside every end-to-end row, and for the MTP acceptance published for this
//                model (llama.cpp: 73-87% with 3-4 drafts).
// Timings are medians of `repeats` runs after `warmup` untimed ones (the steps' at least two: a runner may run a step
// eagerly the first time and capture its CUDA graph the second).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/runner.h"

namespace tern {

struct SpecBenchOptions {
  std::vector<int64_t> lengths;              // context lengths; each >= 2
  int max_drafts = 8;                        // the verify table's k = 0..max_drafts (and the MTP draft rows)
  std::vector<int> draft_counts = {3, 5};    // end to end: drafts per step (each in [1, max_drafts])
  std::vector<double> acceptance = {0.5, 0.7, 0.8, 0.9};  // end to end: per-draft probability of being right
  int64_t tokens = 128;                      // generated per end-to-end run (>= 2)
  int repeats = 3;                           // timed runs (median)
  int warmup = 1;                            // untimed runs before them
  uint64_t seed = 1;                         // the prompts, the filler tokens, the corruption
  std::function<void(const std::string&)> log;  // progress lines; may be empty
};

// The per-draft acceptance published for Qwen3.6's MTP head (llama.cpp, 3-4 drafts): its ends and its middle.
inline constexpr double kPublishedMtpAcceptance[] = {0.73, 0.80, 0.87};
inline constexpr int kPublishedMtpDrafts[] = {3, 4};

struct SpecVerifyRow {
  int drafts = 0;                  // k: the step verifies k + 1 tokens
  std::vector<double> ms;          // every timed forward_verify + rollback
  double ms_median = 0;
  std::vector<double> rollback_ms;  // the rollback's own part of each of `ms` (Session::rollback, synchronous)
  double rollback_ms_median = 0;
  double ratio = 0;                // ms_median / the plain step's
  std::vector<double> mtp_ms;      // every timed MtpDrafter::draft(k) (empty: no MTP head, or k = 0)
  double mtp_ms_median = 0;        // 0 when not measured
};

struct SpecEndToEndRow {
  int drafts = 0;                  // 0: the plain runs (no drafter)
  double acceptance = 0;           // the drafter's per-draft probability of being right (plain: 0)
  std::vector<double> tok_s;       // every timed run
  double tok_s_median = 0;
  double speedup = 0;              // tok_s_median / the plain runs'
  double computed_speedup = 0;     // from the verify costs at `acceptance` (plain: 0)
  int64_t drafted = 0, accepted = 0;  // over every run, warm-up included
  int64_t decode_steps = 0;        // forwards after the prompt, over every run (generated / decode_steps: tokens
                                   // per step)
  int64_t generated = 0;           // tokens after the first, over every run
  int runs = 0;                    // warm-up included
  int mismatches = 0;              // runs whose tokens differ from the reference
  int64_t first_mismatch = -1;     // the earliest index where one did (-1: none)
};

struct SpecPublishedRow {
  int drafts = 0;
  double acceptance = 0;
  double tokens_per_step = 0;      // E
  double cost_ratio = 0;           // (verify(k) + draft(k)) / plain
  bool draft_cost = false;         // draft(k) measured (an MTP head) and included
  double speedup = 0;
};

struct SpecBenchPoint {
  int64_t length = 0;
  std::vector<double> plain_ms;    // every timed one-token step
  double plain_ms_median = 0;
  std::vector<SpecVerifyRow> verify;        // k = 0..max_drafts
  std::vector<SpecEndToEndRow> end_to_end;  // the plain runs first, then (k, a) in the options' order
  std::vector<SpecPublishedRow> published;
};

struct SpecBenchReport {
  std::string version, command, device, model;  // set by the caller
  std::string backend;             // runner.backend_name()
  std::string plain_path;          // "forward_sample" or "forward"
  std::string verify_path;         // "forward_verify_sample" or "forward_verify"
  bool mtp = false;                // the runner has the MTP head (the draft-cost column)
  bool snapshots = false;          // end-to-end runs restore the prompt (else prefill it again)
  SpecBenchOptions options;        // as run (log dropped)
  std::vector<SpecBenchPoint> points;
  int mismatches = 0;              // over every end-to-end run
  int runs = 0;
};

// Runs it. Throws tern::Error on bad options (naming the field) or a runner that cannot verify drafts.
SpecBenchReport bench_speculative(ModelRunner& runner, const SpecBenchOptions& options);

// E = (1 - p^(k+1)) / (1 - p): tokens per step when each of k drafts is right with probability p, independently.
double spec_tokens_per_step(double p, int k);
// The speed-up over the plain step of k drafts at per-draft acceptance p, from costs in ms:
// spec_tokens_per_step(p, k) x plain_ms / (verify_ms + draft_ms). At p = 1 it is (k + 1) x plain / step. 0 when a
// cost is not finite, plain_ms or the step's cost is not > 0, or draft_ms < 0 (nothing to compute from).
double spec_computed_speedup(double p, int k, double plain_ms, double verify_ms, double draft_ms = 0);

// "0.5,0.7,0.9" -> {0.5, 0.7, 0.9}, each in [0, 1]. Throws tern::Error naming the bad item.
std::vector<double> bench_parse_acceptance(const std::string& text);
// "3,5" -> {3, 5}, each in [1, max_drafts]. Throws tern::Error naming the bad item.
std::vector<int> bench_parse_draft_counts(const std::string& text, int max_drafts);

std::string bench_speculative_table(const SpecBenchReport& report);
std::string bench_speculative_json(const SpecBenchReport& report);
// An SVG of two panels (bench_speculative_plot.cpp): the verify cost against k per length, and the computed speed-up
// against acceptance per k with the measured end-to-end rows as markers. Plain SVG 1.1, like bench_svg.
std::string bench_speculative_svg(const SpecBenchReport& report);

}  // namespace tern
