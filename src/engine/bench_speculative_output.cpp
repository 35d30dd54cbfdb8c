// tern bench --speculative outputs: the tables a person reads and the JSON document (bench_speculative.h).
#include <nlohmann/json.hpp>

#include "engine/bench_format.h"
#include "engine/bench_run.h"
#include "engine/bench_speculative.h"

namespace tern {

std::string bench_speculative_table(const SpecBenchReport& r) {
  const SpecBenchOptions& o = r.options;
  std::string out;
  out += bench_format("tern bench --speculative %s | backend %s | device %s\n", r.version.c_str(), r.backend.c_str(),
                      r.device.c_str());
  out += bench_format("model: %s\n", r.model.c_str());
  out += bench_format(
      "method: median of %d run(s) after %d warm-up run(s) (the steps: at least 2); plain step: %s, one token\n\n",
      o.repeats, o.warmup, r.plain_path.c_str());

  out += bench_format(
      "verify cost: the step's token and k drafts through %s, then rollback (verify ms: both; rollback ms: the "
      "rollback alone, part of it)",
      r.verify_path.c_str());
  out +=
      r.mtp ? "; MTP draft: k greedy drafts from the model's MTP head\n" : "; no MTP head (no draft cost measured)\n";
  out += bench_format("| %7s | %6s | %9s | %11s | %12s | %12s | %14s |\n", "context", "drafts", "verify ms",
                      "rollback ms", "x plain step", "MTP draft ms", "MTP ms / draft");
  out += "|--------:|-------:|----------:|------------:|-------------:|-------------:|---------------:|\n";
  for (const SpecBenchPoint& p : r.points) {
    const std::string L = bench_length_label(p.length);
    out += bench_format("| %7s | %6s | %9.3f | %11s | %11.2fx | %12s | %14s |\n", L.c_str(), "plain",
                        p.plain_ms_median, "-", 1.0, "-", "-");
    for (const SpecVerifyRow& v : p.verify)
      out += bench_format("| %7s | %6d | %9.3f | %11.3f | %11.2fx | %12s | %14s |\n", L.c_str(), v.drafts, v.ms_median,
                          v.rollback_ms_median, v.ratio, bench_number(v.mtp_ms_median, "%.3f").c_str(),
                          bench_number(v.drafts > 0 ? v.mtp_ms_median / v.drafts : 0, "%.3f").c_str());
  }

  out += bench_format(
      "\nend to end: %lld tokens, greedy, through the generation loop; drafts: the reference continuation, "
      "each token wrong with probability 1 - acceptance; computed: from the verify costs above\n",
      (long long)o.tokens);
  out +=
      bench_format("| %7s | %6s | %10s | %17s | %13s | %9s | %8s | %8s | %10s |\n", "context", "drafts", "acceptance",
                   "accepted / drafted", "tokens / step", "tok/s", "speed-up", "computed", "mismatches");
  out +=
      "|--------:|-------:|-----------:|------------------:|--------------:|----------:|---------:|---------:|"
      "-----------:|\n";
  for (const SpecBenchPoint& p : r.points) {
    const std::string L = bench_length_label(p.length);
    for (const SpecEndToEndRow& e : p.end_to_end) {
      const bool plain = e.drafts == 0;
      out += bench_format(
          "| %7s | %6s | %10s | %17s | %13.2f | %9.1f | %7.2fx | %8s | %10s |\n", L.c_str(),
          plain ? "off" : std::to_string(e.drafts).c_str(), plain ? "-" : bench_format("%.2f", e.acceptance).c_str(),
          plain ? "-" : bench_format("%.2f", e.drafted > 0 ? double(e.accepted) / double(e.drafted) : 0.0).c_str(),
          e.decode_steps > 0 ? double(e.generated) / double(e.decode_steps) : 0.0, e.tok_s_median, e.speedup,
          plain ? "-" : bench_format("%.2fx", e.computed_speedup).c_str(),
          bench_format("%d / %d", e.mismatches, e.runs).c_str());
    }
  }

  out +=
      "\nthe MTP acceptance published for Qwen3.6-35B-A3B (llama.cpp: 73-87% with 3-4 drafts), as a per-draft "
      "probability: the speed-up it would give, COMPUTED from the costs above (not measured)\n";
  out += bench_format("| %7s | %6s | %10s | %13s | %17s | %19s |\n", "context", "drafts", "acceptance", "tokens / step",
                      "step x plain step", "speed-up (computed)");
  out += "|--------:|-------:|-----------:|--------------:|------------------:|--------------------:|\n";
  for (const SpecBenchPoint& p : r.points)
    for (const SpecPublishedRow& q : p.published)
      out += bench_format("| %7s | %6d | %10.2f | %13.2f | %16.2fx | %18.2fx |\n", bench_length_label(p.length).c_str(),
                          q.drafts, q.acceptance, q.tokens_per_step, q.cost_ratio, q.speedup);
  out += r.mtp ? "(step = verify + the MTP head's drafts)\n"
               : "(step = verify only: this model has no MTP head, so its draft cost is not in it)\n";
  out += bench_format("\nmismatches against decoding without drafts: %d of %d runs%s\n", r.mismatches, r.runs,
                      r.mismatches == 0 ? "" : " -- speculative decoding changed the output");
  return out;
}

std::string bench_speculative_json(const SpecBenchReport& r) {
  using nlohmann::json;
  const SpecBenchOptions& o = r.options;
  json j;
  bench_json_identity(j, r.version, r.command, r.backend, r.device, r.model);
  j["plain_path"] = r.plain_path;
  j["verify_path"] = r.verify_path;
  j["mtp"] = r.mtp;
  j["method"] = {{"repeats", o.repeats},
                 {"warmup", o.warmup},
                 {"max_drafts", o.max_drafts},
                 {"draft_counts", o.draft_counts},
                 {"acceptance", o.acceptance},
                 {"tokens", o.tokens},
                 {"seed", o.seed},
                 {"prompt_restored_from_snapshot", r.snapshots},
                 {"statistic", "median"},
                 {"verify_ms", "forward_verify(_sample) then Session::rollback, timed together; rollback_ms: the "
                               "rollback alone (included in ms)"},
                 {"computed_speedup", "(1 - p^(k+1)) / (1 - p) x plain step ms / (verify ms (k) + MTP draft ms (k))"},
                 {"published_mtp_acceptance", "llama.cpp, Qwen3.6-35B-A3B MTP: 73-87% with 3-4 drafts"}};
  json pts = json::array();
  for (const SpecBenchPoint& p : r.points) {
    json q;
    q["length"] = p.length;
    q["plain_ms"] = p.plain_ms;
    q["plain_ms_median"] = p.plain_ms_median;
    json verify = json::array();
    for (const SpecVerifyRow& v : p.verify) {
      json row = {{"drafts", v.drafts},
                  {"ms", v.ms},
                  {"ms_median", v.ms_median},
                  {"rollback_ms", v.rollback_ms},
                  {"rollback_ms_median", v.rollback_ms_median},
                  {"ratio", v.ratio}};
      if (!v.mtp_ms.empty()) {
        row["mtp_draft_ms"] = v.mtp_ms;
        row["mtp_draft_ms_median"] = v.mtp_ms_median;
      }
      verify.push_back(row);
    }
    q["verify"] = verify;
    json e2e = json::array();
    for (const SpecEndToEndRow& e : p.end_to_end)
      e2e.push_back({{"drafts", e.drafts},
                     {"acceptance", e.drafts == 0 ? json(nullptr) : json(e.acceptance)},
                     {"tok_s", e.tok_s},
                     {"tok_s_median", e.tok_s_median},
                     {"speedup", e.speedup},
                     {"computed_speedup", e.drafts == 0 ? json(nullptr) : json(e.computed_speedup)},
                     {"drafted", e.drafted},
                     {"accepted", e.accepted},
                     {"decode_steps", e.decode_steps},
                     {"generated", e.generated},
                     {"runs", e.runs},
                     {"mismatches", e.mismatches},
                     {"first_mismatch", e.first_mismatch < 0 ? json(nullptr) : json(e.first_mismatch)}});
    q["end_to_end"] = e2e;
    json pub = json::array();
    for (const SpecPublishedRow& c : p.published)
      pub.push_back({{"drafts", c.drafts},
                     {"acceptance", c.acceptance},
                     {"tokens_per_step", c.tokens_per_step},
                     {"cost_ratio", c.cost_ratio},
                     {"draft_cost_included", c.draft_cost},
                     {"computed_speedup", c.speedup}});
    q["published_computed"] = pub;
    pts.push_back(q);
  }
  j["points"] = pts;
  j["mismatches"] = r.mismatches;
  j["runs"] = r.runs;
  return j.dump(2) + "\n";
}

}  // namespace tern
