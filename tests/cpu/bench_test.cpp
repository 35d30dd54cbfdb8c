// CPU speed baseline (not run by default; no timing assertions): a 4-layer model with the real widths (D = 2048,
// 256 experts, real head dims, V = 248320) in the MLX 4-bit layout (8-bit router and shared-expert gate), random.
//   test_cpu --gtest_also_run_disabled_tests --gtest_filter='CpuBench.*'
// Prints prefill and decode tok/s; docs/benchmarks.md records the figures.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "core/thread_pool.h"
#include "cpu/cpu_runner.h"
#include "cpu_test_util.h"

namespace tern {
namespace {

std::shared_ptr<ModelWeights> fullwidth_model(uint64_t seed) {
  test::TinyModelSpec s;
  s.layers = 4;
  s.D = 2048;
  s.V = 248320;
  s.vocab_real = 248077;
  s.Hq = 16, s.Hkv = 2, s.dh = 256, s.rot = 64;
  s.Hk = 16, s.Hv = 32, s.dk = 128, s.dv = 128;
  s.E = 256, s.k = 8, s.F = 512, s.Fs = 512;
  s.format = WeightFormat::affine4;
  auto w = test::make_tiny_model(s, seed);
  // MLX keeps the router and the shared-expert gate at 8 bits.
  auto st = std::make_shared<test::HeapStorage>();
  w->storage.push_back(st);
  test::Rng rng(seed + 7);
  for (LayerWeights& l : w->layers) {
    l.router = test::random_matrix(rng, *st, WeightFormat::affine8, s.E, s.D, 0.5f);
    l.shared_expert_gate = test::random_matrix(rng, *st, WeightFormat::affine8, 1, s.D, 0.2f);
  }
  return w;
}

TEST(CpuBench, DISABLED_FullWidth4Layer4Bit) {
  const auto t0 = std::chrono::steady_clock::now();
  auto model = fullwidth_model(test::fresh_seed("bench"));
  auto runner = cpu_runner_create(model);
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("model: 4 layers (3 GDN + 1 attention), D=2048, E=256, V=248320, %.2f GB, built in %.1f s, %d threads\n",
              double(model->total_bytes()) / 1e9, build_s, thread_pool_global().size());
  test::Rng rng(1);
  for (int64_t n : {16, 64, 256}) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (auto& t : tokens) t = int32_t(rng.bits() % 248077u);
    auto s = runner->create_session(n + 16);
    std::vector<float> logits;
    auto a = std::chrono::steady_clock::now();
    runner->forward(*s, tokens, false, logits);
    const double sp = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    const int steps = 8;
    a = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) runner->forward(*s, std::span(tokens).subspan(size_t(i), 1), false, logits);
    const double sd = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    std::printf("prefill %4lld tokens: %7.2f tok/s (%.2f s) | decode after it: %.2f tok/s (%.0f ms/token)\n",
                (long long)n, double(n) / sp, sp, steps / sd, 1e3 * sd / steps);
  }
}

}  // namespace
}  // namespace tern
