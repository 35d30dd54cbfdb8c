#include "engine/bench_concurrency.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <random>

#include "core/check.h"

namespace tern {

namespace {

using clock_type = std::chrono::steady_clock;

// Stream i's prompt at one length: its own random tokens, the same in every run.
std::vector<int32_t> stream_prompt(uint64_t seed, int stream, int64_t length, int64_t vocab_real) {
  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * uint64_t(stream + 1)));
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab_real - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t& t : prompt) t = dist(rng);
  return prompt;
}

int32_t host_argmax(const std::vector<float>& logits, int64_t vocab_real) {
  const int64_t n = std::min<int64_t>(vocab_real, int64_t(logits.size()));
  TERN_INTERNAL_CHECK(n > 0, "bench: forward_batch wrote no logits");
  return int32_t(std::max_element(logits.begin(), logits.begin() + n) - logits.begin());
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

struct ConcurrencyBench {
  ModelRunner& runner;
  const BenchOptions& options;
  int64_t vocab_real;
  enum class DecodePath { unknown, device, host } path = DecodePath::unknown;
  std::mt19937_64 rng;  // each run's first input tokens
  std::vector<float> prefill_logits;

  // N sessions of capacity L + steps, or an error naming N and the context: before any is made when the runner
  // knows a session's memory and what is free (as tern serve plans --parallel), else when one cannot be made.
  std::vector<std::unique_ptr<Session>> create_sessions(int n, int64_t length) {
    const int64_t capacity = length + options.decode_steps;
    if (const std::optional<int64_t> fit = sessions_that_fit(runner, capacity); fit && n > *fit) {
      const int64_t per = runner.session_bytes(capacity), free = runner.free_memory_bytes();
      const auto gb = [](double b) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f GB", b * 1e-9);
        return std::string(buf);
      };
      TERN_FAIL("bench --concurrency: ", n, " sessions of context ", bench_length_label(length), " (", capacity,
                " tokens with the decode steps) do not fit: they need ", gb(double(per) * n), " (", gb(double(per)),
                " each) but ", gb(double(free)), " is free; ", *fit, " fit at this context");
    }
    std::vector<std::unique_ptr<Session>> sessions;
    sessions.reserve(size_t(n));
    for (int i = 0; i < n; ++i) {
      try {
        sessions.push_back(runner.create_session(capacity));
      } catch (const std::exception& e) {
        sessions.clear();  // free what was made before reporting
        TERN_FAIL("bench --concurrency: ", n, " sessions of context ", bench_length_label(length), " (", capacity,
                  " tokens with the decode steps) do not fit: session ", i + 1, " of ", n,
                  " could not be created: ", e.what());
      } catch (...) {
        sessions.clear();
        TERN_FAIL("bench --concurrency: ", n, " sessions of context ", bench_length_label(length),
                  " do not fit: session ", i + 1, " of ", n, " could not be created");
      }
    }
    return sessions;
  }

  void prefill(Session& session, const std::vector<int32_t>& prompt) {
    const int64_t n = int64_t(prompt.size());
    const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : n;
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t e = std::min(n, b + chunk);
      runner.forward(session, std::span<const int32_t>(prompt).subspan(size_t(b), size_t(e - b)), false,
                     prefill_logits);
    }
  }

  // One run over the N sessions: reset and prefill each, then the decode steps. Returns every step's wall time.
  std::vector<double> run(std::vector<std::unique_ptr<Session>>& sessions, int64_t length, int64_t& memory_peak) {
    const int n = int(sessions.size());
    for (int i = 0; i < n; ++i) {
      sessions[size_t(i)]->reset();
      prefill(*sessions[size_t(i)], stream_prompt(options.seed, i, length, vocab_real));
    }
    memory_peak = std::max(memory_peak, bench_memory_now(options));

    std::vector<std::unique_ptr<BenchMask>> masks(static_cast<size_t>(n));
    if (options.decode_mask)
      for (auto& m : masks) m = options.decode_mask();
    std::vector<DeviceSampling> sampling(static_cast<size_t>(n));  // greedy
    for (int i = 0; i < n; ++i) sampling[size_t(i)].mask = masks[size_t(i)].get();
    std::vector<std::vector<float>> logits(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab_real - 1));
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t& t : tokens) t = dist(rng);
    std::vector<BatchEntry> batch(static_cast<size_t>(n));

    std::vector<double> step_ms;
    step_ms.reserve(size_t(options.decode_steps));
    for (int s = 0; s < options.decode_steps; ++s) {
      const auto t0 = clock_type::now();
      for (int i = 0; i < n; ++i) {
        BatchEntry& e = batch[size_t(i)];
        e = BatchEntry{};
        e.session = sessions[size_t(i)].get();
        e.tokens = std::span<const int32_t>(&tokens[size_t(i)], 1);
        e.logits = &logits[size_t(i)];
        e.sampling = path == DecodePath::host ? nullptr : &sampling[size_t(i)];
      }
      runner.forward_batch(batch);
      for (int i = 0; i < n; ++i) {
        BatchEntry& e = batch[size_t(i)];
        TERN_CHECK(!e.error, "bench --concurrency: stream ", i + 1, " of ", n, " at context ",
                   bench_length_label(length), " failed at decode step ", s + 1, ": ", what_of(e.error));
        TERN_CHECK(e.session->position() == length + s + 1, "bench --concurrency: stream ", i + 1, " of ", n,
                   " is at position ", e.session->position(), " after decode step ", s + 1, ", not ",
                   length + s + 1, " (forward_batch must consume each entry's token once)");
        const DecodePath got = e.sampled ? DecodePath::device : DecodePath::host;
        if (path == DecodePath::unknown) path = got;
        TERN_INTERNAL_CHECK(got == path, "bench --concurrency: forward_batch sampled on the device for some "
                                         "entries and not for others");
        if (got == DecodePath::device) {
          tokens[size_t(i)] = *e.sampled;
          if (masks[size_t(i)]) masks[size_t(i)]->accept(*e.sampled);
        } else {
          TERN_CHECK(!masks[size_t(i)], "bench: constrained decode steps need a backend that samples on its device");
          tokens[size_t(i)] = host_argmax(logits[size_t(i)], vocab_real);
        }
      }
      step_ms.push_back(bench_ms_since(t0));
    }
    memory_peak = std::max(memory_peak, bench_memory_now(options));
    return step_ms;
  }
};

}  // namespace

