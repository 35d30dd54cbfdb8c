#include "engine/bench_run.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "core/check.h"
#include "engine/bench_concurrency.h"

namespace tern {

namespace {

using clock_type = std::chrono::steady_clock;


struct Runner {
  ModelRunner& runner;
  const BenchOptions& options;
  BenchReport& report;
  std::vector<float> logits;
  enum class DecodePath { unknown, device, host } path = DecodePath::unknown;
  std::mt19937_64 rng;
  std::uniform_int_distribution<int32_t> token_dist;
  std::unique_ptr<BenchMask> mask;  // this run's decode-step constraint (options.decode_mask), or null

  void sample_memory(int64_t& peak) {
    peak = std::max(peak, bench_memory_now(options));
  }

  void prefill(Session& session, const std::vector<int32_t>& prompt) {
    const int64_t n = int64_t(prompt.size());
    const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : n;
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t e = std::min(n, b + chunk);
      runner.forward(session, std::span<const int32_t>(prompt).subspan(size_t(b), size_t(e - b)), false, logits);
    }
  }

  // One decode step; returns the next input token.
  int32_t decode_step(Session& session, int32_t token) {
    const int32_t in[1] = {token};
    if (path != DecodePath::host) {
      const int64_t before = session.position();
      DeviceSampling greedy;
      greedy.mask = mask.get();
      std::optional<int32_t> next = runner.forward_sample(session, in, greedy);
      if (next) {
        path = DecodePath::device;
        if (mask) mask->accept(*next);
        return *next;
      }
      TERN_CHECK(!mask, "bench: constrained decode steps need a backend that samples on its device");
      path = DecodePath::host;
      if (session.position() != before) return token_dist(rng);  // consumed without a sample: count the step
    }
    runner.forward(session, in, false, logits);
    return token_dist(rng);  // the bench does not sample on the host: a random next token
  }

  // One run at one length: returns {prefill ms, decode ms per token}.
  std::pair<double, double> run(Session& session, const std::vector<int32_t>& prompt, BenchPoint& point) {
    session.reset();
    auto t0 = clock_type::now();
    prefill(session, prompt);
    const double prefill_ms = bench_ms_since(t0);
    sample_memory(point.memory_peak_bytes);
    double decode_ms = 0;
    if (options.decode_steps > 0) {
      if (options.decode_mask) mask = options.decode_mask();
      int32_t token = token_dist(rng);
      t0 = clock_type::now();
      for (int s = 0; s < options.decode_steps; ++s) token = decode_step(session, token);
      decode_ms = bench_ms_since(t0) / options.decode_steps;
      sample_memory(point.memory_peak_bytes);
    }
    return {prefill_ms, decode_ms};
  }
};

}  // namespace

double bench_ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int64_t bench_memory_now(const BenchOptions& options) {
  if (options.memory_in_use) return options.memory_in_use();
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return int64_t(u.ru_maxrss) * 1024;  // Linux: kilobytes
}

double bench_percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = std::clamp(q, 0.0, 100.0) / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - double(lo)) * (v[hi] - v[lo]);
}

double bench_median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

