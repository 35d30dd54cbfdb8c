// tern bench outputs: the table a person reads and the JSON document (bench_run.h).
#include <nlohmann/json.hpp>

#include "engine/bench_format.h"
#include "engine/bench_run.h"

namespace tern {

namespace {

// tern bench --concurrency: one row per (context, N streams).
std::string bench_concurrency_table(const BenchReport& r) {
  std::string out;
  out += bench_format("| %7s | %7s | %15s | %16s | %10s | %10s | %9s |\n", "context", "streams", "aggregate tok/s",
                      "per-stream tok/s", "ITL p50 ms", "ITL p99 ms", "memory GB");
  out += "|--------:|--------:|----------------:|-----------------:|-----------:|-----------:|----------:|\n";
  for (const BenchConcurrencyPoint& p : r.concurrency)
    out += bench_format("| %7s | %7d | %15s | %16s | %10s | %10s | %9.2f |\n", bench_length_label(p.length).c_str(),
                        p.streams, bench_number(p.aggregate_tok_s, "%.1f").c_str(),
                        bench_number(p.stream_tok_s, "%.1f").c_str(), bench_number(p.itl_p50_ms, "%.3f").c_str(),
                        bench_number(p.itl_p99_ms, "%.3f").c_str(), double(p.memory_peak_bytes) * 1e-9);
  out += bench_format("\npeak memory: %.2f GB (%s)\n", double(r.memory_peak_bytes) * 1e-9, r.memory_kind.c_str());
  return out;
}

}  // namespace

std::string bench_table(const BenchReport& r) {
  const BenchOptions& o = r.options;
  const Roofline& f = r.roofline;
  std::string out;
  out +=
      bench_format("tern bench %s | backend %s | device %s\n", r.version.c_str(), r.backend.c_str(), r.device.c_str());
  out += bench_format("model: %s\n", r.model.c_str());
  out += bench_format("decode bytes/token: weights %.1f MB + state %.1f MB + KV %.1f KiB per context token\n",
                      f.weight_bytes_per_token * 1e-6, f.state_bytes_per_token * 1e-6, f.kv_bytes_per_context / 1024.0);
  out += bench_format("prefill FLOPs/token: linear %.3f GFLOP + GDN %.3f GFLOP + attention %.1f kFLOP x position\n",
                      f.linear_flops_per_token * 1e-9, f.gdn_flops_per_token * 1e-9, f.attention_flops_coeff * 1e-3);
  if (o.concurrency.empty())
    out +=
        bench_format("method: median of %d run(s) after %d warm-up run(s); %d decode step(s) per run; decode path %s\n",
                     o.repeats, o.warmup, o.decode_steps, r.decode_path.c_str());
  else
    out += bench_format(
        "method: per context and N streams, N sessions each prefilled with the context (untimed), then %d "
        "step(s) each one forward_batch of N entries (one token per stream); median of %d run(s) after %d "
        "warm-up run(s); decode path %s\n",
        o.decode_steps, o.repeats, o.warmup, r.decode_path.c_str());
  out +=
      "ceilings: " + (o.peak_gb_s > 0 ? bench_format("%.0f GB/s", o.peak_gb_s) : std::string("no bandwidth ceiling")) +
      ", " + (o.peak_tflop_s > 0 ? bench_format("%.0f TFLOP/s", o.peak_tflop_s) : std::string("no compute ceiling")) +
      "\n\n";
  if (!r.concurrency.empty()) return out + bench_concurrency_table(r);
  out += bench_format("| %6s | %13s | %8s | %6s | %10s | %12s | %9s | %8s | %6s | %11s | %10s |\n", "length",
                      "prefill tok/s", "TFLOP/s", "% peak", "TTFT ms", "decode tok/s", "ms/token", "GB/s", "% peak",
                      "limit tok/s", "memory GB");
  out +=
      "|-------:|--------------:|---------:|-------:|-----------:|-------------:|----------:|---------:|-------:|"
      "------------:|-----------:|\n";
  for (const BenchPoint& p : r.points) {
    const double limit = o.peak_gb_s > 0 ? o.peak_gb_s * 1e9 / f.decode_bytes(p.decode_context) : 0;
    out += bench_format("| %6s | %13s | %8s | %6s | %10s | %12s | %9s | %8s | %6s | %11s | %10.2f |\n",
                        bench_length_label(p.length).c_str(), bench_number(p.prefill_tok_s, "%.1f").c_str(),
                        bench_number(p.prefill_tflop_s, "%.3f").c_str(),
                        bench_percent(p.prefill_tflop_s, o.peak_tflop_s).c_str(),
                        bench_number(p.prefill_ms_median, "%.2f").c_str(), bench_number(p.decode_tok_s, "%.1f").c_str(),
                        bench_number(p.decode_ms_median, "%.3f").c_str(), bench_number(p.decode_gb_s, "%.1f").c_str(),
                        bench_percent(p.decode_gb_s, o.peak_gb_s).c_str(), bench_number(limit, "%.0f").c_str(),
                        double(p.memory_peak_bytes) * 1e-9);
  }
  out += bench_format("\npeak memory: %.2f GB (%s)\n", double(r.memory_peak_bytes) * 1e-9, r.memory_kind.c_str());
  return out;
}

std::string bench_json(const BenchReport& r) {
  using nlohmann::json;
  const BenchOptions& o = r.options;
  const Roofline& f = r.roofline;
  json j;
  bench_json_identity(j, r.version, r.command, r.backend, r.device, r.model);
  j["decode_path"] = r.decode_path;
  j["method"] = {{"repeats", o.repeats},
                 {"warmup", o.warmup},
                 {"decode_steps", o.decode_steps},
                 {"prefill_chunk", o.prefill_chunk},
                 {"seed", o.seed},
                 {"statistic", "median"},
                 {"timer", "host steady_clock around synchronous forward calls"}};
  j["ceilings"] = {{"gb_s", o.peak_gb_s}, {"tflop_s", o.peak_tflop_s}};
  j["roofline"] = {
      {"weight_bytes_per_token", f.weight_bytes_per_token},   {"state_bytes_per_token", f.state_bytes_per_token},
      {"kv_bytes_per_context_token", f.kv_bytes_per_context}, {"total_weight_bytes", f.total_weight_bytes},
      {"linear_flops_per_token", f.linear_flops_per_token},   {"gdn_flops_per_token", f.gdn_flops_per_token},
      {"attention_flops_coeff", f.attention_flops_coeff},     {"lm_head_flops", f.lm_head_flops}};
  j["memory_kind"] = r.memory_kind;
  j["memory_peak_bytes"] = r.memory_peak_bytes;
  json pts = json::array();
  for (const BenchPoint& p : r.points) {
    json q;
    q["length"] = p.length;
    q["prefill_ms"] = p.prefill_ms;
    q["prefill_ms_median"] = p.prefill_ms_median;
    q["ttft_ms"] = p.prefill_ms_median;
    q["prefill_tok_s"] = p.prefill_tok_s;
    q["prefill_flops"] = f.prefill_flops(p.length);
    q["prefill_tflop_s"] = p.prefill_tflop_s;
    q["decode_ms_per_token"] = p.decode_ms;
    q["decode_ms_median"] = p.decode_ms_median;
    q["decode_tok_s"] = p.decode_tok_s;
    q["decode_context"] = p.decode_context;
    q["decode_bytes_per_token"] = f.decode_bytes(p.decode_context);
    q["decode_gb_s"] = p.decode_gb_s;
    if (o.peak_gb_s > 0) {
      q["decode_pct_of_peak"] = 100.0 * p.decode_gb_s / o.peak_gb_s;
      q["decode_limit_tok_s"] = o.peak_gb_s * 1e9 / f.decode_bytes(p.decode_context);
    }
    if (o.peak_tflop_s > 0) q["prefill_pct_of_peak"] = 100.0 * p.prefill_tflop_s / o.peak_tflop_s;
    q["memory_peak_bytes"] = p.memory_peak_bytes;
    pts.push_back(std::move(q));
  }
  j["points"] = std::move(pts);
  if (!o.concurrency.empty()) {
    j["method"]["concurrency"] = o.concurrency;
    json rows = json::array();
    for (const BenchConcurrencyPoint& p : r.concurrency) {
      json q;
      q["length"] = p.length;
      q["streams"] = p.streams;
      q["decode_steps"] = o.decode_steps;
      q["decode_context"] = p.decode_context;
      q["decode_ms"] = p.decode_ms;
      q["decode_ms_median"] = p.decode_ms_median;
      q["step_ms"] = p.step_ms;
      q["aggregate_tok_s"] = p.aggregate_tok_s;
      q["per_stream_tok_s"] = p.stream_tok_s;
      q["itl_p50_ms"] = p.itl_p50_ms;
      q["itl_p99_ms"] = p.itl_p99_ms;
      q["memory_peak_bytes"] = p.memory_peak_bytes;
      rows.push_back(std::move(q));
    }
    j["concurrency"] = std::move(rows);
  }
  return j.dump(2) + "\n";
}

}  // namespace tern