std::vector<int> bench_parse_concurrency(const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : bench_split_list(text, "--concurrency")) {
    TERN_CHECK(item.size() <= 9 && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }),
               "--concurrency: '", item, "' is not a number of streams (like 1,2,4,8)");
    const int n = std::stoi(item);
    TERN_CHECK(n >= 1 && n <= kBenchMaxConcurrency, "--concurrency: ", n, " streams: must be between 1 and ",
               kBenchMaxConcurrency);
    out.push_back(n);
  }
  return out;
}

void bench_concurrency_rows(ModelRunner& runner, const BenchOptions& options, BenchReport& report) {
  for (int n : options.concurrency)
    TERN_CHECK(n >= 1 && n <= kBenchMaxConcurrency, "bench: --concurrency ", n, ": the number of streams must be "
               "between 1 and ", kBenchMaxConcurrency);
  TERN_CHECK(options.decode_steps >= 1, "bench: --concurrency measures decode steps: --decode-steps must be >= 1");

  ConcurrencyBench b{runner, options, runner.vocab_real(), ConcurrencyBench::DecodePath::unknown,
                     std::mt19937_64(options.seed), {}};
  int64_t peak = 0;
  for (int64_t L : options.lengths) {
    for (int n : options.concurrency) {
      BenchConcurrencyPoint point;
      point.length = L;
      point.streams = n;
      const std::string label = std::string("length ")
                                    .append(bench_length_label(L))
                                    .append(", ")
                                    .append(std::to_string(n))
                                    .append(n == 1 ? " stream" : " streams");
      std::vector<std::unique_ptr<Session>> sessions = b.create_sessions(n, L);
      point.memory_peak_bytes = bench_memory_now(options);
      if (options.log) options.log(label + ": warm-up");
      for (int w = 0; w < options.warmup; ++w) b.run(sessions, L, point.memory_peak_bytes);
      for (int r = 0; r < options.repeats; ++r) {
        const std::vector<double> steps = b.run(sessions, L, point.memory_peak_bytes);
        double sum = 0;
        for (double ms : steps) sum += ms;
        point.decode_ms.push_back(sum);
        point.step_ms.insert(point.step_ms.end(), steps.begin(), steps.end());
        if (options.log) {
          char buf[200];
          std::snprintf(buf, sizeof buf, ": run %d/%d %.4f ms/step, %.1f tok/s in all", r + 1, options.repeats,
                        sum / double(steps.size()), double(n) * double(steps.size()) / (sum * 1e-3));
          options.log(label + buf);
        }
      }
      sessions.clear();  // free this row's caches before the next one
      point.decode_ms_median = bench_median(point.decode_ms);
      if (point.decode_ms_median > 0) {
        point.stream_tok_s = double(options.decode_steps) / (point.decode_ms_median * 1e-3);
        point.aggregate_tok_s = double(n) * point.stream_tok_s;
      }
      point.itl_p50_ms = bench_percentile(point.step_ms, 50);
      point.itl_p99_ms = bench_percentile(point.step_ms, 99);
      point.decode_context = double(L) + 0.5 * double(options.decode_steps);
      peak = std::max(peak, point.memory_peak_bytes);
      report.concurrency.push_back(std::move(point));
    }
  }
  report.memory_peak_bytes = peak;
  using P = ConcurrencyBench::DecodePath;
  report.decode_path = b.path == P::device ? "forward_batch, greedy on the device (BatchEntry::sampling)"
                       : b.path == P::host ? "forward_batch, last-token logits to the host (greedy argmax there)"
                                           : "none";
  if (options.decode_mask && b.path == P::device)
    report.decode_path += ", constrained by a grammar's token mask per stream (--json-schema)";
}

}  // namespace tern
