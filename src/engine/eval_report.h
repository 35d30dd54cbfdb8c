// tern eval --report: what a reader needs to tell top-1 flips at near-ties (positions where the reference itself
// hardly prefers its top-1 over the token tern chose) from real error. Per position: KL(p_ref || p_tern), both top-1
// tokens, both top-2 margins and the reference's gap to tern's top-1; over the run: how many top-1 differences are
// near-ties, KL quantiles, and the share of the total KL that the worst 1% of positions carry. Written as JSON or as
// a tab-separated text table.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "engine/eval_metrics.h"

namespace tern {

// The default of --tie-margin (nats).
inline constexpr double kDefaultTieMargin = 0.1;

// How tern's top-1 compares with the reference's at a position: the same token; a different one that the reference
// rates below its own top-1 by less than the tie margin (reference_gap < tie_margin: a near-tie); a different one
// beyond it. When tern chose the reference's runner-up, the usual near-tie flip, the gap is the reference's top-2
// margin; a choice further down the reference's ranking has a larger gap than that margin, and is judged by it.
enum class Top1Agreement { same, near_tie, differs };
Top1Agreement top1_agreement(const EvalPosition& p, double tie_margin);
const char* top1_agreement_name(Top1Agreement a);  // "same", "near-tie", "differs"

struct EvalReportSummary {
  double tie_margin = kDefaultTieMargin;
  int64_t positions = 0;
  int64_t top1_differences = 0;
  int64_t near_ties = 0;          // differences with reference_gap < tie_margin
  int64_t beyond_tie_margin = 0;  // the other differences
  double kl_p50 = 0, kl_p90 = 0, kl_p99 = 0, kl_max = 0;  // per-position KL, nats
  double kl_total = 0;
  int64_t worst_positions = 0;  // the worst 1% of positions, rounded up (at least 1)
  double worst_kl_share = 0;    // their KL / kl_total (0 when kl_total is 0)
};

// The q-quantile (q in [0, 1]) of ascending values, interpolated linearly between the two nearest ranks
// (numpy.quantile's default). values must not be empty.
double quantile_sorted(std::span<const double> values, double q);

// Throws tern::Error when positions is empty (no reference) or tie_margin is negative or not finite.
EvalReportSummary eval_report_summarize(std::span<const EvalPosition> positions, double tie_margin);

// Lines a person reads: tern eval prints them, the text report starts with them.
std::string eval_report_summary_text(const EvalReportSummary& r);

// The report as one JSON object: {"summary": {the eval summary's fields and the report's}, "positions": [one object
// a position]}. Infinite margins (a runner-up at -inf) are written as null.
std::string eval_report_json(const EvalSummary& s, const EvalReportSummary& r, std::span<const EvalPosition> positions);

// The report as text: the summaries as '#' lines, then two tab-separated tables with a header row each: the
// positions where the top-1 tokens differ, and every position.
std::string eval_report_text(const EvalSummary& s, const EvalReportSummary& r, std::span<const EvalPosition> positions);

// Throws tern::Error, before a long run, when the report cannot be written at path: a folder, or in a folder that
// does not exist.
void eval_report_check_path(const std::filesystem::path& path);

// Writes eval_report_json when path ends in .json, else eval_report_text. Throws tern::Error naming the file when it
// cannot be written.
void eval_report_write(const std::filesystem::path& path, const EvalSummary& s, const EvalReportSummary& r,
                       std::span<const EvalPosition> positions);

}  // namespace tern
