// tern bench: the roofline against the figures of kernels.md §2 for the real model's MLX 4-bit layout, the
// measuring loop over a fake runner, the length parser, and the table / JSON / SVG outputs; --concurrency's rows
// (N streams, one forward_batch of N entries per step) over a fake runner that records its batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "engine/bench_roofline.h"
#include "engine/bench_run.h"
#include "eval_fake_runner.h"

namespace tern {
namespace {

// Qwen3.6-35B-A3B in the MLX 4-bit layout (model.md §4.2), shapes only: the Config defaults are the real model's.
ModelWeights full_size_mlx4() {
  Config c;
  c.layer_types.clear();
  for (int i = 0; i < c.num_hidden_layers; ++i)
    c.layer_types.push_back(i % 4 == 3 ? LayerType::full_attention : LayerType::linear_attention);
  return weights_mlx4_shapes(c);
}

TEST(BenchRoofline, MatchesTheKernelBriefForTheRealModel) {
  const Roofline r = roofline_from_weights(full_size_mlx4());
  // kernels.md §2.1: weights 1,669 MB per token (4.5 bits per weight; norms and the embedding row left out);
  // tolerance 1% for those small terms and the f32 vectors of the internal layout.
  EXPECT_NEAR(r.weight_bytes_per_token, 1669e6, 0.01 * 1669e6);
  // GDN state fp32 read + write 126 MB, conv state bf16 3 MB (30 layers).
  EXPECT_NEAR(r.state_bytes_per_token, 129e6, 0.02 * 129e6);
  // KV bf16: 2 heads x 256 x (K, V) x 2 B x 10 layers = 20 KiB per token of context.
  EXPECT_DOUBLE_EQ(r.kv_bytes_per_context, 20.0 * 1024);
  // ~1.88 GB per decode token at 4K (kernels.md §0).
  EXPECT_NEAR(r.decode_bytes(4096), 1.88e9, 0.01 * 1.88e9);
  // model.md §4.6: the text model is 19.51 GB (bf16 vectors there, f32 here: within 0.2%).
  EXPECT_NEAR(r.total_weight_bytes, 19.509e9, 0.002 * 19.509e9);
  // §2.4: 2.437 B active linear parameters = 4.87 GFLOP per token; attention 335 MFLOP per token at 4K;
  // GDN ~170 MFLOP per token; a 4K prompt ~22.0 TFLOP.
  EXPECT_NEAR(r.linear_flops_per_token, 4.874e9, 0.002 * 4.874e9);
  EXPECT_NEAR(r.attention_flops_coeff * 4096 / 2, 335e6, 0.01 * 335e6);
  EXPECT_NEAR(r.gdn_flops_per_token, 170e6, 0.1 * 170e6);
  EXPECT_NEAR(r.prefill_flops(4096), 22.0e12, 0.03 * 22.0e12);
}

TEST(BenchRoofline, RejectsInconsistentWeights) {
  ModelWeights w = full_size_mlx4();
  w.layers.pop_back();
  EXPECT_THROW(roofline_from_weights(w), Error);
}

TEST(BenchLengths, ParsesSuffixesAndRejectsGarbage) {
  EXPECT_EQ(bench_parse_lengths("256,512, 1K,4k,128K"), (std::vector<int64_t>{256, 512, 1024, 4096, 131072}));
  EXPECT_EQ(bench_parse_lengths("7"), (std::vector<int64_t>{7}));
  for (const char* bad : {"", "256,", "x", "1.5K", "0", "-3", "K", "12345678901"})
    EXPECT_THROW(bench_parse_lengths(bad), Error) << bad;
  EXPECT_EQ(bench_length_label(256), "256");
  EXPECT_EQ(bench_length_label(131072), "128K");
  EXPECT_EQ(bench_length_label(1000), "1000");
  EXPECT_DOUBLE_EQ(bench_median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(bench_median({4, 1, 3, 2}), 2.5);
}

TEST(BenchRun, MeasuresEveryLengthThroughTheRunner) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  for (bool device_sampling : {false, true}) {
    testing::FakeRunner runner(64, 60, device_sampling);
    Roofline roof;
    roof.weight_bytes_per_token = 1e6;
    roof.kv_bytes_per_context = 100;
    roof.linear_flops_per_token = 1e9;
    BenchOptions o;
    o.lengths = {5, 17};
    o.repeats = 3;
    o.warmup = 1;
    o.decode_steps = 4;
    o.prefill_chunk = 8;
    o.seed = seed;
    o.peak_gb_s = 1000;
    o.peak_tflop_s = 100;
    int64_t mem = 0;
    o.memory_in_use = [&] { return mem += 1000; };
    int lines = 0;
    o.log = [&](const std::string&) { ++lines; };
    const BenchReport r = bench_run(runner, roof, o);
    ASSERT_EQ(r.points.size(), 2u);
    EXPECT_EQ(r.backend, "fake");
    EXPECT_EQ(r.decode_path.rfind(device_sampling ? "forward_sample" : "forward (", 0), 0u) << r.decode_path;
    // (warm-up + repeats) x (prefill + decode steps) tokens per length.
    EXPECT_EQ(runner.forward_tokens, 4 * (5 + 4) + 4 * (17 + 4));
    EXPECT_EQ(runner.sample_calls, device_sampling ? 4 * 4 * 2 : 0);
    EXPECT_EQ(lines, 2 * (1 + 3));
    for (const BenchPoint& p : r.points) {
      ASSERT_EQ(p.prefill_ms.size(), 3u);
      ASSERT_EQ(p.decode_ms.size(), 3u);
      EXPECT_DOUBLE_EQ(p.prefill_ms_median, bench_median(p.prefill_ms));
      EXPECT_GT(p.prefill_tok_s, 0);
      EXPECT_NEAR(p.prefill_tok_s, double(p.length) / (p.prefill_ms_median * 1e-3), 1e-9 * p.prefill_tok_s);
      EXPECT_NEAR(p.prefill_tflop_s, roof.prefill_flops(p.length) / (p.prefill_ms_median * 1e-3) * 1e-12,
                  1e-9 * p.prefill_tflop_s);
      EXPECT_DOUBLE_EQ(p.decode_context, double(p.length) + 2.0);
      EXPECT_NEAR(p.decode_gb_s, roof.decode_bytes(p.decode_context) * p.decode_tok_s * 1e-9, 1e-9 * p.decode_gb_s);
    }
    EXPECT_GT(r.points[1].memory_peak_bytes, r.points[0].memory_peak_bytes);
    EXPECT_EQ(r.memory_peak_bytes, r.points[1].memory_peak_bytes);

    // Outputs: the table names every length; the JSON parses and holds the figures; the SVG has both series.
    const std::string table = bench_table(r);
    EXPECT_NE(table.find("|      5 |"), std::string::npos) << table;
    EXPECT_NE(table.find("|     17 |"), std::string::npos) << table;
    const auto j = nlohmann::json::parse(bench_json(r));
    ASSERT_EQ(j["points"].size(), 2u);
    EXPECT_EQ(j["points"][1]["length"], 17);
    EXPECT_DOUBLE_EQ(j["points"][0]["prefill_tok_s"].get<double>(), r.points[0].prefill_tok_s);
    EXPECT_DOUBLE_EQ(j["points"][0]["decode_pct_of_peak"].get<double>(), 100.0 * r.points[0].decode_gb_s / 1000);
    EXPECT_FALSE(j.contains("concurrency"));  // without --concurrency the document is as it was
    EXPECT_FALSE(j["method"].contains("concurrency"));
    EXPECT_EQ(table.find("streams"), std::string::npos);
    const std::string svg = bench_svg(r);
    EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    size_t polylines = 0;
    for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
    EXPECT_EQ(polylines, 2u);
  }
}

TEST(BenchRun, RejectsBadOptions) {
  testing::FakeRunner runner(16, 16, false);
  BenchOptions o;
  EXPECT_THROW(bench_run(runner, {}, o), Error);  // no lengths
  o.lengths = {4};
  o.repeats = 0;
  EXPECT_THROW(bench_run(runner, {}, o), Error);
  o.repeats = 1;
  o.lengths = {runner.config().max_position_embeddings};
  EXPECT_THROW(bench_run(runner, {}, o), Error);
}

// The fake runner of the bench tests, recording every forward_batch call (each entry's session and input token)
// and sleeping `step_delay` in each, and refusing a session beyond `max_live` live ones as a device out of memory
// does.
class BatchRecordingRunner : public testing::FakeRunner {
 public:
  explicit BatchRecordingRunner(bool device_sampling) : FakeRunner(64, 60, device_sampling) {}
  struct Entry {
    const Session* session;
    int64_t position;  // before the step
    int32_t token;
    bool sampling;
  };
  class TrackedSession : public testing::FakeSession {
   public:
    TrackedSession(int64_t capacity, int64_t* live) : FakeSession(capacity), live_(live) { ++*live_; }
    ~TrackedSession() override { --*live_; }

