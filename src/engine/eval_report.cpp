#include "engine/eval_report.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "engine/eval_run.h"

namespace tern {

namespace {
using Json = nlohmann::ordered_json;  // keys in the order written
}  // namespace

Top1Agreement top1_agreement(const EvalPosition& p, double tie_margin) {
  if (p.tern_top1 == p.reference_top1) return Top1Agreement::same;
  return p.reference_gap < tie_margin ? Top1Agreement::near_tie : Top1Agreement::differs;
}

const char* top1_agreement_name(Top1Agreement a) {
  switch (a) {
    case Top1Agreement::same: return "same";
    case Top1Agreement::near_tie: return "near-tie";
    case Top1Agreement::differs: return "differs";
  }
  return "?";
}

double quantile_sorted(std::span<const double> values, double q) {
  TERN_CHECK(!values.empty() && q >= 0 && q <= 1, "quantile ", q, " of ", values.size(), " values");
  const double h = q * double(values.size() - 1);
  const size_t lo = size_t(std::floor(h)), hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (h - double(lo)) * (values[hi] - values[lo]);
}

EvalReportSummary eval_report_summarize(std::span<const EvalPosition> positions, double tie_margin) {
  TERN_CHECK(!positions.empty(), "the eval report needs reference logits (--reference)");
  TERN_CHECK(std::isfinite(tie_margin) && tie_margin >= 0, "the tie margin must be a finite number >= 0 (nats), got ",
             tie_margin);
  EvalReportSummary r;
  r.tie_margin = tie_margin;
  r.positions = int64_t(positions.size());
  std::vector<double> kl;
  kl.reserve(positions.size());
  for (const EvalPosition& p : positions) {
    const Top1Agreement a = top1_agreement(p, tie_margin);
    r.top1_differences += a != Top1Agreement::same;
    r.near_ties += a == Top1Agreement::near_tie;
    r.beyond_tie_margin += a == Top1Agreement::differs;
    r.kl_total += p.kl;
    kl.push_back(p.kl);
  }
  std::sort(kl.begin(), kl.end());
  r.kl_p50 = quantile_sorted(kl, 0.50);
  r.kl_p90 = quantile_sorted(kl, 0.90);
  r.kl_p99 = quantile_sorted(kl, 0.99);
  r.kl_max = kl.back();
  r.worst_positions = (r.positions + 99) / 100;
  double worst = 0;
  for (int64_t i = 0; i < r.worst_positions; ++i) worst += kl[kl.size() - 1 - size_t(i)];
  r.worst_kl_share = r.kl_total > 0 ? worst / r.kl_total : 0;
  return r;
}

std::string eval_report_summary_text(const EvalReportSummary& r) {
  char buf[256];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "top-1 differ     %lld: %lld near-ties (the reference's top-1 leads tern's by < %g nats), %lld beyond\n",
                (long long)r.top1_differences, (long long)r.near_ties, r.tie_margin, (long long)r.beyond_tie_margin);
  out += buf;
  std::snprintf(buf, sizeof buf, "KL quantiles     p50 %.4g  p90 %.4g  p99 %.4g  max %.4g nats\n", r.kl_p50, r.kl_p90,
                r.kl_p99, r.kl_max);
  out += buf;
  std::snprintf(buf, sizeof buf, "KL worst 1%%      %.1f%% of the total KL, in %lld position(s)\n",
                100.0 * r.worst_kl_share, (long long)r.worst_positions);
  out += buf;
  return out;
}