BenchReport bench_run(ModelRunner& runner, const Roofline& roofline, const BenchOptions& options) {
  TERN_CHECK(!options.lengths.empty(), "bench: no lengths to measure");
  TERN_CHECK(options.repeats >= 1, "bench: repeats must be >= 1, got ", options.repeats);
  TERN_CHECK(options.warmup >= 0, "bench: warmup must be >= 0, got ", options.warmup);
  TERN_CHECK(options.decode_steps >= 0, "bench: decode steps must be >= 0, got ", options.decode_steps);
  TERN_CHECK(options.prefill_chunk >= 0, "bench: prefill chunk must be >= 0, got ", options.prefill_chunk);
  const int64_t vocab_real = runner.vocab_real();
  TERN_CHECK(vocab_real > 0, "bench: the runner reports no vocabulary");
  for (int64_t L : options.lengths) {
    TERN_CHECK(L >= 1, "bench: length ", L, " must be >= 1");
    TERN_CHECK(L + options.decode_steps <= runner.config().max_position_embeddings, "bench: length ", L, " + ",
               options.decode_steps, " decode steps exceeds the model's max_position_embeddings ",
               runner.config().max_position_embeddings);
  }

  BenchReport report;
  report.backend = runner.backend_name();
  report.roofline = roofline;
  report.options = options;
  report.options.memory_in_use = nullptr;
  report.options.log = nullptr;
  report.options.decode_mask = nullptr;
  report.memory_kind = options.memory_in_use ? "device memory in use" : "host peak resident set";
  if (!options.concurrency.empty()) {
    bench_concurrency_rows(runner, options, report);
    return report;
  }
  Runner r{runner, options, report, {}, Runner::DecodePath::unknown, std::mt19937_64(options.seed),
           std::uniform_int_distribution<int32_t>(0, int32_t(vocab_real - 1)), nullptr};

  int64_t peak = 0;
  for (int64_t L : options.lengths) {
    BenchPoint point;
    point.length = L;
    point.memory_peak_bytes = peak;
    std::vector<int32_t> prompt(static_cast<size_t>(L));
    for (auto& t : prompt) t = r.token_dist(r.rng);
    auto session = runner.create_session(L + options.decode_steps);
    r.sample_memory(point.memory_peak_bytes);
    if (options.log) options.log("length " + bench_length_label(L) + ": warm-up");
    for (int w = 0; w < options.warmup; ++w) r.run(*session, prompt, point);
    for (int i = 0; i < options.repeats; ++i) {
      auto [p, d] = r.run(*session, prompt, point);
      point.prefill_ms.push_back(p);
      if (options.decode_steps > 0) point.decode_ms.push_back(d);
      if (options.log) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "length %s: run %d/%d prefill %.3f ms, decode %.4f ms/token",
                      bench_length_label(L).c_str(), i + 1, options.repeats, p, d);
        options.log(buf);
      }
    }
    session = nullptr;  // free this length's caches before the next one
    point.prefill_ms_median = bench_median(point.prefill_ms);
    if (point.prefill_ms_median > 0) {
      point.prefill_tok_s = double(L) / (point.prefill_ms_median * 1e-3);
      point.prefill_tflop_s = roofline.prefill_flops(L) / (point.prefill_ms_median * 1e-3) * 1e-12;
    }
    point.decode_context = double(L) + 0.5 * double(options.decode_steps);
    point.decode_ms_median = bench_median(point.decode_ms);
    if (point.decode_ms_median > 0) {
      point.decode_tok_s = 1e3 / point.decode_ms_median;
      point.decode_gb_s = roofline.decode_bytes(point.decode_context) * point.decode_tok_s * 1e-9;
    }
    peak = std::max(peak, point.memory_peak_bytes);
    report.points.push_back(std::move(point));
  }
  report.memory_peak_bytes = peak;
  report.decode_path = r.path == Runner::DecodePath::device ? "forward_sample (greedy on the device)"
                       : r.path == Runner::DecodePath::host ? "forward (last-token logits to the host)"
                                                            : "none";
  if (options.decode_mask && r.path == Runner::DecodePath::device)
    report.decode_path += ", constrained by a grammar's token mask (--json-schema)";
  return report;
}

std::vector<std::string> bench_split_list(const std::string& text, const char* flag) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    TERN_CHECK(!item.empty(), flag, ": empty item in '", text, "'");
    out.push_back(std::move(item));
    i = j + 1;
  }
  return out;
}

std::vector<int64_t> bench_parse_lengths(const std::string& text) {
  std::vector<int64_t> out;
  for (std::string item : bench_split_list(text, "--lengths")) {
    const std::string given = item;
    int64_t mult = 1;
    const char last = item.back();
    if (last == 'k' || last == 'K') mult = 1024, item.pop_back();
    else if (last == 'm' || last == 'M') mult = 1024 * 1024, item.pop_back();
    TERN_CHECK(!item.empty() && item.size() <= 9 &&
                   std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }),
               "--lengths: '", given, "' is not a length (like 256, 4K, 128K)");
    const int64_t v = std::stoll(item) * mult;
    TERN_CHECK(v >= 1, "--lengths: '", given, "' must be >= 1");
    out.push_back(v);
  }
  return out;
}

std::string bench_length_label(int64_t length) {
  if (length >= 1024 * 1024 && length % (1024 * 1024) == 0) return std::to_string(length / (1024 * 1024)) + "M";
  if (length >= 1024 && length % 1024 == 0) return std::to_string(length / 1024) + "K";
  return std::to_string(length);
}

}  // namespace tern
