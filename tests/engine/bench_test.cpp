// tern bench: the roofline against the figures of kernels.md §2 for the real model's MLX 4-bit layout, the
// measuring loop over a fake runner, the length parser, and the table / JSON / SVG outputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

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

TEST(BenchSvg, EscapesTextAndDrawsEmptyAxes) {
  BenchReport r;
  r.device = "GPU <A&B>";
  const std::string svg = bench_svg(r);
  EXPECT_NE(svg.find("GPU &lt;A&amp;B&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<polyline"), std::string::npos);
}

}  // namespace
}  // namespace tern