std::string eval_report_json(const EvalSummary& s, const EvalReportSummary& r,
                             std::span<const EvalPosition> positions) {
  Json summary = Json::parse(eval_summary_json(s));
  summary.update(Json{{"tie_margin", r.tie_margin},
                      {"top1_differences", r.top1_differences},
                      {"near_ties", r.near_ties},
                      {"beyond_tie_margin", r.beyond_tie_margin},
                      {"kl_p50", r.kl_p50},
                      {"kl_p90", r.kl_p90},
                      {"kl_p99", r.kl_p99},
                      {"kl_total", r.kl_total},
                      {"worst_1pct_positions", r.worst_positions},
                      {"worst_1pct_kl_share", r.worst_kl_share}});
  Json differ = Json::array(), rows = Json::array();
  for (const EvalPosition& p : positions) {
    const Top1Agreement a = top1_agreement(p, r.tie_margin);
    if (a != Top1Agreement::same) differ.push_back(p.position);
    // nlohmann writes a non-finite double as null.
    rows.push_back({{"position", p.position},
                    {"kl", p.kl},
                    {"reference_top1", p.reference_top1},
                    {"tern_top1", p.tern_top1},
                    {"reference_margin", p.reference_margin},
                    {"tern_margin", p.tern_margin},
                    {"reference_gap", p.reference_gap},
                    {"top1", top1_agreement_name(a)}});
  }
  summary["top1_difference_positions"] = std::move(differ);
  Json doc;
  doc["summary"] = std::move(summary);
  doc["positions"] = std::move(rows);
  return doc.dump(2);
}

namespace {

// Each line of text behind "# ".
std::string commented(const std::string& text) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    out += "# " + text.substr(start, end - start) + "\n";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// A table of the positions that keep(p) selects, under a header row.
std::string position_table(std::span<const EvalPosition> positions, double tie_margin,
                           const std::function<bool(Top1Agreement)>& keep) {
  std::string out = "position\tkl\treference_top1\ttern_top1\treference_margin\ttern_margin\treference_gap\ttop1\n";
  char buf[256];
  for (const EvalPosition& p : positions) {
    const Top1Agreement a = top1_agreement(p, tie_margin);
    if (!keep(a)) continue;
    std::snprintf(buf, sizeof buf, "%lld\t%.6g\t%lld\t%lld\t%.6g\t%.6g\t%.6g\t%s\n", (long long)p.position, p.kl,
                  (long long)p.reference_top1, (long long)p.tern_top1, p.reference_margin, p.tern_margin,
                  p.reference_gap, top1_agreement_name(a));
    out += buf;
  }
  return out;
}

}  // namespace

std::string eval_report_text(const EvalSummary& s, const EvalReportSummary& r,
                             std::span<const EvalPosition> positions) {
  std::string out =
      "# tern eval report. KL(reference || tern) and margins in nats; margin: top-1 minus top-2 log-prob; "
      "reference_gap: the reference's log-prob of its top-1 minus of tern's top-1; top1: same, near-tie (the "
      "reference_gap below the tie margin) or differs\n";
  out += commented(eval_summary_text(s) + eval_report_summary_text(r));
  out += "#\n# top-1 differences\n";
  out += position_table(positions, r.tie_margin, [](Top1Agreement a) { return a != Top1Agreement::same; });
  out += "#\n# every position\n";
  out += position_table(positions, r.tie_margin, [](Top1Agreement) { return true; });
  return out;
}

void eval_report_check_path(const std::filesystem::path& path) {
  std::error_code ec;
  TERN_CHECK(!path.empty(), "the report file name is empty");
  TERN_CHECK(!std::filesystem::is_directory(path, ec), "cannot write the report ", path.string(),
             ": it is a folder");
  const std::filesystem::path parent = path.parent_path();
  TERN_CHECK(parent.empty() || std::filesystem::is_directory(parent, ec), "cannot write the report ", path.string(),
             ": the folder ", parent.string(), " does not exist");
}

void eval_report_write(const std::filesystem::path& path, const EvalSummary& s, const EvalReportSummary& r,
                       std::span<const EvalPosition> positions) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  const std::string text =
      ext == ".json" ? eval_report_json(s, r, positions) + "\n" : eval_report_text(s, r, positions);
  errno = 0;
  std::ofstream out(path, std::ios::binary);
  TERN_CHECK(out.good(), "cannot write the report ", path.string(), errno ? ": " : "",
             errno ? std::strerror(errno) : "");
  out << text;
  out.close();
  TERN_CHECK(!out.fail(), "writing the report ", path.string(), " failed");
}

}  // namespace tern