   private:
    int64_t* live_;
  };
  void forward_batch(std::span<BatchEntry> batch) override {
    std::vector<Entry> step;
    for (const BatchEntry& e : batch) {
      EXPECT_EQ(e.tokens.size(), 1u);
      step.push_back({e.session, e.session->position(), e.tokens[0], e.sampling != nullptr});
    }
    steps.push_back(std::move(step));
    std::this_thread::sleep_for(step_delay);
    ModelRunner::forward_batch(batch);
  }
  int64_t session_bytes(int64_t max_context) const override { return known_memory ? 100 * max_context : 0; }
  int64_t free_memory_bytes() const override { return known_memory ? free_bytes : -1; }
  std::unique_ptr<Session> create_session(int64_t max_context) override {
    if (max_live >= 0 && live >= max_live)
      throw InternalError("CUDA error in create_session: cudaErrorMemoryAllocation (out of memory)");
    ++sessions_created;
    return std::make_unique<TrackedSession>(max_context, &live);
  }
  std::vector<std::vector<Entry>> steps;
  std::chrono::microseconds step_delay{0};
  int64_t max_live = -1, live = 0;
  bool known_memory = false;  // session_bytes: 100 per token; free_memory_bytes: free_bytes
  int64_t free_bytes = 0;
};

int32_t fake_argmax(int64_t position, int32_t token, int64_t vocab_real) {
  int32_t best = 0;
  for (int32_t v = 1; v < vocab_real; ++v)
    if (testing::FakeRunner::logit(position, token, v) > testing::FakeRunner::logit(position, token, best)) best = v;
  return best;
}

TEST(BenchConcurrency, OneForwardBatchOfNEntriesPerStepAndConsistentFigures) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  for (bool device_sampling : {false, true}) {
    BatchRecordingRunner runner(device_sampling);
    runner.step_delay = std::chrono::microseconds(500);
    Roofline roof;
    roof.weight_bytes_per_token = 1e6;
    BenchOptions o;
    o.lengths = {5, 9};
    o.concurrency = {1, 3, 4};
    o.repeats = 3;
    o.warmup = 1;
    o.decode_steps = 4;
    o.prefill_chunk = 4;
    o.seed = seed;
    int64_t mem = 0;
    o.memory_in_use = [&] { return mem += 1000; };
    int lines = 0;
    o.log = [&](const std::string&) { ++lines; };
    const BenchReport r = bench_run(runner, roof, o);
    EXPECT_TRUE(r.points.empty());
    ASSERT_EQ(r.concurrency.size(), 6u);
    EXPECT_EQ(r.decode_path.rfind(device_sampling ? "forward_batch, greedy on the device"
                                                  : "forward_batch, last-token logits to the host", 0),
              0u)
        << r.decode_path;
    EXPECT_EQ(lines, 6 * (1 + 3));

    // The calls: per (length, N), (warm-up + repeats) runs of 4 steps, each ONE forward_batch of N entries over N
    // distinct sessions, each entry one token at the next position; on the host path the token is the greedy
    // argmax of the stream's previous step, on the device path what the device sampled (the fake samples 1).
    EXPECT_EQ(runner.sessions_created, 2 * (1 + 3 + 4));
    EXPECT_EQ(runner.live, 0);  // every row's sessions freed
    size_t k = 0;
    int64_t tokens = 0;
    for (int64_t L : o.lengths)
      for (int n : o.concurrency) {
        tokens += (1 + 3) * n * (L + 4);
        for (int run = 0; run < 1 + 3; ++run)
          for (int s = 0; s < 4; ++s, ++k) {
            ASSERT_LT(k, runner.steps.size());
            const auto& step = runner.steps[k];
            ASSERT_EQ(step.size(), size_t(n)) << "L=" << L << " N=" << n << " step " << s;
            for (int i = 0; i < n; ++i) {
              EXPECT_EQ(step[size_t(i)].position, L + s);
              // Device sampling is offered in the first step; once the runner declines it, it is not asked again.
              EXPECT_EQ(step[size_t(i)].sampling, device_sampling || k == 0);
              for (int j = 0; j < i; ++j) EXPECT_NE(step[size_t(i)].session, step[size_t(j)].session);
              if (s == 0) continue;
              const auto& prev = runner.steps[k - 1][size_t(i)];
              EXPECT_EQ(step[size_t(i)].session, prev.session);
              EXPECT_EQ(step[size_t(i)].token, device_sampling ? 1 : fake_argmax(prev.position, prev.token, 60));
            }
          }
      }
    EXPECT_EQ(k, runner.steps.size());
    EXPECT_EQ(runner.forward_tokens, tokens);
    EXPECT_EQ(runner.sample_calls, device_sampling ? (1 + 3) * 4 * 2 * (1 + 3 + 4) : 0);

    // The figures: every step at least the runner's delay; aggregate = N x per-stream = N x steps / the median
    // run's time; each run's time the sum of its steps; the latency percentiles those of the steps.
    size_t row = 0;
    for (int64_t L : o.lengths)
      for (int n : o.concurrency) {
        const BenchConcurrencyPoint& p = r.concurrency[row++];
        EXPECT_EQ(p.length, L);
        EXPECT_EQ(p.streams, n);
        ASSERT_EQ(p.decode_ms.size(), 3u);
        ASSERT_EQ(p.step_ms.size(), 3u * 4u);
        for (int run = 0; run < 3; ++run) {
          double sum = 0;
          for (int s = 0; s < 4; ++s) {
            EXPECT_GE(p.step_ms[size_t(run * 4 + s)], 0.5);
            sum += p.step_ms[size_t(run * 4 + s)];
          }
          EXPECT_NEAR(p.decode_ms[size_t(run)], sum, 1e-9 * sum);
        }
        EXPECT_DOUBLE_EQ(p.decode_ms_median, bench_median(p.decode_ms));
        EXPECT_NEAR(p.stream_tok_s, 4.0 / (p.decode_ms_median * 1e-3), 1e-9 * p.stream_tok_s);
        EXPECT_NEAR(p.aggregate_tok_s, n * p.stream_tok_s, 1e-9 * p.aggregate_tok_s);
        EXPECT_LE(p.stream_tok_s, 1e3 / 0.5);
        EXPECT_DOUBLE_EQ(p.itl_p50_ms, bench_percentile(p.step_ms, 50));
        EXPECT_DOUBLE_EQ(p.itl_p99_ms, bench_percentile(p.step_ms, 99));
        EXPECT_LE(p.itl_p50_ms, p.itl_p99_ms);
        EXPECT_LE(p.itl_p99_ms, *std::max_element(p.step_ms.begin(), p.step_ms.end()));
        EXPECT_DOUBLE_EQ(p.decode_context, double(L) + 2.0);
        EXPECT_GT(p.memory_peak_bytes, 0);
      }
    EXPECT_EQ(r.memory_peak_bytes, r.concurrency.back().memory_peak_bytes);

    // Outputs: a row per (context, N) in the table; the JSON's rows hold the same figures.
    const std::string table = bench_table(r);
    EXPECT_NE(table.find("aggregate tok/s"), std::string::npos) << table;
    EXPECT_NE(table.find("|       5 |       3 |"), std::string::npos) << table;
    EXPECT_NE(table.find("|       9 |       4 |"), std::string::npos) << table;
    EXPECT_EQ(table.find("prefill tok/s"), std::string::npos) << table;
    const auto j = nlohmann::json::parse(bench_json(r));
    EXPECT_EQ(j["method"]["concurrency"].get<std::vector<int>>(), (std::vector<int>{1, 3, 4}));
    EXPECT_TRUE(j["points"].empty());
    ASSERT_EQ(j["concurrency"].size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      const auto& q = j["concurrency"][i];
      const BenchConcurrencyPoint& p = r.concurrency[i];
      EXPECT_EQ(q["length"], p.length);
      EXPECT_EQ(q["streams"], p.streams);
      EXPECT_EQ(q["decode_steps"], 4);
      EXPECT_DOUBLE_EQ(q["aggregate_tok_s"].get<double>(), p.aggregate_tok_s);
      EXPECT_DOUBLE_EQ(q["per_stream_tok_s"].get<double>(), p.stream_tok_s);
      EXPECT_DOUBLE_EQ(q["itl_p50_ms"].get<double>(), p.itl_p50_ms);
      EXPECT_DOUBLE_EQ(q["itl_p99_ms"].get<double>(), p.itl_p99_ms);
      EXPECT_EQ(q["step_ms"].size(), 12u);
      EXPECT_EQ(q["memory_peak_bytes"], p.memory_peak_bytes);
    }
  }
}

TEST(BenchConcurrency, RejectsBadInput) {
  EXPECT_EQ(bench_parse_concurrency("1,2, 4,8,16,32,256"), (std::vector<int>{1, 2, 4, 8, 16, 32, 256}));
  for (const char* bad : {"", "0", "257", "1,", ",2", "x", "-1", "1.5", "2,1000", "12345678901"})
    EXPECT_THROW(bench_parse_concurrency(bad), Error) << bad;

  BatchRecordingRunner runner(true);
  BenchOptions o;
  o.lengths = {8};
  o.repeats = 1;
  o.warmup = 0;
  o.decode_steps = 2;
  for (int bad : {0, -1, kBenchMaxConcurrency + 1}) {
    o.concurrency = {1, bad};
    EXPECT_THROW(bench_run(runner, {}, o), Error) << bad;
  }
  EXPECT_EQ(runner.sessions_created, 0);  // refused before any session was made
  o.concurrency = {2};
  o.decode_steps = 0;  // nothing to time
  EXPECT_THROW(bench_run(runner, {}, o), Error);
  o.decode_steps = 2;
  o.lengths = {runner.config().max_position_embeddings - 1};  // the context and the steps exceed the positions
  EXPECT_THROW(bench_run(runner, {}, o), Error);

  // Sessions that do not fit: the error names N and the context, after the rows that fit ran; nothing is left.
  o.lengths = {8};
  o.concurrency = {2, 3, 4};
  runner.max_live = 3;
  try {
    bench_run(runner, {}, o);
    ADD_FAILURE() << "4 sessions fitted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("4 sessions of context 8"), std::string::npos) << what;
    EXPECT_NE(what.find("do not fit"), std::string::npos) << what;
    EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
  }
  EXPECT_EQ(runner.live, 0);
  EXPECT_EQ(runner.steps.size(), 2u * 2u);  // the rows of 2 and 3 streams ran their steps

  // A runner that knows a session's memory and what is free: refused before any session is made, with the numbers.
  runner.max_live = -1;
  runner.known_memory = true;
  runner.free_bytes = 3 * 100 * (8 + 2) + 99;  // three sessions of 8 + 2 tokens fit, four do not
  const int64_t created = runner.sessions_created;
  try {
    bench_run(runner, {}, o);
    ADD_FAILURE() << "4 sessions fitted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("4 sessions of context 8 (10 tokens with the decode steps) do not fit"), std::string::npos)
        << what;
    EXPECT_NE(what.find("3 fit"), std::string::npos) << what;
  }
  EXPECT_EQ(runner.sessions_created, created + 2 + 3);  // the rows that fit; none for the row of 4
  EXPECT_EQ(runner.live, 0);
}

TEST(BenchPercentile, LinearBetweenRanks) {
  EXPECT_DOUBLE_EQ(bench_percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(bench_percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(bench_percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(bench_percentile({10, 20}, 99), 19.9);
  EXPECT_DOUBLE_EQ(bench_percentile({3, 1, 2}, 0), 1);
  EXPECT_DOUBLE_EQ(bench_percentile({3, 1, 2}, 100), 3);
}

TEST(BenchSvg, EscapesTextAndDrawsEmptyAxes) {
  BenchReport r;
  r.device = "GPU <A&B>";
  const std::string svg = bench_svg(r);
  EXPECT_NE(svg.find("GPU &lt;A&amp;B&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<polyline"), std::string::npos);
}

}  // namespace
}  // namespace tern
