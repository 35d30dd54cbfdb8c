// tern bench: prefill and decode speed of a runner at a list of context lengths.
//
// Method, per length L (after `warmup` untimed runs of the same shape):
//   prefill: a fresh (reset) session runs L random prompt tokens in one forward call (logits of the last token
//            only), timed on the host around the call; the runner returns logits on the host, so the call is
//            synchronous and the time is time to first token without HTTP;
//   decode:  `decode_steps` single-token steps follow on the same session (context L .. L+steps), timed together;
//            forward_sample (greedy, on the device) when the runner offers it, else forward with the last logits.
// `repeats` timed runs per length; every figure is the median. Achieved GB/s (decode) and TFLOP/s (prefill) come
// from the roofline (bench_roofline.h) and are set against the ceilings given.
//
// With `concurrency` (tern bench --concurrency 1,2,4), instead of the table, per length L and per stream count N
// (src/engine/bench_concurrency.cpp):
//   N sessions are created (capacity L + decode_steps) and each is prefilled with its own L random tokens (untimed);
//   then `decode_steps` steps follow, each ONE forward_batch call whose N entries decode one token per session
//   (greedy on the device through BatchEntry::sampling when the runner samples there, else last-token logits and
//   an argmax on the host), each step timed on the host around the call and the next tokens;
//   per run: decode time = the sum of its steps; aggregate tok/s = N x steps / the median run's decode time,
//   per-stream tok/s = steps / that time (= aggregate / N); inter-token latency p50 / p99 over every timed step
//   (a step's wall time is each stream's gap between two tokens); memory: the highest sample while the N sessions
//   exist. `warmup` untimed and `repeats` timed runs per (L, N), each from a reset and a new prefill.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "engine/bench_roofline.h"
#include "model/runner.h"

namespace tern {

// Constrained decode steps (tern bench --json-schema): a mask source the runner fills while each step's forward
// runs (ModelRunner::forward_sample) and that is told each sampled token.
class BenchMask : public TokenMaskSource {
 public:
  virtual void accept(int32_t id) = 0;
};

struct BenchOptions {
  std::vector<int64_t> lengths;      // prompt lengths; each >= 1
  int repeats = 3;                   // timed runs per length (median)
  int warmup = 1;                    // untimed runs per length before the timed ones
  int decode_steps = 16;             // decode tokens timed after each prefill
  int64_t prefill_chunk = 0;         // tokens per prefill forward call; 0: the whole prompt in one call
  uint64_t seed = 1;                 // prompt tokens are drawn from it
  double peak_gb_s = 0;              // memory bandwidth ceiling, GB/s (0: none, no % column)
  double peak_tflop_s = 0;           // compute ceiling, TFLOP/s (0: none)
  std::function<int64_t()> memory_in_use;            // bytes now (device memory); empty: host peak RSS
  std::function<void(const std::string&)> log;       // progress lines; may be empty
  // Called before each run's decode steps; empty: unconstrained. The steps then pass its mask to forward_sample
  // (the host path, which has no masks, is refused).
  std::function<std::unique_ptr<BenchMask>()> decode_mask;
  // Streams decoding at once (see the top of this file): each in [1, kBenchMaxConcurrency]. Empty: the
  // prefill/decode table by length.
  std::vector<int> concurrency;
};

inline constexpr int kBenchMaxConcurrency = 256;

struct BenchPoint {
  int64_t length = 0;
  std::vector<double> prefill_ms;    // every timed run
  std::vector<double> decode_ms;     // per token, every timed run
  double prefill_ms_median = 0;      // = time to first token
  double prefill_tok_s = 0;
  double prefill_tflop_s = 0;        // achieved
  double decode_ms_median = 0;       // per token
  double decode_tok_s = 0;
  double decode_gb_s = 0;            // achieved
  double decode_context = 0;         // mean context of the timed decode steps
  int64_t memory_peak_bytes = 0;     // highest memory_in_use (or RSS) seen up to this length
};

// One row of tern bench --concurrency: N streams at one context length.
struct BenchConcurrencyPoint {
  int64_t length = 0;                // prompt tokens each stream holds before its decode steps
  int streams = 0;                   // N: sessions, entries per forward_batch call
  std::vector<double> decode_ms;     // every timed run: the sum of its steps' wall times
  std::vector<double> step_ms;       // every timed step of every timed run (inter-token latency samples)
  double decode_ms_median = 0;       // median of decode_ms
  double aggregate_tok_s = 0;        // N x steps / decode_ms_median
  double stream_tok_s = 0;           // steps / decode_ms_median
  double itl_p50_ms = 0, itl_p99_ms = 0;  // percentiles of step_ms (linear between ranks)
  double decode_context = 0;         // mean context of the timed steps, per stream
  int64_t memory_peak_bytes = 0;     // highest memory_in_use (or RSS) seen while the N sessions existed
};

struct BenchReport {
  std::string version;               // tern's version (set by the caller)
  std::string command;               // the command line (set by the caller)
  std::string backend;               // runner.backend_name()
  std::string device;                // what ran it (GPU name, CPU model)
  std::string model;                 // what model (path, "synthetic", "demo") and its formats
  std::string memory_kind;           // what memory_peak_bytes measures
  std::string decode_path;           // "forward_sample" or "forward"
  Roofline roofline;
  BenchOptions options;              // as run (functions dropped)
  std::vector<BenchPoint> points;
  std::vector<BenchConcurrencyPoint> concurrency;  // options.concurrency's rows (then points is empty)
  int64_t memory_peak_bytes = 0;
};

// Runs the benchmark: the table by length, or with options.concurrency its rows. Throws tern::Error on bad options,
// sessions that do not fit (naming N and the context), or a runner failure.
BenchReport bench_run(ModelRunner& runner, const Roofline& roofline, const BenchOptions& options);

// "1,2,4,8" -> {1, 2, 4, 8}; each in [1, kBenchMaxConcurrency]. Throws tern::Error naming the bad item.
std::vector<int> bench_parse_concurrency(const std::string& text);

// "256,1K,4k,128K" -> {256, 1024, 4096, 131072}. Throws tern::Error naming the bad item.
std::vector<int64_t> bench_parse_lengths(const std::string& text);
// The items of a comma-separated flag value, spaces trimmed; an empty item is an error naming `flag`.
std::vector<std::string> bench_split_list(const std::string& text, const char* flag);
std::string bench_length_label(int64_t length);  // 256, 1K, 128K

// Outputs: the table a person reads, the JSON document, and an SVG plot of tok/s against length (log-log).
std::string bench_table(const BenchReport& report);
std::string bench_json(const BenchReport& report);
std::string bench_svg(const BenchReport& report);

double bench_median(std::vector<double> values);
// The q-th percentile (0..100), linear between the closest ranks (numpy's default); 0 for no values.
double bench_percentile(std::vector<double> values, double q);
// Memory in use now: options.memory_in_use(), else the host's peak resident set.
int64_t bench_memory_now(const BenchOptions& options);
// Milliseconds of the host's steady clock since t0.
double bench_ms_since(std::chrono::steady_clock::time_point t0);

}  // namespace tern
